//! Code-interpreter contexts: long-lived Python and Node interpreters inside the sandbox.
//!
//! A context is one interpreter process running a driver shipped with the agent (`drivers/`,
//! standard library only). It is started like an exec (the sandbox's default environment, its
//! own session and process group) with separate pipes for requests (its fd 3), events (its
//! fd 4) and user output (fds 1 and 2). Keeping user output off the control channel means
//! nothing printed, by user code or any process it starts, can forge or corrupt an event. The
//! driver writes a run's "done" only after flushing, so when the agent reads it the rest of the
//! run's output is already in the pipes and a non-blocking drain collects it.
//!
//! A run that times out, or whose interpreter dies, kills the interpreter's process group and
//! starts a fresh interpreter: the context survives, its state does not, and the outcome says so.

use std::collections::{HashMap, VecDeque};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use koder_agent_protocol::{
    AgentError, ContextInfo, ErrorCode, FromAgent, RichResult, RunError, RunOutcome, ToAgent,
    CHUNK_BYTES,
};
use serde::{Deserialize, Serialize};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::unix::pipe;
use tokio::sync::mpsc;

use super::exec::ExecDefaults;
use crate::outbox::Outbox;
use crate::sync::lock;

const PYTHON_DRIVER: &str = include_str!("../../drivers/python_driver.py");
const NODE_DRIVER: &str = include_str!("../../drivers/node_driver.js");

/// Where an interpreter finds its driver's source: a sealed memfd, read once (at offset 0) and
/// closed by a one-line bootstrap, so no source sits in any process's command line.
const DRIVER_FD: RawFd = 5;
/// The bootstraps read at most this much (1 MiB, `1<<20` in them).
const MAX_DRIVER: usize = 1 << 20;
const _: () = assert!(PYTHON_DRIVER.len() < MAX_DRIVER && NODE_DRIVER.len() < MAX_DRIVER);
/// A fresh globals dict: the bootstrap's own names stay out of the driver's.
const PYTHON_BOOT: &str =
    "import os;d=os.pread(5,1<<20,0);os.close(5);exec(compile(d,'koder-driver','exec'),{})";
/// Indirect eval runs the driver in the global scope (with `require`), not the bootstrap's.
const NODE_BOOT: &str = "(0,eval)((f=>{const b=Buffer.alloc(1<<20),n=f.readSync(5,b,0,b.length,0);\
                         f.closeSync(5);return b.toString('utf8',0,n)})(require('fs')))";

/// Contexts one sandbox may hold; each is a resident interpreter.
pub const MAX_CONTEXTS: usize = 16;
/// Largest cell accepted (a request must also fit in one protocol frame).
pub const MAX_CODE_BYTES: usize = 512 * 1024;
/// The context a session gets without asking: Python, started on first use.
pub const DEFAULT_CONTEXT: &str = "default";
/// stdout/stderr bytes forwarded per stream and run; the rest is read and dropped.
pub const OUTPUT_LIMIT: usize = 8 << 20;
/// Rich-output bytes per run. The whole outcome travels in one frame (≤ 1 MiB), so results,
/// the error and their encoding overhead must stay below that together.
pub const RESULT_BUDGET: usize = 900 * 1024;
/// Room for the short notes that replace outputs over the budget.
const NOTE_SLACK: usize = 32 * 1024;
const MAX_RESULTS: usize = 256;
/// Longest event line read from a driver; longer ones are skipped whole.
const MAX_EVENT_LINE: usize = 2 << 20;
const MAX_ERROR_NAME: usize = 1024;
const MAX_ERROR_VALUE: usize = 16 * 1024;
const MAX_TRACEBACK: usize = 64 * 1024;
/// How long a new interpreter may take to say it is ready.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// A cancelled run is interrupted (SIGINT) and killed if it has not finished within this.
const CANCEL_GRACE: Duration = Duration::from_secs(1);
/// Reads of one non-blocking drain of an output pipe: a writer that outlived its run must not
/// keep the agent draining forever.
const DRAIN_READS: usize = 64;
/// Start-up stderr kept for the error message of an interpreter that failed to start.
const STARTUP_STDERR: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lang {
    Python,
    Node,
}

impl Lang {
    fn parse(name: &str) -> Option<Self> {
        match name {
            "python" | "python3" | "py" => Some(Lang::Python),
            "node" | "nodejs" | "javascript" | "js" => Some(Lang::Node),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Lang::Python => "python",
            Lang::Node => "node",
        }
    }

    fn program(self) -> &'static str {
        match self {
            Lang::Python => "python3",
            Lang::Node => "node",
        }
    }

    fn args(self) -> &'static [&'static str] {
        match self {
            // -u: user output reaches the pipe as it is printed, not when a buffer fills.
            Lang::Python => &["-u", "-c", PYTHON_BOOT],
            Lang::Node => &["-e", NODE_BOOT],
        }
    }

    fn driver(self) -> &'static str {
        match self {
            Lang::Python => PYTHON_DRIVER,
            Lang::Node => NODE_DRIVER,
        }
    }
}

/// The contexts of this sandbox.
pub struct Contexts {
    env: Vec<(String, String)>,
    workdir: String,
    map: Mutex<HashMap<String, Arc<Context>>>,
    seq: AtomicU64,
}

