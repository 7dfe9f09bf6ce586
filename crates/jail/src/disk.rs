//! Size-limited writable layer for a sandbox (being written).
