//! A template's `COPY` files, by E2B's files hash: the SDK asks whether the tenant uploaded
//! them already and where to put them (`GET /templates/{id}/files/{hash}` → `{present, url}`),
//! then `PUT`s the tar to that URL, which points back at this daemon and carries its own
//! authority (an HMAC of the tenant's namespace, the hash and an expiry, under the daemon's
//! token key): the SDK sends it no API key. An upload is received into a temporary file
//! (bounded), checked as hostile (`koder_image::oci::check_context_archive`: no `..`, no
//! absolute path, nothing below an archive's own symlink, no device or fifo, bounded) and only
//! then kept, under `<images dir>/e2b-files/<namespace>/<hash>`.
//!
//! Kept within bounds ([`TemplateFiles`]): an upload nobody uploaded, asked about or built from
//! for `keep_for` is removed (when its tenant uploads, when it is asked for, and by a sweep of
//! every tenant's), and a tenant's uploads hold `max_bytes` at most, the least recently used
//! making room for a new one; those used within the last hour never do (a build that found
//! one may not have copied it yet), so an upload that only fits by removing them is refused.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use koder_auth::Identity;
use serde::Deserialize;
use serde_json::json;
use subtle::ConstantTimeEq as _;

use super::{check_part, image_error, split_name, store};
use crate::control::keys::ApiCaller;
use crate::error::HttpError;
use crate::state::E2b;

/// Largest upload (the compressed archive as sent).
const MAX_UPLOAD: u64 = 1 << 30;
/// Bounds on what an archive unpacks to.
const LIMITS: koder_image::oci::Limits = koder_image::oci::Limits {
    max_bytes: 4 << 30,
    max_entries: 200_000,
};
/// How long an upload URL is good for.
const URL_LIFETIME_S: i64 = 3600;
/// Uploads used this recently are never removed to make room for another.
const IN_USE: Duration = Duration::from_secs(3600);
/// A partial upload (`.upload-*`) this old belongs to a request long gone.
const ABANDONED: Duration = Duration::from_secs(86_400);
const PARTIAL: &str = ".upload-";

/// How much of its uploaded template files a tenant keeps, and for how long (`[e2b]
/// template_files_mib`, `template_files_keep_days`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemplateFiles {
    /// Bytes a tenant's uploads may hold together.
    pub max_bytes: u64,
    /// An upload unused this long is removed.
    pub keep_for: Duration,
}

impl Default for TemplateFiles {
    fn default() -> Self {
        Self {
            max_bytes: 4 << 30,
            keep_for: Duration::from_secs(7 * 86_400),
        }
    }
}

/// The tenant's directory of uploaded files.
pub(super) fn dir(e2b: &E2b, who: &Identity) -> Result<PathBuf, HttpError> {
    namespace_dir(e2b, &e2b.template_namespace(&who.tenant_id))
}

fn namespace_dir(e2b: &E2b, namespace: &str) -> Result<PathBuf, HttpError> {
    Ok(files_root(e2b)?.join(namespace))
}

/// Where every tenant's uploads are: `<images dir>/e2b-files`.
fn files_root(e2b: &E2b) -> Result<PathBuf, HttpError> {
    let store = store(e2b)?;
    let images = store
        .root()
        .parent()
        .ok_or_else(|| HttpError::new(500, "the image store has no parent directory"))?;
    Ok(images.join("e2b-files"))
}

/// The uploaded archive of `hash` in `dir`, if there is one still kept; finding it is a use.
pub(super) fn find(dir: &Path, hash: &str, policy: &TemplateFiles) -> Option<PathBuf> {
    let path = is_hash(hash).then(|| dir.join(hash))?;
    let meta = std::fs::symlink_metadata(&path)
        .ok()
        .filter(|m| m.is_file())?;
    let now = SystemTime::now();
    if age(&meta, now) > policy.keep_for {
        remove(&path);
        return None;
    }
    if let Err(e) = std::fs::File::open(&path).and_then(|f| f.set_modified(now)) {
        tracing::warn!(path = %path.display(), error = %e, "marking an upload used");
    }
    Some(path)
}

/// How long ago a file was last used (written, or marked by [`find`]).
fn age(meta: &std::fs::Metadata, now: SystemTime) -> Duration {
    meta.modified()
        .ok()
        .and_then(|used| now.duration_since(used).ok())
        .unwrap_or_default()
}

