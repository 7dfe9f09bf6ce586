use clap::{Args, Subcommand};

use super::{LocalOpts, OnlyOpts};

#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Capture a session's filesystem and print the snapshot's id.
    Create(SnapshotCreateArgs),
    /// List this tenant's snapshots.
    #[command(alias = "ls")]
    List(OnlyOpts),
    /// Show one snapshot.
    Get(SnapshotArgs),
    /// Delete a snapshot.
    #[command(alias = "rm")]
    Delete(SnapshotArgs),
}

#[derive(Debug, Args)]
pub struct SnapshotCreateArgs {
    /// Session id.
    pub session: String,
    /// A name for it: 1–128 characters of [A-Za-z0-9._-].
    #[arg(long)]
    pub name: Option<String>,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// Snapshot id.
    pub snapshot: String,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// Session id.
    pub session: String,
    /// Id of the snapshot to restore.
    pub snapshot: String,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct ForkArgs {
    /// Session id.
    pub session: String,
    /// How many copies.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub count: u32,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct PauseArgs {
    /// Session id.
    pub session: String,
    /// Keep only the filesystem, durably (survives a daemon restart; resume boots afresh)
    /// instead of freezing the processes in memory.
    #[arg(long)]
    pub disk: bool,
    #[command(flatten)]
    pub c: LocalOpts,
}

/// How `create` starts from saved state and what its timeout does.
#[derive(Debug, Clone, Default, Args)]
pub struct LifecycleOpts {
    /// Start on this snapshot's filesystem.
    #[arg(long, value_name = "SNAPSHOT")]
    pub from_snapshot: Option<String>,
    /// What the session's timeout does: kill it (default), or pause it (to disk unless
    /// --keep-memory).
    #[arg(long, value_parser = ["kill", "pause"])]
    pub on_timeout: Option<String>,
    /// A request to the paused session resumes it first.
    #[arg(long)]
    pub auto_resume: bool,
    /// With `--on-timeout pause`: keep the processes (memory pause) instead of only the files.
    #[arg(long, requires = "on_timeout")]
    pub keep_memory: bool,
}
