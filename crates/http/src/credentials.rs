//! Every request header the daemon takes a credential from, in one list: the authenticating
//! extractors (native and E2B) name their headers from here, and the preview proxy strips the
//! whole list, so a credential added to one cannot reach sandbox code through the other. The
//! daemon takes no credential from the query string.

/// Native API keys (`Bearer`), E2B keys as `Bearer`, and envd's `Basic <user>:`.
pub const AUTHORIZATION: &str = "authorization";
/// E2B control-plane and envd/interpreter API keys.
pub const API_KEY: &str = "x-api-key";
/// A sandbox's envd access token (E2B).
pub const ACCESS_TOKEN: &str = "x-access-token";
/// The same token as the E2B code-interpreter SDK sends it.
pub const TRAFFIC_ACCESS_TOKEN: &str = "e2b-traffic-access-token";

/// A node's proof that it forwarded the request (HMAC under the cluster secret; `koder-cluster`
/// checks and removes it before any surface sees the request).
pub const NODE_PROOF: &str = "x-koder-forwarded";

/// Browsers cannot set headers on a WebSocket: the web console offers its key as the
/// subprotocol `koder.bearer.<base64url key>` beside [`TERMINAL_PROTOCOL`], which the handler
/// selects (so the key is never echoed back). Taken only when `Authorization` is absent, and
/// never on preview routes (their subprotocols are forwarded into the sandbox).
pub const WEBSOCKET_BEARER_PREFIX: &str = "koder.bearer.";
/// The subprotocol a terminal WebSocket answers with when the client offered it.
pub const TERMINAL_PROTOCOL: &str = "koder.terminal.v1";

/// Never forwarded into a sandbox. Cookies and proxy credentials are not the daemon's, but a
/// caller's browser or proxy sends them for the daemon's origin: they are not the sandbox's
/// either.
pub const ALL: &[&str] = &[
    AUTHORIZATION,
    API_KEY,
    ACCESS_TOKEN,
    TRAFFIC_ACCESS_TOKEN,
    NODE_PROOF,
    "cookie",
    "proxy-authorization",
];
