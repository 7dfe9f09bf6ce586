//! The `Runtime` trait: how the daemon creates, reaches and destroys sandboxes without knowing
//! whether they are Linux jails or microVMs.
//!
//! A runtime hands out [`Sandbox`]es; each one exposes the agent channel (one protocol for every
//! runtime) and, where the runtime can, optional capabilities such as [`ResourceControl`]. The
//! API layer answers 501 for a capability a runtime does not offer.

use std::sync::Arc;

pub mod slots;

use async_trait::async_trait;
use koder_agent_protocol::{AgentClient, ClientError, ErrorCode as AgentCode};
use koder_api_types::ErrorCode;
use serde::{Deserialize, Serialize};

/// What a sandbox is made of, decided by the caller before creation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// Unique, caller-chosen id: `[A-Za-z0-9-]`, at most [`MAX_ID_LEN`] bytes.
    pub id: String,
    /// Image name; `host` is always available.
    pub image: String,
    pub limits: Limits,
    /// Added to the image's default environment for every exec.
    pub env: Vec<(String, String)>,
    /// Route the sandbox's outgoing connections and lookups to the daemon for decision
    /// (otherwise it has loopback only).
    pub egress: bool,
    /// Captured writable layers the sandbox's upper layer starts from, bottom first: a
    /// sandbox made from a snapshot or a fork. Each is a tar file on the host, as `koder-layer`
    /// writes them, or a directory [`Sandbox::copy_writable_layer`] made (read only from
    /// then on; its maker deletes it once no sandbox uses it). Runtimes that cannot take a
    /// directory refuse it with `InvalidSpec`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<std::path::PathBuf>,
    /// Volumes mounted into the sandbox, each at its own target (distinct, none under another:
    /// see `koder_agent_protocol::init::check_mount_targets`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeMount>,
    /// A clone of another sandbox's writable disk to start from (a fork's copy), made by
    /// [`Sandbox::clone_disk`] of the same runtime on this host: it becomes this sandbox's
    /// own disk, and [`SandboxSpec::layers`] are then only what sits below it
    /// ([`DiskClone::layers_below`]; applied layers are in the disk already). Runtimes that
    /// cannot take one refuse it with `InvalidSpec`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskClone>,
}

/// A sandbox's writable disk cloned while its filesystem was frozen, sharing every block with
/// it (a reflink): no byte is copied until one of the two writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskClone {
    /// The cloned image, on the host; its maker deletes it once the copies are made.
    pub image: std::path::PathBuf,
    pub size_mib: u64,
    /// The host uid (and gid) its files are stored under for the sandbox's uid 0: the cloned
    /// sandbox's range, or the range of the one it was itself cloned from.
    pub stored_ids_base: u32,
    /// Whether the cloned sandbox's layers sat below its disk (then the copy stacks the
    /// same layers below its clone), or were applied into it.
    pub layers_below: bool,
}

/// One volume attached to a sandbox. Files on a volume keep sandbox-relative ("neutral")
/// owners, so runtimes mount it through an id mapping onto the sandbox's own ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMount {
    /// Host directory: the root of the attached volume.
    pub source: std::path::PathBuf,
    /// Absolute, normalized path inside the sandbox (not `/`, nor under `/proc`, `/sys` or
    /// `/dev`).
    pub target: String,
    /// Mounted read-only: writes fail with `EROFS` and the sandbox cannot remount it.
    pub read_only: bool,
}

pub const MAX_ID_LEN: usize = 64;

/// Ids inside a sandbox: 0..65536, like a normal Linux system. The jail maps this many host ids
/// to each sandbox, and volumes (shared between sandboxes) hold owners in this range.
pub const SANDBOX_IDS: u32 = 65536;

/// Resource limits; `None` means the runtime's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// CPU time per wall second in thousandths of a core (1000 = one full core).
    pub cpu_millis: Option<u32>,
    pub memory_mib: Option<u64>,
    pub pids: Option<u64>,
    pub disk_mib: Option<u64>,
}

/// Live resource figures of a sandbox: the same counters whether a host cgroup (jail) or the
/// guest agent's cgroup (microVM) reports them.
pub use koder_agent_protocol::GuestUsage as Usage;

/// The counters an exec's verdict comes from: what [`ResourceControl::exec_counters`] reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExecCounters {
    pub oom_kills: u64,
    pub pids_max_hits: u64,
}

