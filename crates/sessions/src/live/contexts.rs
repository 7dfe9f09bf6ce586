//! Code-interpreter contexts of a session (API.md "Code interpreter"): long-lived interpreters
//! kept by the sandbox's agent, whose variables persist from one run to the next. The agent
//! owns them; this layer adds tenancy, validation, output bounds and verdicts.

use std::sync::Arc;
use std::time::Instant;

use koder_agent_protocol::{self as proto, ClientError, FromAgent, ToAgent};
use koder_api_types::codes;
use koder_auth::Identity;
use tokio::sync::mpsc;
use tracing::Instrument as _;

use crate::languages;
use crate::manager::exec::{End, ExecTrace, Meter, Mode};
use crate::session::Live;
use crate::{Error, Manager};

/// Resolves once the caller following a run's output has gone away; never without one.
async fn caller_gone(follower: Option<&mpsc::Sender<RunEvent>>) {
    match follower {
        Some(tx) => tx.closed().await,
        None => std::future::pending().await,
    }
}

/// Largest cell accepted: a run request must fit in one agent protocol frame.
pub const MAX_CODE_BYTES: usize = 512 * 1024;
const MAX_CONTEXT_ID: usize = 64;

/// Where a new context's interpreter runs and what it has in its environment beyond the
/// session's.
#[derive(Debug, Clone, Default)]
pub struct ContextOptions {
    pub cwd: Option<String>,
    pub env: std::collections::BTreeMap<String, String>,
    /// The id to give it; the create is then idempotent (a context of that id and language
    /// that exists is answered as it is). `default` can only name the Python context.
    pub context_id: Option<String>,
}

/// What to run in a context.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    pub code: String,
    pub timeout_ms: Option<u64>,
    /// Set for this run only.
    pub env: std::collections::BTreeMap<String, String>,
}

/// Output of a run as it is printed, for callers that stream it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutput {
    Stdout(String),
    Stderr(String),
}

/// What a streamed run reports: its output as printed, then its result.
#[derive(Debug)]
pub enum RunEvent {
    Output(RunOutput),
    Done(Result<ContextRun, Error>),
}

/// How long a streamed run's answer waits for the run's first event before its headers go
/// out: long enough for a refusal (an unknown context, a stopped session) to be the answer's
/// own status, short enough that a client waiting for the headers of a run that prints nothing
/// (E2B's JS SDK starts its run timeout only then) gets them at once.
pub const FIRST_EVENT_GRACE: std::time::Duration = std::time::Duration::from_millis(100);

/// The first event of a streamed run if it comes within [`FIRST_EVENT_GRACE`], or none yet; a
/// failure that soon is the run's refusal. A failure after it is the stream's last event.
pub async fn refusal_or_first(
    rx: &mut mpsc::Receiver<RunEvent>,
) -> Result<Option<RunEvent>, Error> {
    match tokio::time::timeout(FIRST_EVENT_GRACE, rx.recv()).await {
        Ok(Some(RunEvent::Done(Err(e)))) => Err(e),
        Ok(Some(event)) => Ok(Some(event)),
        Ok(None) => Err(Error::Internal("the run ended without a result".into())),
        Err(_) => Ok(None),
    }
}

/// A context: one long-lived interpreter in the session's sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContextInfo {
    pub context_id: String,
    pub language: String,
    /// Runs so far in this interpreter (0 after a restart).
    pub execution_count: u64,
    /// Working directory the interpreter started in.
    pub cwd: String,
}

/// One displayable value in the representations it offers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RichResult {
    /// The value of the cell's last expression (others are displayed objects, figures).
    pub is_main_result: bool,
    pub text: Option<String>,
    pub html: Option<String>,
    pub markdown: Option<String>,
    /// JSON text, as the interpreter serialised it.
    pub json: Option<String>,
    /// base64 PNG.
    pub png: Option<String>,
    pub svg: Option<String>,
    /// base64 JPEG.
    pub jpeg: Option<String>,
    /// LaTeX source.
    pub latex: Option<String>,
    /// Tabular data (a pandas DataFrame) as JSON text: each column's name → its values.
    pub data: Option<String>,
    /// The chart a matplotlib figure draws, as JSON text (E2B's `chart` format).
    pub chart: Option<String>,
    /// base64 PDF.
    pub pdf: Option<String>,
    /// JavaScript source.
    pub javascript: Option<String>,
    /// The other MIME types offered, as JSON text of an object (type → value).
    pub extra: Option<String>,
}

