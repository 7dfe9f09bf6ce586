//! Build context archives (the files an E2B template's `COPY` steps take, uploaded as a tar,
//! gzipped or not): checked from their headers alone, as hostile as an image layer, before
//! anything keeps them. They are unpacked by `tar` inside a build sandbox, never on the host;
//! the check still holds them to what an image layer may be: every path relative and without
//! `..` (hard link targets too), no entry below a symlink the archive made, only directories,
//! regular files and links (no device node, no fifo), within bounds.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use tar::EntryType;

use super::unpack::{components, corrupt, forbidden, is_file, Budget};
use super::{LayerStats, Limits};
use crate::store::ImageError;

const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];

/// Checks the archive at `path` (gzip-compressed or plain); what it holds on success.
pub fn check_context_archive(path: &Path, limits: Limits) -> Result<LayerStats, ImageError> {
    let file = std::fs::File::open(path).map_err(ImageError::io("open the archive"))?;
    let mut input = BufReader::new(file);
    let head = input.fill_buf().map_err(corrupt)?;
    if head.starts_with(GZIP_MAGIC) {
        check(flate2::bufread::GzDecoder::new(input), limits)
    } else {
        check(input, limits)
    }
}

fn check(input: impl Read, limits: Limits) -> Result<LayerStats, ImageError> {
    let mut budget = Budget::new(limits);
    let mut stats = LayerStats::default();
    // Paths (components joined by `/`) the archive made symlinks.
    let mut links: HashSet<Vec<u8>> = HashSet::new();
    let mut archive = tar::Archive::new(input);
    for entry in archive.entries().map_err(corrupt)? {
        let entry = entry.map_err(corrupt)?;
        budget.entry()?;
        let raw = entry.path_bytes().into_owned();
        let parts = components(&raw)?;
        for depth in 1..parts.len() {
            if links.contains(&parts[..depth].join(&b'/')) {
                return Err(forbidden(&raw, "below a symlink of the archive"));
            }
        }
        let kind = entry.header().entry_type();
        match kind {
            EntryType::Directory => {}
            EntryType::Symlink => {
                links.insert(parts.join(&b'/'));
            }
            EntryType::Link => {
                components(&entry.link_name_bytes().unwrap_or_default())?;
            }
            kind if is_file(kind) => {
                budget.bytes(entry.size(), &raw)?;
                stats.bytes += entry.size();
            }
            _ => return Err(forbidden(&raw, "neither a file, a directory nor a link")),
        }
        stats.entries += 1;
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oci::testing::{gzip, layer, E};

    fn checked(bytes: &[u8], limits: Limits) -> Result<LayerStats, ImageError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("context.tar");
        std::fs::write(&path, bytes).unwrap();
        check_context_archive(&path, limits)
    }

    #[test]
    fn plain_and_gzipped_contexts_pass() {
        let tar = layer(&[
            E::Dir("folder"),
            E::File("folder/test.txt", b"hello", 0o644),
            E::Symlink("folder/link.txt", "/elsewhere/test.txt"),
        ]);
        for bytes in [tar.clone(), gzip(&tar)] {
            let stats = checked(&bytes, Limits::default()).unwrap();
            assert_eq!((stats.entries, stats.bytes), (3, 5));
        }
    }

    #[test]
    fn hostile_contexts_are_refused() {
        let forbidden = [
            layer(&[E::RawFile(b"../escaped")]),
            layer(&[E::RawFile(b"/etc/passwd")]),
            layer(&[
                E::Symlink("esc", "/etc"),
                E::File("esc/passwd", b"x", 0o644),
            ]),
            layer(&[E::Char("dev/null")]),
        ];
        for bad in forbidden {
            let e = checked(&bad, Limits::default()).unwrap_err();
            assert!(matches!(e, ImageError::Forbidden { .. }), "{e}");
        }
        let bomb = layer(&[E::File("a", &[0; 2048], 0o644)]);
        let small = Limits {
            max_bytes: 1024,
            max_entries: 10,
        };
        assert!(matches!(
            checked(&bomb, small),
            Err(ImageError::TooLarge(_))
        ));
        assert!(matches!(
            checked(
                b"not a tar at all, not even close to 512 bytes",
                Limits::default()
            ),
            Err(ImageError::InvalidArchive(_))
        ));
    }
}
