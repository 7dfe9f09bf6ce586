//! MicroVMs on store images through the real daemon and real guests (QEMU `microvm`, TCG on
//! hosts without usable hardware KVM), the kernel from `KODER_MICROVM_IMAGES`, the python pack
//! linked from `KODER_PACK_CACHE`: a warm pool naming the pack builds its root disk before any
//! create, every VM on the pack shares that one disk and runs the pack's own python with the
//! manifest's environment and workdir; a template's start command serves HTTP and its ready
//! command gates the VM's hand-out; a VM on the template pauses with its memory and resumes on
//! the same disk, also after a restart during which its image lost its name; an image a VM runs
//! on is not deleted, and its disk goes with it once it is.
//! Three boots in all (guests are slow under TCG).

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use koder_image::packs::Pack;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const S: &str = "/v1/sandbox/sessions";
const ADMIN: &str = "admin-key-0123456789";
/// The root disk's file name in the store (`koder_microvm::disk`).
fn disk_of(d: &Daemon, digest: &str) -> PathBuf {
    d.data_dir()
        .join("images/store")
        .join(digest)
        .join("derived")
        .join(koder_microvm::disk::disk_name())
}

/// A template on the python pack: a file, env, a workdir, a start command serving the
/// workdir over HTTP and a ready command waiting for it (TCG guests start python slowly).
const TEMPLATE: &str = r#"
base = "python"
env = { GREETING = "hello from the template" }
workdir = "/opt/app"
run = ["echo built > /opt/app/built.txt"]
start = "exec python3 -m http.server 8000 --bind 127.0.0.1"
ready = "python3 -c 'import urllib.request as u; u.urlopen(\"http://127.0.0.1:8000/hello.txt\", timeout=5)'"
ready_timeout_s = 180

[[files]]
dest = "/opt/app/hello.txt"
content = "hello from the file\n"
"#;

const FETCH: &str = "python3 -c 'import urllib.request as u; \
                     print(u.urlopen(\"http://127.0.0.1:8000/hello.txt\").read().decode(), end=\"\")'";

async fn sh(d: &Daemon, id: &str, script: &str) -> String {
    let v = d.exec(id, json!({ "shell": script })).await;
    assert_eq!(v["exit_code"], 0, "{script}: {v}");
    v["stdout"].as_str().unwrap_or_default().to_string()
}

