//! File metadata as `user.e2b.*` extended attributes ([`koder_agent_protocol::metadata`]).
//!
//! Read through an `O_PATH` descriptor, never a path: `/proc/self/fd/N` names exactly the
//! inode the descriptor holds (no second lookup a sandbox process could race), and nothing is
//! opened for reading (no inotify event, no lease to break, no FIFO to block on). Everything
//! read is bounded: the name list by the kernel's own 64 KiB, each value by the metadata budget.

use std::fs::File;
use std::os::fd::{AsRawFd, BorrowedFd};

use koder_agent_protocol::metadata::{self, XATTR_PREFIX};
use rustix::fs::{self as rfs, XattrFlags};
use rustix::io::Errno;

/// The kernel's bound of a name list (`XATTR_LIST_MAX`).
const LIST_MAX: usize = 64 * 1024;

/// The metadata of the file or directory `fd` (an `O_PATH` descriptor) holds; empty when it has
/// none or its xattrs cannot be read (a filesystem without them is a file without metadata).
pub(super) fn read(fd: BorrowedFd<'_>) -> Vec<(String, String)> {
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let mut names = vec![0u8; LIST_MAX];
    let Ok(len) = rfs::listxattr(path.as_str(), &mut names[..]) else {
        return Vec::new();
    };
    let ours = names[..len.min(LIST_MAX)]
        .split(|b| *b == 0)
        .filter(|n| n.starts_with(XATTR_PREFIX.as_bytes()));
    let mut value = vec![0u8; metadata::MAX_TOTAL_BYTES];
    let raw: Vec<(Vec<u8>, Vec<u8>)> = ours
        .filter_map(|name| {
            // A value over the budget (ERANGE) could never be kept: skipped like any other.
            let n = rfs::getxattr(path.as_str(), name, &mut value[..]).ok()?;
            Some((name.to_vec(), value[..n].to_vec()))
        })
        .collect();
    metadata::collect(raw)
}

/// Sets `pairs` (already checked) on a file the agent just created and holds open.
pub(super) fn write(file: &File, pairs: &[(String, String)]) -> Result<(), Errno> {
    for (key, value) in pairs {
        let name = format!("{XATTR_PREFIX}{key}");
        rfs::fsetxattr(file, name.as_str(), value.as_bytes(), XattrFlags::empty())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use koder_agent_protocol::{ErrorCode, Frame, FrameCodec, FromAgent, ToAgent};
    use tokio_util::codec::Encoder;

    use super::super::testenv::{code, req, Env};

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn set(env: &Env, path: &str, name: &str, value: &[u8]) {
        rustix::fs::setxattr(
            env.p(path).as_path(),
            name,
            value,
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
    }

    fn write_with(env: &Env, path: &str, meta: &[(&str, &str)]) -> koder_agent_protocol::Entry {
        let mut r = req(path);
        r.metadata = pairs(meta);
        let mut w = env.fs.begin_write(&r).unwrap();
        w.write(b"content").unwrap();
        w.commit().unwrap()
    }

    #[test]
    fn metadata_is_set_on_write_and_seen_everywhere() {
        let env = Env::new();
        let meta = [("author", "mish"), ("purpose", "upload")];
        let e = write_with(&env, "/workspace/f", &meta);
        assert_eq!(e.metadata, pairs(&meta));
        assert_eq!(env.fs.stat("/workspace/f").unwrap().metadata, pairs(&meta));
        let (entries, _) = env.fs.list("/workspace", 1).unwrap();
        assert_eq!(entries[0].metadata, pairs(&meta));
        let moved = env.fs.rename("/workspace/f", "/workspace/g").unwrap();
        assert_eq!(moved.metadata, pairs(&meta));
        // An overwrite is a new file: without metadata it has none.
        assert!(env
            .write("/workspace/g", b"second")
            .unwrap()
            .metadata
            .is_empty());
        assert!(env.fs.stat("/workspace/g").unwrap().metadata.is_empty());
        // With other metadata, only that.
        let e = write_with(&env, "/workspace/g", &[("stage", "2")]);
        assert_eq!(e.metadata, pairs(&[("stage", "2")]));
    }

    #[test]
    fn invalid_metadata_is_refused_before_anything_is_created() {
        let env = Env::new();
        for bad in [
            vec![("", "v")],
            vec![("k", "bad\n")],
            vec![("k", "1"), ("k", "2")],
        ] {
            let mut r = req("/workspace/never");
            r.metadata = pairs(&bad);
            assert_eq!(code(env.fs.begin_write(&r)), ErrorCode::InvalidRequest);
        }
        assert!(env.names("/workspace").is_empty());
    }

    #[test]
    fn what_the_sandbox_sets_is_filtered() {
        let env = Env::new();
        env.write("/workspace/f", b"x").unwrap();
        set(&env, "/workspace/f", "user.e2b.author", b"mish");
        set(&env, "/workspace/f", "user.other", b"not metadata");
        set(&env, "/workspace/f", "user.e2b.binary", b"\x00\xff");
        set(&env, "/workspace/f", "user.e2b.line", b"a\nb");
        assert_eq!(
            env.fs.stat("/workspace/f").unwrap().metadata,
            pairs(&[("author", "mish")])
        );
        // Directories carry metadata too; symlinks cannot, and are never followed for it.
        std::fs::create_dir(env.p("/workspace/d")).unwrap();
        set(&env, "/workspace/d", "user.e2b.tag", b"dir");
        assert_eq!(
            env.fs.stat("/workspace/d").unwrap().metadata,
            pairs(&[("tag", "dir")])
        );
        symlink("f", env.p("/workspace/link")).unwrap();
        assert!(env.fs.stat("/workspace/link").unwrap().metadata.is_empty());
        set(&env, "/", "user.e2b.root", b"yes");
        assert_eq!(
            env.fs.stat("/").unwrap().metadata,
            pairs(&[("root", "yes")])
        );
    }

    #[test]
    fn a_listing_full_of_metadata_still_fits_one_frame() {
        let env = Env::new();
        let dir = env.p("/workspace/many");
        std::fs::create_dir(&dir).unwrap();
        let value = vec![b'v'; 1000];
        for i in 0..1500 {
            let name = format!("{:0>200}", i);
            let path = dir.join(&name);
            std::fs::write(&path, b"").unwrap();
            for k in 0..3 {
                let key = format!("user.e2b.k{k}");
                rustix::fs::setxattr(
                    path.as_path(),
                    key.as_str(),
                    &value,
                    rustix::fs::XattrFlags::empty(),
                )
                .unwrap();
            }
        }
        let (entries, truncated) = env.fs.list("/workspace/many", 1).unwrap();
        assert!(truncated);
        assert!(entries.len() > 100, "{}", entries.len());
        assert!(entries.iter().all(|e| e.metadata.len() == 3));
        let frame = Frame {
            stream: 1,
            msg: FromAgent::Entries { entries, truncated },
        };
        let mut codec = FrameCodec::<ToAgent, FromAgent>::default();
        let mut buf = bytes::BytesMut::new();
        codec.encode(frame, &mut buf).unwrap();
    }
}
