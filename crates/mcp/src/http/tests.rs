use axum::body::Body;
use axum::http::Request as HttpRequest;
use tower::ServiceExt as _;

use super::*;

fn opts(listen: &str, allow_remote: bool, key: &str) -> HttpOptions {
    HttpOptions {
        listen: listen.parse().unwrap(),
        allow_remote,
        api_key: key.into(),
    }
}

#[test]
fn loopback_by_default_remote_only_on_request_and_with_a_key() {
    assert!(required_key(&opts("127.0.0.1:7071", false, ""))
        .unwrap()
        .is_none());
    assert!(required_key(&opts("[::1]:7071", false, "k"))
        .unwrap()
        .is_none());
    let err = required_key(&opts("0.0.0.0:7071", false, "k")).unwrap_err();
    assert!(err.to_string().contains("--allow-remote"), "{err}");
    let err = required_key(&opts("0.0.0.0:7071", true, "")).unwrap_err();
    assert!(err.to_string().contains("needs an API key"), "{err}");
    let key = required_key(&opts("192.0.2.1:7071", true, "sekrit")).unwrap();
    assert_eq!(key.as_deref(), Some("sekrit"));
    // Remote mode on loopback (a forwarded port) still wants the key.
    let key = required_key(&opts("127.0.0.1:7071", true, "sekrit")).unwrap();
    assert_eq!(key.as_deref(), Some("sekrit"));
    let err = required_key(&opts("127.0.0.1:7071", true, "")).unwrap_err();
    assert!(err.to_string().contains("needs an API key"), "{err}");
}

#[test]
fn secrets_compare_whole() {
    assert!(same_secret("abc", "abc"));
    assert!(!same_secret("abc", "abd"));
    assert!(!same_secret("ab", "abc"));
    assert!(!same_secret("", "abc"));
}

fn mcp() -> SandboxMcp {
    SandboxMcp::new(koder_sdk::Client::new("http://127.0.0.1:9", "k").unwrap())
}

fn initialize(host: &str) -> axum::http::request::Builder {
    HttpRequest::post(MCP_PATH)
        .header(header::HOST, host)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream")
}

const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

async fn status(app: axum::Router, req: HttpRequest<Body>) -> StatusCode {
    app.oneshot(req).await.unwrap().status()
}

#[tokio::test]
async fn web_pages_and_rebound_names_are_refused() {
    let app = || router(mcp(), None, CancellationToken::new());
    let ok = initialize("127.0.0.1:7071").body(Body::from(INIT)).unwrap();
    assert_eq!(status(app(), ok).await, StatusCode::OK);
    let page = initialize("127.0.0.1:7071")
        .header(header::ORIGIN, "https://evil.example")
        .body(Body::from(INIT))
        .unwrap();
    assert_eq!(status(app(), page).await, StatusCode::FORBIDDEN);
    let rebound = initialize("evil.example:7071")
        .body(Body::from(INIT))
        .unwrap();
    assert_eq!(status(app(), rebound).await, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn a_remote_listener_wants_the_key() {
    let app = || router(mcp(), Some(Arc::from("sekrit")), CancellationToken::new());
    let bare = initialize("sandbox.example:7071")
        .body(Body::from(INIT))
        .unwrap();
    assert_eq!(status(app(), bare).await, StatusCode::UNAUTHORIZED);
    let wrong = initialize("sandbox.example:7071")
        .header(header::AUTHORIZATION, "Bearer nope")
        .body(Body::from(INIT))
        .unwrap();
    assert_eq!(status(app(), wrong).await, StatusCode::UNAUTHORIZED);
    let right = initialize("sandbox.example:7071")
        .header(header::AUTHORIZATION, "Bearer sekrit")
        .body(Body::from(INIT))
        .unwrap();
    assert_eq!(status(app(), right).await, StatusCode::OK);
}
