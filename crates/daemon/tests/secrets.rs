//! Secrets injected at egress, end to end: stored sealed, never returned, bound to a session
//! as a placeholder, replaced in request headers to the secret's host only, masked in what
//! comes back. The upstream is a server in a network namespace this test creates; it logs
//! what it received to a file the test reads.

mod common;
#[path = "support/testnet.rs"]
mod testnet;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use testnet::TestNet;

/// An HTTP server answering with the Authorization it got (body and `x-seen-auth`), logging
/// Host and Authorization of every request to `{log}`.
fn servers(log: &str, tls: &str) -> String {
    format!(
        r#"
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        auth = self.headers.get("authorization") or ""
        with open("{log}", "a") as f:
            f.write(json.dumps({{"host": self.headers.get("host"), "auth": auth, "key": self.headers.get("x-key") or ""}}) + "\n")
        body = ("seen:" + auth).encode()
        self.send_response(200); self.send_header("x-seen-auth", auth); self.send_header("content-length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
{tls}
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), H).serve_forever()
"#
    )
}

/// The same server behind TLS on 8443 with `dir`'s certificate (see [`test_ca`]).
fn tls_server(dir: &std::path::Path) -> String {
    format!(
        r#"
import ssl, threading
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); ctx.load_cert_chain("{d}/srv.pem", "{d}/srv.key")
s2 = http.server.ThreadingHTTPServer(("0.0.0.0", 8443), H); s2.socket = ctx.wrap_socket(s2.socket, server_side=True)
threading.Thread(target=s2.serve_forever, daemon=True).start()
"#,
        d = dir.display()
    )
}

