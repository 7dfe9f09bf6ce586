//! snapshot create/list/get/delete, restore, fork, pause, resume, and `create`'s lifecycle.

use koder_sdk::{CreateSession, Lifecycle, OnTimeout, PauseKind};

use super::Ctx;
use crate::args::{
    ForkArgs, GlobalOpts, LifecycleOpts, PauseArgs, RestoreArgs, SessionArgs, SnapshotCommand,
    SnapshotCreateArgs,
};
use crate::error::Result;
use crate::output;

/// `req` starting from `--from-snapshot`, with a lifecycle when `--on-timeout` or
/// `--auto-resume` was given (else the server's default).
pub(crate) fn with_lifecycle(req: CreateSession, opts: &LifecycleOpts) -> CreateSession {
    let lifecycle = Lifecycle {
        on_timeout: match opts.on_timeout.as_deref() {
            Some("pause") => OnTimeout::Pause,
            _ => OnTimeout::Kill,
        },
        auto_resume: opts.auto_resume,
        keep_memory: opts.keep_memory,
    };
    let lifecycle = (opts.on_timeout.is_some() || opts.auto_resume).then_some(lifecycle);
    CreateSession {
        from_snapshot: opts.from_snapshot.clone(),
        lifecycle,
        ..req
    }
}

pub async fn snapshot(g: &GlobalOpts, command: SnapshotCommand) -> Result<i32> {
    match command {
        SnapshotCommand::Create(a) => create(Ctx::new(g, &a.c)?, a).await,
        SnapshotCommand::List(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            let snapshots = ctx.client.list_snapshots().await?;
            ctx.out.print(&snapshots, |s| output::snapshots_table(s))?;
            Ok(0)
        }
        SnapshotCommand::Get(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            let snapshot = ctx.client.get_snapshot(&a.snapshot).await?;
            ctx.out.print(&snapshot, output::snapshot_table)?;
            Ok(0)
        }
        SnapshotCommand::Delete(a) => {
            Ctx::new(g, &a.c)?
                .client
                .delete_snapshot(&a.snapshot)
                .await?;
            Ok(0)
        }
    }
}

async fn create(ctx: Ctx, a: SnapshotCreateArgs) -> Result<i32> {
    let snapshot = ctx
        .client
        .snapshot_session(&a.session, a.name.as_deref())
        .await?;
    // Just the id for people, so that `snap=$(ksandbox snapshot create S)` works.
    ctx.out.print(&snapshot, |s| s.snapshot_id.clone())?;
    Ok(0)
}

pub async fn restore(ctx: Ctx, a: RestoreArgs) -> Result<i32> {
    let info = ctx.client.restore_session(&a.session, &a.snapshot).await?;
    ctx.out.print(&info, output::session_table)?;
    Ok(0)
}

pub async fn fork(ctx: Ctx, a: ForkArgs) -> Result<i32> {
    let sessions = ctx.client.fork_session(&a.session, a.count).await?;
    // One id a line, like `create`: scripts loop over them.
    ctx.out.print(&sessions, |s| {
        s.iter()
            .map(|s| s.id.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    })?;
    Ok(0)
}

pub async fn pause(ctx: Ctx, a: PauseArgs) -> Result<i32> {
    let kind = if a.disk {
        PauseKind::Disk
    } else {
        PauseKind::Memory
    };
    let info = ctx.client.pause_session(&a.session, kind).await?;
    ctx.out.print(&info, output::session_table)?;
    Ok(0)
}

pub async fn resume(ctx: Ctx, a: SessionArgs) -> Result<i32> {
    let info = ctx.client.resume_session(&a.session).await?;
    ctx.out.print(&info, output::session_table)?;
    Ok(0)
}
