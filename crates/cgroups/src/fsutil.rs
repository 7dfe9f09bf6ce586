//! Small helpers for talking to cgroupfs control files.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::libc;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use parking_lot::Mutex;

use crate::error::CgroupError;
use crate::ExecCounters;

type Result<T> = std::result::Result<T, CgroupError>;

pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(5);

pub(crate) fn read_string(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(|e| CgroupError::io("read", path, e))
}

pub(crate) fn parse_u64(path: &Path, text: &str) -> Result<u64> {
    let t = text.trim();
    t.parse::<u64>().map_err(|e| CgroupError::Parse {
        path: path.to_path_buf(),
        detail: format!("{t:?}: {e}"),
    })
}

pub(crate) fn read_u64(path: &Path) -> Result<u64> {
    parse_u64(path, &read_string(path)?)
}

/// Finds `key N` in a flat-keyed file (memory.events, cpu.stat, ...).
/// `Ok(None)` when the key is absent: older kernels lack some keys.
pub(crate) fn parse_keyed(path: &Path, text: &str, key: &str) -> Result<Option<u64>> {
    for line in text.lines() {
        let mut it = line.split_whitespace();
        if it.next() == Some(key) {
            let v = it.next().unwrap_or("");
            return parse_u64(path, v).map(Some);
        }
    }
    Ok(None)
}

pub(crate) fn read_keyed(path: &Path, key: &str) -> Result<Option<u64>> {
    parse_keyed(path, &read_string(path)?, key)
}

/// Same as `read_keyed` but a missing file also yields `None`, for files
/// that only exist on newer kernels or with optional kernel config.
pub(crate) fn read_keyed_opt(path: &Path, key: &str) -> Result<Option<u64>> {
    match fs::read_to_string(path) {
        Ok(text) => parse_keyed(path, &text, key),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(CgroupError::io("read", path, e)),
    }
}

/// Never creates the file: a missing control file means the controller or
/// feature is absent, and silently creating a regular file would hide that.
pub(crate) fn write_str(path: &Path, value: &str) -> Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .map_err(|e| CgroupError::io("open", path, e))?;
    // cgroupfs parses each write() on its own, so the value must go out in
    // one call; these values are tiny so write_all is a single write.
    f.write_all(value.as_bytes())
        .map_err(|e| CgroupError::io("write", path, e))
}

pub(crate) fn parse_pids(path: &Path, text: &str) -> Result<Vec<u32>> {
    text.split_whitespace()
        .map(|t| {
            t.parse::<u32>().map_err(|e| CgroupError::Parse {
                path: path.to_path_buf(),
                detail: format!("pid {t:?}: {e}"),
            })
        })
        .collect()
}

/// A vanished cgroup has no processes, which is what callers that are
/// tearing down want to hear.
pub(crate) fn read_pids_or_empty(path: &Path) -> Result<Vec<u32>> {
    match fs::read_to_string(path) {
        Ok(text) => parse_pids(path, &text),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(CgroupError::io("read", path, e)),
    }
}

pub(crate) fn check_pid(pid: u32) -> Result<i32> {
    // 0 would mean "the writer itself" to cgroup.procs and "our process
    // group" to kill(2); neither is ever what a caller means.
    match i32::try_from(pid) {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(CgroupError::InvalidPid(pid)),
    }
}

pub(crate) fn sigkill(pid: u32) -> Result<()> {
    let raw = check_pid(pid)?;
    match kill(Pid::from_raw(raw), Signal::SIGKILL) {
        Ok(()) | Err(Errno::ESRCH) => Ok(()),
        Err(source) => Err(CgroupError::Signal { pid, source }),
    }
}

/// Creates `path`; `Ok(false)` if it already existed.
pub(crate) fn mkdir(path: &Path) -> Result<bool> {
    match fs::create_dir(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(CgroupError::io("mkdir", path, e)),
    }
}

/// rmdir that treats "already gone" as success and retries EBUSY briefly:
/// the kernel can report a cgroup busy for a moment after its last task
/// exited.
pub(crate) fn rmdir(path: &Path, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    loop {
        match fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(nix::libc::EBUSY) && start.elapsed() < timeout => {
                thread::sleep(POLL_INTERVAL);
            }
            Err(e) => return Err(CgroupError::io("rmdir", path, e)),
        }
    }
}

/// Polls `cond` until it returns true or `timeout` elapses; returns whether
/// the condition was met. Always evaluates at least once.
pub(crate) fn poll_until(
    timeout: Duration,
    mut cond: impl FnMut() -> Result<bool>,
) -> Result<bool> {
    let start = Instant::now();
    loop {
        if cond()? {
            return Ok(true);
        }
        if start.elapsed() >= timeout {
            return Ok(false);
        }
        thread::sleep(POLL_INTERVAL);
    }
}

pub(crate) fn list_child_dirs(dir: &Path, out: &mut Vec<String>) -> Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        // No parent yet means no children yet.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(CgroupError::io("readdir", dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| CgroupError::io("readdir", dir, e))?;
        let ft = entry
            .file_type()
            .map_err(|e| CgroupError::io("stat", entry.path(), e))?;
        if !ft.is_dir() {
            continue;
        }
        if let Some(name) = entry.file_name().to_str() {
            // Skip directories someone else put here that we could never
            // have created; reconciliation must not act on them.
            if crate::validate_name(name).is_ok() {
                out.push(name.to_string());
            }
        }
    }
    Ok(())
}

