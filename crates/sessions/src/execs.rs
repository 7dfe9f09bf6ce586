//! Execs that are followed rather than awaited: background execs and streamed (SSE) ones.
//!
//! A task consumes the agent's event stream promptly into a byte-bounded replay buffer and a
//! broadcast channel, so a slow or absent follower never stalls the sandbox's agent connection:
//! the buffer keeps the most recent output (older output is dropped and the result flagged
//! truncated), and a follower that falls behind the channel is told how much it missed.
//!
//! This module holds the buffer and the registry; the manager's exec phase starts the exec and
//! runs the consuming task (it owns the resource meter).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use koder_agent_protocol::{self as proto, StreamHandle, ToAgent};
use koder_api_types::{ExecResult, ExecState, ExecStatus};
use parking_lot::Mutex;
use tokio::sync::broadcast;

use crate::manager::exec::SIGKILL;
use crate::Error;

/// Followed execs kept per session (running ones are always kept; the oldest finished go).
const MAX_KEPT: usize = 64;
/// Execs running at once per session through this registry.
const MAX_RUNNING: usize = 64;
/// Events a follower may lag before it is told it missed some.
const CHANNEL_EVENTS: usize = 256;
/// How long a SIGKILL's answer waits for the exec to end: the agent's group kill and its
/// output drain take milliseconds, seconds only on a host under heavy load.
pub const KILL_SETTLES: std::time::Duration = std::time::Duration::from_secs(2);

/// Waits, at most [`KILL_SETTLES`], until `events` (subscribed before the kill was sent)
/// carries an event `ends` says is the end, or closes. Past the bound the kill still went out;
/// the answer just stops waiting.
pub async fn until_ended<T: Clone>(mut events: broadcast::Receiver<T>, ends: impl Fn(&T) -> bool) {
    let ended = async {
        loop {
            match events.recv().await {
                Ok(e) if ends(&e) => break,
                Err(broadcast::error::RecvError::Closed) => break,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
            }
        }
    };
    let _ = tokio::time::timeout(KILL_SETTLES, ended).await;
}

#[derive(Debug, Clone)]
pub enum ExecEvent {
    Stdout(Bytes),
    Stderr(Bytes),
    /// The final result (its stdout/stderr hold the retained output).
    Exit(Box<ExecResult>),
}

/// What a new follower gets: everything retained so far, then live events (none once exited).
pub struct Follow {
    pub exec_id: String,
    pub replay: Vec<ExecEvent>,
    pub live: Option<broadcast::Receiver<ExecEvent>>,
    /// Cancels the exec if the follower goes away early (foreground streams only).
    pub cancel_on_drop: Option<CancelOnDrop>,
}

pub struct CancelOnDrop {
    exec: Arc<FollowedExec>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.exec.state.lock().result.is_none() {
            // Its end is the cancel's doing: a killed exec, not a process that chose SIGKILL.
            self.exec
                .killed
                .store(true, std::sync::atomic::Ordering::SeqCst);
            let handle = self.exec.handle.clone();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = handle.send(ToAgent::Cancel).await;
                });
            }
        }
    }
}

pub(crate) struct FollowedExec {
    id: String,
    command: Vec<String>,
    background: bool,
    started_at: DateTime<Utc>,
    /// Its process's pid in the sandbox: a followed exec exists once its process runs.
    pid: u32,
    handle: StreamHandle,
    state: Mutex<State>,
    events: broadcast::Sender<ExecEvent>,
    /// Set when the session's processes were all killed while this one ran, or its follower
    /// went away and cancelled it.
    killed: std::sync::atomic::AtomicBool,
}

struct State {
    retained: VecDeque<ExecEvent>,
    retained_bytes: usize,
    stdout_dropped: bool,
    stderr_dropped: bool,
    stdin_open: bool,
    result: Option<ExecResult>,
}

#[derive(Default)]
pub(crate) struct Registry {
    execs: Mutex<HashMap<String, Arc<FollowedExec>>>,
}

