//! shell/attach, logs, watch, audit.

use futures::StreamExt as _;

use super::{terminal, Ctx};
use crate::args::{AuditArgs, LogsArgs, WatchArgs};
use crate::error::{CliError, Result};
use crate::output::{self, print_line, print_stream};

pub async fn terminal(ctx: Ctx, session: &str, argv: &[String]) -> Result<i32> {
    terminal::run(&ctx.client, session, argv).await
}

pub async fn logs(ctx: Ctx, a: LogsArgs) -> Result<i32> {
    if a.list {
        let execs = ctx.client.list_execs(&a.session).await?;
        ctx.out.print(&execs, |e| output::execs_table(e))?;
        return Ok(0);
    }
    let exec_id = a
        .exec_id
        .ok_or_else(|| CliError::msg("name an exec id, or use --list"))?;
    let events = ctx.client.follow_exec(&a.session, &exec_id).await?;
    print_stream(events, ctx.out.json).await
}

/// One line per event as it happens (a table cannot be printed before the stream ends).
fn watch_line(ev: &serde_json::Value) -> String {
    let from = ev["from"]
        .as_str()
        .map(|f| format!(" (from {f})"))
        .unwrap_or_default();
    format!(
        "{}\t{}{from}",
        ev["type"].as_str().unwrap_or("?"),
        ev["path"].as_str().unwrap_or("?")
    )
}

pub async fn watch(ctx: Ctx, a: WatchArgs) -> Result<i32> {
    let events = ctx.client.watch(&a.session, &a.path, a.recursive).await?;
    futures::pin_mut!(events);
    while let Some(ev) = events.next().await {
        let ev = ev?;
        if ctx.out.json {
            print_line(&ev.to_string());
        } else {
            print_line(&watch_line(&ev));
        }
    }
    Ok(0)
}

pub async fn audit(ctx: Ctx, a: AuditArgs) -> Result<i32> {
    let verdict = (a.allowed || a.denied).then_some(a.allowed);
    let page = ctx
        .client
        .network_audit(a.session.as_deref(), verdict, None, a.limit)
        .await?;
    ctx.out.print(&page, output::audit_table)?;
    Ok(0)
}
