//! Rust client for the koder-sandbox REST API (contract: `docs/API.md`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), koder_sdk::Error> {
//! use koder_sdk::{Client, CreateSession};
//!
//! let client = Client::from_env()?; // KSANDBOX_URL, KSANDBOX_API_KEY
//! let session = client
//!     .create_session(&CreateSession { language: Some("python".into()), ..Default::default() })
//!     .await?;
//! let out = session.run_code("python", "print(6 * 7)").await?;
//! assert_eq!(out.stdout, "42\n");
//! session.upload("/workspace/data.bin", tokio::fs::File::open("data.bin").await?).await?;
//! session.download_to("/workspace/data.bin", tokio::fs::File::create("copy.bin").await?).await?;
//! session.destroy().await?;
//! # Ok(()) }
//! ```
//!
//! Every call maps a non-2xx answer to [`Error::Api`] carrying the stable `SANDBOX-...` code.
//! Uploads and downloads stream: a file is never held whole in memory unless you ask for it
//! ([`Session::download`]).

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use reqwest::{header, Method, Response, StatusCode, Url};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::CertificateDer;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

mod egress;
mod images;
pub use images::BuildEvent;
pub mod interp;
pub mod live;

pub use koder_api_types as types;
pub use koder_api_types::{
    codes, CreateSession, CreateVolume, EntryType, ExecRequest, ExecResult, FileEntry, FileList,
    Lifecycle, Limits, Network, NetworkMode, OnTimeout, PauseKind, SessionState, SessionVolume,
    Snapshot, Volume, VolumeMountRequest, VolumeUse,
};
pub use reqwest::Body;

/// Where [`Client::from_env`] connects when `KSANDBOX_URL` is unset.
pub const DEFAULT_URL: &str = "http://127.0.0.1:7070";
/// Environment variable holding the daemon's base URL.
pub const ENV_URL: &str = "KSANDBOX_URL";
/// Environment variable holding the API key (bearer token).
pub const ENV_API_KEY: &str = "KSANDBOX_API_KEY";
/// Environment variable naming a PEM file of extra trusted CA certificates.
pub const ENV_CA_CERT: &str = "KSANDBOX_CA_CERT";

/// Chunk size used when streaming a local reader into an upload.
const UPLOAD_CHUNK: usize = 64 * 1024;
/// How much of a non-JSON error body is kept in the synthetic error message.
const MAX_ERROR_TEXT: usize = 512;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The daemon answered with a non-2xx status. `code` is the stable `SANDBOX-...` code from
    /// the `{"error": {...}}` body, or `SANDBOX-HTTP-<status>` when the body was not that shape.
    #[error("{code}: {message}")]
    Api {
        status: u16,
        code: String,
        message: String,
        details: Option<Value>,
    },
    /// The request could not be sent or the answer could not be read (connection refused,
    /// reset, a failing upload source, ...).
    #[error("transport error: {}", error_chain(.0))]
    Transport(reqwest::Error),
    /// A WebSocket (terminal, file watch) could not connect to the daemon at `url`.
    #[error("cannot connect to {url}: {source}")]
    Connect { url: String, source: std::io::Error },
    /// A 2xx answer whose body is not the documented JSON shape.
    #[error("could not decode the daemon's answer: {0}")]
    Decode(String),
    /// Local I/O (writing a download, opening an upload source).
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The base URL given to [`Client::new`] is unusable.
    #[error("invalid base URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    /// An id, name or key that a URL path cannot carry as one segment: empty, `.` or `..`
    /// (URLs resolve those away, so the request would reach another route).
    #[error("{0:?} cannot be sent as an id or name")]
    InvalidName(String),
    /// A CA certificate given to [`ClientBuilder`] is unusable.
    #[error("TLS configuration: {0}")]
    Tls(String),
    /// An event stream ended (or was cut off mid-event) before its final `exit` event, so the
    /// exec's outcome is unknown.
    #[error("the event stream ended before the exec's exit event")]
    StreamEnded,
}

impl Error {
    /// The `SANDBOX-...` code of an API error (including the synthetic `SANDBOX-HTTP-<status>`).
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The HTTP status of an API error.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// True for 404 `SANDBOX-NOT-FOUND` (unknown id or another tenant's session).
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(404)
    }

    /// Builds the error for a non-2xx answer from its status and body.
    pub fn from_response_parts(status: u16, body: &[u8]) -> Error {
        if let Ok(parsed) = serde_json::from_slice::<types::ErrorBody>(body) {
            return Error::Api {
                status,
                code: parsed.error.code,
                message: parsed.error.message,
                details: parsed.error.details,
            };
        }
        let text = String::from_utf8_lossy(body);
        let text = text.trim();
        let message = if text.is_empty() {
            StatusCode::from_u16(status)
                .ok()
                .and_then(|s| s.canonical_reason())
                .unwrap_or("HTTP error")
                .to_string()
        } else {
            truncate(text, MAX_ERROR_TEXT)
        };
        Error::Api {
            status,
            code: format!("SANDBOX-HTTP-{status}"),
            message,
            details: None,
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            let _ = write!(out, ": {text}");
        }
        source = s.source();
    }
    out
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// Wraps any reader as a streaming request body (sent chunked, never buffered whole).
pub fn body_from_reader<R>(reader: R) -> Body
where
    R: AsyncRead + Send + 'static,
{
    Body::wrap_stream(tokio_util::io::ReaderStream::with_capacity(
        reader,
        UPLOAD_CHUNK,
    ))
}

/// A connection to one daemon, authenticated as one tenant. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    base: Url,
    api_key: Option<String>,
    /// The TLS settings of `wss://` connections (terminal, file watch), which do not go
    /// through `http`; the same roots as `http` trusts.
    ws_tls: Arc<rustls::ClientConfig>,
}

