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
    /// Whether sessions (running or paused) run on it, live snapshots were taken on it, or a
    /// warm pool holds it: what keeps it from being deleted.
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

/// An image build from a template spec (`POST /v1/sandbox/images/builds`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Build {
    pub build_id: String,
    /// The name the image gets once every step passed.
    pub name: String,
    pub state: BuildState,
    /// Every step of the spec, in order.
    pub steps: Vec<BuildStep>,
    /// The failed step's index in `steps` (a failed build).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_step: Option<usize>,
    /// Why it failed: `SANDBOX-IMAGE-BUILD-STEP-FAILED` (a step exited non-zero, its output
    /// in `log_tail`) or `SANDBOX-IMAGE-BUILD-FAILED`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<crate::ErrorDetail>,
    /// The image's digest (a succeeded build).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// The last lines of the build's log.
    pub log_tail: String,
    pub created_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum BuildState {
    Queued,
    Running,
    Succeeded,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct BuildStep {
    /// What the step does (`pip six`, `file /opt/app/x (644)`, `run make`).
    pub step: String,
    /// The step's cache key (sha256 of its inputs and its parent's key).
    pub key: String,
    /// `pending`, `cached` (found in the store: not rerun), `running`, `built` or `failed`.
    pub status: String,
}