/// A test CA (`ca.pem`) and a server certificate for api.test and other.test signed by it.
fn test_ca(dir: &std::path::Path) {
    let run = |args: &[&str]| {
        let st = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("openssl");
        assert!(st.success(), "openssl {args:?}");
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    run(&[
        &["req", "-x509"][..],
        &ec,
        &[
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=koder test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign",
        ],
    ]
    .concat());
    run(&[
        &["req"][..],
        &ec,
        &[
            "-keyout",
            "srv.key",
            "-out",
            "srv.csr",
            "-subj",
            "/CN=api.test",
        ],
    ]
    .concat());
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:api.test,DNS:other.test\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "srv.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "srv.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
}

const PROBE: &str = r#"
import os, urllib.request, glob
tok = os.environ["API_TOKEN"]
print(tok)
def get(url):
    r = urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": "Bearer " + tok, "X-Key": tok}), timeout=10)
    return r.headers.get("x-seen-auth") + "|" + r.read().decode()
print(get("http://api.test:8080/"))
print(get("http://other.test:8080/"))
# Everything the session could read the value from, hex-encoded for the test to search (the
# probe must not hold the value itself).
seen = b""
for p in ["/proc/self/environ", "/proc/1/environ", "/proc/self/cmdline"] + glob.glob("/tmp/**", recursive=True) + glob.glob("/etc/*"):
    try: seen += open(p, "rb").read()
    except Exception: pass
print(seen.hex())
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_injected_for_their_host_only() {
    let Some(()) = root_or_skip() else { return };
    let logdir = tempfile::tempdir().unwrap();
    let log = logdir.path().join("seen.jsonl");
    let net = TestNet::up(2, &servers(log.to_str().unwrap(), ""), 8080);
    let ip = net.server_ip();
    let d = Daemon::start(&format!(
        "{BASE_CONFIG}[network]\ninternal = [\"{ip}/32\"]\nsystem_resolver = false\nhosts = {{ \"api.test\" = [\"{ip}\"], \"other.test\" = [\"{ip}\"] }}\n"
    ))
    .await;
    let value = format!("sv-{}", std::process::id() * 7919 + 12345);

    let (status, s) = d
        .json(
            Method::POST,
            "/v1/sandbox/secrets",
            json!({"name": "API_TOKEN", "value": value, "hosts": ["api.test:8080"]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{s}");
    assert_eq!(s["name"], "API_TOKEN");
    let (_, list) = d
        .json(Method::GET, "/v1/sandbox/secrets", Value::Null)
        .await;
    assert_eq!(list["secrets"][0]["hosts"], json!(["api.test:8080"]));
    assert!(!s.to_string().contains(&value) && !list.to_string().contains(&value));
    let (_, theirs) = d
        .json_as(KEY2, Method::GET, "/v1/sandbox/secrets", Value::Null)
        .await;
    assert_eq!(theirs["secrets"], json!([]), "another tenant sees it");

    let (status, e) = d
        .json(
            Method::POST,
            "/v1/sandbox/sessions",
            json!({"secrets": ["API_TOKEN"]}),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "secrets without network: {e}"
    );
    let (status, e) = d
        .json(
            Method::POST,
            "/v1/sandbox/sessions",
            json!({"network": {"mode": "open"}, "secrets": ["NOPE"]}),
        )
        .await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::NOT_FOUND, "SANDBOX-SECRET-NOT-FOUND"),
        "{e}"
    );

    let (status, s) = d
        .json(
            Method::POST,
            "/v1/sandbox/sessions",
            json!({"language": "python", "network": {"mode": "allowlist", "allow": ["api.test", "other.test"]},
                   "secrets": ["API_TOKEN"]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{s}");
    let id = s["id"].as_str().unwrap().to_string();
    let r = d
        .exec(
            &id,
            json!({"code": PROBE, "language": "python", "timeout_ms": 60000}),
        )
        .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    let out: Vec<&str> = r["stdout"].as_str().unwrap().lines().collect();
    let placeholder = out[0];
    assert!(
        placeholder.starts_with("KSECRET_") && !placeholder.contains(&value),
        "{out:?}"
    );
    assert!(
        !r.to_string().contains(&value),
        "the sandbox saw the value: {r}"
    );
    let hex: String = value.bytes().map(|b| format!("{b:02x}")).collect();
    assert!(out[3].len() > 1000, "the probe read the session's files");
    assert!(
        !out[3].contains(&hex),
        "the value is in the sandbox's environment or files"
    );
    // What the sandbox got back from the bound host: the echoed value masked by the
    // placeholder, cut to the value's length.
    let mask = &placeholder[..value.len()];
    assert_eq!(
        out[1],
        format!("Bearer {mask}|seen:Bearer {mask}"),
        "{out:?}"
    );
    assert_eq!(
        out[2],
        format!("Bearer {placeholder}|seen:Bearer {placeholder}"),
        "another host gets the placeholder as it was"
    );

    let seen: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0]["host"], "api.test:8080");
    assert_eq!(
        seen[0]["auth"],
        format!("Bearer {value}"),
        "injected for the bound host"
    );
    assert_eq!(seen[0]["key"], value, "every header");
    assert_eq!(seen[1]["host"], "other.test:8080");
    assert_eq!(
        seen[1]["auth"],
        format!("Bearer {placeholder}"),
        "left alone for another host"
    );

    let (_, audit) = d
        .json(
            Method::GET,
            &format!("/v1/sandbox/audit/network?session_id={id}"),
            Value::Null,
        )
        .await;
    assert!(
        audit["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["proto"] == "secret"
                && e["name"] == "api.test"
                && e["reason"].as_str().unwrap().contains("API_TOKEN")),
        "{audit}"
    );
    assert!(
        !audit.to_string().contains(&value),
        "the audit log holds the value"
    );
    for file in ["state.db", "state.db-wal"] {
        let db = std::fs::read(d.data_dir().join(file)).unwrap_or_default();
        assert!(
            !db.windows(value.len()).any(|w| w == value.as_bytes()),
            "the value is stored in the clear in {file}"
        );
    }

    let (status, _) = d
        .json(Method::DELETE, "/v1/sandbox/secrets/API_TOKEN", Value::Null)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, e) = d
        .json(Method::DELETE, "/v1/sandbox/secrets/API_TOKEN", Value::Null)
        .await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::NOT_FOUND, "SANDBOX-SECRET-NOT-FOUND"),
        "{e}"
    );
}

/// Over HTTPS: the bound host's TLS is terminated with the session's CA (which the session
/// trusts through its environment) and re-encrypted to the upstream, verified against the
/// configured upstream CA; another host's TLS is left end to end.
const TLS_PROBE: &str = r#"
import os, ssl, urllib.request
tok = os.environ["API_TOKEN"]
def get(url, ctx=None):
    try:
        r = urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": "Bearer " + tok}), timeout=10, context=ctx)
        return r.headers.get("x-seen-auth") + "|" + r.read().decode()
    except Exception as e: return "failed:" + repr(e)