/// Which protections a runtime could put in force on this host, stated at start-up instead of
/// pretending (a rootless jail cannot enforce cgroup limits, for example).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enforcement {
    pub enforced: Vec<String>,
    pub not_enforced: Vec<NotEnforced>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotEnforced {
    pub what: String,
    pub why: String,
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("runtime unavailable: {0}")]
    Unavailable(String),
    #[error("invalid sandbox spec: {0}")]
    InvalidSpec(String),
    /// A feature this runtime (or its backend) does not have, whatever the host offers.
    #[error("not supported here: {0}")]
    Unsupported(String),
    #[error("no capacity: {0}")]
    Exhausted(String),
    #[error("sandbox failed to start: {0}")]
    Start(String),
    #[error("sandbox teardown incomplete: {0}")]
    Teardown(String),
    #[error("cgroup: {0}")]
    Cgroup(String),
    #[error(transparent)]
    Agent(#[from] ClientError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl RuntimeError {
    /// The API code this failure answers with (the transports derive their wire status from
    /// it). Capacity exhaustion is `RuntimeUnavailable`: the runtime cannot serve now; start,
    /// teardown, cgroup and I/O failures are the daemon's own (`Internal`).
    pub fn code(&self) -> ErrorCode {
        match self {
            RuntimeError::Unavailable(_) | RuntimeError::Exhausted(_) => {
                ErrorCode::RuntimeUnavailable
            }
            RuntimeError::InvalidSpec(_) => ErrorCode::InvalidArgument,
            RuntimeError::Unsupported(_) => ErrorCode::NotImplemented,
            RuntimeError::Agent(e) => agent_code(e),
            RuntimeError::Start(_)
            | RuntimeError::Teardown(_)
            | RuntimeError::Cgroup(_)
            | RuntimeError::Io { .. } => ErrorCode::Internal,
        }
    }

    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| RuntimeError::Io { context, source }
    }
}

/// The API code of an agent failure: what the agent refused (its code), a dead agent (the
/// session is gone) or a silent one. The one table: the session manager's errors are checked
/// against it.
pub fn agent_code(e: &ClientError) -> ErrorCode {
    match e {
        ClientError::Agent(a) => match a.code {
            AgentCode::NotFound => ErrorCode::NotFound,
            AgentCode::AlreadyExists
            | AgentCode::NotADirectory
            | AgentCode::IsADirectory
            | AgentCode::DirectoryNotEmpty => ErrorCode::Conflict,
            AgentCode::PermissionDenied => ErrorCode::PermissionDenied,
            AgentCode::InvalidPath | AgentCode::InvalidRequest | AgentCode::SpawnFailed => {
                ErrorCode::InvalidArgument
            }
            AgentCode::NoSpace => ErrorCode::FsQuotaExceeded,
            AgentCode::TooLarge => ErrorCode::PayloadTooLarge,
            AgentCode::Io => ErrorCode::Internal,
        },
        ClientError::Disconnected => ErrorCode::SessionStopped,
        ClientError::Timeout(_) => ErrorCode::AgentTimeout,
        ClientError::Protocol(_) | ClientError::Codec(_) => ErrorCode::Internal,
    }
}

/// What start-up reconciliation found left over from a previous run and removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileReport {
    pub sandboxes_removed: Vec<String>,
    /// Suspended sandboxes (see [`MemorySnapshot`]) kept because they are complete and wanted.
    #[serde(default)]
    pub suspended_kept: Vec<String>,
}

#[async_trait]
pub trait Runtime: Send + Sync {
    fn name(&self) -> &'static str;

    fn enforcement(&self) -> &Enforcement;

    async fn create(&self, spec: SandboxSpec) -> Result<Arc<dyn Sandbox>, RuntimeError>;

    /// Whether every sandbox slot is taken, so a create now would be refused as
    /// [`RuntimeError::Exhausted`] (a warm pool's sandboxes count: the caller may give one up
    /// first). `false` for runtimes without a bound.
    fn is_full(&self) -> bool {
        false
    }

    /// Removes every sandbox a previous run of this runtime left behind (processes, cgroups,
    /// sockets, writable layers). Call once at start-up, before creating sandboxes. Complete
    /// suspended sandboxes ([`MemorySnapshot`]) are kept: [`Runtime::reconcile_keeping`] says
    /// which of them are still wanted.
    async fn reconcile(&self) -> Result<ReconcileReport, RuntimeError>;

