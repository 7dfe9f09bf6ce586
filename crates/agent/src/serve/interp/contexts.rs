//! The registry of a sandbox's contexts and each context's life: create, restart, delete, and
//! turning a run's end into its outcome (restarting the interpreter when the run killed it).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use koder_agent_protocol::{
    AgentError, ContextInfo, ErrorCode, ExecTiming, RunError, RunOutcome, ToAgent, TraceContext,
};
use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::lang::Lang;
use super::limits::{DEFAULT_CONTEXT, MAX_CODE_BYTES, MAX_CONTEXTS};
use super::process::Interp;
use super::run::How;
use crate::outbox::Outbox;
use crate::serve::exec::ExecDefaults;
use crate::serve::exec::{kill_group, micros};

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

    pub(super) async fn create(
        &self,
        language: &str,
        cwd: Option<String>,
        env: Vec<(String, String)>,
        id: Option<String>,
    ) -> Result<ContextInfo, AgentError> {
        let lang = Lang::parse(language).ok_or_else(|| {
            AgentError::new(
                ErrorCode::InvalidRequest,
                format!("contexts run python, node, typescript, bash, java or r, not {language:?}"),
            )
        })?;
        let setup = self.setup(cwd, env)?;
        let ctx = self.insert(id.unwrap_or_else(new_id), lang, setup)?;
        if ctx.lang != lang {
            return Err(AgentError::new(
                ErrorCode::InvalidRequest,
                format!("context {} exists and runs {}", ctx.id, ctx.lang.name()),
            ));
        }
        // A named context that is there already (started, or being started by a run or
        // another create) is answered as it is.
        let fresh = ctx.generation.load(Ordering::SeqCst) == 0;
        let mut slot = match ctx.slot.try_lock() {
            Ok(slot) if fresh => slot,
            _ => return Ok(ctx.info()),
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
        let mut map = self.map.lock();
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
        let mut map = self.map.lock();
        if map.get(&ctx.id).is_some_and(|c| Arc::ptr_eq(c, ctx)) {
            map.remove(&ctx.id);
        }
    }

    /// The context, or for [`DEFAULT_CONTEXT`] a new Python context on first use, with
    /// `default_env` added to its environment.
    fn get(
        &self,
        id: &str,
        default_env: Vec<(String, String)>,
    ) -> Result<Arc<Context>, AgentError> {
        if let Some(ctx) = self.map.lock().get(id) {
            return Ok(ctx.clone());
        }
        if id == DEFAULT_CONTEXT {
            let setup = self.setup(None, default_env)?;
            return self.insert(id.into(), Lang::Python, setup);
        }
        Err(not_found(id))
    }

    pub(super) fn list(&self) -> Vec<ContextInfo> {
        let mut all: Vec<Arc<Context>> = self.map.lock().values().cloned().collect();
        all.sort_by_key(|c| c.seq);
        all.iter().map(|c| c.info()).collect()
    }

    pub(super) fn delete(&self, id: &str) -> Result<(), AgentError> {
        let ctx = self.map.lock().remove(id).ok_or_else(|| not_found(id))?;
        ctx.deleted.store(true, Ordering::SeqCst);
        // A run in progress holds the interpreter; killing the group ends it now. An idle
        // interpreter dies with the context's last reference too.
        kill_group(ctx.pgid.swap(0, Ordering::SeqCst), libc::SIGKILL);
        Ok(())
    }

    pub(super) async fn restart(&self, id: &str) -> Result<ContextInfo, AgentError> {
        let ctx = self.get(id, Vec::new())?;
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
    pub(super) async fn start(
        &self,
        ctx: &Context,
        slot: &mut Option<Interp>,
    ) -> Result<(), AgentError> {
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

    pub(super) async fn run(
        &self,
        id: &str,
        run: Run,
        rx: &mut mpsc::Receiver<ToAgent>,
        out: &Outbox,
    ) -> Result<RunOutcome, AgentError> {
        let arrived = Instant::now();
        let Run {
            code,
            timeout_ms,
            env,
            trace,
            default_env,
        } = run;
        let env = env.as_slice();
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
        let ctx = self.get(id, default_env)?;
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
        let env: Vec<(String, String)> = crate::serve::exec::trace_env(trace, env)
            .into_iter()
            .chain(env.iter().cloned())
            .collect();
        let started = Instant::now();
        let end = interp.run(n, &code, &env, timeout, rx, out).await?;
        let ended = Instant::now();
        let mut outcome = RunOutcome {
            results: end.results.list,
            error: end.error,
            execution_count: n,
            timed_out: false,
            restarted,
            duration_ms: 0,
            timing: ExecTiming::default(),
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
        outcome.timing = ExecTiming {
            spawn_us: micros(started - arrived),
            run_us: micros(ended - started),
            since_exit_us: micros(ended.elapsed()),
        };
        Ok(outcome)
    }
}

/// What a `ContextRun` asks for.
pub(super) struct Run {
    pub code: String,
    pub timeout_ms: Option<u64>,
    /// Set for this run only.
    pub env: Vec<(String, String)>,
    pub trace: Option<TraceContext>,
    /// The `default` context's own variables, if this run makes it.
    pub default_env: Vec<(String, String)>,
}

pub(super) struct Context {
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
