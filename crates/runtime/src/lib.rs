//! The `Runtime` trait: how the daemon creates, reaches and destroys sandboxes without knowing
//! whether they are Linux jails or microVMs.
//!
//! A runtime hands out [`Sandbox`]es; each one exposes the agent channel (one protocol for every
//! runtime) and, where the runtime can, optional capabilities such as [`ResourceControl`]. The
//! API layer answers 501 for a capability a runtime does not offer.

use std::sync::Arc;

pub mod slots;

use async_trait::async_trait;
use koder_agent_protocol::{AgentClient, ClientError};
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
    /// Captured writable layers (tar files on the host, as `koder-layer` writes them) the
    /// sandbox's upper layer starts from, bottom first: a sandbox made from a snapshot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<std::path::PathBuf>,
}

pub const MAX_ID_LEN: usize = 64;

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
    /// Stable code for the API layer.
    pub fn code(&self) -> &'static str {
        match self {
            RuntimeError::Unavailable(_) => "SANDBOX-RUNTIME-UNAVAILABLE-001",
            RuntimeError::InvalidSpec(_) => "SANDBOX-INVALID-ARGUMENT",
            RuntimeError::Exhausted(_) => "SANDBOX-RUNTIME-EXHAUSTED",
            RuntimeError::Start(_) => "SANDBOX-RUNTIME-START",
            RuntimeError::Teardown(_) => "SANDBOX-RUNTIME-TEARDOWN",
            RuntimeError::Cgroup(_) => "SANDBOX-RUNTIME-CGROUP",
            RuntimeError::Agent(_) => "SANDBOX-AGENT",
            RuntimeError::Io { .. } => "SANDBOX-RUNTIME-IO",
        }
    }

    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| RuntimeError::Io { context, source }
    }
}

/// What start-up reconciliation found left over from a previous run and removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileReport {
    pub sandboxes_removed: Vec<String>,
}

#[async_trait]
pub trait Runtime: Send + Sync {
    fn name(&self) -> &'static str;

    fn enforcement(&self) -> &Enforcement;

    async fn create(&self, spec: SandboxSpec) -> Result<Arc<dyn Sandbox>, RuntimeError>;

    /// Removes every sandbox a previous run of this runtime left behind (processes, cgroups,
    /// sockets, writable layers). Call once at start-up, before creating sandboxes.
    async fn reconcile(&self) -> Result<ReconcileReport, RuntimeError>;
}

#[async_trait]
pub trait Sandbox: Send + Sync {
    fn id(&self) -> &str;

    /// The channel to this sandbox's agent.
    fn agent(&self) -> &AgentClient;

    /// Kills every process and removes every trace; idempotent.
    async fn destroy(&self) -> Result<(), RuntimeError>;

    /// Resource accounting and freezing, where the runtime can do them.
    fn resources(&self) -> Option<&dyn ResourceControl> {
        None
    }
}

/// Optional capability: live usage, peak reset and freeze/thaw (pause). Asynchronous because a
/// microVM answers through its guest agent.
#[async_trait]
pub trait ResourceControl: Send + Sync {
    async fn usage(&self) -> Result<Usage, RuntimeError>;
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
}
