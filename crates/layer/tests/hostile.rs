//! Hand-made hostile archives: every one fails (or is defused) without touching anything
//! outside the target directory.

mod common;

use std::fs;
use std::io::Read;
use std::os::fd::AsFd;
use std::time::Instant;

use common::*;
use koder_layer::{ApplyOptions, LayerError, Limits, Owners};
use tar::{Builder, EntryType, Header};

const SHIFT: Owners = Owners::Shift {
    base: 300_000,
    size: 65_536,
};

/// A header with fields written raw, so the archive may hold what `tar` itself refuses to
/// write (`..`, absolute paths, device nodes).
fn header(path: &[u8], kind: EntryType, link: &[u8], size: u64) -> Header {
    let mut h = Header::new_gnu();
    h.as_old_mut().name[..path.len()].copy_from_slice(path);
    h.as_old_mut().linkname[..link.len()].copy_from_slice(link);
    h.set_entry_type(kind);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(size);
    h.set_cksum();
    h
}

struct Archive(Builder<Vec<u8>>);

impl Archive {
    fn new() -> Self {
        Self(Builder::new(Vec::new()))
    }
    fn entry(mut self, path: &[u8], kind: EntryType, link: &[u8], data: &[u8]) -> Self {
        let h = header(path, kind, link, data.len() as u64);
        self.0.append(&h, data).unwrap();
        self
    }
    fn file(self, path: &[u8], data: &[u8]) -> Self {
        self.entry(path, EntryType::Regular, b"", data)
    }
    fn dir(self, path: &[u8]) -> Self {
        self.entry(path, EntryType::Directory, b"", b"")
    }
    fn with(mut self, f: impl FnOnce(&mut Builder<Vec<u8>>)) -> Self {
        f(&mut self.0);
        self
    }
    fn done(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }
}

fn forbidden(r: Result<koder_layer::Stats, LayerError>) -> String {
    match r {
        Err(LayerError::Forbidden { path, why }) => format!("{path}: {why}"),
        other => panic!("expected Forbidden, got {other:?}"),
    }
}

fn passwd() -> Vec<u8> {
    fs::read("/etc/passwd").unwrap()
}

#[test]
fn symlink_then_file_through_it_is_refused() {
    let arena = Arena::new();
    let before = passwd();
    let archive = Archive::new()
        .entry(b"etc", EntryType::Symlink, b"/etc", b"")
        .file(b"etc/passwd", b"root::0:0::/:/bin/sh\n")
        .file(b"etc/koder-layer-test", b"x")
        .done();
    forbidden(arena.apply(&archive, SHIFT));
    assert_eq!(passwd(), before);
    arena.assert_outside_untouched();

    // Same through a directory symlink planted before the apply.
    let arena = Arena::new();
    std::os::unix::fs::symlink("/etc", arena.target().join("etc")).unwrap();
    let archive = Archive::new().file(b"etc/koder-layer-test", b"x").done();
    forbidden(arena.apply(&archive, SHIFT));
    arena.assert_outside_untouched();
}

#[test]
fn escaping_paths_are_refused() {
    for path in [
        &b"../x"[..],
        b"/koder-layer-test-abs",
        b"a/../../x",
        b"./../x",
        b"a//../x",
        b"",
    ] {
        let arena = Arena::new();
        let archive = Archive::new().dir(b"a/").file(path, b"escaped").done();
        let why = forbidden(arena.apply(&archive, SHIFT));
        eprintln!("{:?}: {why}", path.escape_ascii().to_string());
        arena.assert_outside_untouched();
    }
    // A GNU long name carries the same attack past the 100-byte field.
    let arena = Arena::new();
    let long = [&b"a/"[..], &b"../".repeat(60)[..], b"x"].concat();
    let archive = Archive::new()
        .dir(b"a/")
        .with(|b| {
            let mut l = Header::new_gnu();
            l.set_entry_type(EntryType::GNULongName);
            l.set_size(long.len() as u64 + 1);
            l.set_cksum();
            b.append(&l, &[&long[..], b"\0"].concat()[..]).unwrap();
        })
        .file(b"truncated", b"escaped")
        .done();
    forbidden(arena.apply(&archive, SHIFT));
    arena.assert_outside_untouched();
}