    /// [`Runtime::reconcile`], keeping only the suspended sandboxes `keep` names (and only
    /// complete ones: a half-written state is removed like any leftover).
    async fn reconcile_keeping(&self, _keep: &[String]) -> Result<ReconcileReport, RuntimeError> {
        self.reconcile().await
    }

    /// Starts a sandbox [`MemorySnapshot::suspend`] saved (in this run of the daemon or an
    /// earlier one) and reconnects to its agent: every process carries on as it was. Its
    /// saved state is used up. On `Exhausted` nothing was touched (try again later); on any
    /// other error the saved state is gone.
    async fn resume_suspended(&self, id: &str) -> Result<Arc<dyn Sandbox>, RuntimeError> {
        Err(RuntimeError::Unavailable(format!(
            "{} cannot resume sandbox {id}: no memory snapshots",
            self.name()
        )))
    }

    /// Removes what a suspended sandbox left (its saved state, disks); idempotent.
    async fn discard_suspended(&self, _id: &str) -> Result<(), RuntimeError> {
        Ok(())
    }
}

#[async_trait]
pub trait Sandbox: Send + Sync {
    fn id(&self) -> &str;

    /// The channel to this sandbox's agent.
    fn agent(&self) -> &AgentClient;

    /// Kills every process and removes every trace; idempotent.
    async fn destroy(&self) -> Result<(), RuntimeError>;

    /// Kills every process and returns once none runs any more, leaving what they leave
    /// (cgroups, mounts, files) to [`Sandbox::destroy`], which must still be called: the
    /// part of a destroy its caller waits for when the rest may finish later. `false` where
    /// the runtime cannot tell its processes are gone before its `destroy` (the default).
    async fn stop(&self) -> bool {
        false
    }

    /// Resource accounting and freezing, where the runtime can do them.
    fn resources(&self) -> Option<&dyn ResourceControl> {
        None
    }

    /// Saving the whole sandbox to files and bringing it back later, where the runtime can.
    fn memory_snapshot(&self) -> Option<&dyn MemorySnapshot> {
        None
    }

    /// Whether the sandbox's [`SandboxSpec::layers`] sit *below* its writable layer (shared,
    /// read-only lower layers): a capture of the writable layer then holds only what changed
    /// above them, deletions as whiteouts, and the filesystem is those layers plus the capture.
    /// `false` (the default): the layers were applied into the writable layer, whose capture
    /// is then the whole filesystem above the image.
    fn layers_below(&self) -> bool {
        false
    }

    /// Copies the writable layer, as a capture through the agent would record it, into the
    /// directory `into` (made by the caller, empty, on the host): a layer that
    /// [`SandboxSpec::layers`] takes as it is, with nothing stored or unpacked. The caller
    /// has frozen the sandbox. Blocks a thread of its own for as long as the copy takes.
    /// On error `into` holds a partial copy the caller discards; `Exhausted` means `bounds`
    /// were exceeded; `Unsupported` where the runtime cannot (then capture via the agent).
    async fn copy_writable_layer(
        &self,
        _into: &std::path::Path,
        _bounds: LayerBounds,
    ) -> Result<CopiedLayer, RuntimeError> {
        Err(RuntimeError::Unsupported(
            "this runtime copies writable layers through its agent only".into(),
        ))
    }

    /// Clones the writable disk into the directory `into` (made by the caller, empty, on the
    /// host) with its filesystem frozen meanwhile, sharing its blocks: what
    /// [`SandboxSpec::disk`] takes. The caller has frozen the sandbox's processes. `Ok(None)`
    /// where the runtime or the host's filesystem cannot share blocks (then copy the layer).
    async fn clone_disk(&self, _into: &std::path::Path) -> Result<Option<DiskClone>, RuntimeError> {
        Ok(None)
    }
}

/// Bounds on a layer [`Sandbox::copy_writable_layer`] makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerBounds {
    /// Sum of the apparent sizes of regular files.
    pub max_bytes: u64,
    pub max_entries: u64,
}

/// What [`Sandbox::copy_writable_layer`] copied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopiedLayer {
    pub entries: u64,
    pub bytes: u64,
}

/// Optional capability: the sandbox's whole state (memory, processes, devices; its disks stay
/// where they are) saved into files of the runtime, and the sandbox stopped: nothing runs and
/// nothing is held but those files, which outlive the daemon.
/// [`Runtime::resume_suspended`] brings it back by its id; [`Runtime::discard_suspended`]
/// removes the files.
#[async_trait]
pub trait MemorySnapshot: Send + Sync {
    /// Saves and stops the sandbox. Afterwards this handle is spent: its agent connection is
    /// closed, and `destroy` leaves the saved files alone. On error the sandbox runs on as
    /// before, unless it died on the way (then its agent connection is closed too and the
    /// caller ends it).
    async fn suspend(&self) -> Result<(), RuntimeError>;
}

