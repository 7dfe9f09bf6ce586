//! Test hook, debug builds only: `KODER_TEST_CRASH_AT=<point>` in the daemon's environment
//! makes the whole process abort at that point, so tests can crash a daemon exactly there.
//! Points: `jail-before-release` (a child cloned, its id maps written, not yet released to
//! exec nor, on cgroup v1, moved into its cgroup),
//! `layer-before-commit` (a layer's blob stored, its row not yet written),
//! `restore-before-install` (a restored sandbox started, not yet the session's),
//! `vm-suspend-before-commit` (a microVM's memory saved to its partial file, not yet renamed
//! into place), `vm-pause-before-record` (a microVM saved and ended, the pause not yet
//! recorded in the store).

/// Aborts the process if the test hook names `point`; release builds never do.
pub fn point(point: &str) {
    #[cfg(debug_assertions)]
    {
        static AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
        if AT
            .get_or_init(|| std::env::var("KODER_TEST_CRASH_AT").ok())
            .as_deref()
            == Some(point)
        {
            std::process::abort();
        }
    }
    #[cfg(not(debug_assertions))]
    let _ = point;
}
