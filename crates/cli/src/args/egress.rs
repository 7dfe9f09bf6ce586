use clap::{Args, Subcommand};

use super::{LocalOpts, OnlyOpts};

#[derive(Debug, Args)]
pub struct NetworkArgs {
    /// Session id.
    pub session: String,
    /// The new mode: none (loopback only), open, or allowlist (the --allow destinations).
    #[arg(long, value_parser = ["none", "open", "allowlist"])]
    pub mode: String,
    /// Allowed destination for `--mode allowlist` (host, `*.domain`, CIDR, `:port` suffix);
    /// repeatable.
    #[arg(long = "allow", value_name = "DEST")]
    pub allow: Vec<String>,
    /// Refused destination, even where an allow entry or mode `open` covers it; repeatable.
    #[arg(long = "deny", value_name = "DEST")]
    pub deny: Vec<String>,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Subcommand)]
pub enum SecretCommand {
    /// Create or replace a secret; its value is read from stdin (never an argument, which
    /// other users could see in the process list).
    Set(SecretSetArgs),
    /// List your secrets: names and hosts, never values.
    Ls(OnlyOpts),
    /// Delete a secret (sessions using it keep their placeholder; nothing is injected anymore).
    Rm(SecretRmArgs),
}

#[derive(Debug, Args)]
pub struct SecretSetArgs {
    /// The secret's name, also the environment variable a session sees (`[A-Za-z_][A-Za-z0-9_]*`).
    pub name: String,
    /// A host the value may be sent to (`api.example.com`, `*.example.com`, an address, with
    /// an optional `:port`); repeatable, at least one.
    #[arg(long = "host", value_name = "HOST", required = true)]
    pub hosts: Vec<String>,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct SecretRmArgs {
    /// The secret's name.
    pub name: String,
    #[command(flatten)]
    pub c: LocalOpts,
}

/// The event types a webhook can subscribe to.
pub(crate) const WEBHOOK_EVENTS: [&str; 5] = [
    "session.created",
    "session.paused",
    "session.resumed",
    "session.stopped",
    "exec.verdict",
];

#[derive(Debug, Subcommand)]
pub enum WebhookCommand {
    /// Register an endpoint and print its id and signing secret (shown this once).
    Add(WebhookAddArgs),
    /// List your endpoints.
    Ls(OnlyOpts),
    /// Delete an endpoint (its pending deliveries are dropped).
    Rm(WebhookIdArgs),
    /// An endpoint's deliveries, newest first: state, attempts, the receiver's last answer.
    Deliveries(WebhookIdArgs),
}

#[derive(Debug, Args)]
pub struct WebhookAddArgs {
    /// `http` or `https` URL (loopback, private and reserved addresses are refused unless the
    /// daemon allows them with `[webhooks] allow_private`).
    #[arg(value_name = "URL")]
    pub target: String,
    /// An event type to deliver; repeatable (default: all).
    #[arg(long = "event", value_name = "EVENT", value_parser = WEBHOOK_EVENTS)]
    pub events: Vec<String>,
    /// Read the signing secret (16-256 characters) from stdin instead of letting the daemon
    /// make one.
    #[arg(long)]
    pub secret_stdin: bool,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct WebhookIdArgs {
    /// Webhook id (see `webhook ls`).
    pub id: String,
    #[command(flatten)]
    pub c: LocalOpts,
}
