//! Network policy end to end. The "internet" is a network namespace this test creates, joined
//! to the host by a veth pair, with test servers inside it; the daemon's resolver maps test
//! names to it and its internal set exempts it from the SSRF guard. No traffic leaves loopback
//! or that namespace.

mod common;
#[path = "support/testnet.rs"]
mod testnet;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use testnet::TestNet;

const S: &str = "/v1/sandbox/sessions";

/// An HTTP server echoing the Host it saw (8080) and a raw server answering with the first byte
/// it received (8443), for the TLS SNI checks.
const SERVERS: &str = r#"
import http.server, socket, threading
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("ok:" + (self.headers.get("host") or "")).encode()
        self.send_response(200); self.send_header("content-length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
def raw():
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 8443)); s.listen()
    while True:
        c, _ = s.accept(); d = c.recv(4096); c.sendall(b"raw:%02x" % (d[0] if d else 0)); c.close()
threading.Thread(target=raw, daemon=True).start()
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), H).serve_forever()
"#;

fn config(net: &TestNet, internal: &str) -> String {
    format!(
        "{BASE_CONFIG}[network]\ninternal = [\"{internal}\"]\nsystem_resolver = false\nhosts = {{ \"pkg.test\" = [\"{ip}\"], \"other.test\" = [\"{ip}\"] }}\n",
        ip = net.server_ip()
    )
}

