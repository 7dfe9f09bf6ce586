//! The exec phase: an API request becomes an agent request (argv, account, env merge, bounds),
//! runs awaited (output collected up to the server's limit) or followed (see [`crate::execs`]),
//! and ends with a verdict from the resource [`Meter`].

mod meter;
mod trace;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use koder_agent_protocol::{self as proto, AgentClient, ClientError, FromAgent};
use koder_api_types::{ExecRequest, ExecResult, ExecStatus};
use koder_auth::Identity;
use tracing::Instrument as _;

pub(crate) use meter::{counters_of, Meter};
pub(crate) use trace::{End, ExecTrace, Mode};

use super::account::run_as;
use super::{first_answer, validate_env, with_env, within, Manager};
use crate::events::Events;
use crate::execs::{signal_number, ExecEvent, Follow, FollowedExec};
use crate::languages;
use crate::session::Live;
use crate::Error;

/// How much longer than its own timeout an exec may take before the daemon gives up on the
/// agent (the agent enforces the timeout itself; this only catches a wedged agent).
const EXEC_GRACE: Duration = Duration::from_secs(10);
pub(crate) const SIGKILL: i32 = 9;

/// What a background exec's stdin takes after the bytes of its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaterStdin {
    /// Input sent while it runs, until closed.
    Open,
    /// Nothing: it reads end-of-file at once, from no pipe that a second message must close
    /// (E2B's process started without `stdin`).
    Closed,
}

/// How an exec runs: awaited, streamed to its caller, or in the background.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Awaited,
    Streamed,
    Background(LaterStdin),
}

impl Shape {
    fn mode(self) -> Mode {
        match self {
            Shape::Awaited => Mode::Awaited,
            Shape::Streamed => Mode::Streamed,
            Shape::Background(_) => Mode::Background,
        }
    }

    fn background(self) -> bool {
        matches!(self, Shape::Background(_))
    }

    fn keeps_stdin_open(self) -> bool {
        self == Shape::Background(LaterStdin::Open)
    }
}

/// A background exec that runs: its id and its process's pid (in the sandbox).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackgroundExec {
    pub exec_id: String,
    pub pid: u32,
}

impl Manager {
    pub async fn exec(
        &self,
        who: &Identity,
        id: &str,
        req: ExecRequest,
    ) -> Result<ExecResult, Error> {
        let mut trace = ExecTrace::start(Mode::Awaited, &who.tenant_id, id);
        let span = trace.span().clone();
        self.exec_awaited(who, id, req, &mut trace)
            .instrument(span)
            .await
    }

    async fn exec_awaited(
        &self,
        who: &Identity,
        id: &str,
        req: ExecRequest,
        trace: &mut ExecTrace,
    ) -> Result<ExecResult, Error> {
        let live = self.awake(who, id).await?;
        trace.on(&live);
        let mut agent_req = self.exec_request(id, &live, req, Shape::Awaited).await?;
        agent_req.trace = trace.agent_context();
        let meter = Meter::start(live.clone()).await;
        let deadline = exec_deadline(agent_req.timeout_ms);
        let outcome = within(
            deadline,
            collect_exec(live.sandbox.agent(), agent_req, self.cfg.output_limit_bytes),
        )
        .await;
        let mut out = match outcome {
            Ok(out) => out,
            Err(e) => {
                meter.abandon();
                return Err(self.agent_failed(id, e).await);
            }
        };
        if !out.killed {
            trace.agent_exited(&out.exit);
        }
        let (verdict, peak_kib) = meter.finish(&out.exit, out.killed, &self.metrics).await;
        let exec_id = uuid::Uuid::new_v4().simple().to_string();
        report_verdict(
            &self.events,
            (&live.tenant_id, id, &exec_id),
            verdict,
            &out.exit,
        );
        trace.finish(End::of_exit(&out.exit, verdict, peak_kib));
        Ok(ExecResult {
            exec_id,
            exit_code: out.exit.exit_code,
            signal: out.exit.signal,
            stdout: String::from_utf8_lossy(&std::mem::take(&mut out.stdout)).into_owned(),
            stderr: String::from_utf8_lossy(&std::mem::take(&mut out.stderr)).into_owned(),
            stdout_truncated: out.stdout_truncated,
            stderr_truncated: out.stderr_truncated,
            duration_ms: out.exit.duration_ms,
            peak_memory_kib: peak_kib,
            verdict: verdict.map(String::from),
        })
    }

