use std::net::SocketAddr;

use clap::Args;

use super::LocalOpts;

#[derive(Debug, Args)]
pub struct McpArgs {
    /// Serve MCP over streamable HTTP at http://ADDR/mcp instead of stdio (e.g. 127.0.0.1:7071).
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// Remote mode: let --http listen on a non-loopback address; every client must then send
    /// the API key as a bearer token (on a loopback address too: it may be a forwarded port).
    #[arg(long, requires = "http")]
    pub allow_remote: bool,
    #[command(flatten)]
    pub c: LocalOpts,
}
