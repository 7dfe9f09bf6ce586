use clap::Args;
use koder_sdk::VolumeMountRequest;

use super::volumes::parse_volume_mount;
use super::{parse_kv, LifecycleOpts, LocalOpts};

#[derive(Debug, Args)]
pub struct SessionArgs {
    /// Session id.
    pub session: String,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Session id.
    pub session: String,
    /// Only events numbered above this (the first column).
    #[arg(long, default_value_t = 0)]
    pub after: u64,
    /// Keep printing new events until the session stops.
    #[arg(long, short)]
    pub follow: bool,
    #[command(flatten)]
    pub c: LocalOpts,
}

/// Session settings shared by `create` and `run`.
#[derive(Debug, Clone, Default, Args)]
pub struct SessionOpts {
    /// Session lifetime in seconds.
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
    /// Memory limit in MiB.
    #[arg(long, value_name = "MIB")]
    pub memory_mib: Option<u64>,
    /// CPU quota in thousandths of a core.
    #[arg(long, value_name = "N")]
    pub cpu_millis: Option<u32>,
    /// Disk quota in MiB (the sandbox's writable layer).
    #[arg(long, value_name = "MIB")]
    pub disk_mib: Option<u64>,
    /// Most processes (and threads) at once.
    #[arg(long, value_name = "N")]
    pub pids: Option<u64>,
    /// Image name instead of a language (see `ksandbox image list`).
    #[arg(long, value_name = "IMAGE")]
    pub image: Option<String>,
    /// Where the session runs (default: the server's).
    #[arg(long, value_parser = ["jail", "microvm"])]
    pub runtime: Option<String>,
    /// Network mode: none (loopback only), open, or allowlist (the --allow destinations).
    #[arg(long, value_parser = ["none", "open", "allowlist"])]
    pub network: Option<String>,
    /// Allowed destination for `--network allowlist` (host, CIDR, `:port` suffix); repeatable.
    #[arg(long = "allow", value_name = "DEST")]
    pub allow: Vec<String>,
    /// Refused destination, even where an allow entry or `--network open` covers it;
    /// repeatable.
    #[arg(long = "deny", value_name = "DEST")]
    pub deny: Vec<String>,
    /// A secret (see `ksandbox secret`) the session may use: its environment holds a
    /// placeholder under the name, replaced at egress for the secret's hosts; repeatable.
    #[arg(long = "secret", value_name = "NAME")]
    pub secrets: Vec<String>,
    /// Session metadata; repeatable.
    #[arg(long = "meta", value_name = "K=V", value_parser = parse_kv)]
    pub meta: Vec<(String, String)>,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Language of the session (default: the server's).
    #[arg(long, short = 'l', value_parser = super::language_parser())]
    pub language: Option<String>,
    /// Session environment variable; repeatable.
    #[arg(long = "env", short = 'e', value_name = "K=V", value_parser = parse_kv)]
    pub env: Vec<(String, String)>,
    /// Mount a volume: NAME:/path, or NAME:/path:ro read-only; repeatable.
    #[arg(long = "volume", short = 'v', value_name = "NAME:/PATH[:ro]", value_parser = parse_volume_mount)]
    pub volumes: Vec<VolumeMountRequest>,
    #[command(flatten)]
    pub session: SessionOpts,
    #[command(flatten)]
    pub lifecycle: LifecycleOpts,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct KillArgs {
    /// Session ids.
    #[arg(required = true)]
    pub sessions: Vec<String>,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct TimeoutArgs {
    /// Session id.
    pub session: String,
    /// Seconds from now.
    pub secs: u64,
    #[command(flatten)]
    pub c: LocalOpts,
}
