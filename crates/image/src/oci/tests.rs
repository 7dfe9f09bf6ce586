use std::os::unix::fs::{MetadataExt, PermissionsExt};

use serde_json::json;

use super::testing::{docker_archive, layer, oci_archive, E};
use super::*;

fn base() -> Vec<u8> {
    layer(&[
        E::Dir("usr"),
        E::Dir("usr/bin"),
        E::File("usr/bin/tool", b"#!/bin/sh\necho tool\n", 0o4755),
        E::Dir("opt"),
        E::Dir("opt/app"),
        E::File("opt/app/old.txt", b"old", 0o644),
        E::File("opt/app/gone.txt", b"gone", 0o644),
        E::Dir("opt/cache"),
        E::File("opt/cache/a", b"a", 0o644),
        E::Char("dev/null"),
    ])
}

fn top() -> Vec<u8> {
    layer(&[
        E::File("opt/app/.wh.gone.txt", b"", 0o644),
        E::File("opt/cache/.wh..wh..opq", b"", 0o644),
        E::File("opt/cache/b", b"b", 0o644),
        E::File("opt/app/new.txt", b"new", 0o640),
        E::Link("opt/app/old-link.txt", "opt/app/old.txt"),
        E::Symlink("opt/app/latest", "new.txt"),
    ])
}

fn write_archive(dir: &Path, bytes: &[u8]) -> std::path::PathBuf {
    let path = dir.join("image.tar");
    std::fs::write(&path, bytes).unwrap();
    path
}

fn tmp_entries(store: &ImageStore) -> usize {
    std::fs::read_dir(store.root().join(".tmp"))
        .unwrap()
        .count()
}