/// Optional capability: live usage, peak reset and freeze/thaw (pause). Asynchronous because a
/// microVM answers through its guest agent.
#[async_trait]
pub trait ResourceControl: Send + Sync {
    async fn usage(&self) -> Result<Usage, RuntimeError>;
    /// The OOM-kill and pids-limit counters of [`ResourceControl::usage`] alone, read around
    /// every exec: runtimes that can read them more cheaply than the whole usage do.
    async fn exec_counters(&self) -> Result<ExecCounters, RuntimeError> {
        let u = self.usage().await?;
        Ok(ExecCounters {
            oom_kills: u.oom_kills,
            pids_max_hits: u.pids_max_hits,
        })
    }
    /// The peak memory of [`ResourceControl::usage`] alone, as cheaply as the runtime can.
    async fn memory_peak(&self) -> Result<u64, RuntimeError> {
        Ok(self.usage().await?.memory_peak_bytes)
    }
    /// Applies new limits to a running sandbox (warm-pool sandboxes learn theirs at hand-out).
    async fn set_limits(&self, limits: &Limits) -> Result<(), RuntimeError>;
    async fn reset_memory_peak(&self) -> Result<(), RuntimeError>;
    async fn freeze(&self) -> Result<(), RuntimeError>;
    async fn thaw(&self) -> Result<(), RuntimeError>;
}

/// Checks a sandbox id: it names host directories, sockets and cgroups.
pub fn validate_id(id: &str) -> Result<(), RuntimeError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !id.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(RuntimeError::InvalidSpec(format!(
            "sandbox id must be 1-{MAX_ID_LEN} characters of [A-Za-z0-9-], not starting with '-'"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        assert!(validate_id("abc-123").is_ok());
        for bad in [
            "",
            "-x",
            "a/b",
            "..",
            "a b",
            "ä",
            &"x".repeat(MAX_ID_LEN + 1),
        ] {
            assert!(validate_id(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn codes_are_api_codes() {
        let cases = [
            (
                RuntimeError::Unavailable("no kvm".into()),
                ErrorCode::RuntimeUnavailable,
            ),
            (
                RuntimeError::Exhausted("slots".into()),
                ErrorCode::RuntimeUnavailable,
            ),
            (
                RuntimeError::InvalidSpec("id".into()),
                ErrorCode::InvalidArgument,
            ),
            (RuntimeError::Start("x".into()), ErrorCode::Internal),
            (RuntimeError::Teardown("x".into()), ErrorCode::Internal),
            (RuntimeError::Cgroup("x".into()), ErrorCode::Internal),
            (
                RuntimeError::io("ctx")(std::io::ErrorKind::Other.into()),
                ErrorCode::Internal,
            ),
            (ClientError::Disconnected.into(), ErrorCode::SessionStopped),
            (
                ClientError::Timeout(std::time::Duration::from_secs(1)).into(),
                ErrorCode::AgentTimeout,
            ),
            (
                ClientError::Protocol("bad frame".into()).into(),
                ErrorCode::Internal,
            ),
        ];
        for (err, code) in cases {
            assert_eq!(err.code(), code, "{err}");
        }
    }

    #[test]
    fn agent_refusals_keep_their_meaning() {
        let cases = [
            (AgentCode::NotFound, ErrorCode::NotFound),
            (AgentCode::AlreadyExists, ErrorCode::Conflict),
            (AgentCode::DirectoryNotEmpty, ErrorCode::Conflict),
            (AgentCode::PermissionDenied, ErrorCode::PermissionDenied),
            (AgentCode::InvalidPath, ErrorCode::InvalidArgument),
            (AgentCode::SpawnFailed, ErrorCode::InvalidArgument),
            (AgentCode::NoSpace, ErrorCode::FsQuotaExceeded),
            (AgentCode::TooLarge, ErrorCode::PayloadTooLarge),
            (AgentCode::Io, ErrorCode::Internal),
        ];
        for (agent, code) in cases {
            let err = RuntimeError::from(ClientError::from(koder_agent_protocol::AgentError::new(
                agent, "refused",
            )));
            assert_eq!(err.code(), code, "{agent:?}");
        }
    }
}
