//! The SDK against a canned HTTP/1.1 server on 127.0.0.1: request shapes (paths, query
//! encoding, auth, bodies) and answer decoding (typed errors, JSON results, streams).

use std::sync::{Arc, Mutex};

use futures::StreamExt as _;
use koder_sdk::live::ExecEvent;
use koder_sdk::{
    Client, CreateSession, Error, ExecRequest, Lifecycle, OnTimeout, PauseKind, SessionState,
    VolumeWrite,
};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

#[derive(Debug, Clone)]
struct Recorded {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Recorded {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct Canned {
    status: u16,
    content_type: &'static str,
    body: Vec<u8>,
    /// When set, the body goes out as these HTTP chunks, each written and flushed on its own.
    chunks: Option<Vec<Vec<u8>>>,
    /// With `chunks`: close the connection instead of sending the final empty chunk.
    cut_off: bool,
}

/// An SSE answer sent in exactly these chunks.
fn sse(chunks: &[&[u8]], cut_off: bool) -> Canned {
    Canned {
        status: 200,
        content_type: "text/event-stream",
        chunks: Some(chunks.iter().map(|c| c.to_vec()).collect()),
        cut_off,
        ..Canned::default()
    }
}

fn json(status: u16, body: &str) -> Canned {
    Canned {
        status,
        content_type: "application/json",
        body: body.as_bytes().to_vec(),
        ..Canned::default()
    }
}

type Handler = Arc<dyn Fn(&Recorded) -> Canned + Send + Sync>;

struct Mock {
    url: String,
    seen: Arc<Mutex<Vec<Recorded>>>,
}

impl Mock {
    async fn start(handler: impl Fn(&Recorded) -> Canned + Send + Sync + 'static) -> Mock {
        Self::serve(None, handler).await
    }

    /// An `https://` mock presenting `tls`'s certificate.
    async fn start_tls(
        tls: Arc<rustls::ServerConfig>,
        handler: impl Fn(&Recorded) -> Canned + Send + Sync + 'static,
    ) -> Mock {
        Self::serve(Some(tokio_rustls::TlsAcceptor::from(tls)), handler).await
    }

    async fn serve(
        tls: Option<tokio_rustls::TlsAcceptor>,
        handler: impl Fn(&Recorded) -> Canned + Send + Sync + 'static,
    ) -> Mock {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let handler: Handler = Arc::new(handler);
        let seen2 = seen.clone();
        let scheme = if tls.is_some() { "https" } else { "http" };
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let handler = handler.clone();
                let seen = seen2.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    // A refused handshake just ends the connection: the client reports it.
                    let _ = match tls {
                        Some(acceptor) => match acceptor.accept(stream).await {
                            Ok(stream) => serve_conn(stream, handler, seen).await,
                            Err(e) => Err(e),
                        },
                        None => serve_conn(stream, handler, seen).await,
                    };
                });
            }
        });
        Mock {
            url: format!("{scheme}://{addr}"),
            seen,
        }
    }

    fn last(&self) -> Recorded {
        self.seen
            .lock()
            .expect("lock")
            .last()
            .cloned()
            .expect("a request")
    }
}

async fn serve_conn<S>(
    stream: S,
    handler: Handler,
    seen: Arc<Mutex<Vec<Recorded>>>,
) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (read, mut write) = tokio::io::split(stream);
    let mut reader = BufReader::new(read);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_string();
        let target = parts.next().unwrap_or_default().to_string();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            reader.read_line(&mut h).await?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
        let get = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        };
        let mut body = Vec::new();
        if get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            loop {
                let mut size = String::new();
                reader.read_line(&mut size).await?;
                let n = usize::from_str_radix(size.trim(), 16).expect("chunk size");
                let mut chunk = vec![0; n + 2];
                reader.read_exact(&mut chunk).await?;
                if n == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..n]);
            }
        } else if let Some(len) = get("content-length") {
            let n: usize = len.parse().expect("content-length");
            body.resize(n, 0);
            reader.read_exact(&mut body).await?;
        }
        let rec = Recorded {
            method,
            target,
            headers,
            body,
        };
        let canned = handler(&rec);
        seen.lock().expect("lock").push(rec);
        let Some(chunks) = &canned.chunks else {
            let head = format!(
                "HTTP/1.1 {} X\r\ncontent-type: {}\r\ncontent-length: {}\r\n\r\n",
                canned.status,
                canned.content_type,
                canned.body.len()
            );
            write.write_all(head.as_bytes()).await?;
            write.write_all(&canned.body).await?;
            write.flush().await?;
            continue;
        };
        let head = format!(
            "HTTP/1.1 {} X\r\ncontent-type: {}\r\ntransfer-encoding: chunked\r\n\r\n",
            canned.status, canned.content_type
        );
        write.write_all(head.as_bytes()).await?;
        for chunk in chunks {
            write
                .write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                .await?;
            write.write_all(chunk).await?;
            write.write_all(b"\r\n").await?;
            write.flush().await?;
        }
        if canned.cut_off {
            return write.shutdown().await;
        }
        write.write_all(b"0\r\n\r\n").await?;
        write.flush().await?;
    }
}

