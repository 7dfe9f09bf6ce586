//! Shapes of volumes: named, tenant-scoped directories that outlive sessions and that sessions
//! mount at a path (API.md "Volumes"; docs/API-ADDITIONS.md "Volumes").

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Volume {
    pub volume_id: String,
    pub name: String,
    /// The size quota: writes past it fail with `ENOSPC` in a sandbox, 507 through the API.
    pub size_mib: u64,
    /// Bytes in use, when the volume's filesystem could be asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    /// `btrfs` (a subvolume) or `ext4` (an image file of its own).
    pub backend: String,
    pub created_at: DateTime<Utc>,
    /// Sessions (running or paused) that have it mounted.
    #[serde(default)]
    pub mounts: Vec<VolumeUse>,
}

/// One session's use of a volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct VolumeUse {
    pub session_id: String,
    pub path: String,
    pub read_only: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct VolumeList {
    pub volumes: Vec<Volume>,
}

/// `POST /v1/sandbox/volumes`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateVolume {
    /// 1–128 characters of `[A-Za-z0-9._-]`, unique per tenant; not shaped like a volume id.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9._-]{1,128}$"))]
    pub name: String,
    /// Size quota (default: the server's `[sessions] volume_default_size_mib`; a copy has its
    /// source's).
    /// At least 16, at most the server's `volume_max_size_mib`, the `maximum` of the document
    /// a daemon serves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 16))]
    pub size_mib: Option<u64>,
    /// Make it a copy of this volume (id or name) as it is now: a btrfs snapshot sharing
    /// blocks, or a copy of an ext4 image (only while no session has that one mounted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_volume: Option<String>,
}

/// A volume to mount in a new session (`POST /v1/sandbox/sessions {"volumes": [...]}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct VolumeMountRequest {
    /// The volume's name (or id).
    pub name: String,
    /// Absolute path inside the sandbox, e.g. `/data`; not `/`, `/proc`, `/sys`, `/dev`.
    pub path: String,
    /// Mount it read-only; a volume has at most one read-write mount at a time.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

/// A volume as a session has it mounted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SessionVolume {
    pub volume_id: String,
    pub name: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_requests_default_to_read_write_and_reject_typos() {
        let m: VolumeMountRequest =
            serde_json::from_str(r#"{"name":"data","path":"/data"}"#).unwrap();
        assert!(!m.read_only);
        assert!(serde_json::from_str::<VolumeMountRequest>(
            r#"{"name":"data","path":"/data","readonly":true}"#
        )
        .is_err());
        assert!(serde_json::from_str::<CreateVolume>(r#"{"name":"x","size":1}"#).is_err());
    }
}
