//! A running session's in-memory half (the store holds the rest). A leaf: the manager, egress
//! and the live features share it without importing one another.

use std::collections::VecDeque;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use koder_api_types::ErrorEntry;
use koder_runtime::Sandbox;
use parking_lot::Mutex;

use crate::execs::Registry;

/// Reports kept in a session's error ring (the oldest goes first).
pub const MAX_ERRORS: usize = 50;

/// What the manager keeps of a running session besides its record.
pub(crate) struct Live {
    pub(crate) sandbox: Arc<dyn Sandbox>,
    pub(crate) tenant_id: String,
    pub(crate) language: String,
    /// `jail` or `microvm`, and the image's name: what spans describe an exec with.
    pub(crate) runtime: String,
    pub(crate) image: String,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) running_execs: AtomicU32,
    pub(crate) execs: Registry,
    /// The error ring: the last [`MAX_ERRORS`] reports.
    pub(crate) errors: Mutex<VecDeque<ErrorEntry>>,
    /// Port pinned with `POST .../preview`; otherwise the upstream is auto-detected.
    pub(crate) preview_port: Mutex<Option<u16>>,
    pub(crate) paused: Mutex<bool>,
    /// The policy its egress loop decides by; `None` when the sandbox has no egress path
    /// (created with network mode `none`).
    pub(crate) policy: Option<crate::egress::SharedPolicy>,
    /// The secrets its egress injects and E2B's header rules, set once the session is
    /// recorded.
    pub(crate) secrets: crate::secrets::SharedBindings,
    /// Its sandbox mounts volumes: they are free for another session only after its teardown.
    pub(crate) volumes: bool,
}