print(tok)
print(get("https://api.test:8443/"))
only_test_ca = ssl.create_default_context(cafile="/tmp/test-ca.pem")
print(get("https://other.test:8443/", only_test_ca))
print(get("https://api.test:8443/", only_test_ca))
print(os.environ["SSL_CERT_FILE"], os.environ["NODE_EXTRA_CA_CERTS"])
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_over_tls_are_injected_by_interception() {
    let Some(()) = root_or_skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    test_ca(dir.path());
    let log = dir.path().join("seen.jsonl");
    let net = TestNet::up(
        3,
        &servers(log.to_str().unwrap(), &tls_server(dir.path())),
        8443,
    );
    let ip = net.server_ip();
    let d = Daemon::start(&format!(
        "{BASE_CONFIG}[network]\ninternal = [\"{ip}/32\"]\nsystem_resolver = false\nhosts = {{ \"api.test\" = [\"{ip}\"], \"other.test\" = [\"{ip}\"] }}\n\
         [secrets]\nupstream_ca_file = \"{}\"\n",
        dir.path().join("ca.pem").display()
    ))
    .await;
    let value = format!("tv-{}", std::process::id() * 104_729 + 777);
    let (status, s) = d
        .json(
            Method::POST,
            "/v1/sandbox/secrets",
            json!({"name": "API_TOKEN", "value": value, "hosts": ["api.test"]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{s}");
    let id = d
        .create(json!({"language": "python", "network": {"mode": "allowlist", "allow": ["api.test", "other.test"]},
                       "secrets": ["API_TOKEN"]}))
        .await;
    let ca = std::fs::read(dir.path().join("ca.pem")).unwrap();
    let r = d
        .req(
            Method::PUT,
            &format!("/v1/sandbox/sessions/{id}/files?path=/tmp/test-ca.pem"),
            KEY1,
        )
        .body(ca)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = d
        .exec(
            &id,
            json!({"code": TLS_PROBE, "language": "python", "timeout_ms": 60000}),
        )
        .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    assert!(
        !r.to_string().contains(&value),
        "the sandbox saw the value: {r}"
    );
    let out: Vec<&str> = r["stdout"].as_str().unwrap().lines().collect();
    let placeholder = out[0];
    let mask = &placeholder[..value.len()];
    assert_eq!(
        out[1],
        format!("Bearer {mask}|seen:Bearer {mask}"),
        "intercepted: {out:?}"
    );
    assert_eq!(
        out[2],
        format!("Bearer {placeholder}|seen:Bearer {placeholder}"),
        "another host: end-to-end TLS under the upstream's own certificate: {out:?}"
    );
    assert!(
        out[3].starts_with("failed:") && out[3].contains("CERTIFICATE_VERIFY_FAILED"),
        "the bound host is answered under the session's CA, not the upstream's: {out:?}"
    );
    assert_eq!(
        out[4],
        "/tmp/.koder-egress/bundle.pem /tmp/.koder-egress/ca.pem"
    );
    let seen: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(
        seen[0]["auth"],
        format!("Bearer {value}"),
        "injected behind TLS"
    );
    assert_eq!(seen[1]["auth"], format!("Bearer {placeholder}"));
}

/// `POST .../{id}/pause` (to disk) or `.../resume`, expecting 200.
async fn pause(d: &Daemon, id: &str, what: &str) {
    let path = format!("/v1/sandbox/sessions/{id}/{what}");
    let body = if what == "pause" {
        json!({"memory": false})
    } else {
        Value::Null
    };
    let (status, v) = d.json(Method::POST, &path, body).await;
    assert_eq!(status, StatusCode::OK, "{path}: {v}");
}

/// What the bound host got for one request from the session (its Authorization), with what
/// the session saw (the placeholder in its environment).
async fn injected(d: &Daemon, id: &str, log: &std::path::Path) -> (String, String) {
    const GET: &str = r#"
import os, urllib.request
tok = os.environ["API_TOKEN"]
urllib.request.urlopen(urllib.request.Request("http://api.test:8080/", headers={"Authorization": "Bearer " + tok}), timeout=10).read()
print(tok)
"#;
    let before = std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .count();
    let r = d
        .exec(
            id,
            json!({"code": GET, "language": "python", "timeout_ms": 60000}),
        )
        .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    let seen = std::fs::read_to_string(log).unwrap();
    let last: Value = serde_json::from_str(seen.lines().nth(before).expect("a request")).unwrap();
    (
        last["auth"].as_str().unwrap().to_string(),
        r["stdout"].as_str().unwrap().trim().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bindings_outlive_the_sandbox_pause_fork_and_restart() {
    let Some(()) = root_or_skip() else { return };
    let logdir = tempfile::tempdir().unwrap();
    let log = logdir.path().join("seen.jsonl");
    let net = TestNet::up(1, &servers(log.to_str().unwrap(), ""), 8080);
    let ip = net.server_ip();
    let mut d = Daemon::start(&format!(
        "{BASE_CONFIG}[network]\ninternal = [\"{ip}/32\"]\nsystem_resolver = false\nhosts = {{ \"api.test\" = [\"{ip}\"] }}\n"
    ))
    .await;
    let value = format!("dv-{}", std::process::id() * 31 + 4242);
    let (status, s) = d
        .json(
            Method::POST,
            "/v1/sandbox/secrets",
            json!({"name": "API_TOKEN", "value": value, "hosts": ["api.test:8080"]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{s}");
    let id = d
        .create(
            json!({"language": "python", "network": {"mode": "allowlist", "allow": ["api.test"]},
                       "secrets": ["API_TOKEN"]}),
        )
        .await;
    let expected = format!("Bearer {value}");
    let (auth, placeholder) = injected(&d, &id, &log).await;
    assert_eq!(auth, expected);
    // Paused to disk and resumed: a new sandbox, the same placeholder, injected again.
    pause(&d, &id, "pause").await;
    pause(&d, &id, "resume").await;
    assert_eq!(
        injected(&d, &id, &log).await,
        (expected.clone(), placeholder.clone())
    );

    // A fork keeps its source's placeholder, and gets the value injected too.
    let (status, forks) = d
        .json(
            Method::POST,
            &format!("/v1/sandbox/sessions/{id}/fork"),
            json!({"count": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{forks}");
    let fork = forks["sessions"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(
        injected(&d, &fork, &log).await,
        (expected.clone(), placeholder.clone())
    );

    // Paused to disk across a daemon restart: the binding is in the store, not in memory.
    pause(&d, &id, "pause").await;
    d.stop();
    d.launch().await;
    pause(&d, &id, "resume").await;
    assert_eq!(
        injected(&d, &id, &log).await,
        (expected.clone(), placeholder.clone())
    );

    // Deleted meanwhile: a resumed session gets nothing injected any more (the placeholder
    // goes out as it is).
    let (status, _) = d
        .json(Method::DELETE, "/v1/sandbox/secrets/API_TOKEN", Value::Null)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    pause(&d, &id, "pause").await;
    pause(&d, &id, "resume").await;
    assert_eq!(
        injected(&d, &id, &log).await,
        (format!("Bearer {placeholder}"), placeholder.clone())
    );
    for file in ["state.db", "state.db-wal"] {
        let db = std::fs::read(d.data_dir().join(file)).unwrap_or_default();
        assert!(
            !db.windows(value.len()).any(|w| w == value.as_bytes()),
            "{file}"
        );
    }
}

/// A running session takes its secrets as they are stored at each connection: a replaced
/// value at once, nothing for a host the secret no longer names, nothing once it is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_session_follows_its_secret_s_rotation_and_deletion() {
    let Some(()) = root_or_skip() else { return };
    let logdir = tempfile::tempdir().unwrap();
    let log = logdir.path().join("seen.jsonl");
    let net = TestNet::up(3, &servers(log.to_str().unwrap(), ""), 8080);
    let ip = net.server_ip();
    let d = Daemon::start(&format!(
        "{BASE_CONFIG}[network]\ninternal = [\"{ip}/32\"]\nsystem_resolver = false\nhosts = {{ \"api.test\" = [\"{ip}\"] }}\n"
    ))
    .await;
    let put = |value: &str, host: &str| {
        let body = json!({"name": "API_TOKEN", "value": value, "hosts": [host]});
        let d = &d;
        async move {
            let (status, s) = d.json(Method::POST, "/v1/sandbox/secrets", body).await;
            assert_eq!(status, StatusCode::CREATED, "{s}");
        }
    };
    let first = format!("rv1-{}", std::process::id());
    put(&first, "api.test:8080").await;
    let id = d
        .create(
            json!({"language": "python", "network": {"mode": "allowlist", "allow": ["api.test"]},
                       "secrets": ["API_TOKEN"]}),
        )
        .await;
    let (auth, placeholder) = injected(&d, &id, &log).await;
    assert_eq!(auth, format!("Bearer {first}"));

    let rotated = format!("rv2-{}", std::process::id());
    put(&rotated, "api.test:8080").await;
    assert_eq!(
        injected(&d, &id, &log).await,
        (format!("Bearer {rotated}"), placeholder.clone()),
        "the rotated value, the same placeholder"
    );

    put(&rotated, "elsewhere.test:8080").await;
    assert_eq!(
        injected(&d, &id, &log).await.0,
        format!("Bearer {placeholder}"),
        "its hosts no longer name api.test"
    );

    put(&rotated, "api.test:8080").await;
    assert_eq!(injected(&d, &id, &log).await.0, format!("Bearer {rotated}"));
    let (status, _) = d
        .json(Method::DELETE, "/v1/sandbox/secrets/API_TOKEN", Value::Null)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        injected(&d, &id, &log).await.0,
        format!("Bearer {placeholder}"),
        "deleted: injected no more"
    );
}
