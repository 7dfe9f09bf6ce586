use super::*;

fn manifest(name: &str, digest: &str) -> Manifest {
    Manifest {
        languages: vec![Language {
            name: "bash".into(),
            interpreter: "/bin/bash".into(),
            version: "5.2".into(),
        }],
        size_bytes: 3,
        build_log: "ok".into(),
        ..Manifest::new(name, digest, serde_json::json!({"pack": name}))
    }
}

fn digest(name: &str) -> String {
    digest_of(&name).unwrap()
}

/// Builds a one-file image `name` and points `name` at it.
fn put(store: &ImageStore, name: &str) -> StoredImage {
    let d = digest(name);
    let staging = store.staging(&d).unwrap();
    std::fs::create_dir_all(staging.rootfs().join("etc")).unwrap();
    std::fs::write(staging.rootfs().join("etc/marker"), name).unwrap();
    std::fs::write(staging.log_path(), "log").unwrap();
    staging.commit(&manifest(name, &d)).unwrap();
    store.set_name(name, &d).unwrap();
    store.get(name).unwrap()
}

#[test]
fn an_unfinished_image_is_never_listed_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path()).unwrap();
    let d = digest("x");
    {
        let staging = store.staging(&d).unwrap();
        std::fs::create_dir_all(staging.rootfs()).unwrap();
        assert!(store.list().unwrap().is_empty());
        assert!(matches!(store.get(&d), Err(ImageError::NotFound(_))));
    }
    assert!(store.list().unwrap().is_empty());
    assert_eq!(
        std::fs::read_dir(store.root().join(TMP)).unwrap().count(),
        0
    );
}

#[test]
fn what_a_killed_build_left_is_collected_and_unnamed_images_too() {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path()).unwrap();
    let kept = put(&store, "kept");
    // A build whose process died (kill -9): its pid is not running.
    let dead = store
        .root()
        .join(TMP)
        .join(format!("{}.{}.0", digest("dead"), u32::MAX - 1));
    std::fs::create_dir_all(dead.join("rootfs/usr")).unwrap();
    // A live build of this process stays.
    let live = store.staging(&digest("live")).unwrap();
    // An image no name points at any more.
    let unnamed = put(&store, "unnamed");
    std::fs::remove_file(store.root().join(NAMES).join("unnamed")).unwrap();
    // One a session or snapshot was made on, its name since moved or deleted.
    let recorded = put(&store, "recorded");
    std::fs::remove_file(store.root().join(NAMES).join("recorded")).unwrap();
    let keep = [recorded.manifest.digest.clone()].into_iter().collect();
    let removed = store.collect_garbage(&keep, DAY).unwrap();
    assert_eq!(removed.len(), 2, "{removed:?}");
    assert!(!dead.exists());
    assert!(live.dir.exists());
    assert!(store.by_digest(&unnamed.manifest.digest).unwrap().is_none());
    let still = store.get(&recorded.manifest.digest).unwrap();
    assert!(still.names.is_empty() && still.root.is_dir());
    // Once nothing records it, it goes too.
    let removed = store.collect_garbage(&HashSet::new(), DAY).unwrap();
    assert_eq!(removed, std::slice::from_ref(&recorded.manifest.digest));
    assert_eq!(store.get("kept").unwrap(), kept);
}

const DAY: std::time::Duration = std::time::Duration::from_secs(86_400);

/// A cached build step `name` (unnamed), last used `ago`.
fn step(store: &ImageStore, name: &str, ago: std::time::Duration) -> String {
    let d = digest(name);
    let staging = store.staging(&d).unwrap();
    std::fs::create_dir_all(staging.rootfs()).unwrap();
    let step = Manifest::new(name, &d, serde_json::json!({"kind": STEP_KIND}));
    staging.commit(&step).unwrap();
    std::fs::File::open(store.root().join(&d).join(MANIFEST))
        .unwrap()
        .set_modified(std::time::SystemTime::now() - ago)
        .unwrap();
    d
}

#[test]
fn cached_steps_are_kept_while_builds_use_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path()).unwrap();
    let named = put(&store, "named");
    std::fs::File::open(store.root().join(&named.manifest.digest).join(MANIFEST))
        .unwrap()
        .set_modified(std::time::SystemTime::now() - 10 * DAY)
        .unwrap();
    let fresh = step(&store, "fresh", DAY / 2);
    let stale = step(&store, "stale", 2 * DAY);
    let found = step(&store, "found", 2 * DAY);
    store
        .mark_used(&store.by_digest(&found).unwrap().unwrap())
        .unwrap();
    let removed = store.collect_garbage(&HashSet::new(), DAY).unwrap();
    assert_eq!(removed, [stale]);
    for kept in [&fresh, &found, &named.manifest.digest] {
        assert!(store.by_digest(kept).unwrap().is_some());
    }
}

