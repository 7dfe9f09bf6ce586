//! A template's `COPY` files, by E2B's files hash: the SDK asks whether the tenant uploaded
//! them already and where to put them (`GET /templates/{id}/files/{hash}` → `{present, url}`),
//! then `PUT`s the tar to that URL, which points back at this daemon and carries its own
//! authority (an HMAC of the tenant's namespace, the hash and an expiry, under the daemon's
//! token key): the SDK sends it no API key. An upload is received into a temporary file
//! (bounded), checked as hostile (`koder_image::oci::check_context_archive`: no `..`, no
//! absolute path, nothing below an archive's own symlink, no device or fifo, bounded) and only
//! then kept, under `<images dir>/e2b-files/<namespace>/<hash>`.

use std::path::{Path, PathBuf};

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

/// The tenant's directory of uploaded files.
pub(super) fn dir(e2b: &E2b, who: &Identity) -> Result<PathBuf, HttpError> {
    namespace_dir(e2b, &e2b.template_namespace(&who.tenant_id))
}

fn namespace_dir(e2b: &E2b, namespace: &str) -> Result<PathBuf, HttpError> {
    let store = store(e2b)?;
    let images = store
        .root()
        .parent()
        .ok_or_else(|| HttpError::new(500, "the image store has no parent directory"))?;
    Ok(images.join("e2b-files").join(namespace))
}

/// The uploaded archive of `hash` in `dir`, if there is one.
pub(super) fn find(dir: &Path, hash: &str) -> Option<PathBuf> {
    is_hash(hash)
        .then(|| dir.join(hash))
        .filter(|p| p.is_file())
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
    let present = find(&namespace_dir(&e2b, &namespace)?, &hash).is_some();
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
    let tmp = dir.join(format!(".upload-{}", uuid::Uuid::new_v4().simple()));
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
    let kept = checked.and_then(|_| {
        std::fs::rename(&tmp, dir.join(&hash))
            .map_err(|e| HttpError::new(500, format!("keep the upload: {e}")))
    });
    if kept.is_err() {
        let _ = tokio::fs::remove_file(&tmp).await;
    }
    kept?;
    tracing::info!(template = %template, hash = %hash, "template files uploaded");
    Ok(StatusCode::OK)
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
        assert!(find(dir.path(), &hash).is_none());
        std::fs::write(dir.path().join(&hash), b"x").unwrap();
        assert!(find(dir.path(), &hash).is_some());
        assert!(find(dir.path(), "..").is_none());
    }
}
