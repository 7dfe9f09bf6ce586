//! The REST API's JSON shapes (contract: `docs/API.md`). snake_case, RFC 3339 UTC times,
//! sizes and durations explicit in field names. Requests reject unknown fields so a typo is a
//! 400, not a silently ignored option.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

pub mod contexts;
mod images;
mod secrets;
mod state;
mod volumes;
pub mod webhooks;
pub use images::{Build, BuildState, BuildStep, Image, ImageLanguage, ImageList};
pub use secrets::{CreateSecret, Secret, SecretList};
pub use state::{
    CreateSnapshot, ForkResult, ForkSession, Lifecycle, OnTimeout, PauseKind, PauseSession,
    RestoreSnapshot, Snapshot, SnapshotList,
};
pub use volumes::{CreateVolume, SessionVolume, Volume, VolumeList, VolumeMountRequest, VolumeUse};

/// Stable error codes (API.md "Errors").
pub mod codes {
    pub const AUTH: &str = "SANDBOX-AUTH-001";
    /// 403: the credential is valid but its scopes do not cover the operation.
    pub const AUTH_SCOPE: &str = "SANDBOX-AUTH-SCOPE";
    /// 429 with `Retry-After`: the tenant's request rate, concurrent execs or open streams.
    pub const RATE_LIMITED: &str = "SANDBOX-RATE-LIMITED";
    pub const NOT_FOUND: &str = "SANDBOX-NOT-FOUND";
    pub const INVALID_ARGUMENT: &str = "SANDBOX-INVALID-ARGUMENT";
    pub const QUOTA_SESSIONS: &str = "SANDBOX-QUOTA-SESSIONS";
    pub const QUOTA_MINUTES: &str = "SANDBOX-QUOTA-MINUTES";
    pub const PLAN_REQUIRED: &str = "SANDBOX-PLAN-REQUIRED";
    pub const RUNTIME_UNAVAILABLE: &str = "SANDBOX-RUNTIME-UNAVAILABLE-001";
    pub const PREVIEW_NOT_LISTENING: &str = "SANDBOX-PREVIEW-NOT-LISTENING";
    pub const PAYLOAD_TOO_LARGE: &str = "SANDBOX-PAYLOAD-TOO-LARGE";
    pub const FS_QUOTA_EXCEEDED: &str = "SANDBOX-FS-QUOTA-EXCEEDED";
    pub const CONFLICT: &str = "SANDBOX-CONFLICT";
    /// 403: the sandbox refused the operation (read-only image, permissions).
    pub const PERMISSION_DENIED: &str = "SANDBOX-PERMISSION-DENIED";
    pub const NOT_IMPLEMENTED: &str = "SANDBOX-NOT-IMPLEMENTED";
    pub const INTERNAL: &str = "SANDBOX-INTERNAL";
    pub const UNSUPPORTED_MEDIA_TYPE: &str = "SANDBOX-UNSUPPORTED-MEDIA-TYPE";
    /// 410: the session ended under the request because its sandbox died (agent exited).
    pub const SESSION_STOPPED: &str = "SANDBOX-SESSION-STOPPED";
    /// 504: the sandbox's agent did not answer in time.
    pub const AGENT_TIMEOUT: &str = "SANDBOX-AGENT-TIMEOUT";
    /// 507: the tenant's snapshot storage (`snapshot_storage_mib`) has no room for this capture.
    pub const QUOTA_SNAPSHOT_STORAGE: &str = "SANDBOX-QUOTA-SNAPSHOT-STORAGE";
    /// 507: the tenant's volumes (`volume_storage_mib`) have no room for this one.
    pub const QUOTA_VOLUME_STORAGE: &str = "SANDBOX-QUOTA-VOLUME-STORAGE";
    /// 409: the volume is in use (mounted by a session, or already mounted read-write).
    pub const VOLUME_BUSY: &str = "SANDBOX-VOLUME-BUSY";
    /// 404: no image of that name on this server (`GET /v1/sandbox/images` lists them).
    pub const IMAGE_NOT_FOUND: &str = "SANDBOX-IMAGE-NOT-FOUND";
    /// 409: the image is in use (a running or paused session, or a warm pool) and stays.
    pub const IMAGE_IN_USE: &str = "SANDBOX-IMAGE-IN-USE";
    /// 400: a network allow/deny entry is malformed, never reachable (loopback) or guarded
    /// (a private range outside the server's `[network] internal`).
    pub const NETWORK_RULE: &str = "SANDBOX-NETWORK-RULE";
    /// 404: no secret of that name for this tenant.
    pub const SECRET_NOT_FOUND: &str = "SANDBOX-SECRET-NOT-FOUND";
    /// 400: a webhook URL reaches an address the SSRF guard refuses (loopback, private,
    /// reserved).
    pub const WEBHOOK_URL_REFUSED: &str = "SANDBOX-WEBHOOK-URL-REFUSED";
    /// 400: a template spec that does not parse or check (TOML or JSON).
    pub const IMAGE_BUILD_INVALID_SPEC: &str = "SANDBOX-IMAGE-BUILD-INVALID-SPEC";
    /// 404: no image build of that id on this server.
    pub const IMAGE_BUILD_NOT_FOUND: &str = "SANDBOX-IMAGE-BUILD-NOT-FOUND";
    /// In a failed build's status (not an HTTP error): a step exited non-zero.
    pub const IMAGE_BUILD_STEP_FAILED: &str = "SANDBOX-IMAGE-BUILD-STEP-FAILED";
    /// In a failed build's status: the build could not run (its sandbox, the store).
    pub const IMAGE_BUILD_FAILED: &str = "SANDBOX-IMAGE-BUILD-FAILED";
    /// 503: the image's ready command did not succeed within its timeout; the session was
    /// destroyed.
    pub const IMAGE_NOT_READY: &str = "SANDBOX-IMAGE-NOT-READY";
    /// 502: the node holding the session (or chosen for a create) could not be reached to
    /// forward the request to it.
    pub const NODE_UNREACHABLE: &str = "SANDBOX-NODE-UNREACHABLE";
    /// 401: a request claimed to come from another node of the cluster but its proof (an
    /// HMAC under the shared cluster secret) is missing, malformed, stale or wrong.
    pub const NODE_AUTH: &str = "SANDBOX-NODE-AUTH";