#[test]
fn oci_layout_layers_apply_in_order_with_whiteouts() {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(&dir.path().join("images")).unwrap();
    let archive = write_archive(dir.path(), &oci_archive(&[base(), top()], true));
    let imported = import(&store, &archive, "app", Limits::default()).unwrap();
    assert!(imported.unpacked);
    let root = &imported.image.root;
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    assert_eq!(read("opt/app/old.txt"), "old");
    assert_eq!(read("opt/app/new.txt"), "new");
    assert_eq!(read("opt/app/old-link.txt"), "old");
    assert_eq!(read("opt/app/latest"), "new");
    assert_eq!(read("opt/cache/b"), "b");
    for gone in [
        "opt/app/gone.txt",
        "opt/cache/a",
        "opt/app/.wh.gone.txt",
        "dev/null",
    ] {
        assert!(
            std::fs::symlink_metadata(root.join(gone)).is_err(),
            "{gone}"
        );
    }
    let mode = |p: &str| {
        std::fs::metadata(root.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("usr/bin/tool"), 0o755, "setuid dropped");
    assert_eq!(mode("opt/app/new.txt"), 0o640);
    // The generated accounts, as every image has them.
    assert!(read("etc/passwd").starts_with("root:x:0:0"));

    let m = &imported.image.manifest;
    assert_eq!(imported.image.names, ["app"]);
    assert_eq!(m.workdir, "/opt/app");
    assert_eq!(m.user, "1000");
    let env: HashMap<_, _> = m.env.iter().cloned().collect();
    assert_eq!(env["PATH"], "/opt/app/bin:/usr/bin:/bin");
    assert_eq!(env["GREETING"], "hello");
    assert_eq!(env["LANG"], "C.UTF-8");
    assert_eq!(m.recipe["kind"], "oci");
    assert_eq!(m.recipe["cmd"], json!(["serve", "--port", "8000"]));
    assert!(m.build_log.contains("layer 2/2"), "{}", m.build_log);
    assert!(m.build_log.contains("1 dropped"), "{}", m.build_log);

    // The same image again is found, under a second name too.
    let again = import(&store, &archive, "app2", Limits::default()).unwrap();
    assert!(!again.unpacked);
    assert_eq!(again.image.names, ["app", "app2"]);
    assert_eq!(tmp_entries(&store), 0);
}

/// An image's own accounts and owners are what its sessions see: `app` made by the image's
/// build keeps its home and its private file; an owner no sandbox has becomes root.
#[test]
fn the_images_accounts_and_owners_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(&dir.path().join("images")).unwrap();
    let passwd = b"root:x:0:0:root:/root:/bin/ash\napp:x:1001:1001::/home/app:/bin/sh\n";
    let layer = layer(&[
        E::Dir("etc"),
        E::File("etc/passwd", passwd, 0o644),
        E::File("etc/group", b"root:x:0:\napp:x:1001:\n", 0o644),
        E::Dir("home"),
        E::Owned(&E::Dir("home/app"), 1001, 1001),
        E::Owned(&E::File("home/app/secret", b"app's", 0o600), 1001, 1001),
        E::Owned(&E::Symlink("home/app/link", "secret"), 1001, 1001),
        E::Owned(&E::File("home/app/far", b"x", 0o644), 70_000, 1001),
    ]);
    let archive = write_archive(dir.path(), &oci_archive(&[layer], true));
    let imported = import(&store, &archive, "owned", Limits::default()).unwrap();
    let root = &imported.image.root;
    let owner = |p: &str| {
        let m = std::fs::symlink_metadata(root.join(p)).unwrap();
        (m.uid(), m.gid(), m.mode() & 0o7777)
    };
    assert_eq!(owner("home/app"), (1001, 1001, 0o755));
    assert_eq!(owner("home/app/secret"), (1001, 1001, 0o600));
    assert_eq!(owner("home/app/link").0, 1001);
    assert_eq!(owner("home/app/far"), (0, 1001, 0o644));
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    assert_eq!(
        read("etc/passwd"),
        "root:x:0:0:root:/root:/bin/ash\napp:x:1001:1001::/home/app:/bin/sh\n\
         user:x:1000:1000:user:/home/user:/bin/ash\n\
         nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    );
    assert!(read("etc/group").starts_with("root:x:0:\napp:x:1001:\ntty:x:5:\n"));
    assert!(read("etc/shadow").contains("app:*::0:99999:7:::\n"));
}

#[test]
fn docker_save_archives_import_too() {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(&dir.path().join("images")).unwrap();
    let archive = write_archive(dir.path(), &docker_archive(&[base(), top()]));
    let imported = import(&store, &archive, "docker-app", Limits::default()).unwrap();
    let root = &imported.image.root;
    assert_eq!(
        std::fs::read_to_string(root.join("opt/cache/b")).unwrap(),
        "b"
    );
    assert!(!root.join("opt/app/gone.txt").exists());
}

/// Imports `layers` and expects `check` of the error; nothing may be left in the store.
fn refused(layers: &[Vec<u8>], limits: Limits, check: impl Fn(&ImageError) -> bool) {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(&dir.path().join("images")).unwrap();
    let archive = write_archive(dir.path(), &oci_archive(layers, true));
    let err = import(&store, &archive, "bad", limits).unwrap_err();
    assert!(check(&err), "{err:?}");
    assert!(store.list().unwrap().is_empty());
    assert_eq!(tmp_entries(&store), 0, "a half image was left");
}

#[test]
fn traversal_and_absolute_paths_are_refused() {
    for path in [&b"../escaped"[..], b"opt/../../escaped", b"/etc/escaped"] {
        refused(
            &[base(), layer(&[E::RawFile(path)])],
            Limits::default(),
            |e| matches!(e, ImageError::Forbidden { .. }),
        );
    }
    assert!(!Path::new("/etc/escaped").exists());
}

#[test]
fn writing_through_a_symlink_is_refused() {
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().to_str().unwrap();
    // The link in one layer, the write in the next; and both in one layer.
    let link = layer(&[E::Symlink("esc", target)]);
    let write = layer(&[E::File("esc/pwned", b"x", 0o644)]);
    refused(
        &[base(), link.clone(), write],
        Limits::default(),
        |e| matches!(e, ImageError::Forbidden { why, .. } if why.contains("symlink")),
    );
    let both = layer(&[E::Symlink("esc", target), E::File("esc/pwned", b"x", 0o644)]);
    refused(&[both], Limits::default(), |e| {
        matches!(e, ImageError::Forbidden { .. })
    });
    // A hard link cannot reach through one either.
    let hard = layer(&[E::Symlink("esc", target), E::Link("h", "esc/file")]);
    std::fs::write(outside.path().join("file"), b"secret").unwrap();
    refused(&[hard], Limits::default(), |e| {
        matches!(e, ImageError::Forbidden { .. })
    });
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
}

#[test]
fn tar_bombs_are_refused_before_unpacking() {
    // 64 MiB of zeros gzip to a few KiB.
    let zeros = vec![0u8; 64 << 20];
    let bomb = layer(&[E::File("zeros", &zeros, 0o644)]);
    let limits = Limits {
        max_bytes: 16 << 20,
        max_entries: 1000,
    };
    refused(&[bomb], limits, |e| matches!(e, ImageError::TooLarge(_)));
    let names: Vec<String> = (0..2000).map(|n| format!("f{n}")).collect();
    let many: Vec<E<'_>> = names.iter().map(|n| E::File(n, b"", 0o644)).collect();
    refused(&[layer(&many)], limits, |e| {
        matches!(e, ImageError::TooLarge(_))
    });
}

#[test]
fn a_layer_that_is_not_what_the_config_says_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(&dir.path().join("images")).unwrap();
    let mut bytes = oci_archive(&[base()], false);
    // Swap a byte of the file content inside the (uncompressed) layer blob.
    let at = bytes.windows(4).position(|w| w == b"echo").unwrap();
    bytes[at] = b'E';
    let archive = write_archive(dir.path(), &bytes);
    let err = import(&store, &archive, "bad", Limits::default()).unwrap_err();
    assert!(
        matches!(err, ImageError::InvalidArchive(ref w) if w.contains("hashes")),
        "{err}"
    );
    let err = import(
        &store,
        &write_archive(dir.path(), b"not a tar"),
        "bad",
        Limits::default(),
    )
    .unwrap_err();
    assert!(matches!(err, ImageError::InvalidArchive(_)), "{err}");
}

