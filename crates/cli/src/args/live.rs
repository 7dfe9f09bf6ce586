use clap::Args;

use super::LocalOpts;

#[derive(Debug, Args)]
pub struct AttachArgs {
    pub session: String,
    #[command(flatten)]
    pub c: LocalOpts,
    /// The program and its arguments (exec'd directly, no shell).
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    pub session: String,
    pub exec_id: Option<String>,
    /// List the session's followed execs instead.
    #[arg(long, conflicts_with = "exec_id")]
    pub list: bool,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    pub session: String,
    #[arg(default_value = "/workspace")]
    pub path: String,
    #[arg(short, long)]
    pub recursive: bool,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Only this session's attempts.
    #[arg(long)]
    pub session: Option<String>,
    /// Only refused attempts.
    #[arg(long, conflicts_with = "allowed")]
    pub denied: bool,
    /// Only allowed attempts.
    #[arg(long)]
    pub allowed: bool,
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
    #[command(flatten)]
    pub c: LocalOpts,
}
