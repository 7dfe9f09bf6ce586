//! The per-sandbox disk quota on a real loop device: ENOSPC at the size, sparse host usage,
//! host mount detached while a sandbox-like namespace keeps the disk, automatic loop release,
//! template caching, clean-up. Needs root and /dev/loop-control.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use koder_jail::disk::{self, Disk, DiskTemplates, MAX_SIZE_MIB};
use koder_runtime::RuntimeError;

const MIB: u64 = 1024 * 1024;

fn usable_or_skip() -> Option<()> {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: disk tests need root");
        return None;
    }
    if !Path::new("/dev/loop-control").exists() {
        eprintln!("skipped: no /dev/loop-control");
        return None;
    }
    Some(())
}

/// A scratch dir under /tmp (the real fs, not a tmpfs) with templates and one sandbox dir.
struct Scratch {
    // Dropped last: the guards below must have unmounted everything first.
    _tmp: tempfile::TempDir,
    root: PathBuf,
}

impl Scratch {
    fn new() -> Scratch {
        let tmp = tempfile::Builder::new()
            .prefix("kdisk-")
            .tempdir_in("/tmp")
            .expect("tempdir");
        // mountinfo shows canonical paths.
        let root = std::fs::canonicalize(tmp.path()).expect("canonical tempdir");
        Scratch { _tmp: tmp, root }
    }

    fn templates(&self) -> DiskTemplates {
        DiskTemplates::overlay(self.root.join("images"))
    }

    fn sandbox_dir(&self, name: &str) -> PathBuf {
        let dir = self.root.join(name);
        std::fs::create_dir_all(&dir).expect("sandbox dir");
        dir
    }
}

/// Removes the disk of a sandbox dir even when an assertion fails first.
struct DiskGuard(PathBuf);

impl Drop for DiskGuard {
    fn drop(&mut self) {
        let _ = disk::remove(&self.0);
    }
}

/// A process holding a copy of the host's mount table in a mount namespace of its own, like a
/// sandbox does; killed on drop.
struct Holder(Child);

impl Holder {
    /// `propagation` as for `unshare --propagation`: `private`, or `unchanged` to keep the copy
    /// in the host's peer groups (what a freshly cloned sandbox has before it changes anything).
    /// Returns once the namespace exists and, if given, shows an ext4 mount at `must_see`.
    fn spawn(propagation: &str, must_see: Option<&Path>) -> Holder {
        let child = Command::new("unshare")
            .args(["-m", "--propagation", propagation, "sleep", "30"])
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn unshare");
        let holder = Holder(child);
        let pid = holder.0.id();
        let own_ns = std::fs::read_link("/proc/self/ns/mnt").expect("own mount ns");
        wait_until(
            Duration::from_secs(5),
            "holder has its own mount namespace",
            || {
                std::fs::read_link(format!("/proc/{pid}/ns/mnt")).is_ok_and(|ns| ns != own_ns)
                    && must_see.is_none_or(|path| {
                        mounts_at(&format!("/proc/{pid}/mountinfo"), path)
                            .iter()
                            .any(|fs| fs == "ext4")
                    })
            },
        );
        holder
    }

    fn mountinfo(&self) -> String {
        format!("/proc/{}/mountinfo", self.0.id())
    }

    fn stop(mut self) {
        self.kill();
    }

    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A tmpfs with shared propagation, standing in for a systemd host's shared root.
struct SharedMount(PathBuf);

impl SharedMount {
    fn new(path: PathBuf) -> SharedMount {
        std::fs::create_dir_all(&path).expect("mkdir");
        rustix::mount::mount(
            "tmpfs",
            &path,
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            None,
        )
        .expect("mount tmpfs");
        let guard = SharedMount(path);
        rustix::mount::mount_change(&guard.0, rustix::mount::MountPropagationFlags::SHARED)
            .expect("make shared");
        guard
    }
}

impl Drop for SharedMount {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH);
    }
}

fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out after {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
    start.elapsed()
}

/// File system types mounted exactly at `path` according to a mountinfo file.
fn mounts_at(mountinfo: &str, path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(mountinfo).unwrap_or_default();
    let want = path.to_string_lossy();
    text.lines()
        .filter(|l| l.split(' ').nth(4) == Some(&*want))
        .filter_map(|l| l.split(" - ").nth(1))
        .filter_map(|rest| rest.split(' ').next().map(String::from))
        .collect()
}

fn backing_file(disk: &Disk) -> PathBuf {
    let name = disk.loop_device.file_name().expect("loop device name");
    Path::new("/sys/block").join(name).join("loop/backing_file")
}

fn wait_released(disk: &Disk) -> Duration {
    let backing = backing_file(disk);
    wait_until(Duration::from_secs(5), "loop device released", || {
        !backing.exists()
    })
}

/// Writes 1 MiB chunks into `dir` until the filesystem refuses; returns bytes written and the
/// error.
fn fill(dir: &Path) -> (u64, std::io::Error) {
    let chunk = vec![0xA5u8; MIB as usize];
    let mut written = 0u64;
    for i in 0.. {
        let mut f = match std::fs::File::create(dir.join(format!("fill-{i}"))) {
            Ok(f) => f,
            Err(e) => return (written, e),
        };
        for _ in 0..4 {
            if let Err(e) = f.write_all(&chunk) {
                return (written, e);
            }
            written += MIB;
        }
        if let Err(e) = f.sync_all() {
            return (written, e);
        }
    }
    unreachable!()
}

#[test]
fn quota_gives_enospc_and_the_namespace_copy_outlives_the_host_mount() {
    let Some(()) = usable_or_skip() else { return };
    let scratch = Scratch::new();
    let dir = scratch.sandbox_dir("sb");
    let _guard = DiskGuard(dir.clone());
    let disk = Disk::create(&scratch.templates(), &dir, 32, Some((200_000, 200_001)))
        .expect("create disk");

    // Layout and ownership.
    assert_eq!(disk.mount_point, dir.join("disk"));
    assert_eq!(disk.upper, dir.join("disk/upper"));
    assert_eq!(disk.work, dir.join("disk/work"));
    for d in [&disk.upper, &disk.work] {
        let meta = std::fs::metadata(d).expect("layer dir");
        assert_eq!(
            (meta.uid(), meta.gid()),
            (200_000, 200_001),
            "{}",
            d.display()
        );
    }
    assert!(!disk.mount_point.join("lost+found").exists());
    let types = mounts_at("/proc/self/mountinfo", &disk.mount_point);
    assert_eq!(types.last().map(String::as_str), Some("ext4"), "{types:?}");

    let dio = backing_file(&disk).with_file_name("dio");
    println!(
        "{} direct I/O: {}",
        disk.loop_device.display(),
        std::fs::read_to_string(dio).unwrap_or_default().trim()
    );

    // The quota.
    let (written, err) = fill(&disk.upper);
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    assert!(
        (20 * MIB..=32 * MIB).contains(&written),
        "wrote {} MiB before ENOSPC",
        written / MIB
    );
    rustix::fs::syncfs(std::fs::File::open(&disk.upper).expect("open upper")).expect("syncfs");
    let allocated = std::fs::metadata(&disk.image).expect("image").blocks() * 512;
    println!(
        "wrote {} MiB until ENOSPC; image allocates {:.1} MiB on the host",
        written / MIB,
        allocated as f64 / MIB as f64
    );
    assert!(allocated <= 34 * MIB, "image allocates {allocated} bytes");
    assert!(allocated >= written, "data did not reach the image");

    // A namespace copy keeps the disk after the host lets go.
    let holder = Holder::spawn("private", Some(&disk.mount_point));
    disk.detach_host_mount().expect("detach");
    assert!(
        mounts_at("/proc/self/mountinfo", &disk.mount_point).is_empty(),
        "host still has a mount at {}",
        disk.mount_point.display()
    );
    assert!(
        mounts_at(&holder.mountinfo(), &disk.mount_point).contains(&"ext4".to_string()),
        "holder lost the disk"
    );
    assert!(
        backing_file(&disk).exists(),
        "loop device released too early"
    );
    std::fs::remove_file(&disk.image).expect("unlink image while attached");
    let backing = std::fs::read_to_string(backing_file(&disk)).unwrap_or_default();
    assert!(backing.trim_end().ends_with("(deleted)"), "{backing:?}");

    holder.stop();
    let took = wait_released(&disk);
    println!("loop device released {took:?} after the last holder died");

    disk::remove(&dir).expect("remove");
    assert!(!disk.image.exists());
    assert!(!disk.mount_point.exists());
}