/// Kill loop shared by v1 and by v2 kernels without `cgroup.kill`:
/// freeze, SIGKILL every member, thaw, until the group is empty or
/// `KILL_TIMEOUT` passes. `freeze` returns whether the group really froze;
/// we kill either way because a partial freeze is still better than none.
pub(crate) fn freeze_kill_loop(
    procs_path: &Path,
    pids: impl Fn() -> Result<Vec<u32>>,
    freeze: impl Fn() -> Result<bool>,
    thaw: impl Fn() -> Result<()>,
) -> Result<()> {
    let start = Instant::now();
    loop {
        if pids()?.is_empty() {
            return Ok(());
        }
        if start.elapsed() >= crate::KILL_TIMEOUT {
            return Err(CgroupError::Timeout {
                what: "all processes to exit",
                path: procs_path.to_path_buf(),
                waited: crate::KILL_TIMEOUT,
            });
        }
        // While frozen nothing can fork a new member, or exit and let its
        // pid be recycled, so the list we read is the list we signal.
        if !freeze()? {
            tracing::debug!(path = %procs_path.display(), "killing without a complete freeze");
        }
        let killed = pids().and_then(|p| p.into_iter().try_for_each(sigkill));
        // Frozen tasks only act on SIGKILL once thawed, so always thaw.
        let thawed = thaw();
        killed?;
        thawed?;
        thread::sleep(POLL_INTERVAL);
    }
}

/// Largest control file [`HeldFile`] reads: the flat-keyed files it serves are a few lines.
const HELD_READ_MAX: usize = 512;

/// A control file opened on first use and kept open, so each read is one `pread` at offset 0
/// (cgroupfs regenerates the content for every read from 0) instead of a path walk, an open,
/// a read and a close. For the counters read around every exec.
pub(crate) struct HeldFile {
    path: PathBuf,
    writable: bool,
    file: Mutex<Option<File>>,
}

impl HeldFile {
    pub(crate) fn read_only(path: PathBuf) -> Self {
        Self {
            path,
            writable: false,
            file: Mutex::new(None),
        }
    }

    /// Opened for reading and writing where the kernel allows writing (v2 `memory.peak` only
    /// takes writes since 6.12), else for reading alone; writes then fail.
    pub(crate) fn writable(path: PathBuf) -> Self {
        Self {
            writable: true,
            ..Self::read_only(path)
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    fn open(&self) -> io::Result<File> {
        let read_only = || File::open(&self.path);
        if !self.writable {
            return read_only();
        }
        match OpenOptions::new().read(true).write(true).open(&self.path) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => read_only(),
            other => other,
        }
    }

    /// Runs `f` on the open file; `Ok(None)` when the file does not exist (an older kernel,
    /// or a group that is gone), which is not remembered: a later call tries again.
    fn with_file<T>(&self, f: impl FnOnce(&File) -> Result<T>) -> Result<Option<T>> {
        let mut slot = self.file.lock();
        if slot.is_none() {
            match self.open() {
                Ok(file) => *slot = Some(file),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(CgroupError::io("open", &self.path, e)),
            }
        }
        match slot.as_ref() {
            Some(file) => f(file).map(Some),
            None => Ok(None),
        }
    }

    /// `parse` applied to the whole content; `Ok(None)` when the file does not exist.
    pub(crate) fn read<T>(
        &self,
        parse: impl FnOnce(&Path, &str) -> Result<T>,
    ) -> Result<Option<T>> {
        self.with_file(|file| {
            let mut buf = [0u8; HELD_READ_MAX];
            let n = rustix::io::pread(file, &mut buf[..], 0)
                .map_err(|e| CgroupError::io("read", &self.path, e.into()))?;
            if n == buf.len() {
                return Err(CgroupError::Parse {
                    path: self.path.clone(),
                    detail: format!("more than {HELD_READ_MAX} bytes"),
                });
            }
            let text = std::str::from_utf8(&buf[..n]).map_err(|e| CgroupError::Parse {
                path: self.path.clone(),
                detail: e.to_string(),
            })?;
            parse(&self.path, text)
        })
    }

    /// Like [`HeldFile::read`], for a file the kernel always has: a missing one is an error.
    pub(crate) fn read_present<T>(
        &self,
        parse: impl FnOnce(&Path, &str) -> Result<T>,
    ) -> Result<T> {
        self.read(parse)?.ok_or_else(|| self.missing())
    }

    /// One `pwrite` at offset 0 (cgroupfs takes each write on its own); `Ok(false)` when the
    /// file does not exist.
    pub(crate) fn write(&self, value: &[u8]) -> Result<bool> {
        let written = self.with_file(|file| {
            rustix::io::pwrite(file, value, 0)
                .map(drop)
                .map_err(|e| CgroupError::io("write", &self.path, e.into()))
        })?;
        Ok(written.is_some())
    }

    pub(crate) fn missing(&self) -> CgroupError {
        CgroupError::io("open", &self.path, io::ErrorKind::NotFound.into())
    }

    /// Closes the descriptor (the next use opens the file again).
    pub(crate) fn close(&self) {
        *self.file.lock() = None;
    }
}

/// The exec counters from the two files both versions keep open: the `oom_kill` key of the
/// memory group's events (`memory.oom_control` on v1, `memory.events` on v2; required) and the
/// `max` key of `pids.events` (absent on kernels older than the file: none counted).
pub(crate) fn exec_counters(oom_events: &HeldFile, pids_events: &HeldFile) -> Result<ExecCounters> {
    let oom_kills = oom_events.read_present(|path, text| parse_keyed(path, text, "oom_kill"))?;
    let pids_max_hits = pids_events.read(|path, text| parse_keyed(path, text, "max"))?;
    Ok(ExecCounters {
        oom_kills: oom_kills.unwrap_or(0),
        pids_max_hits: pids_max_hits.flatten().unwrap_or(0),
    })
}