    /// Exec verdicts (inside an exec result, not HTTP errors).
    pub const EXEC_KILLED_OOM: &str = "SANDBOX-EXEC-KILLED-OOM";
    pub const EXEC_TIMEOUT: &str = "SANDBOX-EXEC-TIMEOUT";
    pub const EXEC_KILLED_CPU: &str = "SANDBOX-EXEC-KILLED-CPU";
    pub const EXEC_KILLED_PIDS: &str = "SANDBOX-EXEC-KILLED-PIDS";
    pub const EXEC_KILLED: &str = "SANDBOX-EXEC-KILLED";
}

/// The stable codes of failed requests, shared by every layer: domain errors carry one, each
/// transport maps it to its wire (an HTTP status, a Connect code). `as_str` is the
/// `SANDBOX-...` string of the REST error body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    Auth,
    AuthScope,
    RateLimited,
    NotFound,
    InvalidArgument,
    QuotaSessions,
    QuotaMinutes,
    PlanRequired,
    RuntimeUnavailable,
    PreviewNotListening,
    PayloadTooLarge,
    FsQuotaExceeded,
    Conflict,
    PermissionDenied,
    NotImplemented,
    Internal,
    UnsupportedMediaType,
    SessionStopped,
    AgentTimeout,
    QuotaSnapshotStorage,
    QuotaVolumeStorage,
    VolumeBusy,
    ImageNotFound,
    ImageInUse,
    NetworkRule,
    SecretNotFound,
    WebhookUrlRefused,
    ImageBuildInvalidSpec,
    ImageBuildNotFound,
    ImageBuildStepFailed,
    ImageBuildFailed,
    ImageNotReady,
    NodeUnreachable,
    NodeAuth,
}