impl Default for Contexts {
    fn default() -> Self {
        Self::new()
    }
}

impl Contexts {
    /// Contexts with a stand-in environment; the agent uses [`Contexts::with_defaults`].
    pub fn new() -> Self {
        let workdir = if Path::new("/workspace").is_dir() {
            "/workspace"
        } else {
            "/"
        };
        Self::with_defaults(&ExecDefaults {
            env: [
                (
                    "PATH",
                    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                ),
                ("HOME", "/root"),
                ("LANG", "C.UTF-8"),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            workdir: workdir.into(),
        })
    }

    /// Interpreters start with the same environment and working directory as execs.
    pub fn with_defaults(defaults: &ExecDefaults) -> Self {
        Self {
            env: defaults.env.clone(),
            workdir: defaults.workdir.clone(),
            map: Mutex::default(),
            seq: AtomicU64::new(0),
        }
    }

    async fn create(
        &self,
        language: &str,
        cwd: Option<String>,
        env: Vec<(String, String)>,
    ) -> Result<ContextInfo, AgentError> {
        let lang = Lang::parse(language).ok_or_else(|| {
            AgentError::new(
                ErrorCode::InvalidRequest,
                format!("contexts run python or node, not {language:?}"),
            )
        })?;
        let setup = self.setup(cwd, env)?;
        let ctx = self.insert(new_id(), lang, setup)?;
        // Nobody else can have the slot yet: the context was just made.
        let Ok(mut slot) = ctx.slot.try_lock() else {
            return Err(AgentError::new(ErrorCode::Io, "new context is busy"));
        };
        if let Err(e) = self.start(&ctx, &mut slot).await {
            drop(slot);
            self.remove_if_same(&ctx);
            return Err(e);
        }
        Ok(ctx.info())
    }

    /// The environment and directory a context's interpreter starts with: the sandbox's, with
    /// the request's additions.
    fn setup(&self, cwd: Option<String>, env: Vec<(String, String)>) -> Result<Setup, AgentError> {
        if !valid_env(&env) {
            return Err(bad_env());
        }
        let cwd = cwd.unwrap_or_else(|| self.workdir.clone());
        if !cwd.starts_with('/') || cwd.contains('\0') || !Path::new(&cwd).is_dir() {
            return Err(AgentError::new(
                ErrorCode::InvalidRequest,
                format!("cwd {cwd:?} is not an existing absolute directory"),
            ));
        }
        let mut merged = self.env.clone();
        for (k, v) in env {
            merged.retain(|(key, _)| *key != k);
            merged.push((k, v));
        }
        Ok(Setup { env: merged, cwd })
    }

    fn insert(&self, id: String, lang: Lang, setup: Setup) -> Result<Arc<Context>, AgentError> {
        let mut map = lock(&self.map);
        if let Some(existing) = map.get(&id) {
            return Ok(existing.clone());
        }
        if map.len() >= MAX_CONTEXTS {
            return Err(AgentError::new(
                ErrorCode::InvalidRequest,
                format!("a sandbox holds at most {MAX_CONTEXTS} contexts; delete one first"),
            ));
        }
        let ctx = Arc::new(Context {
            id: id.clone(),
            lang,
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
            count: AtomicU64::new(0),
            pgid: AtomicI32::new(0),
            generation: AtomicU64::new(0),
            deleted: AtomicBool::new(false),
            slot: tokio::sync::Mutex::new(None),
            setup,
        });
        map.insert(id, ctx.clone());
        Ok(ctx)
    }

    fn remove_if_same(&self, ctx: &Arc<Context>) {
        let mut map = lock(&self.map);
        if map.get(&ctx.id).is_some_and(|c| Arc::ptr_eq(c, ctx)) {
            map.remove(&ctx.id);
        }
    }

    /// The context, or for [`DEFAULT_CONTEXT`] a new Python context on first use.
    fn get(&self, id: &str) -> Result<Arc<Context>, AgentError> {
        if let Some(ctx) = lock(&self.map).get(id) {
            return Ok(ctx.clone());
        }
        if id == DEFAULT_CONTEXT {
            let setup = self.setup(None, Vec::new())?;
            return self.insert(id.into(), Lang::Python, setup);
        }
        Err(not_found(id))
    }

    fn list(&self) -> Vec<ContextInfo> {
        let mut all: Vec<Arc<Context>> = lock(&self.map).values().cloned().collect();
        all.sort_by_key(|c| c.seq);
        all.iter().map(|c| c.info()).collect()
    }

    fn delete(&self, id: &str) -> Result<(), AgentError> {
        let ctx = lock(&self.map).remove(id).ok_or_else(|| not_found(id))?;
        ctx.deleted.store(true, Ordering::SeqCst);
        // A run in progress holds the interpreter; killing the group ends it now. An idle
        // interpreter dies with the context's last reference too.
        kill_group(ctx.pgid.swap(0, Ordering::SeqCst), libc::SIGKILL);
        Ok(())
    }

    async fn restart(&self, id: &str) -> Result<ContextInfo, AgentError> {
        let ctx = self.get(id)?;
        let generation = ctx.generation.load(Ordering::SeqCst);
        // Kill before queueing for the slot, so a run in progress ends instead of being waited
        // for; the run then restarts the interpreter itself.
        kill_group(ctx.pgid.load(Ordering::SeqCst), libc::SIGKILL);
        let mut slot = ctx.slot.lock().await;
        if ctx.deleted.load(Ordering::SeqCst) {
            return Err(not_found(id));
        }
        if slot.is_none() || ctx.generation.load(Ordering::SeqCst) == generation {
            self.start(&ctx, &mut slot).await?;
        }
        Ok(ctx.info())
    }

    /// Replaces the context's interpreter (if any) with a fresh one.
    async fn start(&self, ctx: &Context, slot: &mut Option<Interp>) -> Result<(), AgentError> {
        if let Some(old) = slot.take() {
            ctx.pgid.store(0, Ordering::SeqCst);
            drop(old);
        }
        ctx.count.store(0, Ordering::SeqCst);
        let interp = Interp::start(ctx.lang, &ctx.setup.env, &ctx.setup.cwd).await?;
        ctx.generation.fetch_add(1, Ordering::SeqCst);
        ctx.pgid.store(interp.pid, Ordering::SeqCst);
        if ctx.deleted.load(Ordering::SeqCst) {
            // Deleted while starting: `interp` is dropped (killed) here.
            ctx.pgid.store(0, Ordering::SeqCst);
            return Err(not_found(&ctx.id));
        }
        *slot = Some(interp);
        Ok(())
    }

    async fn run(
        &self,
        id: &str,
        code: String,
        timeout_ms: Option<u64>,
        env: &[(String, String)],
        rx: &mut mpsc::Receiver<ToAgent>,
        out: &Outbox,
    ) -> Result<RunOutcome, AgentError> {
        if code.len() > MAX_CODE_BYTES {
            return Err(AgentError::new(
                ErrorCode::TooLarge,
                format!("code is limited to {MAX_CODE_BYTES} bytes"),
            ));
        }
        // The interpreter could not take such a variable (and must not die trying).
        if !valid_env(env) {
            return Err(bad_env());
        }
        let ctx = self.get(id)?;
        let mut slot = ctx.slot.lock().await;
        if ctx.deleted.load(Ordering::SeqCst) {
            return Err(not_found(id));
        }
        let began = Instant::now();
        // An interpreter that died while idle (OOM-killed, `os._exit` in a thread, ...) is
        // replaced before the run; its state is gone, which the outcome reports.
        let mut restarted = false;
        if slot.as_ref().is_none_or(Interp::has_exited) {
            restarted = ctx.generation.load(Ordering::SeqCst) > 0;
            self.start(&ctx, &mut slot).await?;
        }
        let Some(interp) = slot.as_mut() else {
            return Err(AgentError::new(ErrorCode::Io, "context has no interpreter"));
        };
        let n = ctx.count.fetch_add(1, Ordering::SeqCst) + 1;
        let timeout = timeout_ms.map(Duration::from_millis);
        let end = interp.run(n, &code, env, timeout, rx, out).await?;
        let mut outcome = RunOutcome {
            results: end.results.list,
            error: end.error,
            execution_count: n,
            timed_out: false,
            restarted,
            duration_ms: 0,
        };
        match end.how {
            How::Done => {}
            How::TimedOut | How::Died | How::Abandoned => {
                if let Some(dead) = slot.take() {
                    ctx.pgid.store(0, Ordering::SeqCst);
                    drop(dead);
                }
                if ctx.deleted.load(Ordering::SeqCst) {
                    return Err(AgentError::new(
                        ErrorCode::NotFound,
                        format!("context {id} was deleted during the run"),
                    ));
                }
                outcome.restarted = true;
                outcome.timed_out = end.how == How::TimedOut;
                let (name, value) = match end.how {
                    How::TimedOut => (
                        "TimeoutError",
                        format!(
                            "the run exceeded its timeout of {} ms; the interpreter was restarted \
                             and its state is lost",
                            timeout_ms.unwrap_or_default()
                        ),
                    ),
                    _ => (
                        "InterpreterDied",
                        "the interpreter exited or was killed during the run; it was restarted \
                         and its state is lost"
                            .to_string(),
                    ),
                };
                outcome.error = Some(RunError {
                    name: name.into(),
                    value,
                    traceback: String::new(),
                });
                // A failed start leaves the slot empty; the next run tries again.
                if let Err(e) = self.start(&ctx, &mut slot).await {
                    tracing::warn!(context = %id, error = %e, "interpreter restart failed");
                }
            }
        }
        outcome.duration_ms = began.elapsed().as_millis() as u64;
        Ok(outcome)
    }
}

struct Context {
    id: String,
    lang: Lang,
    /// Creation order, for listing.
    seq: u64,
    count: AtomicU64,
    /// Process group of the current interpreter (0: none), for kills that must not wait for
    /// the slot (a run holds it for as long as it runs).
    pgid: AtomicI32,
    /// Interpreters started so far; tells a restart whether someone else already restarted.
    generation: AtomicU64,
    deleted: AtomicBool,
    /// The interpreter; held for the whole of a run, so runs of one context queue up.
    slot: tokio::sync::Mutex<Option<Interp>>,
    setup: Setup,
}

/// What a context's interpreter starts with, every time it (re)starts.
struct Setup {
    env: Vec<(String, String)>,
    cwd: String,
}

fn valid_env(env: &[(String, String)]) -> bool {
    env.iter()
        .all(|(k, v)| !k.is_empty() && !k.contains(['=', '\0']) && !v.contains('\0'))
}

fn bad_env() -> AgentError {
    AgentError::new(
        ErrorCode::InvalidRequest,
        "environment names must be non-empty without '=' and no NUL bytes anywhere",
    )
}

impl Context {
    fn info(&self) -> ContextInfo {
        ContextInfo {
            context_id: self.id.clone(),
            language: self.lang.name().into(),
            execution_count: self.count.load(Ordering::SeqCst),
            cwd: self.setup.cwd.clone(),
        }
    }
}

pub async fn handle(
    contexts: &Contexts,
    msg: ToAgent,
    mut rx: mpsc::Receiver<ToAgent>,
    out: Outbox,
) {
    let answer = match msg {
        ToAgent::ContextCreate { language, cwd, env } => contexts
            .create(&language, cwd, env)
            .await
            .map(FromAgent::Context),
        ToAgent::ContextList => Ok(FromAgent::Contexts(contexts.list())),
        ToAgent::ContextDelete { context_id } => {
            contexts.delete(&context_id).map(|()| FromAgent::Done)
        }
        ToAgent::ContextRestart { context_id } => {
            contexts.restart(&context_id).await.map(FromAgent::Context)
        }
        ToAgent::ContextRun {
            context_id,
            code,
            timeout_ms,
            env,
        } => contexts
            .run(&context_id, code, timeout_ms, &env, &mut rx, &out)
            .await
            .map(FromAgent::RunDone),
        other => Err(AgentError::new(
            ErrorCode::InvalidRequest,
            format!("{} is not a context operation", other.kind()),
        )),
    };
    let _ = out.send(answer.unwrap_or_else(FromAgent::Error)).await;
}

fn not_found(id: &str) -> AgentError {
    AgentError::new(ErrorCode::NotFound, format!("no context {id:?}"))
}

fn new_id() -> String {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom writes at most `bytes.len()` bytes into `bytes`.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        // Ids only need to be unique within the sandbox.
        static FALLBACK: AtomicU64 = AtomicU64::new(1);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or_default();
        bytes = (t ^ FALLBACK.fetch_add(1, Ordering::Relaxed)).to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    Done,
    TimedOut,
    /// The interpreter exited or was killed.
    Died,
    /// The caller went away and the interpreter did not stop within the grace period.
    Abandoned,
}

struct RunEnd {
    how: How,
    results: Results,
    error: Option<RunError>,
}

/// Rich outputs of a run, bounded in number and total size.
#[derive(Default)]
struct Results {
    list: Vec<RichResult>,
    used: usize,
}

impl Results {
    fn push(&mut self, r: RichResult) {
        if self.list.len() >= MAX_RESULTS {
            return;
        }
        let size = rich_size(&r);
        if self.used + size <= RESULT_BUDGET {
            self.used += size;
            self.list.push(r);
            return;
        }
        self.note(
            r.is_main_result,
            format!("[output of {size} bytes omitted: over this run's result budget]"),
        );
    }

