//! The file API on hostile content: a plain directory stands in for a volume's root, with
//! whatever a sandbox could have left in it, next to a host directory it must never reach.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use koder_volumes::fs::{self, Kind};
use koder_volumes::VolumeError;

struct Setup {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    victim: PathBuf,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("vol");
    let victim = tmp.path().join("victim");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("secret"), "host data").unwrap();
    Setup {
        _tmp: tmp,
        root,
        victim,
    }
}

fn symlink(target: impl AsRef<Path>, link: impl AsRef<Path>) {
    std::os::unix::fs::symlink(target, link).unwrap();
}

fn read(root: &Path, path: &str) -> Result<String, VolumeError> {
    let (mut file, size) = fs::open_file(root, path)?;
    let mut s = String::new();
    file.read_to_string(&mut s).unwrap();
    assert_eq!(s.len() as u64, size);
    Ok(s)
}

fn write(root: &Path, path: &str, overwrite: bool, data: &[u8]) -> Result<fs::Entry, VolumeError> {
    let mut new = fs::create_file(root, path, overwrite, None, None)?;
    new.file_mut().write_all(data).unwrap();
    new.commit()
}

#[test]
fn a_symlink_to_etc_is_reported_and_resolves_inside_the_volume() {
    let s = setup();
    symlink("/etc", s.root.join("etc-link"));
    let entry = fs::stat(&s.root, "/etc-link").unwrap();
    assert_eq!(entry.kind, Kind::Symlink);
    assert_eq!(entry.target.as_deref(), Some("/etc"));
    assert_eq!(entry.name, "etc-link");
    // The host's /etc/passwd is never what is read.
    let err = read(&s.root, "/etc-link/passwd").unwrap_err();
    assert!(matches!(err, VolumeError::NotFound(_)), "{err}");
    std::fs::create_dir(s.root.join("etc")).unwrap();
    std::fs::write(s.root.join("etc/passwd"), "inside").unwrap();
    assert_eq!(read(&s.root, "/etc-link/passwd").unwrap(), "inside");
    // `..` climbing in a target stops at the volume's root too.
    symlink("../../../../../../etc/passwd", s.root.join("up"));
    assert_eq!(read(&s.root, "/up").unwrap(), "inside");
}

#[test]
fn paths_with_dotdot_nul_or_no_slash_are_refused() {
    let s = setup();
    for bad in ["/../victim/secret", "/a/../b", "relative", "", "/a\0b"] {
        let err = fs::stat(&s.root, bad).unwrap_err();
        assert!(
            matches!(err, VolumeError::InvalidPath { .. }),
            "{bad:?}: {err}"
        );
    }
    let long = format!("/{}", "a/".repeat(2100));
    assert!(matches!(
        fs::stat(&s.root, &long),
        Err(VolumeError::InvalidPath { .. })
    ));
    // Empty and `.` components are normalized away.
    let root = fs::stat(&s.root, "//./").unwrap();
    assert_eq!((root.path.as_str(), root.name.as_str()), ("/", "/"));
    assert_eq!(root.kind, Kind::Directory);
}

#[test]
fn a_fifo_is_never_read_and_nothing_hangs() {
    let s = setup();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        s.root.join("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o666),
        0,
    )
    .unwrap();
    symlink("/fifo", s.root.join("to-fifo"));
    let root = s.root.clone();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let a = fs::open_file(&root, "/fifo").map(drop);
        let b = fs::open_file(&root, "/to-fifo").map(drop);
        let _ = tx.send((a, b));
    });
    let (a, b) = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("opening a fifo hung");
    for r in [a, b] {
        assert!(matches!(r, Err(VolumeError::NotRegular(_))), "{r:?}");
    }
    assert_eq!(fs::stat(&s.root, "/fifo").unwrap().kind, Kind::Unknown);
    // A directory is not a file either.
    assert!(matches!(
        fs::open_file(&s.root, "/"),
        Err(VolumeError::IsADirectory(_))
    ));
}

#[test]
fn a_symlink_loop_is_a_typed_error() {
    let s = setup();
    symlink("l2", s.root.join("l1"));
    symlink("l1", s.root.join("l2"));
    assert_eq!(fs::stat(&s.root, "/l1").unwrap().kind, Kind::Symlink);
    let err = read(&s.root, "/l1").unwrap_err();
    assert!(matches!(err, VolumeError::SymlinkLoop(_)), "{err}");
    let err = fs::list(&s.root, "/l1", 1).unwrap_err();
    assert!(matches!(err, VolumeError::SymlinkLoop(_)), "{err}");
}

