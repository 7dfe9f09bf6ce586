//! Where the blobs live: [`BlobConfig`] and the store it opens.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;

use crate::BlobError;

const DEFAULT_REGION: &str = "us-east-1";

/// The daemon's `[blobs]` section.
#[derive(Debug, Clone, Default, serde::Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BlobConfig {
    /// `file:///abs/dir` or `s3://bucket/prefix`; `None` is `<data_dir>/blobs`.
    pub url: Option<String>,
    /// S3 only: a custom endpoint (MinIO, Ceph, ...); path-style requests are used with it.
    pub endpoint: Option<String>,
    /// S3 only; `us-east-1` when unset.
    pub region: Option<String>,
    /// S3 only; with `secret_access_key`. Without both, the builder's own credential chain
    /// (instance metadata, web identity) applies.
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    /// S3 only: allow a plain-http endpoint (a test server on loopback).
    pub allow_http: bool,
}

/// The opened store. Local stores keep their filesystem root: staging files and fsync need it.
pub(crate) enum Backend {
    Local {
        fs: Arc<LocalFileSystem>,
        root: PathBuf,
    },
    S3 {
        store: Arc<object_store::aws::AmazonS3>,
        prefix: Path,
    },
}

pub(crate) fn open_backend(cfg: &BlobConfig, data_dir: &FsPath) -> Result<Backend, BlobError> {
    match cfg.url.as_deref() {
        None => open_local(&data_dir.join("blobs")),
        Some(url) => {
            if let Some(path) = url.strip_prefix("file://") {
                reject_s3_options(cfg)?;
                if !path.starts_with('/') {
                    return Err(BlobError::Config(format!(
                        "{url:?}: a file URL needs an absolute path (file:///dir)"
                    )));
                }
                open_local(FsPath::new(path))
            } else if let Some(rest) = url.strip_prefix("s3://") {
                open_s3(cfg, rest)
            } else {
                Err(BlobError::Config(format!(
                    "{url:?}: want file:///abs/dir or s3://bucket/prefix"
                )))
            }
        }
    }
}

/// The S3 settings next to a local URL are a mistake the operator should hear about.
fn reject_s3_options(cfg: &BlobConfig) -> Result<(), BlobError> {
    let s3_only = cfg.endpoint.is_some()
        || cfg.region.is_some()
        || cfg.access_key_id.is_some()
        || cfg.secret_access_key.is_some()
        || cfg.allow_http;
    if s3_only {
        return Err(BlobError::Config(
            "endpoint, region, keys and allow_http apply to s3:// URLs only".into(),
        ));
    }
    Ok(())
}

fn open_local(dir: &FsPath) -> Result<Backend, BlobError> {
    let ctx = || format!("creating the blob directory {}", dir.display());
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| BlobError::io(ctx(), e))?;
    // An existing directory keeps whatever mode it had: tighten it, tenants' snapshots are in it.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| BlobError::io(ctx(), e))?;
    let root = std::fs::canonicalize(dir).map_err(|e| BlobError::io(ctx(), e))?;
    // Removing emptied directories keeps `list_tenants` to tenants that still hold objects.
    let fs = LocalFileSystem::new_with_prefix(&root)?.with_automatic_cleanup(true);
    Ok(Backend::Local {
        fs: Arc::new(fs),
        root,
    })
}

fn open_s3(cfg: &BlobConfig, bucket_and_prefix: &str) -> Result<Backend, BlobError> {
    let (bucket, prefix) = bucket_and_prefix
        .split_once('/')
        .unwrap_or((bucket_and_prefix, ""));
    if bucket.is_empty() {
        return Err(BlobError::Config("s3:// URL without a bucket".into()));
    }
    let prefix = Path::parse(prefix.trim_end_matches('/'))
        .map_err(|e| BlobError::Config(format!("s3 prefix {prefix:?}: {e}")))?;
    let mut b = AmazonS3Builder::new()
        .with_bucket_name(bucket)
        .with_region(cfg.region.as_deref().unwrap_or(DEFAULT_REGION))
        .with_allow_http(cfg.allow_http);
    if let Some(endpoint) = &cfg.endpoint {
        // Custom endpoints rarely have wildcard DNS for bucket subdomains.
        b = b
            .with_endpoint(endpoint)
            .with_virtual_hosted_style_request(false);
    }
    match (&cfg.access_key_id, &cfg.secret_access_key) {
        (Some(id), Some(secret)) => {
            b = b.with_access_key_id(id).with_secret_access_key(secret);
        }
        (None, None) => {}
        _ => {
            return Err(BlobError::Config(
                "access_key_id and secret_access_key go together".into(),
            ))
        }
    }
    let store = b
        .build()
        .map_err(|e| BlobError::Config(format!("s3: {e}")))?;
    Ok(Backend::S3 {
        store: Arc::new(store),
        prefix,
    })
}
