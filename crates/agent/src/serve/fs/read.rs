//! Reading: `stat` and opening regular files for download.

use std::fs::File;
use std::os::fd::AsFd;

use koder_agent_protocol::{AgentError, Entry, ErrorCode};
use rustix::fs::{self as rfs, FileType, OFlags, Statx};

use super::entry::{fd_statx, file_type};
use super::error::{errno_err, invalid, is_a_directory, shown};
use super::Fs;

impl Fs {
    /// Entry of `path`, with lstat semantics for the final component: a symlink reports kind
    /// `Symlink` and its target, it is not followed.
    pub fn stat(&self, path: &str) -> Result<Entry, AgentError> {
        let abs = self.normalize(path)?;
        self.lstat_abs("stat", &abs)
    }

    /// Opens a regular file for reading (symlinks followed, inside the root).
    /// `IsADirectory` for directories, `InvalidPath` for devices, fifos and sockets (which are
    /// never opened for reading, so a fifo cannot block the agent), `TooLarge` when the file is
    /// bigger than `max_bytes`.
    pub fn open_read(&self, path: &str, max_bytes: Option<u64>) -> Result<File, AgentError> {
        const OP: &str = "read";
        let abs = self.normalize(path)?;
        // Look through an O_PATH descriptor first: that never opens the object itself.
        let probe = self
            .open_in_root(&abs, OFlags::PATH)
            .map_err(|e| errno_err(OP, &abs, e))?;
        let st = fd_statx(probe.as_fd()).map_err(|e| errno_err(OP, &abs, e))?;
        check_readable(&st, &abs, max_bytes)?;
        drop(probe);
        // The object may have been swapped since: open non-blocking and check again.
        let fd = self
            .open_in_root(&abs, OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY)
            .map_err(|e| errno_err(OP, &abs, e))?;
        let st = fd_statx(fd.as_fd()).map_err(|e| errno_err(OP, &abs, e))?;
        check_readable(&st, &abs, max_bytes)?;
        let flags = rfs::fcntl_getfl(&fd).map_err(|e| errno_err(OP, &abs, e))?;
        rfs::fcntl_setfl(&fd, flags.difference(OFlags::NONBLOCK))
            .map_err(|e| errno_err(OP, &abs, e))?;
        Ok(File::from(fd))
    }
}

/// Refuses what `open_read` must not hand out.
fn check_readable(st: &Statx, abs: &str, max_bytes: Option<u64>) -> Result<(), AgentError> {
    match file_type(st) {
        FileType::RegularFile => {}
        FileType::Directory => return Err(is_a_directory("read", abs)),
        _ => return Err(invalid("read", abs, "not a regular file")),
    }
    match max_bytes {
        Some(max) if st.stx_size > max => Err(AgentError::new(
            ErrorCode::TooLarge,
            format!(
                "read {}: {} bytes, more than the limit of {max}",
                shown(abs),
                st.stx_size
            ),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;
    use std::time::Duration;

    use koder_agent_protocol::{EntryKind, ErrorCode};
    use rustix::fs::{self as rfs, FileType, Mode, OFlags};

    use super::super::testenv::{code, mode_of, Env, SANDBOX_PASSWD};

    #[test]
    fn open_read_checks_type_and_size() {
        let env = Env::new();
        std::fs::write(env.p("/workspace/f"), vec![7u8; 100]).unwrap();
        assert_eq!(
            code(env.fs.open_read("/workspace/f", Some(99))),
            ErrorCode::TooLarge
        );
        assert_eq!(
            env.fs
                .open_read("/workspace/f", Some(100))
                .unwrap()
                .metadata()
                .unwrap()
                .len(),
            100
        );
        assert_eq!(
            code(env.fs.open_read("/workspace", None)),
            ErrorCode::IsADirectory
        );
        assert_eq!(code(env.fs.open_read("/", None)), ErrorCode::IsADirectory);
        assert_eq!(
            code(env.fs.open_read("/workspace/none", None)),
            ErrorCode::NotFound
        );
        symlink("f", env.p("/workspace/l")).unwrap();
        assert_eq!(env.read("/workspace/l").unwrap().len(), 100);
        let _listener = std::os::unix::net::UnixListener::bind(env.p("/workspace/sock")).unwrap();
        assert_eq!(
            code(env.fs.open_read("/workspace/sock", None)),
            ErrorCode::InvalidPath
        );
        // The returned file is blocking again.
        let file = env.fs.open_read("/workspace/f", None).unwrap();
        let flags = rfs::fcntl_getfl(&file).unwrap();
        assert!(!flags.contains(OFlags::NONBLOCK));
    }

    #[test]
    fn open_read_fifo_does_not_block() {
        let env = Env::new();
        rfs::mknodat(
            rfs::CWD,
            env.p("/workspace/fifo"),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let fs = env.fs;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(fs.open_read("/workspace/fifo", None).map(|_| ()));
        });
        let result = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("open_read blocked on a fifo");
        assert_eq!(code(result), ErrorCode::InvalidPath);
    }

    #[test]
    fn stat_root_and_dot_components() {
        let env = Env::new();
        let e = env.fs.stat("/").unwrap();
        assert_eq!(
            (e.name.as_str(), e.path.as_str(), e.kind),
            ("/", "/", EntryKind::Dir)
        );
        let e = env.fs.stat("/workspace/x/..").unwrap();
        assert_eq!(e.path, "/workspace");
        assert_eq!(e.name, "workspace");
        let e = env.fs.stat(".").unwrap();
        assert_eq!(e.path, "/workspace");
        let e = env.fs.stat("/etc/./passwd/").unwrap();
        assert_eq!(e.size, SANDBOX_PASSWD.len() as u64);
        assert_eq!(e.mode, mode_of(&env.p("/etc/passwd")));
    }
}