async fn image(d: &Daemon, name: &str) -> Value {
    let (status, v) = d
        .json(
            Method::GET,
            &format!("/v1/sandbox/images/{name}"),
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v
}

/// Builds `spec` as `name` (jail steps) and waits for the build to end.
async fn build(d: &Daemon, name: &str, spec: &str) -> Value {
    let resp = d
        .req(
            Method::POST,
            &format!("/v1/sandbox/images/builds?name={name}"),
            ADMIN,
        )
        .header("content-type", "application/toml")
        .body(spec.to_string())
        .send()
        .await
        .expect("build request");
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let submitted: Value = resp.json().await.unwrap();
    let id = submitted["build_id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let (status, b) = d
            .json_as(
                ADMIN,
                Method::GET,
                &format!("/v1/sandbox/images/builds/{id}"),
                Value::Null,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{b}");
        if b["state"] == "succeeded" || b["state"] == "failed" {
            return b;
        }
        assert!(Instant::now() < deadline, "build did not end: {b}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The root disk each VM of the daemon was launched on (its `vm.json`).
fn vm_disks(d: &Daemon) -> Vec<PathBuf> {
    let mut disks: Vec<PathBuf> = std::fs::read_dir(d.data_dir().join("microvm/vms"))
        .map(|r| r.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default()
        .iter()
        .filter_map(|dir| std::fs::read(dir.join("vm.json")).ok())
        .map(|raw| {
            let v: Value = serde_json::from_slice(&raw).unwrap();
            PathBuf::from(v["launch"]["root_disk"].as_str().unwrap())
        })
        .collect();
    disks.sort();
    disks
}

async fn wait_for_metric(d: &Daemon, line: &str) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while !d.metrics().await.contains(line) {
        assert!(Instant::now() < deadline, "never: {line}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn inode(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .ino()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn microvms_boot_packs_and_templates_from_one_shared_disk_each() {
    let Some(()) = root_or_skip() else { return };
    let mut d = Daemon::start(&format!(
        "[sessions]\nreap_interval = 0.2\npool = {{}}\nmicrovm_pool = {{ python = 1 }}\n\
         [images]\nlanguage_packs = {{ python = \"python\" }}\n\
         [auth]\nadmin_keys = [\"{ADMIN}\"]\n{}",
        microvm_section()
    ))
    .await;
    d.stop();
    let pack = link_pack(&d, Pack::Python);
    let python_disk = disk_of(&d, &pack.manifest.digest);
    d.launch().await;

    // The warm pool names the pack: its disk is built before any create asks for it.
    wait_for_metric(
        &d,
        "koder_pool_ready{image=\"python\",language=\"python\"} 1",
    )
    .await;
    assert!(python_disk.is_file(), "no disk built ahead for the pool");
    let ino = inode(&python_disk);

    let id = d
        .create(json!({"runtime": "microvm", "language": "python"}))
        .await;
    assert!(
        d.metrics()
            .await
            .contains("koder_sessions_created_total{source=\"pool\"} 1"),
        "not from the pool"
    );
    // The pack's python (the host's has Debian's EXTERNALLY-MANAGED marker, the pack none)
    // in a guest without the host's /usr, in the manifest's workdir with its environment.
    let out = sh(
        &d,
        &id,
        "uname -r; test -e /usr/bin/qemu-system-x86_64 && echo host-usr || echo own-usr; \
         python3 -c 'import os, sys, sysconfig; \
         print(sys.version_info[:2], os.path.exists(sysconfig.get_path(\"stdlib\") + \"/EXTERNALLY-MANAGED\"))'; \
         pwd",
    )
    .await;
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].contains("cloud-amd64"), "not a guest: {out}");
    let manifest = image(&d, "python").await;
    assert_eq!(
        lines[1..],
        [
            "own-usr",
            "(3, 11) False",
            manifest["workdir"].as_str().unwrap()
        ],
        "{out}"
    );
    let env = manifest["env"].as_object().unwrap();
    assert!(env.contains_key("PATH"), "{manifest}");
    for (name, value) in env {
        let v = d.exec(&id, json!({"cmd": ["printenv", name]})).await;
        assert_eq!(
            v["stdout"],
            format!("{}\n", value.as_str().unwrap()),
            "{name}"
        );
    }

    // The pool refilled: two VMs, one disk, the same file (never rebuilt).
    let deadline = Instant::now() + Duration::from_secs(300);
    while vm_disks(&d).len() < 2 {
        assert!(Instant::now() < deadline, "the pool did not refill");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(vm_disks(&d), [python_disk.clone(), python_disk.clone()]);
    assert_eq!(inode(&python_disk), ino);

    // A template: start and ready before the VM is handed out, in the image's workdir.
    let built = build(&d, "web", TEMPLATE).await;
    assert_eq!(built["state"], "succeeded", "{built}");
    let web = image(&d, "web").await;
    let web_disk = disk_of(&d, web["digest"].as_str().unwrap());
    assert!(!web_disk.exists(), "built before any VM needed it");
    let web_id = d
        .create(json!({"runtime": "microvm", "image": "web"}))
        .await;
    assert!(web_disk.is_file());
    // Execs start in the image's workdir, and may write there.
    let served =
        format!("pwd; echo w > w.txt && cat w.txt; cat built.txt; echo \"$GREETING\"; {FETCH}");
    assert_eq!(
        sh(&d, &web_id, &served).await,
        "/opt/app\nw\nbuilt\nhello from the template\nhello from the file\n"
    );

    // An image a VM runs on is not deleted (nor the pool's).
    for name in ["web", "python"] {
        let (status, e) = d
            .json_as(
                ADMIN,
                Method::DELETE,
                &format!("/v1/sandbox/images/{name}"),
                Value::Null,
            )
            .await;
        assert_eq!(
            (status, error_code(&e)),
            (StatusCode::CONFLICT, "SANDBOX-IMAGE-IN-USE"),
            "{name}: {e}"
        );
    }

    // Paused with its memory and resumed: the saved VM comes back on the template's disk,
    // its files there. A paused VM's image is not deleted either.
    let (status, v) = d
        .json(
            Method::POST,
            &format!("{S}/{web_id}/pause"),
            json!({"memory": true}),
        )
        .await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("paused")),
        "{v}"
    );
    let (status, e) = d
        .json_as(ADMIN, Method::DELETE, "/v1/sandbox/images/web", Value::Null)
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{e}");
    // Its name gone meanwhile (moved to a rebuild, say), the build it runs on outlives a
    // restart while the paused session records it, and the VM resumes on it.
    d.stop();
    let store = koder_image::ImageStore::open(&d.data_dir().join("images")).unwrap();
    assert!(store.unname("web").unwrap());
    d.launch().await;
    assert!(web_disk.is_file(), "the paused VM's disk was collected");
    let (status, v) = d
        .json(Method::POST, &format!("{S}/{web_id}/resume"), Value::Null)
        .await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("running")),
        "{v}"
    );
    assert!(vm_disks(&d).contains(&web_disk), "{:?}", vm_disks(&d));
    // The start command's server outlived the agent connection the save ended: it still
    // answers.
    assert_eq!(sh(&d, &web_id, "cat /opt/app/built.txt").await, "built\n");
    assert_eq!(sh(&d, &web_id, FETCH).await, "hello from the file\n");
    store
        .set_name("web", web["digest"].as_str().unwrap())
        .unwrap();

    // Once no session runs on it, the template goes, its disk with it.
    let (status, _) = d
        .json(Method::DELETE, &format!("{S}/{web_id}"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, e) = d
        .json_as(ADMIN, Method::DELETE, "/v1/sandbox/images/web", Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK, "{e}");
    assert!(!web_disk.exists(), "the disk outlived its image");
    let tmp = d.data_dir().join("images/store/.tmp");
    assert_eq!(std::fs::read_dir(tmp).unwrap().count(), 0, "scratch left");
}