impl ErrorCode {
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Auth => codes::AUTH,
            ErrorCode::AuthScope => codes::AUTH_SCOPE,
            ErrorCode::RateLimited => codes::RATE_LIMITED,
            ErrorCode::NotFound => codes::NOT_FOUND,
            ErrorCode::InvalidArgument => codes::INVALID_ARGUMENT,
            ErrorCode::QuotaSessions => codes::QUOTA_SESSIONS,
            ErrorCode::QuotaMinutes => codes::QUOTA_MINUTES,
            ErrorCode::PlanRequired => codes::PLAN_REQUIRED,
            ErrorCode::RuntimeUnavailable => codes::RUNTIME_UNAVAILABLE,
            ErrorCode::PreviewNotListening => codes::PREVIEW_NOT_LISTENING,
            ErrorCode::PayloadTooLarge => codes::PAYLOAD_TOO_LARGE,
            ErrorCode::FsQuotaExceeded => codes::FS_QUOTA_EXCEEDED,
            ErrorCode::Conflict => codes::CONFLICT,
            ErrorCode::PermissionDenied => codes::PERMISSION_DENIED,
            ErrorCode::NotImplemented => codes::NOT_IMPLEMENTED,
            ErrorCode::Internal => codes::INTERNAL,
            ErrorCode::UnsupportedMediaType => codes::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::SessionStopped => codes::SESSION_STOPPED,
            ErrorCode::AgentTimeout => codes::AGENT_TIMEOUT,
            ErrorCode::QuotaSnapshotStorage => codes::QUOTA_SNAPSHOT_STORAGE,
            ErrorCode::QuotaVolumeStorage => codes::QUOTA_VOLUME_STORAGE,
            ErrorCode::VolumeBusy => codes::VOLUME_BUSY,
            ErrorCode::ImageNotFound => codes::IMAGE_NOT_FOUND,
            ErrorCode::ImageInUse => codes::IMAGE_IN_USE,
            ErrorCode::NetworkRule => codes::NETWORK_RULE,
            ErrorCode::SecretNotFound => codes::SECRET_NOT_FOUND,
            ErrorCode::WebhookUrlRefused => codes::WEBHOOK_URL_REFUSED,
            ErrorCode::ImageBuildInvalidSpec => codes::IMAGE_BUILD_INVALID_SPEC,
            ErrorCode::ImageBuildNotFound => codes::IMAGE_BUILD_NOT_FOUND,
            ErrorCode::ImageBuildStepFailed => codes::IMAGE_BUILD_STEP_FAILED,
            ErrorCode::ImageBuildFailed => codes::IMAGE_BUILD_FAILED,
            ErrorCode::ImageNotReady => codes::IMAGE_NOT_READY,
            ErrorCode::NodeUnreachable => codes::NODE_UNREACHABLE,
            ErrorCode::NodeAuth => codes::NODE_AUTH,
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every non-2xx answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ErrorDetail {
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_millis: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_mib: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    #[default]
    None,
    Open,
    Allowlist,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Network {
    #[serde(default)]
    pub mode: NetworkMode,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// Entries refused even when an allow entry (or mode `open`) covers them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
}

/// `POST /v1/sandbox/sessions`
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    /// `python`, `node` or `bash` (default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// `jail` (default) or `microvm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "object::optional"
    )]
    pub limits: Option<Limits>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "object::optional"
    )]
    pub network: Option<Network>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Seconds until the session ends (or pauses); at most the server's `max_timeout_s`, the
    /// `maximum` of the document a daemon serves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub timeout_s: Option<u64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// Start from this snapshot's filesystem (image, runtime and language are the snapshot's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_snapshot: Option<String>,
    /// What the timeout does (kill, or pause to disk) and whether requests wake a paused session.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "object::optional"
    )]
    pub lifecycle: Option<Lifecycle>,
    /// Volumes to mount (at most 16, distinct paths, none under another).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "object::list"
    )]
    pub volumes: Vec<VolumeMountRequest>,
    /// Secrets (by name) the session may use: its environment holds a placeholder under each
    /// name, which egress replaces with the value in requests to the secret's hosts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    Starting,
    Running,
    Paused,
    Stopped,
    /// Ended because the node holding its sandbox was lost (its heartbeat stopped); the
    /// session's `end_reason` names the node. Listed until deleted, which acknowledges it.
    Lost,
}