#[test]
fn hard_links_only_reach_files_of_this_layer() {
    let before = passwd();
    for target in [
        &b"/etc/passwd"[..],
        b"../../etc/passwd",
        b"host-file",
        b"planted",
        b"d",
    ] {
        let arena = Arena::new();
        fs::write(arena.target().join("host-file"), b"host").unwrap();
        let archive = Archive::new()
            .entry(b"planted", EntryType::Symlink, b"/etc/passwd", b"")
            .dir(b"d/")
            .entry(b"h", EntryType::Link, target, b"")
            .done();
        forbidden(arena.apply(&archive, SHIFT));
        assert_eq!(passwd(), before);
        assert_eq!(
            fs::metadata("/etc/passwd").unwrap().len() as usize,
            before.len()
        );
        arena.assert_outside_untouched();
    }
    // A file of this layer replaced by a symlink is no target any more.
    let arena = Arena::new();
    let archive = Archive::new()
        .file(b"f", b"mine")
        .entry(b"f", EntryType::Symlink, b"/etc/passwd", b"")
        .entry(b"h", EntryType::Link, b"f", b"")
        .done();
    forbidden(arena.apply(&archive, SHIFT));
    arena.assert_outside_untouched();
    // The legitimate case works.
    let arena = Arena::new();
    let archive = Archive::new()
        .file(b"f", b"mine")
        .entry(b"h", EntryType::Link, b"f", b"")
        .done();
    arena.apply(&archive, SHIFT).unwrap();
    assert_eq!(fs::read(arena.target().join("h")).unwrap(), b"mine");
}

#[test]
fn devices_are_refused_whiteouts_kept() {
    for (kind, major, minor) in [
        (EntryType::Block, 8, 0),
        (EntryType::Char, 1, 3),
        (EntryType::Char, 0, 1),
    ] {
        let arena = Arena::new();
        let archive = Archive::new()
            .with(|b| {
                let mut h = header(b"dev", kind, b"", 0);
                h.set_device_major(major).unwrap();
                h.set_device_minor(minor).unwrap();
                h.set_cksum();
                b.append(&h, &[][..]).unwrap();
            })
            .done();
        forbidden(arena.apply(&archive, SHIFT));
        assert!(fs::symlink_metadata(arena.target().join("dev")).is_err());
        arena.assert_outside_untouched();
    }
    let arena = Arena::new();
    let archive = Archive::new()
        .with(|b| {
            let mut h = header(b"wh", EntryType::Char, b"", 0);
            h.set_device_major(0).unwrap();
            h.set_device_minor(0).unwrap();
            h.set_cksum();
            b.append(&h, &[][..]).unwrap();
        })
        .done();
    arena.apply(&archive, SHIFT).unwrap();
    let md = fs::symlink_metadata(arena.target().join("wh")).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(
        &md.file_type()
    ));
    assert_eq!(std::os::unix::fs::MetadataExt::rdev(&md), 0);
}

#[test]
fn declared_huge_file_is_refused_before_writing() {
    let arena = Arena::new();
    let mut archive = Archive::new().file(b"small", b"ok").done();
    archive.truncate(archive.len() - 1024);
    archive.extend_from_slice(header(b"huge", EntryType::Regular, b"", 10 << 30).as_bytes());
    let opts = ApplyOptions {
        limits: Limits {
            max_bytes: 100 << 20,
            max_entries: 100,
        },
        owners: SHIFT,
    };
    let start = Instant::now();
    let r = koder_layer::apply(open_dir(&arena.target()).as_fd(), &archive[..], &opts);
    let err = r.unwrap_err();
    assert!(
        matches!(err, LayerError::TooLarge { .. }) && err.is_quota(),
        "{err:?}"
    );
    assert!(start.elapsed().as_secs() < 5, "took {:?}", start.elapsed());
    assert!(fs::symlink_metadata(arena.target().join("huge")).is_err());
    arena.assert_outside_untouched();
}

/// A stream of `n` empty files, made as it is read.
struct ManyFiles {
    next: u64,
    n: u64,
    block: Vec<u8>,
    at: usize,
}