#[test]
fn root_directories_that_are_links_are_replaced_not_followed() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("keep"), b"k").unwrap();
    let target = outside.path().to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(&dir.path().join("images")).unwrap();
    let links = layer(&[
        E::Symlink("etc", target),
        E::Symlink("dev", target),
        E::Dir("var"),
        E::Symlink("var/log", target),
        E::File("tmp", b"not a dir", 0o644),
    ]);
    let archive = write_archive(dir.path(), &oci_archive(&[links], true));
    let imported = import(&store, &archive, "links", Limits::default()).unwrap();
    let root = &imported.image.root;
    for d in ["etc", "dev", "var/log", "tmp"] {
        assert!(
            std::fs::symlink_metadata(root.join(d)).unwrap().is_dir(),
            "{d}"
        );
    }
    let left: Vec<_> = std::fs::read_dir(outside.path()).unwrap().collect();
    assert_eq!(left.len(), 1, "sanitizing followed a link out of the tree");
    assert!(imported
        .image
        .manifest
        .build_log
        .contains("/etc was no directory"));
}

#[test]
fn interpreters_are_looked_for_inside_the_tree_never_through_the_host() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("bash"), b"the host's").unwrap();
    let target = outside.path().to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(&dir.path().join("images")).unwrap();
    let tree = layer(&[
        E::Symlink("bin", target),
        E::Dir("usr"),
        E::Dir("usr/bin"),
        E::Dir("opt"),
        E::File("opt/python3", b"elf", 0o755),
        E::Symlink("usr/bin/python3", "/opt/python3"),
        E::Symlink("usr/bin/node", "/opt/no-node"),
    ]);
    let archive = write_archive(dir.path(), &oci_archive(&[tree], true));
    let imported = import(&store, &archive, "probe", Limits::default()).unwrap();
    let names: Vec<_> = imported
        .image
        .manifest
        .languages
        .iter()
        .map(|l| l.name.as_str())
        .collect();
    // /bin/bash is the host's file through an absolute link; /usr/bin/node dangles.
    assert_eq!(names, ["python"]);
}