impl SessionState {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionState::Starting => "starting",
            SessionState::Running => "running",
            SessionState::Paused => "paused",
            SessionState::Stopped => "stopped",
            SessionState::Lost => "lost",
        }
    }

    /// Stopped or lost: nothing runs and nothing can resume it.
    pub fn is_ended(self) -> bool {
        matches!(self, SessionState::Stopped | SessionState::Lost)
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "starting" => SessionState::Starting,
            "running" => SessionState::Running,
            "paused" => SessionState::Paused,
            "stopped" => SessionState::Stopped,
            "lost" => SessionState::Lost,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Session {
    pub id: String,
    pub tenant_id: String,
    pub language: String,
    pub image: String,
    pub runtime: String,
    pub state: SessionState,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// Effective limits.
    pub limits: Limits,
    pub network: Network,
    pub metadata: BTreeMap<String, String>,
    /// Why a stopped session ended: `deleted`, `expired`, `agent exited` (its sandbox died)...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_reason: Option<String>,
    /// Volumes it has mounted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<SessionVolume>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SessionList {
    pub sessions: Vec<Session>,
}

/// `POST /v1/sandbox/sessions/{id}/kill-processes`: how many sandbox processes were killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct KilledProcesses {
    pub killed: u32,
}

/// `POST /v1/sandbox/sessions/{id}/timeout`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SetTimeout {
    /// From now; at most the server's `max_timeout_s`, the `maximum` of the document a daemon
    /// serves.
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub timeout_s: u64,
}

/// `POST /v1/sandbox/sessions/{id}/exec`: exactly one of `cmd`, `shell`, `code`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// argv, run without a shell; the first names the program.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_items = 1))]
    pub cmd: Option<Vec<String>>,
    /// Run by `/bin/bash -c`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<String>,
    /// Source run by `language`'s interpreter (default: the session's language).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// At most the server's `max_exec_timeout_ms`, the `maximum` of the document a daemon
    /// serves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub timeout_ms: Option<u64>,
    /// Start and return 202 at once; follow with `GET .../execs/{exec_id}[/stream]`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub background: bool,
    /// `root` (default), `user` (uid 1000, home /home/user), or any other account of the
    /// sandbox's /etc/passwd by name or uid (a uid no account has runs with that gid and `/`
    /// as its home); one the sandbox lacks is a 400.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// 202 answer of a background exec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ExecStarted {
    pub exec_id: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ExecState {
    Running,
    Exited,
}

/// `GET .../execs/{exec_id}`: a running exec's status, or a finished one's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ExecStatus {
    pub exec_id: String,
    pub command: Vec<String>,
    pub background: bool,
    pub state: ExecState,
    pub started_at: DateTime<Utc>,
    pub pid: Option<u32>,
    /// Present once exited; stdout/stderr hold the retained (most recent) output.
    pub result: Option<ExecResult>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ExecList {
    pub execs: Vec<ExecStatus>,
}

/// `POST .../execs/{exec_id}/signal`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// `SIGTERM`, `TERM` or a number.
    pub signal: String,
}

