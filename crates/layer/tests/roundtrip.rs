//! Capture → apply reproduces a tree exactly, and stacking layers behaves like overlayfs.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::*;
use koder_layer::{ApplyOptions, LayerError, Limits, Owners, Stats};
use std::os::fd::AsFd;

const MTIME: i64 = 1_600_000_000;
const SHIFT: Owners = Owners::Shift {
    base: 300_000,
    size: 65_536,
};

fn build_tree(root: &Path) {
    fs::create_dir_all(root.join("d/sub")).unwrap();
    fs::write(root.join("d/file.txt"), b"hello\n").unwrap();
    fs::write(root.join("empty"), b"").unwrap();
    // 64 MiB, one 4 KiB data block in the middle.
    let sparse = fs::File::create(root.join("big.sparse")).unwrap();
    sparse.set_len(64 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&sparse, &[0xab; 4096], 32 << 20).unwrap();
    drop(sparse);
    std::os::unix::fs::symlink("d/file.txt", root.join("link")).unwrap();
    std::os::unix::fs::symlink("/etc", root.join("abs-link")).unwrap();
    // Targets are kept verbatim, not normalised.
    std::os::unix::fs::symlink("a//b/./c/", root.join("odd-link")).unwrap();
    let long_target = "t/".repeat(150);
    std::os::unix::fs::symlink(&long_target, root.join("long-link")).unwrap();
    fs::write(root.join("hard1"), b"linked").unwrap();
    fs::hard_link(root.join("hard1"), root.join("d/hard2")).unwrap();
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        root.join("fifo"),
        rustix::fs::Mode::from_raw_mode(0o640),
    )
    .unwrap();
    whiteout(&root.join("wh"));
    fs::create_dir(root.join("opaque")).unwrap();
    set_xattr(&root.join("opaque"), "user.overlay.opaque", b"y");
    fs::write(root.join("opaque/inside"), b"x").unwrap();
    fs::write(root.join("tagged"), b"t").unwrap();
    set_xattr(&root.join("tagged"), "user.note", b"hi\0there");
    set_xattr(&root.join("d"), "user.dir-note", b"d");
    fs::write(root.join("suid"), b"#!/bin/sh\n").unwrap();
    fs::create_dir(root.join("sgid")).unwrap();
    fs::create_dir(root.join("sticky")).unwrap();
    fs::write(root.join("ünïcødé-名前"), b"u").unwrap();
    fs::write(root.join("new\nline"), b"n").unwrap();
    fs::write(root.join(p(b"bad-utf8-\xff")), b"b").unwrap();
    fs::write(root.join("c".repeat(200)), b"long name").unwrap();
    let deep = root
        .join("x".repeat(100))
        .join("y".repeat(100))
        .join("z".repeat(100));
    fs::create_dir_all(&deep).unwrap();
    fs::write(deep.join("w".repeat(50)), b"long path").unwrap();
    // A socket is skipped.
    let _sock = std::os::unix::net::UnixListener::bind(root.join("sock")).unwrap();

    own_and_date(root, 1000, 1000, MTIME);
    // Modes after chown, which clears setuid.
    let mode = |rel: &str, m: u32| {
        fs::set_permissions(root.join(rel), fs::Permissions::from_mode(m)).unwrap()
    };
    mode("suid", 0o4755);
    mode("sgid", 0o2775);
    mode("sticky", 0o1777);
    mode("d/sub", 0o700);
}