#[test]
fn a_symlinked_dir_pointing_outside_reaches_nothing_outside() {
    let s = setup();
    symlink(&s.victim, s.root.join("out"));
    let victim = s.victim.display().to_string();
    let err = read(&s.root, "/out/secret").unwrap_err();
    assert!(matches!(err, VolumeError::NotFound(_)), "{err}");
    assert!(matches!(
        fs::list(&s.root, "/out", 1),
        Err(VolumeError::NotFound(_))
    ));
    assert!(matches!(
        fs::create_file(&s.root, "/out/new", false, None, None),
        Err(VolumeError::NotFound(_))
    ));
    assert!(fs::make_dir(&s.root, "/out/sub", true, None, None).is_err());
    assert!(fs::set_metadata(&s.root, "/out/secret", Some(1234), None, None).is_err());
    assert!(fs::remove(&s.root, "/out/secret").is_err());
    // The link itself is changed, never what it points at.
    fs::set_metadata(&s.root, "/out", Some(1234), Some(1234), None).unwrap();
    let err = fs::set_metadata(&s.root, "/out", None, None, Some(0o777)).unwrap_err();
    assert!(matches!(err, VolumeError::InvalidArgument(_)), "{err}");
    let meta = std::fs::metadata(&s.victim).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, 0o755), "{victim}");
    assert_eq!(
        std::fs::symlink_metadata(s.root.join("out")).unwrap().uid(),
        1234
    );
    assert_eq!(
        std::fs::read_to_string(s.victim.join("secret")).unwrap(),
        "host data"
    );
    assert_eq!(std::fs::read_dir(&s.victim).unwrap().count(), 1);
}

#[test]
fn removing_a_dir_holding_links_to_a_host_dir_spares_the_host() {
    let s = setup();
    let d = s.root.join("d/e");
    std::fs::create_dir_all(&d).unwrap();
    symlink(&s.victim, s.root.join("d/abs"));
    symlink("../../../victim", d.join("rel"));
    symlink(s.victim.join("secret"), d.join("file"));
    std::fs::write(d.join("plain"), "x").unwrap();
    fs::remove(&s.root, "/d").unwrap();
    assert!(!s.root.join("d").exists());
    assert_eq!(
        std::fs::read_to_string(s.victim.join("secret")).unwrap(),
        "host data"
    );
    let err = fs::remove(&s.root, "/").unwrap_err();
    assert!(matches!(err, VolumeError::InvalidPath { .. }), "{err}");
    assert!(matches!(
        fs::remove(&s.root, "/missing"),
        Err(VolumeError::NotFound(_))
    ));
}

#[test]
fn files_are_created_atomically_with_owner_and_mode() {
    let s = setup();
    let new = fs::create_file(&s.root, "/a.txt", false, Some((1000, 1000)), Some(0o640)).unwrap();
    // Not visible before commit; dropped uncommitted, gone.
    assert!(fs::list(&s.root, "/", 1).unwrap().is_empty());
    drop(new);
    assert!(fs::list(&s.root, "/", 1).unwrap().is_empty());

    let mut new =
        fs::create_file(&s.root, "/a.txt", false, Some((1000, 1000)), Some(0o640)).unwrap();
    new.file_mut().write_all(b"hello").unwrap();
    let entry = new.commit().unwrap();
    assert_eq!(
        (entry.kind, entry.size, entry.mode, entry.uid, entry.gid),
        (Kind::File, 5, 0o640, 1000, 1000)
    );
    assert_eq!(entry.path, "/a.txt");
    let err = write(&s.root, "/a.txt", false, b"no").unwrap_err();
    assert!(matches!(err, VolumeError::AlreadyExists(_)), "{err}");
    assert_eq!(write(&s.root, "/a.txt", true, b"bye").unwrap().size, 3);
    assert_eq!(read(&s.root, "/a.txt").unwrap(), "bye");
    let err = write(&s.root, "/missing/b", false, b"").unwrap_err();
    assert!(matches!(err, VolumeError::NotFound(_)), "{err}");
    std::fs::create_dir(s.root.join("dir")).unwrap();
    let err = write(&s.root, "/dir", true, b"").unwrap_err();
    assert!(matches!(err, VolumeError::IsADirectory(_)), "{err}");
    // Overwriting a symlink replaces the link, not what it points at.
    symlink(s.victim.join("secret"), s.root.join("link"));
    write(&s.root, "/link", true, b"mine").unwrap();
    assert_eq!(fs::stat(&s.root, "/link").unwrap().kind, Kind::File);
    assert_eq!(
        std::fs::read_to_string(s.victim.join("secret")).unwrap(),
        "host data"
    );
    let names: Vec<_> = fs::list(&s.root, "/", 1)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["a.txt", "dir", "link"], "no temporary names left");
}

#[test]
fn make_dir_follows_mkdir_p() {
    let s = setup();
    let e = fs::make_dir(&s.root, "/a", false, Some((1000, 1000)), Some(0o2750)).unwrap();
    assert_eq!((e.kind, e.mode, e.uid), (Kind::Directory, 0o2750, 1000));
    let err = fs::make_dir(&s.root, "/a", false, None, None).unwrap_err();
    assert!(matches!(err, VolumeError::AlreadyExists(_)), "{err}");
    fs::make_dir(&s.root, "/a", true, None, None).unwrap();
    let err = fs::make_dir(&s.root, "/x/y", false, None, None).unwrap_err();
    assert!(matches!(err, VolumeError::NotFound(_)), "{err}");
    let e = fs::make_dir(&s.root, "/x/y/z", true, Some((7, 8)), Some(0o700)).unwrap();
    assert_eq!((e.mode, e.uid, e.gid), (0o700, 7, 8));
    let mid = std::fs::metadata(s.root.join("x/y")).unwrap();
    assert_eq!((mid.mode() & 0o7777, mid.uid()), (0o755, 7));
    std::fs::write(s.root.join("f"), "").unwrap();
    let err = fs::make_dir(&s.root, "/f/g", true, None, None).unwrap_err();
    assert!(matches!(err, VolumeError::NotADirectory(_)), "{err}");
    let err = fs::make_dir(&s.root, "/m", false, None, Some(0o17777)).unwrap_err();
    assert!(matches!(err, VolumeError::InvalidArgument(_)), "{err}");
}