/// Builds a [`Client`] with more than a URL and a key: extra trusted CA certificates for a
/// daemon behind a private CA.
///
/// ```no_run
/// # fn demo() -> Result<(), koder_sdk::Error> {
/// let client = koder_sdk::Client::builder("https://sandbox.internal:7443")
///     .api_key("ksk_...")
///     .add_ca_file("/etc/koder/ca.pem")?
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    base_url: String,
    api_key: String,
    extra_roots: Vec<CertificateDer<'static>>,
}

impl ClientBuilder {
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = key.into();
        self
    }

    /// Trusts every certificate of a PEM bundle, on top of the public (webpki) roots.
    pub fn add_ca_pem(mut self, pem: &[u8]) -> Result<Self> {
        let certs = CertificateDer::pem_slice_iter(pem)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::Tls(format!("CA certificate PEM: {e}")))?;
        if certs.is_empty() {
            return Err(Error::Tls("no certificate in the CA PEM".into()));
        }
        self.extra_roots.extend(certs);
        Ok(self)
    }

    /// [`ClientBuilder::add_ca_pem`] with the contents of a file.
    pub fn add_ca_file(self, path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let pem = std::fs::read(path)
            .map_err(|e| Error::Tls(format!("reading CA certificate {}: {e}", path.display())))?;
        self.add_ca_pem(&pem)
            .map_err(|e| Error::Tls(format!("{}: {e}", path.display())))
    }

    pub fn build(self) -> Result<Client> {
        let mut http = reqwest::Client::builder().connect_timeout(Duration::from_secs(10));
        for der in &self.extra_roots {
            let cert = reqwest::Certificate::from_der(der)
                .map_err(|e| Error::Tls(format!("CA certificate: {e}")))?;
            http = http.add_root_certificate(cert);
        }
        let http = http.build().map_err(Error::Transport)?;
        let ws_tls = websocket_tls(&self.extra_roots)?;
        let mut client = Client::with_http_client(self.base_url, self.api_key, http)?;
        client.ws_tls = ws_tls;
        Ok(client)
    }
}

