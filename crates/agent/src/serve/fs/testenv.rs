//! The sandbox root the module's tests run against.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use koder_agent_protocol::{AgentError, Entry, ErrorCode, WriteFileRequest};

use super::Fs;

/// A sandbox root with `/workspace` and `/etc/passwd`, plus a separate "host" directory
/// outside it holding a distinctive secret file.
pub(super) struct Env {
    pub(super) root: tempfile::TempDir,
    pub(super) host: tempfile::TempDir,
    pub(super) fs: Fs,
}

pub(super) const SANDBOX_PASSWD: &[u8] = b"sandbox-passwd\n";
pub(super) const HOST_SECRET: &[u8] = b"HOST-SECRET-do-not-leak\n";

impl Env {
    pub(super) fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let host = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("workspace")).unwrap();
        std::fs::create_dir(root.path().join("etc")).unwrap();
        std::fs::write(root.path().join("etc/passwd"), SANDBOX_PASSWD).unwrap();
        std::fs::write(host.path().join("secret"), HOST_SECRET).unwrap();
        std::fs::create_dir(host.path().join("dir")).unwrap();
        std::fs::write(host.path().join("dir/keep"), b"keep").unwrap();
        let fs = Fs::new(root.path(), "/workspace").unwrap();
        Env { root, host, fs }
    }

    /// Host path of an in-sandbox path.
    pub(super) fn p(&self, sandbox_path: &str) -> PathBuf {
        self.root.path().join(sandbox_path.trim_start_matches('/'))
    }

    pub(super) fn host_secret(&self) -> PathBuf {
        self.host.path().join("secret")
    }

    pub(super) fn read(&self, path: &str) -> Result<Vec<u8>, AgentError> {
        let mut file = self.fs.open_read(path, None)?;
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut file, &mut buf).unwrap();
        Ok(buf)
    }

    pub(super) fn write(&self, path: &str, data: &[u8]) -> Result<Entry, AgentError> {
        let mut w = self.fs.begin_write(&req(path))?;
        w.write(data)?;
        w.commit()
    }

    pub(super) fn assert_host_intact(&self) {
        assert_eq!(std::fs::read(self.host_secret()).unwrap(), HOST_SECRET);
        assert_eq!(
            std::fs::read(self.host.path().join("dir/keep")).unwrap(),
            b"keep"
        );
    }

    /// Names in a host directory.
    pub(super) fn names(&self, sandbox_dir: &str) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.p(sandbox_dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

pub(super) fn req(path: &str) -> WriteFileRequest {
    WriteFileRequest {
        path: path.to_owned(),
        mode: None,
        create_parents: false,
        max_bytes: None,
        owner: None,
        metadata: Vec::new(),
    }
}

pub(super) fn code<T: std::fmt::Debug>(result: Result<T, AgentError>) -> ErrorCode {
    match result {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.code,
    }
}

pub(super) fn mode_of(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}
