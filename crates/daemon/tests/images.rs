//! Images end to end: language packs built from Debian (once, into the test cache outside the
//! clone: `KODER_PACK_CACHE`, default /var/cache/koder-sandbox-test/packs; scripts/test.sh
//! builds them) and linked into each daemon's data dir, sessions on them, the image API and the
//! in-use rule.

mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;
use koder_image::packs::{self, Pack};
use koder_image::ImageStore;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const ADMIN: &str = "admin-key-0123456789";

/// Serializes pack builds of this binary's tests (each pack is built once, then found).
static BUILDS: Mutex<()> = Mutex::new(());

/// The test cache's store with `pack` in it (built the first time: minutes).
fn cached(pack: Pack) -> ImageStore {
    let dir = std::env::var_os("KODER_PACK_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/var/cache/koder-sandbox-test/packs".into());
    let _one = BUILDS.lock().unwrap_or_else(|e| e.into_inner());
    let store = ImageStore::open(&dir).expect("pack cache");
    let built = packs::build(&store, pack, &packs::BuildOptions::default())
        .unwrap_or_else(|e| panic!("building the {} pack: {e}", pack.name()));
    if built.built {
        eprintln!(
            "built the {} pack into {} (scripts/test.sh does this once)",
            pack.name(),
            dir.display()
        );
    }
    store
}

/// Links `packs` from the cache into the daemon's data dir (hard links: milliseconds).
fn link(d: &Daemon, which: &[Pack]) {
    let store = ImageStore::open(&d.data_dir().join("images")).expect("daemon image store");
    for pack in which {
        store
            .link_from(&cached(*pack), pack.name())
            .expect("link pack");
    }
}

/// A daemon with `config` (a whole config: it replaces BASE_CONFIG) and an admin key.
async fn daemon(config: &str, which: &[Pack]) -> Daemon {
    let mut d = Daemon::start(&format!("{config}\n[auth]\nadmin_keys = [\"{ADMIN}\"]\n")).await;
    // Linked while the daemon is down, so its start (language packs, pool) already sees them.
    d.stop();
    link(&d, which);
    d.launch().await;
    d
}

async fn sh(d: &Daemon, id: &str, cmd: &str) -> Value {
    d.exec(id, json!({"shell": cmd})).await
}

/// Deletes what `path` names, whatever the answer (clean-up of what a test made).
async fn delete(d: &Daemon, path: &str) {
    d.json(Method::DELETE, path, Value::Null).await;
}