/// rustls settings with the public roots plus `extra`; the provider is named explicitly so
/// that no process-wide default has to be installed.
fn websocket_tls(extra: &[CertificateDer<'static>]) -> Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    for cert in extra {
        roots
            .add(cert.clone())
            .map_err(|e| Error::Tls(format!("CA certificate: {e}")))?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Error::Tls(e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(config))
}

impl Client {
    /// `base_url` like `http://127.0.0.1:7070` (a path prefix is kept); an empty `api_key`
    /// sends no `Authorization` header.
    pub fn new(base_url: impl AsRef<str>, api_key: impl Into<String>) -> Result<Self> {
        Self::builder(base_url.as_ref()).api_key(api_key).build()
    }

    /// A [`ClientBuilder`] for `base_url` (no API key until [`ClientBuilder::api_key`]).
    pub fn builder(base_url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            base_url: base_url.into(),
            api_key: String::new(),
            extra_roots: Vec::new(),
        }
    }

    /// Like [`Client::new`] with a caller-configured `reqwest::Client`.
    pub fn with_http_client(
        base_url: impl AsRef<str>,
        api_key: impl Into<String>,
        http: reqwest::Client,
    ) -> Result<Self> {
        let raw = base_url.as_ref().trim();
        let invalid = |reason: &str| Error::InvalidUrl {
            url: raw.to_string(),
            reason: reason.to_string(),
        };
        let mut base = Url::parse(raw).map_err(|e| invalid(&e.to_string()))?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(invalid("scheme must be http or https"));
        }
        if base.cannot_be_a_base() {
            return Err(invalid("not a base URL"));
        }
        base.set_query(None);
        base.set_fragment(None);
        let api_key = api_key.into();
        Ok(Client {
            http,
            base,
            api_key: (!api_key.is_empty()).then_some(api_key),
            ws_tls: websocket_tls(&[])?,
        })
    }

    /// `KSANDBOX_URL` (default `http://127.0.0.1:7070`), `KSANDBOX_API_KEY` and
    /// `KSANDBOX_CA_CERT`.
    pub fn from_env() -> Result<Self> {
        let url = std::env::var(ENV_URL)
            .ok()
            .filter(|u| !u.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_URL.to_string());
        let key = std::env::var(ENV_API_KEY).unwrap_or_default();
        let mut builder = Self::builder(url).api_key(key);
        if let Some(ca) = std::env::var_os(ENV_CA_CERT).filter(|c| !c.is_empty()) {
            builder = builder.add_ca_file(ca)?;
        }
        builder.build()
    }

    pub fn base_url(&self) -> &Url {
        &self.base
    }

    /// The base URL with `segments` appended, each percent-encoded as one path segment.
    /// A segment that is empty, `.` or `..` is refused ([`Error::InvalidName`]) rather than
    /// dropped, as the URL rules would, which would send the request elsewhere.
    pub fn url(&self, segments: &[&str]) -> Result<Url> {
        if let Some(bad) = segments.iter().find(|s| matches!(**s, "" | "." | "..")) {
            return Err(Error::InvalidName((*bad).to_string()));
        }
        let mut url = self.base.clone();
        {
            let mut path = url.path_segments_mut().map_err(|()| Error::InvalidUrl {
                url: self.base.to_string(),
                reason: "not a base URL".into(),
            })?;
            path.pop_if_empty().extend(segments);
        }
        Ok(url)
    }

    fn session_url(&self, id: &str, rest: &[&str]) -> Result<Url> {
        let mut segments = vec!["v1", "sandbox", "sessions", id];
        segments.extend_from_slice(rest);
        self.url(&segments)
    }

    fn request(&self, method: Method, url: Url) -> reqwest::RequestBuilder {
        let builder = self.http.request(method, url);
        match &self.api_key {
            Some(key) => builder.bearer_auth(key),
            None => builder,
        }
    }

    async fn send(&self, builder: reqwest::RequestBuilder) -> Result<Response> {
        let response = builder.send().await.map_err(Error::Transport)?;
        check(response).await
    }

    // ---- health ----

    /// `GET /healthz` answered 200. Any failure (including connection refused) is `false`.
    pub async fn health(&self) -> bool {
        let Ok(url) = self.url(&["healthz"]) else {
            return false;
        };
        match self.http.get(url).send().await {
            Ok(resp) => resp.status() == StatusCode::OK,
            Err(_) => false,
        }
    }

    // ---- sessions ----

    /// `POST /v1/sandbox/sessions`.
    pub async fn create_session(&self, req: &CreateSession) -> Result<Session> {
        let url = self.url(&["v1", "sandbox", "sessions"])?;
        let resp = self.send(self.request(Method::POST, url).json(req)).await?;
        let info: types::Session = decode(resp).await?;
        Ok(Session::from_info(self.clone(), info))
    }

    /// A handle on an existing session (`GET /v1/sandbox/sessions/{id}`).
    pub async fn session(&self, id: &str) -> Result<Session> {
        let info = self.get_session(id).await?;
        Ok(Session::from_info(self.clone(), info))
    }

    /// `GET /v1/sandbox/sessions/{id}`.
    pub async fn get_session(&self, id: &str) -> Result<types::Session> {
        let url = self.session_url(id, &[])?;
        decode(self.send(self.request(Method::GET, url)).await?).await
    }

    /// `GET /v1/sandbox/sessions`: this tenant's sessions.
    pub async fn list_sessions(&self) -> Result<Vec<types::Session>> {
        let url = self.url(&["v1", "sandbox", "sessions"])?;
        let list: types::SessionList =
            decode(self.send(self.request(Method::GET, url)).await?).await?;
        Ok(list.sessions)
    }

    /// `POST /v1/sandbox/sessions/{id}/timeout`; returns the updated session.
    pub async fn set_timeout(&self, id: &str, timeout_s: u64) -> Result<types::Session> {
        let url = self.session_url(id, &["timeout"])?;
        let resp = self
            .send(
                self.request(Method::POST, url)
                    .json(&types::SetTimeout { timeout_s }),
            )
            .await?;
        let body = resp.bytes().await.map_err(Error::Transport)?;
        match serde_json::from_slice::<types::Session>(&body) {
            Ok(info) => Ok(info),
            // The contract does not fix this answer's body: fetch the session instead.
            Err(_) => self.get_session(id).await,
        }
    }

    /// `GET /v1/sandbox/sessions/{id}/metrics`: live resource use.
    pub async fn session_metrics(&self, id: &str) -> Result<types::SessionMetrics> {
        let url = self.session_url(id, &["metrics"])?;
        decode(self.send(self.request(Method::GET, url)).await?).await
    }

    /// `GET /v1/sandbox/sessions/{id}/events`: the session's event log (a stopped one's too),
    /// the events numbered above `after`, oldest first, at most `limit` (the server's 500 when
    /// `None`); `more` says whether another page follows.
    pub async fn session_events(
        &self,
        id: &str,
        after: u64,
        limit: Option<u32>,
    ) -> Result<types::SessionEventList> {
        let url = self.session_url(id, &["events"])?;
        let mut builder = self.request(Method::GET, url).query(&[("after", after)]);
        if let Some(limit) = limit {
            builder = builder.query(&[("limit", limit)]);
        }
        decode(self.send(builder).await?).await
    }

    /// `POST /v1/sandbox/sessions/{id}/kill-processes`: SIGKILLs every process in the session
    /// (a fork bomb, a wedged tree) and keeps the session; returns how many were signalled.
    pub async fn kill_processes(&self, id: &str) -> Result<u32> {
        let url = self.session_url(id, &["kill-processes"])?;
        let killed: types::KilledProcesses =
            decode(self.send(self.request(Method::POST, url)).await?).await?;
        Ok(killed.killed)
    }

    // ---- state that outlives a sandbox: snapshots, pauses, forks ----

    /// `POST /v1/sandbox/sessions` with `from_snapshot`: a new session on a snapshot's
    /// filesystem; the rest of `req` (limits, lifecycle, ...) applies as for any create.
    pub async fn create_from_snapshot(
        &self,
        snapshot_id: impl Into<String>,
        req: CreateSession,
    ) -> Result<Session> {
        let req = CreateSession {
            from_snapshot: Some(snapshot_id.into()),
            ..req
        };
        self.create_session(&req).await
    }

    /// `POST /v1/sandbox/sessions/{id}/snapshot`: captures the session's filesystem. A full
    /// snapshot store is `SANDBOX-QUOTA-SNAPSHOT-STORAGE` (507).
    pub async fn snapshot_session(&self, id: &str, name: Option<&str>) -> Result<Snapshot> {
        let url = self.session_url(id, &["snapshot"])?;
        let body = types::CreateSnapshot {
            name: name.map(String::from),
        };
        decode(
            self.send(self.request(Method::POST, url).json(&body))
                .await?,
        )
        .await
    }

    /// `POST /v1/sandbox/sessions/{id}/restore`: the session restarts on the snapshot's
    /// filesystem (its processes end); returns the session.
    pub async fn restore_session(&self, id: &str, snapshot_id: &str) -> Result<types::Session> {
        let url = self.session_url(id, &["restore"])?;
        let body = types::RestoreSnapshot {
            snapshot_id: snapshot_id.into(),
        };
        decode(
            self.send(self.request(Method::POST, url).json(&body))
                .await?,
        )
        .await
    }

    /// `POST /v1/sandbox/sessions/{id}/fork`: `count` (1–100) new sessions, each on a copy of
    /// this one's filesystem.
    pub async fn fork_session(&self, id: &str, count: u32) -> Result<Vec<types::Session>> {
        let url = self.session_url(id, &["fork"])?;
        let body = types::ForkSession { count };
        let forked: types::ForkResult = decode(
            self.send(self.request(Method::POST, url).json(&body))
                .await?,
        )
        .await?;
        Ok(forked.sessions)
    }

    /// `POST /v1/sandbox/sessions/{id}/pause`: [`PauseKind::Memory`] freezes the processes in
    /// place, [`PauseKind::Disk`] keeps only the filesystem, durably.
    pub async fn pause_session(&self, id: &str, kind: PauseKind) -> Result<types::Session> {
        let url = self.session_url(id, &["pause"])?;
        let body = types::PauseSession {
            memory: Some(kind == PauseKind::Memory),
        };
        decode(
            self.send(self.request(Method::POST, url).json(&body))
                .await?,
        )
        .await
    }

    /// `POST /v1/sandbox/sessions/{id}/resume`.
    pub async fn resume_session(&self, id: &str) -> Result<types::Session> {
        let url = self.session_url(id, &["resume"])?;
        decode(self.send(self.request(Method::POST, url)).await?).await
    }

    fn snapshot_url(&self, id: Option<&str>) -> Result<Url> {
        let mut segments = vec!["v1", "sandbox", "snapshots"];
        segments.extend(id);
        self.url(&segments)
    }

    /// `GET /v1/sandbox/snapshots`: this tenant's snapshots.
    pub async fn list_snapshots(&self) -> Result<Vec<Snapshot>> {
        let url = self.snapshot_url(None)?;
        let list: types::SnapshotList =
            decode(self.send(self.request(Method::GET, url)).await?).await?;
        Ok(list.snapshots)
    }

    /// `GET /v1/sandbox/snapshots/{id}`.
    pub async fn get_snapshot(&self, id: &str) -> Result<Snapshot> {
        let url = self.snapshot_url(Some(id))?;
        decode(self.send(self.request(Method::GET, url)).await?).await
    }

    /// `DELETE /v1/sandbox/snapshots/{id}`.
    pub async fn delete_snapshot(&self, id: &str) -> Result<()> {
        let url = self.snapshot_url(Some(id))?;
        self.send(self.request(Method::DELETE, url)).await?;
        Ok(())
    }

    // ---- admin (the client's key must be an admin key) ----

    fn admin_url(&self, rest: &[&str]) -> Result<Url> {
        let mut segments = vec!["v1", "sandbox", "admin", "tenants"];
        segments.extend_from_slice(rest);
        self.url(&segments)
    }

    /// `GET /v1/sandbox/admin/tenants`.
    pub async fn admin_tenants(&self) -> Result<Vec<types::TenantInfo>> {
        let list: types::TenantList = decode(
            self.send(self.request(Method::GET, self.admin_url(&[])?))
                .await?,
        )
        .await?;
        Ok(list.tenants)
    }

    /// `GET /v1/sandbox/admin/tenants/{id}`.
    pub async fn admin_tenant(&self, id: &str) -> Result<types::TenantInfo> {
        decode(
            self.send(self.request(Method::GET, self.admin_url(&[id])?))
                .await?,
        )
        .await
    }

    /// `PUT /v1/sandbox/admin/tenants/{id}`: create or update a tenant's plan and quotas.
    pub async fn admin_put_tenant(
        &self,
        id: &str,
        req: &types::PutTenant,
    ) -> Result<types::TenantInfo> {
        let url = self.admin_url(&[id])?;
        decode(self.send(self.request(Method::PUT, url).json(req)).await?).await
    }

    /// `POST /v1/sandbox/admin/tenants/{id}/keys`: a new API key, shown only in this answer.
    pub async fn admin_issue_key(&self, id: &str) -> Result<types::IssuedKey> {
        let url = self.admin_url(&[id, "keys"])?;
        decode(self.send(self.request(Method::POST, url)).await?).await
    }

    /// `GET /v1/sandbox/admin/nodes`: the daemons sharing this one's store, with their state
    /// (`up`, `lost`, `left`) and last reported load.
    pub async fn admin_nodes(&self) -> Result<Vec<types::NodeInfo>> {
        let url = self.url(&["v1", "sandbox", "admin", "nodes"])?;
        let list: types::NodeList =
            decode(self.send(self.request(Method::GET, url)).await?).await?;
        Ok(list.nodes)
    }

    /// `DELETE /v1/sandbox/sessions/{id}`.
    pub async fn destroy_session(&self, id: &str) -> Result<()> {
        let url = self.session_url(id, &[])?;
        self.send(self.request(Method::DELETE, url)).await?;
        Ok(())
    }

    // ---- exec ----

    /// `POST /v1/sandbox/sessions/{id}/exec` (non-streaming JSON form).
    pub async fn exec(&self, id: &str, req: &ExecRequest) -> Result<ExecResult> {
        let url = self.session_url(id, &["exec"])?;
        let builder = self
            .request(Method::POST, url)
            .header(header::ACCEPT, "application/json")
            .json(req);
        decode(self.send(builder).await?).await
    }

    // ---- files ----

    /// `PUT .../files?path=`: `body` may be bytes (`Vec<u8>`, `Bytes`, `String`), a
    /// `tokio::fs::File`, or any reader via [`body_from_reader`]; streams are sent chunked.
    pub async fn upload(&self, id: &str, path: &str, body: impl Into<Body>) -> Result<FileEntry> {
        self.upload_inner(id, path, body.into(), None).await
    }

    /// Streams a local file, announcing its length up front.
    pub async fn upload_file(
        &self,
        id: &str,
        path: &str,
        local: impl AsRef<Path>,
    ) -> Result<FileEntry> {
        let (body, len) = open_upload(local.as_ref()).await?;
        self.upload_inner(id, path, body, Some(len)).await
    }

    /// Streams any reader.
    pub async fn upload_reader<R>(&self, id: &str, path: &str, reader: R) -> Result<FileEntry>
    where
        R: AsyncRead + Send + 'static,
    {
        self.upload_inner(id, path, body_from_reader(reader), None)
            .await
    }

    async fn upload_inner(
        &self,
        id: &str,
        path: &str,
        body: Body,
        len: Option<u64>,
    ) -> Result<FileEntry> {
        let url = file_url(self.session_url(id, &["files"])?, path, &[]);
        self.upload_to(url, body, len).await
    }

    /// `PUT url` with `body` as the file's bytes.
    async fn upload_to(&self, url: Url, body: Body, len: Option<u64>) -> Result<FileEntry> {
        let mut builder = self
            .request(Method::PUT, url)
            .header(header::CONTENT_TYPE, "application/octet-stream");
        if let Some(len) = len {
            builder = builder.header(header::CONTENT_LENGTH, len);
        }
        decode(self.send(builder.body(body)).await?).await
    }

    async fn download_response(&self, id: &str, path: &str) -> Result<Response> {
        let url = file_url(self.session_url(id, &["files"])?, path, &[]);
        self.send(self.request(Method::GET, url)).await
    }

    /// `GET .../files?path=` into memory. Prefer [`Client::download_to`] for big files.
    pub async fn download(&self, id: &str, path: &str) -> Result<Bytes> {
        let resp = self.download_response(id, path).await?;
        resp.bytes().await.map_err(Error::Transport)
    }

    /// `GET .../files?path=` as a stream of chunks.
    pub async fn download_stream(
        &self,
        id: &str,
        path: &str,
    ) -> Result<impl Stream<Item = Result<Bytes>> + Send + 'static> {
        Ok(body_stream(self.download_response(id, path).await?))
    }

    /// Streams `GET .../files?path=` into `writer` (flushed at the end); returns the byte count.
    pub async fn download_to<W>(&self, id: &str, path: &str, writer: W) -> Result<u64>
    where
        W: AsyncWrite + Unpin,
    {
        write_stream(self.download_stream(id, path).await?, writer).await
    }

    /// `GET .../files/list?path=&depth=`.
    pub async fn list_files(&self, id: &str, path: &str, depth: Option<u32>) -> Result<FileList> {
        let url = self.session_url(id, &["files", "list"])?;
        let mut builder = self.request(Method::GET, url).query(&[("path", path)]);
        if let Some(depth) = depth {
            builder = builder.query(&[("depth", depth)]);
        }
        decode(self.send(builder).await?).await
    }

    /// `GET .../files/stat?path=`: one entry (a symlink is described, not followed).
    pub async fn stat(&self, id: &str, path: &str) -> Result<FileEntry> {
        let url = self.session_url(id, &["files", "stat"])?;
        let builder = self.request(Method::GET, url).query(&[("path", path)]);
        decode(self.send(builder).await?).await
    }

    /// `DELETE .../files?path=&recursive=`.
    pub async fn remove(&self, id: &str, path: &str, recursive: bool) -> Result<()> {
        let url = self.session_url(id, &["files"])?;
        let recursive = if recursive { "true" } else { "false" };
        self.send(
            self.request(Method::DELETE, url)
                .query(&[("path", path), ("recursive", recursive)]),
        )
        .await?;
        Ok(())
    }

    /// `POST .../files/mkdir {"path"}`.
    pub async fn mkdir(&self, id: &str, path: &str) -> Result<()> {
        let url = self.session_url(id, &["files", "mkdir"])?;
        let body = types::MakeDir { path: path.into() };
        self.send(self.request(Method::POST, url).json(&body))
            .await?;
        Ok(())
    }

    /// `POST .../files/move {"from","to"}`.
    pub async fn rename(&self, id: &str, from: &str, to: &str) -> Result<()> {
        let url = self.session_url(id, &["files", "move"])?;
        let body = types::MoveFile {
            from: from.into(),
            to: to.into(),
        };
        self.send(self.request(Method::POST, url).json(&body))
            .await?;
        Ok(())
    }

    // ---- volumes: named directories that outlive sessions (mounted by CreateSession.volumes) ----

    /// `.../volumes[/{key}][/rest...]`; `key` is a volume id or name.
    fn volume_url(&self, key: Option<&str>, rest: &[&str]) -> Result<Url> {
        let mut segments = vec!["v1", "sandbox", "volumes"];
        segments.extend(key);
        segments.extend_from_slice(rest);
        self.url(&segments)
    }

    /// `.../volumes/{key}/files[/op]?path=&extra...`
    fn volume_file_url(
        &self,
        key: &str,
        op: Option<&str>,
        path: &str,
        extra: &[(&str, String)],
    ) -> Result<Url> {
        let rest: Vec<&str> = std::iter::once("files").chain(op).collect();
        Ok(file_url(self.volume_url(Some(key), &rest)?, path, extra))
    }

    /// `POST /v1/sandbox/volumes`: a new, empty volume with a quota of `size_mib` (default: the
    /// server's). A taken name is 409; no room left for the tenant's volumes is
    /// `SANDBOX-QUOTA-VOLUME-STORAGE` (507); a server without volumes answers 501.
    pub async fn create_volume(&self, name: &str, size_mib: Option<u64>) -> Result<Volume> {
        self.post_volume(&CreateVolume {
            name: name.into(),
            size_mib,
            from_volume: None,
        })
        .await
    }

    /// `POST /v1/sandbox/volumes` with `from_volume`: a copy of `source` (id or name) as it is
    /// now, with its size. An ext4-backed source must not be mounted by a session
    /// (`SANDBOX-VOLUME-BUSY`).
    pub async fn copy_volume(&self, source: &str, name: &str) -> Result<Volume> {
        self.post_volume(&CreateVolume {
            name: name.into(),
            size_mib: None,
            from_volume: Some(source.into()),
        })
        .await
    }

    async fn post_volume(&self, body: &CreateVolume) -> Result<Volume> {
        let url = self.volume_url(None, &[])?;
        decode(
            self.send(self.request(Method::POST, url).json(body))
                .await?,
        )
        .await
    }

    /// `GET /v1/sandbox/volumes`: this tenant's volumes.
    pub async fn list_volumes(&self) -> Result<Vec<Volume>> {
        let url = self.volume_url(None, &[])?;
        let list: types::VolumeList =
            decode(self.send(self.request(Method::GET, url)).await?).await?;
        Ok(list.volumes)
    }

    /// `GET /v1/sandbox/volumes/{key}` (id or name).
    pub async fn get_volume(&self, key: &str) -> Result<Volume> {
        let url = self.volume_url(Some(key), &[])?;
        decode(self.send(self.request(Method::GET, url)).await?).await
    }

    /// `DELETE /v1/sandbox/volumes/{key}`: the volume and its files. While a session has it
    /// mounted this is `SANDBOX-VOLUME-BUSY` (409).
    pub async fn delete_volume(&self, key: &str) -> Result<()> {
        let url = self.volume_url(Some(key), &[])?;
        self.send(self.request(Method::DELETE, url)).await?;
        Ok(())
    }

    /// `PUT .../volumes/{key}/files?path=`: writes a file without a session (`path` is
    /// volume-absolute, `/` the volume's root). `body` as for [`Client::upload`]. An existing
    /// file without [`VolumeWrite::overwrite`] is 409, a missing parent 404, a full volume 507.
    pub async fn volume_upload(
        &self,
        key: &str,
        path: &str,
        body: impl Into<Body>,
        opts: &VolumeWrite,
    ) -> Result<FileEntry> {
        let url = self.volume_file_url(key, None, path, &opts.query())?;
        self.upload_to(url, body.into(), None).await
    }

    /// [`Client::volume_upload`] streaming a local file, its length announced up front.
    pub async fn volume_upload_file(
        &self,
        key: &str,
        path: &str,
        local: impl AsRef<Path>,
        opts: &VolumeWrite,
    ) -> Result<FileEntry> {
        let (body, len) = open_upload(local.as_ref()).await?;
        let url = self.volume_file_url(key, None, path, &opts.query())?;
        self.upload_to(url, body, Some(len)).await
    }

    async fn volume_download_response(&self, key: &str, path: &str) -> Result<Response> {
        let url = self.volume_file_url(key, None, path, &[])?;
        self.send(self.request(Method::GET, url)).await
    }

    /// `GET .../volumes/{key}/files?path=` into memory. Prefer
    /// [`Client::volume_download_to`] for big files.
    pub async fn volume_download(&self, key: &str, path: &str) -> Result<Bytes> {
        let resp = self.volume_download_response(key, path).await?;
        resp.bytes().await.map_err(Error::Transport)
    }

    /// `GET .../volumes/{key}/files?path=` as a stream of chunks.
    pub async fn volume_download_stream(
        &self,
        key: &str,
        path: &str,
    ) -> Result<impl Stream<Item = Result<Bytes>> + Send + 'static> {
        Ok(body_stream(self.volume_download_response(key, path).await?))
    }

    /// Streams a volume's file into `writer` (flushed at the end); returns the byte count.
    pub async fn volume_download_to<W>(&self, key: &str, path: &str, writer: W) -> Result<u64>
    where
        W: AsyncWrite + Unpin,
    {
        write_stream(self.volume_download_stream(key, path).await?, writer).await
    }

    /// `GET .../volumes/{key}/files/list?path=&depth=`.
    pub async fn volume_list(&self, key: &str, path: &str, depth: Option<u32>) -> Result<FileList> {
        let depth: Vec<(&str, String)> = depth
            .map(|d| ("depth", d.to_string()))
            .into_iter()
            .collect();
        let url = self.volume_file_url(key, Some("list"), path, &depth)?;
        decode(self.send(self.request(Method::GET, url)).await?).await
    }

    /// `GET .../volumes/{key}/files/stat?path=`.
    pub async fn volume_stat(&self, key: &str, path: &str) -> Result<FileEntry> {
        let url = self.volume_file_url(key, Some("stat"), path, &[])?;
        decode(self.send(self.request(Method::GET, url)).await?).await
    }

    /// `POST .../volumes/{key}/files/mkdir`: with `parents`, missing parents are made too and
    /// an existing directory is no error.
    pub async fn volume_mkdir(&self, key: &str, path: &str, parents: bool) -> Result<FileEntry> {
        let url = self.volume_url(Some(key), &["files", "mkdir"])?;
        let body = VolumeMakeDir { path, parents };
        decode(
            self.send(self.request(Method::POST, url).json(&body))
                .await?,
        )
        .await
    }

    /// `DELETE .../volumes/{key}/files?path=`: a file, or a directory with everything in it.
    pub async fn volume_remove(&self, key: &str, path: &str) -> Result<()> {
        let url = self.volume_file_url(key, None, path, &[])?;
        self.send(self.request(Method::DELETE, url)).await?;
        Ok(())
    }

    /// `PATCH .../volumes/{key}/files?path=`: changes the owner and/or permission bits (the
    /// fields left `None` are kept).
    pub async fn volume_set_metadata(
        &self,
        key: &str,
        path: &str,
        uid: Option<u32>,
        gid: Option<u32>,
        mode: Option<u32>,
    ) -> Result<FileEntry> {
        let url = self.volume_file_url(key, None, path, &[])?;
        let body = FileMetadata { uid, gid, mode };
        decode(
            self.send(self.request(Method::PATCH, url).json(&body))
                .await?,
        )
        .await
    }
}

