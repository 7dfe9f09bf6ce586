use clap::Args;

use super::LocalOpts;

#[derive(Debug, Args)]
pub struct AttachArgs {
    /// Session id.
    pub session: String,
    #[command(flatten)]
    pub c: LocalOpts,
    /// The program and its arguments (exec'd directly, no shell).
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// Session id.
    pub session: String,
    /// Id of the exec to follow (printed by `exec --background`).
    pub exec_id: Option<String>,
    /// List the session's followed execs instead.
    #[arg(long, conflicts_with_all = ["exec_id", "status"])]
    pub list: bool,
    /// Print the exec's state (running, or exited with its verdict and exit code) instead of
    /// following its output.
    #[arg(long, requires = "exec_id")]
    pub status: bool,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Session id.
    pub session: String,
    /// Directory inside the sandbox.
    #[arg(default_value = "/workspace")]
    pub path: String,
    /// Include its subdirectories.
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
    /// Most entries to show (newest first).
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct PreviewArgs {
    /// Session id.
    pub session: String,
    /// Pin the preview to this port inside the sandbox (default: the port detected from the
    /// session's listening sockets, or the one pinned before).
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub port: Option<u16>,
    #[command(flatten)]
    pub c: LocalOpts,
}

/// The signals the daemon knows by name (`SIGTERM`, `term` and `TERM` all work).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "UPPER")]
pub enum Signal {
    #[value(alias = "SIGHUP")]
    Hup,
    #[value(alias = "SIGINT")]
    Int,
    #[value(alias = "SIGQUIT")]
    Quit,
    #[value(alias = "SIGKILL")]
    Kill,
    #[value(alias = "SIGUSR1")]
    Usr1,
    #[value(alias = "SIGUSR2")]
    Usr2,
    #[value(alias = "SIGPIPE")]
    Pipe,
    #[value(alias = "SIGALRM")]
    Alrm,
    #[value(alias = "SIGTERM")]
    Term,
    #[value(alias = "SIGCONT")]
    Cont,
    #[value(alias = "SIGSTOP")]
    Stop,
    #[value(alias = "SIGTSTP")]
    Tstp,
    #[value(alias = "SIGWINCH")]
    Winch,
}

impl Signal {
    /// The name on the wire: `SIGTERM`.
    pub fn wire_name(self) -> String {
        let name = clap::ValueEnum::to_possible_value(&self)
            .map(|v| v.get_name().to_string())
            .unwrap_or_default();
        format!("SIG{name}")
    }
}

#[derive(Debug, Args)]
pub struct SignalArgs {
    /// Session id.
    pub session: String,
    /// Id of a background or followed exec (see `logs --list`).
    pub exec_id: String,
    /// Signal sent to the exec's process group.
    #[arg(value_enum, ignore_case = true, default_value_t = Signal::Term)]
    pub signal: Signal,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct StdinArgs {
    /// Session id.
    pub session: String,
    /// Id of a background exec (printed by `exec --background`).
    pub exec_id: String,
    /// Send this text instead of copying this command's own stdin (until its end).
    #[arg(long, value_name = "TEXT")]
    pub data: Option<String>,
    /// Close the exec's stdin after sending (its reader sees end of file).
    #[arg(long)]
    pub eof: bool,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct ErrorsArgs {
    /// Session id.
    pub session: String,
    /// Report an error instead of listing them (an agent's own failure worth keeping with
    /// the session).
    #[arg(long, value_name = "MESSAGE")]
    pub report: Option<String>,
    /// Who reports it (with --report).
    #[arg(long, default_value = "cli", requires = "report")]
    pub source: String,
    /// A stack trace or details (with --report).
    #[arg(long, requires = "report")]
    pub stack: Option<String>,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to write a completion script for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}