    fn note(&mut self, is_main_result: bool, text: String) {
        if self.list.len() >= MAX_RESULTS || self.used + text.len() > RESULT_BUDGET + NOTE_SLACK {
            return;
        }
        self.used += text.len();
        self.list.push(RichResult {
            is_main_result,
            text: Some(text),
            ..Default::default()
        });
    }
}

fn rich_size(r: &RichResult) -> usize {
    [&r.text, &r.html, &r.markdown, &r.json, &r.png, &r.svg]
        .iter()
        .map(|f| f.as_ref().map_or(0, String::len))
        .sum()
}

/// What a driver says, one JSON object per line.
#[derive(Deserialize)]
struct Event {
    ev: String,
    #[serde(default)]
    n: u64,
    #[serde(default)]
    main: bool,
    #[serde(default)]
    data: Option<Mime>,
    #[serde(default)]
    error: Option<DriverError>,
}

#[derive(Deserialize)]
struct Mime {
    text: Option<String>,
    html: Option<String>,
    markdown: Option<String>,
    json: Option<String>,
    png: Option<String>,
    svg: Option<String>,
}

#[derive(Deserialize)]
struct DriverError {
    #[serde(default)]
    name: String,
    #[serde(default)]
    value: String,
    #[serde(default)]
    traceback: String,
}

#[derive(Serialize)]
struct Request<'a> {
    code: &'a str,
    n: u64,
    env: std::collections::BTreeMap<&'a str, &'a str>,
}