/// How [`Client::volume_upload`] writes a file: whether it may replace one, and the new
/// file's owner and permission bits (`None`: the server's defaults, uid and gid 1000).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VolumeWrite {
    pub overwrite: bool,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// Permission bits, e.g. `0o644`.
    pub mode: Option<u32>,
}

impl VolumeWrite {
    /// The query parameters besides `path`; numbers in decimal, as everywhere in the API.
    fn query(&self) -> Vec<(&'static str, String)> {
        let mut query = vec![("overwrite", self.overwrite.to_string())];
        let ids = [("uid", self.uid), ("gid", self.gid), ("mode", self.mode)];
        query.extend(
            ids.into_iter()
                .filter_map(|(k, v)| v.map(|v| (k, v.to_string()))),
        );
        query
    }
}

/// `POST .../volumes/{volume}/files/mkdir`
#[derive(Serialize)]
struct VolumeMakeDir<'a> {
    path: &'a str,
    parents: bool,
}

/// `PATCH .../volumes/{volume}/files?path=`
#[derive(Serialize)]
struct FileMetadata {
    #[serde(skip_serializing_if = "Option::is_none")]
    uid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mode: Option<u32>,
}

/// A files route's `url` with `?path=` and `extra` (form-encoded: `&`, `#`, `%`, `/` in a
/// path stay inside the value).
fn file_url(mut url: Url, path: &str, extra: &[(&str, String)]) -> Url {
    url.query_pairs_mut()
        .append_pair("path", path)
        .extend_pairs(extra);
    url
}