fn remove(path: &Path) {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            tracing::warn!(path = %path.display(), error = %e, "removing an upload");
        }
        _ => tracing::info!(path = %path.display(), "template upload removed"),
    }
}

/// A kept upload.
struct Kept {
    path: PathBuf,
    bytes: u64,
    age: Duration,
}

/// The uploads of `dir` kept at `now` but the one of `except`, least recently used first;
/// expired ones and abandoned partial uploads are removed on the way.
fn survey(
    dir: &Path,
    policy: &TemplateFiles,
    now: SystemTime,
    except: Option<&str>,
) -> std::io::Result<Vec<Kept>> {
    let mut kept = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(kept),
        other => other?,
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let meta = match entry.metadata() {
            // Removed meanwhile (another upload made room, a sweep).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            other => other?,
        };
        if !meta.is_file() {
            continue;
        }
        let age = age(&meta, now);
        let upload = is_hash(&name);
        let stale = match upload {
            true => age > policy.keep_for,
            false => name.starts_with(PARTIAL) && age > ABANDONED,
        };
        if stale {
            remove(&entry.path());
        } else if upload && except != Some(&*name) {
            kept.push(Kept {
                path: entry.path(),
                bytes: meta.len(),
                age,
            });
        }
    }
    kept.sort_by_key(|k| std::cmp::Reverse(k.age));
    Ok(kept)
}

/// Why an upload is not kept.
#[derive(Debug)]
enum NoRoom {
    /// The tenant's uploads would hold more than allowed: why.
    Full(String),
    Io(std::io::Error),
}

/// Makes room in `dir` for an upload of `bytes` under `hash` (replacing one there): the least
/// recently used go while the tenant's uploads would hold more than the policy allows, none
/// used within [`IN_USE`].
fn make_room(
    dir: &Path,
    hash: &str,
    bytes: u64,
    policy: &TemplateFiles,
    now: SystemTime,
) -> Result<(), NoRoom> {
    let kept = survey(dir, policy, now, Some(hash)).map_err(NoRoom::Io)?;
    let total = kept
        .iter()
        .map(|k| k.bytes)
        .sum::<u64>()
        .saturating_add(bytes);
    let removable = || kept.iter().take_while(|k| k.age >= IN_USE);
    let in_use = total - removable().map(|k| k.bytes).sum::<u64>();
    // Nothing goes for an upload that would not fit anyway.
    if in_use > policy.max_bytes {
        let mib = |b: u64| b.div_ceil(1 << 20);
        return Err(NoRoom::Full(format!(
            "an upload of {} MiB does not fit the {} MiB a tenant's template files may hold: \
             {} MiB of them were used within the last hour",
            mib(bytes),
            mib(policy.max_bytes),
            mib(in_use - bytes)
        )));
    }
    let mut left = total;
    for k in removable() {
        if left <= policy.max_bytes {
            break;
        }
        remove(&k.path);
        left -= k.bytes;
    }
    Ok(())
}

/// Removes every tenant's expired uploads and abandoned partial ones.
pub(crate) fn sweep(e2b: &E2b) {
    let Ok(root) = files_root(e2b) else { return };
    let Ok(namespaces) = std::fs::read_dir(&root) else {
        return;
    };
    let now = SystemTime::now();
    for dir in namespaces.flatten() {
        if let Err(e) = survey(&dir.path(), &e2b.template_limits().files, now, None) {
            tracing::warn!(dir = %dir.path().display(), error = %e, "sweeping template uploads");
        }
    }
}

