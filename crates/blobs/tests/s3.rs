//! The S3 backend against a real S3-protocol server on loopback: s3s-fs, installed by
//! `scripts/setup-s3.sh`. Without the binary the test says SKIPPED on stderr and returns.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::*;
use koder_blobs::{BlobConfig, Blobs};

const DEFAULT_BIN: &str = "/var/cache/koder-sandbox-test/s3s/bin/s3s-fs";
const BUCKET: &str = "koder-test";
const PREFIX: &str = "pre/fix";
const KEY_ID: &str = "koder-test-key";
const SECRET: &str = "koder-test-secret";

struct Server {
    child: tokio::process::Child,
    port: u16,
    root: tempfile::TempDir,
}

impl Server {
    async fn start(bin: &Path) -> Server {
        let root = tempfile::tempdir().unwrap();
        // s3s-fs keeps a bucket as a directory of its root: creating it is creating the bucket.
        std::fs::create_dir(root.path().join(BUCKET)).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = tokio::process::Command::new(bin)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", KEY_ID, "--secret-key", SECRET])
            .arg(root.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Server { child, port, root };
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("s3s-fs did not listen on 127.0.0.1:{port}");
    }

    fn config(&self) -> BlobConfig {
        BlobConfig {
            url: Some(format!("s3://{BUCKET}/{PREFIX}")),
            endpoint: Some(format!("http://127.0.0.1:{}", self.port)),
            region: None,
            access_key_id: Some(KEY_ID.into()),
            secret_access_key: Some(SECRET.into()),
            allow_http: true,
        }
    }

    fn object_file(&self, tenant: &str, key: &str) -> PathBuf {
        self.root
            .path()
            .join(BUCKET)
            .join(PREFIX)
            .join("tenants")
            .join(tenant)
            .join(key)
    }

    /// Parts of multipart uploads that were neither completed nor aborted.
    fn pending_parts(&self) -> Vec<String> {
        std::fs::read_dir(self.root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".upload_id-"))
            .collect()
    }
}

#[tokio::test]
async fn s3_backend() {
    let bin = std::env::var_os("S3S_FS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| DEFAULT_BIN.into());
    if !bin.exists() {
        // Straight to the process's stderr: the harness captures `eprintln!` of passing tests.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: s3_backend: no S3 test server at {} (run scripts/setup-s3.sh)",
            bin.display()
        );
        return;
    }
    let mut server = Server::start(&bin).await;
    let data_dir = tempfile::tempdir().unwrap();
    let blobs = Blobs::open(&server.config(), data_dir.path())
        .await
        .unwrap();

    round_trip(&blobs).await;
    writer_round_trip(&blobs).await;
    not_found_and_delete(&blobs).await;
    hostile(&blobs).await;
    isolation(&blobs).await;
    checksum(&blobs, |t, k| server.object_file(t, k)).await;
    interrupted(&blobs).await;
    in_progress(&blobs).await;
    // Cancelled and failed uploads were aborted on the server, not left as parts (the abort
    // of a dropped future runs in the background: give it a moment).
    let mut pending = server.pending_parts();
    for _ in 0..50 {
        if pending.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        pending = server.pending_parts();
    }
    assert_eq!(pending, Vec::<String>::new());
    // Nothing was written beside the prefix, and the local data dir stays untouched.
    let top: Vec<_> = std::fs::read_dir(server.root.path().join(BUCKET))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(top, vec!["pre"]);
    assert_eq!(std::fs::read_dir(data_dir.path()).unwrap().count(), 0);
    // S3 keeps no staging objects this crate could see; the sweep has nothing to do.
    assert_eq!(blobs.sweep_incomplete().await.unwrap(), 0);

    // Wrong credentials are refused, not ignored.
    let wrong = BlobConfig {
        secret_access_key: Some("wrong".into()),
        ..server.config()
    };
    let other = Blobs::open(&wrong, data_dir.path()).await.unwrap();
    assert!(other.list("rt").await.is_err());

    server.child.kill().await.unwrap();
}
