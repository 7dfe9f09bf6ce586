//! Ending every sandbox process but the agent while the session stays: the way out of a fork
//! bomb that saturated the pids limit (every further exec fails with EAGAIN).
//!
//! The agent is PID 1 of its pid namespace (jail) or the kernel's init (microVM), so
//! `kill(-1, SIGKILL)` reaches every other process of the sandbox and never the agent. One sweep
//! can miss children forked while the kernel walks the task list, so it repeats until `/proc`
//! shows no live process besides the agent, within a bound.

use std::collections::HashSet;
use std::time::Duration;

use koder_agent_protocol::{AgentError, ErrorCode};

/// Sweeps before giving up; with [`PAUSE`] a few seconds, far above what a saturated pids
/// limit needs, and short enough that a daemon call never hangs on it.
const ROUNDS: usize = 300;
/// Lets the reaper collect the dead (and a dying parent's zombies reach it) between sweeps.
const PAUSE: Duration = Duration::from_millis(10);
/// `PF_KTHREAD` in `/proc/<pid>/stat`'s flags: a guest's kernel threads are not sandbox
/// processes and ignore signals anyway.
const PF_KTHREAD: u64 = 0x0020_0000;

/// SIGKILLs every process of the sandbox except the agent; returns how many it signalled.
pub async fn kill_all() -> Result<u32, AgentError> {
    if std::process::id() != 1 {
        // kill(-1) from anything but a namespace's init would reach processes outside it.
        return Err(AgentError::new(
            ErrorCode::InvalidRequest,
            "kill-all needs the agent to be the sandbox's init",
        ));
    }
    let mut signalled = HashSet::new();
    for _ in 0..ROUNDS {
        let live = live_processes()?;
        if live.is_empty() {
            return Ok(u32::try_from(signalled.len()).unwrap_or(u32::MAX));
        }
        signalled.extend(live);
        // SAFETY: kill takes plain integers; from init, -1 means every other process of its pid
        // namespace. ESRCH (nothing left) is fine: the next listing confirms it.
        unsafe {
            libc::kill(-1, libc::SIGKILL);
        }
        tokio::time::sleep(PAUSE).await;
    }
    Err(AgentError::new(
        ErrorCode::Io,
        format!(
            "processes survived {ROUNDS} SIGKILL sweeps: {:?}",
            live_processes()?
        ),
    ))
}

/// Pids in `/proc` that are neither the agent, nor dead (zombies awaiting the reaper), nor
/// kernel threads.
fn live_processes() -> Result<Vec<i32>, AgentError> {
    let dir = std::fs::read_dir("/proc")
        .map_err(|e| AgentError::new(ErrorCode::Io, format!("list /proc: {e}")))?;
    Ok(dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != 1)
        .filter(|pid| {
            // A process that vanished between listing and reading is gone, not live.
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| is_live_user(&s))
        })
        .collect())
}

/// Whether a `/proc/<pid>/stat` line is a live user-space process.
fn is_live_user(stat: &str) -> bool {
    // The command name may hold spaces and parentheses; the fields after its last ')' are
    // state, ppid, pgrp, session, tty_nr, tpgid, flags, ...
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return false;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let dead = matches!(fields.first(), Some(&("Z" | "X" | "x")) | None);
    let kthread = fields
        .get(6)
        .and_then(|f| f.parse::<u64>().ok())
        .is_some_and(|flags| flags & PF_KTHREAD != 0);
    !dead && !kthread
}

#[cfg(test)]
mod tests {
    use super::is_live_user;

    #[test]
    fn stat_lines_are_classified() {
        let user = "42 (bash) S 1 42 42 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0";
        assert!(is_live_user(user));
        let tricky = "43 (a) Z (b)) R 1 43 43 0 -1 4194560 1 0";
        assert!(is_live_user(tricky), "only the last ')' ends the name");
        assert!(!is_live_user("44 (sh) Z 1 44 44 0 -1 4194564 0"));
        assert!(!is_live_user("2 (kthreadd) S 0 0 0 0 -1 2129984 0"));
        assert!(!is_live_user("garbage"));
    }
}
