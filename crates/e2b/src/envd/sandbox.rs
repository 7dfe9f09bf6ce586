//! What E2B keeps per sandbox beyond the session manager.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;

use parking_lot::Mutex;

use super::filesystem::watcher::Watcher;
use super::process::table::Proc;
use super::user::User;

/// E2B state of one sandbox that the session manager does not keep.
#[derive(Default)]
pub struct SandboxCtx {
    pub procs: Mutex<HashMap<u32, Proc>>,
    pub watchers: Mutex<HashMap<String, Watcher>>,
    /// The languages whose default context this daemon has made sure of (the agent keeps
    /// them; a daemon restart asks again, which finds them).
    pub default_contexts: tokio::sync::Mutex<std::collections::BTreeSet<&'static str>>,
    /// Whether its ports take requests without the traffic access token (E2B's
    /// `allowPublicTraffic`, true unless the create said false). Only a create through E2B
    /// sets it: a sandbox this adapter holds no record of (made natively, or before a daemon
    /// restart) keeps its ports behind the token.
    pub public_traffic: AtomicBool,
    /// E2B's `maskRequestHost`: the `Host` its ports' requests arrive with (`${PORT}` replaced
    /// by the port) instead of the name the client asked for.
    pub mask_request_host: Mutex<Option<String>>,
    /// Whom its requests act as when they name no user, and where its processes start when
    /// they name no directory: found once, from the image it was created on.
    pub defaults: tokio::sync::OnceCell<Defaults>,
}

/// A sandbox's default user and working directory: on a template built through E2B, the
/// template's last `USER` and `WORKDIR` (E2B persists them to its sandboxes); elsewhere `user`
/// in its home.
#[derive(Debug, Clone)]
pub struct Defaults {
    pub user: User,
    pub workdir: Option<String>,
}
