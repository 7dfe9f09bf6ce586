//! Shapes of the state that outlives a sandbox: snapshots, durable pauses, forks (API.md
//! "Snapshots"; docs/API-ADDITIONS.md "State that lasts").

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

use crate::Session;

/// A captured filesystem: what a session changed on top of its image, plus that image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Snapshot {
    pub snapshot_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Stored bytes of every layer the snapshot needs.
    pub size_bytes: u64,
    pub image: String,
    pub language: String,
    pub runtime: String,
    /// The session it was taken from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SnapshotList {
    pub snapshots: Vec<Snapshot>,
}

/// `POST /v1/sandbox/sessions/{id}/snapshot`
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshot {
    /// 1–128 characters of `[A-Za-z0-9._-]`; unique per tenant only by choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9._-]{1,128}$"))]
    pub name: Option<String>,
}

/// `POST /v1/sandbox/sessions/{id}/restore`: the session's sandbox restarts on the snapshot's
/// filesystem (its processes end).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RestoreSnapshot {
    pub snapshot_id: String,
}

/// `POST /v1/sandbox/sessions/{id}/pause`
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PauseSession {
    /// `true` (default): keep processes and memory (a jail's are frozen in place and lost if
    /// the daemon stops). `false`: keep only the filesystem, durably; resume boots it afresh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<bool>,
}

/// How a paused session is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum PauseKind {
    /// Processes frozen in place (jail freezer); lost when the daemon stops.
    Memory,
    /// Filesystem captured into the blob store, sandbox gone; survives daemon restarts.
    Disk,
}

impl PauseKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PauseKind::Memory => "memory",
            PauseKind::Disk => "disk",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "memory" => Some(PauseKind::Memory),
            "disk" => Some(PauseKind::Disk),
            _ => None,
        }
    }
}

/// What happens when a session's timeout passes, and whether a request wakes a paused one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Lifecycle {
    #[serde(default)]
    pub on_timeout: OnTimeout,
    /// A request to a paused session resumes it first.
    #[serde(default)]
    pub auto_resume: bool,
    /// With `on_timeout: "pause"`: keep the processes (a memory pause; a jail's is turned into
    /// a disk pause at a clean daemon shutdown and lost in a crash) instead of only the files.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_memory: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    #[default]
    Kill,
    /// Pause: to disk (filesystem kept, `memory: false`), or in memory with `keep_memory`.
    Pause,
}

/// `POST /v1/sandbox/sessions/{id}/fork`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ForkSession {
    /// 1–100 copies (default 1).
    #[serde(default = "one")]
    pub count: u32,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ForkResult {
    pub sessions: Vec<Session>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_reject_unknown_fields_and_default() {
        let p: PauseSession = serde_json::from_str("{}").unwrap();
        assert_eq!(p.memory, None);
        assert!(serde_json::from_str::<PauseSession>(r#"{"memroy":false}"#).is_err());
        let f: ForkSession = serde_json::from_str("{}").unwrap();
        assert_eq!(f.count, 1);
        let l: Lifecycle =
            serde_json::from_str(r#"{"on_timeout":"pause","auto_resume":true}"#).unwrap();
        assert_eq!(l.on_timeout, OnTimeout::Pause);
        assert!(serde_json::from_str::<Lifecycle>(r#"{"on_timeout":"sleep"}"#).is_err());
        assert_eq!(
            PauseKind::parse(PauseKind::Disk.as_str()),
            Some(PauseKind::Disk)
        );
    }
}