/// A local file as an upload body, with its length; a directory is refused up front.
async fn open_upload(local: &Path) -> Result<(Body, u64)> {
    let file = tokio::fs::File::open(local).await?;
    let meta = file.metadata().await?;
    if meta.is_dir() {
        return Err(Error::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} is a directory", local.display()),
        )));
    }
    Ok((body_from_reader(file), meta.len()))
}

fn body_stream(response: Response) -> impl Stream<Item = Result<Bytes>> + Send + 'static {
    response.bytes_stream().map_err(Error::Transport)
}

/// Copies `stream` into `writer` and flushes it; returns the byte count.
async fn write_stream<W>(stream: impl Stream<Item = Result<Bytes>>, mut writer: W) -> Result<u64>
where
    W: AsyncWrite + Unpin,
{
    let mut stream = std::pin::pin!(stream);
    let mut total = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        writer.write_all(&chunk).await?;
        total += chunk.len() as u64;
    }
    writer.flush().await?;
    Ok(total)
}

async fn check(response: Response) -> Result<Response> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body = response.bytes().await.unwrap_or_default();
    Err(Error::from_response_parts(status.as_u16(), &body))
}

async fn decode<T: DeserializeOwned>(response: Response) -> Result<T> {
    let body = response.bytes().await.map_err(Error::Transport)?;
    serde_json::from_slice(&body).map_err(|e| {
        let text = String::from_utf8_lossy(&body);
        Error::Decode(format!("{e} (body: {})", truncate(text.trim(), 256)))
    })
}

