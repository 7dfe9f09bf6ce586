//! The daemon on a PostgreSQL store (`[store] url`): sessions are created, run and deleted,
//! and what it keeps (a session paused to disk, keys, tenants) is there after a restart — in
//! the database, not in a SQLite file of the data dir. Needs `KODER_TEST_PG_URL` (a server
//! `scripts/setup-postgres.sh` starts); skipped without it unless `KODER_TEST_REQUIRE_PG`.

mod common;
#[path = "support/pg.rs"]
mod pg;

use common::*;
use pg::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_live_in_postgres_across_a_restart() {
    let Some(()) = root_or_skip() else { return };
    let Some(server) = pg_server_or_skip() else {
        return;
    };
    let db = TestDatabase::create(&server, "daemon");
    let mut d = Daemon::start(&format!("{BASE_CONFIG}[store]\nurl = \"{}\"\n", db.url)).await;

    let a = d.create(json!({})).await;
    let v = d.exec(&a, json!({"shell": "echo hello"})).await;
    assert_eq!(v["stdout"], "hello\n", "{v}");
    let b = d.create(json!({})).await;
    let v = d
        .exec(&b, json!({"shell": "echo kept > /home/user/kept"}))
        .await;
    assert_eq!(v["exit_code"], 0, "{v}");
    d.pause_to_disk(&b).await;
    let status = d
        .req(Method::DELETE, &format!("/v1/sandbox/sessions/{a}"), KEY1)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, StatusCode::NO_CONTENT);

    // The rows are in Postgres, and the daemon made no SQLite file.
    assert_eq!(
        db.query(&format!(
            "SELECT state FROM sessions WHERE id IN ('{a}', '{b}') ORDER BY id = '{a}' DESC"
        )),
        "stopped\npaused"
    );
    assert!(!d.data_dir().join("state.db").exists());

    d.stop();
    d.launch().await;
    let (status, list) = d
        .json(Method::GET, "/v1/sandbox/sessions", Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let live: Vec<(&str, &str)> = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["id"].as_str().unwrap(), s["state"].as_str().unwrap()))
        .collect();
    assert_eq!(live, [(b.as_str(), "paused")], "{list}");
    let (status, v) = d
        .json(
            Method::POST,
            &format!("/v1/sandbox/sessions/{b}/resume"),
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let v = d.exec(&b, json!({"shell": "cat /home/user/kept"})).await;
    assert_eq!(v["stdout"], "kept\n", "{v}");
    let status = d
        .req(Method::DELETE, &format!("/v1/sandbox/sessions/{b}"), KEY1)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, StatusCode::NO_CONTENT);
    d.stop();
}

const ADMIN: &str = "admin-key-0123456789abcdef";
const NODES: &str = "SELECT id || ' ' || state FROM nodes ORDER BY id";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_register_heartbeat_and_mark_a_killed_one_lost() {
    let Some(()) = root_or_skip() else { return };
    let Some(server) = pg_server_or_skip() else {
        return;
    };
    let db = TestDatabase::create(&server, "nodes");
    let config = |id: &str| {
        format!(
            "{BASE_CONFIG}[store]\nurl = \"{}\"\n[node]\nid = \"{id}\"\nheartbeat_s = 0.2\nlost_after_s = 1.0\n\
             [auth]\nadmin_keys = [\"{ADMIN}\"]\n",
            db.url
        )
    };
    let mut a = Daemon::start(&config("node-a")).await;
    let mut b = Daemon::start(&config("node-b")).await;
    eventually(&db, NODES, "node-a up\nnode-b up", 10).await;
    // Each advertises the address it serves on, with its runtimes and capacity.
    assert_eq!(
        db.query("SELECT address FROM nodes WHERE id = 'node-b'"),
        b.base
    );
    // The microVM runtime only where this host can run it.
    let runtimes = db.query("SELECT runtimes_json FROM nodes WHERE id = 'node-a'");
    assert!(
        [r#"["jail"]"#, r#"["jail","microvm"]"#].contains(&runtimes.as_str()),
        "{runtimes}"
    );
    assert!(db
        .query("SELECT capacity_sandboxes FROM nodes WHERE id = 'node-a'")
        .parse::<u64>()
        .is_ok_and(|n| n > 0));
    // Operators see them through any node; tenants do not.
    let resp = b
        .req(Method::GET, "/v1/sandbox/admin/nodes", ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let v: Value = resp.json().await.unwrap();
    let nodes: Vec<(&str, &str, &str)> = v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["id"].as_str().unwrap(),
                n["state"].as_str().unwrap(),
                n["address"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        nodes,
        [
            ("node-a", "up", a.base.as_str()),
            ("node-b", "up", b.base.as_str())
        ],
        "{v}"
    );
    let status = b
        .req(Method::GET, "/v1/sandbox/admin/nodes", KEY1)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, StatusCode::FORBIDDEN);
    let spec: Value = b
        .http
        .get(format!("{}/openapi.json", b.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(spec["paths"]["/v1/sandbox/admin/nodes"]["get"].is_object());
    assert!(spec["components"]["schemas"]["NodeList"].is_object());
    // Heartbeats go on.
    let beat = |id: &str| -> i64 {
        db.query(&format!(
            "SELECT heartbeat_at_ms FROM nodes WHERE id = '{id}'"
        ))
        .parse()
        .unwrap()
    };
    let first = beat("node-a");
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    assert!(beat("node-a") > first);
    // A session counts as load at the next heartbeat.
    let s = a.create(json!({})).await;
    eventually(
        &db,
        "SELECT load_sandboxes FROM nodes WHERE id = 'node-a'",
        "1",
        10,
    )
    .await;
    let status = a
        .req(Method::DELETE, &format!("/v1/sandbox/sessions/{s}"), KEY1)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, StatusCode::NO_CONTENT);

    // Each session is recorded on the node holding its sandbox.
    let on_a = a.create(json!({})).await;
    let on_b = b.create(json!({})).await;
    let node_of = |id: &str| db.query(&format!("SELECT node_id FROM sessions WHERE id = '{id}'"));
    assert_eq!(node_of(&on_a), "node-a");
    assert_eq!(node_of(&on_b), "node-b");
    let session_state = |id: &str| {
        db.query(&format!(
            "SELECT state, end_reason FROM sessions WHERE id = '{id}'"
        ))
    };

    // Killed: the survivor marks it lost once its heartbeat is 1 s old, and ends the
    // sessions whose sandboxes went with it.
    b.crash();
    eventually(&db, NODES, "node-a up\nnode-b lost", 10).await;
    assert_ne!(
        db.query("SELECT down_at_ms IS NOT NULL FROM nodes WHERE id = 'node-b'"),
        "f"
    );
    eventually(
        &db,
        &format!("SELECT state, end_reason FROM sessions WHERE id = '{on_b}'"),
        "stopped|its node node-b was lost",
        10,
    )
    .await;
    // Back after a restart; its start-up reconciles its own sessions only: node-a's runs on.
    b.launch().await;
    eventually(&db, NODES, "node-a up\nnode-b up", 10).await;
    assert_eq!(session_state(&on_a), "running|");
    let out = a
        .exec(&on_a, json!({"cmd": ["/bin/echo", "still here"]}))
        .await;
    assert_eq!(out["stdout"], "still here\n", "{out}");
    let status = a
        .req(
            Method::DELETE,
            &format!("/v1/sandbox/sessions/{on_a}"),
            KEY1,
        )
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, StatusCode::NO_CONTENT);
    a.stop();
    eventually(&db, NODES, "node-a left\nnode-b up", 10).await;
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(db.query(NODES), "node-a left\nnode-b up");
    b.stop();
}