#[test]
fn names_tags_and_delete() {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path()).unwrap();
    let py = put(&store, "python");
    store.set_name("python:3.11", &py.manifest.digest).unwrap();
    let other = put(&store, "bash");
    let got = store.get("python:3.11").unwrap();
    assert_eq!(got.names, ["python", "python:3.11"]);
    assert_eq!(
        got.root,
        store.root().join(&py.manifest.digest).join("rootfs")
    );
    assert_eq!(store.get(&py.manifest.digest).unwrap().names, got.names);
    let listed: Vec<_> = store.list().unwrap().into_iter().map(|i| i.names).collect();
    assert_eq!(listed, [vec!["bash".to_string()], got.names.clone()]);
    // A name moves to another image atomically.
    store
        .set_name("python:3.11", &other.manifest.digest)
        .unwrap();
    assert_eq!(store.get("python:3.11").unwrap().manifest.name, "bash");
    let deleted = store.delete("bash").unwrap();
    assert_eq!(deleted.names, ["bash", "python:3.11"]);
    assert!(matches!(
        store.get("python:3.11"),
        Err(ImageError::NotFound(_))
    ));
    assert!(!store.root().join(&other.manifest.digest).exists());
    assert_eq!(store.get("python").unwrap().names, ["python"]);
    assert!(matches!(store.delete("bash"), Err(ImageError::NotFound(_))));
    assert!(matches!(
        store.set_name("ghost", &digest("none")),
        Err(ImageError::NotFound(_))
    ));
}

#[test]
fn hostile_references_touch_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path()).unwrap();
    put(&store, "python");
    std::fs::write(dir.path().join("secret"), "s").unwrap();
    for bad in [
        "",
        "..",
        "../secret",
        "/etc/passwd",
        "names/python",
        "pÿthon",
        ".tmp",
    ] {
        assert!(
            matches!(store.get(bad), Err(ImageError::InvalidName(_))),
            "{bad:?}"
        );
        assert!(matches!(store.delete(bad), Err(ImageError::InvalidName(_))));
        assert!(store.set_name(bad, &digest("python")).is_err());
    }
    assert!(matches!(
        store.staging("../../x"),
        Err(ImageError::InvalidName(_))
    ));
    assert!(dir.path().join("secret").exists());
    assert_eq!(store.list().unwrap().len(), 1);
}

#[test]
fn a_name_pointing_outside_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path()).unwrap();
    symlink("../../..", store.root().join(NAMES).join("evil")).unwrap();
    assert!(matches!(store.get("evil"), Err(ImageError::NotFound(_))));
    assert!(store.list().unwrap().is_empty());
}

#[test]
fn a_second_build_of_a_digest_keeps_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path()).unwrap();
    let first = put(&store, "python");
    let again = store.staging(&first.manifest.digest).unwrap();
    std::fs::create_dir_all(again.rootfs()).unwrap();
    let mut m = manifest("python", &first.manifest.digest);
    m.build_log = "second".into();
    let kept = again.commit(&m).unwrap();
    assert_eq!(kept.manifest.build_log, "ok");
    assert_eq!(
        std::fs::read_dir(store.root().join(TMP)).unwrap().count(),
        0
    );
}

#[test]
fn link_from_shares_the_tree() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let cache = ImageStore::open(&dir.path().join("cache")).unwrap();
    let built = put(&cache, "python");
    symlink("marker", built.root.join("etc/link")).unwrap();
    let data = ImageStore::open(&dir.path().join("data")).unwrap();
    let linked = data.link_from(&cache, "python").unwrap();
    assert_eq!(linked.manifest, built.manifest);
    assert_eq!(linked.names, ["python"]);
    let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
    assert_eq!(
        ino(&linked.root.join("etc/marker")),
        ino(&built.root.join("etc/marker"))
    );
    assert_eq!(
        std::fs::read_link(linked.root.join("etc/link")).unwrap(),
        Path::new("marker")
    );
    // Again: nothing to do.
    assert_eq!(data.link_from(&cache, "python").unwrap(), linked);
    assert!(matches!(
        data.link_from(&cache, "node"),
        Err(ImageError::NotFound(_))
    ));
}

#[test]
fn derived_files_appear_whole_stay_first_and_go_with_their_image() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let cache = ImageStore::open(&dir.path().join("cache")).unwrap();
    let image = put(&cache, "python");
    let install = |content: &str, name: &str| {
        let scratch = cache.scratch("disk");
        std::fs::write(scratch.path(), content).unwrap();
        cache
            .install_derived(&image, name, scratch.path(), "disk-v")
            .unwrap()
    };
    let first = install("first", "disk-v1");
    assert_eq!(first, image.derived("disk-v1"));
    // A second builder of the same file: the first copy stays, the scratch file goes.
    assert_eq!(install("second", "disk-v1"), first);
    assert_eq!(std::fs::read_to_string(&first).unwrap(), "first");
    assert_eq!(
        std::fs::read_dir(cache.root().join(TMP)).unwrap().count(),
        0
    );
    // A newer recipe of the file replaces the older one's.
    let newer = install("newer", "disk-v2");
    assert!(!first.exists() && newer.is_file());
    assert!(matches!(
        cache.install_derived(&image, "../escape", newer.as_path(), "x"),
        Err(ImageError::InvalidName(_))
    ));

    // Linked into another store with the image, as the same file.
    let data = ImageStore::open(&dir.path().join("data")).unwrap();
    let linked = data.link_from(&cache, "python").unwrap();
    let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
    assert_eq!(ino(&linked.derived("disk-v2")), ino(&newer));
    // Deleted with its image.
    cache.delete("python").unwrap();
    assert!(!newer.exists());
    assert!(linked.derived("disk-v2").is_file());
}
