//! Overlay upper layers as tar streams, for snapshots, restore and fork.
//!
//! [`capture`] runs inside a sandbox's agent and writes the sandbox's overlay *upper
//! directory* (what the session changed on top of its read-only image) as a tar stream.
//! [`apply`] runs on the host, as root, and writes such a stream into the upper directory of a
//! new sandbox. Synchronous, no async runtime: both ends drive it from a blocking thread.
//!
//! # The archive
//!
//! One entry per directory, regular file (content), symlink (target verbatim, as bytes), hard
//! link (a tar `Link` to the first path of the inode in this archive), fifo and overlay
//! whiteout (a char device 0:0), parents before children, names sorted bytewise inside each
//! directory. Each carries its mode (including setuid, setgid, sticky), uid and gid as the
//! capturing side saw them (inside a sandbox: namespace ids), mtime in whole seconds, and —
//! for files and directories — its `user.*` extended attributes as PAX `SCHILY.xattr.`
//! records: `user.overlay.opaque` (an opaque directory) and every `user.*` name outside
//! `user.overlay.` (overlayfs' other bookkeeping — origin, impure, redirect... — describes the
//! old lower layers, not the new ones, and is left out). Sockets and devices other than
//! whiteouts are skipped; the root directory itself is not an entry (the new upper dir keeps
//! the owner and mode its runtime gave it). Long names and link targets use GNU long-name and
//! PAX records, so names are any bytes but `/` and NUL.
//!
//! # What a capture guarantees
//!
//! Captured from a *frozen* tree (the sandbox's processes stopped, nothing else writing), the
//! stream is exactly that tree as listed above, and it is deterministic: the same tree gives
//! the same bytes. The walk itself never leaves the tree whatever it holds: directories are
//! opened relative to their parent with `O_NOFOLLOW | O_DIRECTORY`, nothing is looked up by
//! an absolute path, symlinks are read, never followed. On a tree that changes during the
//! walk, the capture still never leaves it and never writes an entry whose content disagrees
//! with its header (a file that changed size fails the capture with [`LayerError::Io`]), but
//! the result is no consistent snapshot. [`Limits`] are checked before any content is read:
//! a huge (or sparse) file is refused from its apparent size at once.
//!
//! # What apply guarantees
//!
//! Everything in an archive is treated as hostile. Nothing is created, opened or changed
//! outside the target directory, whatever the archive holds (symlinks planted by earlier
//! entries included): every parent is resolved with `openat2(RESOLVE_IN_ROOT |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)`, every final component is
//! created or removed relative to that parent without following it. Hard links only reach
//! regular files made by the same apply; devices other than whiteouts, privileged and
//! overlay-private attributes, ids outside the sandbox's range never land. On error, apply
//! stops and returns it, leaving whatever it had written so far: applying into a fresh
//! directory is all-or-nothing for a caller that removes that directory on error (the daemon
//! does).

mod apply;
mod capture;
mod copy;
mod path;
mod reader;
mod xattrs;

pub use apply::apply;
pub use capture::capture;
pub use copy::copy;

/// Longest path (bytes, without a trailing `/`) an archive may name, as Linux' `PATH_MAX`
/// minus the terminating NUL.
pub const MAX_PATH: usize = 4095;
/// Longest single name component (Linux' `NAME_MAX`).
pub const MAX_NAME: usize = 255;
/// Deepest directory nesting captured or applied; each level holds one descriptor during a
/// capture.
pub const MAX_DEPTH: usize = 256;

/// Bounds on one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Sum of the apparent sizes of regular files (a sparse file counts its full size).
    pub max_bytes: u64,
    /// Number of entries (directories, files, links, whiteouts...).
    pub max_entries: u64,
}

/// What a capture wrote or an apply applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub entries: u64,
    /// Sum of the apparent sizes of regular files (hard links counted once).
    pub bytes: u64,
}

/// How namespace uids/gids in the archive become owners on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owners {
    /// Ids land as they are in the archive (any id but `u32::MAX`, which chown reads as
    /// "unchanged"). Only for a target the host never executes from: an archive may then hold
    /// root-owned setuid files.
    AsIs,
    /// Host id = `base` + archive id; an archive id `>= size` is [`LayerError::Forbidden`].
    Shift { base: u32, size: u32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApplyOptions {
    pub limits: Limits,
    pub owners: Owners,
}

#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("layer larger than {limit} bytes (at {path})")]
    TooLarge { path: String, limit: u64 },
    #[error("layer has more than {limit} entries")]
    TooManyEntries { limit: u64 },
    #[error("forbidden entry {path}: {why}")]
    Forbidden { path: String, why: &'static str },
    #[error("corrupt archive: {0}")]
    Corrupt(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl LayerError {
    /// The layer broke a [`Limits`] bound (as opposed to being hostile, broken or unreadable).
    pub fn is_quota(&self) -> bool {
        matches!(self, Self::TooLarge { .. } | Self::TooManyEntries { .. })
    }

    fn forbidden(path: &[u8], why: &'static str) -> Self {
        Self::Forbidden {
            path: shown(path),
            why,
        }
    }

    fn io(context: impl Into<String>, source: impl Into<std::io::Error>) -> Self {
        Self::Io {
            context: context.into(),
            source: source.into(),
        }
    }
}

/// A path as it may appear in messages: names are attacker-chosen bytes, so control and
/// non-ASCII bytes are escaped rather than reaching a log verbatim.
fn shown(path: &[u8]) -> String {
    path.escape_ascii().to_string()
}

/// Running totals checked against [`Limits`] before anything is read or written.
#[derive(Debug)]
struct Budget<'a> {
    limits: &'a Limits,
    stats: Stats,
}

impl<'a> Budget<'a> {
    fn new(limits: &'a Limits) -> Self {
        Self {
            limits,
            stats: Stats::default(),
        }
    }

    fn entry(&mut self) -> Result<(), LayerError> {
        if self.stats.entries >= self.limits.max_entries {
            return Err(LayerError::TooManyEntries {
                limit: self.limits.max_entries,
            });
        }
        self.stats.entries += 1;
        Ok(())
    }

    fn bytes(&mut self, path: &[u8], size: u64) -> Result<(), LayerError> {
        match self.stats.bytes.checked_add(size) {
            Some(total) if total <= self.limits.max_bytes => {
                self.stats.bytes = total;
                Ok(())
            }
            _ => Err(LayerError::TooLarge {
                path: shown(path),
                limit: self.limits.max_bytes,
            }),
        }
    }
}