/// A handle on one session: the client plus the last known session info.
#[derive(Clone, Debug)]
pub struct Session {
    client: Client,
    info: types::Session,
}

impl Session {
    /// A handle from already-fetched info (e.g. an entry of [`Client::list_sessions`]).
    pub fn from_info(client: Client, info: types::Session) -> Self {
        Session { client, info }
    }

    pub fn id(&self) -> &str {
        &self.info.id
    }

    /// The session as last seen (creation, [`Session::refresh`], or the last call that answers
    /// with the session: [`Session::set_timeout`], pause, resume, restore).
    pub fn info(&self) -> &types::Session {
        &self.info
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Re-reads the session from the daemon.
    pub async fn refresh(&mut self) -> Result<&types::Session> {
        self.info = self.client.get_session(&self.info.id).await?;
        Ok(&self.info)
    }

    /// Sets the session's remaining lifetime to `timeout_s` seconds from now.
    pub async fn set_timeout(&mut self, timeout_s: u64) -> Result<&types::Session> {
        self.info = self.client.set_timeout(&self.info.id, timeout_s).await?;
        Ok(&self.info)
    }

    pub async fn exec(&self, req: &ExecRequest) -> Result<ExecResult> {
        self.client.exec(&self.info.id, req).await
    }

    /// Kills every process in the session and keeps it; see [`Client::kill_processes`].
    pub async fn kill_processes(&self) -> Result<u32> {
        self.client.kill_processes(&self.info.id).await
    }

    /// Runs an argv (no shell).
    pub async fn run_cmd<I, S>(&self, argv: I) -> Result<ExecResult>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let req = ExecRequest {
            cmd: Some(argv.into_iter().map(Into::into).collect()),
            ..Default::default()
        };
        self.exec(&req).await
    }

