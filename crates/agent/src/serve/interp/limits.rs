//! The bounds of contexts and runs the daemon relies on; a leaf of `interp`, re-exported.

/// Contexts one sandbox may hold; each is a resident interpreter.
pub const MAX_CONTEXTS: usize = 16;
/// Largest cell accepted (a request must also fit in one protocol frame).
pub const MAX_CODE_BYTES: usize = 512 * 1024;
/// The context a session gets without asking: Python, started on first use.
pub const DEFAULT_CONTEXT: &str = "default";
/// stdout/stderr bytes forwarded per stream and run; the rest is read and dropped.
pub const OUTPUT_LIMIT: usize = 8 << 20;
/// Rich-output bytes per run. The whole outcome travels in one frame (≤ 1 MiB), so results,
/// the error and their encoding overhead must stay below that together.
pub const RESULT_BUDGET: usize = 900 * 1024;