    /// The agent request for an API exec; a background one leaves output bounding to the
    /// daemon's per-exec buffer, and may keep stdin open for later input.
    async fn exec_request(
        &self,
        id: &str,
        live: &Live,
        req: ExecRequest,
        shape: Shape,
    ) -> Result<proto::ExecRequest, Error> {
        let argv = match (req.cmd, req.shell, req.code) {
            (None, None, Some(code)) => {
                languages::code_argv(req.language.as_deref().unwrap_or(&live.language), &code)?
            }
            _ if req.language.is_some() => {
                return Err(Error::InvalidArgument(
                    "language only applies to code".into(),
                ))
            }
            (Some(cmd), None, None) => {
                if cmd.first().is_none_or(String::is_empty) {
                    return Err(Error::InvalidArgument("cmd must name a program".into()));
                }
                cmd
            }
            (None, Some(shell), None) => vec!["/bin/bash".into(), "-c".into(), shell],
            _ => {
                return Err(Error::InvalidArgument(
                    "give exactly one of cmd, shell or code".into(),
                ))
            }
        };
        let timeout_ms = req.timeout_ms.unwrap_or(self.cfg.default_exec_timeout_ms);
        if timeout_ms == 0 || timeout_ms > self.cfg.max_exec_timeout_ms {
            return Err(Error::InvalidArgument(format!(
                "timeout_ms must be 1..={}",
                self.cfg.max_exec_timeout_ms
            )));
        }
        let extra_env = validate_env(&req.env)?;
        if let Some(cwd) = &req.cwd {
            if cwd.is_empty() || cwd.contains('\0') || cwd.len() > proto::MAX_PATH_BYTES {
                return Err(Error::InvalidArgument("cwd must be a path".into()));
            }
        }
        let account = self.account_in(id, live, req.user.as_deref()).await?;
        let (uid, gid, env) = run_as(&account, live.env.clone());
        let env = with_env(env, extra_env);
        Ok(proto::ExecRequest {
            argv,
            env,
            cwd: req.cwd,
            stdin: req.stdin.map(String::into_bytes).unwrap_or_default(),
            keep_stdin_open: shape.keeps_stdin_open(),
            timeout_ms: Some(timeout_ms),
            output_limit_bytes: if shape.background() {
                u64::MAX
            } else {
                self.cfg.output_limit_bytes
            },
            uid,
            gid,
            trace: None,
            detached: false,
            quiet: false,
        })
    }

    /// Starts an exec that runs on its own; its output is buffered for followers. It returns
    /// once the process runs.
    pub async fn exec_background(
        &self,
        who: &Identity,
        id: &str,
        req: ExecRequest,
        stdin: LaterStdin,
    ) -> Result<BackgroundExec, Error> {
        let exec = self
            .start_followed(who, id, req, Shape::Background(stdin))
            .await?;
        Ok(BackgroundExec {
            exec_id: exec.id().to_string(),
            pid: exec.pid(),
        })
    }

    /// Starts an exec and follows it; dropping the follower before it ends kills the exec.
    pub async fn exec_streamed(
        &self,
        who: &Identity,
        id: &str,
        req: ExecRequest,
    ) -> Result<Follow, Error> {
        let exec = self.start_followed(who, id, req, Shape::Streamed).await?;
        Ok(exec.follow(true))
    }

    /// Starts a followed exec; its span (a child of the current one) lasts until it ends.
    async fn start_followed(
        &self,
        who: &Identity,
        id: &str,
        req: ExecRequest,
        shape: Shape,
    ) -> Result<Arc<FollowedExec>, Error> {
        let mut trace = ExecTrace::start(shape.mode(), &who.tenant_id, id);
        let span = trace.span().clone();
        self.begin_followed(who, id, req, shape, &mut trace)
            .instrument(span)
            .await
            .map(|(exec, run)| {
                tokio::spawn(consume(exec.clone(), run, trace));
                exec
            })
    }