fn stdout(v: &Value) -> &str {
    v["stdout"].as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_run_on_language_packs_and_images_in_use_stay() {
    let Some(()) = root_or_skip() else { return };
    let d = daemon(BASE_CONFIG, &[Pack::Python, Pack::Bash]).await;

    let (status, list) = d.json(Method::GET, "/v1/sandbox/images", Value::Null).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let names: Vec<&str> = list["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["host", "bash", "python"], "{list}");
    let (status, py) = d
        .json(Method::GET, "/v1/sandbox/images/python:3.11", Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK, "{py}");
    assert_eq!(py["names"], json!(["python", "python:3.11"]));
    assert_eq!(py["languages"][0]["interpreter"], "/usr/bin/python3");
    assert_eq!(py["recipe"]["suite"], "bookworm");
    assert!(py["build_log"]
        .as_str()
        .unwrap()
        .contains("koder: python built"));

    // A python session on the pack: its own Python, Debian's tree, no setuid, writable dirs.
    let id = d.create(json!({"image": "python"})).await;
    let (_, s) = d
        .json(
            Method::GET,
            &format!("/v1/sandbox/sessions/{id}"),
            Value::Null,
        )
        .await;
    assert_eq!(
        (s["image"].as_str(), s["language"].as_str()),
        (Some("python"), Some("python"))
    );
    let v = d
        .exec(&id, json!({"cmd": ["python3", "-c", "import sys; print(sys.version_info[:2], sys.executable)"]}))
        .await;
    assert_eq!(stdout(&v).trim(), "(3, 11) /usr/bin/python3", "{v}");
    let v = d
        .exec(
            &id,
            json!({"code": "import pip, venv; print(pip.__version__ > '2')"}),
        )
        .await;
    assert_eq!(stdout(&v).trim(), "True", "{v}");
    // The host image generates /etc and copies no debian_version; the pack is Debian's own.
    let v = sh(
        &d,
        &id,
        "cat /etc/debian_version; stat -c %a /usr/bin/su; ls /usr/lib/python3.11/EXTERNALLY-MANAGED 2>&1 | grep -c 'No such'; \
         id -nu 1000; echo hi > /workspace/a && cat /workspace/a; echo t > /tmp/t && cat /tmp/t",
    )
    .await;
    let out: Vec<&str> = stdout(&v).lines().collect();
    assert!(out[0].starts_with("12."), "{v}");
    assert_eq!(&out[1..], ["755", "1", "user", "hi", "t"], "{v}");
    // Its root is its own, as a container's: root writes anywhere in it (a new top-level
    // directory, a system-wide Python module), the user only where its owners let it.
    let v = sh(
        &d,
        &id,
        "mkdir /app && echo a > /app/a && cat /app/a; \
         echo 'X = 5' > /usr/lib/python3/dist-packages/koder_probe.py && python3 -c 'import koder_probe; print(koder_probe.X)'",
    )
    .await;
    assert_eq!(stdout(&v), "a\n5\n", "{v}");
    let v = d
        .exec(&id, json!({"shell": "touch /usr/y /opt/y 2>&1 | grep -c 'Permission denied'; mkdir /u 2>&1 | grep -c 'Permission denied'", "user": "user"}))
        .await;
    assert_eq!(stdout(&v), "2\n1\n", "{v}");
    let resp = d
        .req(
            Method::PUT,
            &format!("/v1/sandbox/sessions/{id}/files"),
            KEY1,
        )
        .query(&[("path", "/new/f.txt")])
        .body("via the files API")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    assert_eq!(
        stdout(&sh(&d, &id, "cat /new/f.txt").await),
        "via the files API"
    );
    // Another session on the same image has none of it.
    let other = d.create(json!({"image": "python"})).await;
    let v = sh(
        &d,
        &other,
        "ls /app /usr/lib/python3/dist-packages/koder_probe.py /new 2>&1 | grep -c 'No such'",
    )
    .await;
    assert_eq!(stdout(&v), "3\n", "{v}");
    delete(&d, &format!("/v1/sandbox/sessions/{other}")).await;
    // A snapshot holds those changes, a deleted image file too, and a session made from it
    // starts with them.
    sh(&d, &id, "rm /usr/bin/xargs").await;
    let (s, snap) = d
        .json(
            Method::POST,
            &format!("/v1/sandbox/sessions/{id}/snapshot"),
            json!({}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{snap}");
    let sid = snap["snapshot_id"].as_str().unwrap();
    let restored = d.create(json!({"from_snapshot": sid})).await;
    let v = sh(
        &d,
        &restored,
        "cat /app/a /new/f.txt; python3 -c 'import koder_probe; print(koder_probe.X)'; ls /usr/bin/xargs 2>&1 | grep -c 'No such'",
    )
    .await;
    assert_eq!(stdout(&v), "a\nvia the files API5\n1\n", "{v}");
    delete(&d, &format!("/v1/sandbox/sessions/{restored}")).await;
    delete(&d, &format!("/v1/sandbox/snapshots/{sid}")).await;

    // Bash pack: bash and coreutils, and nothing of the host's (no python at all).
    let b = d.create(json!({"image": "bash"})).await;
    let v = sh(
        &d,
        &b,
        "bash --version | head -1; ls /usr/bin/python3 2>&1 | grep -c 'No such'",
    )
    .await;
    assert!(stdout(&v).starts_with("GNU bash, version 5.2"), "{v}");
    assert!(stdout(&v).ends_with("1\n"), "{v}");
    // Its `user` has sudo too: the agent's, at the place Debian's PATH looks first; and
    // Debian's own `su` lets root become anyone (the pack's shadow file names every account).
    let v = d
        .exec(
            &b,
            json!({
                "shell": "sudo id -u; command -v sudo; sudo -u nobody id -un; \
                          sudo su - user -c 'id -un; pwd'",
                "user": "user",
            }),
        )
        .await;
    assert_eq!(
        stdout(&v),
        "0\n/usr/local/bin/sudo\nnobody\nuser\n/home/user\n",
        "{v}"
    );
    // Paused to disk and resumed, it boots on its own image again (not the language's
    // default), with its files.
    sh(&d, &b, "echo kept > /workspace/k").await;
    for step in ["pause", "resume"] {
        let path = format!("/v1/sandbox/sessions/{b}/{step}");
        let (s, e) = d.json(Method::POST, &path, json!({"memory": false})).await;
        assert_eq!(s, StatusCode::OK, "{step}: {e}");
    }
    let v = sh(
        &d,
        &b,
        "cat /workspace/k; ls /usr/bin/python3 2>&1 | grep -c 'No such'",
    )
    .await;
    assert_eq!(stdout(&v), "kept\n1\n", "{v}");
    let (status, e) = d
        .json(
            Method::POST,
            "/v1/sandbox/sessions",
            json!({"image": "bash", "language": "python"}),
        )
        .await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::BAD_REQUEST, "SANDBOX-INVALID-ARGUMENT"),
        "{e}"
    );

    // Unknown and hostile names.
    for (path, status, code) in [
        ("/v1/sandbox/images/ruby", 404, "SANDBOX-IMAGE-NOT-FOUND"),
        ("/v1/sandbox/images/Python", 400, "SANDBOX-INVALID-ARGUMENT"),
        (
            "/v1/sandbox/images/%2e%2e%2fetc",
            400,
            "SANDBOX-INVALID-ARGUMENT",
        ),
        (
            "/v1/sandbox/images/py%C3%BEthon",
            400,
            "SANDBOX-INVALID-ARGUMENT",
        ),
    ] {
        let (s, e) = d.json(Method::GET, path, Value::Null).await;
        assert_eq!((s.as_u16(), error_code(&e)), (status, code), "{path}: {e}");
    }
    let long = format!("/v1/sandbox/images/{}", "a".repeat(200));
    let (s, _) = d.json(Method::GET, &long, Value::Null).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, e) = d
        .json(
            Method::POST,
            "/v1/sandbox/sessions",
            json!({"image": "ruby"}),
        )
        .await;
    assert_eq!(
        (s.as_u16(), error_code(&e)),
        (404, "SANDBOX-IMAGE-NOT-FOUND"),
        "{e}"
    );

    // Deleting: admin keys only, never under a session, then gone for good.
    let (s, _) = d
        .json(Method::DELETE, "/v1/sandbox/images/python", Value::Null)
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, e) = d
        .json_as(
            ADMIN,
            Method::DELETE,
            "/v1/sandbox/images/python:3.11",
            Value::Null,
        )
        .await;
    assert_eq!(
        (s.as_u16(), error_code(&e)),
        (409, "SANDBOX-IMAGE-IN-USE"),
        "{e}"
    );
    let (s, e) = d
        .json_as(
            ADMIN,
            Method::DELETE,
            "/v1/sandbox/images/host",
            Value::Null,
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{e}");
    let (s, _) = d
        .json(
            Method::DELETE,
            &format!("/v1/sandbox/sessions/{id}"),
            Value::Null,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, e) = d
        .json_as(
            ADMIN,
            Method::DELETE,
            "/v1/sandbox/images/python",
            Value::Null,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{e}");
    assert_eq!(e["names"], json!(["python", "python:3.11"]));
    let (s, e) = d
        .json(
            Method::POST,
            "/v1/sandbox/sessions",
            json!({"image": "python"}),
        )
        .await;
    assert_eq!(
        (s.as_u16(), error_code(&e)),
        (404, "SANDBOX-IMAGE-NOT-FOUND"),
        "{e}"
    );
    let store_dir = d.data_dir().join("images/store");
    let left: Vec<_> = std::fs::read_dir(&store_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.len() == 64)
        .collect();
    assert_eq!(left.len(), 1, "only the bash pack is left: {left:?}");
    // The bash session still runs on its image.
    let v = sh(&d, &b, "echo alive").await;
    assert_eq!(stdout(&v), "alive\n");
}

/// `[images] language_packs` puts a language's sessions and its warm pool on the pack; a
/// create from that pool is as quick as one from a `host` pool.
#[tokio::test(flavor = "multi_thread")]
async fn a_language_pack_has_a_warm_pool() {
    let Some(()) = root_or_skip() else { return };
    let d = daemon(
        "[sessions]\nreap_interval = 0.2\npool = { python = 1, bash = 1 }\n[images]\nlanguage_packs = { python = \"python\" }\n",
        &[Pack::Python],
    )
    .await;
    // Pool depth is reported per image: python's lane runs on its pack, bash's on `host`.
    let ready = |metrics: &str, lang: &str, image: &str| {
        metrics
            .lines()
            .any(|l| l == format!("koder_pool_ready{{image=\"{image}\",language=\"{lang}\"}} 1"))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let m = d.metrics().await;
        if ready(&m, "python", "python") && ready(&m, "bash", "host") {
            break;
        }
        assert!(Instant::now() < deadline, "pools not ready:\n{m}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let timed = |body: Value| {
        let d = &d;
        async move {
            let started = Instant::now();
            let id = d.create(body).await;
            (id, started.elapsed())
        }
    };
    let (py, py_took) = timed(json!({"language": "python"})).await;
    let (host, host_took) = timed(json!({"language": "bash"})).await;
    eprintln!("create from the warm pool: python pack {py_took:?}, host (bash) {host_took:?}");
    let m = d.metrics().await;
    assert!(
        m.contains("koder_sessions_created_total{source=\"pool\"} 2"),
        "both from the pool:\n{m}"
    );
    let (_, s) = d
        .json(
            Method::GET,
            &format!("/v1/sandbox/sessions/{py}"),
            Value::Null,
        )
        .await;
    assert_eq!(s["image"], "python");
    let v = sh(&d, &py, "cat /etc/debian_version").await;
    assert!(stdout(&v).starts_with("12."), "{v}");
    let v = sh(&d, &host, "test -e /etc/debian_version || echo host").await;
    assert_eq!(stdout(&v), "host\n");
    // The pool's image stays.
    let (s, e) = d
        .json_as(
            ADMIN,
            Method::DELETE,
            "/v1/sandbox/images/python",
            Value::Null,
        )
        .await;
    assert_eq!(
        (s.as_u16(), error_code(&e)),
        (409, "SANDBOX-IMAGE-IN-USE"),
        "{e}"
    );
    assert!(e["error"]["message"]
        .as_str()
        .unwrap()
        .contains("warm pool"));
}