/// One running interpreter. Dropping it kills its process group.
struct Interp {
    pid: i32,
    /// pidfd: readable once the interpreter has exited.
    exited: Option<AsyncFd<OwnedFd>>,
    requests: pipe::Sender,
    events: LineReader,
    stdout: pipe::Receiver,
    stderr: pipe::Receiver,
}

impl Drop for Interp {
    fn drop(&mut self) {
        kill_group(self.pid, libc::SIGKILL);
    }
}

/// Kills a process group unless disarmed: covers the steps between fork and a complete
/// [`Interp`].
struct GroupGuard(i32);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        kill_group(self.0, libc::SIGKILL);
    }
}

impl Interp {
    async fn start(
        lang: Lang,
        env: &[(String, String)],
        workdir: &str,
    ) -> Result<Self, AgentError> {
        let spawn_err = |m: String| AgentError::new(ErrorCode::SpawnFailed, m);
        let program = find_program(lang.program(), env).ok_or_else(|| {
            spawn_err(format!(
                "no {} interpreter in this sandbox's PATH",
                lang.program()
            ))
        })?;
        let cstr = |s: &[u8]| {
            CString::new(s).map_err(|_| spawn_err("environment contains a NUL byte".into()))
        };
        let prog = cstr(program.as_os_str().as_bytes())?;
        let mut argv = vec![cstr(lang.program().as_bytes())?];
        for a in lang.args() {
            argv.push(cstr(a.as_bytes())?);
        }
        let envp = env
            .iter()
            .map(|(k, v)| cstr(format!("{k}={v}").as_bytes()))
            .collect::<Result<Vec<_>, _>>()?;
        let cwd = cstr(workdir.as_bytes())?;
        let driver = driver_file(lang.driver())
            .map_err(|e| spawn_err(format!("driver source file: {e}")))?;
        let forked =
            tokio::task::spawn_blocking(move || fork_exec(&prog, &argv, &envp, &cwd, &driver))
                .await
                .map_err(|e| spawn_err(format!("interpreter start failed: {e}")))?
                .map_err(|e| spawn_err(format!("cannot start {}: {e}", lang.program())))?;
        let guard = GroupGuard(forked.pid);
        let io = |e: std::io::Error| spawn_err(format!("interpreter pipes: {e}"));
        let mut interp = Interp {
            pid: forked.pid,
            // SAFETY: the OwnedFd keeps the pidfd open, unchanged, for the AsyncFd's lifetime.
            exited: forked.pidfd.and_then(|fd| unsafe {
                AsyncFd::register_with_interest(fd, Interest::READABLE).ok()
            }),
            requests: pipe::Sender::from_owned_fd(forked.requests).map_err(io)?,
            events: LineReader::new(pipe::Receiver::from_owned_fd(forked.events).map_err(io)?),
            stdout: pipe::Receiver::from_owned_fd(forked.stdout).map_err(io)?,
            stderr: pipe::Receiver::from_owned_fd(forked.stderr).map_err(io)?,
        };
        std::mem::forget(guard);
        interp.wait_ready(lang).await?;
        Ok(interp)
    }