    async fn begin_followed(
        &self,
        who: &Identity,
        id: &str,
        req: ExecRequest,
        shape: Shape,
        trace: &mut ExecTrace,
    ) -> Result<(Arc<FollowedExec>, Running), Error> {
        let live = self.awake(who, id).await?;
        trace.on(&live);
        live.execs.admit()?;
        let mut agent_req = self.exec_request(id, &live, req, shape).await?;
        agent_req.trace = trace.agent_context();
        let command = agent_req.argv.clone();
        let deadline = tokio::time::Instant::now() + exec_deadline(agent_req.timeout_ms);
        let meter = Meter::start(live.clone()).await;
        // Handed out only once it runs: a program that cannot start is the caller's error (as
        // for an awaited exec), not an exec that ends at once.
        let started = match live.sandbox.agent().exec(agent_req).await {
            Ok(mut s) => match first_answer(&mut s).await {
                Ok(FromAgent::Started { pid }) => Ok((s, pid)),
                Ok(other) => Err(Error::Internal(format!(
                    "sandbox agent: an exec began with {}",
                    message_name(&other)
                ))),
                Err(e) => Err(self.agent_failed(id, e).await),
            },
            Err(e) => Err(self.agent_failed(id, e).await),
        };
        let (stream, pid) = match started {
            Ok(s) => s,
            Err(e) => {
                meter.abandon();
                return Err(e);
            }
        };
        let exec = FollowedExec::new(
            command,
            shape.background(),
            shape.keeps_stdin_open(),
            pid,
            stream.handle(),
        );
        live.execs.insert(exec.clone());
        let limit = usize::try_from(self.cfg.output_limit_bytes).unwrap_or(usize::MAX);
        let report = Report {
            events: self.events.clone(),
            tenant: live.tenant_id.clone(),
            session: id.to_string(),
        };
        let run = Running {
            stream,
            meter,
            report,
            metrics: self.metrics_handle(),
            limit,
            deadline,
        };
        Ok((exec, run))
    }

    pub async fn list_execs(&self, who: &Identity, id: &str) -> Result<Vec<ExecStatus>, Error> {
        Ok(self.live(who, id)?.execs.statuses())
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
        exec.write_stdin(data, close).await
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
        exec.signal(number).await
    }
}

/// Where a followed exec's verdict is reported once it ends.
struct Report {
    events: Events,
    tenant: String,
    session: String,
}

/// A started followed exec, for [`consume`].
struct Running {
    stream: proto::AgentStream,
    meter: Meter,
    report: Report,
    metrics: Arc<crate::Metrics>,
    limit: usize,
    deadline: tokio::time::Instant,
}

/// An `exec.verdict` event for an exec that did not end on its own.
fn report_verdict(
    events: &Events,
    (tenant, session, exec_id): (&str, &str, &str),
    verdict: Option<&str>,
    exit: &proto::ExitInfo,
) {
    let Some(verdict) = verdict else { return };
    let data = serde_json::json!({
        "session_id": session,
        "exec_id": exec_id,
        "verdict": verdict,
        "exit_code": exit.exit_code,
        "signal": exit.signal,
        "duration_ms": exit.duration_ms,
    });
    events.emit(tenant, crate::events::kinds::EXEC_VERDICT, data);
}