/// E2B's files hash: a sha256, lowercase hex.
fn is_hash(hash: &str) -> bool {
    hash.len() == 64
        && hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn check_hash(hash: &str) -> Result<(), HttpError> {
    if is_hash(hash) {
        Ok(())
    } else {
        Err(HttpError::bad_request(format!(
            "invalid files hash {hash:?}: 64 lowercase hex digits"
        )))
    }
}

fn signed(namespace: &str, template: &str, hash: &str, expires: i64) -> String {
    format!("{namespace}:{template}:{hash}:{expires}")
}

/// `GET /templates/{id}/files/{hash}` → 201 `{present, url}`.
pub(super) async fn upload_link(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    UrlPath((template, hash)): UrlPath<(String, String)>,
    tls: Option<axum::Extension<koder_http::ArrivedOverTls>>,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    split_name(&template)?;
    check_hash(&hash)?;
    let namespace = e2b.template_namespace(&who.tenant_id);
    let present = find(
        &namespace_dir(&e2b, &namespace)?,
        &hash,
        &e2b.template_limits().files,
    )
    .is_some();
    let expires = chrono::Utc::now().timestamp() + URL_LIFETIME_S;
    let signature = e2b.upload_signature(&signed(&namespace, &template, &hash, expires));
    // The URL the SDK reached this daemon by, so the upload comes back the same way.
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| HttpError::bad_request("no Host header to build the upload URL from"))?;
    // Over the daemon's own HTTPS listener, or through a proxy that says it took HTTPS.
    let forwarded_https = headers
        .get("x-forwarded-proto")
        .and_then(|h| h.to_str().ok())
        .is_some_and(|p| p == "https");
    let scheme = match tls.is_some() || forwarded_https {
        true => "https",
        false => "http",
    };
    let url = format!(
        "{scheme}://{host}/templates/{template}/files/{hash}?namespace={namespace}&expires={expires}&signature={signature}"
    );
    Ok((
        StatusCode::CREATED,
        axum::Json(json!({"present": present, "url": url})),
    )
        .into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct UploadQuery {
    namespace: String,
    expires: i64,
    signature: String,
}

/// `PUT` of an upload URL: the archive, checked, kept under its hash.
pub(super) async fn upload(
    State(e2b): State<E2b>,
    UrlPath((template, hash)): UrlPath<(String, String)>,
    Query(q): Query<UploadQuery>,
    raw: Body,
) -> Result<StatusCode, HttpError> {
    check_hash(&hash)?;
    check_part(&q.namespace, "namespace")?;
    let want = e2b.upload_signature(&signed(&q.namespace, &template, &hash, q.expires));
    if !bool::from(want.as_bytes().ct_eq(q.signature.as_bytes())) {
        return Err(HttpError::unauthorized("invalid upload signature"));
    }
    if q.expires < chrono::Utc::now().timestamp() {
        return Err(HttpError::unauthorized("the upload URL expired"));
    }
    let dir = namespace_dir(&e2b, &q.namespace)?;
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(|e| HttpError::new(500, format!("create the files directory: {e}")))?;
    let tmp = dir.join(format!("{PARTIAL}{}", uuid::Uuid::new_v4().simple()));
    let kept = koder_http::receive_upload(raw, &tmp, MAX_UPLOAD)
        .await
        .map(|()| tmp.clone())
        .map_err(HttpError::from);
    let checked = match kept {
        Ok(path) => tokio::task::spawn_blocking(move || {
            koder_image::oci::check_context_archive(&path, LIMITS)
        })
        .await
        .map_err(|e| HttpError::new(500, format!("archive check: {e}")))
        .and_then(|r| r.map_err(image_error)),
        Err(e) => Err(e),
    };
    let policy = e2b.template_limits().files;
    let kept = match checked {
        Ok(_) => {
            let (tmp, dir, hash, e2b) = (tmp.clone(), dir.clone(), hash.clone(), e2b.clone());
            tokio::task::spawn_blocking(move || {
                // Uploads finishing at once would each find the room the other takes.
                let _keeping = e2b.template_room().lock();
                keep(&tmp, &dir, &hash, &policy)
            })
            .await
            .map_err(|e| HttpError::new(500, format!("keep the upload: {e}")))
            .and_then(|r| r)
        }
        Err(e) => Err(e),
    };
    if kept.is_err() {
        let _ = tokio::fs::remove_file(&tmp).await;
    }
    kept?;
    tracing::info!(template = %template, hash = %hash, "template files uploaded");
    Ok(StatusCode::OK)
}

/// Keeps the checked upload `tmp` as `dir/hash`, once the tenant's uploads have room for it.
fn keep(tmp: &Path, dir: &Path, hash: &str, policy: &TemplateFiles) -> Result<(), HttpError> {
    let bytes = std::fs::metadata(tmp)
        .map_err(|e| HttpError::new(500, format!("keep the upload: {e}")))?
        .len();
    make_room(dir, hash, bytes, policy, SystemTime::now()).map_err(|e| match e {
        NoRoom::Full(why) => image_error(koder_image::ImageError::TooLarge(why)),
        NoRoom::Io(e) => HttpError::new(500, format!("reading the uploads: {e}")),
    })?;
    std::fs::rename(tmp, dir.join(hash))
        .map_err(|e| HttpError::new(500, format!("keep the upload: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_sha256_hex() {
        assert!(is_hash(&"0a".repeat(32)));
        for bad in ["", "../x", &"A".repeat(64), &"0".repeat(63)] {
            assert!(!is_hash(bad), "{bad}");
        }
        let dir = tempfile::tempdir().unwrap();
        let hash = "1".repeat(64);
        let policy = TemplateFiles::default();
        assert!(find(dir.path(), &hash, &policy).is_none());
        std::fs::write(dir.path().join(&hash), b"x").unwrap();
        assert!(find(dir.path(), &hash, &policy).is_some());
        assert!(find(dir.path(), "..", &policy).is_none());
    }

    /// A file of `bytes` named `name` in `dir`, last used `ago`.
    fn put(dir: &Path, name: &str, bytes: usize, ago: Duration) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, vec![0u8; bytes]).unwrap();
        std::fs::File::open(&path)
            .unwrap()
            .set_modified(SystemTime::now() - ago)
            .unwrap();
        path
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn uploads_expire_unused_and_finding_one_is_a_use() {
        let dir = tempfile::tempdir().unwrap();
        let policy = TemplateFiles {
            max_bytes: 1 << 20,
            keep_for: 24 * HOUR,
        };
        let (fresh, old) = ("a".repeat(64), "b".repeat(64));
        put(dir.path(), &fresh, 10, 23 * HOUR);
        let expired = put(dir.path(), &old, 10, 25 * HOUR);
        assert!(find(dir.path(), &old, &policy).is_none());
        assert!(!expired.exists(), "an expired upload stayed");
        let found = find(dir.path(), &fresh, &policy).unwrap();
        let meta = std::fs::metadata(found).unwrap();
        assert!(
            age(&meta, SystemTime::now()) < HOUR,
            "finding it did not mark it used"
        );

        // A sweep removes expired uploads and abandoned partial ones, nothing else.
        let stale = put(dir.path(), &"c".repeat(64), 10, 48 * HOUR);
        let abandoned = put(dir.path(), ".upload-1", 10, 25 * HOUR);
        let receiving = put(dir.path(), ".upload-2", 10, HOUR);
        let other = put(dir.path(), "notes", 10, 48 * HOUR);
        let kept = survey(dir.path(), &policy, SystemTime::now(), None).unwrap();
        assert_eq!(kept.len(), 1);
        assert!(!stale.exists() && !abandoned.exists());
        assert!(receiving.exists() && other.exists());
    }

    #[test]
    fn the_least_recently_used_uploads_make_room_but_not_those_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let policy = TemplateFiles {
            max_bytes: 100,
            keep_for: 240 * HOUR,
        };
        let now = SystemTime::now();
        let oldest = put(dir.path(), &"a".repeat(64), 40, 5 * HOUR);
        let older = put(dir.path(), &"b".repeat(64), 40, 3 * HOUR);
        let recent = put(dir.path(), &"c".repeat(64), 40, HOUR / 2);
        // 120 + 20: the least recently used goes, and that is enough.
        make_room(dir.path(), &"d".repeat(64), 20, &policy, now).unwrap();
        assert!(!oldest.exists() && older.exists() && recent.exists());
        // Replacing an upload counts its new size only.
        make_room(dir.path(), &"b".repeat(64), 60, &policy, now).unwrap();
        assert!(older.exists() && recent.exists());
        // 80 + 70 fits only without the recent one, which stays: refused, and nothing goes.
        let refused = make_room(dir.path(), &"e".repeat(64), 70, &policy, now);
        let Err(NoRoom::Full(why)) = refused else {
            panic!("{refused:?}")
        };
        assert!(why.contains("were used within the last hour"), "{why}");
        assert!(older.exists() && recent.exists());
        // Larger than everything allowed: refused whatever is there.
        assert!(matches!(
            make_room(dir.path(), &"f".repeat(64), 101, &policy, now),
            Err(NoRoom::Full(_))
        ));
    }
}
