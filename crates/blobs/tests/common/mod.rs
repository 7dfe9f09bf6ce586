//! The checks every backend must pass; `local.rs` and `s3.rs` run them on their store.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use futures::{stream, Stream, StreamExt, TryStreamExt};
use koder_api_types::ErrorCode;
use koder_blobs::{BlobError, BlobInfo, Blobs};
use rand::{RngCore, SeedableRng};
use sha2::{Digest, Sha256};

pub const MIB: usize = 1 << 20;

pub fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut data = vec![0; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut data);
    data
}

pub fn info_of(data: &[u8]) -> BlobInfo {
    BlobInfo {
        size: data.len() as u64,
        sha256: hex::encode(Sha256::digest(data)),
    }
}

pub fn chunks(
    data: &[u8],
    chunk: usize,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    let parts: Vec<_> = data
        .chunks(chunk)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    stream::iter(parts)
}

pub async fn read_all(blobs: &Blobs, tenant: &str, key: &str, expected: &BlobInfo) -> Vec<u8> {
    let s = blobs.get(tenant, key, expected).await.unwrap();
    let parts: Vec<Bytes> = s.try_collect().await.unwrap();
    parts.concat()
}

/// 9 MiB (more than a part, so one is uploaded), then the body never ends.
pub fn stalling_body() -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    chunks(&random(9 * MIB, 7), MIB).chain(stream::pending())
}

pub async fn round_trip(blobs: &Blobs) {
    let data = random(20 * MIB, 1);
    let info = blobs
        .put("rt", "snap/1.tar", chunks(&data, MIB))
        .await
        .unwrap();
    assert_eq!(info, info_of(&data));
    assert_eq!(info.sha256, info.sha256.to_lowercase());
    assert_eq!(
        blobs.list("rt").await.unwrap(),
        vec![("snap/1.tar".to_string(), 20 * MIB as u64)]
    );
    assert!(read_all(blobs, "rt", "snap/1.tar", &info).await == data);

    let empty = blobs.put("rt", "empty", stream::empty()).await.unwrap();
    assert_eq!(empty, info_of(b""));
    assert!(read_all(blobs, "rt", "empty", &empty).await.is_empty());

    // Replacing an object.
    let small = random(1000, 2);
    let info2 = blobs
        .put("rt", "snap/1.tar", chunks(&small, 100))
        .await
        .unwrap();
    assert_eq!(read_all(blobs, "rt", "snap/1.tar", &info2).await, small);
}

pub async fn writer_round_trip(blobs: &Blobs) {
    use std::io::Write;
    let data = random(3 * MIB + 12345, 3);
    let (mut w, upload) = blobs.writer("wr", "archive").unwrap();
    let produced = data.clone();
    let producer = tokio::task::spawn_blocking(move || {
        // Small writes like a tar producer's, then one big one.
        for block in produced[..MIB].chunks(512) {
            w.write_all(block)?;
        }
        w.write_all(&produced[MIB..])?;
        w.finish()
    });
    let (info, produced) = tokio::join!(upload, producer);
    produced.unwrap().unwrap();
    let info = info.unwrap();
    assert_eq!(info, info_of(&data));
    assert!(read_all(blobs, "wr", "archive", &info).await == data);

    // A producer that fails (drops the writer without finish) stores nothing.
    let (mut w, upload) = blobs.writer("wr", "failed").unwrap();
    let producer = tokio::task::spawn_blocking(move || {
        w.write_all(&random(2 * MIB, 4))?;
        drop(w);
        std::io::Result::Ok(())
    });
    let (res, produced) = tokio::join!(upload, producer);
    produced.unwrap().unwrap();
    assert!(matches!(res, Err(BlobError::Io { .. })), "{res:?}");
    assert_not_found(blobs, "wr", "failed").await;

    assert!(matches!(
        blobs.writer("wr", "../x"),
        Err(BlobError::InvalidKey(_))
    ));
}

pub async fn assert_not_found(blobs: &Blobs, tenant: &str, key: &str) {
    let any = info_of(b"x");
    match blobs.get(tenant, key, &any).await {
        Err(e @ BlobError::NotFound) => assert_eq!(e.code(), ErrorCode::NotFound),
        Err(e) => panic!("{tenant}/{key}: {e:?}"),
        Ok(_) => panic!("{tenant}/{key} exists"),
    }
    assert!(blobs
        .list(tenant)
        .await
        .unwrap()
        .iter()
        .all(|(k, _)| k != key));
}