/// Drains a followed exec's agent stream into its buffer until it exits, then records its result.
async fn consume(exec: Arc<FollowedExec>, run: Running, mut trace: ExecTrace) {
    let Running {
        mut stream,
        meter,
        report,
        metrics,
        limit,
        deadline,
    } = run;
    let started = std::time::Instant::now();
    let (exit, killed) = loop {
        // Past the deadline the agent is wedged: the exec ends as killed (the drop cancels it).
        let next = tokio::time::timeout_at(deadline, stream.recv())
            .await
            .unwrap_or(Err(ClientError::Disconnected));
        match next {
            Ok(FromAgent::Stdout(d)) => exec.record(ExecEvent::Stdout(Bytes::from(d)), limit),
            Ok(FromAgent::Stderr(d)) => exec.record(ExecEvent::Stderr(Bytes::from(d)), limit),
            Ok(FromAgent::Exited(exit)) => {
                trace.agent_exited(&exit);
                break (exit, false);
            }
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
    let killed = killed || exec.was_killed();
    let (verdict, peak) = meter.finish(&exit, killed, &metrics).await;
    report_verdict(
        &report.events,
        (&report.tenant, &report.session, exec.id()),
        verdict,
        &exit,
    );
    trace.finish(End::of_exit(&exit, verdict, peak));
    exec.finish(ExecResult {
        exec_id: exec.id().to_string(),
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

/// An exec's collected output; `killed` when the sandbox went away mid-run (what was printed
/// until then is kept).
struct Collected {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    stdout_truncated: bool,
    stderr_truncated: bool,
    exit: proto::ExitInfo,
    killed: bool,
}

async fn collect_exec(
    agent: &AgentClient,
    req: proto::ExecRequest,
    limit: u64,
) -> Result<Collected, ClientError> {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let began = Instant::now();
    // Only the exit matters here: the agent announces no start.
    let mut stream = agent
        .exec(proto::ExecRequest { quiet: true, ..req })
        .await?;
    let mut c = Collected {
        stdout: Vec::new(),
        stderr: Vec::new(),
        stdout_truncated: false,
        stderr_truncated: false,
        exit: proto::ExitInfo::default(),
        killed: false,
    };
    loop {
        match stream.recv().await {
            Ok(FromAgent::Stdout(d)) => {
                c.stdout_truncated |= append_bounded(&mut c.stdout, &d, limit)
            }
            Ok(FromAgent::Stderr(d)) => {
                c.stderr_truncated |= append_bounded(&mut c.stderr, &d, limit)
            }
            Ok(FromAgent::Exited(exit)) => {
                c.stdout_truncated |= exit.stdout_truncated;
                c.stderr_truncated |= exit.stderr_truncated;
                c.exit = exit;
                return Ok(c);
            }
            Ok(other) => {
                return Err(ClientError::Protocol(
                    format!("unexpected {other:?}").chars().take(80).collect(),
                ))
            }
            // The agent took the exec (a spawn that failed is an `Error`, not a hang-up): output
            // already received is the partial result of a killed exec.
            Err(ClientError::Disconnected) => {
                c.killed = true;
                c.exit.signal = Some(SIGKILL);
                c.exit.duration_ms = began.elapsed().as_millis() as u64;
                return Ok(c);
            }
            Err(e) => return Err(e),
        }
    }
}

/// How long the daemon waits for an exec of `timeout_ms` (none: the server's one-shot deadline).
pub(crate) fn exec_deadline(timeout_ms: Option<u64>) -> Duration {
    match timeout_ms {
        Some(ms) => Duration::from_millis(ms) + EXEC_GRACE,
        None => proto::client::REQUEST_DEADLINE,
    }
}

fn append_bounded(buf: &mut Vec<u8>, data: &[u8], limit: usize) -> bool {
    let room = limit.saturating_sub(buf.len());
    buf.extend_from_slice(&data[..data.len().min(room)]);
    data.len() > room
}

/// A message's kind for an error text (never its hostile contents).
fn message_name(msg: &FromAgent) -> String {
    format!("{msg:?}")
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_bounded_keeps_what_fits_and_reports_the_rest() {
        let mut buf = Vec::new();
        assert!(!append_bounded(&mut buf, b"abc", 5));
        assert!(append_bounded(&mut buf, b"defg", 5));
        assert_eq!(buf, b"abcde");
        // Once full, nothing more is kept and every further chunk counts as cut.
        assert!(append_bounded(&mut buf, b"h", 5));
        assert!(!append_bounded(&mut buf, b"", 5));
        assert_eq!(buf, b"abcde");
    }

    #[test]
    fn append_bounded_exactly_at_the_limit_is_not_truncated() {
        let mut buf = b"ab".to_vec();
        assert!(!append_bounded(&mut buf, b"cd", 4));
        assert_eq!(buf, b"abcd");
    }

    #[test]
    fn exec_deadline_adds_the_grace_or_uses_the_one_shot_deadline() {
        assert_eq!(
            exec_deadline(Some(1500)),
            Duration::from_millis(1500) + EXEC_GRACE
        );
        assert_eq!(exec_deadline(None), proto::client::REQUEST_DEADLINE);
    }
}
