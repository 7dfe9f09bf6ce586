//! JWT auth through the real daemon: an OpenID issuer served by the test on loopback, keys
//! made here (RSA, EC P-256, Ed25519), every refusal a 401 that never falls back to anything
//! else, scopes gating operations on the native and the E2B API, key rotation and a flood of
//! unknown kids, and prod mode's start-up rules.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use koder_auth::testing::{hs256, now, tampered, unsigned, Issuer, SigningKey};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const S: &str = "/v1/sandbox/sessions";
const ADMIN_KEY: &str = "admin-key-0123456789";

/// BASE_CONFIG with `issuer` as the JWT issuer and tenant `acme` (the tokens' tenant).
fn config(issuer: &Issuer, env: &str) -> String {
    format!(
        "env = \"{env}\"\n{BASE_CONFIG}[auth]\nissuer_url = \"{}\"\njwks_min_refresh_s = 1\n\
         admin_keys = [\"{ADMIN_KEY}\"]\n[tenants.acme]\nplan = \"standard\"\n",
        issuer.url
    )
}

fn token(key: &SigningKey, issuer: &Issuer, scope: &str) -> String {
    key.sign(&issuer.claims("acme", scope))
}

async fn status_of(
    d: &Daemon,
    token: &str,
    method: Method,
    path: &str,
    body: Value,
) -> (StatusCode, String) {
    let (status, v) = d.json_as(token, method, path, body).await;
    (status, error_code(&v).to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_beside_static_keys() {
    let Some(()) = root_or_skip() else { return };
    let keys = [
        SigningKey::rsa("rsa"),
        SigningKey::ec("ec"),
        SigningKey::ed25519("ed"),
    ];
    let issuer = Issuer::start(&keys.iter().collect::<Vec<_>>()).await;
    let d = Daemon::start(&config(&issuer, "dev")).await;

    let full = token(&keys[0], &issuer, "sandbox:write sandbox:exec");
    let (status, s) = d.json_as(&full, Method::POST, S, json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{s}");
    assert_eq!(s["tenant_id"], "acme");
    let id = s["id"].as_str().unwrap().to_string();
    for key in &keys {
        let t = token(key, &issuer, "sandbox:read");
        let (status, list) = d.json_as(&t, Method::GET, S, Value::Null).await;
        assert_eq!(status, StatusCode::OK, "{:?}: {list}", key.alg);
        assert_eq!(list["sessions"][0]["id"], id.as_str());
    }
    // Static keys keep working beside JWTs, each for its own tenant.
    let (status, mine) = d.json_as(KEY1, Method::GET, S, Value::Null).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(mine["sessions"], json!([]));
    let (status, code) = status_of(&d, KEY1, Method::GET, &format!("{S}/{id}"), Value::Null).await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::NOT_FOUND, "SANDBOX-NOT-FOUND")
    );
    // The same token works as an E2B API key.
    let resp = d
        .http
        .get(format!("{}/sandboxes", d.base))
        .header("x-api-key", &full)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    // The start-up fetch, then the cache.
    assert_eq!(issuer.jwks_fetches(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_tokens_are_401_and_never_downgraded() {
    let Some(()) = root_or_skip() else { return };
    let rsa = SigningKey::rsa("rsa");
    let issuer = Issuer::start(&[&rsa]).await;
    let d = Daemon::start(&config(&issuer, "dev")).await;
    let good = issuer.claims("acme", "sandbox:read");
    let with = |field: &str, value: Value| {
        let mut c = good.clone();
        c[field] = value;
        c
    };
    let mut no_tenant = good.clone();
    no_tenant.as_object_mut().unwrap().remove("tenant");
    let pem = rsa.public_pem.clone().unwrap();
    let cases = [
        (
            "another audience",
            rsa.sign(&with("aud", json!("another-service"))),
        ),
        ("expired", rsa.sign(&with("exp", json!(now() - 300)))),
        ("not yet valid", rsa.sign(&with("nbf", json!(now() + 300)))),
        (
            "wrong issuer",
            rsa.sign(&with("iss", json!("https://idp.evil.example"))),
        ),
        ("alg none", unsigned("rsa", &good)),
        (
            "HS256 keyed with the RSA public key",
            hs256("rsa", pem.as_bytes(), &good),
        ),
        (
            "tampered payload",
            tampered(&rsa.sign(&good), &with("tenant", json!("t1"))),
        ),
        ("no tenant claim", rsa.sign(&no_tenant)),
        ("unknown kid", rsa.sign_as("nobody", &good)),
    ];
    for (what, t) in &cases {
        let resp = d.req(Method::GET, S, t).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{what}");
        assert_eq!(resp.headers()["www-authenticate"], "Bearer", "{what}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(error_code(&body), "SANDBOX-AUTH-001", "{what}: {body}");
        // E2B's control plane refuses it the same way, whichever header carries it.
        let e2b = d
            .http
            .get(format!("{}/sandboxes", d.base))
            .header("x-api-key", t)
            .send()
            .await
            .unwrap();
        assert_eq!(e2b.status(), StatusCode::UNAUTHORIZED, "E2B: {what}");
    }
    assert_eq!(
        d.req(Method::GET, S, &rsa.sign(&good))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scopes_gate_operations() {
    let Some(()) = root_or_skip() else { return };
    let ed = SigningKey::ed25519("ed");
    let issuer = Issuer::start(&[&ed]).await;
    let d = Daemon::start(&config(&issuer, "dev")).await;
    let read = token(&ed, &issuer, "sandbox:read");
    let write = token(&ed, &issuer, "sandbox:write");
    let exec = token(&ed, &issuer, "sandbox:exec");
    let none = token(&ed, &issuer, "openid profile");

    let (status, s) = d.json_as(&write, Method::POST, S, json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{s}");
    let id = s["id"].as_str().unwrap().to_string();
    let run = json!({"shell": "echo hi"});
    let exec_path = format!("{S}/{id}/exec");
    let denied = |(status, code): (StatusCode, String)| {
        assert_eq!(
            (status, code.as_str()),
            (StatusCode::FORBIDDEN, "SANDBOX-AUTH-SCOPE")
        );
    };

    // Read-only: lists and reads, nothing else.
    assert_eq!(
        status_of(&d, &read, Method::GET, S, Value::Null).await.0,
        StatusCode::OK
    );
    assert_eq!(
        status_of(&d, &read, Method::GET, &format!("{S}/{id}"), Value::Null)
            .await
            .0,
        StatusCode::OK
    );
    denied(status_of(&d, &read, Method::POST, S, json!({})).await);
    denied(status_of(&d, &read, Method::POST, &exec_path, run.clone()).await);
    denied(status_of(&d, &read, Method::DELETE, &format!("{S}/{id}"), Value::Null).await);
    let upload = d
        .req(Method::PUT, &format!("{S}/{id}/files?path=/tmp/x"), &read)
        .body("data")
        .send()
        .await
        .unwrap();
    assert_eq!(upload.status(), StatusCode::FORBIDDEN);
    let (_, message) = d
        .json_as(&read, Method::POST, &exec_path, run.clone())
        .await;
    assert!(
        message["error"]["message"]
            .as_str()
            .unwrap()
            .contains("sandbox:exec"),
        "{message}"
    );

    // Exec runs code but does not create sessions; write creates but does not run code.
    let (status, out) = d
        .json_as(&exec, Method::POST, &exec_path, run.clone())
        .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["stdout"], "hi\n");
    denied(status_of(&d, &exec, Method::POST, S, json!({})).await);
    denied(status_of(&d, &write, Method::POST, &exec_path, run.clone()).await);
    // No sandbox scope at all: not even reading.
    denied(status_of(&d, &none, Method::GET, S, Value::Null).await);

    // The operator endpoints want sandbox:admin (or an admin key).
    let admin = token(&ed, &issuer, "sandbox:admin");
    let tenants = "/v1/sandbox/admin/tenants";
    assert_eq!(
        status_of(&d, &admin, Method::GET, tenants, Value::Null)
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(
        status_of(&d, ADMIN_KEY, Method::GET, tenants, Value::Null)
            .await
            .0,
        StatusCode::OK
    );
    denied(status_of(&d, &exec, Method::GET, tenants, Value::Null).await);
    let (status, code) = status_of(&d, KEY1, Method::GET, tenants, Value::Null).await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::FORBIDDEN, "SANDBOX-PERMISSION-DENIED")
    );

    // E2B: reading the control plane needs read, creating needs write, envd needs exec.
    let e2b = |t: &str, method: Method, path: &str| {
        d.http
            .request(method, format!("{}{path}", d.base))
            .header("x-api-key", t)
    };
    assert_eq!(
        e2b(&read, Method::GET, "/sandboxes")
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    let create = e2b(&read, Method::POST, "/sandboxes")
        .json(&json!({"templateID": "base"}))
        .send()
        .await
        .unwrap();
    assert_eq!(create.status(), StatusCode::FORBIDDEN);
    let body: Value = create.json().await.unwrap();
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("SANDBOX-AUTH-SCOPE"),
        "{body}"
    );
    let envd = |t: &str| {
        e2b(t, Method::POST, "/filesystem.Filesystem/Stat")
            .header("e2b-sandbox-id", &id)
            .header("content-type", "application/json")
            .body(r#"{"path": "/tmp"}"#)
    };
    assert_eq!(
        envd(&read).send().await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(envd(&exec).send().await.unwrap().status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_refetches_and_a_kid_flood_does_not() {
    let Some(()) = root_or_skip() else { return };
    let old = SigningKey::ec("old");
    let issuer = Issuer::start(&[&old]).await;
    let d = Daemon::start(&config(&issuer, "dev")).await;
    assert_eq!(issuer.jwks_fetches(), 1, "fetched once at start");
    // Past the refresh interval, so the flood may cause one fetch, and no more.
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let forger = SigningKey::ec("forger");
    let claims = issuer.claims("acme", "sandbox:read");
    let flood = (0..100).map(|i| {
        let t = forger.sign_as(&format!("random-kid-{i}"), &claims);
        let req = d.req(Method::GET, S, &t);
        async move { req.send().await.unwrap().status() }
    });
    let started = Instant::now();
    let statuses = futures::future::join_all(flood).await;
    assert!(
        statuses.iter().all(|s| *s == StatusCode::UNAUTHORIZED),
        "{statuses:?}"
    );
    let during = issuer.jwks_fetches() - 1;
    let allowed = 1 + started.elapsed().as_secs() as usize;
    assert!(during <= allowed, "{during} fetches for 100 unknown kids");

    // Rotation: the issuer adds a key; a token naming it makes the daemon fetch the new set.
    let new = SigningKey::rsa("new");
    issuer.publish(&[&old, &new]);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let before = issuer.jwks_fetches();
    let (status, _) = status_of(&d, &new.sign(&claims), Method::GET, S, Value::Null).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(issuer.jwks_fetches(), before + 1);
    let (status, _) = status_of(&d, &old.sign(&claims), Method::GET, S, Value::Null).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        issuer.jwks_fetches(),
        before + 1,
        "known kids need no fetch"
    );
}

/// Runs `serve` with `config` and `flags`, expecting it to refuse to start; its stderr.
fn refused_start(config: &str, flags: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("koder.toml");
    std::fs::write(&path, config).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_koder-sandbox"))
        .arg("serve")
        .arg("--config")
        .arg(&path)
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(flags)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the daemon started with {config:?} {flags:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prod_takes_jwts_only() {
    let Some(()) = root_or_skip() else { return };
    let ed = SigningKey::ed25519("ed");
    let issuer = Issuer::start(&[&ed]).await;

    let no_issuer = refused_start("env = \"prod\"\n", &[]);
    assert!(
        no_issuer.contains("needs JWT auth: set [auth] issuer_url"),
        "{no_issuer}"
    );
    let with_keys = refused_start(&config(&issuer, "prod"), &["--api-key", "t1:key-one-1234"]);
    assert!(with_keys.contains("refuses static API keys"), "{with_keys}");

    let d = Daemon::start_with(&config(&issuer, "prod"), false).await;
    assert!(
        !d.data_dir().join("dev-api-key").exists(),
        "no dev tenant in prod"
    );
    let (status, _) = status_of(
        &d,
        &token(&ed, &issuer, "sandbox:read"),
        Method::GET,
        S,
        Value::Null,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, code) = status_of(&d, "key-one-1234", Method::GET, S, Value::Null).await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::UNAUTHORIZED, "SANDBOX-AUTH-001")
    );
    // Nor can an operator mint static keys.
    let (status, code) = status_of(
        &d,
        ADMIN_KEY,
        Method::POST,
        "/v1/sandbox/admin/tenants/acme/keys",
        Value::Null,
    )
    .await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::CONFLICT, "SANDBOX-CONFLICT")
    );
}
