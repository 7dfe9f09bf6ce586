//! Network rules end to end: deny beats allow, wildcard domains, ports, a running session's
//! policy replaced (`PUT .../network`, native and E2B) and the refusals of entries a sandbox
//! can never or must never reach. Upstreams live in a network namespace this test creates.

mod common;
#[path = "support/testnet.rs"]
mod testnet;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use testnet::TestNet;

const S: &str = "/v1/sandbox/sessions";

/// HTTP servers on 8080 and 8081 answering `ok:<port>:<Host>`.
const SERVERS: &str = r#"
import http.server, threading
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("ok:%d:%s" % (self.server.server_port, self.headers.get("host") or "")).encode()
        self.send_response(200); self.send_header("content-length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
s2 = http.server.ThreadingHTTPServer(("0.0.0.0", 8081), H)
threading.Thread(target=s2.serve_forever, daemon=True).start()
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), H).serve_forever()
"#;

const NAMES: [&str; 4] = ["pkg.test", "other.test", "a.wild.test", "b.wild.test"];

fn config(net: &TestNet) -> String {
    let ip = net.server_ip();
    let hosts: Vec<String> = NAMES
        .iter()
        .map(|n| format!("\"{n}\" = [\"{ip}\"]"))
        .collect();
    format!(
        "{BASE_CONFIG}[network]\ninternal = [\"{ip}/32\"]\nsystem_resolver = false\nhosts = {{ {} }}\n",
        hosts.join(", ")
    )
}

const HELPERS: &str = r#"
import urllib.request
def http(url):
    try: return urllib.request.urlopen(url, timeout=5).read().decode()
    except Exception as e: return "refused:" + type(e).__name__
for u in URLS:
    print(http(u))
"#;

