//! Images brought in by operators, end to end: OCI archives imported through the API (on
//! the Debian bash pack of the test cache as their base layer), template specs built step by
//! step in jails on the python pack (a Debian package from the mirror and a pip package from
//! the package index, both reached through the build-only network exemption), and sessions on
//! them.

mod common;

use common::*;
use koder_image::oci::testing::{layer, layer_of_dir, oci_archive, E};
use koder_image::packs::{self, Pack};
use koder_image::ImageStore;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const ADMIN: &str = "admin-key-0123456789";

/// The test cache's store with `pack` built (`KODER_PACK_CACHE`; built the first time).
fn pack_cache(pack: Pack) -> (ImageStore, koder_image::StoredImage) {
    let dir = std::env::var_os("KODER_PACK_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/var/cache/koder-sandbox-test/packs".into());
    let store = ImageStore::open(&dir).expect("pack cache");
    let image = packs::build(&store, pack, &packs::BuildOptions::default())
        .unwrap_or_else(|e| panic!("building the {} pack: {e}", pack.name()))
        .image;
    (store, image)
}

/// The bash pack's tree from the test cache.
fn bash_pack_root() -> std::path::PathBuf {
    pack_cache(Pack::Bash).1.root
}

async fn daemon() -> Daemon {
    Daemon::start(&format!(
        "{BASE_CONFIG}\n[auth]\nadmin_keys = [\"{ADMIN}\"]\n"
    ))
    .await
}