/// On a host whose mounts propagate (systemd's shared root), the host-side lazy unmount must
/// not reach into a sandbox that still shares the host's peer groups.
#[test]
fn detach_under_a_shared_parent_leaves_the_sandbox_copy() {
    let Some(()) = usable_or_skip() else { return };
    let scratch = Scratch::new();
    let shared = SharedMount::new(scratch.root.join("shared"));
    let dir = shared.0.join("sb");
    std::fs::create_dir(&dir).expect("sandbox dir");
    // A slave namespace that exists already, like a systemd service's.
    let slave = Holder::spawn("slave", None);
    let _guard = DiskGuard(dir.clone());
    let disk = Disk::create(&scratch.templates(), &dir, 16, None).expect("create disk");
    assert!(
        !mounts_at(&slave.mountinfo(), &disk.mount_point).contains(&"ext4".to_string()),
        "the ext4 mount propagated into another namespace"
    );

    let holder = Holder::spawn("unchanged", Some(&disk.mount_point));
    std::fs::write(disk.upper.join("keep"), b"still here").expect("write");
    disk.detach_host_mount().expect("detach");
    assert!(mounts_at("/proc/self/mountinfo", &disk.mount_point).is_empty());
    assert!(
        mounts_at(&holder.mountinfo(), &disk.mount_point).contains(&"ext4".to_string()),
        "the host's unmount propagated into the sandbox's copy"
    );
    let kept = std::fs::read(format!(
        "/proc/{}/root{}",
        holder.0.id(),
        disk.upper.join("keep").display()
    ))
    .expect("read through the holder's namespace");
    assert_eq!(kept, b"still here");
    assert!(
        backing_file(&disk).exists(),
        "loop device released too early"
    );

    holder.stop();
    wait_released(&disk);
    disk::remove(&dir).expect("remove");
    assert!(!disk.image.exists());
    assert!(
        mounts_at(&slave.mountinfo(), &disk.mount_point).is_empty(),
        "another namespace kept a mount at {}",
        disk.mount_point.display()
    );
    slave.stop();
}

/// A disk from a plain template (mkfs's root, `lost+found`) gets the layout an overlay
/// template has baked in.
#[test]
fn plain_and_overlay_templates_give_the_same_layout() {
    let Some(()) = usable_or_skip() else { return };
    let scratch = Scratch::new();
    let plain = DiskTemplates::new(scratch.root.join("plain"));
    let layout = |templates: &DiskTemplates, name: &str| {
        let dir = scratch.sandbox_dir(name);
        let _guard = DiskGuard(dir.clone());
        let disk = Disk::create(templates, &dir, 16, Some((200_000, 200_001))).expect("disk");
        let mut entries: Vec<_> = std::fs::read_dir(&disk.mount_point)
            .expect("disk root")
            .map(|e| e.expect("entry").file_name())
            .collect();
        entries.sort();
        let stat = |p: &Path| {
            let m = std::fs::metadata(p).expect("stat");
            (m.mode(), m.uid(), m.gid())
        };
        let layout = (
            entries,
            stat(&disk.mount_point),
            stat(&disk.upper),
            stat(&disk.work),
        );
        disk::remove(&dir).expect("remove");
        layout
    };
    let overlay = layout(&scratch.templates(), "overlay");
    assert_eq!(overlay, layout(&plain, "plain"));
    assert_eq!(overlay.0, ["upper", "work"]);
    assert_eq!(
        (
            overlay.1 .0 & 0o7777,
            overlay.2 .0 & 0o7777,
            overlay.3 .0 & 0o7777
        ),
        (0o711, 0o755, 0o700)
    );
}

