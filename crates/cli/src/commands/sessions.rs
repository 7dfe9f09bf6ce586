//! create, ls, info, kill, kill-processes, timeout, metrics, events, health.

use koder_sdk::{types, CreateSession, Limits, Network};

use super::Ctx;
use crate::args::{usage_error, CreateArgs, EventsArgs, SessionOpts};
use crate::error::Result;
use crate::output::{self, print_line};

pub(crate) fn create_request(
    language: Option<String>,
    env: &[(String, String)],
    opts: &SessionOpts,
) -> CreateSession {
    let limits = Limits {
        cpu_millis: opts.cpu_millis,
        memory_mib: opts.memory_mib,
        disk_mib: opts.disk_mib,
        pids: opts.pids,
    };
    let network = opts.network.as_deref().map(|mode| Network {
        mode: match mode {
            "open" => types::NetworkMode::Open,
            "allowlist" => types::NetworkMode::Allowlist,
            _ => types::NetworkMode::None,
        },
        allow: opts.allow.clone(),
        deny: opts.deny.clone(),
    });
    CreateSession {
        language,
        image: opts.image.clone(),
        runtime: opts.runtime.clone(),
        limits: (limits != Limits::default()).then_some(limits),
        network,
        env: env.iter().cloned().collect(),
        timeout_s: opts.timeout,
        metadata: opts.meta.iter().cloned().collect(),
        secrets: opts.secrets.clone(),
        ..Default::default()
    }
}

/// `--allow` only means something with `--network allowlist`, `--deny` with a mode that lets
/// something out.
pub(super) fn check_allowlist(sub: &str, opts: &SessionOpts) {
    let mode = opts.network.as_deref();
    let conflict = if !opts.allow.is_empty() && mode != Some("allowlist") {
        Some("--allow needs --network allowlist")
    } else if !opts.deny.is_empty() && !matches!(mode, Some("open" | "allowlist")) {
        Some("--deny needs --network open or --network allowlist")
    } else {
        None
    };
    if let Some(message) = conflict {
        usage_error(sub, clap::error::ErrorKind::ArgumentConflict, message);
    }
}

/// What `create` sends: the session settings, the lifecycle and the volumes to mount.
pub(crate) fn create_args_request(a: CreateArgs) -> CreateSession {
    let req =
        super::state::with_lifecycle(create_request(a.language, &a.env, &a.session), &a.lifecycle);
    CreateSession {
        volumes: a.volumes,
        ..req
    }
}

pub async fn create(ctx: Ctx, a: CreateArgs) -> Result<i32> {
    check_allowlist("create", &a.session);
    let req = create_args_request(a);
    let session = ctx.client.create_session(&req).await?;
    // Just the id for people, so that `id=$(ksandbox create)` works.
    ctx.out.print(session.info(), |s| s.id.clone())?;
    Ok(0)
}

pub async fn ls(ctx: Ctx) -> Result<i32> {
    let sessions = ctx.client.list_sessions().await?;
    ctx.out.print(&sessions, |s| output::sessions_table(s))?;
    Ok(0)
}

pub async fn info(ctx: Ctx, id: &str) -> Result<i32> {
    let info = ctx.client.get_session(id).await?;
    ctx.out.print(&info, output::session_table)?;
    Ok(0)
}

pub async fn kill(ctx: Ctx, ids: &[String]) -> Result<i32> {
    for id in ids {
        ctx.client.destroy_session(id).await?;
    }
    Ok(0)
}

pub async fn kill_processes(ctx: Ctx, id: &str) -> Result<i32> {
    let killed = ctx.client.kill_processes(id).await?;
    ctx.out
        .print(&serde_json::json!({ "killed": killed }), |_| {
            format!("{killed} processes killed")
        })?;
    Ok(0)
}

pub async fn timeout(ctx: Ctx, id: &str, secs: u64) -> Result<i32> {
    let info = ctx.client.set_timeout(id, secs).await?;
    ctx.out.print(&info, |s| {
        s.expires_at
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    })?;
    Ok(0)
}

pub async fn metrics(ctx: Ctx, id: &str) -> Result<i32> {
    let m = ctx.client.session_metrics(id).await?;
    ctx.out.print(&m, output::metrics_table)?;
    Ok(0)
}

/// How often `events --follow` asks for new events.
const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// One line per event (a JSON object with `--json`), so a followed log prints as it grows.
pub async fn events(ctx: Ctx, a: EventsArgs) -> Result<i32> {
    let mut after = a.after;
    loop {
        let page = ctx.client.session_events(&a.session, after, None).await?;
        let mut stopped = false;
        for e in &page.events {
            ctx.out.print(e, output::event_line)?;
            after = e.seq;
            stopped |= e.kind == "session.stopped";
        }
        if page.more {
            continue;
        }
        if !a.follow || stopped {
            return Ok(0);
        }
        // A session can end without a stop event reaching its log (its record lost with a
        // node): stop following once it is over and nothing more came.
        if page.events.is_empty() && ctx.client.get_session(&a.session).await?.state.is_ended() {
            return Ok(0);
        }
        tokio::time::sleep(FOLLOW_EVERY).await;
    }
}

pub async fn health(ctx: Ctx) -> Result<i32> {
    let ok = ctx.client.health().await;
    if ctx.out.json {
        print_line(&serde_json::json!({ "ok": ok }).to_string());
    } else {
        print_line(if ok { "ok" } else { "unreachable" });
    }
    Ok(if ok { 0 } else { 1 })
}
