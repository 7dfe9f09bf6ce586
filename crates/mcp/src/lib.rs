//! MCP (Model Context Protocol) server for koder-sandbox: the tools an agent needs to run code
//! safely (sessions, code and commands with their verdicts, files, background processes,
//! preview URLs), served over stdio or streamable HTTP with the official Rust SDK (`rmcp`).
//!
//! It is a client of the daemon's REST API (through `koder-sdk`) like the CLI: every tool call
//! is a REST request authenticated with the configured API key, and every failure comes back as
//! a tool error carrying the daemon's `SANDBOX-...` code.
//!
//! Layers: `args` (what a tool accepts, checked) → `reply` (reading arguments, answering) →
//! `server` (the tools) → `http` (the streamable HTTP transport); stdio is here.

mod args;
mod http;
mod reply;
mod server;

use rmcp::ServiceExt as _;

pub use http::{serve_http, HttpOptions, HttpServer, MCP_PATH};
pub use reply::{ToolError, CANCELLED, TRANSPORT};
pub use server::SandboxMcp;

/// Why serving stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The MCP handshake on stdio failed (the client sent something else, or went away).
    #[error("MCP initialization failed: {0}")]
    Initialize(String),
    /// The server's task ended abnormally.
    #[error("MCP server task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// Binding or serving the HTTP listener.
    #[error("MCP HTTP server: {0}")]
    Io(#[from] std::io::Error),
    /// An HTTP listen address this server refuses (see [`HttpOptions`]).
    #[error("{0}")]
    Address(String),
}

/// Serves MCP on this process's stdin/stdout until the client closes them.
pub async fn serve_stdio(server: SandboxMcp) -> Result<(), Error> {
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| Error::Initialize(e.to_string()))?;
    running.waiting().await?;
    Ok(())
}
