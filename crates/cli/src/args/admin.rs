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
    pub tenant: String,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct TenantSetArgs {
    pub tenant: String,
    #[arg(long)]
    pub plan: String,
    #[arg(long)]
    pub name: Option<String>,
    #[arg(long)]
    pub max_sessions: Option<u32>,
    #[arg(long = "daily-minutes")]
    pub daily_session_minutes: Option<u64>,
    #[command(flatten)]
    pub c: LocalOpts,
}