/// Fetches every URL from inside the session; one line per URL.
async fn fetch(d: &Daemon, id: &str, urls: &[String]) -> Vec<String> {
    let code = format!("URLS = {}\n{HELPERS}", serde_json::to_string(urls).unwrap());
    let r = d
        .exec(
            id,
            json!({"code": code, "language": "python", "timeout_ms": 60000}),
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

fn urls(list: &[&str]) -> Vec<String> {
    list.iter().map(|u| format!("http://{u}/")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_beats_allow_with_wildcards_and_ports() {
    let Some(()) = root_or_skip() else { return };
    let net = TestNet::up(0, SERVERS, 8080);
    let ip = net.server_ip();
    let d = Daemon::start(&config(&net)).await;

    let (status, s) = d
        .json(
            Method::POST,
            S,
            json!({"language": "python", "network": {"mode": "allowlist",
                "allow": ["pkg.test", "*.wild.test", format!("{ip}")],
                "deny": ["b.wild.test", "pkg.test:8081"]}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{s}");
    assert_eq!(
        s["network"]["deny"],
        json!(["b.wild.test", "pkg.test:8081"])
    );
    let id = s["id"].as_str().unwrap().to_string();
    let out = fetch(
        &d,
        &id,
        &urls(&[
            "pkg.test:8080",
            "pkg.test:8081",
            "a.wild.test:8080",
            "b.wild.test:8080",
            "other.test:8080",
        ]),
    )
    .await;
    assert_eq!(out[0], "ok:8080:pkg.test:8080", "{out:?}");
    assert!(
        out[1].starts_with("refused"),
        "denied port reached: {out:?}"
    );
    assert_eq!(
        out[2], "ok:8080:a.wild.test:8080",
        "wildcard allow: {out:?}"
    );
    assert!(
        out[3].starts_with("refused"),
        "denied name reached: {out:?}"
    );
    assert!(
        out[4].starts_with("refused"),
        "unlisted name reached: {out:?}"
    );

    // Open mode with deny rules: everything the guard lets through but what is denied.
    let (status, s) = d
        .json(
            Method::POST,
            S,
            json!({"language": "python", "network": {"mode": "open", "deny": ["*.wild.test", format!("{ip}:8081")]}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{s}");
    let open = s["id"].as_str().unwrap().to_string();
    let out = fetch(
        &d,
        &open,
        &urls(&["other.test:8080", "a.wild.test:8080", "other.test:8081"]),
    )
    .await;
    assert_eq!(out[0], "ok:8080:other.test:8080", "{out:?}");
    assert!(out[1].starts_with("refused"), "{out:?}");
    assert!(
        out[2].starts_with("refused"),
        "denied port by address: {out:?}"
    );

    let (_, audit) = d
        .json(
            Method::GET,
            &format!("/v1/sandbox/audit/network?session_id={id}&allowed=false"),
            Value::Null,
        )
        .await;
    assert!(
        audit["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["reason"]
                .as_str()
                .unwrap_or("")
                .contains("denied by pkg.test:8081")),
        "{audit}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_sessions_policy_is_replaced_and_audited() {
    let Some(()) = root_or_skip() else { return };
    let net = TestNet::up(1, SERVERS, 8080);
    let d = Daemon::start(&config(&net)).await;
    let (status, s) = d
        .json(
            Method::POST,
            S,
            json!({"language": "python", "network": {"mode": "allowlist", "allow": ["pkg.test:8080"]}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{s}");
    let id = s["id"].as_str().unwrap().to_string();
    let both = urls(&["pkg.test:8080", "other.test:8080"]);
    let out = fetch(&d, &id, &both).await;
    assert_eq!(out[0], "ok:8080:pkg.test:8080", "{out:?}");
    assert!(out[1].starts_with("refused"), "{out:?}");

    let path = format!("{S}/{id}/network");
    let (status, s) = d
        .json(
            Method::PUT,
            &path,
            json!({"mode": "allowlist", "allow": ["other.test:8080"]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{s}");
    assert_eq!(
        s["network"]["allow"][0],
        format!("other.test:8080={}", net.server_ip())
    );
    let out = fetch(&d, &id, &both).await;
    assert!(
        out[0].starts_with("refused"),
        "allowed before, refused after: {out:?}"
    );
    assert_eq!(
        out[1], "ok:8080:other.test:8080",
        "refused before, allowed after: {out:?}"
    );
    let (_, got) = d.json(Method::GET, &format!("{S}/{id}"), Value::Null).await;
    assert_eq!(
        got["network"], s["network"],
        "the new policy is the session's"
    );

    // A refused update leaves the policy as it was.
    let (status, e) = d
        .json(
            Method::PUT,
            &path,
            json!({"mode": "allowlist", "allow": ["127.0.0.1:8080"]}),
        )
        .await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::BAD_REQUEST, "SANDBOX-NETWORK-RULE"),
        "{e}"
    );
    assert_eq!(fetch(&d, &id, &both).await[1], "ok:8080:other.test:8080");

    // E2B's shape: allowOut + denyOut all traffic is an allowlist.
    let r = d
        .http
        .put(format!("{}/sandboxes/{id}/network", d.base))
        .header("X-API-KEY", KEY1)
        .json(&json!({"allowOut": ["pkg.test"], "denyOut": ["0.0.0.0/0"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::NO_CONTENT,
        "{}",
        r.text().await.unwrap()
    );
    let out = fetch(&d, &id, &both).await;
    assert_eq!(out[0], "ok:8080:pkg.test:8080", "{out:?}");
    assert!(out[1].starts_with("refused"), "{out:?}");
    // Another tenant's session is not found.
    let (status, _) = d
        .json_as(KEY2, Method::PUT, &path, json!({"mode": "open"}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (_, audit) = d
        .json(
            Method::GET,
            &format!("/v1/sandbox/audit/network?session_id={id}"),
            Value::Null,
        )
        .await;
    let changes: Vec<&Value> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["proto"] == "policy")
        .collect();
    assert_eq!(changes.len(), 2, "{audit}");
    assert!(
        changes.iter().any(|e| e["reason"]
            .as_str()
            .unwrap()
            .contains("allow [other.test:8080=")),
        "{audit}"
    );

    // A session without network has no egress path to open.
    let none = d.create(json!({"language": "python"})).await;
    let (status, e) = d
        .json(
            Method::PUT,
            &format!("{S}/{none}/network"),
            json!({"mode": "open"}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_and_guarded_entries_are_refused_with_reasons() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(&format!(
        "{BASE_CONFIG}[network]\ninternal = [\"127.0.0.0/8\"]\nsystem_resolver = false\nhosts = {{ \"loop.test\" = [\"127.0.0.1\"] }}\n"
    ))
    .await;
    for entry in ["127.0.0.1", "[::1]:443", "loop.test", "127.0.0.0/8"] {
        let (status, e) = d
            .json(
                Method::POST,
                S,
                json!({"network": {"mode": "allowlist", "allow": [entry]}}),
            )
            .await;
        assert_eq!(
            (status, error_code(&e)),
            (StatusCode::BAD_REQUEST, "SANDBOX-NETWORK-RULE"),
            "{entry}: {e}"
        );
        assert!(
            e["error"]["message"]
                .as_str()
                .unwrap()
                .contains("own loopback"),
            "{entry}: {e}"
        );
    }
    let (status, e) = d
        .json(
            Method::POST,
            S,
            json!({"network": {"mode": "allowlist", "allow": ["10.77.0.0/16"]}}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("`internal`") && msg.contains("[network]"),
        "{msg}"
    );
    let (status, e) = d
        .json(
            Method::POST,
            S,
            json!({"network": {"mode": "open", "deny": ["not a host"]}}),
        )
        .await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::BAD_REQUEST, "SANDBOX-NETWORK-RULE"),
        "{e}"
    );
    let (status, e) = d
        .json(
            Method::POST,
            S,
            json!({"network": {"mode": "none", "deny": ["10.0.0.1"]}}),
        )
        .await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::BAD_REQUEST, "SANDBOX-INVALID-ARGUMENT"),
        "{e}"
    );
}

/// The servers of `SERVERS` on `::` (dual-stack): they answer on the namespace's v4 and v6.
const SERVERS6: &str = r#"
import http.server, socket, threading
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("ok:%d:%s" % (self.server.server_port, self.headers.get("host") or "")).encode()
        self.send_response(200); self.send_header("content-length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
class S(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6
s2 = S(("::", 8081), H)
threading.Thread(target=s2.serve_forever, daemon=True).start()
S(("::", 8080), H).serve_forever()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_destinations_go_through_the_same_policy_and_audit() {
    let Some(()) = root_or_skip() else { return };
    let net = TestNet::up(2, SERVERS6, 8080);
    let ip6 = net.server_ip6();
    let d = Daemon::start(&format!(
        "{BASE_CONFIG}[network]\ninternal = [\"{ip6}/128\"]\nsystem_resolver = false\nhosts = {{ \"v6.test\" = [\"{ip6}\"] }}\n"
    ))
    .await;

    let (status, s) = d
        .json(
            Method::POST,
            S,
            json!({"language": "python", "network": {"mode": "allowlist",
                "allow": ["v6.test", format!("{ip6}/128")],
                "deny": [format!("[{ip6}]:8081")]}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{s}");
    let id = s["id"].as_str().unwrap().to_string();
    let lit = format!("[{ip6}]");
    let out = fetch(
        &d,
        &id,
        &urls(&[
            "v6.test:8080",
            &format!("{lit}:8080"),
            &format!("{lit}:8081"),
        ]),
    )
    .await;
    // The name resolves to its AAAA only, so this is an IPv6 connection through the proxy.
    assert_eq!(out[0], "ok:8080:v6.test:8080", "AAAA name: {out:?}");
    assert_eq!(out[1], format!("ok:8080:{lit}:8080"), "v6 CIDR: {out:?}");
    assert!(out[2].starts_with("refused"), "v6 deny beat allow: {out:?}");

    // Live update: the v6 CIDR leaves the allowlist, the next connection is refused.
    let (status, body) = d
        .json(
            Method::PUT,
            &format!("{S}/{id}/network"),
            json!({"mode": "allowlist", "allow": ["v6.test"]}),
        )
        .await;
    assert!(status.is_success(), "{status} {body}");
    let out = fetch(&d, &id, &urls(&["v6.test:8080", &format!("{lit}:8080")])).await;
    assert_eq!(out[0], "ok:8080:v6.test:8080", "{out:?}");
    assert!(
        out[1].starts_with("refused"),
        "updated policy not applied: {out:?}"
    );

    let (_, audit) = d
        .json(
            Method::GET,
            &format!("/v1/sandbox/audit/network?session_id={id}"),
            Value::Null,
        )
        .await;
    let entries = audit["entries"].as_array().unwrap();
    let dest = ip6.parse::<std::net::Ipv6Addr>().unwrap().to_string(); // as the audit writes it
    let has = |port: u16, allowed: bool| {
        entries.iter().any(|e| {
            e["proto"] == "tcp" && e["dest"] == dest && e["port"] == port && e["allowed"] == allowed
        })
    };
    assert!(has(8080, true), "{audit}");
    assert!(has(8081, false), "{audit}");
    assert!(
        entries
            .iter()
            .any(|e| e["proto"] == "dns" && e["dest"] == "v6.test" && e["allowed"] == true),
        "{audit}"
    );
}
