//! The in-sandbox agent: PID 1 of every sandbox.
//!
//! `setup` builds the root inside fresh namespaces, `confine` raises the walls, then `server`
//! answers the daemon: `exec` runs processes, `fs` does file operations inside the root only.

pub mod child;
pub mod confine;
pub mod egress;
pub mod exec;
pub mod fs;
pub mod guest;
pub mod interp;
pub mod killall;
pub mod net;
pub mod pty;
pub mod server;
pub mod setup;
pub mod watch;

/// Locks a mutex whose data stays consistent even if a holder panicked (maps of channels).
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
