//! E2B's host names for a sandbox's ports (`<port>-<id>.<domain>` under `[e2b] domain`), on
//! the daemon's HTTP listener and its HTTPS one (`[server] tls_*`): a server inside the sandbox
//! answers by name, envd does on its port, a private sandbox's ports need its traffic token,
//! (and sees the masked host it asked for), a closed port or an unknown sandbox get E2B's 502s,
//! and other names are not routed.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DOMAIN: &str = "sbx.test";
const S: &str = "/v1/sandbox/sessions";

/// Answers every GET with its path and headers (stdlib only: the sandbox has no network).
const ECHO: &str = r#"
import http.server, json
class Echo(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"path": self.path, "names": list(self.headers.keys()),
                           "headers": {k.lower(): v for k, v in self.headers.items()}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", 8000), Echo).serve_forever()
"#;

struct Hosts {
    d: Daemon,
    https: SocketAddr,
    cert: rustls::pki_types::CertificateDer<'static>,
    _pem: tempfile::TempDir,
}

async fn start() -> Hosts {
    let made = rcgen::generate_simple_self_signed(vec![format!("*.{DOMAIN}")]).unwrap();
    let pem = tempfile::tempdir().unwrap();
    let (cert, key) = (pem.path().join("cert.pem"), pem.path().join("key.pem"));
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
    let config = format!(
        "{BASE_CONFIG}\n[e2b]\ndomain = \"{DOMAIN}\"\n[server]\ntls_listen = \"127.0.0.1:0\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\n",
        cert.display(),
        key.display()
    );
    // Port 0: the daemon's pick, read from what it prints, so nothing can take it meanwhile.
    let d = Daemon::start(&config).await;
    let https = d
        .printed_address("HTTPS")
        .await
        .trim_start_matches("https://")
        .parse()
        .expect("the daemon's HTTPS address");
    Hosts {
        d,
        https,
        cert: made.cert.der().clone(),
        _pem: pem,
    }
}

/// An E2B sandbox (no internet: nothing here leaves the machine) running [`ECHO`] on 8000.
async fn sandbox(h: &Hosts, network: Value) -> (String, String) {
    let resp = h
        .d
        .http
        .post(format!("{}/sandboxes", h.d.base))
        .header("x-api-key", KEY1)
        .json(&json!({"templateID": "base", "allow_internet_access": false, "network": network}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["domain"], DOMAIN, "{v}");
    let id = v["sandboxID"].as_str().unwrap().to_string();
    let token = v["trafficAccessToken"].as_str().unwrap().to_string();
    let resp =
        h.d.req(Method::PUT, &format!("{S}/{id}/files"), KEY1)
            .query(&[("path", "/workspace/echo.py")])
            .body(ECHO)
            .send()
            .await
            .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let (status, v) =
        h.d.json(
            Method::POST,
            &format!("{S}/{id}/exec"),
            json!({"cmd": ["python3", "/workspace/echo.py"], "background": true}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, v) =
            h.d.json(Method::GET, &format!("{S}/{id}/upstream"), Value::Null)
                .await;
        if status == StatusCode::OK && v["port"] == 8000 {
            return (id, token);
        }
        assert!(Instant::now() < deadline, "echo server not up: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// GET /some/path?q=1 on the plain listener with `Host: host`.
async fn by_name(h: &Hosts, host: &str, headers: &[(&str, &str)]) -> (StatusCode, Value) {
    by_name_at(h, host, "/some/path?q=1", headers).await
}

/// GET `path` on the plain listener with `Host: host`.
async fn by_name_at(
    h: &Hosts,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, Value) {
    let mut rb =
        h.d.http
            .get(format!("{}{path}", h.d.base))
            .header("host", host);
    for (k, v) in headers {
        rb = rb.header(*k, *v);
    }
    let resp = rb.send().await.unwrap();
    let status = resp.status();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// GET `path` over HTTPS to the name (with the `extra` header lines), trusting only the test's
/// certificate: the status line and body.
async fn https_get(h: &Hosts, host: &str, path: &str, extra: &str) -> (String, String) {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(h.cert.clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(h.https).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    tls.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_port_answers_by_name_over_http_and_https() {
    let Some(()) = root_or_skip() else { return };
    let h = start().await;
    let (id, token) = sandbox(&h, Value::Null).await;
    let name = format!("8000-{id}.{DOMAIN}");

    // Public by default, as in E2B: the request reaches the server as the client sent it,
    // credentials the daemon understands stripped.
    let (status, v) = by_name(&h, &name, &[("x-api-key", KEY1), ("x-custom", "1")]).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["path"], "/some/path?q=1");
    assert_eq!(v["headers"]["host"], name.as_str());
    assert_eq!(v["headers"]["x-custom"], "1");
    // In their conventional case on the wire, as a browser or an HTTP/1 proxy sends them.
    for name in ["Host", "X-Custom"] {
        assert!(v["names"].as_array().unwrap().contains(&json!(name)), "{v}");
    }
    assert!(v["headers"].get("x-api-key").is_none(), "{v}");

    let (status, body) = https_get(&h, &name, "/tls", "").await;
    // The version is the sandbox server's own (Python's answers HTTP/1.0); the status is ours.
    assert!(
        status.starts_with("HTTP/1.") && status.ends_with(" 200 OK"),
        "{status}: {body}"
    );
    assert!(body.contains("\"path\": \"/tls\""), "{body}");

    // envd by name: its own port of the same sandbox.
    let (status, v) = by_name_at(
        &h,
        &format!("49983-{id}.{DOMAIN}:80"),
        "/health",
        &[("x-access-token", token.as_str())],
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{v}");

    let (status, v) = by_name(&h, &format!("9999-{id}.{DOMAIN}"), &[]).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{v}");
    // E2B's proxy bodies, word for word (its JS suite compares them).
    assert_eq!(
        v,
        json!({"code": 502, "message": "The sandbox is running but port is not open",
               "sandboxId": id, "port": "9999"})
    );
    let gone = "s0123456789abcdef0123456789abcdef";
    let (status, v) = by_name(&h, &format!("8000-{gone}.{DOMAIN}"), &[]).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{v}");
    assert_eq!(
        v,
        json!({"code": 502, "message": "The sandbox was not found", "sandboxId": gone})
    );

    // Not a sandbox name: the daemon's own routes, as without a domain.
    for host in [format!("8000-{id}.other.test"), format!("api.{DOMAIN}")] {
        let (status, v) = by_name(&h, &host, &[]).await;
        assert_ne!(status, StatusCode::OK, "{host}: {v}");
        assert!(v.get("path").is_none(), "{host} reached the sandbox: {v}");
    }
    let resp =
        h.d.http
            .get(format!("{}/healthz", h.d.base))
            .header("host", format!("api.{DOMAIN}"))
            .send()
            .await
            .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);

    // A URL the daemon hands back for the SDK to call (a template's file upload) has the
    // scheme the request came by: https over the daemon's own HTTPS listener.
    let files = format!("/templates/t/files/{}", "ab".repeat(32));
    let (status, body) = https_get(
        &h,
        &format!("api.{DOMAIN}"),
        &files,
        &format!("X-API-KEY: {KEY1}\r\n"),
    )
    .await;
    assert!(status.ends_with(" 201 Created"), "{status}: {body}");
    let url: Value = serde_json::from_str(&body).unwrap();
    let url = url["url"].as_str().unwrap();
    assert!(
        url.starts_with(&format!("https://api.{DOMAIN}/templates/t/files/")),
        "{url}"
    );
    let (_, v) = by_name_at(&h, &format!("api.{DOMAIN}"), &files, &[("x-api-key", KEY1)]).await;
    let url = v["url"].as_str().unwrap();
    assert!(
        url.starts_with(&format!("http://api.{DOMAIN}/templates/t/files/")),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_sandbox_port_needs_its_traffic_token() {
    let Some(()) = root_or_skip() else { return };
    let h = start().await;
    let (id, token) = sandbox(
        &h,
        json!({"allowPublicTraffic": false, "maskRequestHost": "app.example:${PORT}"}),
    )
    .await;
    let (_, other_token) = sandbox(&h, Value::Null).await;
    let name = format!("8000-{id}.{DOMAIN}");

    let (status, v) = by_name(&h, &name, &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    for wrong in ["", "x", other_token.as_str()] {
        let (status, v) = by_name(&h, &name, &[("e2b-traffic-access-token", wrong)]).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{wrong:?}: {v}");
    }
    let (status, v) = by_name(&h, &name, &[("e2b-traffic-access-token", token.as_str())]).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    // The token opened the proxy; it never reaches the sandbox's server, which sees the
    // masked host.
    assert!(
        v["headers"].get("e2b-traffic-access-token").is_none(),
        "{v}"
    );
    assert_eq!(v["headers"]["host"], "app.example:8000");

    // Fixed at create.
    let resp =
        h.d.http
            .put(format!("{}/sandboxes/{id}/network", h.d.base))
            .header("x-api-key", KEY1)
            .json(&json!({"allowPublicTraffic": true}))
            .send()
            .await
            .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let (status, _) = by_name(&h, &name, &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}
