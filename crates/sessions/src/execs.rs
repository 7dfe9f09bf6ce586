//! Execs that are followed rather than awaited: background execs and streamed (SSE) ones.
//!
//! A task consumes the agent's event stream promptly into a byte-bounded replay buffer and a
//! broadcast channel, so a slow or absent follower never stalls the sandbox's agent connection:
//! the buffer keeps the most recent output (older output is dropped and the result flagged
//! truncated), and a follower that falls behind the channel is told how much it missed.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use koder_agent_protocol::{self as proto, ClientError, FromAgent, StreamHandle, ToAgent};
use koder_api_types::{ExecRequest, ExecResult, ExecState, ExecStatus};
use koder_auth::Identity;
use parking_lot::Mutex;
use tokio::sync::broadcast;

use crate::manager::{exec_deadline, Meter, SIGKILL};
use crate::{Error, Manager};

/// Followed execs kept per session (running ones are always kept; the oldest finished go).
const MAX_KEPT: usize = 64;
/// Execs running at once per session through this registry.
const MAX_RUNNING: usize = 64;
/// Events a follower may lag before it is told it missed some.
const CHANNEL_EVENTS: usize = 256;

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
    handle: StreamHandle,
    state: Mutex<State>,
    events: broadcast::Sender<ExecEvent>,
    /// Set when the session's processes were all killed while this one ran.
    killed: std::sync::atomic::AtomicBool,
}