    /// Waits for the driver's "ready", keeping the start of its stderr for the error message
    /// of an interpreter that fails to start (a broken image, a missing module...).
    async fn wait_ready(&mut self, lang: Lang) -> Result<(), AgentError> {
        let deadline = tokio::time::sleep(START_TIMEOUT);
        tokio::pin!(deadline);
        let mut errors = Vec::new();
        let mut buf = vec![0u8; CHUNK_BYTES];
        let mut sink = vec![0u8; CHUNK_BYTES];
        let (mut out_open, mut err_open) = (true, true);
        loop {
            tokio::select! {
                biased;
                line = self.events.next_line() => match line {
                    Ok(Some(Line::Full(bytes))) => {
                        if serde_json::from_slice::<Event>(&bytes).is_ok_and(|e| e.ev == "ready") {
                            return Ok(());
                        }
                    }
                    Ok(Some(Line::TooLong)) => {}
                    Ok(None) | Err(_) => break,
                },
                r = self.stderr.read(&mut buf), if err_open => match r {
                    Ok(n) if n > 0 => {
                        let room = STARTUP_STDERR.saturating_sub(errors.len());
                        errors.extend_from_slice(&buf[..n.min(room)]);
                    }
                    _ => err_open = false,
                },
                r = self.stdout.read(&mut sink), if out_open => {
                    if !matches!(r, Ok(n) if n > 0) {
                        out_open = false;
                    }
                }
                () = &mut deadline => {
                    return Err(AgentError::new(
                        ErrorCode::SpawnFailed,
                        format!("the {} interpreter did not start within {} s", lang.name(),
                            START_TIMEOUT.as_secs()),
                    ));
                }
            }
        }
        while errors.len() < STARTUP_STDERR {
            match self.stderr.try_read(&mut buf) {
                Ok(n) if n > 0 => {
                    let room = STARTUP_STDERR - errors.len();
                    errors.extend_from_slice(&buf[..n.min(room)]);
                }
                _ => break,
            }
        }
        Err(AgentError::new(
            ErrorCode::SpawnFailed,
            format!(
                "the {} interpreter exited during start-up: {}",
                lang.name(),
                String::from_utf8_lossy(&errors).trim()
            ),
        ))
    }