impl Read for ManyFiles {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.at == self.block.len() {
            self.block = if self.next < self.n {
                let h = header(
                    format!("f{}", self.next).as_bytes(),
                    EntryType::Regular,
                    b"",
                    0,
                );
                h.as_bytes().to_vec()
            } else if self.next == self.n {
                vec![0; 1024]
            } else {
                return Ok(0);
            };
            self.next += 1;
            self.at = 0;
        }
        let n = buf.len().min(self.block.len() - self.at);
        buf[..n].copy_from_slice(&self.block[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

#[test]
fn a_million_entries_stop_at_the_limit() {
    let arena = Arena::new();
    let input = ManyFiles {
        next: 0,
        n: 1_000_000,
        block: Vec::new(),
        at: 0,
    };
    let opts = ApplyOptions {
        limits: Limits {
            max_bytes: 1 << 30,
            max_entries: 100_000,
        },
        owners: SHIFT,
    };
    let start = Instant::now();
    let err = koder_layer::apply(open_dir(&arena.target()).as_fd(), input, &opts).unwrap_err();
    eprintln!("TooManyEntries after {:?}", start.elapsed());
    assert!(
        matches!(err, LayerError::TooManyEntries { limit: 100_000 }),
        "{err:?}"
    );
    assert_eq!(fs::read_dir(arena.target()).unwrap().count(), 100_000);
    arena.assert_outside_untouched();
}

#[test]
fn owners_outside_the_range_are_refused() {
    for (uid, gid) in [(70_000, 0), (0, 65_536), (u64::from(u32::MAX), 0)] {
        let arena = Arena::new();
        let archive = Archive::new()
            .with(|b| {
                let mut h = header(b"f", EntryType::Regular, b"", 0);
                h.set_uid(uid);
                h.set_gid(gid);
                h.set_cksum();
                b.append(&h, &[][..]).unwrap();
            })
            .done();
        forbidden(arena.apply(&archive, SHIFT));
        arena.assert_outside_untouched();
    }
    // -1 would mean "unchanged" to chown: never as-is either.
    let arena = Arena::new();
    let archive = Archive::new()
        .with(|b| {
            let mut h = header(b"f", EntryType::Regular, b"", 0);
            h.set_uid(u64::from(u32::MAX));
            h.set_cksum();
            b.append(&h, &[][..]).unwrap();
        })
        .done();
    forbidden(arena.apply(&archive, Owners::AsIs));
}

fn with_xattrs(records: &[(&str, &[u8])]) -> Vec<u8> {
    Archive::new()
        .with(|b| b.append_pax_extensions(records.iter().copied()).unwrap())
        .file(b"f", b"data")
        .done()
}

#[test]
fn privileged_xattrs_are_dropped() {
    let arena = Arena::new();
    let archive = with_xattrs(&[
        ("SCHILY.xattr.trusted.overlay.opaque", b"y"),
        (
            "SCHILY.xattr.security.capability",
            &[
                1, 0, 0, 2, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ],
        ),
        ("SCHILY.xattr.system.posix_acl_access", &[2, 0, 0, 0]),
        ("SCHILY.xattr.user.overlay.redirect", b"/etc"),
        ("SCHILY.xattr.user.ok", b"fine"),
    ]);
    arena.apply(&archive, SHIFT).unwrap();
    let got = xattrs(&arena.target().join("f"));
    assert_eq!(
        got.into_iter().collect::<Vec<_>>(),
        [(b"user.ok".to_vec(), b"fine".to_vec())]
    );
}

#[test]
fn xattr_bounds_and_foreign_pax_records_are_refused() {
    let names: Vec<String> = (0..65).map(|i| format!("SCHILY.xattr.user.n{i}")).collect();
    let many: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), &b"v"[..])).collect();
    let arena = Arena::new();
    forbidden(arena.apply(&with_xattrs(&many), SHIFT));

    let big = vec![b'v'; 64 * 1024 + 1];
    let arena = Arena::new();
    forbidden(arena.apply(&with_xattrs(&[("SCHILY.xattr.user.big", &big)]), SHIFT));

    // Other readers would take a PAX size or uid; this one must not disagree with them.
    for key in ["size", "uid", "GNU.sparse.map"] {
        let arena = Arena::new();
        let err = arena
            .apply(&with_xattrs(&[(key, b"1")]), SHIFT)
            .unwrap_err();
        assert!(matches!(err, LayerError::Corrupt(_)), "{key}: {err:?}");
        arena.assert_outside_untouched();
    }
}

#[test]
fn oversized_extension_headers_are_refused_unread() {
    let arena = Arena::new();
    let mut archive = Vec::new();
    let mut l = Header::new_gnu();
    l.set_entry_type(EntryType::GNULongName);
    l.set_size(8 << 30);
    l.set_cksum();
    archive.extend_from_slice(l.as_bytes());
    archive.extend_from_slice(&vec![b'a'; 1 << 20]);
    let err = arena.apply(&archive, SHIFT).unwrap_err();
    assert!(matches!(err, LayerError::Corrupt(_)), "{err:?}");
}

#[test]
fn truncated_archives_are_corrupt() {
    let src = tempfile::tempdir().unwrap();
    fs::write(src.path().join("a"), vec![7u8; 100_000]).unwrap();
    fs::write(src.path().join("b"), b"b").unwrap();
    let (archive, _) = capture(src.path(), &ROOMY).unwrap();
    let entry_end = 512 + 100_000usize.div_ceil(512) * 512;
    for cut in [
        300,
        512 + 50_000,
        entry_end,
        archive.len() - 512,
        archive.len() - 1,
    ] {
        let arena = Arena::new();
        let err = arena.apply(&archive[..cut], SHIFT).unwrap_err();
        assert!(
            matches!(err, LayerError::Corrupt(_)),
            "cut at {cut}: {err:?}"
        );
        arena.assert_outside_untouched();
    }
    Arena::new().apply(&archive, SHIFT).unwrap();
}

#[test]
fn unsupported_entry_types_are_refused() {
    for kind in [
        EntryType::GNUSparse,
        EntryType::Continuous,
        EntryType::XGlobalHeader,
    ] {
        let arena = Arena::new();
        let archive = Archive::new().entry(b"s", kind, b"", b"").done();
        assert!(arena.apply(&archive, SHIFT).is_err(), "{kind:?}");
        assert!(fs::symlink_metadata(arena.target().join("s")).is_err());
    }
}