/// `POST .../errors`: an error a client saw (e.g. in the app the session serves).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ReportError {
    /// At most 256 bytes.
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 256))]
    pub source: String,
    /// At most 16 KiB.
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 16384))]
    pub message: String,
    /// At most 64 KiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 65536))]
    pub stack: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ErrorEntry {
    pub at: DateTime<Utc>,
    pub source: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ErrorList {
    /// Oldest first; at most the last 50.
    pub errors: Vec<ErrorEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ExecResult {
    pub exec_id: String,
    pub exit_code: Option<i32>,
    /// Number of the signal that ended the process, if one did.
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration_ms: u64,
    pub peak_memory_kib: Option<u64>,
    /// One of the exec verdict codes, or null for a normal exit.
    pub verdict: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum EntryType {
    File,
    Dir,
    Symlink,
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct FileEntry {
    pub name: String,
    pub path: String,
    #[serde(rename = "type")]
    pub kind: EntryType,
    pub size: u64,
    pub mode: u32,
    pub modified_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    /// Owner inside the sandbox (0 = root, 1000 = user).
    #[serde(default)]
    pub uid: u32,
    #[serde(default)]
    pub gid: u32,
    /// The file's metadata (extended attributes `user.e2b.<key>`, as E2B's envd stores them):
    /// printable US-ASCII keys and values, at most 4096 bytes in all. Absent when it has none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct FileList {
    pub entries: Vec<FileEntry>,
    /// True when the listing was cut at the server's entry limit.
    #[serde(default)]
    pub truncated: bool,
}

/// `GET /v1/sandbox/sessions/{id}/metrics`: live resource use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SessionMetrics {
    /// CPU time used by the session's processes since it started.
    pub cpu_used_ms: u64,
    pub memory_current_kib: u64,
    /// Highest memory use since the last exec started (or the session started).
    pub memory_peak_kib: u64,
    pub memory_limit_kib: Option<u64>,
    pub oom_kills: u64,
    pub pids_current: u64,
    pub pids_limit: Option<u64>,
    pub disk_used_kib: u64,
    pub disk_total_kib: u64,
}

/// `GET /v1/sandbox/sessions/{id}/events`: one thing that happened to the session, as the
/// webhook delivery of the same event says it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SessionEvent {
    /// The event's place in the session's log: 1 for its first, one more for each next;
    /// `after` pages with it.
    pub seq: u64,
    /// `evt_...`, the `id` of the webhook delivery of this event.
    pub id: String,
    /// `session.created`, `session.paused`, `session.resumed`, `session.stopped` or
    /// `exec.verdict`.
    #[serde(rename = "type")]
    pub kind: String,
    pub created_at: DateTime<Utc>,
    /// As in the webhook delivery (docs/API-ADDITIONS.md "Webhooks").
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub data: serde_json::Value,
}

/// `GET /v1/sandbox/sessions/{id}/events`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SessionEventList {
    /// Oldest first.
    pub events: Vec<SessionEvent>,
    /// More events follow the last one listed: ask again with `after` its `seq`.
    pub more: bool,
}

/// Tenant as seen by an administrator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct TenantInfo {
    pub id: String,
    pub name: String,
    /// `none` has no sandbox access (402 on create).
    pub plan: String,
    pub max_sessions: Option<u32>,
    pub daily_session_minutes: Option<u64>,
    pub created_at: DateTime<Utc>,
    pub live_sessions: u64,
    pub session_minutes_today: u64,
}

/// `PUT /v1/sandbox/admin/tenants/{id}`
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PutTenant {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub plan: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sessions: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daily_session_minutes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct TenantList {
    pub tenants: Vec<TenantInfo>,
}

/// A daemon sharing the store (`GET /v1/sandbox/admin/nodes`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct NodeInfo {
    pub id: String,
    /// Base URL the other nodes reach it at.
    pub address: String,
    /// `http://host:port` of its gRPC face, where gRPC calls for its sessions are forwarded;
    /// absent when it serves no gRPC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_address: Option<String>,
    pub runtimes: Vec<String>,
    pub capacity_sandboxes: u64,
    /// At its last heartbeat.
    pub load_sandboxes: u64,
    /// `up`, `lost` (no heartbeat within the timeout) or `left` (shut down cleanly).
    pub state: String,
    pub started_at: DateTime<Utc>,
    pub heartbeat_at: DateTime<Utc>,
    /// When it was marked lost or left.
    pub down_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct NodeList {
    pub nodes: Vec<NodeInfo>,
}

/// A newly issued API key; shown once, stored only as a hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct IssuedKey {
    pub tenant_id: String,
    pub api_key: String,
}

/// One network attempt of a sandbox (`GET /v1/sandbox/audit/network`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct AuditEntry {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub session_id: String,
    /// `tcp` (a connection) or `dns` (a name lookup).
    pub proto: String,
    /// Destination address (or the looked-up name for `dns`).
    pub dest: String,
    pub port: u16,
    /// TLS SNI / HTTP Host of a connection.
    pub name: Option<String>,
    pub allowed: bool,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct AuditPage {
    /// Newest first.
    pub entries: Vec<AuditEntry>,
    /// Pass as `before` for the next (older) page; absent on the last page.
    pub next_before: Option<i64>,
}

