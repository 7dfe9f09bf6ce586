//! Shapes of images: the read-only root trees sessions run on (API.md "Images";
//! docs/API-ADDITIONS.md "Images").

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Image {
    /// The name sessions use (`"image": "python"`); the first of `names`.
    pub name: String,
    /// Every name pointing at this image (`python`, `python:3.11`).
    pub names: Vec<String>,
    /// sha256 of the image's build inputs; absent for `host`, which is generated per host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// `host` (the host's /usr under a generated root) or `pack` (built from Debian packages).
    pub kind: String,
    /// Languages sessions on it can run, the default first.
    pub languages: Vec<ImageLanguage>,
    pub env: BTreeMap<String, String>,
    pub workdir: String,
    pub user: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// The build inputs the digest is taken of (suite, packages, recipe version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub recipe: Option<serde_json::Value>,
    /// The end of the build's output (`GET /images/{name}` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_log: Option<String>,
    /// Sessions (running or paused) on it, and whether a warm pool holds it.
    #[serde(default)]
    pub in_use: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ImageLanguage {
    pub name: String,
    /// Absolute path of the interpreter inside the image.
    pub interpreter: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ImageList {
    pub images: Vec<Image>,
}