pub async fn not_found_and_delete(blobs: &Blobs) {
    assert_not_found(blobs, "nf", "nothing").await;
    blobs.delete("nf", "nothing").await.unwrap();
    blobs.put("nf", "k", chunks(b"hello", 2)).await.unwrap();
    blobs.delete("nf", "k").await.unwrap();
    assert_not_found(blobs, "nf", "k").await;
    blobs.delete("nf", "k").await.unwrap();
    assert_eq!(blobs.list("nf").await.unwrap(), vec![]);
}

pub fn hostile_names() -> Vec<String> {
    vec![
        "../x".into(),
        "a/../../b".into(),
        "/abs".into(),
        String::new(),
        ".".into(),
        "..".into(),
        "a\0b".into(),
        "snäp".into(),
        "☃".into(),
        "a//b".into(),
        "a/".into(),
        "a\\..\\b".into(),
        "%2e%2e".into(),
        "k".repeat(10_000),
    ]
}

fn assert_invalid<T: std::fmt::Debug>(what: &str, res: Result<T, BlobError>) {
    match res {
        Err(e @ BlobError::InvalidKey(_)) => {
            assert_eq!(e.code(), ErrorCode::InvalidArgument);
            assert!(
                e.to_string().len() < 400,
                "error message echoes the whole name"
            );
        }
        other => panic!("{what}: {other:?}"),
    }
}

/// Every operation refuses every hostile tenant and key before touching the store.
pub async fn hostile(blobs: &Blobs) {
    let info = info_of(b"x");
    for bad in hostile_names() {
        let ctx = format!("{:?}", bad.chars().take(20).collect::<String>());
        for (tenant, key) in [("ok", bad.as_str()), (bad.as_str(), "ok")] {
            assert_invalid(&ctx, blobs.put(tenant, key, chunks(b"x", 1)).await);
            assert_invalid(&ctx, blobs.get(tenant, key, &info).await.map(|_| ()));
            assert_invalid(&ctx, blobs.delete(tenant, key).await);
            assert_invalid(&ctx, blobs.writer(tenant, key).map(|_| ()));
        }
        assert_invalid(&ctx, blobs.list(&bad).await);
    }
}

/// Names at the limits are accepted, one byte more is not. (Not run against s3s-fs: it
/// names a file after the base64 of the whole bucket and key, too long for the filesystem.)
pub async fn limits(blobs: &Blobs) {
    let k240 = "k".repeat(240);
    let long = format!("{k240}/{k240}/{}", "k".repeat(30));
    let t = "t".repeat(128);
    blobs.put(&t, &long, chunks(b"x", 1)).await.unwrap();
    assert_eq!(blobs.list(&t).await.unwrap(), vec![(long.clone(), 1)]);
    blobs.delete(&t, &long).await.unwrap();
    assert_eq!(long.len(), 512);
    assert_invalid(
        "513",
        blobs.put("ok", &format!("{long}k"), chunks(b"x", 1)).await,
    );
    assert_invalid(
        "segment",
        blobs.put("ok", &"k".repeat(241), chunks(b"x", 1)).await,
    );
    assert_invalid(
        "129",
        blobs.put(&"t".repeat(129), "k", chunks(b"x", 1)).await,
    );
}

pub async fn isolation(blobs: &Blobs) {
    let data = b"tenant a's secret";
    let info = blobs.put("iso-a", "dir/k", chunks(data, 4)).await.unwrap();
    // A tenant whose name has `iso-a` as prefix must not see it either.
    for other in ["iso-b", "iso-ab", "iso-a."] {
        assert_eq!(blobs.list(other).await.unwrap(), vec![]);
        match blobs.get(other, "dir/k", &info).await {
            Err(BlobError::NotFound) => {}
            Err(e) => panic!("{other}: {e:?}"),
            Ok(_) => panic!("{other} reads iso-a's object"),
        }
        blobs.delete(other, "dir/k").await.unwrap();
    }
    blobs.put("iso-ab", "k", chunks(b"other", 2)).await.unwrap();
    assert_eq!(
        blobs.list("iso-a").await.unwrap(),
        vec![("dir/k".to_string(), data.len() as u64)]
    );
    assert_eq!(read_all(blobs, "iso-a", "dir/k", &info).await, data);
    let tenants = blobs.list_tenants().await.unwrap();
    assert!(tenants.contains(&"iso-a".to_string()), "{tenants:?}");
    assert!(tenants.contains(&"iso-ab".to_string()), "{tenants:?}");
    assert!(!tenants.contains(&"iso-b".to_string()), "{tenants:?}");
}