impl Registry {
    pub(crate) fn get(&self, exec_id: &str) -> Result<Arc<FollowedExec>, Error> {
        self.execs
            .lock()
            .get(exec_id)
            .cloned()
            .ok_or_else(|| Error::FileNotFound(format!("no exec {exec_id:?} in this session")))
    }

    /// Marks every running exec as killed on purpose, before its processes are.
    pub(crate) fn mark_running_killed(&self) {
        for e in self.execs.lock().values() {
            if e.state.lock().result.is_none() {
                e.killed.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
    }

    /// Makes room for one more: too many running is a conflict, old finished ones are dropped.
    pub(crate) fn admit(&self) -> Result<(), Error> {
        let mut execs = self.execs.lock();
        let running = execs
            .values()
            .filter(|e| e.state.lock().result.is_none())
            .count();
        if running >= MAX_RUNNING {
            return Err(Error::Conflict(format!(
                "at most {MAX_RUNNING} followed execs may run at once"
            )));
        }
        while execs.len() >= MAX_KEPT {
            let oldest = execs
                .values()
                .filter(|e| e.state.lock().result.is_some())
                .min_by_key(|e| e.started_at)
                .map(|e| e.id.clone());
            match oldest {
                Some(id) => execs.remove(&id),
                None => break,
            };
        }
        Ok(())
    }

    pub(crate) fn insert(&self, exec: Arc<FollowedExec>) {
        self.execs.lock().insert(exec.id.clone(), exec);
    }

    /// Every kept exec, oldest first.
    pub(crate) fn statuses(&self) -> Vec<ExecStatus> {
        let mut all: Vec<ExecStatus> = self.execs.lock().values().map(|e| e.status()).collect();
        all.sort_by_key(|s| s.started_at);
        all
    }
}

impl FollowedExec {
    /// A running exec of `command` (its process `pid`) on the agent stream behind `handle`,
    /// taking input while `stdin_open`.
    pub(crate) fn new(
        command: Vec<String>,
        background: bool,
        stdin_open: bool,
        pid: u32,
        handle: StreamHandle,
    ) -> Arc<Self> {
        let (events, _) = broadcast::channel(CHANNEL_EVENTS);
        Arc::new(FollowedExec {
            id: uuid::Uuid::new_v4().simple().to_string(),
            command,
            background,
            started_at: Utc::now(),
            pid,
            handle,
            state: Mutex::new(State {
                retained: VecDeque::new(),
                retained_bytes: 0,
                stdout_dropped: false,
                stderr_dropped: false,
                stdin_open,
                result: None,
            }),
            events,
            killed: Default::default(),
        })
    }

    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// Its process's pid in the sandbox.
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the session's processes were all killed while this exec ran, or it was cancelled.
    pub(crate) fn was_killed(&self) -> bool {
        self.killed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Writes to the exec's stdin; `close` closes it afterwards.
    pub(crate) async fn write_stdin(&self, data: Bytes, close: bool) -> Result<(), Error> {
        {
            let st = self.state.lock();
            if st.result.is_some() {
                return Err(Error::ExecExited);
            }
            if !st.stdin_open {
                return Err(Error::Conflict("stdin of this exec is closed".into()));
            }
        }
        for chunk in data.chunks(proto::CHUNK_BYTES) {
            self.handle.send(ToAgent::Stdin(chunk.to_vec())).await?;
        }
        if close {
            self.state.lock().stdin_open = false;
            self.handle.send(ToAgent::CloseStdin).await?;
        }
        Ok(())
    }

    /// Sends signal `number` to a running exec.
    ///
    /// A SIGKILL answers once the exec has ended (at most [`KILL_SETTLES`] later), so that a
    /// caller who killed a process never finds it still there: the agent reaps it, then reports.
    pub(crate) async fn signal(&self, number: i32) -> Result<(), Error> {
        let live = {
            let st = self.state.lock();
            if st.result.is_some() {
                return Err(Error::ExecExited);
            }
            self.events.subscribe()
        };
        self.handle.send(ToAgent::Signal(number)).await?;
        if number == SIGKILL {
            until_ended(live, |e| matches!(e, ExecEvent::Exit(_))).await;
        }
        Ok(())
    }

    pub(crate) fn status(&self) -> ExecStatus {
        let st = self.state.lock();
        ExecStatus {
            exec_id: self.id.clone(),
            command: self.command.clone(),
            background: self.background,
            state: if st.result.is_some() {
                ExecState::Exited
            } else {
                ExecState::Running
            },
            started_at: self.started_at,
            pid: Some(self.pid),
            result: st.result.clone(),
        }
    }

    /// Snapshot and subscription under one lock: nothing is missed or seen twice.
    pub(crate) fn follow(self: &Arc<Self>, cancel_on_drop: bool) -> Follow {
        let st = self.state.lock();
        let mut replay: Vec<ExecEvent> = st.retained.iter().cloned().collect();
        let live = match &st.result {
            Some(r) => {
                replay.push(ExecEvent::Exit(Box::new(without_output(r))));
                None
            }
            None => Some(self.events.subscribe()),
        };
        Follow {
            exec_id: self.id.clone(),
            replay,
            live,
            cancel_on_drop: cancel_on_drop.then(|| CancelOnDrop { exec: self.clone() }),
        }
    }

    pub(crate) fn record(&self, event: ExecEvent, limit: usize) {
        let mut st = self.state.lock();
        let len = match &event {
            ExecEvent::Stdout(b) | ExecEvent::Stderr(b) => b.len(),
            ExecEvent::Exit(_) => 0,
        };
        st.retained.push_back(event.clone());
        st.retained_bytes += len;
        while st.retained_bytes > limit {
            match st.retained.pop_front() {
                Some(ExecEvent::Stdout(b)) => {
                    st.retained_bytes -= b.len();
                    st.stdout_dropped = true;
                }
                Some(ExecEvent::Stderr(b)) => {
                    st.retained_bytes -= b.len();
                    st.stderr_dropped = true;
                }
                Some(ExecEvent::Exit(_)) | None => break,
            }
        }
        // No followers is fine: the buffer serves late ones.
        let _ = self.events.send(event);
    }

    pub(crate) fn finish(&self, mut result: ExecResult) {
        let mut st = self.state.lock();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        for e in &st.retained {
            match e {
                ExecEvent::Stdout(b) => out.extend_from_slice(b),
                ExecEvent::Stderr(b) => err.extend_from_slice(b),
                ExecEvent::Exit(_) => {}
            }
        }
        result.stdout = String::from_utf8_lossy(&out).into_owned();
        result.stderr = String::from_utf8_lossy(&err).into_owned();
        result.stdout_truncated |= st.stdout_dropped;
        result.stderr_truncated |= st.stderr_dropped;
        st.stdin_open = false;
        let _ = self
            .events
            .send(ExecEvent::Exit(Box::new(without_output(&result))));
        st.result = Some(result);
    }
}

fn without_output(r: &ExecResult) -> ExecResult {
    ExecResult {
        stdout: String::new(),
        stderr: String::new(),
        ..r.clone()
    }
}

/// `SIGTERM`, `TERM`, `term` or a number in 1..=64.
pub fn signal_number(name: &str) -> Option<i32> {
    if let Ok(n) = name.parse::<i32>() {
        return (1..=64).contains(&n).then_some(n);
    }
    let upper = name.to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    Some(match bare {
        "HUP" => 1,
        "INT" => 2,
        "QUIT" => 3,
        "KILL" => 9,
        "USR1" => 10,
        "USR2" => 12,
        "PIPE" => 13,
        "ALRM" => 14,
        "TERM" => 15,
        "CONT" => 18,
        "STOP" => 19,
        "TSTP" => 20,
        "WINCH" => 28,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_names() {
        assert_eq!(signal_number("SIGTERM"), Some(15));
        assert_eq!(signal_number("kill"), Some(9));
        assert_eq!(signal_number("2"), Some(2));
        assert_eq!(signal_number("0"), None);
        assert_eq!(signal_number("SIGFOO"), None);
    }
}