    /// Runs `cmd` with `/bin/bash -c`.
    pub async fn run_shell(&self, cmd: impl Into<String>) -> Result<ExecResult> {
        let req = ExecRequest {
            shell: Some(cmd.into()),
            ..Default::default()
        };
        self.exec(&req).await
    }

    /// Runs `code` with `language`'s interpreter (`python`, `node`, `bash`).
    pub async fn run_code(
        &self,
        language: impl Into<String>,
        code: impl Into<String>,
    ) -> Result<ExecResult> {
        let req = ExecRequest {
            code: Some(code.into()),
            language: Some(language.into()),
            ..Default::default()
        };
        self.exec(&req).await
    }

    /// See [`Client::upload`].
    pub async fn upload(&self, path: &str, body: impl Into<Body>) -> Result<FileEntry> {
        self.client.upload(&self.info.id, path, body).await
    }

    /// See [`Client::upload_file`].
    pub async fn upload_file(&self, path: &str, local: impl AsRef<Path>) -> Result<FileEntry> {
        self.client.upload_file(&self.info.id, path, local).await
    }

    /// See [`Client::upload_reader`].
    pub async fn upload_reader<R>(&self, path: &str, reader: R) -> Result<FileEntry>
    where
        R: AsyncRead + Send + 'static,
    {
        self.client.upload_reader(&self.info.id, path, reader).await
    }

    pub async fn download(&self, path: &str) -> Result<Bytes> {
        self.client.download(&self.info.id, path).await
    }

