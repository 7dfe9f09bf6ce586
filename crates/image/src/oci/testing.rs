//! Image archives made in tests: layers of listed entries or of a directory, packed as an OCI
//! image layout or as `docker save` does.

use std::io::Write as _;
use std::path::Path;

use flate2::write::GzEncoder;
use serde_json::json;
use sha2::{Digest as _, Sha256};

/// One entry of a test layer.
pub enum E<'a> {
    Dir(&'a str),
    File(&'a str, &'a [u8], u32),
    Link(&'a str, &'a str),
    Symlink(&'a str, &'a str),
    Char(&'a str),
    /// A regular file whose header names any bytes (paths `tar::Builder` refuses).
    RawFile(&'a [u8]),
    /// An entry owned by (uid, gid).
    Owned(&'a E<'a>, u64, u64),
}

/// A layer tar holding `entries`, in order.
pub fn layer(entries: &[E<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(0);
        let e = match e {
            E::Owned(inner, uid, gid) => {
                h.set_uid(*uid);
                h.set_gid(*gid);
                *inner
            }
            e => e,
        };
        let (path, data): (&[u8], &[u8]) = match e {
            E::Dir(p) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                (p.as_bytes(), b"")
            }
            E::File(p, data, mode) => {
                h.set_mode(*mode);
                (p.as_bytes(), data)
            }
            E::Link(p, target) | E::Symlink(p, target) => {
                h.set_entry_type(if matches!(e, E::Link(..)) {
                    tar::EntryType::Link
                } else {
                    tar::EntryType::Symlink
                });
                h.set_mode(0o777);
                h.set_link_name(target).unwrap();
                (p.as_bytes(), b"")
            }
            E::Char(p) => {
                h.set_entry_type(tar::EntryType::Char);
                h.set_mode(0o666);
                h.set_device_major(1).unwrap();
                h.set_device_minor(3).unwrap();
                (p.as_bytes(), b"")
            }
            E::RawFile(p) => {
                h.set_mode(0o644);
                (*p, b"x")
            }
            E::Owned(..) => panic!("an owned entry inside an owned entry"),
        };
        h.as_old_mut().name = [0; 100];
        h.as_old_mut().name[..path.len()].copy_from_slice(path);
        h.set_size(data.len() as u64);
        h.set_cksum();
        b.append(&h, data).unwrap();
    }
    b.into_inner().unwrap()
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

pub fn sha(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

fn config(diff_ids: &[String]) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/opt/app/bin:/usr/bin:/bin", "GREETING=hello"],
                   "WorkingDir": "/opt/app", "User": "1000", "Cmd": ["serve", "--port", "8000"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .unwrap()
}

fn outer(files: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut h = tar::Header::new_ustar();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, name, data.as_slice()).unwrap();
    }
    b.into_inner().unwrap()
}

/// An OCI image layout tar of `layers` (uncompressed tars; gzipped in the layout when
/// `gzipped`).
pub fn oci_archive(layers: &[Vec<u8>], gzipped: bool) -> Vec<u8> {
    let diff_ids: Vec<String> = layers.iter().map(|l| sha(l)).collect();
    let cfg = config(&diff_ids);
    let mut files = vec![(format!("blobs/sha256/{}", &sha(&cfg)[7..]), cfg.clone())];
    let mut descriptors = Vec::new();
    for l in layers {
        let blob = if gzipped { gzip(l) } else { l.clone() };
        descriptors.push(
            json!({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                                "digest": sha(&blob), "size": blob.len()}),
        );
        files.push((format!("blobs/sha256/{}", &sha(&blob)[7..]), blob));
    }
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha(&cfg), "size": cfg.len()},
        "layers": descriptors,
    }))
    .unwrap();
    files.push((
        format!("blobs/sha256/{}", &sha(&manifest)[7..]),
        manifest.clone(),
    ));
    let index = serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": sha(&manifest), "size": manifest.len()}]}))
    .unwrap();
    files.push((
        "oci-layout".into(),
        br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
    ));
    files.push(("index.json".into(), index));
    outer(&files)
}

/// A `docker save` tar of `layers`.
pub fn docker_archive(layers: &[Vec<u8>]) -> Vec<u8> {
    let diff_ids: Vec<String> = layers.iter().map(|l| sha(l)).collect();
    let cfg = config(&diff_ids);
    let cfg_name = format!("{}.json", &sha(&cfg)[7..]);
    let mut files = vec![(cfg_name.clone(), cfg)];
    let mut names = Vec::new();
    for (n, l) in layers.iter().enumerate() {
        names.push(format!("layer{n}/layer.tar"));
        files.push((format!("layer{n}/layer.tar"), l.clone()));
    }
    let manifest = json!([{"Config": cfg_name, "RepoTags": ["app:latest"], "Layers": names}]);
    files.push((
        "manifest.json".into(),
        serde_json::to_vec(&manifest).unwrap(),
    ));
    outer(&files)
}

/// A layer holding the tree under `dir` (symlinks as links), its paths relative to it.
pub fn layer_of_dir(dir: &Path) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    b.append_dir_all(".", dir).unwrap();
    b.into_inner().unwrap()
}
