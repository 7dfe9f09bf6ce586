//! Processes a crashed daemon left running: their pids are recorded in a file next to their
//! state, and a later daemon kills them — but only once each pid is pinned with a pidfd and
//! still runs the expected executable, since a recorded pid may have been recycled by anyone's
//! process since.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use koder_runtime::RuntimeError;
use rustix::process::{Pid, PidfdFlags, Signal, WaitId, WaitIdOptions};
use tokio::io::unix::AsyncFd;

/// How long a killed process gets to disappear before the reaper moves on.
const EXIT_WAIT: Duration = Duration::from_secs(5);

/// Which executables a recorded process must be running to be killed.
#[derive(Debug, Clone)]
pub enum ExeMatch {
    /// Exactly this binary (compared after resolving symlinks).
    Path(PathBuf),
    /// Any binary whose file name starts with one of these (VMMs whose path is configurable).
    NamePrefix(Vec<String>),
}

impl ExeMatch {
    fn matches(&self, exe: &Path) -> bool {
        match self {
            ExeMatch::Path(bin) => {
                let bin = std::fs::canonicalize(bin).unwrap_or_else(|_| bin.clone());
                exe == bin
            }
            ExeMatch::NamePrefix(prefixes) => exe
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| prefixes.iter().any(|p| n.starts_with(p.as_str()))),
        }
    }
}

/// Writes `pids` to `file`, one per line, for [`kill_recorded`] after a crash.
pub fn record(file: &Path, pids: &[impl std::fmt::Display]) -> Result<(), RuntimeError> {
    let text: Vec<String> = pids.iter().map(|p| p.to_string()).collect();
    std::fs::write(file, text.join("\n")).map_err(RuntimeError::io(format!(
        "record pids in {}",
        file.display()
    )))
}

/// Kills every process recorded in `file` that still runs an executable `exe` accepts, and
/// waits (boundedly) until each is gone. Returns how many were killed; a missing file or a
/// process already gone counts as nothing to do.
pub async fn kill_recorded(file: &Path, exe: &ExeMatch) -> usize {
    let Ok(text) = std::fs::read_to_string(file) else {
        return 0;
    };
    let mut killed = 0;
    for pid in text.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        let Some(pidfd) = pidfd_if(pid, exe) else {
            continue;
        };
        if rustix::process::pidfd_send_signal(&pidfd, Signal::KILL).is_ok() {
            killed += 1;
            wait_exited(&pidfd, EXIT_WAIT).await;
            reap_if_child(&pidfd);
        }
    }
    killed
}

/// A pidfd for `pid` if it runs an executable `exe` accepts. The pidfd is opened first: from
/// then on the pid cannot be recycled under us, so the check is about the process we signal.
fn pidfd_if(pid: i32, exe: &ExeMatch) -> Option<OwnedFd> {
    let pid = Pid::from_raw(pid)?;
    let pidfd = rustix::process::pidfd_open(pid, PidfdFlags::empty()).ok()?;
    let link = std::fs::read_link(format!("/proc/{}/exe", pid.as_raw_nonzero())).ok()?;
    // A process started before its binary was replaced shows it as "... (deleted)".
    let link = link.to_string_lossy();
    let link = Path::new(link.trim_end_matches(" (deleted)"));
    exe.matches(link).then_some(pidfd)
}

/// Waits until the pidfd's process has exited (a pidfd turns readable then), at most `limit`.
pub async fn wait_exited(pidfd: &OwnedFd, limit: Duration) {
    let Ok(own) = pidfd.try_clone() else { return };
    // SAFETY: `own` is a duplicate owned by the AsyncFd; nothing else closes it.
    if let Ok(fd) = unsafe { AsyncFd::register(own) } {
        let _ = tokio::time::timeout(limit, fd.readable()).await;
    }
}

/// Reaps the process if it is this process's exited child (a start interrupted by shutdown):
/// an unreaped zombie keeps a cgroup-v1 group busy. For anyone else's process this is ECHILD.
pub fn reap_if_child(pidfd: &OwnedFd) -> bool {
    matches!(
        rustix::process::waitid(
            WaitId::PidFd(pidfd.as_fd()),
            WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
        ),
        Ok(Some(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Command};

    fn sleeper() -> Child {
        Command::new("sleep").arg("1000").spawn().unwrap()
    }

    fn exe_of(child: &Child) -> PathBuf {
        std::fs::read_link(format!("/proc/{}/exe", child.id())).unwrap()
    }

    #[tokio::test]
    async fn refuses_a_pid_running_another_executable() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("pids");
        let mut child = sleeper();
        record(&file, &[child.id()]).unwrap();
        let others = [
            ExeMatch::Path("/usr/bin/true".into()),
            ExeMatch::NamePrefix(vec!["qemu-system".into(), "firecracker".into()]),
        ];
        for other in &others {
            assert_eq!(kill_recorded(&file, other).await, 0, "{other:?}");
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "a foreign process was killed"
        );
        child.kill().unwrap();
        child.wait().unwrap();
    }

    // The reaper under test is what waits for these children.
    #[allow(clippy::zombie_processes)]
    #[tokio::test]
    async fn kills_and_reaps_a_recorded_process_by_path_or_name() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("pids");
        let (a, b) = (sleeper(), sleeper());
        let exe = exe_of(&a);
        let name = exe.file_name().unwrap().to_string_lossy().into_owned();
        // A line that is no pid is skipped.
        std::fs::write(&file, format!("{}\n{}\nnot-a-pid\n", a.id(), b.id())).unwrap();
        let pidfds: Vec<OwnedFd> = [&a, &b]
            .iter()
            .map(|c| {
                rustix::process::pidfd_open(
                    Pid::from_raw(c.id() as i32).unwrap(),
                    PidfdFlags::empty(),
                )
                .unwrap()
            })
            .collect();
        assert_eq!(
            kill_recorded(&file, &ExeMatch::NamePrefix(vec![name])).await,
            2
        );
        // Both were our children and are reaped: waitid on their pidfds finds nothing.
        for pidfd in &pidfds {
            assert!(!reap_if_child(pidfd));
        }
        let c = sleeper();
        record(&file, &[c.id()]).unwrap();
        assert_eq!(kill_recorded(&file, &ExeMatch::Path(exe)).await, 1);
        assert_eq!(
            kill_recorded(&tmp.path().join("missing"), &ExeMatch::Path("/x".into())).await,
            0
        );
    }
}