const SESSION: &str = r#"{"id":"s-1","tenant_id":"t1","language":"python","image":"host","runtime":"jail",
 "state":"running","created_at":"2025-01-01T00:00:00Z","expires_at":"2025-01-01T00:05:00Z",
 "limits":{"cpu_millis":1000,"memory_mib":512},"network":{"mode":"none"},"metadata":{"k":"v"}}"#;

const ENTRY: &str = r#"{"name":"a b.txt","path":"/workspace/a b.txt","type":"file","size":3,"mode":420,"modified_at":"2025-01-01T00:00:00Z"}"#;

#[tokio::test]
async fn create_sends_json_and_bearer_auth() {
    let mock = Mock::start(|_| json(201, SESSION)).await;
    let client = Client::new(&mock.url, "secret-key").expect("client");
    let req = CreateSession {
        language: Some("python".into()),
        timeout_s: Some(60),
        ..Default::default()
    };
    let session = client.create_session(&req).await.expect("create");
    assert_eq!(session.id(), "s-1");
    assert_eq!(
        session.info().metadata.get("k").map(String::as_str),
        Some("v")
    );
    let rec = mock.last();
    assert_eq!(rec.method, "POST");
    assert_eq!(rec.target, "/v1/sandbox/sessions");
    assert_eq!(rec.header("authorization"), Some("Bearer secret-key"));
    let sent: serde_json::Value = serde_json::from_slice(&rec.body).expect("json body");
    assert_eq!(
        sent,
        serde_json::json!({"language": "python", "timeout_s": 60})
    );
}

#[tokio::test]
async fn api_errors_are_typed() {
    let mock = Mock::start(|rec| {
        if rec.target.contains("missing") {
            json(
                404,
                r#"{"error":{"code":"SANDBOX-NOT-FOUND","message":"session not found"}}"#,
            )
        } else if rec.target.contains("proxy") {
            Canned {
                status: 502,
                content_type: "text/html",
                body: b"<html>bad gateway</html>".to_vec(),
                ..Canned::default()
            }
        } else {
            json(200, "{not json")
        }
    })
    .await;
    let client = Client::new(&mock.url, "k").expect("client");
    let err = client.session("missing").await.expect_err("404");
    assert_eq!(err.code(), Some("SANDBOX-NOT-FOUND"));
    assert_eq!(err.status(), Some(404));
    assert_eq!(err.to_string(), "SANDBOX-NOT-FOUND: session not found");

    let err = client.get_session("proxy").await.expect_err("502");
    assert_eq!(err.code(), Some("SANDBOX-HTTP-502"));
    assert!(err.to_string().contains("bad gateway"), "{err}");

    let err = client.get_session("garbage").await.expect_err("decode");
    assert!(matches!(err, Error::Decode(_)), "{err:?}");
    assert_eq!(err.code(), None);
}

