//! Three daemons as one service: each in a network namespace of its own (veth pairs to a
//! bridge the test makes), sharing the test's PostgreSQL (through a relay on the bridge: the
//! server trusts loopback only) and an S3 server (s3s-fs on the bridge's address), and a
//! cluster secret. Creates spread across the nodes; every surface is used through a node that
//! does not hold the session; quotas hold across nodes; a node killed with SIGKILL is marked
//! lost and its sessions end with the reason; a session it had paused to disk resumes on
//! another node, and the killed node, back, does not take it back.
//!
//! Needs root, `KODER_TEST_PG_URL` (`scripts/setup-postgres.sh`) and s3s-fs
//! (`scripts/setup-s3.sh`); skipped without them unless `KODER_TEST_REQUIRE_PG` is set.

#[path = "support/clusternet.rs"]
mod clusternet;
mod common;
mod grpc_common;
#[path = "support/pg.rs"]
mod pg;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use clusternet::ClusterNet;
use common::*;
use futures::{SinkExt as _, StreamExt as _};
use grpc_common::{authed, ok, refused, Client};
use koder_grpc::proto as pb;
use koder_image::oci::testing::{layer, oci_archive, E};
use pg::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

const S: &str = "/v1/sandbox/sessions";
const S3S_FS: &str = "/var/cache/koder-sandbox-test/s3s/bin/s3s-fs";
const BUCKET: &str = "koder-cluster";
const KEY_ID: &str = "koder-test-key";
const SECRET: &str = "koder-test-secret";
const NODES: &str = "SELECT id || ' ' || state FROM nodes ORDER BY id";
/// Every node's gRPC port (each in a namespace of its own).
const GRPC_PORT: u16 = 50051;
const ADMIN_KEY: &str = "cluster-admin-key-0123456789";
/// The E2B sandbox domain: `<port>-<id>.sbx.test` names a sandbox's port on every node.
const E2B_DOMAIN: &str = "sbx.test";

/// s3s-fs on the bridge's address, its bucket a directory of its root.
struct S3 {
    _child: tokio::process::Child,
    port: u16,
    _root: tempfile::TempDir,
}

