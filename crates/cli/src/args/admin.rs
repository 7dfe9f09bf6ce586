use clap::{Args, Subcommand};

use super::{LocalOpts, OnlyOpts};

#[derive(Debug, Args)]
pub struct AdminArgs {
    #[command(subcommand)]
    pub what: AdminCommand,
}

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Tenants: plans, quotas, keys.
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// The daemons sharing this one's store: address, runtimes, capacity, load and state
    /// (`up`, `lost` after missed heartbeats, `left` after a clean shutdown).
    Nodes(OnlyOpts),
}

#[derive(Debug, Subcommand)]
pub enum TenantCommand {
    /// List tenants with their quotas and today's use.
    Ls(OnlyOpts),
    /// Show one tenant.
    Get(TenantIdArgs),
    /// Create or update a tenant (plan `none` has no sandbox access).
    Set(TenantSetArgs),
    /// Issue a new API key for a tenant (printed once).
    Key(TenantIdArgs),
}

#[derive(Debug, Args)]
pub struct TenantIdArgs {
    /// Tenant id.
    pub tenant: String,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct TenantSetArgs {
    /// Tenant id (created when new).
    pub tenant: String,
    /// Plan name (1-64 characters); `none` has no sandbox access.
    #[arg(long)]
    pub plan: String,
    /// Display name.
    #[arg(long)]
    pub name: Option<String>,
    /// Most live sessions at once (default: unlimited, or the server's).
    #[arg(long)]
    pub max_sessions: Option<u32>,
    /// Session minutes a day (default: unlimited, or the server's).
    #[arg(long = "daily-minutes", value_name = "MINUTES")]
    pub daily_session_minutes: Option<u64>,
    #[command(flatten)]
    pub c: LocalOpts,
}
