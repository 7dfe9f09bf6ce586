//! Streamable HTTP transport: rmcp's `StreamableHttpService` at `/mcp` on an axum server.
//!
//! Whoever reaches this endpoint acts with the configured API key, so it binds loopback unless
//! told otherwise, and answers only requests that cannot come from a web page: a `Host` that
//! names loopback (DNS rebinding) and no `Origin` header (rmcp checks both). A non-loopback
//! listener is allowed only on request, and then every request must carry the API key itself
//! as a bearer token: being on the network proves nothing.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::{Error, SandboxMcp};

/// Where the MCP endpoint is served, relative to the listener.
pub const MCP_PATH: &str = "/mcp";

/// How `ksandbox mcp --http` listens.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    pub listen: SocketAddr,
    /// Accept a non-loopback `listen` address (then clients must present `api_key`).
    pub allow_remote: bool,
    /// The API key the server's daemon requests carry.
    pub api_key: String,
}

/// A bound MCP HTTP listener, not serving yet (so the caller can show its address first).
pub struct HttpServer {
    listener: TcpListener,
    /// Set in remote mode: the bearer token every request must carry.
    required_key: Option<Arc<str>>,
}

impl HttpServer {
    pub async fn bind(opts: &HttpOptions) -> Result<HttpServer, Error> {
        let required_key = required_key(opts)?;
        let listener = TcpListener::bind(opts.listen).await?;
        Ok(HttpServer {
            listener,
            required_key,
        })
    }

    pub fn local_addr(&self) -> Result<SocketAddr, Error> {
        Ok(self.listener.local_addr()?)
    }

    /// Serves until `shutdown` completes, then ends every MCP session.
    pub async fn serve(
        self,
        mcp: SandboxMcp,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), Error> {
        let stop = CancellationToken::new();
        let app = router(mcp, self.required_key, stop.clone());
        let ended = stop.clone();
        axum::serve(self.listener, app)
            .with_graceful_shutdown(async move {
                shutdown.await;
                ended.cancel();
            })
            .await?;
        stop.cancel();
        Ok(())
    }
}

/// [`HttpServer::bind`] then [`HttpServer::serve`].
pub async fn serve_http(
    mcp: SandboxMcp,
    opts: &HttpOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    HttpServer::bind(opts).await?.serve(mcp, shutdown).await
}

/// The bearer token clients must present in remote mode (`allow_remote`: wherever it listens,
/// for a loopback port may be forwarded from afar), or `None` for a loopback-only server.
fn required_key(opts: &HttpOptions) -> Result<Option<Arc<str>>, Error> {
    if !opts.allow_remote {
        if opts.listen.ip().is_loopback() {
            return Ok(None);
        }
        return Err(Error::Address(format!(
            "{} is not a loopback address: whoever reaches the MCP endpoint uses your API key; \
             pass --allow-remote to listen there (clients must then send the key as a bearer token)",
            opts.listen
        )));
    }
    if opts.api_key.is_empty() {
        return Err(Error::Address(
            "--allow-remote needs an API key (--api-key or KSANDBOX_API_KEY), which \
             every client must present"
                .into(),
        ));
    }
    Ok(Some(Arc::from(opts.api_key.as_str())))
}

fn router(
    mcp: SandboxMcp,
    required_key: Option<Arc<str>>,
    stop: CancellationToken,
) -> axum::Router {
    let mut config = StreamableHttpServerConfig::default()
        .enforce_origin_validation()
        .with_cancellation_token(stop);
    if required_key.is_some() {
        // The Host check defends loopback servers against DNS rebinding; a remote one is
        // reached by names this server cannot know, and the bearer check stands in for it.
        config = config.disable_allowed_hosts();
    }
    let service = StreamableHttpService::new(
        move || Ok(mcp.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let app = axum::Router::new().nest_service(MCP_PATH, service);
    match required_key {
        Some(key) => app.layer(axum::middleware::from_fn_with_state(key, check_bearer)),
        None => app,
    }
}

async fn check_bearer(State(key): State<Arc<str>>, req: Request, next: Next) -> Response {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if presented.is_some_and(|p| same_secret(p, &key)) {
        return next.run(req).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "this MCP endpoint needs the API key as a bearer token\n",
    )
        .into_response()
}

/// Constant-time equality, so response timing does not reveal how much of a guess was right.
fn same_secret(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq as _;
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

#[cfg(test)]
mod tests;
