//! The ext4-image backend end to end (root, loop devices, mkfs.ext4): the test directory is on
//! a filesystem that is not btrfs.

mod common;

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use common::{can_loop_mount, write, Scratch};
use koder_api_types::ErrorCode;
use koder_volumes::{fs, Backend, VolumeError, VolumeHost};

#[test]
fn ext4_volumes_live_through_attach_quota_restart_snapshot_and_trash() {
    if !can_loop_mount() {
        return;
    }
    let scratch = Scratch::new();
    let dir = scratch.path().join("volumes");
    let templates = scratch.path().join("templates");
    let host = VolumeHost::open(&dir, &templates).unwrap();
    if host.backend() != Backend::Ext4Image {
        eprintln!("skipped: the temp dir is on btrfs");
        return;
    }
    assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o7777, 0o700);

    host.create("v1", 16).unwrap();
    let err = host.create("v1", 16).unwrap_err();
    assert!(matches!(err, VolumeError::VolumeExists(_)), "{err}");
    assert_eq!(err.code(), ErrorCode::Conflict);
    assert_eq!(
        host.create("../x", 16).unwrap_err().code(),
        ErrorCode::InvalidArgument
    );
    assert_eq!(
        host.create("v0", 0).unwrap_err().code(),
        ErrorCode::InvalidArgument
    );
    assert_eq!(host.list_ids().unwrap(), ["v1"]);
    assert!(std::fs::read_dir(dir.join("tmp")).unwrap().next().is_none());

    let a = host.attach("v1").unwrap();
    let root_meta = std::fs::metadata(a.root()).unwrap();
    assert_eq!(
        (root_meta.uid(), root_meta.gid(), root_meta.mode() & 0o7777),
        (1000, 1000, 0o755)
    );
    assert!(
        fs::list(a.root(), "/", 1).unwrap().is_empty(),
        "lost+found left"
    );
    let mounted = scratch.mounts().len();
    assert_eq!(mounted, 2, "a private self-bind and the ext4 mount");
    let flags = rustix::fs::statvfs(a.root()).unwrap().f_flag;
    use rustix::fs::StatVfsMountFlags as F;
    assert!(
        flags.contains(F::NOSUID | F::NODEV | F::NOEXEC),
        "{flags:?}"
    );

    write(a.root(), "/hello.txt", b"hello").unwrap();
    let b = host.attach("v1").unwrap();
    assert_eq!(b.root(), a.root());
    assert_eq!(
        scratch.mounts().len(),
        mounted,
        "a second attach mounts nothing"
    );

    // The size is a quota.
    let err = write(a.root(), "/big", &vec![7u8; 32 << 20]).unwrap_err();
    assert!(matches!(err, VolumeError::QuotaExceeded(_)), "{err}");
    assert_eq!(err.code(), ErrorCode::FsQuotaExceeded);
    assert!(
        fs::stat(a.root(), "/big").is_err(),
        "a failed write left a file"
    );
    let usage = host.usage("v1").unwrap();
    assert_eq!(usage.size_bytes, 16 << 20);
    assert!(
        usage.used_bytes > 0 && usage.used_bytes < 16 << 20,
        "{usage:?}"
    );

    let err = host.delete("v1").unwrap_err();
    assert!(matches!(err, VolumeError::Busy { .. }), "{err}");
    assert_eq!(err.code(), ErrorCode::VolumeBusy);
    let err = host.snapshot("v1", "v2").unwrap_err();
    assert!(matches!(err, VolumeError::Busy { .. }), "{err}");
    drop((a, b));

    // A restarted daemon finds the host mount and reuses it.
    drop(host);
    let host = VolumeHost::open(&dir, &templates).unwrap();
    let a = host.attach("v1").unwrap();
    assert_eq!(
        scratch.mounts().len(),
        mounted,
        "mounted twice after a restart"
    );
    assert_eq!(
        std::fs::read_to_string(a.root().join("hello.txt")).unwrap(),
        "hello"
    );
    drop(a);

    host.snapshot("v1", "v2").unwrap();
    assert_eq!(host.list_ids().unwrap(), ["v1", "v2"]);
    let copy = host.attach("v2").unwrap();
    assert_eq!(
        std::fs::read_to_string(copy.root().join("hello.txt")).unwrap(),
        "hello"
    );
    write(copy.root(), "/only-in-copy", b"x").unwrap();
    let orig = host.attach("v1").unwrap();
    assert!(fs::stat(orig.root(), "/only-in-copy").is_err());
    drop((copy, orig));

    host.delete("v1").unwrap();
    assert_eq!(host.list_ids().unwrap(), ["v2"]);
    assert!(matches!(
        host.attach("v1"),
        Err(VolumeError::VolumeNotFound(_))
    ));
    assert!(matches!(
        host.delete("v1"),
        Err(VolumeError::VolumeNotFound(_))
    ));
    assert_eq!(host.purge_trash(Duration::from_secs(3600)).unwrap(), 0);
    assert_eq!(host.purge_trash(Duration::ZERO).unwrap(), 1);
    assert!(std::fs::read_dir(dir.join("trash"))
        .unwrap()
        .next()
        .is_none());
    // The id is free again, for a new empty volume.
    host.create("v1", 8).unwrap();
    let fresh = host.attach("v1").unwrap();
    assert!(fs::list(fresh.root(), "/", 1).unwrap().is_empty());
    drop(fresh);

    host.shutdown().unwrap();
    assert!(scratch.mounts().is_empty(), "{:?}", scratch.mounts());
}

#[test]
fn leftovers_of_an_interrupted_create_are_removed_and_never_listed() {
    if !can_loop_mount() {
        return;
    }
    let scratch = Scratch::new();
    let dir = scratch.path().join("volumes");
    let host = VolumeHost::open(&dir, &scratch.path().join("t")).unwrap();
    std::fs::write(dir.join("tmp/v9.1.0"), "half an image").unwrap();
    std::fs::create_dir(dir.join("tmp/v9.1.0.mnt")).unwrap();
    assert!(host.list_ids().unwrap().is_empty());
    drop(host);
    let host = VolumeHost::open(&dir, &scratch.path().join("t")).unwrap();
    assert!(std::fs::read_dir(dir.join("tmp")).unwrap().next().is_none());
    assert!(host.list_ids().unwrap().is_empty());
}