    fn has_exited(&self) -> bool {
        match &self.exited {
            Some(fd) => {
                let mut p = libc::pollfd {
                    fd: fd.get_ref().as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: poll reads and writes one pollfd we own; timeout 0 never blocks.
                unsafe { libc::poll(&mut p, 1, 0) > 0 }
            }
            // SAFETY: kill with signal 0 only checks for existence.
            None => unsafe { libc::kill(self.pid, 0) != 0 },
        }
    }

    async fn run(
        &mut self,
        n: u64,
        code: &str,
        env: &[(String, String)],
        timeout: Option<Duration>,
        rx: &mut mpsc::Receiver<ToAgent>,
        out: &Outbox,
    ) -> Result<RunEnd, AgentError> {
        let env = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut request = serde_json::to_vec(&Request { code, n, env })
            .map_err(|e| AgentError::new(ErrorCode::InvalidRequest, format!("code: {e}")))?;
        request.push(b'\n');
        // Whatever background work printed since the last run is not this run's output.
        let mut obuf = vec![0u8; CHUNK_BYTES];
        discard_pending(&self.stdout, &mut obuf);
        discard_pending(&self.stderr, &mut obuf);
        let mut ebuf = vec![0u8; CHUNK_BYTES];

        let pid = self.pid;
        let mut results = Results::default();
        let mut error = None;
        let mut sinks = Sinks::new(out);
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let mut grace: Option<tokio::time::Instant> = None;
        let mut control_open = true;
        let (mut out_open, mut err_open) = (true, true);
        let mut written = false;
        let write = self.requests.write_all(&request);
        tokio::pin!(write);
        let how = loop {
            tokio::select! {
                biased;
                r = &mut write, if !written => match r {
                    Ok(()) => written = true,
                    Err(_) => break How::Died,
                },
                line = self.events.next_line() => match line {
                    Ok(Some(Line::Full(bytes))) => {
                        let Ok(ev) = serde_json::from_slice::<Event>(&bytes) else { continue };
                        if ev.n != n {
                            continue;
                        }
                        match ev.ev.as_str() {
                            "display" => {
                                if let Some(m) = ev.data {
                                    results.push(rich(m, ev.main));
                                }
                            }
                            "done" => {
                                error = ev.error.map(run_error);
                                break How::Done;
                            }
                            _ => {}
                        }
                    }
                    Ok(Some(Line::TooLong)) => results.note(
                        false,
                        format!("[an output larger than {MAX_EVENT_LINE} bytes was dropped]"),
                    ),
                    Ok(None) | Err(_) => break How::Died,
                },
                r = self.stdout.read(&mut obuf), if out_open => match r {
                    Ok(k) if k > 0 => {
                        if !sinks.stdout(&obuf[..k]).await {
                            abandon(pid, &mut grace, &mut control_open);
                        }
                    }
                    _ => out_open = false,
                },
                r = self.stderr.read(&mut ebuf), if err_open => match r {
                    Ok(k) if k > 0 => {
                        if !sinks.stderr(&ebuf[..k]).await {
                            abandon(pid, &mut grace, &mut control_open);
                        }
                    }
                    _ => err_open = false,
                },
                () = exited(self.exited.as_ref()) => break How::Died,
                () = sleep_until(deadline) => break How::TimedOut,
                () = sleep_until(grace) => break How::Abandoned,
                msg = rx.recv(), if control_open => match msg {
                    Some(ToAgent::Signal(sig)) if (1..=64).contains(&sig) => kill_group(pid, sig),
                    Some(ToAgent::Cancel) | None => abandon(pid, &mut grace, &mut control_open),
                    Some(_) => {}
                },
            }
        };
        if how != How::Done {
            // Partial output stays in the pipes after a kill; collect it before answering.
            kill_group(pid, libc::SIGKILL);
        }
        sinks.drain_stdout(&self.stdout, &mut obuf).await;
        sinks.drain_stderr(&self.stderr, &mut ebuf).await;
        Ok(RunEnd {
            how,
            results,
            error,
        })
    }
}

/// Interrupts a run nobody waits for any more; it gets [`CANCEL_GRACE`] to finish, so an
/// interruptible run keeps its context's state.
fn abandon(pid: i32, grace: &mut Option<tokio::time::Instant>, control_open: &mut bool) {
    *control_open = false;
    if grace.is_none() {
        kill_group(pid, libc::SIGINT);
        *grace = Some(tokio::time::Instant::now() + CANCEL_GRACE);
    }
}

/// Forwards a run's stdout/stderr to the caller, each bounded by [`OUTPUT_LIMIT`].
struct Sinks<'a> {
    out: &'a Outbox,
    stdout_sent: usize,
    stderr_sent: usize,
    /// The caller is gone: output is read (so writers do not block) and dropped.
    gone: bool,
}

impl<'a> Sinks<'a> {
    fn new(out: &'a Outbox) -> Self {
        Self {
            out,
            stdout_sent: 0,
            stderr_sent: 0,
            gone: false,
        }
    }

    async fn stdout(&mut self, data: &[u8]) -> bool {
        let sent = &mut self.stdout_sent;
        Self::forward(self.out, &mut self.gone, sent, data, FromAgent::Stdout).await
    }

    async fn stderr(&mut self, data: &[u8]) -> bool {
        let sent = &mut self.stderr_sent;
        Self::forward(self.out, &mut self.gone, sent, data, FromAgent::Stderr).await
    }