#[test]
fn round_trip_reproduces_everything() {
    let src = tempfile::tempdir().unwrap();
    build_tree(src.path());
    let (archive, stats) = capture(src.path(), &ROOMY).unwrap();
    let (again, _) = capture(src.path(), &ROOMY).unwrap();
    assert!(archive == again, "capture is deterministic");
    // The sparse file counts its apparent size.
    assert!(stats.bytes >= 64 << 20, "{stats:?}");

    let dst = tempfile::tempdir().unwrap();
    let applied = apply(dst.path(), &archive, SHIFT).unwrap();
    assert_eq!(applied, stats);

    let mut want = snapshot(src.path());
    want.remove(&b"sock"[..])
        .expect("the socket was in the source");
    for node in want.values_mut() {
        node.uid += 300_000;
        node.gid += 300_000;
    }
    let got = snapshot(dst.path());
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>()
    );
    for (path, node) in &want {
        assert_eq!(&got[path], node, "{}", path.escape_ascii());
    }
    assert_eq!(got[&b"suid"[..]].uid, 301_000);
    assert_eq!(got[&b"suid"[..]].mode, 0o4755);
    assert_eq!(got[&b"wh"[..]].kind, "char");
    // `d/hard2` sorts first: the archive's file, `hard1` its link.
    assert_eq!(
        got[&b"hard1"[..]].same_inode_as.as_deref(),
        Some(&b"d/hard2"[..])
    );

    let sparse = fs::metadata(dst.path().join("big.sparse")).unwrap();
    assert_eq!(sparse.len(), 64 << 20);
    assert!(
        sparse.blocks() * 512 <= 1 << 20,
        "restored sparse file has {} blocks",
        sparse.blocks()
    );
    let data = fs::read(dst.path().join("big.sparse")).unwrap();
    assert!(data[32 << 20..(32 << 20) + 4096].iter().all(|b| *b == 0xab));
    assert_eq!(data.iter().filter(|b| **b != 0).count(), 4096);
}

#[test]
fn privileged_and_overlay_private_xattrs_are_not_captured() {
    let src = tempfile::tempdir().unwrap();
    fs::write(src.path().join("f"), b"f").unwrap();
    set_xattr(&src.path().join("f"), "trusted.evil", b"1");
    set_xattr(&src.path().join("f"), "user.overlay.origin", b"1");
    set_xattr(&src.path().join("f"), "user.kept", b"1");
    let (archive, _) = capture(src.path(), &ROOMY).unwrap();
    let dst = tempfile::tempdir().unwrap();
    apply(dst.path(), &archive, Owners::AsIs).unwrap();
    let names: Vec<_> = xattrs(&dst.path().join("f")).into_keys().collect();
    assert_eq!(names, [b"user.kept".to_vec()]);
}

fn layer(build: impl FnOnce(&Path)) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    capture(dir.path(), &ROOMY).unwrap().0
}

#[test]
fn stacked_layers_behave_like_overlay() {
    let l1 = layer(|r| {
        fs::write(r.join("keep"), b"keep").unwrap();
        fs::write(r.join("gone"), b"gone").unwrap();
        fs::create_dir_all(r.join("dir-to-file/child")).unwrap();
        fs::create_dir(r.join("hide")).unwrap();
        fs::write(r.join("hide/old1"), b"1").unwrap();
        fs::create_dir(r.join("hide/old2")).unwrap();
        fs::create_dir(r.join("merge")).unwrap();
        fs::write(r.join("merge/a"), b"a").unwrap();
        set_xattr(&r.join("merge"), "user.stale", b"s");
        fs::create_dir(r.join("was-opaque")).unwrap();
        set_xattr(&r.join("was-opaque"), "user.overlay.opaque", b"y");
        fs::write(r.join("was-opaque/a"), b"a").unwrap();
        fs::write(r.join("file-to-dir"), b"f").unwrap();
        std::os::unix::fs::symlink("/etc", r.join("link-to-dir")).unwrap();
    });
    let l2 = layer(|r| {
        whiteout(&r.join("gone"));
        fs::write(r.join("dir-to-file"), b"now a file").unwrap();
        fs::create_dir(r.join("hide")).unwrap();
        set_xattr(&r.join("hide"), "user.overlay.opaque", b"y");
        fs::write(r.join("hide/new"), b"new").unwrap();
        fs::create_dir(r.join("merge")).unwrap();
        fs::write(r.join("merge/b"), b"b").unwrap();
        fs::create_dir(r.join("was-opaque")).unwrap();
        fs::write(r.join("was-opaque/b"), b"b").unwrap();
        fs::create_dir(r.join("file-to-dir")).unwrap();
        fs::write(r.join("file-to-dir/inner"), b"i").unwrap();
        fs::create_dir(r.join("link-to-dir")).unwrap();
        fs::write(r.join("link-to-dir/koder-layer-test"), b"inside").unwrap();
    });
    let dst = tempfile::tempdir().unwrap();
    apply(dst.path(), &l1, Owners::AsIs).unwrap();
    apply(dst.path(), &l2, Owners::AsIs).unwrap();
    let d = dst.path();
    let names = |rel: &str| {
        let mut v: Vec<_> = fs::read_dir(d.join(rel))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        v.sort();
        v
    };
    assert_eq!(fs::read(d.join("keep")).unwrap(), b"keep");
    let gone = fs::symlink_metadata(d.join("gone")).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(
        &gone.file_type()
    ));
    assert_eq!(gone.rdev(), 0);
    assert_eq!(fs::read(d.join("dir-to-file")).unwrap(), b"now a file");
    assert_eq!(names("hide"), ["new"]);
    assert_eq!(xattrs(&d.join("hide"))[&b"user.overlay.opaque"[..]], b"y");
    assert_eq!(names("merge"), ["a", "b"]);
    // Layer 2's copy of the directory carries its current attributes only.
    assert!(xattrs(&d.join("merge")).is_empty());
    // Opaque in layer 1 still hides the image below layer 1.
    assert_eq!(names("was-opaque"), ["a", "b"]);
    assert_eq!(
        xattrs(&d.join("was-opaque"))[&b"user.overlay.opaque"[..]],
        b"y"
    );
    assert_eq!(fs::read(d.join("file-to-dir/inner")).unwrap(), b"i");
    assert!(fs::symlink_metadata(d.join("link-to-dir"))
        .unwrap()
        .is_dir());
    assert_eq!(
        fs::read(d.join("link-to-dir/koder-layer-test")).unwrap(),
        b"inside"
    );
    assert!(fs::symlink_metadata("/etc/koder-layer-test").is_err());
}

