//! The command line: clap definitions only, one module per command group.

mod admin;
mod egress;
mod exec;
mod files;
mod image;
mod interp;
mod live;
mod mcp;
mod sessions;
mod state;
mod volumes;

use clap::{Args, CommandFactory as _, Parser, Subcommand};
use std::path::PathBuf;

pub use admin::{AdminArgs, AdminCommand, TenantCommand};
pub use egress::{NetworkArgs, SecretCommand, WebhookCommand};
pub use exec::{ExecArgs, ExecOpts, RunArgs};
pub use files::{CpArgs, FilesArgs, MkdirArgs, MvArgs, RmArgs, StatArgs};
pub use image::{BuildStatusArgs, ImageBuildArgs, ImageCommand, ImageImportArgs};
pub use interp::{ContextCommand, RunCodeArgs};
#[cfg(test)]
pub(crate) use interp::{ContextCreateArgs, ContextLanguage};
pub use live::{
    AttachArgs, AuditArgs, CompletionsArgs, ErrorsArgs, LogsArgs, PreviewArgs, SignalArgs,
    StdinArgs, WatchArgs,
};
pub use mcp::McpArgs;
pub use sessions::{CreateArgs, EventsArgs, KillArgs, SessionArgs, SessionOpts, TimeoutArgs};
pub use state::{
    ForkArgs, LifecycleOpts, PauseArgs, RestoreArgs, SnapshotCommand, SnapshotCreateArgs,
};
#[cfg(test)]
pub(crate) use volumes::parse_mode;
pub use volumes::{VolumeCommand, VolumeMkdirArgs, VolumePutArgs, VolumeRmArgs};

#[derive(Debug, Parser)]
#[command(
    name = "ksandbox",
    version,
    about = "Run code in koder-sandbox sessions (and run the daemon itself)",
    after_help = "Client options (--url, --api-key, --ca-cert, --json) go before or after the subcommand."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalOpts,
    #[command(subcommand)]
    pub command: Command,
}

/// The languages a session or a run is created for, with the aliases the daemon takes.
pub(crate) fn language_parser() -> clap::builder::PossibleValuesParser {
    use clap::builder::PossibleValue;
    clap::builder::PossibleValuesParser::new([
        PossibleValue::new("python").alias("py"),
        PossibleValue::new("node").aliases(["js", "javascript", "nodejs"]),
        PossibleValue::new("bash").alias("sh"),
    ])
}

/// Options in front of the subcommand (`ksandbox --json ls`).
#[derive(Debug, Clone, Args)]
pub struct GlobalOpts {
    /// Daemon base URL [default: http://127.0.0.1:7070].
    #[arg(long, env = "KSANDBOX_URL", value_name = "URL")]
    pub url: Option<String>,
    /// API key (bearer token).
    #[arg(
        long,
        env = "KSANDBOX_API_KEY",
        hide_env_values = true,
        value_name = "KEY"
    )]
    pub api_key: Option<String>,
    /// PEM file of CA certificates to trust (an https daemon behind a private CA).
    #[arg(long, env = "KSANDBOX_CA_CERT", value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// Machine-readable JSON output.
    #[arg(long)]
    pub json: bool,
}

/// The same options after the subcommand (`ksandbox ls --json`); these win over the global ones.
/// (Not clap-global: `serve` has its own `--api-key TENANT:KEY`.)
#[derive(Debug, Clone, Default, Args)]
pub struct LocalOpts {
    /// Daemon base URL [env: KSANDBOX_URL].
    #[arg(long = "url", value_name = "URL", help_heading = "Client options")]
    pub url: Option<String>,
    /// API key [env: KSANDBOX_API_KEY].
    #[arg(long = "api-key", value_name = "KEY", help_heading = "Client options")]
    pub api_key: Option<String>,
    /// PEM file of CA certificates to trust [env: KSANDBOX_CA_CERT].
    #[arg(long = "ca-cert", value_name = "FILE", help_heading = "Client options")]
    pub ca_cert: Option<PathBuf>,
    /// Machine-readable JSON output.
    #[arg(long = "json", help_heading = "Client options")]
    pub json: bool,
}

/// Subcommands whose only arguments are the client options.
#[derive(Debug, Args)]
pub struct OnlyOpts {
    #[command(flatten)]
    pub c: LocalOpts,
}

// Built once per process, so the variants' size difference costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the koder-sandbox daemon in the foreground.
    Serve(koder_daemon::ServeArgs),
    #[command(flatten)]
    Client(ClientCommand),
}

