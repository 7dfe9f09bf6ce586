//! What E2B keeps per sandbox beyond the session manager.

use std::collections::HashMap;

use parking_lot::Mutex;

use super::filesystem::watcher::Watcher;
use super::process::table::Proc;

/// E2B state of one sandbox that the session manager does not keep.
#[derive(Default)]
pub struct SandboxCtx {
    pub procs: Mutex<HashMap<u32, Proc>>,
    pub watchers: Mutex<HashMap<String, Watcher>>,
    /// The sandbox's default JavaScript context (the default Python one is the manager's).
    pub js_context: tokio::sync::Mutex<Option<String>>,
}