    pub async fn download_stream(
        &self,
        path: &str,
    ) -> Result<impl Stream<Item = Result<Bytes>> + Send + 'static> {
        self.client.download_stream(&self.info.id, path).await
    }

    pub async fn download_to<W>(&self, path: &str, writer: W) -> Result<u64>
    where
        W: AsyncWrite + Unpin,
    {
        self.client.download_to(&self.info.id, path, writer).await
    }

    pub async fn list(&self, path: &str, depth: Option<u32>) -> Result<FileList> {
        self.client.list_files(&self.info.id, path, depth).await
    }

    pub async fn remove(&self, path: &str, recursive: bool) -> Result<()> {
        self.client.remove(&self.info.id, path, recursive).await
    }

    pub async fn mkdir(&self, path: &str) -> Result<()> {
        self.client.mkdir(&self.info.id, path).await
    }

    pub async fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.client.rename(&self.info.id, from, to).await
    }

    /// See [`Client::snapshot_session`].
    pub async fn snapshot(&self, name: Option<&str>) -> Result<Snapshot> {
        self.client.snapshot_session(&self.info.id, name).await
    }

    /// See [`Client::restore_session`]; updates [`Session::info`].
    pub async fn restore(&mut self, snapshot_id: &str) -> Result<&types::Session> {
        self.info = self
            .client
            .restore_session(&self.info.id, snapshot_id)
            .await?;
        Ok(&self.info)
    }

    /// See [`Client::fork_session`]; a handle on each new session.
    pub async fn fork(&self, count: u32) -> Result<Vec<Session>> {
        let forked = self.client.fork_session(&self.info.id, count).await?;
        Ok(forked
            .into_iter()
            .map(|info| Session::from_info(self.client.clone(), info))
            .collect())
    }

    /// See [`Client::pause_session`]; updates [`Session::info`].
    pub async fn pause(&mut self, kind: PauseKind) -> Result<&types::Session> {
        self.info = self.client.pause_session(&self.info.id, kind).await?;
        Ok(&self.info)
    }

    /// See [`Client::resume_session`]; updates [`Session::info`].
    pub async fn resume(&mut self) -> Result<&types::Session> {
        self.info = self.client.resume_session(&self.info.id).await?;
        Ok(&self.info)
    }

    /// `DELETE /v1/sandbox/sessions/{id}`.
    pub async fn destroy(self) -> Result<()> {
        self.client.destroy_session(&self.info.id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_error_envelope() {
        let body = br#"{"error":{"code":"SANDBOX-NOT-FOUND","message":"no such session","details":{"id":"x"}}}"#;
        let err = Error::from_response_parts(404, body);
        assert_eq!(err.code(), Some("SANDBOX-NOT-FOUND"));
        assert_eq!(err.status(), Some(404));
        assert!(err.is_not_found());
        match &err {
            Error::Api {
                message, details, ..
            } => {
                assert_eq!(message, "no such session");
                assert_eq!(
                    details.as_ref().and_then(|d| d.get("id")),
                    Some(&"x".into())
                );
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(err.to_string(), "SANDBOX-NOT-FOUND: no such session");
    }

    #[test]
    fn falls_back_to_a_synthetic_code() {
        let err = Error::from_response_parts(502, b"Bad Gateway from proxy\n");
        assert_eq!(err.code(), Some("SANDBOX-HTTP-502"));
        assert_eq!(err.to_string(), "SANDBOX-HTTP-502: Bad Gateway from proxy");
        let err = Error::from_response_parts(503, b"");
        assert_eq!(err.to_string(), "SANDBOX-HTTP-503: Service Unavailable");
        // JSON, but not the envelope.
        let err = Error::from_response_parts(400, br#"{"message":"nope"}"#);
        assert_eq!(err.code(), Some("SANDBOX-HTTP-400"));
        let long = "x".repeat(5000);
        let err = Error::from_response_parts(500, long.as_bytes());
        assert!(err.to_string().len() < 600);
    }

    #[test]
    fn builds_urls_with_encoded_segments() {
        let c = Client::new("http://127.0.0.1:7070", "k").unwrap();
        assert_eq!(
            c.session_url("abc", &["files", "list"]).unwrap().as_str(),
            "http://127.0.0.1:7070/v1/sandbox/sessions/abc/files/list"
        );
        assert_eq!(
            c.session_url("a/b?c#d", &[]).unwrap().as_str(),
            "http://127.0.0.1:7070/v1/sandbox/sessions/a%2Fb%3Fc%23d"
        );
        let c = Client::new("http://h:1/prefix/?q=1#f", "").unwrap();
        assert_eq!(c.api_key, None);
        assert_eq!(
            c.url(&["healthz"]).unwrap().as_str(),
            "http://h:1/prefix/healthz"
        );
        assert!(matches!(
            Client::new("ftp://h/", "k"),
            Err(Error::InvalidUrl { .. })
        ));
        assert!(matches!(
            Client::new("not a url", "k"),
            Err(Error::InvalidUrl { .. })
        ));
    }

    #[test]
    fn volume_keys_stay_one_segment_and_paths_stay_in_the_query() {
        let c = Client::new("http://h:1/p/", "").unwrap();
        let root = "http://h:1/p/v1/sandbox/volumes";
        assert_eq!(c.volume_url(None, &[]).unwrap().as_str(), root);
        for (key, encoded) in [
            ("data", "data"),
            ("a/b", "a%2Fb"),
            ("%2F", "%252F"),
            ("..a", "..a"),
            ("...", "..."),
            ("ü v", "%C3%BC%20v"),
            ("x?y#z", "x%3Fy%23z"),
        ] {
            assert_eq!(
                c.volume_url(Some(key), &[]).unwrap().as_str(),
                format!("{root}/{encoded}"),
                "{key:?}"
            );
            assert_eq!(
                c.volume_file_url(key, Some("list"), "/", &[("depth", "2".into())])
                    .unwrap()
                    .as_str(),
                format!("{root}/{encoded}/files/list?path=%2F&depth=2"),
                "{key:?}"
            );
        }
        // URLs drop these segments, which would reach `/volumes/files` or the list route.
        for key in ["..", ".", ""] {
            assert!(
                matches!(c.volume_url(Some(key), &["files"]), Err(Error::InvalidName(k)) if k == key),
                "{key:?}"
            );
            assert!(c.volume_file_url(key, None, "/a", &[]).is_err(), "{key:?}");
            assert!(c.session_url(key, &["exec"]).is_err(), "{key:?}");
        }

        let opts = VolumeWrite {
            overwrite: true,
            uid: Some(0),
            gid: None,
            mode: Some(0o644),
        };
        assert_eq!(
            c.volume_file_url("v", None, "/../a&b=c#d%2F/ü", &opts.query())
                .unwrap()
                .as_str(),
            format!("{root}/v/files?path=%2F..%2Fa%26b%3Dc%23d%252F%2F%C3%BC&overwrite=true&uid=0&mode=420")
        );
        assert_eq!(
            VolumeWrite::default().query(),
            [("overwrite", "false".to_string())]
        );
    }
}
