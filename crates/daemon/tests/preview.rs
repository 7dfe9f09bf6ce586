//! Upstream detection and the preview reverse proxy into a sandbox whose network is `none`.

mod common;

use std::time::Duration;

use common::*;
use futures::{SinkExt, StreamExt};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

const S: &str = "/v1/sandbox/sessions";

/// An HTTP server that answers with the request it saw, and a minimal WebSocket echo server
/// (stdlib only: the sandbox has no network to install anything).
const SERVERS: &str = r#"
import base64, hashlib, http.server, json, socket, struct, sys, threading

class Echo(http.server.BaseHTTPRequestHandler):
    def reply(self):
        n = int(self.headers.get("content-length") or 0)
        body = json.dumps({"method": self.command, "path": self.path,
                           "headers": {k.lower(): v for k, v in self.headers.items()},
                           "body": self.rfile.read(n).decode()}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = do_PUT = reply
    def log_message(self, *a):
        pass

def ws_echo(conn):
    req = b""
    while b"\r\n\r\n" not in req:
        req += conn.recv(4096)
    key = [l.split(b":", 1)[1].strip() for l in req.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key")][0]
    accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    while True:
        head = conn.recv(2)
        if len(head) < 2:
            return
        op, n = head[0] & 0x0F, head[1] & 0x7F
        if n == 126:
            n = struct.unpack(">H", conn.recv(2))[0]
        mask = conn.recv(4)
        data = b""
        while len(data) < n:
            data += conn.recv(n - len(data))
        data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        if op == 8:
            return
        reply = b"echo:" + data
        conn.sendall(bytes([0x81, len(reply)]) + reply)

def ws_server():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 8001))
    s.listen()
    while True:
        c, _ = s.accept()
        threading.Thread(target=ws_echo, args=(c,), daemon=True).start()

threading.Thread(target=ws_server, daemon=True).start()
http.server.ThreadingHTTPServer(("127.0.0.1", 8000), Echo).serve_forever()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preview_proxies_http_and_websockets_into_the_sandbox() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({"language": "python"})).await;

    let (status, e) = d
        .json(Method::GET, &format!("{S}/{id}/upstream"), Value::Null)
        .await;
    assert_eq!(
        (status, error_code(&e)),
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "SANDBOX-PREVIEW-NOT-LISTENING"
        )
    );
    let resp = d
        .req(Method::GET, &format!("{S}/{id}/preview/"), KEY1)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);

    let resp = d
        .req(Method::PUT, &format!("{S}/{id}/files"), KEY1)
        .query(&[("path", "/workspace/servers.py")])
        .body(SERVERS)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let (status, _) = d
        .json(
            Method::POST,
            &format!("{S}/{id}/exec"),
            json!({"cmd": ["python3", "/workspace/servers.py"], "background": true}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let mut up = Value::Null;
    for _ in 0..100 {
        let (status, v) = d
            .json(Method::GET, &format!("{S}/{id}/upstream"), Value::Null)
            .await;
        if status == StatusCode::OK {
            up = v;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        up["port"], 8000,
        "auto-detected the lowest listening port: {up}"
    );
    assert_eq!(up["url"], "http://127.0.0.1:8000");
    assert_eq!(up["pinned"], false);

    let resp = d
        .req(
            Method::POST,
            &format!("{S}/{id}/preview/api/items?x=1&y=%20"),
            KEY1,
        )
        .header("x-custom", "kept")
        .body("payload")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let seen: Value = resp.json().await.unwrap();
    assert_eq!(seen["method"], "POST");
    assert_eq!(seen["path"], "/api/items?x=1&y=%20");
    assert_eq!(seen["body"], "payload");
    assert_eq!(seen["headers"]["x-custom"], "kept");
    assert_eq!(seen["headers"]["host"], "127.0.0.1:8000");
    assert!(
        seen["headers"].get("authorization").is_none(),
        "the caller's key reached the sandbox: {seen}"
    );
    let resp = d
        .req(Method::GET, &format!("{S}/{id}/preview/"), KEY1)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.json::<Value>().await.unwrap()["path"], "/");

    // Pinning: a port nothing listens on is 503 until it does; a listening one is used.
    let (status, e) = d
        .json(
            Method::POST,
            &format!("{S}/{id}/preview"),
            json!({"port": 9999}),
        )
        .await;
    assert_eq!(
        (status, error_code(&e)),
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "SANDBOX-PREVIEW-NOT-LISTENING"
        )
    );
    let (status, _) = d
        .json(Method::GET, &format!("{S}/{id}/upstream"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let (status, v) = d
        .json(
            Method::POST,
            &format!("{S}/{id}/preview"),
            json!({"port": 8001}),
        )
        .await;
    assert_eq!(
        (status, v["pinned"].as_bool()),
        (StatusCode::OK, Some(true)),
        "{v}"
    );

    // A WebSocket upgrade through the proxy reaches the pinned server.
    let url = format!("{}{S}/{id}/preview/ws", d.base.replace("http://", "ws://"));
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {KEY1}").parse().unwrap());
    let mut ws = tokio_tungstenite::connect_async(req)
        .await
        .expect("websocket through the preview")
        .0;
    ws.send(Message::Text("hi".into())).await.unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(5), ws.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(reply, Message::Text("echo:hi".into()));

    let (status, _) = d
        .json_as(
            KEY2,
            Method::GET,
            &format!("{S}/{id}/upstream"),
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let resp = d
        .req(Method::GET, &format!("{S}/{id}/preview/"), KEY2)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
}