    async fn forward(
        out: &Outbox,
        gone: &mut bool,
        sent: &mut usize,
        data: &[u8],
        wrap: fn(Vec<u8>) -> FromAgent,
    ) -> bool {
        let take = data.len().min(OUTPUT_LIMIT.saturating_sub(*sent));
        if *gone || take == 0 {
            return !*gone;
        }
        *sent += take;
        // Awaiting is the back-pressure: a slow caller slows the interpreter's writes.
        if out.send(wrap(data[..take].to_vec())).await.is_err() {
            *gone = true;
        }
        !*gone
    }

    async fn drain_stdout(&mut self, r: &pipe::Receiver, buf: &mut [u8]) {
        for _ in 0..DRAIN_READS {
            match r.try_read(buf) {
                Ok(k) if k > 0 => {
                    if !self.stdout(&buf[..k]).await {
                        return;
                    }
                }
                _ => return,
            }
        }
    }

    async fn drain_stderr(&mut self, r: &pipe::Receiver, buf: &mut [u8]) {
        for _ in 0..DRAIN_READS {
            match r.try_read(buf) {
                Ok(k) if k > 0 => {
                    if !self.stderr(&buf[..k]).await {
                        return;
                    }
                }
                _ => return,
            }
        }
    }
}

fn discard_pending(r: &pipe::Receiver, buf: &mut [u8]) {
    for _ in 0..DRAIN_READS {
        if !matches!(r.try_read(buf), Ok(k) if k > 0) {
            return;
        }
    }
}

fn rich(m: Mime, main: bool) -> RichResult {
    RichResult {
        is_main_result: main,
        text: m.text,
        html: m.html,
        markdown: m.markdown,
        json: m.json,
        png: m.png,
        svg: m.svg,
    }
}

fn run_error(e: DriverError) -> RunError {
    RunError {
        name: clip(e.name, MAX_ERROR_NAME),
        value: clip(e.value, MAX_ERROR_VALUE),
        traceback: clip(e.traceback, MAX_TRACEBACK),
    }
}