impl S3 {
    async fn start(bin: &Path, host: &str) -> S3 {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join(BUCKET)).unwrap();
        let port = std::net::TcpListener::bind((host, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = tokio::process::Command::new(bin)
            .args(["--host", host, "--port", &port.to_string()])
            .args(["--access-key", KEY_ID, "--secret-key", SECRET])
            .arg(root.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        for _ in 0..100 {
            if tokio::net::TcpStream::connect((host, port)).await.is_ok() {
                return S3 {
                    _child: child,
                    port,
                    _root: root,
                };
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("s3s-fs did not listen on {host}:{port}");
    }
}

/// Relays connections to `listen`'s free port on to `to`; the port. Ends with the runtime.
async fn relay(listen: &str, to: String) -> u16 {
    let listener = tokio::net::TcpListener::bind((listen, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let to = to.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(&to).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    port
}

/// `url`'s `host:port`, and `url` with them replaced by `addr`.
fn authority_and_via(url: &str, addr: &str) -> (String, String) {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (authority, path) = rest.split_once('/').expect("a database path");
    let (user, host) = match authority.rsplit_once('@') {
        Some((user, host)) => (format!("{user}@"), host),
        None => (String::new(), authority),
    };
    (host.to_string(), format!("{scheme}://{user}{addr}/{path}"))
}

fn s3s_fs_or_skip() -> Option<PathBuf> {
    let bin = std::env::var_os("S3S_FS_BIN").map_or_else(|| PathBuf::from(S3S_FS), PathBuf::from);
    if bin.exists() {
        return Some(bin);
    }
    assert!(
        std::env::var_os("KODER_TEST_REQUIRE_PG").is_none(),
        "no s3s-fs at {} (scripts/setup-s3.sh)",
        bin.display()
    );
    eprintln!(
        "skipped: no s3s-fs at {} (scripts/setup-s3.sh)",
        bin.display()
    );
    None
}

/// node-2 keeps a warm `node` sandbox (creates name no language, so `bash`, in the scenes
/// before the last).
fn node_config(k: usize, store: &str, s3: &str, secret: &Path, ip: &str) -> String {
    let sessions = match k {
        2 => "[sessions]\nreap_interval = 0.2\npool = { node = 1 }\n",
        _ => BASE_CONFIG,
    };
    format!(
        "{sessions}[server]\ngrpc_addr = \"{ip}:{GRPC_PORT}\"\n\
         [e2b]\ndomain = \"{E2B_DOMAIN}\"\n\
         [auth]\nadmin_keys = [\"{ADMIN_KEY}\"]\n\
         [store]\nurl = \"{store}\"\n\
         [node]\nid = \"node-{k}\"\nheartbeat_s = 0.2\nlost_after_s = 1.5\n\
         [cluster]\nsecret_file = \"{}\"\n\
         [blobs]\nurl = \"s3://{BUCKET}/cluster\"\nendpoint = \"{s3}\"\n\
         access_key_id = \"{KEY_ID}\"\nsecret_access_key = \"{SECRET}\"\nallow_http = true\n\
         [tenants.t2]\nmax_sessions = 2\n\
         [jail]\nmax_sandboxes = 3\nuid_base = {}\n",
        secret.display(),
        // Host id ranges of their own: the three jails share this host's uids.
        3_000_000_000u32 + u32::try_from(k).unwrap() * 4 * 65_536,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_serve_as_one() {
    let Some(()) = root_or_skip() else { return };
    let Some(server) = pg_server_or_skip() else {
        return;
    };
    let Some(s3s_fs) = s3s_fs_or_skip() else {
        return;
    };
    let db = TestDatabase::create(&server, "cluster");
    let net = ClusterNet::up(3);
    let host = net.host_ip();
    let s3 = S3::start(&s3s_fs, &host).await;
    let (pg_at, _) = authority_and_via(&db.url, "");
    let relay_port = relay(&host, pg_at).await;
    let (_, store_url) = authority_and_via(&db.url, &format!("{host}:{relay_port}"));
    let secrets = tempfile::tempdir().unwrap();
    let secret = secrets.path().join("cluster.secret");
    std::fs::write(
        &secret,
        "3f1c0ad6e8b34c5f9a7d2e6b1c8f4a0d5e9b3c7a1f6d2e8b4c0a9f5d3e7b1c6a\n",
    )
    .unwrap();
    let s3_url = format!("http://{host}:{}", s3.port);
    let mut nodes = Vec::new();
    for k in 0..3 {
        let config = node_config(k, &store_url, &s3_url, &secret, &net.node_ip(k));
        nodes.push(Daemon::start_in(&config, net.netns(k), &net.node_ip(k)).await);
    }
    eventually(&db, NODES, "node-0 up\nnode-1 up\nnode-2 up", 20).await;

    // Creates all sent to node-0 fill it (3 sandboxes), then go where there is most room.
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(nodes[0].create(json!({})).await);
    }
    let placed: Vec<String> = ids.iter().map(|id| node_of(&db, id)).collect();
    assert_eq!(
        placed,
        ["node-0", "node-0", "node-0", "node-1", "node-2"],
        "{ids:?}"
    );
    let (on1, on2) = (ids[3].clone(), ids[4].clone());

    every_surface_through_other_nodes(&nodes, &on1).await;
    let grpc: Vec<Client> = futures::future::join_all(
        (0..3).map(|k| Client::connect(format!("http://{}:{GRPC_PORT}", net.node_ip(k)))),
    )
    .await
    .into_iter()
    .map(|c| c.expect("gRPC connect"))
    .collect();
    grpc_through_other_nodes(&grpc, &on1).await;
    forged_node_proofs_are_refused(&nodes[0], &on1).await;

    // Tenant t2 may hold 2 sessions: one on node-1, one on node-2, then no third anywhere.
    let t2a = create_as(&nodes[1], KEY2).await.expect("t2's first");
    let t2b = create_as(&nodes[2], KEY2).await.expect("t2's second");
    assert_eq!(
        (node_of(&db, &t2a), node_of(&db, &t2b)),
        ("node-1".into(), "node-2".into())
    );
    for d in &nodes {
        let refused = create_as(d, KEY2).await.unwrap_err();
        assert_eq!(
            (refused.0, error_code(&refused.1)),
            (StatusCode::TOO_MANY_REQUESTS, "SANDBOX-QUOTA-SESSIONS"),
            "{}",
            refused.1
        );
    }

    // A key issued at run time through one node works on the others at once.
    let (status, issued) = nodes[0]
        .json_as(
            ADMIN_KEY,
            Method::POST,
            "/v1/sandbox/admin/tenants/t1/keys",
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{issued}");
    let issued = issued["api_key"].as_str().unwrap();
    for d in &nodes[1..] {
        let listed = listed(d, issued).await;
        assert!(listed.iter().any(|(id, _)| *id == on1), "{listed:?}");
    }

    // Its envd token, as node-2 gives it out.
    let resp = e2b(&nodes[0], Method::GET, &format!("/sandboxes/{on2}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let envd_token = resp.json::<Value>().await.unwrap()["envdAccessToken"]
        .as_str()
        .unwrap()
        .to_string();

    // A session on node-2 paused to disk (through node-1): its layer goes to S3.
    let v = nodes[0]
        .exec(&on2, json!({"shell": "echo kept > /home/user/kept"}))
        .await;
    assert_eq!(v["exit_code"], 0, "{v}");
    nodes[1].pause_to_disk(&on2).await;

    // node-2 is killed: the others mark it lost and end what it held, with the reason; its
    // durable pause stays, and t2's quota has room again.
    nodes[2].crash();
    eventually(&db, NODES, "node-0 up\nnode-1 up\nnode-2 lost", 20).await;
    eventually(
        &db,
        &format!("SELECT state || '|' || end_reason FROM sessions WHERE id = '{t2b}'"),
        "stopped|its node node-2 was lost",
        20,
    )
    .await;
    let (status, v) = nodes[0]
        .json_as(KEY2, Method::GET, &format!("{S}/{t2b}"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        (&v["state"], &v["end_reason"]),
        (&json!("lost"), &json!("its node node-2 was lost")),
        "{v}"
    );
    // Listed until deleted; the delete acknowledges it.
    assert!(listed(&nodes[1], KEY2)
        .await
        .contains(&(t2b.clone(), "lost".into())));
    delete_session(&nodes[1], &t2b, KEY2).await;
    assert!(!listed(&nodes[1], KEY2)
        .await
        .iter()
        .any(|(id, _)| *id == t2b));
    let (status, v) = nodes[0]
        .json(Method::GET, &format!("{S}/{on2}"), Value::Null)
        .await;
    assert_eq!(
        (status, &v["state"]),
        (StatusCode::OK, &json!("paused")),
        "{v}"
    );

    // Resumed through node-1, it boots there from its layer in S3 and is node-1's now.
    let (status, v) = nodes[1]
        .json(Method::POST, &format!("{S}/{on2}/resume"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(node_of(&db, &on2), "node-1");
    let v = nodes[0]
        .exec(&on2, json!({"cmd": ["/bin/cat", "/home/user/kept"]}))
        .await;
    assert_eq!(v["stdout"], "kept\n", "{v}");
    // The envd token node-2 gave out still opens envd on its new node (every node derives
    // the token key from the cluster secret).
    let resp = nodes[0]
        .http
        .get(format!("{}/health", nodes[0].base))
        .header("host", format!("49983-{on2}.{E2B_DOMAIN}"))
        .header("x-access-token", &envd_token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);

    // node-2 comes back: its start-up reconciles its own sessions only; the one resumed
    // elsewhere runs on, served through node-2 as well.
    nodes[2].launch().await;
    eventually(&db, NODES, "node-0 up\nnode-1 up\nnode-2 up", 20).await;
    assert_eq!(
        db.query(&format!(
            "SELECT node_id || ' ' || state FROM sessions WHERE id = '{on2}'"
        )),
        "node-1 running"
    );
    let v = nodes[2]
        .exec(&on2, json!({"cmd": ["/bin/cat", "/home/user/kept"]}))
        .await;
    assert_eq!(v["stdout"], "kept\n", "{v}");

    // A delete through another node ends the session on its owner.
    delete_session(&nodes[2], &on1, KEY1).await;
    assert_eq!(
        db.query(&format!("SELECT state FROM sessions WHERE id = '{on1}'")),
        "stopped"
    );

    // node-1 has room, but node-2 has a warm `node` sandbox (reported with its heartbeat): a
    // `node` create sent to node-1 goes there and is served from the pool; a `bash` one, warm
    // nowhere, stays.
    eventually(
        &db,
        "SELECT CASE WHEN warm_json LIKE '%\"jail/node/%' THEN 'warm' ELSE 'cold' END \
         FROM nodes WHERE id = 'node-2'",
        "warm",
        60,
    )
    .await;
    // (A gRPC create, placed as REST's are.)
    let warm = ok(grpc[1]
        .clone()
        .create_session(authed(
            KEY1,
            pb::CreateSessionRequest {
                language: Some("node".into()),
                ..Default::default()
            },
        ))
        .await)
    .id;
    assert_eq!(node_of(&db, &warm), "node-2");
    assert!(
        nodes[2]
            .metrics()
            .await
            .contains("koder_sessions_created_total{source=\"pool\"} 1"),
        "not from node-2's pool"
    );
    let cold = nodes[1].create(json!({"language": "bash"})).await;
    assert_eq!(node_of(&db, &cold), "node-1");

    // node-1 is full now (t2a, on2, cold). A session paused to disk on node-0, which filled
    // up meanwhile, resumes where there is room (node-2) instead of failing on its own node.
    let first = ids[0].clone();
    nodes[0].pause_to_disk(&first).await;
    let filler = nodes[0].create(json!({})).await;
    assert_eq!(node_of(&db, &filler), "node-0");
    let (status, v) = nodes[0]
        .json(Method::POST, &format!("{S}/{first}/resume"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(node_of(&db, &first), "node-2");
    let v = nodes[1].exec(&first, json!({"cmd": ["/bin/true"]})).await;
    assert_eq!(v["exit_code"], 0, "{v}");

    // Room on node-1 again (node-0 stays full): the image scenes' sessions land there.
    delete_session(&nodes[1], &cold, KEY1).await;
    images_are_shared_between_nodes(&nodes, &db).await;
    volumes_are_served_where_their_data_is(&nodes, &db).await;
    for d in &mut nodes {
        d.stop();
    }
}

/// An image imported through node-0 runs sessions on node-1, which fetches it from the
/// bucket; imported again (new content) through node-2, node-1 follows the name; deleted
/// through node-0, which never held the new build, it is gone on node-1 too.
async fn images_are_shared_between_nodes(nodes: &[Daemon], db: &TestDatabase) {
    let archive = |content: &[u8]| {
        oci_archive(
            &[layer(&[
                E::Dir("opt"),
                E::File("opt/hello.txt", content, 0o644),
            ])],
            false,
        )
    };
    for (via, content) in [(0, "one\n"), (2, "two\n")] {
        let resp = nodes[via]
            .req(
                Method::POST,
                "/v1/sandbox/images/import?name=shared-app",
                ADMIN_KEY,
            )
            .header("content-type", "application/x-tar")
            .body(archive(content.as_bytes()))
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let imported: Value = resp.json().await.unwrap();
        assert_eq!(status, StatusCode::CREATED, "{imported}");
        // Inspected and listed through a node that does not hold this build.
        let other = &nodes[if via == 0 { 2 } else { 0 }];
        assert_eq!(
            shared_app(other).await["digest"],
            imported["digest"],
            "{imported}"
        );
        let id = nodes[1].create(json!({"image": "shared-app"})).await;
        assert_eq!(node_of(db, &id), "node-1");
        assert_eq!(hello_of(&nodes[1], &id).await, content);
        delete_session(&nodes[1], &id, KEY1).await;
    }
    assert_eq!(
        db.query("SELECT count(*) FROM shared_images"),
        "2",
        "both builds archived once"
    );
    builds_run_on_the_builder(nodes, db).await;

    let (status, v) = nodes[0]
        .json_as(
            ADMIN_KEY,
            Method::DELETE,
            "/v1/sandbox/images/shared-app",
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, v) = nodes[1]
        .json(Method::POST, S, json!({"image": "shared-app"}))
        .await;
    assert_eq!(
        (status, error_code(&v)),
        (StatusCode::NOT_FOUND, "SANDBOX-IMAGE-NOT-FOUND"),
        "{v}"
    );
    assert_eq!(
        db.query("SELECT count(*) FROM shared_image_names WHERE digest IS NOT NULL"),
        "0"
    );
    assert_eq!(shared_app(&nodes[2]).await, Value::Null);
}

/// The image `shared-app` as `d` shows it (`null` when it has none), checked to be listed
/// alike.
async fn shared_app(d: &Daemon) -> Value {
    let (status, image) = d
        .json_as(
            ADMIN_KEY,
            Method::GET,
            "/v1/sandbox/images/shared-app",
            Value::Null,
        )
        .await;
    let (_, list) = d
        .json_as(ADMIN_KEY, Method::GET, "/v1/sandbox/images", Value::Null)
        .await;
    let listed: Vec<&Value> = list["images"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["names"] == json!(["shared-app"]))
        .collect();
    if status == StatusCode::NOT_FOUND {
        assert!(listed.is_empty(), "{list}");
        return Value::Null;
    }
    assert_eq!(status, StatusCode::OK, "{image}");
    assert_eq!(listed.len(), 1, "{list}");
    assert_eq!(listed[0]["digest"], image["digest"], "{list}");
    image
}

/// A volume made through node-1 keeps its data there: its files are written through node-2,
/// sessions mounting it (native or E2B, asked of node-2) run on node-1, a copy asked of
/// node-0 is made there, and a session mounting volumes of two nodes is refused.
async fn volumes_are_served_where_their_data_is(nodes: &[Daemon], db: &TestDatabase) {
    let volume_node = |name: &str| {
        db.query(&format!(
            "SELECT node_id FROM volumes WHERE name = '{name}'"
        ))
    };
    let v = create_volume(&nodes[1], json!({"name": "vol-a"})).await;
    let volume_id = v["volume_id"].as_str().unwrap().to_string();
    assert_eq!(volume_node("vol-a"), "node-1");
    let resp = nodes[2]
        .req(
            Method::PUT,
            "/v1/sandbox/volumes/vol-a/files?path=/kept.txt",
            KEY1,
        )
        .body("on node-1\n")
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{:?}", resp.text().await);

    let id = nodes[2]
        .create(json!({"volumes": [{"name": "vol-a", "path": "/data"}]}))
        .await;
    assert_eq!(node_of(db, &id), "node-1");
    let v = nodes[0]
        .exec(&id, json!({"cmd": ["/bin/cat", "/data/kept.txt"]}))
        .await;
    assert_eq!(v["stdout"], "on node-1\n", "{v}");
    delete_session(&nodes[0], &id, KEY1).await;

    // E2B's create, and E2B's volume API by id, through other nodes.
    let resp = e2b(&nodes[2], Method::POST, "/sandboxes")
        .json(&json!({"templateID": "base", "volumeMounts": [{"name": "vol-a", "path": "/data"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let id = resp.json::<Value>().await.unwrap()["sandboxID"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(node_of(db, &id), "node-1");
    let resp = e2b(&nodes[0], Method::GET, &format!("/volumes/{volume_id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    delete_session(&nodes[2], &id, KEY1).await;

    // A copy asked of node-0 is made where its source is; a volume made on node-2 and vol-a
    // cannot be mounted together.
    create_volume(&nodes[0], json!({"name": "vol-b", "from_volume": "vol-a"})).await;
    assert_eq!(volume_node("vol-b"), "node-1");
    create_volume(&nodes[2], json!({"name": "vol-c"})).await;
    assert_eq!(volume_node("vol-c"), "node-2");
    let (status, v) = nodes[0]
        .json(
            Method::POST,
            S,
            json!({"volumes": [{"name": "vol-a", "path": "/a"}, {"name": "vol-c", "path": "/c"}]}),
        )
        .await;
    assert_eq!(
        (status, error_code(&v)),
        (StatusCode::CONFLICT, "SANDBOX-CONFLICT"),
        "{v}"
    );
    for name in ["vol-a", "vol-b", "vol-c"] {
        let status = nodes[0]
            .req(Method::DELETE, &format!("/v1/sandbox/volumes/{name}"), KEY1)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, StatusCode::NO_CONTENT, "{name}");
    }
}

/// Every request of a build goes to the builder, node-0 (the smallest id up), whichever node
/// it reaches: a native build started through node-2 runs there (on a base imported through
/// node-2) and answers through node-1; an E2B template build requested through node-1 is
/// known through node-2.
async fn builds_run_on_the_builder(nodes: &[Daemon], db: &TestDatabase) {
    let resp = nodes[2]
        .req(
            Method::POST,
            "/v1/sandbox/images/builds?name=built-app",
            ADMIN_KEY,
        )
        .header("content-type", "application/toml")
        .body("base = \"shared-app\"\nrun = [\"true\"]\n")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let build = resp.json::<Value>().await.unwrap()["build_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        db.query(&format!(
            "SELECT node_id FROM image_builds WHERE id = '{build}'"
        )),
        "node-0"
    );
    let mut state = Value::Null;
    for _ in 0..300 {
        let (status, v) = nodes[1]
            .json_as(
                ADMIN_KEY,
                Method::GET,
                &format!("/v1/sandbox/images/builds/{build}"),
                Value::Null,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        state = v["state"].clone();
        if state == "succeeded" || state == "failed" {
            // The base was found there: the step ran (an image without a shell fails it).
            assert_eq!(v["failed_step"], 0, "{v}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(state, "failed");

    let v: Value = e2b(&nodes[1], Method::POST, "/v3/templates")
        .json(&json!({"name": "routed"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let (template, build) = (v["templateID"].as_str(), v["buildID"].as_str());
    let (template, build) = (template.unwrap(), build.unwrap());
    let resp = e2b(
        &nodes[2],
        Method::GET,
        &format!("/templates/{template}/builds/{build}/status"),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.json::<Value>().await.unwrap()["status"], "waiting");

    // Started through node-2 (on the image imported through node-2; ENV alone runs no
    // step), polled through node-1: it is built on node-0.
    let resp = e2b(
        &nodes[2],
        Method::POST,
        &format!("/v2/templates/{template}/builds/{build}"),
    )
    .json(&json!({"fromImage": "shared-app", "steps": [{"type": "ENV", "args": ["K", "v"]}]}))
    .send()
    .await
    .unwrap();
    assert_eq!(
        resp.status(),
        StatusCode::ACCEPTED,
        "{:?}",
        resp.text().await
    );
    let status = format!("/templates/{template}/builds/{build}/status");
    let mut v = Value::Null;
    for _ in 0..300 {
        v = e2b(&nodes[1], Method::GET, &status)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if v["status"] != "building" && v["status"] != "waiting" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(v["status"], "ready", "{v}");

    // node-2 never held it: it lists it, and a sandbox made on it through node-2 gets it.
    assert!(e2b_lists(&nodes[2], "routed").await);
    // Described alike through the builder and through node-2 (from the manifest shared).
    let mut described = Vec::new();
    for d in [&nodes[0], &nodes[2]] {
        let v: Value = e2b(d, Method::GET, "/templates/routed/tags")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        described.push(v);
    }
    assert_eq!(described[0], described[1]);
    assert_eq!(described[0][0]["tag"], "default", "{}", described[0]);
    let resp = e2b(&nodes[2], Method::POST, "/sandboxes")
        .json(&json!({"templateID": "routed", "allow_internet_access": false}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let id = resp.json::<Value>().await.unwrap()["sandboxID"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(hello_of(&nodes[1], &id).await, "two\n");
    let status = e2b(&nodes[1], Method::DELETE, &format!("/sandboxes/{id}"))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, StatusCode::NO_CONTENT);

    // Deleted through node-1: gone from node-2's listing too.
    let status = e2b(&nodes[1], Method::DELETE, "/templates/routed")
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert!(!e2b_lists(&nodes[2], "routed").await);
}

/// A request to E2B's API as tenant t1.
fn e2b(d: &Daemon, method: Method, path: &str) -> reqwest::RequestBuilder {
    d.http
        .request(method, format!("{}{path}", d.base))
        .header("x-api-key", KEY1)
}

/// Whether the E2B template listing through `d` names `template`.
async fn e2b_lists(d: &Daemon, template: &str) -> bool {
    let v: Value = e2b(d, Method::GET, "/templates")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .any(|t| t["templateID"] == template)
}

/// `/opt/hello.txt` of session `id`, read through `d`.
async fn hello_of(d: &Daemon, id: &str) -> String {
    let resp = d
        .req(
            Method::GET,
            &format!("{S}/{id}/files?path=/opt/hello.txt"),
            KEY1,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    resp.text().await.unwrap()
}

/// Creates a volume through `d`; its answer.
async fn create_volume(d: &Daemon, body: Value) -> Value {
    let (status, v) = d.json(Method::POST, "/v1/sandbox/volumes", body).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    v
}

/// The node the store records session `id` on.
fn node_of(db: &TestDatabase, id: &str) -> String {
    db.query(&format!("SELECT node_id FROM sessions WHERE id = '{id}'"))
}

/// Deletes session `id` (of the tenant of `key`) through `d`.
async fn delete_session(d: &Daemon, id: &str, key: &str) {
    let status = d
        .req(Method::DELETE, &format!("{S}/{id}"), key)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, StatusCode::NO_CONTENT, "{id}");
}

/// (id, state) of the sessions the tenant of `key` lists.
async fn listed(d: &Daemon, key: &str) -> Vec<(String, String)> {
    let (status, v) = d.json_as(key, Method::GET, S, Value::Null).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["id"].as_str().unwrap().into(),
                s["state"].as_str().unwrap().into(),
            )
        })
        .collect()
}

/// Creates a session as the tenant of `key`: its id, or the refusal.
async fn create_as(d: &Daemon, key: &str) -> Result<String, (StatusCode, Value)> {
    let (status, v) = d.json_as(key, Method::POST, S, json!({})).await;
    if status == StatusCode::CREATED {
        return Ok(v["id"].as_str().unwrap().to_string());
    }
    Err((status, v))
}

/// Session `id` lives on node-1; nodes 0 and 2 serve every surface of it.
async fn every_surface_through_other_nodes(nodes: &[Daemon], id: &str) {
    let (a, c) = (&nodes[0], &nodes[2]);
    // JSON and SSE execs.
    let v = a.exec(id, json!({"cmd": ["/bin/echo", "forwarded"]})).await;
    assert_eq!(v["stdout"], "forwarded\n", "{v}");
    let resp = c
        .req(Method::POST, &format!("{S}/{id}/exec"), KEY1)
        .header("accept", "text/event-stream")
        .json(&json!({"shell": "echo one; sleep 0.3; echo two"}))
        .send()
        .await
        .unwrap();
    let events = read_sse(resp).await;
    assert_eq!(stdout_of(&events), "one\ntwo\n", "{events:?}");
    // The second line came later than the first: streamed, not buffered at the hop.
    let lines: Vec<_> = events.iter().filter(|e| e.name == "stdout").collect();
    if let [first, .., last] = lines.as_slice() {
        assert!(last.at.duration_since(first.at) >= Duration::from_millis(200));
    }

    // Files up through one node and down through another.
    let bytes: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let resp = a
        .req(Method::PUT, &format!("{S}/{id}/files"), KEY1)
        .query(&[("path", "/tmp/blob.bin")])
        .body(bytes.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let down = c
        .req(Method::GET, &format!("{S}/{id}/files"), KEY1)
        .query(&[("path", "/tmp/blob.bin")])
        .send()
        .await
        .unwrap();
    assert_eq!(down.status(), StatusCode::OK);
    assert!(down.bytes().await.unwrap() == bytes);

    // The terminal's WebSocket.
    let mut ws = connect(a, id, "").await;
    ws.send(Message::Binary(b"echo fwd-$((6*7))\n".to_vec().into()))
        .await
        .unwrap();
    read_until(&mut ws, "fwd-42").await;
    drop(ws);

    // The preview proxy, to a server inside the sandbox.
    let v = a
        .exec(
            id,
            json!({"shell": "mkdir -p /tmp/www && printf 'hello through the cluster' > /tmp/www/hello.txt"}),
        )
        .await;
    assert_eq!(v["exit_code"], 0, "{v}");
    let (status, v) = c
        .json(
            Method::POST,
            &format!("{S}/{id}/exec"),
            json!({"cmd": ["/usr/bin/python3", "-m", "http.server", "8000", "--bind", "127.0.0.1",
                           "--directory", "/tmp/www"], "background": true}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let mut served = String::new();
    for _ in 0..100 {
        let resp = a
            .req(Method::GET, &format!("{S}/{id}/preview/hello.txt"), KEY1)
            .send()
            .await
            .unwrap();
        if resp.status() == StatusCode::OK {
            served = resp.text().await.unwrap();
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(served, "hello through the cluster");

    // E2B: the control plane and envd.
    let resp = e2b(c, Method::GET, &format!("/sandboxes/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let info: Value = resp.json().await.unwrap();
    assert_eq!(info["sandboxID"], id, "{info}");
    let token = info["trafficAccessToken"]
        .as_str()
        .expect("a traffic token");
    // The sandbox's server by its E2B host name, asked of a node that does not hold the
    // sandbox, with the token the owner gave.
    let resp = c
        .http
        .get(format!("{}/hello.txt", c.base))
        .header("host", format!("8000-{id}.{E2B_DOMAIN}"))
        .header("e2b-traffic-access-token", token)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    assert_eq!(
        (status, resp.text().await.unwrap()),
        (StatusCode::OK, "hello through the cluster".into())
    );
    let resp = e2b(a, Method::GET, "/files")
        .query(&[("path", "/tmp/www/hello.txt")])
        .header("e2b-sandbox-id", id)
        .header("e2b-sandbox-port", "49983")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.text().await.unwrap(), "hello through the cluster");

    // Another tenant's key is refused by the owner as it would be directly: unknown id.
    let (status, v) = a
        .json_as(KEY2, Method::GET, &format!("{S}/{id}"), Value::Null)
        .await;
    assert_eq!(
        (status, error_code(&v)),
        (StatusCode::NOT_FOUND, "SANDBOX-NOT-FOUND")
    );
}

/// Session `id` lives on node-1; the gRPC faces of nodes 0 and 2 serve it: unary, server
/// and client streams and the bidirectional terminal, another tenant refused by the owner.
async fn grpc_through_other_nodes(grpc: &[Client], id: &str) {
    let (mut a, mut c) = (grpc[0].clone(), grpc[2].clone());
    let shell = |cmd: &str| pb::ExecRequest {
        session_id: id.into(),
        shell: Some(cmd.into()),
        ..Default::default()
    };
    let done = ok(a.exec(authed(KEY1, shell("echo grpc-forwarded"))).await);
    assert_eq!(done.stdout, "grpc-forwarded\n", "{done:?}");

    // Streamed, not buffered at the hop: the second line comes later than the first.
    let mut events = ok(c
        .exec_stream(authed(KEY1, shell("echo one; sleep 0.3; echo two")))
        .await);
    let mut lines = Vec::new();
    while let Some(event) = events.next().await {
        if let Some(pb::exec_event::Event::Stdout(b)) = event.expect("an event").event {
            lines.push((std::time::Instant::now(), b));
        }
    }
    let out: Vec<u8> = lines.iter().flat_map(|(_, b)| b.clone()).collect();
    assert_eq!(out, b"one\ntwo\n");
    if let [first, .., last] = lines.as_slice() {
        assert!(last.0.duration_since(first.0) >= Duration::from_millis(200));
    }

    // A file streamed up through one node and down through the other.
    let bytes: Vec<u8> = (0..300_000u32).map(|i| (i * 13 % 251) as u8).collect();
    let parts = std::iter::once(pb::WriteFileRequest {
        part: Some(pb::write_file_request::Part::Header(pb::WriteFileHeader {
            session_id: id.into(),
            path: "/tmp/grpc.bin".into(),
            ..Default::default()
        })),
    })
    .chain(bytes.chunks(64 * 1024).map(|chunk| pb::WriteFileRequest {
        part: Some(pb::write_file_request::Part::Data(chunk.to_vec())),
    }))
    .collect::<Vec<_>>();
    let entry = ok(a
        .write_file(authed(KEY1, futures::stream::iter(parts)))
        .await);
    assert_eq!(entry.size, bytes.len() as u64);
    let mut down = ok(c
        .read_file(authed(
            KEY1,
            pb::ReadFileRequest {
                session_id: id.into(),
                path: "/tmp/grpc.bin".into(),
            },
        ))
        .await);
    let mut read = Vec::new();
    while let Some(chunk) = down.next().await {
        read.extend(chunk.expect("a chunk").data);
    }
    assert!(read == bytes, "{} bytes came back", read.len());

    // The terminal, both ways through node-0.
    use pb::terminal_request::Part;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let part = |p| pb::TerminalRequest { part: Some(p) };
    tx.send(part(Part::Start(pb::TerminalStart {
        session_id: id.into(),
        argv: vec!["/bin/sh".into()],
        ..Default::default()
    })))
    .await
    .unwrap();
    let input =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let mut out = ok(a.terminal(authed(KEY1, input)).await);
    tx.send(part(Part::Input(b"echo term-$((6*7))\n".to_vec())))
        .await
        .unwrap();
    let mut seen = String::new();
    tokio::time::timeout(Duration::from_secs(20), async {
        while !seen.contains("term-42") {
            let msg = out
                .next()
                .await
                .expect("terminal output")
                .expect("a message");
            if let Some(pb::terminal_output::Event::Output(b)) = msg.event {
                seen.push_str(&String::from_utf8_lossy(&b));
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no term-42 through the hop: {seen:?}"));
    drop(tx);

    // Another tenant is refused by the owner as it would be directly.
    let get = |key| {
        authed(
            key,
            pb::GetSessionRequest {
                session_id: id.into(),
            },
        )
    };
    assert_eq!(ok(c.get_session(get(KEY1)).await).id, id);
    assert_eq!(
        refused(c.get_session(get(KEY2)).await),
        (tonic::Code::NotFound, "SANDBOX-NOT-FOUND".into())
    );
    // A client cannot pass as a node here either.
    let mut forged = get(KEY1);
    forged
        .metadata_mut()
        .insert("x-koder-forwarded", "v1 node-1 0 00".parse().unwrap());
    assert_eq!(
        refused(c.get_session(forged).await),
        (tonic::Code::Unauthenticated, "SANDBOX-NODE-AUTH".into())
    );
}

/// A client cannot pass as a node: a proof that does not verify is refused, and a real
/// node's header grants no identity (the caller is still authenticated by the owner).
async fn forged_node_proofs_are_refused(d: &Daemon, id: &str) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    for proof in [
        format!("v1 node-1 {now} {}", "00".repeat(32)),
        "v1 node-1".into(),
        "garbage".into(),
    ] {
        let resp = d
            .req(Method::GET, &format!("{S}/{id}"), KEY1)
            .header("x-koder-forwarded", proof)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(error_code(&v), "SANDBOX-NODE-AUTH", "{v}");
    }
}