fn copy(
    src: &Path,
    src_owners: Owners,
    dst: &Path,
    opts: ApplyOptions,
) -> Result<Stats, LayerError> {
    koder_layer::copy(
        open_dir(src).as_fd(),
        src_owners,
        open_dir(dst).as_fd(),
        &opts,
    )
}

#[test]
fn a_copy_is_the_capture_applied_with_owners_moved_between_ranges() {
    let src = tempfile::tempdir().unwrap();
    build_tree(src.path());
    // Owned by a host id outside the source's range: a capture inside sees the overflow id.
    std::os::unix::fs::lchown(src.path().join("empty"), Some(5), Some(5)).unwrap();
    let via_archive = tempfile::tempdir().unwrap();
    let (archive, captured) = capture(src.path(), &ROOMY).unwrap();
    apply(via_archive.path(), &archive, SHIFT).unwrap();

    let dst = tempfile::tempdir().unwrap();
    let from = Owners::Shift {
        base: 500,
        size: 65_536,
    };
    let opts = ApplyOptions {
        limits: ROOMY,
        owners: SHIFT,
    };
    let copied = copy(src.path(), from, dst.path(), opts).unwrap();
    assert_eq!(copied, captured);

    let mut want = snapshot(via_archive.path());
    for (path, node) in want.iter_mut() {
        let moved = if path.as_slice() == b"empty" {
            365_534
        } else {
            node.uid - 500
        };
        node.uid = moved;
        node.gid = moved;
    }
    assert_eq!(snapshot(dst.path()), want);
    assert_eq!(
        fs::metadata(dst.path().join("suid")).unwrap().uid(),
        300_500
    );
}

#[test]
fn a_copy_fails_with_the_cause_not_the_broken_pipe() {
    let src = tempfile::tempdir().unwrap();
    build_tree(src.path());
    let roomy = ApplyOptions {
        limits: ROOMY,
        owners: SHIFT,
    };
    // The source's fault, found by the capture.
    let small = ApplyOptions {
        limits: Limits {
            max_bytes: 1 << 20,
            max_entries: 1 << 30,
        },
        ..roomy
    };
    let dst = tempfile::tempdir().unwrap();
    let e = copy(src.path(), Owners::AsIs, dst.path(), small).unwrap_err();
    assert!(e.is_quota(), "{e}");
    // The target's refusal, found by apply while the capture still writes.
    let narrow = ApplyOptions {
        owners: Owners::Shift {
            base: 300_000,
            size: 10,
        },
        ..roomy
    };
    let dst = tempfile::tempdir().unwrap();
    let e = copy(src.path(), Owners::AsIs, dst.path(), narrow).unwrap_err();
    assert!(matches!(e, LayerError::Forbidden { .. }), "{e}");
}
