//! Volumes on microVMs through the real daemon, a real guest (QEMU `microvm`, TCG where there
//! is no usable KVM; the image of `KODER_MICROVM_IMAGES`) and real jails: a guest writes into
//! its volume over virtio-fs as the sandbox uids, the session-less file API reads and writes the
//! same files while the VM runs, a read-only volume refuses writes in the guest and is read-only
//! on the host side of its share too, a second writer is refused, the size quota binds, a
//! symlink to `/` the guest leaves leaks no host file through the file API, and a jail mounting
//! the volume afterwards finds what the guest wrote. One boot.

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const S: &str = "/v1/sandbox/sessions";
const V: &str = "/v1/sandbox/volumes";

fn config() -> String {
    format!("{BASE_CONFIG}\n{}", microvm_section())
}

async fn sh(d: &Daemon, id: &str, script: &str, user: &str) -> Value {
    d.exec(id, json!({ "shell": script, "user": user })).await
}

async fn sh_ok(d: &Daemon, id: &str, script: &str, user: &str) -> String {
    let v = sh(d, id, script, user).await;
    assert_eq!(v["exit_code"], 0, "{script}: {v}");
    v["stdout"].as_str().unwrap_or_default().to_string()
}

async fn new_volume(d: &Daemon, name: &str, size_mib: u64) -> String {
    let (status, v) = d
        .json(Method::POST, V, json!({"name": name, "size_mib": size_mib}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    v["volume_id"].as_str().unwrap_or_default().to_string()
}

async fn get_file(d: &Daemon, volume: &str, path: &str) -> (StatusCode, Vec<u8>) {
    let resp = d
        .req(Method::GET, &format!("{V}/{volume}/files"), KEY1)
        .query(&[("path", path)])
        .send()
        .await
        .expect("download");
    let status = resp.status();
    (status, resp.bytes().await.expect("body").to_vec())
}

async fn put_file(d: &Daemon, volume: &str, path: &str, body: &[u8]) -> StatusCode {
    d.req(Method::PUT, &format!("{V}/{volume}/files"), KEY1)
        .query(&[("path", path)])
        .body(body.to_vec())
        .send()
        .await
        .expect("upload")
        .status()
}

/// The mount options of the root of each virtiofsd serving volume `volume_id`: its sandbox
/// pivots into the share, so the share is its `/`, and nothing else of the host is mounted.
fn share_mount_options(volume_id: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let pid = entry.path();
        let Ok(cmdline) = std::fs::read(pid.join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_server = args.first().is_some_and(|a| a.ends_with("virtiofsd"));
        let serves = args
            .iter()
            .any(|a| a.starts_with("source=") && a.contains(volume_id));
        if !is_server || !serves {
            continue;
        }
        let info = std::fs::read_to_string(pid.join("mountinfo")).unwrap_or_default();
        found.extend(
            info.lines()
                .filter(|l| l.split(' ').nth(4) == Some("/"))
                .filter_map(|l| l.split(' ').nth(5).map(String::from)),
        );
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn microvm_volumes_share_files_with_the_host_and_jails() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(&config()).await;
    let data = new_volume(&d, "data", 16).await;
    let reference = new_volume(&d, "ref", 16).await;
    assert_eq!(
        put_file(&d, "ref", "/given.txt", b"from the host").await,
        StatusCode::CREATED
    );

    let (status, vm) = d
        .json(
            Method::POST,
            S,
            json!({
                "runtime": "microvm",
                "limits": {"memory_mib": 128, "disk_mib": 128},
                "volumes": [
                    {"name": "data", "path": "/data"},
                    {"name": "ref", "path": "/mnt/ref", "read_only": true}
                ]
            }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{vm}");
    assert_eq!(vm["volumes"][1]["read_only"], true, "{vm}");
    let vm = vm["id"].as_str().unwrap_or_default().to_string();

    // The guest writes as the sandbox's uids; the file API reads it while the VM runs.
    let owner = sh_ok(
        &d,
        &vm,
        "echo hi > /data/a.txt && mkdir /data/dir && ln -s / /data/root && \
         ln -s /etc/passwd /data/pw && stat -c %u:%g /data/a.txt",
        "user",
    )
    .await;
    assert_eq!(owner.trim(), "1000:1000");
    assert_eq!(
        get_file(&d, "data", "/a.txt").await,
        (StatusCode::OK, b"hi\n".to_vec())
    );
    // ...and the guest sees what the file API writes, at once.
    assert_eq!(
        put_file(&d, "data", "/dir/b.txt", b"from the api").await,
        StatusCode::CREATED
    );
    assert_eq!(
        sh_ok(
            &d,
            &vm,
            "cat /data/dir/b.txt; stat -c %u /data/dir/b.txt",
            "root"
        )
        .await,
        "from the api1000\n"
    );

    // The guest's symlinks resolve inside the volume, never on the host.
    for path in ["/root/etc/passwd", "/pw", "/root/proc/self/environ"] {
        let (status, body) = get_file(&d, "data", path).await;
        assert_ne!(
            status,
            StatusCode::OK,
            "{path}: {}",
            String::from_utf8_lossy(&body)
        );
    }

    // Read-only: refused in the guest, and read-only on the host side of the share too.
    assert_eq!(
        sh_ok(&d, &vm, "cat /mnt/ref/given.txt", "root").await,
        "from the host"
    );
    let w = sh(&d, &vm, "echo x > /mnt/ref/x", "root").await;
    assert_ne!(w["exit_code"], 0, "{w}");
    assert!(
        w["stderr"].as_str().unwrap_or("").contains("Read-only"),
        "{w}"
    );
    let ro = share_mount_options(&reference);
    assert!(!ro.is_empty(), "no virtiofsd serves the read-only volume");
    for opts in &ro {
        let opts: Vec<&str> = opts.split(',').collect();
        for want in ["ro", "nosuid", "nodev", "noexec"] {
            assert!(opts.contains(&want), "{opts:?}");
        }
    }
    let rw = share_mount_options(&data);
    assert!(
        rw.iter()
            .all(|o| o.starts_with("rw,") && o.contains("nosuid") && o.contains("nodev")),
        "{rw:?}"
    );

    // One writer: a second read-write claim is refused, a reader is not.
    let (status, v) = d
        .json(
            Method::POST,
            S,
            json!({"volumes": [{"name": "data", "path": "/data"}]}),
        )
        .await;
    assert_eq!(
        (status, error_code(&v)),
        (StatusCode::CONFLICT, "SANDBOX-VOLUME-BUSY"),
        "{v}"
    );

    // The size quota binds inside the guest.
    let full = sh(&d, &vm, "head -c 40M /dev/zero > /data/big", "root").await;
    assert_ne!(full["exit_code"], 0, "{full}");
    assert!(
        full["stderr"].as_str().unwrap_or("").contains("No space"),
        "{full}"
    );
    sh_ok(&d, &vm, "rm /data/big", "root").await;

    // A pause keeps the guest's memory in place (a vhost-user device does not migrate) and the
    // volume stays usable after the resume.
    let (status, v) = d
        .json(Method::POST, &format!("{S}/{vm}/pause"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, v) = d
        .json(Method::POST, &format!("{S}/{vm}/resume"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(sh_ok(&d, &vm, "cat /data/a.txt", "user").await, "hi\n");

    // After the VM, a jail mounting the volume finds what the guest wrote, as it wrote it.
    let (status, v) = d
        .json(Method::DELETE, &format!("{S}/{vm}"), Value::Null)
        .await;
    assert!(status.is_success(), "{status}: {v}");
    assert!(
        share_mount_options(&data).is_empty(),
        "virtiofsd outlived its VM"
    );
    let jail = d
        .create(json!({"volumes": [{"name": "data", "path": "/data"}]}))
        .await;
    assert_eq!(
        sh_ok(
            &d,
            &jail,
            "cat /data/a.txt; stat -c %u:%g /data/a.txt; readlink /data/root; cat /data/dir/b.txt",
            "user"
        )
        .await,
        "hi\n1000:1000\n/\nfrom the api"
    );
}