/// The exception a run raised.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunError {
    pub name: String,
    pub value: String,
    pub traceback: String,
}

impl From<proto::ContextInfo> for ContextInfo {
    fn from(c: proto::ContextInfo) -> Self {
        let proto::ContextInfo {
            context_id,
            language,
            execution_count,
            cwd,
        } = c;
        Self {
            context_id,
            language,
            execution_count,
            cwd,
        }
    }
}

impl From<proto::RichResult> for RichResult {
    fn from(r: proto::RichResult) -> Self {
        let proto::RichResult {
            is_main_result,
            text,
            html,
            markdown,
            json,
            png,
            svg,
            jpeg,
            latex,
            data,
            chart,
            pdf,
            javascript,
            extra,
        } = r;
        Self {
            is_main_result,
            text,
            html,
            markdown,
            json,
            png,
            svg,
            jpeg,
            latex,
            data,
            chart,
            pdf,
            javascript,
            extra,
        }
    }
}

impl From<proto::RunError> for RunError {
    fn from(e: proto::RunError) -> Self {
        let proto::RunError {
            name,
            value,
            traceback,
        } = e;
        Self {
            name,
            value,
            traceback,
        }
    }
}

/// The result of one run in a context.
#[derive(Debug, Clone, Default)]
pub struct ContextRun {
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// Rich outputs in display order; the last expression's value has `is_main_result`.
    pub results: Vec<RichResult>,
    pub error: Option<RunError>,
    pub execution_count: u64,
    pub duration_ms: u64,
    /// An exec verdict code, or none for a run that ended by itself.
    pub verdict: Option<&'static str>,
    /// The interpreter was killed and started afresh: the context's state is gone.
    pub restarted: bool,
    /// The session's peak memory during the run, when nothing else ran meanwhile.
    pub peak_memory_kib: Option<u64>,
}

impl Manager {
    /// Starts a run whose output (as printed) and then result arrive on the returned channel.
    /// Dropping the receiver cancels the run, as dropping an exec's stream cancels the exec.
    pub fn run_in_context_streamed(
        self: &Arc<Self>,
        who: Identity,
        id: String,
        cid: String,
        req: RunRequest,
    ) -> mpsc::Receiver<RunEvent> {
        let (events, rx) = mpsc::channel(64);
        let manager = self.clone();
        // The run's span stays the caller's child though it outlives the call.
        let parent = tracing::Span::current();
        tokio::spawn(
            async move {
                let result = manager
                    .run_in_context(&who, &id, &cid, req, Some(events.clone()))
                    .await;
                let _ = events.send(RunEvent::Done(result)).await;
            }
            .instrument(parent),
        );
        rx
    }

    /// A new context; `opts` sets where and with which extra variables its interpreter runs.
    pub async fn create_context(
        &self,
        who: &Identity,
        id: &str,
        language: &str,
        opts: ContextOptions,
    ) -> Result<ContextInfo, Error> {
        let live = self.awake(who, id).await?;
        // The session's variables, as every process of it has them, then the context's own.
        let env =
            crate::manager::with_env(live.env.clone(), crate::manager::validate_env(&opts.env)?);
        if let Some(cwd) = opts.cwd.as_deref() {
            if !cwd.starts_with('/') || cwd.len() > proto::MAX_PATH_BYTES || cwd.contains('\0') {
                return Err(Error::InvalidArgument(format!(
                    "cwd {cwd:?} must be an absolute path"
                )));
            }
        }
        let language = languages::context_language(language)?;
        if let Some(cid) = opts.context_id.as_deref() {
            validate_context_id(cid)
                .map_err(|_| Error::InvalidArgument(format!("context id {cid:?} is not valid")))?;
            if cid == DEFAULT_CONTEXT && language != "python" {
                return Err(Error::InvalidArgument(format!(
                    "context {DEFAULT_CONTEXT} runs python, not {language}"
                )));
            }
        }
        let msg = ToAgent::ContextCreate {
            language: language.into(),
            cwd: opts.cwd,
            env,
            context_id: opts.context_id,
        };
        match self.ask(&live, id, msg).await? {
            FromAgent::Context(info) => Ok(info.into()),
            other => Err(unexpected(&other)),
        }
    }