fn clip(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

async fn exited(pidfd: Option<&AsyncFd<OwnedFd>>) {
    if let Some(fd) = pidfd {
        if fd.readable().await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

fn kill_group(pgid: i32, sig: i32) {
    if pgid <= 0 {
        return; // -0 and -(-1) would reach far more than one interpreter
    }
    // SAFETY: kill takes plain integers. ESRCH (already gone) is the expected race.
    unsafe {
        libc::kill(-pgid, sig);
    }
}

enum Line {
    Full(Vec<u8>),
    TooLong,
}

/// Splits a driver's events into lines, never holding more than [`MAX_EVENT_LINE`] bytes.
/// Cancel-safe: a read interrupted by `select!` loses nothing.
struct LineReader {
    r: pipe::Receiver,
    chunk: Vec<u8>,
    partial: Vec<u8>,
    skipping: bool,
    lines: VecDeque<Line>,
}

impl LineReader {
    fn new(r: pipe::Receiver) -> Self {
        Self {
            r,
            chunk: vec![0u8; CHUNK_BYTES],
            partial: Vec::new(),
            skipping: false,
            lines: VecDeque::new(),
        }
    }

    async fn next_line(&mut self) -> std::io::Result<Option<Line>> {
        loop {
            if let Some(line) = self.lines.pop_front() {
                return Ok(Some(line));
            }
            let n = self.r.read(&mut self.chunk).await?;
            if n == 0 {
                return Ok(None);
            }
            self.absorb(n);
        }
    }

    fn absorb(&mut self, n: usize) {
        let mut data = &self.chunk[..n];
        while let Some(pos) = data.iter().position(|&b| b == b'\n') {
            let line = &data[..pos];
            if self.skipping || self.partial.len() + line.len() > MAX_EVENT_LINE {
                self.skipping = false;
                self.partial.clear();
                self.lines.push_back(Line::TooLong);
            } else {
                self.partial.extend_from_slice(line);
                self.lines
                    .push_back(Line::Full(std::mem::take(&mut self.partial)));
            }
            data = &data[pos + 1..];
        }
        if self.skipping {
            return;
        }
        if self.partial.len() + data.len() > MAX_EVENT_LINE {
            self.partial = Vec::new();
            self.skipping = true;
        } else {
            self.partial.extend_from_slice(data);
        }
    }
}

/// `program` as an executable file: as given when it has a slash, else the first match along
/// the PATH of `env`.
fn find_program(program: &str, env: &[(String, String)]) -> Option<PathBuf> {
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let p = PathBuf::from(program);
        return executable(&p).then_some(p);
    }
    let path = env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map_or("/usr/local/bin:/usr/bin:/bin", |(_, v)| v.as_str());
    path.split(':')
        .filter(|d| d.starts_with('/'))
        .map(|d| Path::new(d).join(program))
        .find(|p| executable(p))
}

struct Forked {
    pid: i32,
    pidfd: Option<OwnedFd>,
    requests: OwnedFd,
    events: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
}

/// A close-on-exec pipe whose ends sit at fd 10 or above, so the child's `dup2`s onto fds 0-4
/// can never overwrite a pipe end it has yet to move.
fn high_pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    Ok((
        rustix::io::fcntl_dupfd_cloexec(&r, 10)?,
        rustix::io::fcntl_dupfd_cloexec(&w, 10)?,
    ))
}

/// The driver's source in an anonymous, sealed file: the interpreter reads it from
/// [`DRIVER_FD`].
fn driver_file(source: &str) -> std::io::Result<OwnedFd> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd = rustix::fs::memfd_create(
        "koder-driver",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    let mut written = 0;
    while written < source.len() {
        written += rustix::io::write(&fd, &source.as_bytes()[written..])?;
    }
    rustix::fs::fcntl_add_seals(
        &fd,
        SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL,
    )?;
    // Above the fds the child moves its hand-overs onto, like the pipes.
    Ok(rustix::io::fcntl_dupfd_cloexec(&fd, 10)?)
}

/// Forks and execs the interpreter with requests on fd 3, events on fd 4, its driver's source on
/// fd 5, output pipes on fds 1/2 and an empty stdin, in a new session. A plain fork rather than `Command`: the agent's
/// reaper collects every child's status, so nothing here may wait for the child (std's spawn
/// does when exec fails), and `Command` cannot place descriptors at fixed numbers without
/// `pre_exec`. Exec failures come back through a close-on-exec pipe instead.
fn fork_exec(
    prog: &CString,
    argv: &[CString],
    envp: &[CString],
    cwd: &CString,
    driver: &OwnedFd,
) -> std::io::Result<Forked> {
    let (req_r, req_w) = high_pipe()?;
    let (ev_r, ev_w) = high_pipe()?;
    let (out_r, out_w) = high_pipe()?;
    let (err_r, err_w) = high_pipe()?;
    let (in_r, in_w) = high_pipe()?;
    let (fail_r, fail_w) = high_pipe()?;
    let argv_ptrs: Vec<*const libc::c_char> = argv
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp_ptrs: Vec<*const libc::c_char> = envp
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let fds = ChildFds {
        stdin: in_r.as_raw_fd(),
        stdout: out_w.as_raw_fd(),
        stderr: err_w.as_raw_fd(),
        requests: req_r.as_raw_fd(),
        events: ev_w.as_raw_fd(),
        driver: driver.as_raw_fd(),
        fail: fail_w.as_raw_fd(),
    };
    // SAFETY: the child only makes async-signal-safe calls on memory prepared before the fork
    // (no allocation, no locks) and ends in execve or _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: see above; every pointer stays valid in the child's copy of this frame.
        unsafe {
            exec_child(
                &fds,
                prog.as_ptr(),
                argv_ptrs.as_ptr(),
                envp_ptrs.as_ptr(),
                cwd.as_ptr(),
            )
        }
    }
    drop((req_r, ev_w, out_w, err_w, in_r, in_w, fail_w));
    // SAFETY: pidfd_open takes plain integers; the child cannot have been reaped yet unless it
    // already died, in which case this fails and the exec report says why.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: a non-negative result is a new descriptor that nothing else owns.
    let pidfd = (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw as RawFd) });
    let mut report = [0u8; 4];
    let mut got = 0;
    while got < report.len() {
        match rustix::io::read(&fail_r, &mut report[got..]) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    if got == report.len() {
        // The child has exited; the reaper collects it.
        return Err(std::io::Error::from_raw_os_error(i32::from_ne_bytes(
            report,
        )));
    }
    Ok(Forked {
        pid,
        pidfd,
        requests: req_w,
        events: ev_r,
        stdout: out_r,
        stderr: err_r,
    })
}

struct ChildFds {
    stdin: RawFd,
    stdout: RawFd,
    stderr: RawFd,
    requests: RawFd,
    events: RawFd,
    driver: RawFd,
    fail: RawFd,
}

/// Runs in the forked child: never returns.
///
/// # Safety
/// Only between fork and exec; the pointers must be NUL-terminated arrays of C strings.
unsafe fn exec_child(
    fds: &ChildFds,
    prog: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
) -> ! {
    let mut empty: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut empty);
    libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
    // The agent ignores SIGPIPE; an ignored disposition would survive exec.
    libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    libc::setsid();
    let moves = [
        (fds.stdin, 0),
        (fds.stdout, 1),
        (fds.stderr, 2),
        (fds.requests, 3),
        (fds.events, 4),
        (fds.driver, DRIVER_FD),
    ];
    for (from, to) in moves {
        if libc::dup2(from, to) < 0 {
            fail_child(fds.fail);
        }
    }
    // Requests, events and the driver on 3-5 are the interpreter's explicit hand-over (the
    // bootstrap closes 5); nothing else passes.
    if crate::child::before_exec(DRIVER_FD + 1).is_err() {
        fail_child(fds.fail);
    }
    if libc::chdir(cwd) != 0 {
        fail_child(fds.fail);
    }
    libc::execve(prog, argv, envp);
    fail_child(fds.fail)
}

/// # Safety
/// Only in the forked child.
unsafe fn fail_child(fd: RawFd) -> ! {
    let errno = *libc::__errno_location();
    let bytes = errno.to_ne_bytes();
    libc::write(fd, bytes.as_ptr().cast(), bytes.len());
    libc::_exit(127)
}
