//! Capture stays inside its tree and refuses over-limit trees before reading them.

mod common;

use std::fs;
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::time::Instant;

use common::*;
use koder_layer::{LayerError, Limits};

#[test]
fn symlinks_are_recorded_never_followed() {
    let src = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/etc", src.path().join("link")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", src.path().join("file-link")).unwrap();
    fs::create_dir(src.path().join("d")).unwrap();
    std::os::unix::fs::symlink("../../..", src.path().join("d/up")).unwrap();
    let (archive, stats) = capture(src.path(), &ROOMY).unwrap();
    assert_eq!(stats.entries, 4);
    assert_eq!(stats.bytes, 0);
    let mut seen = Vec::new();
    for entry in tar::Archive::new(&archive[..]).entries().unwrap() {
        let entry = entry.unwrap();
        let path = entry.path_bytes().into_owned();
        let target = entry.link_name_bytes().map(|t| t.into_owned());
        assert_eq!(entry.size(), 0, "no content read through a symlink");
        seen.push((path, entry.header().entry_type(), target));
    }
    use tar::EntryType::*;
    let want: Vec<(Vec<u8>, tar::EntryType, Option<Vec<u8>>)> = vec![
        (b"d".to_vec(), Directory, None),
        (b"d/up".to_vec(), Symlink, Some(b"../../..".to_vec())),
        (
            b"file-link".to_vec(),
            Symlink,
            Some(b"/etc/passwd".to_vec()),
        ),
        (b"link".to_vec(), Symlink, Some(b"/etc".to_vec())),
    ];
    assert_eq!(seen, want);
}

/// Counts what reaches it, so a test can prove nothing was streamed.
struct Counting(u64);

impl Write for Counting {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn over_limit_is_refused_from_the_size_before_reading() {
    let src = tempfile::tempdir().unwrap();
    fs::write(src.path().join("a-small"), b"small").unwrap();
    fs::File::create(src.path().join("b-sparse"))
        .unwrap()
        .set_len(10 << 30)
        .unwrap();
    let limits = Limits {
        max_bytes: 100 << 20,
        max_entries: 100,
    };
    let mut out = Counting(0);
    let start = Instant::now();
    let err = koder_layer::capture(open_dir(src.path()).as_fd(), &mut out, &limits).unwrap_err();
    assert!(
        matches!(err, LayerError::TooLarge { .. }) && err.is_quota(),
        "{err:?}"
    );
    assert!(out.0 < 1 << 20, "{} bytes written", out.0);
    eprintln!("refused after {:?}", start.elapsed());

    let limits = Limits {
        max_bytes: 1 << 40,
        max_entries: 1,
    };
    let err = koder_layer::capture(open_dir(src.path()).as_fd(), io::sink(), &limits).unwrap_err();
    assert!(
        matches!(err, LayerError::TooManyEntries { limit: 1 }),
        "{err:?}"
    );
}

#[test]
fn capture_speed_of_100_mib() {
    let src = tempfile::tempdir().unwrap();
    let block: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8 + 1).collect();
    for i in 0..100 {
        fs::write(src.path().join(format!("f{i:03}")), &block).unwrap();
    }
    let start = Instant::now();
    let mut out = Counting(0);
    let stats = koder_layer::capture(open_dir(src.path()).as_fd(), &mut out, &ROOMY).unwrap();
    let took = start.elapsed();
    assert_eq!(stats.bytes, 100 << 20);
    assert!(out.0 > 100 << 20);
    println!(
        "captured 100 MiB in {took:?} ({:.0} MiB/s)",
        100.0 / took.as_secs_f64()
    );
}
