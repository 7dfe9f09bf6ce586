//! Locking shared by both phases.

/// Locks a mutex whose data stays consistent even if a holder panicked (maps of channels).
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