#[test]
fn templates_are_built_once_per_size() {
    let Some(()) = usable_or_skip() else { return };
    let scratch = Scratch::new();
    let templates = scratch.templates();

    let first = scratch.sandbox_dir("a");
    let _ga = DiskGuard(first.clone());
    let started = Instant::now();
    Disk::create(&templates, &first, 64, None).expect("first disk");
    println!(
        "first 64 MiB disk (builds the template): {:?}",
        started.elapsed()
    );
    let template = templates.template(64).expect("template");
    assert_eq!(template, scratch.root.join("images/overlay-64m.img"));
    let mtime = std::fs::metadata(&template)
        .expect("template")
        .modified()
        .expect("mtime");

    for name in ["b", "c", "d"] {
        let dir = scratch.sandbox_dir(name);
        let _g = DiskGuard(dir.clone());
        let started = Instant::now();
        let disk = Disk::create(&templates, &dir, 64, None).expect("cached disk");
        println!(
            "64 MiB disk from the cached template: {:?}",
            started.elapsed()
        );
        assert!(disk.upper.is_dir());
        disk::remove(&dir).expect("remove");
    }
    let again = std::fs::metadata(&template)
        .expect("template")
        .modified()
        .expect("mtime");
    assert_eq!(mtime, again, "template was rebuilt");

    let big = scratch.sandbox_dir("big");
    let _gb = DiskGuard(big.clone());
    templates.template(8192).expect("8 GiB template");
    let started = Instant::now();
    let disk = Disk::create(&templates, &big, 8192, None).expect("8 GiB disk");
    println!(
        "8 GiB disk from the cached template: {:?}",
        started.elapsed()
    );
    let allocated = std::fs::metadata(&disk.image).expect("image").blocks() * 512;
    println!(
        "8 GiB image allocates {:.1} MiB",
        allocated as f64 / MIB as f64
    );
    assert!(
        allocated < 256 * MIB,
        "image is not sparse: {allocated} bytes"
    );

    // No temporary build files stay behind.
    let leftovers: Vec<_> = std::fs::read_dir(scratch.root.join("images"))
        .expect("images")
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().contains(".tmp."))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn concurrent_creates_get_their_own_devices() {
    let Some(()) = usable_or_skip() else { return };
    let scratch = Scratch::new();
    let templates = scratch.templates();
    let dirs: Vec<PathBuf> = (0..8)
        .map(|i| scratch.sandbox_dir(&format!("c{i}")))
        .collect();
    let _guards: Vec<DiskGuard> = dirs.iter().cloned().map(DiskGuard).collect();
    let disks: Vec<Disk> = std::thread::scope(|s| {
        let handles: Vec<_> = dirs
            .iter()
            .map(|d| s.spawn(|| Disk::create(&templates, d, 16, None)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread").expect("create"))
            .collect()
    });
    let mut devices: Vec<_> = disks.iter().map(|d| d.loop_device.clone()).collect();
    devices.sort();
    devices.dedup();
    assert_eq!(devices.len(), disks.len(), "a loop device was shared");
    for (disk, dir) in disks.iter().zip(&dirs) {
        disk::remove(dir).expect("remove");
        wait_released(disk);
    }
}

#[test]
fn remove_unmounts_a_disk_never_detached() {
    let Some(()) = usable_or_skip() else { return };
    let scratch = Scratch::new();
    let dir = scratch.sandbox_dir("sb");
    let _guard = DiskGuard(dir.clone());
    let disk = Disk::create(&scratch.templates(), &dir, 16, None).expect("create disk");
    assert!(!mounts_at("/proc/self/mountinfo", &disk.mount_point).is_empty());

    disk::remove(&dir).expect("remove");
    assert!(mounts_at("/proc/self/mountinfo", &disk.mount_point).is_empty());
    assert!(!disk.image.exists());
    assert!(!disk.mount_point.exists());
    wait_released(&disk);

    // Nothing there: still fine, and idempotent.
    disk::remove(&dir).expect("remove again");
    disk::remove(&scratch.root.join("never-existed")).expect("remove missing dir");
}

#[test]
fn sizes_are_validated() {
    let Some(()) = usable_or_skip() else { return };
    let scratch = Scratch::new();
    let templates = scratch.templates();
    let dir = scratch.sandbox_dir("sb");
    let _guard = DiskGuard(dir.clone());
    for size in [0, MAX_SIZE_MIB + 1, u64::MAX] {
        let err = Disk::create(&templates, &dir, size, None).expect_err("size accepted");
        assert!(matches!(err, RuntimeError::InvalidSpec(_)), "{err:?}");
        assert!(err.to_string().contains("MiB"), "{err}");
        assert!(templates.template(size).is_err());
        assert!(!dir.join("disk.img").exists());
    }
    // The smallest size mkfs.ext4 takes (in whole MiB) is a working disk.
    let disk = Disk::create(&templates, &dir, disk::MIN_SIZE_MIB, None).expect("minimum size");
    std::fs::write(disk.upper.join("f"), b"x").expect("write on the smallest disk");
    disk::remove(&dir).expect("remove");

    // A second create over an existing image is refused and leaves that image alone.
    std::fs::write(dir.join("disk.img"), b"not ours").expect("write");
    assert!(Disk::create(&templates, &dir, 16, None).is_err());
    assert_eq!(
        std::fs::read(dir.join("disk.img")).expect("read"),
        b"not ours"
    );
}

/// Loop devices whose backing file lies under `dir`.
/// The loop devices (`loopN`) whose backing file is under `dir`.
fn devices_backed_under(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/sys/block")
        .into_iter()
        .flatten()
        .flatten()
    {
        let backing = e.path().join("loop/backing_file");
        if let Ok(text) = std::fs::read_to_string(&backing) {
            if Path::new(text.trim()).starts_with(dir) {
                found.push(e.file_name().to_string_lossy().into_owned());
            }
        }
    }
    found
}

fn images_in(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|r| r.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// A disk made ahead is what the next create of its size gets, whole (the same image, moved
/// into the sandbox's directory, already attached), then the next is made; one of another size
/// is made on the spot; dropping the stock releases its device and deletes its image.
#[test]
fn disks_made_ahead_are_taken_whole_and_released_with_the_stock() {
    let Some(()) = usable_or_skip() else { return };
    let s = Scratch::new();
    let stock = s.root.join("ready");
    let ready = disk::ReadyDisks::new(s.templates(), stock.clone()).expect("stock");
    let a = s.sandbox_dir("a");
    let _ga = DiskGuard(a.clone());
    let first = Disk::create_ready(&ready, &a, 16, None).expect("first disk");
    assert!(!mounts_at("/proc/self/mountinfo", &first.mount_point).is_empty());
    wait_until(Duration::from_secs(10), "a disk made ahead", || {
        ready.ready_count(16) == 1
    });
    let devices = devices_backed_under(&stock);
    assert_eq!(devices.len(), 1);
    // Its filesystem is open already (ext4 lists each live superblock), mounted nowhere.
    assert!(Path::new("/proc/fs/ext4").join(&devices[0]).exists());
    let ahead = images_in(&stock).remove(0);
    let inode = std::fs::metadata(&ahead).unwrap().ino();
    assert_eq!(
        mounts_at("/proc/self/mountinfo", &stock),
        Vec::<String>::new()
    );

    let b = s.sandbox_dir("b");
    let _gb = DiskGuard(b.clone());
    let second = Disk::create_ready(&ready, &b, 16, None).expect("second disk");
    assert_eq!(std::fs::metadata(&second.image).unwrap().ino(), inode);
    assert_eq!(
        std::fs::read_to_string(backing_file(&second))
            .unwrap()
            .trim(),
        second.image.to_string_lossy()
    );
    assert!(!mounts_at("/proc/self/mountinfo", &second.mount_point).is_empty());
    assert!(second.upper.is_dir() && second.work.is_dir());
    // Made ahead with the directories sandbox code writes to, still root's.
    assert!(!first.upper_dirs_made && second.upper_dirs_made);
    let tmp = std::fs::metadata(second.upper.join("tmp")).unwrap();
    assert_eq!((tmp.uid(), tmp.mode() & 0o7777), (0, 0o1777));

    // Another size: nothing ready, made on the spot.
    let c = s.sandbox_dir("c");
    let _gc = DiskGuard(c.clone());
    let other = Disk::create_ready(&ready, &c, 24, None).expect("other size");
    assert_eq!(other.size_mib, 24);

    wait_until(Duration::from_secs(10), "both sizes made ahead", || {
        ready.ready_count(16) == 1 && ready.ready_count(24) == 1
    });
    assert_eq!(images_in(&stock).len(), 2);
    assert_eq!(devices_backed_under(&stock).len(), 2);
    // The refill threads may hold the stock a moment longer than its `ready_count` shows: it goes
    // with whichever lets go last.
    drop(ready);
    wait_until(Duration::from_secs(5), "stock images deleted", || {
        images_in(&stock).is_empty()
    });
    wait_until(Duration::from_secs(5), "stock devices released", || {
        devices_backed_under(&stock).is_empty()
    });
}

/// A size whose creates come faster than its refill gets more disks made ahead; the sizes
/// stocked are the few asked last, the one asked longest ago leaving the stock with its disks.
#[test]
fn the_stock_deepens_for_a_size_in_demand_and_keeps_only_recent_sizes() {
    let Some(()) = usable_or_skip() else { return };
    let s = Scratch::new();
    let stock = s.root.join("ready");
    let ready = disk::ReadyDisks::new(s.templates(), stock.clone()).expect("stock");
    let mut guards = Vec::new();
    let mut create = |name: &str, mib: u64| {
        let dir = s.sandbox_dir(name);
        guards.push(DiskGuard(dir.clone()));
        Disk::create_ready(&ready, &dir, mib, None).expect("disk")
    };
    // The second create comes before the first's refill has started: a miss.
    create("a", 16);
    create("b", 16);
    wait_until(Duration::from_secs(10), "two disks made ahead", || {
        ready.ready_count(16) == 2
    });
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(images_in(&stock).len(), 2, "no more than the depth");
    assert_eq!(devices_backed_under(&stock).len(), 2);

    let others = [17, 18, 19, 20];
    for (i, mib) in others.into_iter().enumerate() {
        create(&format!("o{i}"), mib);
    }
    assert_eq!(ready.ready_count(16), 0, "the oldest size left the stock");
    wait_until(
        Duration::from_secs(20),
        "the recent sizes made ahead",
        || others.iter().all(|&mib| ready.ready_count(mib) == 1),
    );
    // Released beside the creates, not by them.
    let sizes_left = || {
        let mut names: Vec<String> = images_in(&stock)
            .iter()
            .filter_map(|p| Some(p.file_name()?.to_str()?.split('-').next()?.to_owned()))
            .collect();
        names.sort();
        names
    };
    wait_until(
        Duration::from_secs(5),
        "the oldest size's disks released",
        || {
            sizes_left() == ["17m", "18m", "19m", "20m"]
                && devices_backed_under(&stock).len() == others.len()
        },
    );
}
