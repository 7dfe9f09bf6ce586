//! shell/attach, logs, signal, watch, audit, preview, errors.

use futures::StreamExt as _;

use super::{terminal, Ctx};
use crate::args::{AuditArgs, ErrorsArgs, LogsArgs, PreviewArgs, SignalArgs, StdinArgs, WatchArgs};
use crate::error::{CliError, IoContext as _, Result};
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
    if a.status {
        let status = ctx.client.exec_status(&a.session, &exec_id).await?;
        ctx.out.print(&status, output::exec_status_table)?;
        return Ok(0);
    }
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

pub async fn preview(ctx: Ctx, a: PreviewArgs) -> Result<i32> {
    let url = ctx.client.preview_url(&a.session)?;
    let info = match a.port {
        Some(port) => match ctx.client.pin_preview(&a.session, port).await {
            Ok(info) => info,
            // The pin holds; the server is just not up yet, and the URL is already right.
            Err(e) if e.code() == Some(koder_sdk::codes::PREVIEW_NOT_LISTENING) => {
                eprintln!("ksandbox: pinned port {port}, but nothing listens there yet");
                let pinned =
                    serde_json::json!({"preview_url": url.as_str(), "port": port, "pinned": true});
                ctx.out.print(&pinned, |_| url.to_string())?;
                return Ok(0);
            }
            Err(e) => return Err(e.into()),
        },
        None => ctx.client.upstream(&a.session).await?,
    };
    let mut shown = serde_json::to_value(&info)?;
    if let Some(o) = shown.as_object_mut() {
        o.insert("preview_url".into(), url.as_str().into());
    }
    ctx.out.print(&shown, |_| url.to_string())?;
    if !ctx.out.json {
        let how = if info.pinned { "pinned" } else { "detected" };
        eprintln!(
            "ksandbox: proxies to {} inside the sandbox (port {how}); requests need the API key \
             as `Authorization: Bearer KEY`",
            info.url
        );
    }
    Ok(0)
}

pub async fn errors(ctx: Ctx, a: ErrorsArgs) -> Result<i32> {
    if let Some(message) = a.report {
        let report = koder_sdk::types::ReportError {
            source: a.source,
            message,
            stack: a.stack,
        };
        let entry = ctx.client.report_error(&a.session, &report).await?;
        ctx.out.print_json_only(&entry)?;
        return Ok(0);
    }
    let errors = ctx.client.errors(&a.session).await?;
    ctx.out.print(&errors, |e| output::errors_table(e))?;
    Ok(0)
}

pub async fn signal(ctx: Ctx, a: SignalArgs) -> Result<i32> {
    let name = a.signal.wire_name();
    ctx.client
        .exec_signal(&a.session, &a.exec_id, &name)
        .await?;
    ctx.out
        .print_json_only(&serde_json::json!({"exec_id": a.exec_id, "signal": name}))?;
    Ok(0)
}

/// The daemon takes at most 1 MiB per stdin write; smaller chunks keep a pipe interactive.
const STDIN_CHUNK: usize = 64 * 1024;

/// Sends `--data`, or copies this command's stdin as it arrives, to a background exec.
pub async fn stdin(ctx: Ctx, a: StdinArgs) -> Result<i32> {
    let send =
        |data: Vec<u8>, close: bool| ctx.client.exec_stdin(&a.session, &a.exec_id, data, close);
    if let Some(data) = a.data {
        send(data.into_bytes(), a.eof).await?;
        return Ok(0);
    }
    let mut input = tokio::io::stdin();
    let mut buf = vec![0u8; STDIN_CHUNK];
    loop {
        let n = tokio::io::AsyncReadExt::read(&mut input, &mut buf)
            .await
            .doing(|| "reading standard input".into())?;
        if n == 0 {
            break;
        }
        send(buf[..n].to_vec(), false).await?;
    }
    if a.eof {
        send(Vec::new(), true).await?;
    }
    Ok(0)
}