#[tokio::test]
async fn transport_errors_are_typed() {
    // Bind then drop a listener so the port is (almost certainly) closed.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let client = Client::new(format!("http://127.0.0.1:{port}"), "k").expect("client");
    let err = client.list_sessions().await.expect_err("refused");
    assert!(matches!(err, Error::Transport(_)), "{err:?}");
    assert!(!client.health().await);
    let Err(err) = client.watch("s-1", "/workspace", false).await else {
        panic!("a watch without a daemon")
    };
    match err {
        Error::Connect { url, .. } => assert_eq!(
            url,
            format!("ws://127.0.0.1:{port}/v1/sandbox/sessions/s-1/fs/watch")
        ),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn file_paths_are_query_encoded() {
    let mock = Mock::start(|rec| match rec.method.as_str() {
        "PUT" => json(201, ENTRY),
        "GET" if rec.target.contains("/files/list") => {
            json(200, &format!(r#"{{"entries":[{ENTRY}]}}"#))
        }
        "GET" => Canned {
            status: 200,
            content_type: "application/octet-stream",
            body: b"abc".to_vec(),
            ..Canned::default()
        },
        "DELETE" => Canned {
            status: 204,
            content_type: "text/plain",
            body: Vec::new(),
            ..Canned::default()
        },
        _ => json(201, ENTRY),
    })
    .await;
    let client = Client::new(format!("{}/", mock.url), "k").expect("client");
    let path = "/workspace/a b&c=d#e?f%g/ü.txt";
    let encoded = "%2Fworkspace%2Fa+b%26c%3Dd%23e%3Ff%25g%2F%C3%BC.txt";

    let entry = client
        .upload("s 1", path, b"abc".to_vec())
        .await
        .expect("upload");
    assert_eq!(entry.size, 3);
    let rec = mock.last();
    assert_eq!(rec.method, "PUT");
    assert_eq!(
        rec.target,
        format!("/v1/sandbox/sessions/s%201/files?path={encoded}")
    );
    assert_eq!(rec.body, b"abc");
    assert_eq!(rec.header("content-type"), Some("application/octet-stream"));

    let bytes = client.download("s1", path).await.expect("download");
    assert_eq!(&bytes[..], b"abc");
    assert_eq!(
        mock.last().target,
        format!("/v1/sandbox/sessions/s1/files?path={encoded}")
    );

    let list = client
        .list_files("s1", "/workspace", Some(2))
        .await
        .expect("list");
    assert_eq!(list.entries.len(), 1);
    assert!(!list.truncated);
    assert_eq!(
        mock.last().target,
        "/v1/sandbox/sessions/s1/files/list?path=%2Fworkspace&depth=2"
    );

    client.remove("s1", path, true).await.expect("remove");
    let rec = mock.last();
    assert_eq!(rec.method, "DELETE");
    assert_eq!(
        rec.target,
        format!("/v1/sandbox/sessions/s1/files?path={encoded}&recursive=true")
    );

    client.mkdir("s1", "/workspace/d").await.expect("mkdir");
    let rec = mock.last();
    assert_eq!(rec.target, "/v1/sandbox/sessions/s1/files/mkdir");
    assert_eq!(rec.body, br#"{"path":"/workspace/d"}"#);

    client
        .rename("s1", "/workspace/a", "/workspace/b")
        .await
        .expect("move");
    let rec = mock.last();
    assert_eq!(rec.target, "/v1/sandbox/sessions/s1/files/move");
    assert_eq!(rec.body, br#"{"from":"/workspace/a","to":"/workspace/b"}"#);
}

#[tokio::test]
async fn streaming_upload_and_download() {
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let served = payload.clone();
    let mock = Mock::start(move |rec| {
        if rec.method == "PUT" {
            json(201, ENTRY)
        } else {
            Canned {
                status: 200,
                content_type: "application/octet-stream",
                body: served.clone(),
                ..Canned::default()
            }
        }
    })
    .await;
    let client = Client::new(&mock.url, "k").expect("client");

    let dir = tempfile::tempdir().expect("tempdir");
    let local = dir.path().join("in.bin");
    std::fs::write(&local, &payload).expect("write");

    // A reader of unknown length goes out chunked.
    let file = tokio::fs::File::open(&local).await.expect("open");
    client
        .upload_reader("s1", "/workspace/in.bin", file)
        .await
        .expect("upload reader");
    let rec = mock.last();
    assert_eq!(rec.header("transfer-encoding"), Some("chunked"));
    assert_eq!(rec.body, payload);

    // A local file announces its length.
    client
        .upload_file("s1", "/workspace/in.bin", &local)
        .await
        .expect("upload file");
    let rec = mock.last();
    assert_eq!(
        rec.header("content-length"),
        Some(payload.len().to_string().as_str())
    );
    assert_eq!(rec.body, payload);

    let out = dir.path().join("out.bin");
    let file = tokio::fs::File::create(&out).await.expect("create");
    let n = client
        .download_to("s1", "/workspace/in.bin", file)
        .await
        .expect("download_to");
    assert_eq!(n, payload.len() as u64);
    assert_eq!(std::fs::read(&out).expect("read"), payload);
}

#[tokio::test]
async fn exec_and_session_calls() {
    let mock = Mock::start(|rec| {
        if rec.target.ends_with("/exec") {
            json(
                200,
                r#"{"exec_id":"e1","exit_code":null,"signal":9,"stdout":"partial","stderr":"",
                    "stdout_truncated":false,"stderr_truncated":false,"duration_ms":30000,
                    "peak_memory_kib":null,"verdict":"SANDBOX-EXEC-TIMEOUT"}"#,
            )
        } else if rec.target.ends_with("/timeout") || rec.method == "DELETE" {
            Canned {
                status: 204,
                content_type: "text/plain",
                body: Vec::new(),
                ..Canned::default()
            }
        } else if rec.target == "/v1/sandbox/sessions" {
            json(200, &format!(r#"{{"sessions":[{SESSION}]}}"#))
        } else if rec.target == "/healthz" {
            Canned {
                status: 200,
                content_type: "text/plain",
                body: b"ok".to_vec(),
                ..Canned::default()
            }
        } else {
            json(200, SESSION)
        }
    })
    .await;
    let client = Client::new(&mock.url, "").expect("client");
    assert!(client.health().await);

    let sessions = client.list_sessions().await.expect("list");
    assert_eq!(sessions.len(), 1);
    assert_eq!(mock.last().header("authorization"), None);

    let mut session = client.session("s-1").await.expect("get");
    let result = session
        .exec(&ExecRequest {
            cmd: Some(vec!["sleep".into(), "100".into()]),
            timeout_ms: Some(30_000),
            ..Default::default()
        })
        .await
        .expect("exec");
    assert_eq!(result.verdict.as_deref(), Some("SANDBOX-EXEC-TIMEOUT"));
    assert_eq!(result.signal, Some(9));
    let rec = mock.last();
    assert_eq!(rec.header("accept"), Some("application/json"));
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&rec.body).expect("json"),
        serde_json::json!({"cmd": ["sleep", "100"], "timeout_ms": 30000})
    );

    session.run_shell("echo hi | wc -c").await.expect("shell");
    assert_eq!(mock.last().body, br#"{"shell":"echo hi | wc -c"}"#);
    session.run_code("python", "print(1)").await.expect("code");
    assert_eq!(
        mock.last().body,
        br#"{"code":"print(1)","language":"python"}"#
    );

    // A bodiless timeout answer falls back to re-reading the session.
    session.set_timeout(600).await.expect("timeout");
    let seen = mock.seen.lock().expect("lock").clone();
    let n = seen.len();
    assert_eq!(seen[n - 2].target, "/v1/sandbox/sessions/s-1/timeout");
    assert_eq!(seen[n - 2].body, br#"{"timeout_s":600}"#);
    assert_eq!(seen[n - 1].method, "GET");

    session.destroy().await.expect("destroy");
    let rec = mock.last();
    assert_eq!(rec.method, "DELETE");
    assert_eq!(rec.target, "/v1/sandbox/sessions/s-1");
}

const EXIT_EVENT: &str = "event: exit\r\ndata: {\"exec_id\":\"e1\",\"exit_code\":0,\"signal\":null,\"stdout_truncated\":false,\"stderr_truncated\":false,\"duration_ms\":5,\"peak_memory_kib\":null,\"verdict\":null}\r\n\r\n";

fn run_echo() -> ExecRequest {
    ExecRequest {
        cmd: Some(vec!["echo".into()]),
        ..Default::default()
    }
}

#[tokio::test]
async fn exec_stream_over_http_chunks() {
    // "é" split between two HTTP chunks, a data field over two lines, CRLF, a keep-alive.
    let stdout = "event: stdout\r\ndata: {\"data\":\r\ndata: \"caf\u{e9}\"}\r\n\r\n";
    let cut = stdout.find('\u{e9}').expect("é") + 1;
    let first =
        ": keep-alive\r\n\r\nevent: start\r\ndata: {\"exec_id\":\"e1\"}\r\n\r\n".to_string();
    let (a, b) = stdout.as_bytes().split_at(cut);
    let chunks: Vec<Vec<u8>> = vec![
        first.into_bytes(),
        a.to_vec(),
        b.to_vec(),
        EXIT_EVENT.into(),
    ];
    let mock = Mock::start(move |_| {
        let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
        sse(&refs, false)
    })
    .await;
    let client = Client::new(&mock.url, "k").expect("client");
    let events: Vec<_> = client
        .exec_stream("s1", &run_echo())
        .await
        .expect("stream")
        .collect()
        .await;
    let events: Vec<ExecEvent> = events.into_iter().map(|e| e.expect("event")).collect();
    assert_eq!(
        events[..2],
        [
            ExecEvent::Start {
                exec_id: "e1".into()
            },
            ExecEvent::Stdout("caf\u{e9}".as_bytes().to_vec()),
        ]
    );
    assert!(matches!(&events[2], ExecEvent::Exit(r) if r.exit_code == Some(0)));
    assert_eq!(events.len(), 3);
    assert_eq!(mock.last().header("accept"), Some("text/event-stream"));
}

#[tokio::test]
async fn exec_stream_cut_off_is_an_error() {
    let partial = &EXIT_EVENT[..EXIT_EVENT.len() - 2];
    let mock = Mock::start(move |rec| {
        let cut_off = rec.target.contains("closed");
        sse(
            &[
                b"event: stdout\ndata: {\"data\":\"a\"}\n\n",
                partial.as_bytes(),
            ],
            cut_off,
        )
    })
    .await;
    let client = Client::new(&mock.url, "k").expect("client");
    for (session, transport) in [("closed", true), ("ended", false)] {
        let events: Vec<_> = client
            .follow_exec(session, "e1")
            .await
            .expect("stream")
            .collect()
            .await;
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(
            events[0].as_ref().ok(),
            Some(&ExecEvent::Stdout(b"a".to_vec()))
        );
        match &events[1] {
            Err(Error::Transport(_)) if transport => {}
            Err(Error::StreamEnded) if !transport => {}
            other => panic!("{session}: {other:?}"),
        }
    }
}

/// A private CA and a server certificate for 127.0.0.1 signed by it.
fn private_ca() -> (String, Arc<rustls::ServerConfig>) {
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::new()).expect("CA params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).expect("CA cert");
    let key = rcgen::KeyPair::generate().expect("server key");
    let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("params");
    let cert = params.signed_by(&key, &ca).expect("server cert");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .expect("server config");
    (ca.pem(), Arc::new(config))
}

#[tokio::test]
async fn https_with_a_private_ca() {
    let (ca_pem, tls) = private_ca();
    let mock = Mock::start_tls(tls, |_| {
        json(200, &format!(r#"{{"sessions":[{SESSION}]}}"#))
    })
    .await;
    assert!(mock.url.starts_with("https://127.0.0.1:"), "{}", mock.url);

    let trusting = Client::builder(&mock.url)
        .api_key("k")
        .add_ca_pem(ca_pem.as_bytes())
        .expect("CA PEM")
        .build()
        .expect("client");
    let sessions = trusting.list_sessions().await.expect("list over https");
    assert_eq!(sessions[0].id, "s-1");
    assert_eq!(mock.last().header("authorization"), Some("Bearer k"));

    // The same daemon without the CA: the certificate is refused, nothing is sent.
    let before = mock.seen.lock().expect("lock").len();
    let err = Client::new(&mock.url, "k")
        .expect("client")
        .list_sessions()
        .await
        .expect_err("untrusted certificate");
    assert!(matches!(err, Error::Transport(_)), "{err:?}");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );
    assert_eq!(mock.seen.lock().expect("lock").len(), before);

    // Through a file, as the CLI's --ca-cert gives it.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("ca.pem");
    std::fs::write(&file, &ca_pem).expect("write CA");
    let from_file = Client::builder(&mock.url)
        .add_ca_file(&file)
        .expect("CA file")
        .build()
        .expect("client");
    assert_eq!(from_file.list_sessions().await.expect("list").len(), 1);
}

#[test]
fn unusable_ca_certificates_are_refused() {
    let builder = Client::builder("https://127.0.0.1:1");
    for pem in [
        &b""[..],
        b"not a certificate",
        b"-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n",
    ] {
        let err = builder.clone().add_ca_pem(pem).expect_err("bad PEM");
        assert!(matches!(err, Error::Tls(_)), "{err:?}");
    }
    let err = builder
        .add_ca_file("/nonexistent/ca.pem")
        .expect_err("missing file");
    assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
}

const SNAPSHOT: &str = r#"{"snapshot_id":"snap-1","name":"base","size_bytes":4096,"image":"host",
 "language":"python","runtime":"jail","session_id":"s-1",
 "created_at":"2025-01-01T00:00:00Z","expires_at":"2025-01-08T00:00:00Z"}"#;

fn no_content() -> Canned {
    Canned {
        status: 204,
        content_type: "text/plain",
        ..Canned::default()
    }
}

fn body_json(rec: &Recorded) -> serde_json::Value {
    serde_json::from_slice(&rec.body).expect("json body")
}

#[tokio::test]
async fn snapshot_restore_fork_pause_resume() {
    let mock = Mock::start(|rec| {
        let paused = SESSION.replace("\"running\"", "\"paused\"");
        match (rec.method.as_str(), rec.target.as_str()) {
            ("POST", t) if t.ends_with("/snapshot") => json(201, SNAPSHOT),
            ("POST", t) if t.ends_with("/fork") => json(
                201,
                &format!(
                    r#"{{"sessions":[{},{}]}}"#,
                    SESSION.replace("s-1", "s-2"),
                    SESSION.replace("s-1", "s-3")
                ),
            ),
            ("POST", t) if t.ends_with("/pause") => json(200, &paused),
            ("GET", "/v1/sandbox/snapshots") => {
                json(200, &format!(r#"{{"snapshots":[{SNAPSHOT}]}}"#))
            }
            ("GET", t) if t.starts_with("/v1/sandbox/snapshots/") => json(200, SNAPSHOT),
            ("DELETE", _) => no_content(),
            _ => json(200, SESSION),
        }
    })
    .await;
    let client = Client::new(&mock.url, "k").expect("client");
    let mut session = client.session("s-1").await.expect("get");

    let snap = session.snapshot(Some("base")).await.expect("snapshot");
    assert_eq!(
        (snap.snapshot_id.as_str(), snap.size_bytes),
        ("snap-1", 4096)
    );
    let rec = mock.last();
    assert_eq!(rec.target, "/v1/sandbox/sessions/s-1/snapshot");
    assert_eq!(body_json(&rec), serde_json::json!({"name": "base"}));
    session.snapshot(None).await.expect("unnamed snapshot");
    assert_eq!(body_json(&mock.last()), serde_json::json!({}));

    let listed = client.list_snapshots().await.expect("list");
    assert_eq!(listed, vec![snap.clone()]);
    assert_eq!(client.get_snapshot("snap-1").await.expect("get"), snap);
    assert_eq!(mock.last().target, "/v1/sandbox/snapshots/snap-1");

    let new = client
        .create_from_snapshot(
            "snap-1",
            CreateSession {
                lifecycle: Some(Lifecycle {
                    on_timeout: OnTimeout::Pause,
                    auto_resume: true,
                    keep_memory: false,
                }),
                ..Default::default()
            },
        )
        .await
        .expect("create from snapshot");
    assert_eq!(new.id(), "s-1");
    let rec = mock.last();
    assert_eq!(
        (rec.method.as_str(), rec.target.as_str()),
        ("POST", "/v1/sandbox/sessions")
    );
    assert_eq!(
        body_json(&rec),
        serde_json::json!({"from_snapshot": "snap-1",
            "lifecycle": {"on_timeout": "pause", "auto_resume": true}})
    );

    session.restore("snap-1").await.expect("restore");
    let rec = mock.last();
    assert_eq!(rec.target, "/v1/sandbox/sessions/s-1/restore");
    assert_eq!(
        body_json(&rec),
        serde_json::json!({"snapshot_id": "snap-1"})
    );

    let forks = session.fork(2).await.expect("fork");
    let ids: Vec<&str> = forks.iter().map(|s| s.id()).collect();
    assert_eq!(ids, ["s-2", "s-3"]);
    assert_eq!(body_json(&mock.last()), serde_json::json!({"count": 2}));

    let info = session.pause(PauseKind::Disk).await.expect("pause");
    assert_eq!(info.state, SessionState::Paused);
    assert_eq!(session.info().state, SessionState::Paused);
    let rec = mock.last();
    assert_eq!(rec.target, "/v1/sandbox/sessions/s-1/pause");
    assert_eq!(body_json(&rec), serde_json::json!({"memory": false}));
    session.pause(PauseKind::Memory).await.expect("pause");
    assert_eq!(body_json(&mock.last()), serde_json::json!({"memory": true}));

    let info = session.resume().await.expect("resume");
    assert_eq!(info.state, SessionState::Running);
    let rec = mock.last();
    assert_eq!(
        (rec.method.as_str(), rec.target.as_str()),
        ("POST", "/v1/sandbox/sessions/s-1/resume")
    );

    client.delete_snapshot("snap-1").await.expect("delete");
    let rec = mock.last();
    assert_eq!(
        (rec.method.as_str(), rec.target.as_str()),
        ("DELETE", "/v1/sandbox/snapshots/snap-1")
    );
}

#[tokio::test]
async fn state_errors_carry_their_codes() {
    let mock = Mock::start(|rec| {
        if rec.target.ends_with("/snapshot") || rec.target.ends_with("/fork") {
            json(
                507,
                r#"{"error":{"code":"SANDBOX-QUOTA-SNAPSHOT-STORAGE","message":"snapshot storage full"}}"#,
            )
        } else {
            json(
                404,
                r#"{"error":{"code":"SANDBOX-NOT-FOUND","message":"snapshot not found"}}"#,
            )
        }
    })
    .await;
    let client = Client::new(&mock.url, "k").expect("client");
    let err = client
        .snapshot_session("s-1", Some("big"))
        .await
        .expect_err("507");
    assert_eq!(err.code(), Some(koder_sdk::codes::QUOTA_SNAPSHOT_STORAGE));
    assert_eq!(err.status(), Some(507));
    let err = client.fork_session("s-1", 3).await.expect_err("507");
    assert_eq!(err.code(), Some("SANDBOX-QUOTA-SNAPSHOT-STORAGE"));

    let err = client.delete_snapshot("gone").await.expect_err("404");
    assert!(err.is_not_found(), "{err:?}");
    let err = client.get_snapshot("gone").await.expect_err("404");
    assert!(err.is_not_found(), "{err:?}");
    let err = client
        .pause_session("gone", PauseKind::Memory)
        .await
        .expect_err("404");
    assert_eq!(err.code(), Some("SANDBOX-NOT-FOUND"));
    let err = client.resume_session("gone").await.expect_err("404");
    assert!(err.is_not_found(), "{err:?}");
}

const VOLUME: &str = r#"{"volume_id":"vol-1","name":"data","size_mib":1024,"used_bytes":4096,
 "backend":"btrfs","created_at":"2025-01-01T00:00:00Z",
 "mounts":[{"session_id":"s-1","path":"/data","read_only":true}]}"#;

#[tokio::test]
async fn volume_calls() {
    let mock = Mock::start(|rec| match (rec.method.as_str(), rec.target.as_str()) {
        ("POST", "/v1/sandbox/volumes") => json(201, VOLUME),
        ("GET", "/v1/sandbox/volumes") => json(200, &format!(r#"{{"volumes":[{VOLUME}]}}"#)),
        ("GET", t) if t.contains("/files/list?") => {
            json(200, &format!(r#"{{"entries":[{ENTRY}],"truncated":true}}"#))
        }
        ("GET", t) if t.contains("/files?") => Canned {
            status: 200,
            content_type: "application/octet-stream",
            body: b"volume bytes".to_vec(),
            ..Canned::default()
        },
        ("GET", t) if t.contains("/files/") => json(200, ENTRY),
        ("GET", _) => json(200, VOLUME),
        ("DELETE", _) => no_content(),
        (_, t) if t.contains("/files") => json(201, ENTRY),
        _ => json(
            404,
            r#"{"error":{"code":"SANDBOX-NOT-FOUND","message":"no route"}}"#,
        ),
    })
    .await;
    let client = Client::new(&mock.url, "k").expect("client");

    let vol = client
        .create_volume("data", Some(1024))
        .await
        .expect("create");
    assert_eq!(vol.mounts[0].path, "/data");
    assert_eq!(
        body_json(&mock.last()),
        serde_json::json!({"name": "data", "size_mib": 1024})
    );
    client.create_volume("data", None).await.expect("create");
    assert_eq!(body_json(&mock.last()), serde_json::json!({"name": "data"}));
    assert_eq!(
        client.list_volumes().await.expect("list"),
        vec![vol.clone()]
    );
    assert_eq!(client.get_volume("a/b").await.expect("get"), vol);
    assert_eq!(mock.last().target, "/v1/sandbox/volumes/a%2Fb");
    client.delete_volume("data").await.expect("delete");
    let rec = mock.last();
    assert_eq!(
        (rec.method.as_str(), rec.target.as_str()),
        ("DELETE", "/v1/sandbox/volumes/data")
    );
    let sent = mock.seen.lock().expect("lock").len();
    let err = client.delete_volume("..").await.expect_err("dot-dot");
    assert!(matches!(err, Error::InvalidName(_)), "{err:?}");
    assert_eq!(mock.seen.lock().expect("lock").len(), sent, "nothing sent");

    let opts = VolumeWrite {
        overwrite: true,
        mode: Some(0o600),
        ..VolumeWrite::default()
    };
    client
        .volume_upload("data", "/a b.txt", b"abc".to_vec(), &opts)
        .await
        .expect("upload");
    let rec = mock.last();
    assert_eq!(rec.method, "PUT");
    assert_eq!(
        rec.target,
        "/v1/sandbox/volumes/data/files?path=%2Fa+b.txt&overwrite=true&mode=384"
    );
    assert_eq!(rec.body, b"abc");
    assert_eq!(rec.header("content-type"), Some("application/octet-stream"));

    let dir = tempfile::tempdir().expect("tempdir");
    let local = dir.path().join("in.bin");
    std::fs::write(&local, b"12345").expect("write");
    client
        .volume_upload_file("data", "/in.bin", &local, &VolumeWrite::default())
        .await
        .expect("upload file");
    let rec = mock.last();
    assert_eq!(
        rec.target,
        "/v1/sandbox/volumes/data/files?path=%2Fin.bin&overwrite=false"
    );
    assert_eq!(rec.header("content-length"), Some("5"));

    let bytes = client
        .volume_download("data", "/in.bin")
        .await
        .expect("get");
    assert_eq!(&bytes[..], b"volume bytes");
    let mut sink = Vec::new();
    let n = client
        .volume_download_to("data", "/in.bin", &mut sink)
        .await
        .expect("download_to");
    assert_eq!((n, &sink[..]), (12, &b"volume bytes"[..]));
    assert_eq!(
        mock.last().target,
        "/v1/sandbox/volumes/data/files?path=%2Fin.bin"
    );

    let list = client
        .volume_list("data", "/", Some(3))
        .await
        .expect("list");
    assert!(list.truncated);
    assert_eq!(
        mock.last().target,
        "/v1/sandbox/volumes/data/files/list?path=%2F&depth=3"
    );
    client.volume_stat("data", "/x").await.expect("stat");
    assert_eq!(
        mock.last().target,
        "/v1/sandbox/volumes/data/files/stat?path=%2Fx"
    );

    client
        .volume_mkdir("data", "/d/e", true)
        .await
        .expect("mkdir");
    let rec = mock.last();
    assert_eq!(
        (rec.method.as_str(), rec.target.as_str()),
        ("POST", "/v1/sandbox/volumes/data/files/mkdir")
    );
    assert_eq!(
        body_json(&rec),
        serde_json::json!({"path": "/d/e", "parents": true})
    );

    client
        .volume_set_metadata("data", "/x", Some(0), None, Some(0o755))
        .await
        .expect("patch");
    let rec = mock.last();
    assert_eq!(
        (rec.method.as_str(), rec.target.as_str()),
        ("PATCH", "/v1/sandbox/volumes/data/files?path=%2Fx")
    );
    assert_eq!(body_json(&rec), serde_json::json!({"uid": 0, "mode": 493}));

    client.volume_remove("data", "/d").await.expect("rm");
    let rec = mock.last();
    assert_eq!(
        (rec.method.as_str(), rec.target.as_str()),
        ("DELETE", "/v1/sandbox/volumes/data/files?path=%2Fd")
    );
}

#[tokio::test]
async fn volume_errors_carry_their_codes() {
    let mock = Mock::start(|rec| match rec.method.as_str() {
        "DELETE" => json(
            409,
            r#"{"error":{"code":"SANDBOX-VOLUME-BUSY","message":"mounted by s-1"}}"#,
        ),
        _ => json(
            507,
            r#"{"error":{"code":"SANDBOX-QUOTA-VOLUME-STORAGE","message":"no room"}}"#,
        ),
    })
    .await;
    let client = Client::new(&mock.url, "k").expect("client");
    let err = client.delete_volume("data").await.expect_err("409");
    assert_eq!(
        (err.status(), err.code()),
        (Some(409), Some(koder_sdk::codes::VOLUME_BUSY))
    );
    let err = client
        .create_volume("big", Some(1 << 20))
        .await
        .expect_err("507");
    assert_eq!(err.code(), Some(koder_sdk::codes::QUOTA_VOLUME_STORAGE));
    let err = client
        .volume_upload("data", "/f", "x", &VolumeWrite::default())
        .await
        .expect_err("507");
    assert_eq!(err.status(), Some(507));
}

const CONTEXT: &str =
    r#"{"context_id":"c-1","language":"node","execution_count":0,"cwd":"/workspace"}"#;
const UPSTREAM: &str = r#"{"url":"http://127.0.0.1:8000","port":8000,"pinned":true,
    "preview_path":"/v1/sandbox/sessions/s-1/preview/"}"#;

#[tokio::test]
async fn context_and_preview_calls() {
    use koder_sdk::interp::{CreateContext, RunCode, DEFAULT_CONTEXT};
    let mock = Mock::start(|rec| match (rec.method.as_str(), rec.target.as_str()) {
        ("POST", "/v1/sandbox/sessions/s-1/contexts") => json(201, CONTEXT),
        ("GET", "/v1/sandbox/sessions/s-1/contexts") => {
            json(200, &format!(r#"{{"contexts":[{CONTEXT}]}}"#))
        }
        ("DELETE", _) => no_content(),
        ("POST", t) if t.ends_with("/restart") => json(200, CONTEXT),
        ("POST", t) if t.ends_with("/run") => json(
            200,
            r#"{"stdout":"","stderr":"","stdout_truncated":false,"stderr_truncated":false,
                "results":[{"is_main_result":false,"png":"iVBORw0K"}],
                "error":{"name":"ValueError","value":"bad","traceback":"tb"},
                "execution_count":1,"duration_ms":3,"verdict":null,"restarted":false}"#,
        ),
        ("POST", "/v1/sandbox/sessions/s-1/preview") => json(200, UPSTREAM),
        ("GET", "/v1/sandbox/sessions/s-1/upstream") => json(
            503,
            r#"{"error":{"code":"SANDBOX-PREVIEW-NOT-LISTENING","message":"nothing listens"}}"#,
        ),
        _ => json(
            404,
            r#"{"error":{"code":"SANDBOX-NOT-FOUND","message":"no"}}"#,
        ),
    })
    .await;
    let client = Client::new(&mock.url, "k").expect("client");
    let created = client
        .create_context(
            "s-1",
            &CreateContext {
                language: Some("node".into()),
                ..Default::default()
            },
        )
        .await
        .expect("create");
    assert_eq!(created.context_id, "c-1");
    assert_eq!(client.list_contexts("s-1").await.expect("list"), [created]);
    client.delete_context("s-1", "c-1").await.expect("delete");
    client.restart_context("s-1", "c-1").await.expect("restart");
    let run = client
        .run_in_context(
            "s-1",
            DEFAULT_CONTEXT,
            &RunCode {
                code: "raise ValueError('bad')".into(),
                timeout_ms: Some(500),
                ..Default::default()
            },
        )
        .await
        .expect("run");
    assert_eq!(run.error.map(|e| e.name).as_deref(), Some("ValueError"));
    assert_eq!(run.results[0].png.as_deref(), Some("iVBORw0K"));
    let pinned = client.pin_preview("s-1", 8000).await.expect("pin");
    assert!(pinned.pinned && pinned.port == 8000, "{pinned:?}");
    let err = client.upstream("s-1").await.expect_err("503");
    assert_eq!(err.code(), Some("SANDBOX-PREVIEW-NOT-LISTENING"));
    assert_eq!(
        client.preview_url("s-1").expect("url").as_str(),
        format!("{}/v1/sandbox/sessions/s-1/preview/", mock.url)
    );

    let seen = mock.seen.lock().unwrap().clone();
    assert_eq!(body_json(&seen[0]), serde_json::json!({"language": "node"}));
    assert_eq!(seen[2].target, "/v1/sandbox/sessions/s-1/contexts/c-1");
    assert_eq!(
        seen[4].target,
        "/v1/sandbox/sessions/s-1/contexts/default/run"
    );
    assert_eq!(
        body_json(&seen[4]),
        serde_json::json!({"code": "raise ValueError('bad')", "timeout_ms": 500})
    );
    assert_eq!(body_json(&seen[5]), serde_json::json!({"port": 8000}));
}