/// Runs a Python probe in the session and returns its stdout lines.
async fn probe(d: &Daemon, id: &str, code: &str) -> Vec<String> {
    let r = d
        .exec(
            id,
            json!({"code": code, "language": "python", "timeout_ms": 30000}),
        )
        .await;
    assert_eq!(r["exit_code"], 0, "probe failed: {r}");
    r["stdout"]
        .as_str()
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

const HELPERS: &str = r#"
import socket, ssl, urllib.request
def http(url):
    try: return urllib.request.urlopen(url, timeout=5).read().decode()
    except Exception as e: return "refused:" + type(e).__name__
def resolve(name):
    try: return socket.getaddrinfo(name, 80, socket.AF_INET)[0][4][0]
    except Exception as e: return "nxdomain:" + type(e).__name__
def raw(ip, port, data):
    try:
        s = socket.create_connection((ip, port), timeout=5); s.sendall(data); r = s.recv(100); s.close()
        return r.decode() or "refused:empty"
    except Exception as e: return "refused:" + type(e).__name__
def tls(ip, port, name):
    out, inc = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ssl.create_default_context().wrap_bio(inc, out, server_hostname=name)
    try: obj.do_handshake()
    except ssl.SSLWantReadError: pass
    return raw(ip, port, out.read())
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowlist_none_and_open_against_a_test_network() {
    let Some(()) = root_or_skip() else { return };
    let net = TestNet::up(0, SERVERS, 8080);
    let ip = net.server_ip();
    let d = Daemon::start(&config(&net, &format!("{}/32", ip))).await;

    // Entries that resolve into guarded ranges are refused at create.
    let (status, e) = d
        .json(
            Method::POST,
            S,
            json!({"network": {"mode": "allowlist", "allow": ["169.254.169.254"]}}),
        )
        .await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::BAD_REQUEST, "SANDBOX-NETWORK-RULE"),
        "{e}"
    );
    let (status, _) = d
        .json(
            Method::POST,
            S,
            json!({"network": {"mode": "allowlist", "allow": ["nowhere.test"]}}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // allowlist
    let (status, s) = d
        .json(
            Method::POST,
            S,
            json!({"language": "python", "network": {"mode": "allowlist", "allow": ["pkg.test"]}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{s}");
    assert_eq!(
        s["network"],
        json!({"mode": "allowlist", "allow": [format!("pkg.test={ip}")]}),
        "pinned answer shown"
    );
    let id = s["id"].as_str().unwrap().to_string();
    let out = probe(&d, &id, &format!(
        "{HELPERS}\nprint(resolve('pkg.test'))\nprint(http('http://pkg.test:8080/'))\nprint(resolve('other.test'))\n\
         print(raw('{ip}', 8080, b'GET / HTTP/1.1\\r\\nHost: other.test\\r\\n\\r\\n'))\n\
         print(tls('{ip}', 8443, 'pkg.test'))\nprint(tls('{ip}', 8443, 'other.test'))\nprint(raw('{ip}', 8443, b''))\n\
         print(raw('{}.1', 8080, b'GET / HTTP/1.1\\r\\nHost: pkg.test\\r\\n\\r\\n'))",
        net.prefix
    )).await;
    assert_eq!(
        out[0], ip,
        "allowlisted name resolves to its pinned address"
    );
    assert_eq!(out[1], "ok:pkg.test:8080", "allowlisted name reachable");
    assert!(
        out[2].starts_with("nxdomain"),
        "other names do not resolve: {out:?}"
    );
    assert!(
        out[3].starts_with("refused"),
        "raw IP with another Host refused: {out:?}"
    );
    assert_eq!(
        out[4], "raw:16",
        "TLS with the allowlisted SNI passes (the server got a ClientHello)"
    );
    assert!(
        out[5].starts_with("refused"),
        "raw IP with a different SNI refused: {out:?}"
    );
    assert!(
        out[6].starts_with("refused"),
        "a connection naming nothing is refused: {out:?}"
    );
    assert!(
        out[7].starts_with("refused"),
        "another address refused: {out:?}"
    );

    let (_, audit) = d
        .json(
            Method::GET,
            &format!("/v1/sandbox/audit/network?session_id={id}"),
            Value::Null,
        )
        .await;
    let entries = audit["entries"].as_array().unwrap();
    let has = |proto: &str, name: &str, allowed: bool| {
        entries.iter().any(|e| {
            e["proto"] == proto
                && e["name"].as_str().unwrap_or("").contains(name)
                && e["allowed"] == allowed
        }) || entries.iter().any(|e| {
            e["proto"] == proto && e["dest"].as_str() == Some(name) && e["allowed"] == allowed
        })
    };
    assert!(has("tcp", "pkg.test", true), "{audit}");
    assert!(has("dns", "other.test", false), "{audit}");
    assert!(has("tcp", "other.test", false), "{audit}");
    assert!(has("tcp", &format!("{}.1", net.prefix), false), "{audit}");
    for e in entries {
        assert_eq!(e["session_id"], id.as_str());
        assert!(e["at"].is_string() && e["reason"].is_string() && e["port"].is_number());
    }
    // Paging and tenancy.
    let (_, page) = d
        .json(
            Method::GET,
            "/v1/sandbox/audit/network?limit=2",
            Value::Null,
        )
        .await;
    assert_eq!(page["entries"].as_array().unwrap().len(), 2);
    let before = page["next_before"].as_i64().unwrap();
    let (_, older) = d
        .json(
            Method::GET,
            &format!("/v1/sandbox/audit/network?limit=1000&before={before}"),
            Value::Null,
        )
        .await;
    assert!(older["entries"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["id"].as_i64().unwrap() < before));
    let (_, theirs) = d
        .json_as(KEY2, Method::GET, "/v1/sandbox/audit/network", Value::Null)
        .await;
    assert!(
        theirs["entries"].as_array().unwrap().is_empty(),
        "another tenant sees this audit log"
    );

    // none: nothing resolves, nothing connects.
    let none = d.create(json!({"language": "python"})).await;
    let out = probe(&d, &none, &format!("{HELPERS}\nprint(resolve('pkg.test'))\nprint(raw('{ip}', 8080, b'GET / HTTP/1.1\\r\\n\\r\\n'))")).await;
    assert!(
        out[0].starts_with("nxdomain") && out[1].starts_with("refused"),
        "mode none reached out: {out:?}"
    );

    // open: public-looking or internal destinations by IP, never a guarded range.
    let open = d
        .create(json!({"language": "python", "network": {"mode": "open"}}))
        .await;
    let out = probe(&d, &open, &format!(
        "{HELPERS}\nprint(raw('{ip}', 8080, b'GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')[:15])\nprint(raw('{}.1', 8080, b'x'))\nprint(raw('169.254.169.254', 80, b'x'))",
        net.prefix
    )).await;
    assert_eq!(
        out[0], "HTTP/1.0 200 OK",
        "open mode reaches the internal test server: {out:?}"
    );
    assert!(
        out[1].starts_with("refused"),
        "open mode reached a private range: {out:?}"
    );
    assert!(
        out[2].starts_with("refused"),
        "open mode reached the metadata address: {out:?}"
    );
    let (_, audit) = d
        .json(
            Method::GET,
            &format!("/v1/sandbox/audit/network?session_id={open}&allowed=false"),
            Value::Null,
        )
        .await;
    assert!(
        audit["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["dest"] == "169.254.169.254"),
        "{audit}"
    );
}

/// Sessions with network get warm sandboxes too, from a lane of their own that fills once such
/// creates come: each one is bound to its own session's policy when it is handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_with_network_are_served_from_the_pool_under_their_own_policy() {
    let Some(()) = root_or_skip() else { return };
    let net = TestNet::up(0, SERVERS, 8080);
    let ip = net.server_ip();
    let config = config(&net, &format!("{ip}/32")).replace("pool = {}", "pool = { python = 1 }");
    let d = Daemon::start(&config).await;
    let series = |name: &str| format!("{name}{{image=\"host\",language=\"python\"}} 1");
    let egress_ready = series("koder_pool_egress_ready");
    let wait_ready = || async {
        for _ in 0..300 {
            if d.metrics().await.lines().any(|l| l == egress_ready) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("no warm sandbox with egress after 30 s");
    };
    // The first create with network finds none (a miss is demand), then the lane fills.
    let open = json!({"language": "python", "network": {"mode": "open"}});
    let first = d.create(open.clone()).await;
    wait_ready().await;
    let (status, s) = d
        .json(
            Method::POST,
            S,
            json!({"language": "python", "network": {"mode": "allowlist", "allow": ["pkg.test"]}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{s}");
    let listed = s["id"].as_str().unwrap().to_string();
    wait_ready().await;
    let second = d.create(open).await;
    let m = d.metrics().await;
    let takes = |result: &str| {
        format!("koder_pool_egress_takes_total{{image=\"host\",language=\"python\",result=\"{result}\"}}")
    };
    assert!(m.contains(&format!("{} 2", takes("hit"))), "{m}");
    assert!(m.contains(&format!("{} 1", takes("miss"))), "{m}");
    assert!(
        m.contains("koder_sessions_created_total{source=\"pool\"} 2"),
        "{m}"
    );
    // The allowlisted session's pooled sandbox obeys its allowlist; the open ones reach by IP.
    let out = probe(&d, &listed, &format!(
        "{HELPERS}\nprint(http('http://pkg.test:8080/'))\nprint(raw('{ip}', 8080, b'GET / HTTP/1.1\\r\\nHost: other.test\\r\\n\\r\\n'))"
    )).await;
    assert_eq!(out[0], "ok:pkg.test:8080", "{out:?}");
    assert!(
        out[1].starts_with("refused"),
        "allowlist not applied: {out:?}"
    );
    for id in [&first, &second] {
        let out = probe(&d, id, &format!(
            "{HELPERS}\nprint(raw('{ip}', 8080, b'GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')[:15])\nprint(raw('169.254.169.254', 80, b'x'))"
        )).await;
        assert_eq!(out[0], "HTTP/1.0 200 OK", "{out:?}");
        assert!(out[1].starts_with("refused"), "{out:?}");
    }
}

/// The same mediation inside a microVM: the guest has no network device; its agent redirects
/// and reports connections and lookups over vsock, and the daemon decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn microvm_allowlist_is_mediated_through_the_guest_agent() {
    let Some(()) = root_or_skip() else { return };
    let net = TestNet::up(0, SERVERS, 8080);
    let ip = net.server_ip();
    let d = Daemon::start(&format!(
        "{}\n{}",
        config(&net, &format!("{ip}/32")),
        microvm_section()
    ))
    .await;
    let (status, s) = d
        .json(
            Method::POST,
            S,
            json!({"runtime": "microvm", "language": "python", "network": {"mode": "allowlist", "allow": ["pkg.test"]}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{s}");
    let id = s["id"].as_str().unwrap().to_string();
    let out = probe(
        &d,
        &id,
        &format!(
            "{HELPERS}\nimport os\nprint(','.join(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:])))\n\
             print(resolve('pkg.test'))\nprint(http('http://pkg.test:8080/'))\nprint(resolve('other.test'))\n\
             print(raw('{ip}', 8080, b'GET / HTTP/1.1\\r\\nHost: other.test\\r\\n\\r\\n'))"
        ),
    )
    .await;
    assert_eq!(
        out[1], ip,
        "allowlisted name resolves to its pinned address: {out:?}"
    );
    assert_eq!(out[2], "ok:pkg.test:8080", "{out:?}");
    assert!(out[3].starts_with("nxdomain"), "{out:?}");
    assert!(out[4].starts_with("refused"), "{out:?}");
    let (_, audit) = d
        .json(
            Method::GET,
            &format!("/v1/sandbox/audit/network?session_id={id}"),
            Value::Null,
        )
        .await;
    let entries = audit["entries"].as_array().unwrap();
    assert!(
        entries.iter().any(|e| e["proto"] == "tcp"
            && e["allowed"] == true
            && e["name"].as_str().unwrap_or("").contains("pkg.test")),
        "{audit}"
    );
    assert!(
        entries
            .iter()
            .any(|e| e["proto"] == "dns" && e["allowed"] == false && e["dest"] == "other.test"),
        "{audit}"
    );
}