async fn import(d: &Daemon, name: &str, key: &str, archive: Vec<u8>) -> (StatusCode, Value) {
    let resp = d
        .req(
            Method::POST,
            &format!("/v1/sandbox/images/import?name={name}"),
            key,
        )
        .header("content-type", "application/x-tar")
        .body(archive)
        .send()
        .await
        .expect("import request");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread")]
async fn an_imported_oci_image_runs_sessions_and_hostile_archives_leave_nothing() {
    let Some(()) = root_or_skip() else { return };
    let base = layer_of_dir(&bash_pack_root());
    let top = layer(&[
        E::Dir("opt"),
        E::Dir("opt/app"),
        E::File("opt/app/hello.txt", b"hello from the layer\n", 0o644),
        E::Owned(
            &E::File("opt/app/mine.txt", b"user's own\n", 0o600),
            1000,
            1000,
        ),
        E::File("usr/bin/.wh.yes", b"", 0o644),
    ]);
    let archive = oci_archive(&[base.clone(), top], false);
    let d = daemon().await;

    let (status, e) = import(&d, "app", KEY1, archive.clone()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a tenant key imports: {e}");
    let (status, image) = import(&d, "app", ADMIN, archive).await;
    assert_eq!(status, StatusCode::CREATED, "{image}");
    assert_eq!(image["names"], json!(["app"]));
    assert_eq!(image["recipe"]["kind"], "oci");
    assert_eq!(image["languages"][0]["name"], "bash", "{image}");

    let id = d.create(json!({"image": "app"})).await;
    let v = d
        .exec(
            &id,
            json!({"shell": "cat /opt/app/hello.txt; echo \"$GREETING $PWD\"; \
                             test -e /usr/bin/yes && echo kept || echo whited-out; \
                             ls /usr/bin/ls && echo ok > /workspace/w && cat /workspace/w"}),
        )
        .await;
    assert_eq!(
        v["stdout"].as_str().unwrap_or(""),
        "hello from the layer\nhello /opt/app\nwhited-out\n/usr/bin/ls\nok\n",
        "{v}"
    );
    // The layer's owners are the session's: `user`'s private file is `user`'s alone, and the
    // tree's root directory, host root's alone on the host, is not what the session's `/` is.
    let v = d
        .exec(
            &id,
            json!({"shell": "stat -c %U:%a /opt/app/mine.txt; cat /opt/app/mine.txt && \
                             echo more >> /opt/app/mine.txt && echo appended; \
                             stat -c %a / && ls / > /dev/null && echo lists-root; \
                             /usr/local/bin/sudo -u nobody cat /opt/app/mine.txt 2>&1 | grep -c 'Permission denied'",
                   "user": "user"}),
        )
        .await;
    assert_eq!(
        v["stdout"].as_str().unwrap_or(""),
        "user:600\nuser's own\nappended\n755\nlists-root\n1\n",
        "{v}"
    );

    // Hostile archives: refused with a typed error, nothing left behind.
    let outside = tempfile::tempdir().unwrap();
    let escape = outside.path().to_str().unwrap();
    let hostile = [
        (
            layer(&[E::RawFile(b"../../escaped")]),
            "SANDBOX-IMAGE-FORBIDDEN-ENTRY",
        ),
        (
            layer(&[E::Symlink("esc", escape), E::File("esc/pwned", b"x", 0o644)]),
            "SANDBOX-IMAGE-FORBIDDEN-ENTRY",
        ),
    ];
    for (bad, code) in hostile {
        let (status, e) = import(&d, "bad", ADMIN, oci_archive(&[bad], false)).await;
        assert_eq!(
            (status, error_code(&e)),
            (StatusCode::BAD_REQUEST, code),
            "{e}"
        );
    }
    let (status, e) = import(&d, "bad", ADMIN, b"no tar at all".to_vec()).await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::BAD_REQUEST, "SANDBOX-IMAGE-INVALID-ARCHIVE"),
        "{e}"
    );
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    let (_, list) = d.json(Method::GET, "/v1/sandbox/images", Value::Null).await;
    let names: Vec<&str> = list["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["host", "app"], "{list}");
    let tmp = d.data_dir().join("images/store/.tmp");
    assert_eq!(
        std::fs::read_dir(tmp).unwrap().count(),
        0,
        "upload or half image left"
    );
}

/// The package index's mirror: a reserved address, so only builds may reach it.
const BUILD_CONFIG: &str = "[images]\nbuild_internal = [\"203.0.113.80/32\"]\n";

const TEMPLATE: &str = r#"
base = "python"
apt = ["hello"]
pip = ["six"]
env = { GREETING = "hello from the template" }
workdir = "/opt/app"
run = ["echo built > /opt/app/built.txt"]
start = "exec python3 -m http.server 8000 --bind 127.0.0.1"
ready = "python3 -c 'import urllib.request as u; u.urlopen(\"http://127.0.0.1:8000/hello.txt\", timeout=2)'"
ready_timeout_s = 30

[[files]]
dest = "/opt/app/hello.txt"
content = "hello from the file\n"
"#;

/// Submits a build and follows its log to the end: (status at submit, the final `done`
/// status, every log line).
async fn build(d: &Daemon, name: &str, key: &str, spec: &str) -> (StatusCode, Value, Vec<String>) {
    let resp = d
        .req(
            Method::POST,
            &format!("/v1/sandbox/images/builds?name={name}"),
            key,
        )
        .header("content-type", "application/toml")
        .body(spec.to_string())
        .send()
        .await
        .expect("build request");
    let status = resp.status();
    let submitted: Value = resp.json().await.unwrap_or(Value::Null);
    if status != StatusCode::ACCEPTED {
        return (status, submitted, Vec::new());
    }
    assert_eq!(submitted["state"], "queued", "{submitted}");
    let id = submitted["build_id"].as_str().unwrap();
    let (lines, done) = logs_of(d, id).await;
    let (s, polled) = d
        .json_as(
            ADMIN,
            Method::GET,
            &format!("/v1/sandbox/images/builds/{id}"),
            Value::Null,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{polled}");
    assert_eq!(polled["state"], done["state"], "{polled}");
    (status, done, lines)
}

/// Asserts a build failed as a whole (not a step), saying `why`.
fn failed_with(build: &Value, why: &str) {
    assert_eq!(
        build["error"]["code"], "SANDBOX-IMAGE-BUILD-FAILED",
        "{build}"
    );
    let message = build["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(why), "{build}");
}

fn step_statuses(build: &Value) -> Vec<&str> {
    build["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["status"].as_str().unwrap())
        .collect()
}

async fn template_daemon() -> Daemon {
    template_daemon_with("").await
}

/// A template daemon whose config has `extra` (TOML lines) after the build settings of its
/// `[images]` table: more of its keys, or further tables.
async fn template_daemon_with(extra: &str) -> Daemon {
    let mut d = Daemon::start(&format!(
        "{BASE_CONFIG}\n{BUILD_CONFIG}{extra}[auth]\nadmin_keys = [\"{ADMIN}\"]\n"
    ))
    .await;
    d.stop();
    let (cache, _) = pack_cache(Pack::Python);
    ImageStore::open(&d.data_dir().join("images"))
        .unwrap()
        .link_from(&cache, "python")
        .expect("link the python pack");
    d.launch().await;
    d
}

#[tokio::test(flavor = "multi_thread")]
async fn a_template_builds_in_jails_caches_its_steps_and_its_sessions_start_ready() {
    let Some(()) = root_or_skip() else { return };
    let d = template_daemon().await;

    let (status, e, _) = build(&d, "app", KEY1, TEMPLATE).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a tenant key builds: {e}");
    let (status, e, _) = build(
        &d,
        "app",
        ADMIN,
        "base = \"python\"\npip = [\"--index-url=x\"]",
    )
    .await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::BAD_REQUEST, "SANDBOX-IMAGE-BUILD-INVALID-SPEC"),
        "{e}"
    );

    let (status, built, log) = build(&d, "app", ADMIN, TEMPLATE).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(built["state"], "succeeded", "{built}\n{}", log.join("\n"));
    assert_eq!(
        step_statuses(&built),
        ["built", "built", "built", "built"],
        "{built}"
    );
    let text = log.join("\n");
    assert!(text.contains("step 1/4: apt hello"), "{text}");
    assert!(text.contains("Setting up hello"), "{text}");
    assert!(text.contains("step 2/4: pip six"), "{text}");
    assert!(text.contains("Successfully installed six"), "{text}");

    // Sessions on it: the Debian package, the file, the env, and the server the start command
    // runs, answering before the session was handed out; the image's files are the sandbox
    // root's (its lower layer is id-mapped), so a session can change those in its writable
    // directories (in its own upper layer).
    let id = d.create(json!({"image": "app"})).await;
    let v = d
        .exec(
            &id,
            json!({"shell": "hello; dpkg-query -W -f='${Status}\\n' hello; stat -c %U:%G /usr/bin /etc/passwd; \
                              chmod 600 /var/lib/dpkg/status && stat -c %a /var/lib/dpkg/status"}),
        )
        .await;
    assert_eq!(
        v["stdout"].as_str().unwrap_or(""),
        "Hello, world!\ninstall ok installed\nroot:root\nroot:root\n600\n",
        "{v}"
    );
    let v = d
        .exec(
            &id,
            json!({"shell": "python3 -c 'import six; print(six.__name__)'; cat /opt/app/hello.txt /opt/app/built.txt; \
                              echo \"$GREETING\"; \
                              python3 -c 'import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:8000/hello.txt\").read().decode(), end=\"\")'; \
                              pwd"}),
        )
        .await;
    assert_eq!(
        v["stdout"].as_str().unwrap_or(""),
        "six\nhello from the file\nbuilt\nhello from the template\nhello from the file\n/opt/app\n",
        "execs start in the image's working directory: {v}"
    );
    // Restored onto a new sandbox, the session runs its image's start command again, ready
    // before the restore answers.
    let (status, snap) = d
        .json(
            Method::POST,
            &format!("/v1/sandbox/sessions/{id}/snapshot"),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{snap}");
    let (status, v) = d
        .json(
            Method::POST,
            &format!("/v1/sandbox/sessions/{id}/restore"),
            json!({"snapshot_id": snap["snapshot_id"]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let v = d
        .exec(
            &id,
            json!({"shell": "python3 -c 'import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:8000/hello.txt\").read().decode(), end=\"\")'"}),
        )
        .await;
    assert_eq!(v["stdout"], "hello from the file\n", "{v}");
    // The mirror is the build's alone: a session with network open cannot reach it.
    let open = d
        .create(json!({"image": "app", "network": {"mode": "open"}}))
        .await;
    let v = d
        .exec(
            &open,
            json!({"shell": "python3 -c 'import urllib.request as u; u.urlopen(\"https://pypi.org/simple/six/\", timeout=5)' 2>/dev/null && echo reached || echo refused"}),
        )
        .await;
    assert_eq!(v["stdout"], "refused\n", "{v}");

    // The same spec again: every step found, nothing rerun, the same image.
    let (_, again, log) = build(&d, "app", ADMIN, TEMPLATE).await;
    assert_eq!(again["state"], "succeeded", "{again}");
    assert_eq!(
        step_statuses(&again),
        ["cached", "cached", "cached", "cached"],
        "{again}"
    );
    assert_eq!(again["digest"], built["digest"]);
    assert_eq!(
        log.iter().filter(|l| l.ends_with(": cached")).count(),
        4,
        "{log:?}"
    );
    assert!(
        !log.iter().any(|l| l.contains("Successfully installed")),
        "{log:?}"
    );

    // The last step changed: only it runs.
    let changed = TEMPLATE.replace("echo built", "echo rebuilt");
    let (_, rebuilt, _) = build(&d, "app2", ADMIN, &changed).await;
    assert_eq!(
        step_statuses(&rebuilt),
        ["cached", "cached", "cached", "built"],
        "{rebuilt}"
    );

    // A failing step: which one, its output, and no image.
    let failing = TEMPLATE.replace(
        "run = [\"echo built > /opt/app/built.txt\"]",
        "run = [\"echo about to fail; exit 3\"]",
    );
    let (_, failed, _) = build(&d, "broken", ADMIN, &failing).await;
    assert_eq!(failed["state"], "failed", "{failed}");
    assert_eq!(failed["failed_step"], 3, "{failed}");
    assert_eq!(failed["error"]["code"], "SANDBOX-IMAGE-BUILD-STEP-FAILED");
    let message = failed["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("step 4") && message.contains("exited with 3"),
        "{message}"
    );
    assert!(message.contains("about to fail"), "{message}");
    let (status, _) = d
        .json(Method::GET, "/v1/sandbox/images/broken", Value::Null)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let tmp = d.data_dir().join("images/store/.tmp");
    assert_eq!(
        std::fs::read_dir(tmp).unwrap().count(),
        0,
        "half image left"
    );

    // A ready command that never passes: a typed error, and no session.
    let never =
        "base = \"python\"\nstart = \"sleep 600\"\nready = \"false\"\nready_timeout_s = 2\n";
    let (_, slow, _) = build(&d, "never", ADMIN, never).await;
    assert_eq!(slow["state"], "succeeded", "{slow}");
    let (status, e) = d
        .json(
            Method::POST,
            "/v1/sandbox/sessions",
            json!({"image": "never"}),
        )
        .await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::SERVICE_UNAVAILABLE, "SANDBOX-IMAGE-NOT-READY"),
        "{e}"
    );
    let (_, list) = d
        .json(Method::GET, "/v1/sandbox/sessions", Value::Null)
        .await;
    let images: Vec<&str> = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["state"] == "running")
        .map(|s| s["image"].as_str().unwrap())
        .collect();
    assert_eq!(images, ["app", "app"], "{list}");
}

/// A warm pool on a template image: its sandboxes ran the start command and passed the ready
/// command before they were pooled, so a create from the pool has the server up at once.
#[tokio::test(flavor = "multi_thread")]
async fn a_warm_pool_on_a_template_starts_and_readies_before_hand_out() {
    let Some(()) = root_or_skip() else { return };
    let mut d = Daemon::start(&format!(
        "[sessions]\nreap_interval = 0.2\npool = {{ python = 1 }}\n{BUILD_CONFIG}\
         language_packs = {{ python = \"app\" }}\n[auth]\nadmin_keys = [\"{ADMIN}\"]\n"
    ))
    .await;
    d.stop();
    let (cache, _) = pack_cache(Pack::Python);
    ImageStore::open(&d.data_dir().join("images"))
        .unwrap()
        .link_from(&cache, "python")
        .expect("link the python pack");
    d.launch().await;
    let spec = TEMPLATE
        .replace("pip = [\"six\"]\n", "")
        .replace("apt = [\"hello\"]\n", "");
    let (_, built, log) = build(&d, "app", ADMIN, &spec).await;
    assert_eq!(built["state"], "succeeded", "{built}\n{}", log.join("\n"));
    // The pool's image is read at start.
    d.stop();
    d.launch().await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !d
        .metrics()
        .await
        .contains("koder_pool_ready{image=\"app\",language=\"python\"} 1")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the pool never filled"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let id = d.create(json!({"language": "python"})).await;
    assert!(
        d.metrics()
            .await
            .contains("koder_sessions_created_total{source=\"pool\"} 1"),
        "not from the pool"
    );
    let v = d
        .exec(
            &id,
            json!({"shell": "python3 -c 'import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:8000/hello.txt\").read().decode(), end=\"\")'"}),
        )
        .await;
    assert_eq!(v["stdout"], "hello from the file\n", "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_images_user_may_be_an_account_a_step_adds() {
    let Some(()) = root_or_skip() else { return };
    let d = template_daemon().await;
    let spec = "base = \"python\"\nrun = [\"useradd -m -d /srv/app app\", \
                \"groupadd -g 2345 devs && usermod -aG devs app && install -d -m 0770 -g devs /srv/shared\"]\n\
                user = \"app\"\n\
                start = \"whoami > /tmp/started-by; echo $HOME >> /tmp/started-by\"\n";
    let (_, built, log) = build(&d, "acct", ADMIN, spec).await;
    assert_eq!(built["state"], "succeeded", "{built}\n{}", log.join("\n"));
    let id = d.create(json!({"image": "acct"})).await;
    let r = d.exec(&id, json!({"shell": "cat /tmp/started-by"})).await;
    assert_eq!(
        r["stdout"], "app\n/srv/app\n",
        "the start command runs as the image's user: {r}"
    );
    let r = d
        .exec(&id, json!({"shell": "id -un; pwd", "user": "app"}))
        .await;
    assert_eq!(
        r["stdout"].as_str().unwrap().lines().next(),
        Some("app"),
        "{r}"
    );
    // Its supplementary groups, as a login gives them: a directory of one is its to write,
    // through an exec and through the agent's sudo alike.
    let r = d
        .exec(
            &id,
            json!({"shell": "id -Gn; touch /srv/shared/mine && echo wrote", "user": "app"}),
        )
        .await;
    assert_eq!(r["stdout"], "app devs\nwrote\n", "{r}");
    let r = d
        .exec(
            &id,
            json!({"shell": "sudo -u app sh -c 'id -Gn; touch /srv/shared/too && echo wrote'"}),
        )
        .await;
    assert_eq!(r["stdout"], "app devs\nwrote\n", "{r}");
    // Groups the sandbox changes count from its next process on; one it cannot map is left
    // out rather than failing the process.
    d.exec(&id, json!({"shell": "groupadd -g 2346 late && usermod -aG late app && echo 'far:x:99999:app' >> /etc/group"}))
        .await;
    let r = d.exec(&id, json!({"shell": "id -G", "user": "app"})).await;
    let gid = sh(&d, &id, "id -g app").await;
    assert_eq!(r["stdout"], format!("{} 2345 2346\n", gid.trim()), "{r}");

    let ghost = "base = \"python\"\nrun = [\"true\"]\nuser = \"ghost\"\n";
    let (_, failed, _) = build(&d, "ghost", ADMIN, ghost).await;
    assert_eq!(failed["state"], "failed", "{failed}");
    failed_with(&failed, "\"ghost\" is no account");
    let (status, refused, _) = build(&d, "bad", ADMIN, "base = \"python\"\nuser = \"-rf\"\n").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
}

/// The log of build `id` as its SSE stream gives it: the lines and the `done` status.
async fn logs_of(d: &Daemon, id: &str) -> (Vec<String>, Value) {
    let resp = d
        .req(
            Method::GET,
            &format!("/v1/sandbox/images/builds/{id}/logs"),
            ADMIN,
        )
        .send()
        .await
        .expect("logs request");
    assert_eq!(resp.status(), StatusCode::OK);
    let events = read_sse(resp).await;
    let lines = events
        .iter()
        .filter(|e| e.name == "log")
        .map(|e| e.data["line"].as_str().unwrap_or_default().to_string())
        .collect();
    let done = events
        .iter()
        .find(|e| e.name == "done")
        .expect("a done event");
    (lines, done.data.clone())
}

/// A build's status and log outlive the daemon that ran it; a build its daemon was killed
/// during is failed at the next start (its sandbox is gone), not left running for ever.
#[tokio::test(flavor = "multi_thread")]
async fn builds_outlive_their_daemon_and_one_it_died_during_fails() {
    let Some(()) = root_or_skip() else { return };
    let mut d = template_daemon().await;
    let spec = "base = \"python\"\nrun = [\"echo quick build\"]\n";
    let (_, quick, lines) = build(&d, "quick", ADMIN, spec).await;
    assert_eq!(quick["state"], "succeeded", "{quick}");
    let quick_id = quick["build_id"].as_str().unwrap().to_string();

    let resp = d
        .req(Method::POST, "/v1/sandbox/images/builds?name=slow", ADMIN)
        .header("content-type", "application/toml")
        .body("base = \"python\"\nrun = [\"echo begun; sleep 600\"]\n")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let slow_id = resp.json::<Value>().await.unwrap()["build_id"]
        .as_str()
        .unwrap()
        .to_string();
    let path = format!("/v1/sandbox/images/builds/{slow_id}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (_, b) = d.json_as(ADMIN, Method::GET, &path, Value::Null).await;
        // The step's own output line, not its heading (which names the command too and
        // is logged before the step is marked running).
        let ran = |l: &str| l.trim() == "begun";
        if b["log_tail"].as_str().unwrap_or_default().lines().any(ran) {
            assert_eq!(b["state"], "running", "{b}");
            assert_eq!(step_statuses(&b), ["running"], "{b}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the step never ran: {b}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // A running step's output is recorded as it grows, not only when the step ends.
    let records = koder_store::Store::open_sqlite(&d.data_dir().join("state.db"))
        .await
        .expect("open the daemon's store");
    loop {
        let recorded = records
            .get_build(&slow_id)
            .await
            .unwrap()
            .expect("recorded");
        if recorded
            .status
            .log_tail
            .lines()
            .any(|l| l.trim() == "begun")
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the step's output was never recorded: {:?}",
            recorded.status
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    drop(records);
    d.crash();
    d.launch().await;

    let quick_path = format!("/v1/sandbox/images/builds/{quick_id}");
    let (status, again) = d
        .json_as(ADMIN, Method::GET, &quick_path, Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again, quick, "the status as it ended");
    let (replayed, done) = logs_of(&d, &quick_id).await;
    assert_eq!(replayed, lines, "the whole log");
    assert_eq!(done, quick);

    let (status, slow) = d.json_as(ADMIN, Method::GET, &path, Value::Null).await;
    assert_eq!(status, StatusCode::OK, "{slow}");
    assert_eq!(slow["state"], "failed", "{slow}");
    assert_eq!(slow["failed_step"], 0, "{slow}");
    assert_eq!(step_statuses(&slow), ["failed"], "{slow}");
    failed_with(&slow, "daemon stopped");
    assert!(slow["finished_at"].is_string(), "{slow}");
    let (replayed, done) = logs_of(&d, &slow_id).await;
    assert!(replayed.iter().any(|l| l == "begun"), "{replayed:?}");
    assert!(
        replayed.last().unwrap().contains("daemon stopped"),
        "{replayed:?}"
    );
    assert_eq!(done, slow);
    let (status, _) = d
        .json_as(ADMIN, Method::GET, "/v1/sandbox/images/slow", Value::Null)
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "no image of the stopped build"
    );
    let (status, e) = d
        .json_as(
            ADMIN,
            Method::GET,
            "/v1/sandbox/images/builds/bld-unknown",
            Value::Null,
        )
        .await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::NOT_FOUND, "SANDBOX-IMAGE-BUILD-NOT-FOUND")
    );
}

/// A step is sandbox code, and so is the layer it leaves: one that replaces `/etc` by a
/// symlink to a host directory gets a tree whose link the daemon, finishing the step's image
/// as host root, must never follow (it writes the image's accounts there). The host's
/// directory stays as it was.
#[tokio::test(flavor = "multi_thread")]
async fn a_step_linking_etc_out_of_its_tree_changes_nothing_on_the_host() {
    let Some(()) = root_or_skip() else { return };
    let d = template_daemon().await;
    let host = tempfile::tempdir().expect("tempdir");
    let files = ["passwd", "group", "shadow", "hosts", "kept"];
    for f in files {
        std::fs::write(host.path().join(f), "the host's own\n").unwrap();
    }
    let spec = format!(
        "base = \"python\"\nrun = [\"rm -rf /etc && ln -s {} /etc && echo linked\"]\n",
        host.path().display()
    );
    let (status, built, log) = build(&d, "linked", ADMIN, &spec).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{built}");
    assert_eq!(built["state"], "succeeded", "{built}\n{}", log.join("\n"));
    assert!(
        log.iter().any(|l| l.trim() == "linked"),
        "{}",
        log.join("\n")
    );
    for f in files {
        let path = host.path().join(f);
        assert_eq!(
            std::fs::read_to_string(&path).ok().as_deref(),
            Some("the host's own\n"),
            "{} was changed by the build",
            path.display()
        );
    }
    // Its sessions get an /etc of their own again.
    let id = d.create(json!({"image": "linked"})).await;
    let v = d
        .exec(
            &id,
            json!({"shell": "test -d /etc && ! test -L /etc && cat /etc/hostname"}),
        )
        .await;
    assert_eq!(v["stdout"], "sandbox\n", "{v}");
}

/// `sh` in session `id`, which must exit 0; its stdout.
async fn sh(d: &Daemon, id: &str, script: &str) -> String {
    let r = d.exec(id, json!({ "shell": script })).await;
    assert_eq!(r["exit_code"], 0, "{script}: {r}");
    r["stdout"].as_str().unwrap_or_default().to_string()
}

/// A session's call that must answer `want`.
async fn call(d: &Daemon, method: Method, path: &str, body: Value, want: StatusCode) -> Value {
    let (status, v) = d.json(method, path, body).await;
    assert_eq!(status, want, "{path}: {v}");
    v
}

/// Snapshots session `id`; the snapshot's id.
async fn snapshot(d: &Daemon, id: &str) -> String {
    let path = format!("/v1/sandbox/sessions/{id}/snapshot");
    let v = call(d, Method::POST, &path, json!({}), StatusCode::CREATED).await;
    v["snapshot_id"].as_str().unwrap().to_string()
}

async fn delete_snapshot(d: &Daemon, id: &str) {
    let path = format!("/v1/sandbox/snapshots/{id}");
    call(
        d,
        Method::DELETE,
        &path,
        Value::Null,
        StatusCode::NO_CONTENT,
    )
    .await;
}

async fn resume(d: &Daemon, id: &str) {
    let path = format!("/v1/sandbox/sessions/{id}/resume");
    call(d, Method::POST, &path, Value::Null, StatusCode::OK).await;
}

/// What session `id` shows of the image build it runs on and of the file it wrote.
async fn first_build_and_note(d: &Daemon, id: &str) -> String {
    sh(d, id, "cat /etc/app-build /home/user/note").await
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_and_snapshots_keep_the_build_they_were_made_on_when_the_name_moves() {
    let Some(()) = root_or_skip() else { return };
    let mut d = template_daemon().await;
    let spec = |n: &str| format!("base = \"python\"\nrun = [\"echo {n} > /etc/app-build\"]\n");
    let (_, built, log) = build(&d, "app", ADMIN, &spec("one")).await;
    assert_eq!(built["state"], "succeeded", "{built}\n{}", log.join("\n"));
    let first = built["digest"].as_str().unwrap().to_string();
    let a = d.create(json!({"image": "app"})).await;
    sh(&d, &a, "echo mine > /home/user/note").await;
    let snap = snapshot(&d, &a).await;
    let sessions = "/v1/sandbox/sessions";
    let pause = json!({"memory": false});
    call(
        &d,
        Method::POST,
        &format!("{sessions}/{a}/pause"),
        pause.clone(),
        StatusCode::OK,
    )
    .await;

    // The name moves to a new build: new sessions get it...
    let (_, built, _) = build(&d, "app", ADMIN, &spec("two")).await;
    assert_eq!(built["state"], "succeeded", "{built}");
    assert_ne!(built["digest"], first.as_str());
    let b = d.create(json!({"image": "app"})).await;
    assert_eq!(sh(&d, &b, "cat /etc/app-build").await, "two\n");
    // ...what was made on the first keeps it: resumed, from the snapshot, forked, restored.
    resume(&d, &a).await;
    assert_eq!(first_build_and_note(&d, &a).await, "one\nmine\n");
    let c = d.create(json!({"from_snapshot": snap})).await;
    assert_eq!(first_build_and_note(&d, &c).await, "one\nmine\n");
    let forks = call(
        &d,
        Method::POST,
        &format!("{sessions}/{a}/fork"),
        json!({"count": 1}),
        StatusCode::CREATED,
    )
    .await;
    let f = forks["sessions"][0]["id"].as_str().unwrap();
    assert_eq!(first_build_and_note(&d, f).await, "one\nmine\n");
    call(
        &d,
        Method::POST,
        &format!("{sessions}/{b}/restore"),
        json!({"snapshot_id": snap}),
        StatusCode::OK,
    )
    .await;
    assert_eq!(first_build_and_note(&d, &b).await, "one\nmine\n");

    // Nothing runs on the second build now, and no snapshot was taken on it: it may go.
    let images = "/v1/sandbox/images";
    let v = call(
        &d,
        Method::GET,
        &format!("{images}/app"),
        Value::Null,
        StatusCode::OK,
    )
    .await;
    assert_eq!(v["in_use"], false, "{v}");
    let (status, v) = d
        .json_as(ADMIN, Method::DELETE, &format!("{images}/app"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");

    // The first build, unnamed now, outlives a restart while a paused session and a snapshot
    // need it; the sessions of before were stopped by the restart.
    call(
        &d,
        Method::POST,
        &format!("{sessions}/{a}/pause"),
        pause,
        StatusCode::OK,
    )
    .await;
    d.stop();
    d.launch().await;
    let tree = d.data_dir().join("images/store").join(&first);
    assert!(tree.is_dir(), "the first build was collected");
    resume(&d, &a).await;
    assert_eq!(first_build_and_note(&d, &a).await, "one\nmine\n");
    let e = d.create(json!({"from_snapshot": snap})).await;
    assert_eq!(sh(&d, &e, "cat /etc/app-build").await, "one\n");
    let (status, v) = d
        .json(Method::POST, sessions, json!({"image": "app"}))
        .await;
    assert_eq!(
        (status, error_code(&v)),
        (StatusCode::NOT_FOUND, "SANDBOX-IMAGE-NOT-FOUND"),
        "{v}"
    );

    // Once neither a session nor a snapshot records it, the next start collects it.
    for id in [&a, &e] {
        let path = format!("{sessions}/{id}");
        call(
            &d,
            Method::DELETE,
            &path,
            Value::Null,
            StatusCode::NO_CONTENT,
        )
        .await;
    }
    delete_snapshot(&d, &snap).await;
    d.stop();
    d.launch().await;
    assert!(
        !tree.exists(),
        "the first build outlived everything made on it"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_a_live_snapshot_was_taken_on_is_not_deleted() {
    let Some(()) = root_or_skip() else { return };
    let d = template_daemon().await;
    let (_, built, log) = build(
        &d,
        "snapped",
        ADMIN,
        "base = \"python\"\nrun = [\"true\"]\n",
    )
    .await;
    assert_eq!(built["state"], "succeeded", "{built}\n{}", log.join("\n"));
    let a = d.create(json!({"image": "snapped"})).await;
    let snap = snapshot(&d, &a).await;
    call(
        &d,
        Method::DELETE,
        &format!("/v1/sandbox/sessions/{a}"),
        Value::Null,
        StatusCode::NO_CONTENT,
    )
    .await;
    let image = "/v1/sandbox/images/snapped";
    let v = call(&d, Method::GET, image, Value::Null, StatusCode::OK).await;
    assert_eq!(v["in_use"], true, "{v}");
    let (status, v) = d.json_as(ADMIN, Method::DELETE, image, Value::Null).await;
    assert_eq!(
        (status, error_code(&v)),
        (StatusCode::CONFLICT, "SANDBOX-IMAGE-IN-USE"),
        "{v}"
    );
    assert!(
        v["error"]["message"].as_str().unwrap().contains(&snap),
        "{v}"
    );
    delete_snapshot(&d, &snap).await;
    let (status, v) = d.json_as(ADMIN, Method::DELETE, image, Value::Null).await;
    assert_eq!(status, StatusCode::OK, "{v}");
}

/// `GET /templates/t/files/{hash}` as the tenant of `key`: whether that upload is kept, and
/// where to `PUT` it.
async fn upload_link(d: &Daemon, key: &str, hash: &str) -> (bool, String) {
    let resp = d
        .http
        .get(format!("{}/templates/t/files/{hash}", d.base))
        .header("x-api-key", key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let v: Value = resp.json().await.unwrap();
    (v["present"] == true, v["url"].as_str().unwrap().to_string())
}

/// Uploads an archive of `kib` KiB under `hash` as the tenant of `key`: the status and the
/// answer.
async fn upload(d: &Daemon, key: &str, hash: &str, kib: usize) -> (StatusCode, Value) {
    let (_, url) = upload_link(d, key, hash).await;
    let data = vec![7u8; kib << 10];
    let resp = d
        .http
        .put(url)
        .body(layer(&[E::File("data", &data, 0o644)]))
        .send()
        .await
        .unwrap();
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Marks tenant t1's upload of `hash` as last used `hours` ago.
fn last_used(d: &Daemon, hash: &str, hours: u64) {
    let root = d.data_dir().join("images/e2b-files");
    for ns in std::fs::read_dir(root).unwrap() {
        let path = ns.unwrap().path().join(hash);
        if path.is_file() {
            let when = std::time::SystemTime::now() - std::time::Duration::from_secs(hours * 3600);
            std::fs::File::open(&path)
                .unwrap()
                .set_modified(when)
                .unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenants_template_uploads_are_bounded_and_unused_ones_expire() {
    let Some(()) = root_or_skip() else { return };
    let mut d = Daemon::start(&format!(
        "{BASE_CONFIG}\n[e2b]\ntemplate_files_mib = 1\ntemplate_files_keep_days = 1\n"
    ))
    .await;
    let [a, b, c] = ["a", "b", "c"].map(|x| x.repeat(64));
    assert_eq!(upload(&d, KEY1, &a, 600).await.0, StatusCode::OK);
    // A second one would need the first, just used (a build may be about to read it): refused.
    let (status, v) = upload(&d, KEY1, &b, 600).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    let message = v["message"].as_str().unwrap();
    assert!(
        message.starts_with("SANDBOX-IMAGE-TOO-LARGE") && message.contains("within the last hour"),
        "{v}"
    );
    assert!(upload_link(&d, KEY1, &a).await.0 && !upload_link(&d, KEY1, &b).await.0);
    // Once the first was left unused for a while, it makes room for the next.
    last_used(&d, &a, 2);
    assert_eq!(upload(&d, KEY1, &b, 600).await.0, StatusCode::OK);
    assert!(!upload_link(&d, KEY1, &a).await.0 && upload_link(&d, KEY1, &b).await.0);
    // Larger than all a tenant may keep: refused whatever is there.
    assert_eq!(
        upload(&d, KEY1, &c, 1100).await.0,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    // Another tenant's uploads are bounded on their own.
    assert_eq!(upload(&d, KEY2, &c, 600).await.0, StatusCode::OK);

    // Unused for longer than kept: asking finds none, and the sweep at start removes it.
    last_used(&d, &b, 25);
    assert!(!upload_link(&d, KEY1, &b).await.0);
    assert_eq!(upload(&d, KEY1, &a, 10).await.0, StatusCode::OK);
    last_used(&d, &a, 25);
    d.stop();
    d.launch().await;
    let root = d.data_dir().join("images/e2b-files");
    assert!(
        comes_true(|| walkdir(&root) == [c.clone()]).await,
        "not only the other tenant's upload is left: {:?}",
        walkdir(&root)
    );
}

/// The names of the files under `root`, sorted.
fn walkdir(root: &std::path::Path) -> Vec<String> {
    let mut names = Vec::new();
    for ns in std::fs::read_dir(root).unwrap() {
        for f in std::fs::read_dir(ns.unwrap().path()).unwrap() {
            names.push(f.unwrap().file_name().to_string_lossy().into_owned());
        }
    }
    names.sort();
    names
}

/// Sets a file's mtime `days` back.
fn days_old(path: &std::path::Path, days: u64) {
    let when = std::time::SystemTime::now() - std::time::Duration::from_secs(days * 86_400);
    std::fs::File::open(path)
        .unwrap()
        .set_modified(when)
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn build_steps_no_build_used_for_days_are_collected_at_start() {
    let Some(()) = root_or_skip() else { return };
    let mut d = template_daemon_with("step_cache_days = 1\n").await;
    let spec = "base = \"python\"\nrun = [\"echo cached > /etc/step\"]\n";
    let (_, built, log) = build(&d, "stepped", ADMIN, spec).await;
    assert_eq!(built["state"], "succeeded", "{built}\n{}", log.join("\n"));
    let key = built["steps"][0]["key"].as_str().unwrap();
    let manifest = d
        .data_dir()
        .join("images/store")
        .join(key)
        .join("manifest.json");
    assert!(manifest.is_file(), "{built}");

    // Found by a build, a step counts as used again, and a restart keeps it.
    days_old(&manifest, 2);
    let (_, again, _) = build(&d, "stepped", ADMIN, spec).await;
    assert_eq!(step_statuses(&again), ["cached"], "{again}");
    let age = std::fs::metadata(&manifest)
        .unwrap()
        .modified()
        .unwrap()
        .elapsed()
        .unwrap();
    assert!(
        age.as_secs() < 3600,
        "a cache hit did not mark the step used: {age:?}"
    );
    d.stop();
    d.launch().await;
    assert!(manifest.is_file(), "a step used lately was collected");

    // Unused for longer than kept: the next start collects it. The image it helped make is
    // whole on its own, and the next build runs the step again.
    days_old(&manifest, 2);
    d.stop();
    d.launch().await;
    assert!(!manifest.exists(), "a step unused for days was kept");
    let id = d.create(json!({"image": "stepped"})).await;
    assert_eq!(sh(&d, &id, "cat /etc/step").await, "cached\n");
    let (_, third, _) = build(&d, "stepped", ADMIN, spec).await;
    assert_eq!(step_statuses(&third), ["built"], "{third}");
}

/// An E2B control-plane call as tenant t1: the status and the answer.
async fn e2b_call(d: &Daemon, method: Method, path: &str, body: Value) -> (StatusCode, Value) {
    e2b_call_as(d, KEY1, method, path, body).await
}

async fn e2b_call_as(
    d: &Daemon,
    key: &str,
    method: Method,
    path: &str,
    body: Value,
) -> (StatusCode, Value) {
    let resp = d
        .http
        .request(method, format!("{}{path}", d.base))
        .header("x-api-key", key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Starts building E2B template `name` as tenant `key` on the python pack with one `RUN` of
/// `run`: the start's status and answer, and the build's status path.
async fn e2b_start(d: &Daemon, key: &str, name: &str, run: &str) -> (StatusCode, Value, String) {
    let (start, status_path) = e2b_request(d, key, name).await;
    let (status, v) = e2b_start_at(d, key, &start, run).await;
    (status, v, status_path)
}

/// Requests E2B template `name`'s build as tenant `key`: the paths that start it and that
/// tell its status.
async fn e2b_request(d: &Daemon, key: &str, name: &str) -> (String, String) {
    let new = json!({"name": name});
    let (status, v) = e2b_call_as(d, key, Method::POST, "/v3/templates", new).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let (t, id) = (
        v["templateID"].as_str().unwrap(),
        v["buildID"].as_str().unwrap(),
    );
    (
        format!("/v2/templates/{t}/builds/{id}"),
        format!("/templates/{t}/builds/{id}/status"),
    )
}

/// Starts the requested build at `start` on the python pack with one `RUN` of `run`.
async fn e2b_start_at(d: &Daemon, key: &str, start: &str, run: &str) -> (StatusCode, Value) {
    let steps = json!({"fromImage": "python", "steps": [{"type": "RUN", "args": [run]}]});
    e2b_call_as(d, key, Method::POST, start, steps).await
}

/// The last status of the build at `path` (tenant t1's), once it ended.
async fn e2b_ended(d: &Daemon, path: &str) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let (_, v) = e2b_call(d, Method::GET, path, Value::Null).await;
        if v["status"] == "ready" || v["status"] == "error" {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{path} did not end: {v}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Builds E2B template `name` on the python pack with one `RUN` of `run`: the start's status
/// and answer, and once it ended, the build's last status.
async fn e2b_build(d: &Daemon, name: &str, run: &str) -> (StatusCode, Value) {
    let (status, v, path) = e2b_start(d, KEY1, name, run).await;
    if status != StatusCode::ACCEPTED {
        return (status, v);
    }
    (status, e2b_ended(d, &path).await)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_has_a_bounded_number_of_e2b_builds_under_way() {
    let Some(()) = root_or_skip() else { return };
    let d = template_daemon().await;
    // Six requested builds started at once (one of them twice): four run, the others are
    // refused, however the requests interleave.
    let mut requested = Vec::new();
    for i in 0..6 {
        requested.push(e2b_request(&d, KEY1, &format!("slow{i}")).await);
    }
    let starts = requested
        .iter()
        .chain(&requested[..1])
        .map(|(start, _)| e2b_start_at(&d, KEY1, start, "sleep 2"));
    let answers = futures::future::join_all(starts).await;
    let count = |code: StatusCode| answers.iter().filter(|(s, _)| *s == code).count();
    assert_eq!(
        (
            count(StatusCode::ACCEPTED),
            count(StatusCode::TOO_MANY_REQUESTS) + count(StatusCode::CONFLICT)
        ),
        (4, 3),
        "{answers:?}"
    );
    let under_way: Vec<&String> = requested
        .iter()
        .zip(&answers)
        .filter(|(_, (s, _))| *s == StatusCode::ACCEPTED)
        .map(|((_, status), _)| status)
        .collect();
    let (status, v, _) = e2b_start(&d, KEY1, "more", "true").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert!(v["message"].as_str().unwrap().contains("under way"), "{v}");
    // Another tenant's builds are bounded on their own.
    let (status, v, _) = e2b_start(&d, KEY2, "theirs", "true").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    // Once one of them ended, the next may start.
    let v = e2b_ended(&d, under_way[0]).await;
    assert_eq!(v["status"], "ready", "{v}");
    let (status, v, _) = e2b_start(&d, KEY1, "more", "true").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenants_e2b_templates_hold_a_bounded_number_of_images() {
    let Some(()) = root_or_skip() else { return };
    let d = template_daemon_with("[e2b]\nmax_template_images = 2\n").await;
    for (name, run) in [("one", "echo 1"), ("two", "echo 2")] {
        let (status, v) = e2b_build(&d, name, run).await;
        assert_eq!(
            (status, v["status"].as_str()),
            (StatusCode::ACCEPTED, Some("ready")),
            "{v}"
        );
    }
    // A third image is refused before anything runs...
    let (status, v) = e2b_build(&d, "three", "echo 3").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("hold 2 images"),
        "{v}"
    );
    // ...but a rebuild of a tag moves it to the new image, leaving the old one unnamed.
    let (status, v) = e2b_build(&d, "one", "echo 1 again").await;
    assert_eq!(
        (status, v["status"].as_str()),
        (StatusCode::ACCEPTED, Some("ready")),
        "{v}"
    );
    // Another tenant's templates count on their own.
    let resp = d
        .http
        .post(format!("{}/v3/templates", d.base))
        .header("x-api-key", KEY2)
        .json(&json!({"name": "three"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    // Once a template is deleted there is room again.
    let (status, v) = e2b_call(&d, Method::DELETE, "/templates/two", Value::Null).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{v}");
    let (status, v) = e2b_build(&d, "three", "echo 3").await;
    assert_eq!(
        (status, v["status"].as_str()),
        (StatusCode::ACCEPTED, Some("ready")),
        "{v}"
    );
}