/// The commands that talk to a daemon (and `image`, which builds locally).
#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// Create a session and print its id.
    Create(CreateArgs),
    /// List this tenant's sessions.
    Ls(OnlyOpts),
    /// Show one session.
    Info(SessionArgs),
    /// Run a command in a session: `exec S -- CMD ARGS...` or `exec S --shell 'CMD'`.
    Exec(ExecArgs),
    /// Create a throw-away session, run code in it, destroy it.
    Run(RunArgs),
    /// Copy a file to or from a session (`SESSION:/path` names the sandbox side, `-` is stdio).
    Cp(CpArgs),
    /// Remove files in a session.
    Rm(RmArgs),
    /// Destroy sessions.
    #[command(alias = "destroy")]
    Kill(KillArgs),
    /// List files in a session.
    Files(FilesArgs),
    /// Show one file's type, size, mode and owner in a session.
    Stat(StatArgs),
    /// Create a directory (and its parents) in a session.
    Mkdir(MkdirArgs),
    /// Move or rename a file in a session.
    Mv(MvArgs),
    /// Kill every process in a session (a fork bomb, a wedged tree) and keep the session.
    KillProcesses(SessionArgs),
    /// Set a session's remaining lifetime.
    Timeout(TimeoutArgs),
    /// Snapshots: saved filesystems that outlive their session.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Volumes: named directories that outlive sessions; `create --volume NAME:/path` mounts one.
    #[command(subcommand)]
    Volume(VolumeCommand),
    /// Restart a session on a snapshot's filesystem (its processes end).
    Restore(RestoreArgs),
    /// Copy a session into new ones and print their ids.
    Fork(ForkArgs),
    /// Pause a session: processes frozen in memory, or with --disk only its filesystem, durably.
    Pause(PauseArgs),
    /// Resume a paused session.
    Resume(SessionArgs),
    /// Interpreter contexts: long-lived Python/Node interpreters whose variables persist.
    #[command(subcommand)]
    Context(ContextCommand),
    /// Run code in a session's interpreter context: `run-code S 'x = 1'`, `run-code S - < f.py`.
    RunCode(RunCodeArgs),
    /// Print the preview URL of a session's web server (the daemon's proxy to it), pinning
    /// the port with --port.
    Preview(PreviewArgs),
    /// List the errors reported for a session (the last 50, oldest first), or report one.
    Errors(ErrorsArgs),
    /// Send a signal to a background or followed exec.
    Signal(SignalArgs),
    /// Write to a background exec's stdin: --data TEXT, or this command's own stdin.
    Stdin(StdinArgs),
    /// Change a running session's network policy (applies to its new connections).
    Network(NetworkArgs),
    /// Secrets: values your sessions use without seeing them, injected at egress into
    /// requests to the hosts they are bound to (`create --secret NAME`).
    #[command(subcommand)]
    Secret(SecretCommand),
    /// Webhooks: signed HTTP notifications of session and exec events.
    #[command(subcommand)]
    Webhook(WebhookCommand),
    /// Check that the daemon answers (GET /healthz).
    Health(OnlyOpts),
    /// Live resource use of a session (CPU, memory, pids, disk).
    Metrics(SessionArgs),
    /// What happened to a session (created, paused, resumed, stopped and why, execs killed by
    /// a limit), a stopped one's too.
    Events(EventsArgs),
    /// Open an interactive shell in a session (raw terminal, resizes follow the window).
    Shell(SessionArgs),
    /// Attach a terminal to a program in a session: `attach S -- top`.
    Attach(AttachArgs),
    /// Follow a background exec's output (replayed from the start), show its status, or list
    /// them.
    Logs(LogsArgs),
    /// Print file events below a directory in a session as they happen.
    Watch(WatchArgs),
    /// The network audit log: every connection attempt and lookup of your sandboxes.
    Audit(AuditArgs),
    /// Operator commands; need an admin key (--api-key or KSANDBOX_ADMIN_KEY).
    Admin(AdminArgs),
    /// Serve the sandbox as MCP tools for AI agents: stdio, or streamable HTTP with --http.
    Mcp(McpArgs),
    /// Images: build language packs and the microVM guest, import OCI archives (locally);
    /// list, inspect, delete.
    #[command(subcommand)]
    Image(ImageCommand),
    /// Print a shell completion script: `source <(ksandbox completions bash)`, or save it to
    /// your shell's completion directory (zsh: a `_ksandbox` file on $fpath).
    Completions(CompletionsArgs),
}

pub(crate) fn parse_kv(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected K=V, got {s:?}")),
    }
}

/// A usage error of subcommand `sub`: printed like clap's own, exit status 2.
pub fn usage_error(sub: &str, kind: clap::error::ErrorKind, message: impl std::fmt::Display) -> ! {
    let mut cli = Cli::command();
    cli.build();
    match cli.find_subcommand_mut(sub) {
        Some(cmd) => cmd.error(kind, message).exit(),
        None => cli.error(kind, message).exit(),
    }
}
