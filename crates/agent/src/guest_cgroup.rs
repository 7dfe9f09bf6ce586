//! The cgroup-v2 group of a microVM guest's sandbox processes, as the agent drives it while
//! serving (limits, usage, freeze). Created at boot (`boot::guest`), driven by `serve::server`:
//! a leaf so neither phase depends on the other.

use std::os::fd::OwnedFd;
use std::path::Path;

use koder_agent_protocol::{AgentError, ErrorCode, GuestLimits, GuestUsage};

use crate::setup_error::{SetupError, Step};

/// The cgroup-v2 group every sandbox process runs in, driven through descriptors opened at boot:
/// once Landlock is in force the agent could not open the cgroup files again (and must not be
/// able to: its children inherit its domain).
pub struct SandboxCgroup {
    memory_max: OwnedFd,
    pids_max: OwnedFd,
    cpu_max: OwnedFd,
    memory_current: OwnedFd,
    memory_peak: OwnedFd,
    memory_events: OwnedFd,
    pids_current: OwnedFd,
    pids_events: OwnedFd,
    cpu_stat: OwnedFd,
    freeze: OwnedFd,
}

impl SandboxCgroup {
    /// Opens the control and counter files of the group at `dir`, and its `cgroup.procs` for
    /// the children to join through (`child::set_workload_cgroup`).
    pub(crate) fn open(dir: &Path) -> Result<(Self, OwnedFd), SetupError> {
        let open = |name: &str, write: bool| -> Result<OwnedFd, SetupError> {
            std::fs::OpenOptions::new()
                .read(!write)
                .write(write)
                .open(dir.join(name))
                .map(OwnedFd::from)
                .step(format!("open cgroup file {name}"))
        };
        let cg = SandboxCgroup {
            memory_max: open("memory.max", true)?,
            pids_max: open("pids.max", true)?,
            cpu_max: open("cpu.max", true)?,
            memory_current: open("memory.current", false)?,
            memory_peak: open("memory.peak", false)?,
            memory_events: open("memory.events", false)?,
            pids_current: open("pids.current", false)?,
            pids_events: open("pids.events", false)?,
            cpu_stat: open("cpu.stat", false)?,
            freeze: open("cgroup.freeze", true)?,
        };
        Ok((cg, open("cgroup.procs", true)?))
    }

    pub fn set_limits(&self, limits: &GuestLimits) -> Result<(), AgentError> {
        if let Some(bytes) = limits.memory_bytes {
            write_at(&self.memory_max, &bytes.to_string())?;
        }
        if let Some(pids) = limits.pids {
            write_at(&self.pids_max, &pids.to_string())?;
        }
        if let Some(millis) = limits.cpu_millis {
            // 100 ms period; quota in µs per period.
            let quota = u64::from(millis.max(1)) * 100;
            write_at(&self.cpu_max, &format!("{quota} 100000"))?;
        }
        Ok(())
    }

    pub fn freeze(&self, frozen: bool) -> Result<(), AgentError> {
        write_at(&self.freeze, if frozen { "1" } else { "0" })
    }

    pub fn usage(&self) -> Result<GuestUsage, AgentError> {
        let number = |fd: &OwnedFd| -> Result<u64, AgentError> {
            read_at(fd)?
                .trim()
                .parse()
                .map_err(|_| AgentError::new(ErrorCode::Io, "unreadable cgroup counter"))
        };
        Ok(GuestUsage {
            memory_current_bytes: number(&self.memory_current)?,
            memory_peak_bytes: number(&self.memory_peak)?,
            oom_kills: keyed(&read_at(&self.memory_events)?, "oom_kill"),
            cpu_usage_us: keyed(&read_at(&self.cpu_stat)?, "usage_usec"),
            pids_current: number(&self.pids_current)?,
            pids_max_hits: keyed(&read_at(&self.pids_events)?, "max"),
        })
    }
}

/// The value of `key` in a flat-keyed cgroup file (`key value` lines); 0 when absent.
fn keyed(text: &str, key: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

fn read_at(fd: &OwnedFd) -> Result<String, AgentError> {
    let mut buf = vec![0u8; 4096];
    let n = rustix::io::pread(fd, &mut buf, 0)
        .map_err(|e| AgentError::new(ErrorCode::Io, format!("read cgroup file: {e}")))?;
    buf.truncate(n);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

fn write_at(fd: &OwnedFd, value: &str) -> Result<(), AgentError> {
    rustix::io::pwrite(fd, value.as_bytes(), 0)
        .map(drop)
        .map_err(|e| AgentError::new(ErrorCode::Io, format!("write cgroup file: {e}")))
}

#[cfg(test)]
mod tests {
    use super::keyed;

    #[test]
    fn flat_keyed_files() {
        let events = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(keyed(events, "oom_kill"), 2);
        assert_eq!(keyed(events, "oom"), 3);
        assert_eq!(keyed(events, "max"), 12);
        assert_eq!(keyed(events, "missing"), 0);
        assert_eq!(keyed("usage_usec nonsense\n", "usage_usec"), 0);
    }
}