/// `POST .../files/mkdir`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct MakeDir {
    /// At most 4096 bytes, no NUL; relative paths are below /workspace.
    #[cfg_attr(
        feature = "openapi",
        schema(min_length = 1, max_length = 4096, pattern = "^[^\\x00]*$")
    )]
    pub path: String,
}

/// `POST .../files/move`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct MoveFile {
    /// At most 4096 bytes, no NUL; relative paths are below /workspace.
    #[cfg_attr(
        feature = "openapi",
        schema(min_length = 1, max_length = 4096, pattern = "^[^\\x00]*$")
    )]
    pub from: String,
    #[cfg_attr(
        feature = "openapi",
        schema(min_length = 1, max_length = 4096, pattern = "^[^\\x00]*$")
    )]
    pub to: String,
}

/// Derived `Deserialize` reads a struct from a JSON array too (its fields by position). The
/// API documents these fields as objects, so an array there is refused like any other wrong
/// type. (The body itself is held to an object by the daemon's JSON extractor.)
mod object {
    use serde::de::{DeserializeOwned, Error};
    use serde::{Deserialize, Deserializer};
    use serde_json::{Map, Value};

    fn from_map<T: DeserializeOwned, E: Error>(map: Map<String, Value>) -> Result<T, E> {
        T::deserialize(Value::Object(map)).map_err(E::custom)
    }

    pub fn optional<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: DeserializeOwned,
    {
        Option::<Map<String, Value>>::deserialize(d)?
            .map(from_map)
            .transpose()
    }

    pub fn list<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: DeserializeOwned,
    {
        Vec::<Map<String, Value>>::deserialize(d)?
            .into_iter()
            .map(from_map)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_objects_are_not_read_from_arrays() {
        for body in [
            r#"{"limits":[null,null]}"#,
            r#"{"limits":[100]}"#,
            r#"{"network":["open"]}"#,
            r#"{"lifecycle":["pause"]}"#,
            r#"{"volumes":[["data","/data"]]}"#,
        ] {
            let err = serde_json::from_str::<CreateSession>(body).unwrap_err();
            assert!(err.to_string().contains("expected a map"), "{body}: {err}");
        }
        let ok = r#"{"limits":{"memory_mib":64},"network":{"mode":"open"},"lifecycle":{"on_timeout":"pause"},"volumes":[{"name":"data","path":"/data"}]}"#;
        let req: CreateSession = serde_json::from_str(ok).unwrap();
        assert_eq!(req.limits.and_then(|l| l.memory_mib), Some(64));
        assert_eq!(req.volumes[0].path, "/data");
        assert!(req.lifecycle.is_some() && req.network.is_some());
        let inner =
            serde_json::from_str::<CreateSession>(r#"{"limits":{"memory":1}}"#).unwrap_err();
        assert!(
            inner.to_string().contains("unknown field `memory`"),
            "{inner}"
        );
    }

    #[test]
    fn unknown_request_fields_are_rejected() {
        let err = serde_json::from_str::<CreateSession>(r#"{"languag":"python"}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `languag`"), "{err}");
        assert!(serde_json::from_str::<ExecRequest>(r#"{"cmd":"ls"}"#).is_err());
    }

    #[test]
    fn session_round_trips_in_snake_case() {
        let json = r#"{"language":"python","limits":{"memory_mib":256},"network":{"mode":"allowlist","allow":["pypi.org"]},"timeout_s":60}"#;
        let req: CreateSession = serde_json::from_str(json).unwrap();
        assert_eq!(req.network.as_ref().unwrap().mode, NetworkMode::Allowlist);
        assert_eq!(req.limits.unwrap().memory_mib, Some(256));
        let entry = FileEntry {
            name: "a".into(),
            path: "/a".into(),
            kind: EntryType::Dir,
            size: 0,
            mode: 0o755,
            modified_at: DateTime::from_timestamp(0, 0).unwrap(),
            symlink_target: None,
            uid: 0,
            gid: 0,
            metadata: BTreeMap::new(),
        };
        let v = serde_json::to_value(&entry).unwrap();
        assert!(
            v.get("metadata").is_none(),
            "empty metadata is left out: {v}"
        );
        assert_eq!(v["type"], "dir");
        assert_eq!(v["modified_at"], "1970-01-01T00:00:00Z");
    }
}
