//! The local-directory backend: the shared checks plus what only a directory shows (modes,
//! staging files, a crashed upload).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use koder_blobs::{BlobConfig, BlobError, Blobs};

async fn open(data_dir: &Path) -> Blobs {
    Blobs::open(&BlobConfig::default(), data_dir).await.unwrap()
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .map(|e| e.into_path())
        .collect()
}

fn staging_files(dir: &Path) -> Vec<PathBuf> {
    files_under(dir)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains('#'))
        .collect()
}

/// Staging files of dropped uploads go in the background: give that a moment.
async fn wait_no_staging(dir: &Path) {
    for _ in 0..50 {
        if staging_files(dir).is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("staging files left: {:?}", staging_files(dir));
}

#[tokio::test]
async fn default_dir_is_private() {
    let tmp = tempfile::tempdir().unwrap();
    open(tmp.path()).await;
    let mode = std::fs::metadata(tmp.path().join("blobs"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);

    // A configured directory that exists with a loose mode is tightened.
    let dir = tmp.path().join("configured");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cfg = BlobConfig {
        url: Some(format!("file://{}", dir.display())),
        ..Default::default()
    };
    let blobs = Blobs::open(&cfg, tmp.path()).await.unwrap();
    blobs.put("t", "k", chunks(b"x", 1)).await.unwrap();
    assert!(dir.join("tenants/t/k").is_file());
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
}

#[tokio::test]
async fn bad_config() {
    let tmp = tempfile::tempdir().unwrap();
    for cfg in [
        BlobConfig {
            url: Some("file://relative/dir".into()),
            ..Default::default()
        },
        BlobConfig {
            url: Some("ftp://x".into()),
            ..Default::default()
        },
        BlobConfig {
            url: Some("s3:///prefix".into()),
            ..Default::default()
        },
        BlobConfig {
            url: Some("s3://bucket".into()),
            access_key_id: Some("id".into()),
            ..Default::default()
        },
        BlobConfig {
            url: Some(format!("file://{}", tmp.path().display())),
            allow_http: true,
            ..Default::default()
        },
    ] {
        match Blobs::open(&cfg, tmp.path()).await {
            Err(BlobError::Config(_)) => {}
            Err(e) => panic!("{cfg:?}: {e:?}"),
            Ok(_) => panic!("{cfg:?} accepted"),
        }
    }
    let parsed: BlobConfig =
        serde_json::from_str(r#"{"url":"s3://b/p","allow_http":true}"#).unwrap();
    assert_eq!(parsed.url.as_deref(), Some("s3://b/p"));
    assert!(serde_json::from_str::<BlobConfig>(r#"{"urll":"x"}"#).is_err());
}

#[tokio::test]
async fn round_trip_20mib() {
    let tmp = tempfile::tempdir().unwrap();
    round_trip(&open(tmp.path()).await).await;
}

#[tokio::test]
async fn blocking_writer() {
    let tmp = tempfile::tempdir().unwrap();
    writer_round_trip(&open(tmp.path()).await).await;
    wait_no_staging(tmp.path()).await;
}

#[tokio::test]
async fn not_found_and_idempotent_delete() {
    let tmp = tempfile::tempdir().unwrap();
    not_found_and_delete(&open(tmp.path()).await).await;
}

#[tokio::test]
async fn hostile_names_never_escape() {
    let tmp = tempfile::tempdir().unwrap();
    let blobs = open(tmp.path()).await;
    hostile(&blobs).await;
    limits(&blobs).await;
    // Nothing was created anywhere: neither beside the blob directory nor inside it.
    let entries: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(entries, vec!["blobs"]);
    assert_eq!(files_under(tmp.path()), Vec::<PathBuf>::new());
}

#[tokio::test]
async fn tenants_are_isolated() {
    let tmp = tempfile::tempdir().unwrap();
    isolation(&open(tmp.path()).await).await;
}

#[tokio::test]
async fn corruption_is_detected() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("blobs");
    checksum(&open(tmp.path()).await, |t, k| {
        root.join("tenants").join(t).join(k)
    })
    .await;
}

#[tokio::test]
async fn interrupted_put_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    interrupted(&open(tmp.path()).await).await;
    wait_no_staging(tmp.path()).await;
}

#[tokio::test]
async fn upload_in_progress_is_invisible() {
    let tmp = tempfile::tempdir().unwrap();
    in_progress(&open(tmp.path()).await).await;
    wait_no_staging(tmp.path()).await;
}

/// A daemon dies mid-upload (nothing runs its clean-up: the future is leaked); the next one
/// never shows the staging file and sweeps it.
#[tokio::test]
async fn crashed_upload_is_swept() {
    let tmp = tempfile::tempdir().unwrap();
    let crashed = open(tmp.path()).await;
    let mut put = Box::pin(crashed.put("cr", "snap", stalling_body()));
    assert!(tokio::time::timeout(Duration::from_secs(1), &mut put)
        .await
        .is_err());
    std::mem::forget(put);
    let staged = staging_files(tmp.path());
    assert_eq!(staged.len(), 1, "{staged:?}");
    // The crashed process's own sweep leaves its (still running) upload alone.
    assert_eq!(crashed.sweep_incomplete().await.unwrap(), 0);

    let next = open(tmp.path()).await;
    assert_eq!(next.list("cr").await.unwrap(), vec![]);
    assert_not_found(&next, "cr", "snap").await;
    assert_eq!(next.sweep_incomplete().await.unwrap(), 1);
    assert_eq!(staging_files(tmp.path()), Vec::<PathBuf>::new());
    assert_eq!(next.sweep_incomplete().await.unwrap(), 0);
    // The key is usable again.
    let info = next.put("cr", "snap", chunks(b"ok", 1)).await.unwrap();
    assert_eq!(read_all(&next, "cr", "snap", &info).await, b"ok");
}

#[tokio::test]
async fn deleting_the_last_object_forgets_the_tenant() {
    let tmp = tempfile::tempdir().unwrap();
    let blobs = open(tmp.path()).await;
    assert_eq!(blobs.list_tenants().await.unwrap(), Vec::<String>::new());
    blobs.put("gone", "a/b", chunks(b"x", 1)).await.unwrap();
    blobs.put("kept", "k", chunks(b"x", 1)).await.unwrap();
    assert_eq!(blobs.list_tenants().await.unwrap(), vec!["gone", "kept"]);
    blobs.delete("gone", "a/b").await.unwrap();
    assert_eq!(blobs.list_tenants().await.unwrap(), vec!["kept"]);
}
