//! The btrfs backend end to end, on a btrfs filesystem made for the test on a sparse file
//! (root, loop devices, btrfs-progs).

mod common;

use std::os::unix::fs::MetadataExt;
use std::process::Command;
use std::time::Duration;

use common::{can_loop_mount, tool, write, Scratch};
use koder_hostkit::loopdev;
use koder_volumes::{fs, Backend, VolumeError, VolumeHost};
use rustix::mount::MountAttrFlags;

#[test]
fn btrfs_volumes_are_subvolumes_with_a_qgroup_quota() {
    if !can_loop_mount() || !tool("mkfs.btrfs") || !tool("btrfs") {
        eprintln!("skipped: needs btrfs-progs");
        return;
    }
    let scratch = Scratch::new();
    let image = scratch.path().join("btrfs.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(512 << 20)
        .unwrap();
    let out = Command::new("mkfs.btrfs")
        .arg("-q")
        .arg(&image)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mnt = scratch.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&image)
            .unwrap();
        let device = loopdev::attach(&file, &image).unwrap();
        // Scratch unmounts it whatever happens; the device then clears itself.
        loopdev::mount_private(device.path(), &mnt, c"btrfs", MountAttrFlags::empty(), c"")
            .unwrap();
    }

    let dir = mnt.join("volumes");
    let host = VolumeHost::open(&dir, &scratch.path().join("templates")).unwrap();
    assert_eq!(host.backend(), Backend::Btrfs);
    host.create("v1", 16).unwrap();
    assert!(matches!(
        host.create("v1", 16),
        Err(VolumeError::VolumeExists(_))
    ));
    assert_eq!(host.list_ids().unwrap(), ["v1"]);

    let a = host.attach("v1").unwrap();
    let meta = std::fs::metadata(a.root()).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o7777),
        (1000, 1000, 0o755)
    );
    assert_eq!(meta.ino(), 256, "the root of a subvolume");
    write(a.root(), "/hello.txt", b"hello").unwrap();
    write(a.root(), "/eight", &vec![1u8; 8 << 20]).unwrap();
    let usage = host.usage("v1").unwrap();
    assert_eq!(usage.size_bytes, 16 << 20);
    assert!(usage.used_bytes >= 8 << 20, "{usage:?}");

    // Snapshots need no detach on btrfs and keep the quota.
    host.snapshot("v1", "v2").unwrap();
    assert_eq!(host.usage("v2").unwrap().size_bytes, 16 << 20);
    let err = write(a.root(), "/big", &vec![7u8; 32 << 20]).unwrap_err();
    assert!(matches!(err, VolumeError::QuotaExceeded(_)), "{err}");

    assert!(matches!(host.delete("v1"), Err(VolumeError::Busy { .. })));
    drop(a);
    let copy = host.attach("v2").unwrap();
    assert_eq!(
        std::fs::read_to_string(copy.root().join("hello.txt")).unwrap(),
        "hello"
    );
    assert!(fs::stat(copy.root(), "/big").is_err());
    drop(copy);

    host.delete("v1").unwrap();
    assert_eq!(host.list_ids().unwrap(), ["v2"]);
    assert_eq!(host.purge_trash(Duration::from_secs(3600)).unwrap(), 0);
    assert_eq!(host.purge_trash(Duration::ZERO).unwrap(), 1);
    assert!(std::fs::read_dir(dir.join("trash"))
        .unwrap()
        .next()
        .is_none());
    host.shutdown().unwrap();
}