/// The stored file of an object is changed behind the store's back: the read fails at the
/// end, never silently.
pub async fn checksum(blobs: &Blobs, file_of: impl Fn(&str, &str) -> PathBuf) {
    let data = random(3 * MIB, 5);
    let info = blobs.put("ck", "k", chunks(&data, MIB)).await.unwrap();

    // Wrong expectations, store intact.
    let wrong_sha = BlobInfo {
        sha256: info_of(b"other").sha256,
        ..info.clone()
    };
    assert_checksum_at_end(blobs, &wrong_sha, data.len()).await;
    let wrong_size = BlobInfo {
        size: info.size + 1,
        ..info.clone()
    };
    assert!(matches!(
        blobs.get("ck", "k", &wrong_size).await.map(|_| ()),
        Err(BlobError::Checksum { .. })
    ));

    // Same size, flipped byte in the middle.
    let mut corrupt = data.clone();
    corrupt[2 * MIB] ^= 0xff;
    std::fs::write(file_of("ck", "k"), &corrupt).unwrap();
    assert_checksum_at_end(blobs, &info, data.len()).await;
}

async fn assert_checksum_at_end(blobs: &Blobs, expected: &BlobInfo, len: usize) {
    let items: Vec<_> = blobs
        .get("ck", "k", expected)
        .await
        .unwrap()
        .collect()
        .await;
    let (last, body) = items.split_last().unwrap();
    let got: usize = body.iter().map(|b| b.as_ref().unwrap().len()).sum();
    assert_eq!(got, len);
    match last {
        Err(e @ BlobError::Checksum { .. }) => assert_eq!(e.code(), ErrorCode::Internal),
        other => panic!("{other:?}"),
    }
}

/// A body that fails mid-way and a put future dropped mid-way both leave no object.
pub async fn interrupted(blobs: &Blobs) {
    let failing = chunks(&random(9 * MIB, 6), MIB).chain(stream::once(async {
        // Lets the first part land before the failure.
        tokio::time::sleep(Duration::from_millis(500)).await;
        Err(std::io::Error::other("producer failed"))
    }));
    let res = blobs.put("int", "failed", failing).await;
    assert!(matches!(res, Err(BlobError::Io { .. })), "{res:?}");
    assert_not_found(blobs, "int", "failed").await;

    let res = tokio::time::timeout(
        Duration::from_secs(1),
        blobs.put("int", "dropped", stalling_body()),
    )
    .await;
    assert!(res.is_err(), "a stalled body completed");
    assert_not_found(blobs, "int", "dropped").await;
    assert_eq!(blobs.list("int").await.unwrap(), vec![]);
}

/// While an upload is in progress its object does not show, and a sweep leaves it alone.
pub async fn in_progress(blobs: &Blobs) {
    let data = random(9 * MIB, 8);
    let (go, wait) = tokio::sync::oneshot::channel::<()>();
    let body = chunks(&data, MIB).chain(stream::once(async move {
        let _ = wait.await;
        Ok(Bytes::from_static(b"end"))
    }));
    let b = blobs.clone();
    let put = tokio::spawn(async move { b.put("prog", "k", body).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(blobs.list("prog").await.unwrap(), vec![]);
    assert_eq!(blobs.sweep_incomplete().await.unwrap(), 0);
    go.send(()).unwrap();
    let info = put.await.unwrap().unwrap();
    let mut expected = data.clone();
    expected.extend_from_slice(b"end");
    assert_eq!(info, info_of(&expected));
    assert!(read_all(blobs, "prog", "k", &info).await == expected);
}
