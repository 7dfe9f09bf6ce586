//! `ksandbox mcp`: the MCP server (crate `koder-mcp`) on stdio or streamable HTTP.

use koder_mcp::{HttpOptions, HttpServer, SandboxMcp, MCP_PATH};
use tokio::signal::unix::{signal, SignalKind};

use super::Ctx;
use crate::args::McpArgs;
use crate::error::{CliError, Result};

pub async fn run(ctx: Ctx, api_key: String, a: McpArgs) -> Result<i32> {
    let server = SandboxMcp::new(ctx.client);
    let failed = |e: koder_mcp::Error| CliError::msg(e.to_string());
    let Some(listen) = a.http else {
        koder_mcp::serve_stdio(server).await.map_err(failed)?;
        return Ok(0);
    };
    let opts = HttpOptions {
        listen,
        allow_remote: a.allow_remote,
        api_key,
    };
    let http = HttpServer::bind(&opts).await.map_err(failed)?;
    let addr = http.local_addr().map_err(failed)?;
    // On stderr like every diagnostic of this command (in stdio mode stdout is the protocol).
    eprintln!("ksandbox mcp: streamable HTTP on http://{addr}{MCP_PATH}");
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let stop = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    };
    http.serve(server, stop).await.map_err(failed)?;
    Ok(0)
}