    pub async fn list_contexts(&self, who: &Identity, id: &str) -> Result<Vec<ContextInfo>, Error> {
        let live = self.awake(who, id).await?;
        match self.ask(&live, id, ToAgent::ContextList).await? {
            FromAgent::Contexts(all) => Ok(all.into_iter().map(Into::into).collect()),
            other => Err(unexpected(&other)),
        }
    }

    pub async fn delete_context(&self, who: &Identity, id: &str, cid: &str) -> Result<(), Error> {
        let live = self.awake(who, id).await?;
        validate_context_id(cid)?;
        let msg = ToAgent::ContextDelete {
            context_id: cid.into(),
        };
        match self.ask(&live, id, msg).await? {
            FromAgent::Done => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    pub async fn restart_context(
        &self,
        who: &Identity,
        id: &str,
        cid: &str,
    ) -> Result<ContextInfo, Error> {
        let live = self.awake(who, id).await?;
        validate_context_id(cid)?;
        let msg = ToAgent::ContextRestart {
            context_id: cid.into(),
        };
        match self.ask(&live, id, msg).await? {
            FromAgent::Context(info) => Ok(info.into()),
            other => Err(unexpected(&other)),
        }
    }

    /// Runs code in context `cid` ("default" is a Python context made on first use). With
    /// `live`, output is also sent there as it is printed (the result still carries all of it,
    /// bounded); a receiver that goes away cancels the run.
    pub async fn run_in_context(
        &self,
        who: &Identity,
        id: &str,
        cid: &str,
        req: RunRequest,
        live_output: Option<mpsc::Sender<RunEvent>>,
    ) -> Result<ContextRun, Error> {
        let mut trace = ExecTrace::start(Mode::Context, &who.tenant_id, id);
        let span = trace.span().clone();
        let run = self
            .run_traced(who, id, cid, req, live_output, &mut trace)
            .instrument(span)
            .await?;
        trace.finish(End {
            verdict: run.verdict,
            exit_code: None,
            signal: None,
            duration_ms: run.duration_ms,
            peak_memory_kib: run.peak_memory_kib,
        });
        Ok(run)
    }

    async fn run_traced(
        &self,
        who: &Identity,
        id: &str,
        cid: &str,
        req: RunRequest,
        live_output: Option<mpsc::Sender<RunEvent>>,
        trace: &mut ExecTrace,
    ) -> Result<ContextRun, Error> {
        let RunRequest {
            code,
            timeout_ms,
            env,
        } = req;
        let live = self.awake(who, id).await?;
        trace.on(&live);
        validate_context_id(cid)?;
        let env = crate::manager::validate_env(&env)?;
        if code.len() > MAX_CODE_BYTES {
            return Err(Error::PayloadTooLarge(format!(
                "code is limited to {MAX_CODE_BYTES} bytes"
            )));
        }
        let timeout_ms = timeout_ms.unwrap_or(self.cfg.default_exec_timeout_ms);
        if timeout_ms == 0 || timeout_ms > self.cfg.max_exec_timeout_ms {
            return Err(Error::InvalidArgument(format!(
                "timeout_ms must be 1..={}",
                self.cfg.max_exec_timeout_ms
            )));
        }
        let limit = usize::try_from(self.cfg.output_limit_bytes).unwrap_or(usize::MAX);
        let rc = live.sandbox.resources();
        let before = crate::manager::exec::counters_of(rc).await;
        let meter = Meter::start(live.clone()).await;
        let began = Instant::now();
        let msg = ToAgent::ContextRun {
            context_id: cid.into(),
            code,
            timeout_ms: Some(timeout_ms),
            env,
            trace: trace.agent_context(),
            default_env: match cid == DEFAULT_CONTEXT {
                true => live.env.clone(),
                false => Vec::new(),
            },
        };
        let mut stream = match live.sandbox.agent().open(msg).await {
            Ok(s) => s,
            Err(e) => {
                meter.abandon();
                return Err(self.agent_failed(id, e).await);
            }
        };
        let mut run = ContextRun::default();
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let mut forward = live_output.map(|tx| (tx, Utf8Chunks::default(), Utf8Chunks::default()));
        let budget = crate::manager::exec::exec_deadline(Some(timeout_ms));
        let deadline = tokio::time::Instant::now() + budget;
        let mut cancelled = false;
        let outcome = loop {
            let next = tokio::select! {
                next = tokio::time::timeout_at(deadline, stream.recv()) => {
                    next.unwrap_or(Err(ClientError::Timeout(budget)))
                }
                () = caller_gone(forward.as_ref().map(|f| &f.0)) => {
                    // As a dropped exec stream cancels its exec: the agent interrupts the run
                    // (SIGINT, so the context keeps its state) and ends it if that fails.
                    forward = None;
                    cancelled = true;
                    let _ = stream.send(ToAgent::Cancel).await;
                    continue;
                }
            };
            match next {
                Ok(FromAgent::Stdout(d)) => {
                    if let Some((tx, out, _)) = &mut forward {
                        let _ = tx
                            .send(RunEvent::Output(RunOutput::Stdout(out.push(&d))))
                            .await;
                    }
                    run.stdout_truncated |= append_bounded(&mut stdout, &d, limit)
                }
                Ok(FromAgent::Stderr(d)) => {
                    if let Some((tx, _, err)) = &mut forward {
                        let _ = tx
                            .send(RunEvent::Output(RunOutput::Stderr(err.push(&d))))
                            .await;
                    }
                    run.stderr_truncated |= append_bounded(&mut stderr, &d, limit)
                }
                Ok(FromAgent::RunDone(outcome)) => {
                    stream.mark_finished();
                    trace.agent_ran(&outcome);
                    break Ok(Some(outcome));
                }
                Ok(other) => break Err(unexpected(&other)),
                // The sandbox went away mid-run: what was printed until then is the result of
                // a killed run, as for exec.
                Err(ClientError::Disconnected) => break Ok(None),
                Err(e) => break Err(self.agent_failed(id, e).await),
            }
        };
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(e) => {
                meter.abandon();
                return Err(e);
            }
        };
        run.peak_memory_kib = meter.peak().await;
        // Decoded once at the end: a character split between two chunks stays whole.
        run.stdout = String::from_utf8_lossy(&stdout).into_owned();
        run.stderr = String::from_utf8_lossy(&stderr).into_owned();
        let Some(outcome) = outcome else {
            run.verdict = Some(codes::EXEC_KILLED);
            run.duration_ms = began.elapsed().as_millis() as u64;
            return Ok(run);
        };
        // Only a restarted interpreter may have been OOM-killed.
        let after = match outcome.restarted {
            true => crate::manager::exec::counters_of(rc).await,
            false => None,
        };
        let oom = matches!((before, after), (Some(b), Some(a)) if a.oom_kills > b.oom_kills);
        run.verdict = if outcome.timed_out {
            Some(codes::EXEC_TIMEOUT)
        } else if cancelled {
            Some(codes::EXEC_KILLED)
        } else if outcome.restarted && oom {
            Some(codes::EXEC_KILLED_OOM)
        } else if outcome.restarted {
            Some(codes::EXEC_KILLED)
        } else {
            None
        };
        run.results = outcome.results.into_iter().map(Into::into).collect();
        run.error = outcome.error.map(Into::into);
        run.execution_count = outcome.execution_count;
        run.duration_ms = outcome.duration_ms;
        run.restarted = outcome.restarted;
        Ok(run)
    }

    /// One request, one answer; agent errors become API errors.
    async fn ask(&self, live: &Live, id: &str, msg: ToAgent) -> Result<FromAgent, Error> {
        let answer = crate::manager::within(crate::manager::exec::exec_deadline(None), async {
            let mut stream = live.sandbox.agent().open(msg).await?;
            let answer = stream.recv().await;
            stream.mark_finished();
            answer
        })
        .await;
        match answer {
            Ok(m) => Ok(m),
            Err(e) => Err(self.agent_failed(id, e).await),
        }
    }
}

/// The Python context a run without one goes to, made by its first run.
pub const DEFAULT_CONTEXT: &str = "default";

/// Context ids are the agent's (hex), "default" or ones the daemon chose (letters, digits, `-`,
/// `_`); anything else cannot exist.
fn validate_context_id(cid: &str) -> Result<(), Error> {
    let plausible = !cid.is_empty()
        && cid.len() <= MAX_CONTEXT_ID
        && cid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if plausible {
        Ok(())
    } else {
        Err(Error::FileNotFound(format!("no context {cid:?}")))
    }
}

/// Appends output up to `limit` bytes; true when something was cut.
/// Decodes UTF-8 arriving in chunks: a character split between two chunks comes out whole with
/// the second one; invalid bytes become U+FFFD. (std decodes whole buffers only.)
#[derive(Default)]
struct Utf8Chunks {
    carry: Vec<u8>,
}

impl Utf8Chunks {
    fn push(&mut self, data: &[u8]) -> String {
        self.carry.extend_from_slice(data);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.carry) {
                Ok(s) => {
                    out.push_str(s);
                    self.carry.clear();
                    return out;
                }
                Err(e) => {
                    let (good, rest) = self.carry.split_at(e.valid_up_to());
                    out.push_str(&String::from_utf8_lossy(good));
                    match e.error_len() {
                        // An incomplete character at the end: wait for the rest of it.
                        None => {
                            self.carry = rest.to_vec();
                            return out;
                        }
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.carry = rest[bad..].to_vec();
                        }
                    }
                }
            }
        }
    }
}