/// Owners are ids a sandbox can see: past 0..65536 an id would show as `nobody` everywhere,
/// and `u32::MAX` would tell chown to leave the owner as it is.
#[test]
fn owners_outside_a_sandboxs_ids_are_refused() {
    let s = setup();
    let last = koder_runtime::SANDBOX_IDS - 1;
    let e = fs::make_dir(&s.root, "/ok", false, Some((last, last)), None).unwrap();
    assert_eq!((e.uid, e.gid), (last, last));
    for owner in [(last + 1, 0), (0, last + 1), (u32::MAX, 0)] {
        let refused = [
            fs::make_dir(&s.root, "/d", false, Some(owner), None).err(),
            fs::create_file(&s.root, "/f", false, Some(owner), None).err(),
            fs::set_metadata(&s.root, "/ok", Some(owner.0), Some(owner.1), None).err(),
        ];
        for err in refused {
            assert!(
                matches!(err, Some(VolumeError::InvalidArgument(_))),
                "{owner:?}: {err:?}"
            );
        }
    }
    let e = fs::stat(&s.root, "/ok").unwrap();
    assert_eq!(
        (e.uid, e.gid),
        (last, last),
        "a refused change changes nothing"
    );
    assert!(!s.root.join("d").exists() && !s.root.join("f").exists());
}

#[test]
fn list_goes_depth_first_to_the_depth_and_never_into_symlinks() {
    let s = setup();
    std::fs::create_dir_all(s.root.join("a/b/c")).unwrap();
    std::fs::write(s.root.join("a/f"), "12").unwrap();
    symlink("/a", s.root.join("z-link"));
    symlink(&s.victim, s.root.join("a/out"));
    let paths = |depth| -> Vec<String> {
        fs::list(&s.root, "/", depth)
            .unwrap()
            .into_iter()
            .map(|e| e.path)
            .collect()
    };
    assert_eq!(paths(1), ["/a", "/z-link"]);
    assert_eq!(paths(2), ["/a", "/a/b", "/a/f", "/a/out", "/z-link"]);
    assert_eq!(
        paths(10),
        ["/a", "/a/b", "/a/b/c", "/a/f", "/a/out", "/z-link"]
    );
    // Listing through a symlink inside the volume is fine: it is the path the caller named.
    let via: Vec<_> = fs::list(&s.root, "/z-link", 1)
        .unwrap()
        .into_iter()
        .map(|e| e.path)
        .collect();
    assert_eq!(via, ["/z-link/b", "/z-link/f", "/z-link/out"]);
    for bad in [0, fs::MAX_DEPTH + 1] {
        assert!(matches!(
            fs::list(&s.root, "/", bad),
            Err(VolumeError::InvalidArgument(_))
        ));
    }
    assert!(matches!(
        fs::list(&s.root, "/a/f", 1),
        Err(VolumeError::NotADirectory(_))
    ));
}

#[test]
fn set_metadata_changes_mode_and_owner_in_order() {
    let s = setup();
    std::fs::write(s.root.join("f"), "").unwrap();
    let e = fs::set_metadata(&s.root, "/f", Some(1000), Some(1001), Some(0o4755)).unwrap();
    assert_eq!((e.uid, e.gid, e.mode), (1000, 1001, 0o4755));
    let e = fs::set_metadata(&s.root, "/f", None, None, Some(0o600)).unwrap();
    assert_eq!(e.mode, 0o600);
    let err = fs::set_metadata(&s.root, "/f", None, None, Some(0o10000)).unwrap_err();
    assert!(matches!(err, VolumeError::InvalidArgument(_)), "{err}");
    assert_eq!(
        std::fs::metadata(s.root.join("f"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o600
    );
}

#[test]
fn remove_takes_big_directories_and_names_that_are_not_utf8() {
    use std::os::unix::ffi::OsStrExt;
    let s = setup();
    let big = s.root.join("big");
    std::fs::create_dir(&big).unwrap();
    for i in 0..5000 {
        std::fs::write(big.join(i.to_string()), "").unwrap();
    }
    std::fs::write(big.join(std::ffi::OsStr::from_bytes(b"bad\xff")), "").unwrap();
    // Listed without the name it could not show.
    assert_eq!(fs::list(&s.root, "/big", 1).unwrap().len(), 5000);
    fs::remove(&s.root, "/big").unwrap();
    assert!(!big.exists());
}