struct State {
    pid: Option<u32>,
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
    fn get(&self, exec_id: &str) -> Result<Arc<FollowedExec>, Error> {
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
    fn admit(&self) -> Result<(), Error> {
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
}

impl FollowedExec {
    fn status(&self) -> ExecStatus {
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
            pid: st.pid,
            result: st.result.clone(),
        }
    }

    /// Snapshot and subscription under one lock: nothing is missed or seen twice.
    fn follow(self: &Arc<Self>, cancel_on_drop: bool) -> Follow {
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

    fn record(&self, event: ExecEvent, limit: usize) {
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

    fn finish(&self, mut result: ExecResult) {
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

impl Manager {
    /// Starts an exec that runs on its own; its output is buffered for followers.
    pub async fn exec_background(
        &self,
        who: &Identity,
        id: &str,
        req: ExecRequest,
    ) -> Result<String, Error> {
        Ok(self.start_followed(who, id, req, true).await?.id.clone())
    }

    /// Starts an exec and follows it; dropping the follower before it ends kills the exec.
    pub async fn exec_streamed(
        &self,
        who: &Identity,
        id: &str,
        req: ExecRequest,
    ) -> Result<Follow, Error> {
        let exec = self.start_followed(who, id, req, false).await?;
        Ok(exec.follow(true))
    }

    async fn start_followed(
        &self,
        who: &Identity,
        id: &str,
        req: ExecRequest,
        background: bool,
    ) -> Result<Arc<FollowedExec>, Error> {
        let live = self.live(who, id)?;
        live.execs.admit()?;
        let agent_req = self.exec_request(&live, req, background)?;
        let command = agent_req.argv.clone();
        let deadline = tokio::time::Instant::now() + exec_deadline(agent_req.timeout_ms);
        let meter = Meter::start(live.clone()).await;
        let stream = match live.sandbox.agent().exec(agent_req).await {
            Ok(s) => s,
            Err(e) => {
                meter.abandon();
                return Err(self.agent_failed(id, e).await);
            }
        };
        let (events, _) = broadcast::channel(CHANNEL_EVENTS);
        let exec = Arc::new(FollowedExec {
            id: uuid::Uuid::new_v4().simple().to_string(),
            command,
            background,
            started_at: Utc::now(),
            handle: stream.handle(),
            state: Mutex::new(State {
                pid: None,
                retained: VecDeque::new(),
                retained_bytes: 0,
                stdout_dropped: false,
                stderr_dropped: false,
                stdin_open: background,
                result: None,
            }),
            events,
            killed: Default::default(),
        });
        live.execs
            .execs
            .lock()
            .insert(exec.id.clone(), exec.clone());
        let limit = usize::try_from(self.cfg.output_limit_bytes).unwrap_or(usize::MAX);
        tokio::spawn(consume(
            stream,
            exec.clone(),
            meter,
            self.metrics_handle(),
            (limit, deadline),
        ));
        Ok(exec)
    }

    pub async fn list_execs(&self, who: &Identity, id: &str) -> Result<Vec<ExecStatus>, Error> {
        let live = self.live(who, id)?;
        let mut all: Vec<ExecStatus> = live
            .execs
            .execs
            .lock()
            .values()
            .map(|e| e.status())
            .collect();
        all.sort_by_key(|s| s.started_at);
        Ok(all)
    }

    pub async fn exec_status(
        &self,
        who: &Identity,
        id: &str,
        exec_id: &str,
    ) -> Result<ExecStatus, Error> {
        Ok(self.live(who, id)?.execs.get(exec_id)?.status())
    }

    /// Replays what the exec printed so far, then follows it live.
    pub async fn follow_exec(
        &self,
        who: &Identity,
        id: &str,
        exec_id: &str,
    ) -> Result<Follow, Error> {
        Ok(self.live(who, id)?.execs.get(exec_id)?.follow(false))
    }

    /// Writes to a background exec's stdin; `close` closes it afterwards.
    pub async fn exec_stdin(
        &self,
        who: &Identity,
        id: &str,
        exec_id: &str,
        data: Bytes,
        close: bool,
    ) -> Result<(), Error> {
        let exec = self.live(who, id)?.execs.get(exec_id)?;
        if !exec.state.lock().stdin_open {
            return Err(Error::Conflict("stdin of this exec is closed".into()));
        }
        for chunk in data.chunks(proto::CHUNK_BYTES) {
            exec.handle.send(ToAgent::Stdin(chunk.to_vec())).await?;
        }
        if close {
            exec.state.lock().stdin_open = false;
            exec.handle.send(ToAgent::CloseStdin).await?;
        }
        Ok(())
    }

    pub async fn exec_signal(
        &self,
        who: &Identity,
        id: &str,
        exec_id: &str,
        signal: &str,
    ) -> Result<(), Error> {
        let exec = self.live(who, id)?.execs.get(exec_id)?;
        let number = signal_number(signal)
            .ok_or_else(|| Error::InvalidArgument(format!("unknown signal {signal:?}")))?;
        if exec.state.lock().result.is_some() {
            return Err(Error::Conflict("the exec has already exited".into()));
        }
        exec.handle.send(ToAgent::Signal(number)).await?;
        Ok(())
    }
}

async fn consume(
    mut stream: proto::AgentStream,
    exec: Arc<FollowedExec>,
    meter: Meter,
    metrics: Arc<crate::Metrics>,
    (limit, deadline): (usize, tokio::time::Instant),
) {
    let started = std::time::Instant::now();
    let (exit, killed) = loop {
        // Past the deadline the agent is wedged: the exec ends as killed (the drop cancels it).
        let next = tokio::time::timeout_at(deadline, stream.recv())
            .await
            .unwrap_or(Err(ClientError::Disconnected));
        match next {
            Ok(FromAgent::Started { pid }) => exec.state.lock().pid = Some(pid),
            Ok(FromAgent::Stdout(d)) => exec.record(ExecEvent::Stdout(Bytes::from(d)), limit),
            Ok(FromAgent::Stderr(d)) => exec.record(ExecEvent::Stderr(Bytes::from(d)), limit),
            Ok(FromAgent::Exited(exit)) => break (exit, false),
            Ok(_) => {}
            Err(_) => {
                let exit = proto::ExitInfo {
                    signal: Some(SIGKILL),
                    duration_ms: started.elapsed().as_millis() as u64,
                    ..Default::default()
                };
                break (exit, true);
            }
        }
    };
    let killed = killed || exec.killed.load(std::sync::atomic::Ordering::SeqCst);
    let (verdict, peak) = meter.finish(&exit, killed, &metrics).await;
    exec.finish(ExecResult {
        exec_id: exec.id.clone(),
        exit_code: exit.exit_code,
        signal: exit.signal,
        stdout: String::new(),
        stderr: String::new(),
        stdout_truncated: exit.stdout_truncated,
        stderr_truncated: exit.stderr_truncated,
        duration_ms: exit.duration_ms,
        peak_memory_kib: peak,
        verdict: verdict.map(String::from),
    });
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