fn append_bounded(buf: &mut Vec<u8>, data: &[u8], limit: usize) -> bool {
    let room = limit.saturating_sub(buf.len());
    buf.extend_from_slice(&data[..data.len().min(room)]);
    data.len() > room
}

fn unexpected(msg: &FromAgent) -> Error {
    let shown: String = format!("{msg:?}").chars().take(80).collect();
    Error::Internal(format!("sandbox agent: unexpected {shown}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_split_between_chunks() {
        let mut d = Utf8Chunks::default();
        let text = "a€b";
        let bytes = text.as_bytes();
        assert_eq!(d.push(&bytes[..2]), "a");
        assert_eq!(d.push(&bytes[2..4]), "€");
        assert_eq!(d.push(&bytes[4..]), "b");
        assert_eq!(d.push(b"x\xffy"), "x\u{fffd}y");
        assert_eq!(d.push(b"\xe2\x82"), "");
        assert_eq!(d.push(b"\xac!"), "€!");
    }

    #[test]
    fn context_ids_and_bounded_output() {
        assert!(validate_context_id("default").is_ok());
        assert!(validate_context_id("0123abcd").is_ok());
        for bad in ["", "../x", "a b", &"x".repeat(65)] {
            assert!(matches!(
                validate_context_id(bad),
                Err(Error::FileNotFound(_))
            ));
        }
        let mut s = Vec::new();
        assert!(!append_bounded(&mut s, b"abc", 5));
        assert!(append_bounded(&mut s, b"def", 5));
        assert_eq!(s, b"abcde");
    }
}
