//! Volumes through the real daemon and real jails: persistence across sessions and restarts,
//! one writer and many readers, ownership as sandbox uids whatever a session's host range,
//! the size and tenant quotas, the file API without a session on hostile contents, and
//! deletion (refused while mounted).

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const POST: Method = Method::POST;
const GET: Method = Method::GET;
const DELETE: Method = Method::DELETE;

async fn sh(d: &Daemon, id: &str, script: &str) -> Value {
    d.exec(id, json!({ "shell": script })).await
}

async fn sh_ok(d: &Daemon, id: &str, script: &str, user: &str) -> String {
    let v = d.exec(id, json!({ "shell": script, "user": user })).await;
    assert_eq!(v["exit_code"], 0, "{script}: {v}");
    v["stdout"].as_str().unwrap_or_default().to_string()
}

async fn new_volume(d: &Daemon, name: &str, size_mib: u64) -> Value {
    let (status, v) = d
        .json(
            POST,
            "/v1/sandbox/volumes",
            json!({"name": name, "size_mib": size_mib}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    v
}

async fn put_file(d: &Daemon, volume: &str, query: &str, body: Vec<u8>) -> (StatusCode, Value) {
    let resp = d
        .req(
            Method::PUT,
            &format!("/v1/sandbox/volumes/{volume}/files?{query}"),
            KEY1,
        )
        .body(body)
        .send()
        .await
        .expect("upload");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn get_file(d: &Daemon, volume: &str, path: &str) -> (StatusCode, Vec<u8>) {
    let resp = d
        .req(GET, &format!("/v1/sandbox/volumes/{volume}/files"), KEY1)
        .query(&[("path", path)])
        .send()
        .await
        .expect("download");
    let status = resp.status();
    (status, resp.bytes().await.expect("body").to_vec())
}

fn mounts_under(dir: &std::path::Path) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let dir = dir.display().to_string();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&dir))
        .map(String::from)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_persist_with_one_writer_and_sandbox_owners() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let vol = new_volume(&d, "data", 64).await;
    let vid = vol["volume_id"].as_str().unwrap().to_string();
    assert_eq!(
        (vol["size_mib"].clone(), vol["backend"].clone()),
        (json!(64), json!("ext4")),
        "{vol}"
    );

    // Names: unique per tenant, plain, not id-shaped; another tenant sees nothing.
    let (status, v) = d
        .json(POST, "/v1/sandbox/volumes", json!({"name": "data"}))
        .await;
    assert_eq!(
        (status, error_code(&v)),
        (StatusCode::CONFLICT, "SANDBOX-CONFLICT"),
        "{v}"
    );
    for bad in ["", "a/b", "../x", "0f8fad5b-d9cb-469f-a165-70867728950e"] {
        let (status, v) = d
            .json(POST, "/v1/sandbox/volumes", json!({"name": bad}))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad:?}: {v}");
    }
    let (status, _) = d
        .json_as(
            KEY2,
            GET,
            &format!("/v1/sandbox/volumes/{vid}"),
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // A writer: what `user` writes belongs to uid 1000 inside, and on the volume.
    let (status, a) = d
        .json(
            POST,
            "/v1/sandbox/sessions",
            json!({"volumes": [{"name": "data", "path": "/data"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{a}");
    assert_eq!(a["volumes"][0]["path"], "/data", "{a}");
    let a = a["id"].as_str().unwrap().to_string();
    let owner = sh_ok(
        &d,
        &a,
        "echo hi > /data/a.txt && stat -c %u:%g /data/a.txt",
        "user",
    )
    .await;
    assert_eq!(owner.trim(), "1000:1000");

    // A second writer is refused; readers are not, and cannot write.
    let (status, v) = d
        .json(
            POST,
            "/v1/sandbox/sessions",
            json!({"volumes": [{"name": vid, "path": "/v"}]}),
        )
        .await;
    assert_eq!(
        (status, error_code(&v)),
        (StatusCode::CONFLICT, "SANDBOX-VOLUME-BUSY"),
        "{v}"
    );
    let b = d
        .create(json!({"volumes": [{"name": "data", "path": "/mnt/ro", "read_only": true}]}))
        .await;
    let seen = sh_ok(
        &d,
        &b,
        "cat /mnt/ro/a.txt; stat -c %u /mnt/ro/a.txt",
        "root",
    )
    .await;
    assert_eq!(seen, "hi\n1000\n");
    let w = sh(&d, &b, "echo x > /mnt/ro/b.txt").await;
    assert_ne!(w["exit_code"], 0, "{w}");
    assert!(
        w["stderr"].as_str().unwrap_or("").contains("Read-only"),
        "{w}"
    );
    let w = sh(&d, &b, "mount -o remount,rw /mnt/ro").await;
    assert_ne!(w["exit_code"], 0, "{w}");

    // Deleting a mounted volume is refused; the listing shows who holds it.
    let (status, v) = d
        .json(DELETE, &format!("/v1/sandbox/volumes/{vid}"), Value::Null)
        .await;
    assert_eq!(
        (status, error_code(&v)),
        (StatusCode::CONFLICT, "SANDBOX-VOLUME-BUSY"),
        "{v}"
    );
    let (_, v) = d.json(GET, "/v1/sandbox/volumes/data", Value::Null).await;
    assert_eq!(v["mounts"].as_array().map(Vec::len), Some(2), "{v}");
    // The session list shows each session's own mounts, with the volume's name.
    let (_, list) = d.json(GET, "/v1/sandbox/sessions", Value::Null).await;
    let mounts_of = |id: &str| {
        list["sessions"]
            .as_array()
            .and_then(|all| all.iter().find(|s| s["id"] == id))
            .map(|s| s["volumes"].clone())
            .unwrap_or(Value::Null)
    };
    assert_eq!(
        mounts_of(&a),
        json!([{"volume_id": vid, "name": "data", "path": "/data"}]),
        "{list}"
    );
    assert_eq!(mounts_of(&b)[0]["path"], "/mnt/ro", "{list}");
    assert_eq!(mounts_of(&b)[0]["read_only"], true, "{list}");

    // The file API sees and feeds the same filesystem.
    assert_eq!(
        get_file(&d, "data", "/a.txt").await,
        (StatusCode::OK, b"hi\n".to_vec())
    );
    let (status, e) = put_file(&d, "data", "path=/b.txt", b"from the api".to_vec()).await;
    assert_eq!(
        (status, e["uid"].clone()),
        (StatusCode::CREATED, json!(1000)),
        "{e}"
    );
    let (status, _) = put_file(&d, "data", "path=/b.txt", b"again".to_vec()).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        sh_ok(&d, &a, "cat /data/b.txt", "user").await,
        "from the api"
    );

    // Ended sessions release it; a new session finds everything.
    for id in [&a, &b] {
        let (status, _) = d
            .json(DELETE, &format!("/v1/sandbox/sessions/{id}"), Value::Null)
            .await;
        assert_eq!(status, StatusCode::NO_CONTENT);
    }
    // A copy: a volume of its own with the same files; refused while the source is mounted.
    let (status, v) = d
        .json(
            POST,
            "/v1/sandbox/volumes",
            json!({"name": "copy", "from_volume": "data"}),
        )
        .await;
    assert_eq!(
        (status, v["size_mib"].clone()),
        (StatusCode::CREATED, json!(64)),
        "{v}"
    );
    assert_eq!(
        get_file(&d, "copy", "/b.txt").await,
        (StatusCode::OK, b"from the api".to_vec())
    );
    let (status, _) = put_file(&d, "copy", "path=/only-in-copy", b"c".to_vec()).await;
    assert_eq!(status, StatusCode::CREATED);
    let c = d
        .create(json!({"volumes": [{"name": "data", "path": "/home/user/work"}]}))
        .await;
    let (status, v) = d
        .json(
            POST,
            "/v1/sandbox/volumes",
            json!({"name": "copy2", "from_volume": "data"}),
        )
        .await;
    assert_eq!(
        (status, error_code(&v)),
        (StatusCode::CONFLICT, "SANDBOX-VOLUME-BUSY"),
        "{v}"
    );
    let w = sh(&d, &c, "test ! -e /home/user/work/only-in-copy").await;
    assert_eq!(w["exit_code"], 0, "the copy is not the original: {w}");
    assert_eq!(
        sh_ok(
            &d,
            &c,
            "cat /home/user/work/a.txt /home/user/work/b.txt",
            "user"
        )
        .await,
        "hi\nfrom the api"
    );
    let (status, _) = d
        .json(DELETE, &format!("/v1/sandbox/sessions/{c}"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = d
        .json(DELETE, &format!("/v1/sandbox/volumes/{vid}"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = d
        .json(GET, &format!("/v1/sandbox/volumes/{vid}"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // No sandbox mount stayed on the host.
    assert_eq!(
        mounts_under(&d.data_dir().join("jail")),
        Vec::<String>::new()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_hostile_contents_and_bad_mounts_get_typed_errors() {
    let Some(()) = root_or_skip() else { return };
    let config = format!("{BASE_CONFIG}[tenants.t1]\nvolume_storage_mib = 100\n");
    let d = Daemon::start(&config).await;
    new_volume(&d, "small", 16).await;
    let (status, v) = d
        .json(
            POST,
            "/v1/sandbox/volumes",
            json!({"name": "big", "size_mib": 90}),
        )
        .await;
    assert_eq!(
        (status, error_code(&v)),
        (
            StatusCode::INSUFFICIENT_STORAGE,
            "SANDBOX-QUOTA-VOLUME-STORAGE"
        ),
        "{v}"
    );
    let (status, v) = d
        .json(
            POST,
            "/v1/sandbox/volumes",
            json!({"name": "tiny", "size_mib": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");

    // Mount requests: unknown volume, system paths, nesting.
    for (mounts, why) in [
        (json!([{"name": "nope", "path": "/x"}]), "unknown volume"),
        (json!([{"name": "small", "path": "/proc/x"}]), "under /proc"),
        (json!([{"name": "small", "path": "relative"}]), "relative"),
        (json!([{"name": "small", "path": "/a/../b"}]), "dot-dot"),
    ] {
        let (status, v) = d
            .json(POST, "/v1/sandbox/sessions", json!({"volumes": mounts}))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{why}: {v}");
    }

    let s = d
        .create(json!({"volumes": [{"name": "small", "path": "/data"}]}))
        .await;
    // The size quota binds inside the sandbox...
    let full = sh(&d, &s, "head -c 40000000 /dev/zero > /data/fill").await;
    assert_ne!(full["exit_code"], 0, "{full}");
    assert!(
        full["stderr"].as_str().unwrap_or("").contains("No space"),
        "{full}"
    );
    sh(&d, &s, "rm -f /data/fill").await;
    // ...and through the file API, which leaves no partial file.
    let (status, v) = put_file(&d, "small", "path=/big.bin", vec![7u8; 40 << 20]).await;
    assert_eq!(status, StatusCode::INSUFFICIENT_STORAGE, "{v}");
    let (status, _) = d
        .json(
            GET,
            "/v1/sandbox/volumes/small/files/stat?path=/big.bin",
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Hostile contents made by the sandbox: links out, fifos, loops.
    sh_ok(
        &d,
        &s,
        "ln -s /etc /data/etc; ln -s ../../../../ /data/up; mkfifo /data/fifo; \
        ln -s loop /data/loop; mkdir /data/dir; ln -s /etc/passwd /data/dir/pw",
        "root",
    )
    .await;
    for path in ["/etc/passwd", "/up/etc/passwd", "/dir/pw", "/loop"] {
        let (status, body) = get_file(&d, "small", path).await;
        assert!(
            status.is_client_error(),
            "{path}: {status} {}",
            String::from_utf8_lossy(&body)
        );
        assert!(
            !String::from_utf8_lossy(&body).contains("root:x:0:0"),
            "{path} leaked the host's passwd"
        );
    }
    let (status, _) = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        get_file(&d, "small", "/fifo"),
    )
    .await
    .expect("reading a fifo must not hang");
    assert!(status.is_client_error(), "{status}");
    let (_, v) = d
        .json(
            GET,
            "/v1/sandbox/volumes/small/files/stat?path=/etc",
            Value::Null,
        )
        .await;
    assert_eq!(
        (v["type"].clone(), v["symlink_target"].clone()),
        (json!("symlink"), json!("/etc")),
        "{v}"
    );
    // Removing a directory holding a link to the host's /etc removes the link only.
    let resp = d
        .req(DELETE, "/v1/sandbox/volumes/small/files", KEY1)
        .query(&[("path", "/dir")])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    assert!(std::path::Path::new("/etc/passwd").exists());
    for bad in ["", "rel/path", "/a\u{0}b"] {
        let (status, _) = get_file(&d, "small", bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_and_their_claims_survive_a_restart() {
    let Some(()) = root_or_skip() else { return };
    let mut d = Daemon::start(BASE_CONFIG).await;
    new_volume(&d, "keep", 32).await;
    let s = d
        .create(json!({"volumes": [{"name": "keep", "path": "/keep"}]}))
        .await;
    sh_ok(&d, &s, "echo before > /keep/f", "user").await;
    // An E2B volume token handed out before the restart still opens its volume after it.
    let (status, e2b_volume) = d.json(POST, "/volumes", json!({"name": "tok"})).await;
    assert_eq!(status, StatusCode::CREATED, "{e2b_volume}");
    let content = format!(
        "/volumecontent/{}/dir?path=/",
        e2b_volume["volumeID"].as_str().unwrap()
    );
    let token = e2b_volume["token"].as_str().unwrap().to_string();
    let listed = |d: &Daemon| d.req(Method::GET, &content, &token).send();
    assert_eq!(listed(&d).await.unwrap().status(), StatusCode::OK);
    let (status, v) = d
        .json(
            POST,
            &format!("/v1/sandbox/sessions/{s}/pause"),
            json!({"memory": false}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    d.stop();
    d.launch().await;
    assert_eq!(listed(&d).await.unwrap().status(), StatusCode::OK);
    // The paused session still holds its claim, so another writer is refused.
    let (status, v) = d
        .json(
            POST,
            "/v1/sandbox/sessions",
            json!({"volumes": [{"name": "keep", "path": "/k"}]}),
        )
        .await;
    assert_eq!(
        (status, error_code(&v)),
        (StatusCode::CONFLICT, "SANDBOX-VOLUME-BUSY"),
        "{v}"
    );
    let (status, v) = d
        .json(
            POST,
            &format!("/v1/sandbox/sessions/{s}/resume"),
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(sh_ok(&d, &s, "cat /keep/f", "user").await, "before\n");
    // A crash: the running session is stopped at restart and its claim goes with it.
    d.crash();
    d.launch().await;
    let r = d
        .create(json!({"volumes": [{"name": "keep", "path": "/k"}]}))
        .await;
    assert_eq!(sh_ok(&d, &r, "cat /k/f", "user").await, "before\n");
}
