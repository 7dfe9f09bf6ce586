//! The measurements. Each phase pushes its rows; a phase that fails pushes an error row and the
//! run goes on.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use futures::{StreamExt, TryStreamExt};
use koder_sdk::{Client, CreateSession, ExecRequest, Session, SessionState};
use serde_json::{json, Value};

use crate::daemon::{cgroup_mem, memory_cgroup, CgroupMem, Daemon};
use crate::host::{self, ProcMem};
use crate::report::{Row, Status};
use crate::stats::{fmt_ms, mib, Summary};
use crate::Settings;

/// Row order of the table.
pub const ORDER: &[&str] = &[
    "host_spawn",
    "bwrap_spawn",
    "runc_exec",
    "exec_true",
    "exec_stream",
    "grpc_rest_exec",
    "grpc_exec",
    "cluster_exec_local",
    "cluster_exec_forwarded",
    "cluster_creates",
    "e2b_run",
    "host_node",
    "e2b_tti",
    "host_node_burst",
    "e2b_tti_burst",
    "e2b_tti_burst_pooled",
    "create_warm",
    "create_cold",
    "destroy",
    "create_exec_destroy",
    "python_host",
    "python_exec",
    "interp_warm",
    "host_spawn_throughput",
    "exec_throughput",
    "create_throughput",
    "density_memory",
    "density_breakdown",
    "density_held",
    "density_create",
    "density_teardown",
    "upload",
    "download",
    "snapshot",
    "create_from_snapshot",
    "restore",
    "fork",
    "fork_one",
    "fork_files",
    "fork_one_files",
    "pause_resume",
    "image_pack_build",
    "image_pack_cached",
    "image_template_build",
    "image_template_cached",
    "image_create_warm",
    "image_create_cold",
    "microvm_create_cold",
    "microvm_create_warm",
    "microvm_exec",
    "microvm_python",
    "microvm_memory",
];

/// Host figures the targets are relative to.
#[derive(Debug, Default)]
pub struct Baselines {
    pub spawn_p50_ms: Option<f64>,
    pub bwrap_p50_ms: Option<f64>,
    pub runc_p50_ms: Option<f64>,
    /// JSON exec of `/bin/true`, from the exec phase.
    pub json_exec_p50_ms: Option<f64>,
    pub python_p50_ms: Option<f64>,
}

pub struct Ctx<'a> {
    pub d: &'a Daemon,
    pub s: &'a Settings,
    pub base: &'a Baselines,
}

pub(crate) const TRUE: &str = "/bin/true";
/// Idle sessions the density target asks for.
pub const DENSITY_TARGET: usize = 2000;
const SESSION_TIMEOUT_S: u64 = 3600;
pub const POOL_WAIT: Duration = Duration::from_secs(60);

pub fn create_req(language: &str) -> CreateSession {
    CreateSession {
        language: Some(language.into()),
        timeout_s: Some(SESSION_TIMEOUT_S),
        ..Default::default()
    }
}

fn argv(cmd: &[&str]) -> ExecRequest {
    ExecRequest {
        cmd: Some(cmd.iter().map(|s| s.to_string()).collect()),
        ..Default::default()
    }
}

/// Runs `cmd` in the session and insists on exit 0.
async fn exec_ok(client: &Client, id: &str, req: &ExecRequest) -> Result<()> {
    let r = client.exec(id, req).await?;
    if r.exit_code != Some(0) {
        bail!(
            "exec {:?} ended with {:?}/{:?}: {}",
            req.cmd,
            r.exit_code,
            r.signal,
            r.stderr.chars().take(200).collect::<String>()
        );
    }
    Ok(())
}

/// `warmup` untimed then `n` timed runs of `op`.
async fn time_n<F, Fut>(warmup: usize, n: usize, mut op: F) -> Result<Vec<Duration>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    for _ in 0..warmup {
        op().await?;
    }
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let began = Instant::now();
        op().await?;
        samples.push(began.elapsed());
    }
    Ok(samples)
}

pub(crate) fn summary(samples: &[Duration]) -> Result<Summary> {
    Summary::of(samples).ok_or_else(|| anyhow!("no samples"))
}

// ---- host ----

/// Host baselines taken before any daemon runs: host python always; host spawn, bwrap and
/// `runc exec` only with `standalone` (otherwise the exec phase takes them interleaved with
/// its own samples).
pub fn host_baselines(
    s: &Settings,
    work_root: &Path,
    standalone: bool,
    rows: &mut Vec<Row>,
) -> Baselines {
    let mut b = Baselines::default();
    if standalone {
        let mut sampler = HostSampler::new(work_root);
        for _ in 0..s.warmup.min(20) {
            sampler.sample(false);
        }
        for _ in 0..s.spawn_samples {
            sampler.sample(true);
        }
        sampler.rows(&mut b, rows, "");
    }
    let py_name = "`python3 -c pass` on the host";
    if Path::new(host::PYTHON).exists() {
        let n = s.python_samples;
        match host::time_spawns(
            || {
                let mut c = Command::new(host::PYTHON);
                c.args(["-c", "pass"]);
                c
            },
            2,
            n,
        )
        .and_then(|v| summary(&v))
        {
            Ok(sum) => {
                b.python_p50_ms = Some(sum.p50_ms);
                rows.push(
                    Row::info("python_host", py_name, sum.display())
                        .target("baseline", Status::Info)
                        .data(json!(sum)),
                );
            }
            Err(e) => rows.push(Row::error("python_host", py_name, &e)),
        }
    } else {
        rows.push(Row::not_available(
            "python_host",
            py_name,
            "no /usr/bin/python3",
        ));
    }
    b
}

// ---- exec ----

/// Raw exec requests over one keep-alive connection pool: JSON answers or SSE streams.
pub struct RawExec {
    http: reqwest::Client,
    url: reqwest::Url,
    key: String,
    body: Value,
}

impl RawExec {
    pub fn new(ctx: &Ctx<'_>, client: &Client, sid: &str, cmd: &[&str]) -> Result<RawExec> {
        Self::with_body(ctx, client, sid, json!({ "cmd": cmd }))
    }

    /// An exec request of any shape (`{"cmd", "user"}`...).
    pub fn with_body(ctx: &Ctx<'_>, client: &Client, sid: &str, body: Value) -> Result<RawExec> {
        Ok(RawExec {
            http: reqwest::Client::builder().build()?,
            url: client.url(&["v1", "sandbox", "sessions", sid, "exec"])?,
            key: ctx.d.key.clone(),
            body,
        })
    }

    /// `POST .../exec` answered with the JSON result; insists on exit 0.
    pub async fn json(&self) -> Result<()> {
        let resp = self
            .http
            .post(self.url.clone())
            .bearer_auth(&self.key)
            .header(reqwest::header::ACCEPT, "application/json")
            .json(&self.body)
            .send()
            .await?;
        let status = resp.status();
        let body = resp.bytes().await?;
        if !status.is_success() {
            bail!("exec answered {status}: {}", String::from_utf8_lossy(&body));
        }
        let v: Value = serde_json::from_slice(&body).context("exec answer")?;
        if v.get("exit_code").and_then(Value::as_i64) != Some(0) {
            bail!("exec did not exit 0: {}", truncate_json(&v));
        }
        Ok(())
    }

    /// The same with `Accept: text/event-stream`: read to the end of the stream, which must
    /// carry an `exit` event with exit code 0.
    pub async fn streamed(&self) -> Result<()> {
        let resp = self
            .http
            .post(self.url.clone())
            .bearer_auth(&self.key)
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .json(&self.body)
            .send()
            .await?;
        let status = resp.status();
        let body = resp.bytes().await?;
        let text = String::from_utf8_lossy(&body);
        if !status.is_success() {
            bail!("streamed exec answered {status}: {text}");
        }
        let mut event = "";
        let mut exit = None;
        for line in text.lines() {
            if let Some(e) = line.strip_prefix("event:") {
                event = e.trim();
            } else if let Some(d) = line.strip_prefix("data:") {
                if event == "exit" {
                    exit = serde_json::from_str::<Value>(d.trim()).ok();
                }
            }
        }
        match exit {
            Some(v) if v.get("exit_code").and_then(Value::as_i64) == Some(0) => Ok(()),
            Some(v) => bail!("streamed exec did not exit 0: {}", truncate_json(&v)),
            None => bail!(
                "streamed exec: no exit event in {:?}",
                text.chars().take(200).collect::<String>()
            ),
        }
    }
}

/// Targets of the form "p50 ≤ f × what": one verdict over all the available baselines, each
/// limit shown with its own ✓/✗.
fn ratio_targets(p50: f64, targets: &[(f64, &str, Option<f64>)]) -> (String, Status) {
    let mut parts = Vec::new();
    let (mut any, mut all) = (false, true);
    for (f, what, base) in targets {
        match base {
            Some(b) if *b > 0.0 => {
                let limit = f * b;
                let ok = p50 <= limit;
                any = true;
                all &= ok;
                parts.push(format!(
                    "≤ {f} × {what} = {} {}",
                    fmt_ms(limit),
                    if ok { "✓" } else { "✗" }
                ));
            }
            _ => parts.push(format!("≤ {f} × {what} (baseline n/a)")),
        }
    }
    let status = if any {
        Status::verdict(all)
    } else {
        Status::NotAvailable
    };
    (format!("p50 {}", parts.join("; ")), status)
}

/// "p50 … = 2.10 × spawn, 0.40 × bwrap".
pub(crate) fn with_ratios(sum: &Summary, bases: &[(&str, Option<f64>)]) -> String {
    let r: Vec<String> = bases
        .iter()
        .filter_map(|(what, b)| {
            b.filter(|b| *b > 0.0)
                .map(|b| format!("{:.2} × {what}", sum.p50_ms / b))
        })
        .collect();
    if r.is_empty() {
        sum.display()
    } else {
        format!("{} = {}", sum.display(), r.join(", "))
    }
}

const SPAWN_NAME: &str = "`/bin/true`, plain spawn on the host (`std::process::Command`)";
const BWRAP_NAME: &str =
    "`/bin/true` in a one-shot `bwrap --unshare-all --die-with-parent ...` sandbox";
const RUNC_NAME: &str =
    "`runc exec` of `/bin/true` into a running container (Debian's runc, `/usr` bound read-only)";

/// Host spawn, bwrap one-shot and `runc exec` samples taken one of each per call, so they can
/// be interleaved with the daemon's samples.
struct HostSampler {
    runc: Option<Result<host::RuncContainer>>,
    bwrap: bool,
    spawn: Vec<Duration>,
    bwrap_s: Vec<Duration>,
    runc_s: Vec<Duration>,
    err: Option<anyhow::Error>,
}

impl HostSampler {
    fn new(work_root: &Path) -> HostSampler {
        HostSampler {
            runc: host::runc_bin().map(|b| host::RuncContainer::start(&b, work_root)),
            bwrap: Path::new(host::BWRAP).exists(),
            spawn: Vec::new(),
            bwrap_s: Vec::new(),
            runc_s: Vec::new(),
            err: None,
        }
    }

    /// One sample of each baseline (`keep`: recorded, else warm-up).
    fn sample(&mut self, keep: bool) {
        if self.err.is_some() {
            return;
        }
        let r = (|| -> Result<()> {
            let t = host::time_one(Command::new(TRUE))?;
            if keep {
                self.spawn.push(t);
            }
            if self.bwrap {
                let t = host::time_one(host::bwrap_command(&[TRUE]))?;
                if keep {
                    self.bwrap_s.push(t);
                }
            }
            if let Some(Ok(c)) = &self.runc {
                let t = host::time_one(c.exec_true())?;
                if keep {
                    self.runc_s.push(t);
                }
            }
            Ok(())
        })();
        if let Err(e) = r {
            self.err = Some(e);
        }
    }

    /// Pushes the three baseline rows and records their p50s.
    fn rows(self, b: &mut Baselines, rows: &mut Vec<Row>, how: &str) {
        if let Some(e) = self.err {
            rows.push(Row::error("host_spawn", SPAWN_NAME, &e));
            return;
        }
        let push = |rows: &mut Vec<Row>, id: &'static str, name: &str, v: &[Duration]| {
            let sum = Summary::of(v)?;
            rows.push(
                Row::info(id, format!("{name}{how}"), sum.display())
                    .target("baseline", Status::Info)
                    .data(json!(sum)),
            );
            Some(sum.p50_ms)
        };
        b.spawn_p50_ms = push(rows, "host_spawn", SPAWN_NAME, &self.spawn);
        if self.bwrap {
            b.bwrap_p50_ms = push(rows, "bwrap_spawn", BWRAP_NAME, &self.bwrap_s);
        } else {
            rows.push(Row::not_available(
                "bwrap_spawn",
                BWRAP_NAME,
                "bubblewrap not installed; scripts/setup.sh installs it",
            ));
        }
        match self.runc {
            Some(Ok(_)) => b.runc_p50_ms = push(rows, "runc_exec", RUNC_NAME, &self.runc_s),
            Some(Err(e)) => rows.push(Row::error("runc_exec", RUNC_NAME, &e)),
            None => rows.push(Row::not_available(
                "runc_exec",
                RUNC_NAME,
                "runc not installed; scripts/bench.sh installs it",
            )),
        }
    }
}

/// Exec `/bin/true` as JSON and as an SSE stream, interleaved sample by sample (alternating
/// which goes first), with one host-spawn, one bwrap and one `runc exec` sample every
/// `exec_samples / spawn_samples` rounds; all ratios are against those interleaved baselines.
pub async fn exec_latency(ctx: &Ctx<'_>, base: &mut Baselines, rows: &mut Vec<Row>) {
    let name = "exec `/bin/true` in a live session (REST, keep-alive, JSON answer)";
    let sname = "streamed exec `/bin/true` (`Accept: text/event-stream`, keep-alive)";
    match exec_latency_inner(ctx).await {
        Ok((sampler, json_s, sse_s)) => {
            sampler.rows(base, rows, " — interleaved with the execs");
            match summary(&json_s) {
                Ok(sum) => {
                    base.json_exec_p50_ms = Some(sum.p50_ms);
                    let (target, status) = ratio_targets(
                        sum.p50_ms,
                        &[
                            (1.5, "spawn", base.spawn_p50_ms),
                            (0.25, "bwrap", base.bwrap_p50_ms),
                            (0.05, "runc exec", base.runc_p50_ms),
                        ],
                    );
                    rows.push(
                        Row::info(
                            "exec_true",
                            name,
                            with_ratios(
                                &sum,
                                &[
                                    ("spawn", base.spawn_p50_ms),
                                    ("bwrap", base.bwrap_p50_ms),
                                    ("runc exec", base.runc_p50_ms),
                                ],
                            ),
                        )
                        .target(target, status)
                        .data(json!(sum)),
                    );
                }
                Err(e) => rows.push(Row::error("exec_true", name, &e)),
            }
            match summary(&sse_s) {
                Ok(sum) => {
                    let (target, status) =
                        ratio_targets(sum.p50_ms, &[(1.2, "JSON exec", base.json_exec_p50_ms)]);
                    rows.push(
                        Row::info(
                            "exec_stream",
                            sname,
                            with_ratios(&sum, &[("JSON exec", base.json_exec_p50_ms)]),
                        )
                        .target(target, status)
                        .data(json!(sum)),
                    );
                }
                Err(e) => rows.push(Row::error("exec_stream", sname, &e)),
            }
        }
        Err(e) => rows.push(Row::error("exec_true", name, &e)),
    }
}

async fn exec_latency_inner(ctx: &Ctx<'_>) -> Result<(HostSampler, Vec<Duration>, Vec<Duration>)> {
    let client = ctx.d.client()?;
    let session = client.create_session(&create_req("bash")).await?;
    let result = async {
        let raw = RawExec::new(ctx, &client, session.id(), &[TRUE])?;
        let mut sampler = HostSampler::new(&ctx.d.dir);
        let n = ctx.s.exec_samples;
        let every = (n / ctx.s.spawn_samples.max(1)).max(1);
        for _ in 0..ctx.s.warmup {
            raw.json().await?;
            raw.streamed().await?;
        }
        for _ in 0..ctx.s.warmup.min(5) {
            sampler.sample(false);
        }
        let (mut js, mut ss) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for i in 0..n {
            for first_json in [i % 2 == 0, i % 2 != 0] {
                let t = Instant::now();
                if first_json {
                    raw.json().await?;
                    js.push(t.elapsed());
                } else {
                    raw.streamed().await?;
                    ss.push(t.elapsed());
                }
            }
            if i % every == 0 && sampler.spawn.len() < ctx.s.spawn_samples {
                sampler.sample(true);
            }
        }
        Ok((sampler, js, ss))
    }
    .await;
    let _ = client.destroy_session(session.id()).await;
    result
}

/// The pause before each sample of the "after a pause" rows: an agent's calls come with its
/// model's thinking between them, long enough for idle CPUs to sleep and for any fast path
/// that only lasts while it is used (the kernel's cgroup lock held ready for the next move,
/// ~30 ms) to lapse; a back-to-back loop hides what such a pause costs.
const PAUSE: Duration = Duration::from_millis(200);

/// Exec `/bin/true` after a pause, each sample interleaved with a host spawn after the same
/// pause (alternating which goes first).
pub async fn exec_after_pause(ctx: &Ctx<'_>, rows: &mut Vec<Row>) {
    let host = format!(
        "`/bin/true`, plain spawn on the host after a {} ms pause",
        PAUSE.as_millis()
    );
    let name = format!(
        "exec `/bin/true` in a live session after a {} ms pause (REST, keep-alive)",
        PAUSE.as_millis()
    );
    match exec_after_pause_inner(ctx).await {
        Ok((spawn, exec)) => {
            let ratio = [("spawn after the same pause", Some(spawn.p50_ms))];
            rows.push(
                Row::info(
                    "host_spawn_paused",
                    format!("{host} — interleaved with the execs"),
                    spawn.display(),
                )
                .target("baseline", Status::Info)
                .data(json!(spawn)),
            );
            rows.push(
                Row::info("exec_true_paused", name, with_ratios(&exec, &ratio))
                    .target("compare with the host", Status::Info)
                    .data(json!(exec)),
            );
        }
        Err(e) => rows.push(Row::error("exec_true_paused", name, &e)),
    }
}

/// The host spawns' and the execs' summaries.
async fn exec_after_pause_inner(ctx: &Ctx<'_>) -> Result<(Summary, Summary)> {
    let client = ctx.d.client()?;
    let session = client.create_session(&create_req("bash")).await?;
    let result = async {
        let raw = RawExec::new(ctx, &client, session.id(), &[TRUE])?;
        raw.json().await?;
        let n = ctx.s.paused_samples;
        let (mut spawns, mut execs) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for i in 0..n {
            for exec_first in [i % 2 == 0, i % 2 != 0] {
                tokio::time::sleep(PAUSE).await;
                if exec_first {
                    let t = Instant::now();
                    raw.json().await?;
                    execs.push(t.elapsed());
                } else {
                    spawns.push(host::time_one(Command::new(TRUE))?);
                }
            }
        }
        Ok((summary(&spawns)?, summary(&execs)?))
    }
    .await;
    let _ = client.destroy_session(session.id()).await;
    result
}

// ---- create ----

/// The line for an empty-pool create, back to back or after a pause.
const COLD_CREATE_P50_MS: f64 = 8.0;

fn cold_create_row(id: &'static str, name: impl Into<String>, create: &Summary) -> Row {
    Row::info(id, name, create.display())
        .target(
            format!("p50 ≤ {COLD_CREATE_P50_MS} ms"),
            Status::verdict(create.p50_ms <= COLD_CREATE_P50_MS),
        )
        .data(json!(create))
}

pub async fn warm_create(ctx: &Ctx<'_>, rows: &mut Vec<Row>) {
    let name = "session create, warm pool";
    match warm_create_inner(ctx, false).await {
        Ok(sum) => {
            let (target, status) =
                ratio_targets(sum.p50_ms, &[(0.25, "bwrap", ctx.base.bwrap_p50_ms)]);
            rows.push(
                Row::info(
                    "create_warm",
                    name,
                    with_ratios(&sum, &[("bwrap", ctx.base.bwrap_p50_ms)]),
                )
                .target(target, status)
                .data(json!(sum)),
            );
        }
        Err(e) => rows.push(Row::error("create_warm", name, &e)),
    }
    let name = "create + exec `/bin/true` + destroy (warm pool)";
    match warm_create_inner(ctx, true).await {
        Ok(sum) => rows.push(
            Row::info("create_exec_destroy", name, sum.display())
                .target("p50 ≤ 6 ms", Status::verdict(sum.p50_ms <= 6.0))
                .data(json!(sum)),
        ),
        Err(e) => rows.push(Row::error("create_exec_destroy", name, &e)),
    }
}

/// Creates from a full pool (waiting for the refill between samples, untimed); with `full`,
/// each sample is create + exec + destroy.
async fn warm_create_inner(ctx: &Ctx<'_>, full: bool) -> Result<Summary> {
    let client = ctx.d.client()?;
    let http = reqwest::Client::new();
    let req = create_req("bash");
    let exec = argv(&[TRUE]);
    let n = if full {
        ctx.s.ced_samples
    } else {
        ctx.s.create_samples
    };
    let mut samples = Vec::with_capacity(n);
    // One untimed round warms the HTTP connection and the daemon's code paths.
    for i in 0..n + 1 {
        ctx.d
            .wait_pool(&http, "bash", ctx.s.warm_pool_bash, POOL_WAIT)
            .await?;
        let began = Instant::now();
        let session = client.create_session(&req).await?;
        if full {
            exec_ok(&client, session.id(), &exec).await?;
            client.destroy_session(session.id()).await?;
        }
        let took = began.elapsed();
        if !full {
            client.destroy_session(session.id()).await?;
        }
        if i > 0 {
            samples.push(took);
        }
    }
    summary(&samples)
}

pub async fn cold_create(ctx: &Ctx<'_>, rows: &mut Vec<Row>) {
    let name = "session create, empty pool (`pool = {}`)";
    match cold_create_inner(ctx, ctx.s.create_samples, None).await {
        Ok((create, destroy)) => {
            rows.push(cold_create_row("create_cold", name, &create));
            rows.push(
                Row::info("destroy", "session destroy (`DELETE`)", destroy.display())
                    .data(json!(destroy)),
            );
        }
        Err(e) => rows.push(Row::error("create_cold", name, &e)),
    }
}

/// Empty-pool creates with a pause before each, as a user making one now and then does.
pub async fn cold_create_after_pause(ctx: &Ctx<'_>, rows: &mut Vec<Row>) {
    let name = format!(
        "session create, empty pool, after a {} ms pause",
        PAUSE.as_millis()
    );
    match cold_create_inner(ctx, ctx.s.paused_samples, Some(PAUSE)).await {
        Ok((create, _)) => rows.push(cold_create_row("create_cold_paused", name, &create)),
        Err(e) => rows.push(Row::error("create_cold_paused", name, &e)),
    }
}

/// `n` creates, each destroyed before the next, `pause` before each.
async fn cold_create_inner(
    ctx: &Ctx<'_>,
    n: usize,
    pause: Option<Duration>,
) -> Result<(Summary, Summary)> {
    let client = ctx.d.client()?;
    let req = create_req("bash");
    let (mut creates, mut destroys) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n + 1 {
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
        let began = Instant::now();
        let session = client.create_session(&req).await?;
        let created = began.elapsed();
        let began = Instant::now();
        client.destroy_session(session.id()).await?;
        if i > 0 {
            creates.push(created);
            destroys.push(began.elapsed());
        }
    }
    Ok((summary(&creates)?, summary(&destroys)?))
}

// ---- python ----

pub async fn python(ctx: &Ctx<'_>, rows: &mut Vec<Row>) {
    let name = "`python3 -c pass` exec in a session";
    match python_inner(ctx).await {
        Ok(sum) => {
            let mut result = sum.display();
            if let Some(h) = ctx.base.python_p50_ms {
                result.push_str(&format!("; p50 {:+.2} ms vs. host", sum.p50_ms - h));
            }
            rows.push(
                Row::info("python_exec", name, result)
                    .target("compare with the host", Status::Info)
                    .data(json!(sum)),
            );
        }
        Err(e) => rows.push(Row::error("python_exec", name, &e)),
    }
}

async fn python_inner(ctx: &Ctx<'_>) -> Result<Summary> {
    let client = ctx.d.client()?;
    let session = client.create_session(&create_req("python")).await?;
    let req = argv(&["python3", "-c", "pass"]);
    let samples = time_n(2, ctx.s.python_samples, || {
        exec_ok(&client, session.id(), &req)
    })
    .await;
    let _ = client.destroy_session(session.id()).await;
    summary(&samples?)
}

// ---- code interpreter ----

pub async fn interp(ctx: &Ctx<'_>, rows: &mut Vec<Row>) {
    let name = "warm interpreter `1+1` (code-interpreter context run)";
    match interp_inner(ctx).await {
        Ok(Some(sum)) => rows.push(
            Row::info("interp_warm", name, sum.display())
                .target("p50 ≤ 1 ms", Status::verdict(sum.p50_ms <= 1.0))
                .data(json!(sum)),
        ),
        Ok(None) => rows.push(
            Row::not_available("interp_warm", name, "not available")
                .target("p50 ≤ 1 ms", Status::NotAvailable),
        ),
        Err(e) => rows.push(Row::error("interp_warm", name, &e)),
    }
}

/// `None` when the daemon has no contexts endpoint (404/405/501).
async fn interp_inner(ctx: &Ctx<'_>) -> Result<Option<Summary>> {
    let client = ctx.d.client()?;
    let session = client.create_session(&create_req("python")).await?;
    let result = interp_run(ctx, &client, session.id()).await;
    let _ = client.destroy_session(session.id()).await;
    result
}

fn unavailable(status: reqwest::StatusCode) -> bool {
    matches!(status.as_u16(), 404 | 405 | 501)
}

async fn interp_run(ctx: &Ctx<'_>, client: &Client, sid: &str) -> Result<Option<Summary>> {
    let http = reqwest::Client::new();
    let contexts = client.url(&["v1", "sandbox", "sessions", sid, "contexts"])?;
    let resp = http
        .post(contexts.clone())
        .bearer_auth(&ctx.d.key)
        .header(reqwest::header::ACCEPT, "application/json")
        .json(&json!({"language": "python"}))
        .send()
        .await?;
    let status = resp.status();
    let body = resp.bytes().await?;
    if unavailable(status) {
        return Ok(None);
    }
    if !status.is_success() {
        bail!(
            "POST .../contexts answered {status}: {}",
            String::from_utf8_lossy(&body)
                .chars()
                .take(200)
                .collect::<String>()
        );
    }
    let v: Value = serde_json::from_slice(&body).context("context create answer")?;
    let cid = v
        .get("context_id")
        .or_else(|| v.get("id"))
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("context create answer has no context_id: {v}"))?
        .to_string();
    let run_url = client.url(&["v1", "sandbox", "sessions", sid, "contexts", &cid, "run"])?;
    let run = || async {
        let resp = http
            .post(run_url.clone())
            .bearer_auth(&ctx.d.key)
            .header(reqwest::header::ACCEPT, "application/json")
            .json(&json!({"code": "1+1"}))
            .send()
            .await?;
        let status = resp.status();
        let body = resp.bytes().await?;
        Ok::<_, anyhow::Error>((status, body))
    };
    let (status, body) = run().await?;
    if unavailable(status) {
        return Ok(None);
    }
    check_run(status, &body)?;
    // The first answer must show the value, so the timed runs measure real evaluations.
    let v: Value = serde_json::from_slice(&body).context("context run answer")?;
    let shows_two = v
        .get("results")
        .and_then(Value::as_array)
        .is_some_and(|rs| {
            rs.iter()
                .any(|r| r.get("text").and_then(Value::as_str) == Some("2"))
        })
        || v.get("stdout")
            .and_then(Value::as_str)
            .is_some_and(|o| o.trim() == "2");
    if !shows_two {
        bail!("`1+1` did not answer 2: {}", truncate_json(&v));
    }
    let samples = time_n(ctx.s.warmup, ctx.s.interp_samples, || async {
        let (status, body) = run().await?;
        check_run(status, &body)
    })
    .await?;
    let mut delete = contexts.clone();
    delete
        .path_segments_mut()
        .map_err(|()| anyhow!("base URL"))?
        .push(&cid);
    let _ = http.delete(delete).bearer_auth(&ctx.d.key).send().await;
    Ok(Some(summary(&samples)?))
}

fn truncate_json(v: &Value) -> String {
    v.to_string().chars().take(200).collect()
}

fn check_run(status: reqwest::StatusCode, body: &[u8]) -> Result<()> {
    if !status.is_success() {
        bail!(
            "context run answered {status}: {}",
            String::from_utf8_lossy(body)
                .chars()
                .take(200)
                .collect::<String>()
        );
    }
    let v: Value = serde_json::from_slice(body).context("context run answer")?;
    match v.get("error") {
        None | Some(Value::Null) => Ok(()),
        Some(err) => bail!("`1+1` raised: {err}"),
    }
}

// ---- throughput ----

pub async fn exec_throughput(ctx: &Ctx<'_>, rows: &mut Vec<Row>) {
    let s = ctx.s;
    let name = format!(
        "exec `/bin/true` throughput, {} concurrent clients × {} s",
        s.clients, s.duration_s
    );
    let hname = format!(
        "host: `/bin/true` spawned from {} threads (spawn + wait, loop), the same cores — half before, half after the daemon's run",
        s.clients
    );
    // The host's own rate brackets the daemon's: half the time before, half after.
    let half = s.duration() / 2;
    let before = host::spawn_throughput(s.clients, half);
    let daemon = exec_throughput_inner(ctx).await;
    let after = host::spawn_throughput(s.clients, half);
    let host_rate = match (before, after) {
        (Ok((n1, t1)), Ok((n2, t2))) => {
            let rate = (n1 + n2) as f64 / (t1 + t2).as_secs_f64().max(1e-9);
            rows.push(
                Row::info(
                    "host_spawn_throughput",
                    hname,
                    format!(
                        "{rate:.0} spawns/s ({n1} + {n2} spawns in {:.1} + {:.1} s)",
                        t1.as_secs_f64(),
                        t2.as_secs_f64()
                    ),
                )
                .target("baseline", Status::Info)
                .data(json!({"spawns_per_s": rate, "spawns": [n1, n2], "seconds": [t1.as_secs_f64(), t2.as_secs_f64()]})),
            );
            Some(rate)
        }
        (Err(e), _) | (_, Err(e)) => {
            rows.push(Row::error("host_spawn_throughput", hname, &e));
            None
        }
    };
    match daemon {
        Ok((rate, ok, errors, sum)) => {
            let (target, status) = match host_rate {
                Some(h) => (
                    format!("≥ 0.6 × host = {:.0} execs/s, 0 errors", 0.6 * h),
                    Status::verdict(rate >= 0.6 * h && errors == 0),
                ),
                None => (
                    "≥ 0.6 × host (baseline n/a)".to_string(),
                    Status::NotAvailable,
                ),
            };
            let ratio =
                host_rate.map_or_else(String::new, |h| format!(" = {:.2} × host", rate / h));
            rows.push(
                Row::info(
                    "exec_throughput",
                    name,
                    format!(
                        "{rate:.0} execs/s{ratio} ({ok} ok, {errors} errors; latency under load {})",
                        sum.display()
                    ),
                )
                .target(target, status)
                .data(json!({"execs_per_s": rate, "host_spawns_per_s": host_rate, "ok": ok, "errors": errors, "latency": sum})),
            )
        }
        Err(e) => rows.push(Row::error("exec_throughput", name, &e)),
    }
}

/// One session and one HTTP connection pool per client.
async fn exec_throughput_inner(ctx: &Ctx<'_>) -> Result<(f64, u64, u64, Summary)> {
    let s = ctx.s;
    let mut clients = Vec::with_capacity(s.clients);
    for _ in 0..s.clients {
        clients.push(ctx.d.client()?);
    }
    let req = create_req("bash");
    let created: Vec<Result<Session, koder_sdk::Error>> = futures::stream::iter(clients.iter())
        .map(|c| c.create_session(&req))
        .buffered(4)
        .collect()
        .await;
    let mut sessions = Vec::new();
    let mut first_err = None;
    for r in created {
        match r {
            Ok(sess) => sessions.push(sess),
            Err(e) => first_err = first_err.or(Some(e)),
        }
    }
    let result = async {
        if let Some(e) = first_err {
            return Err(anyhow!("creating the clients' sessions: {e}"));
        }
        let req = argv(&[TRUE]);
        // Every connection is up before the clock starts.
        futures::future::try_join_all(
            sessions
                .iter()
                .map(|sess| exec_ok(sess.client(), sess.id(), &req)),
        )
        .await?;
        let began = Instant::now();
        let deadline = began + s.duration();
        let per_client = futures::future::join_all(sessions.iter().map(|sess| {
            let req = &req;
            async move {
                let (mut lat, mut errors) = (Vec::new(), 0u64);
                while Instant::now() < deadline {
                    let t = Instant::now();
                    match exec_ok(sess.client(), sess.id(), req).await {
                        Ok(()) => lat.push(t.elapsed()),
                        Err(_) => errors += 1,
                    }
                }
                (lat, errors)
            }
        }))
        .await;
        let elapsed = began.elapsed().as_secs_f64();
        let mut all = Vec::new();
        let mut errors = 0;
        for (lat, e) in per_client {
            all.extend(lat);
            errors += e;
        }
        let ok = all.len() as u64;
        Ok((ok as f64 / elapsed, ok, errors, summary(&all)?))
    }
    .await;
    futures::future::join_all(sessions.into_iter().map(Session::destroy)).await;
    result
}

pub async fn create_throughput(ctx: &Ctx<'_>, rows: &mut Vec<Row>) {
    let s = ctx.s;
    let name = format!(
        "creates/s sustained ({} concurrent create→destroy loops × {} s, warm pool refilling)",
        s.create_workers, s.duration_s
    );
    match create_throughput_inner(ctx).await {
        Ok((rate, ok, errors, sum)) => rows.push(
            Row::info(
                "create_throughput",
                name,
                format!(
                    "{rate:.1} creates/s ({ok} ok, {errors} errors; create latency {})",
                    sum.display()
                ),
            )
            .data(
                json!({"creates_per_s": rate, "ok": ok, "errors": errors, "create_latency": sum}),
            ),
        ),
        Err(e) => rows.push(Row::error("create_throughput", name, &e)),
    }
}

async fn create_throughput_inner(ctx: &Ctx<'_>) -> Result<(f64, u64, u64, Summary)> {
    let s = ctx.s;
    let mut clients = Vec::with_capacity(s.create_workers);
    for _ in 0..s.create_workers {
        clients.push(ctx.d.client()?);
    }
    let req = create_req("bash");
    let began = Instant::now();
    let deadline = began + s.duration();
    let per_worker = futures::future::join_all(clients.iter().map(|c| {
        let req = &req;
        async move {
            let (mut lat, mut errors, mut last_err) = (Vec::new(), 0u64, None);
            while Instant::now() < deadline {
                let t = Instant::now();
                match c.create_session(req).await {
                    Ok(sess) => {
                        lat.push(t.elapsed());
                        if let Err(e) = sess.destroy().await {
                            errors += 1;
                            last_err = Some(e.to_string());
                        }
                    }
                    Err(e) => {
                        errors += 1;
                        last_err = Some(e.to_string());
                    }
                }
            }
            (lat, errors, last_err)
        }
    }))
    .await;
    let elapsed = began.elapsed().as_secs_f64();
    let (mut all, mut errors, mut last_err) = (Vec::new(), 0, None);
    for (lat, e, le) in per_worker {
        all.extend(lat);
        errors += e;
        last_err = last_err.or(le);
    }
    if all.is_empty() {
        bail!("no create succeeded: {}", last_err.unwrap_or_default());
    }
    let ok = all.len() as u64;
    Ok((ok as f64 / elapsed, ok, errors, summary(&all)?))
}

// ---- density ----

pub async fn density(ctx: &Ctx<'_>, rows: &mut Vec<Row>) {
    if let Err(e) = density_inner(ctx, rows).await {
        rows.push(Row::error(
            "density_memory",
            format!("{} idle sessions", ctx.s.density),
            &e,
        ));
    }
}

/// Memory readings taken before and after the sessions exist.
struct Snapshot {
    meminfo: BTreeMap<String, u64>,
    daemon: ProcMem,
    /// The daemon's own memory cgroup.
    daemon_cgroup: Option<CgroupMem>,
    /// Sum over the sandboxes' cgroups; their count; agent processes' RSS/PSS.
    sandboxes: CgroupMem,
    cgroups: usize,
    agents: usize,
    agent_mem: ProcMem,
}

impl Snapshot {
    fn take(d: &Daemon) -> Result<Snapshot> {
        let pid = d.pid().context("daemon not running")?;
        let mut snap = Snapshot {
            meminfo: host::meminfo()?,
            daemon: host::proc_mem(pid).unwrap_or_default(),
            daemon_cgroup: d
                .daemon_cgroup
                .as_ref()
                .and_then(|(dir, file)| cgroup_mem(dir, file)),
            sandboxes: CgroupMem::default(),
            cgroups: 0,
            agents: 0,
            agent_mem: ProcMem::default(),
        };
        if let Some((dir, file)) = memory_cgroup(&d.cgroup_parent) {
            for (mem, pids) in host::sandbox_cgroups(&dir, file) {
                snap.cgroups += 1;
                snap.sandboxes += mem;
                for pid in pids {
                    if let Some(m) = host::proc_mem(pid) {
                        snap.agents += 1;
                        snap.agent_mem.rss_kib += m.rss_kib;
                        snap.agent_mem.pss_kib += m.pss_kib;
                    }
                }
            }
        }
        Ok(snap)
    }

    fn kib(&self, key: &str) -> i64 {
        self.meminfo.get(key).copied().unwrap_or(0) as i64
    }
}

async fn density_inner(ctx: &Ctx<'_>, rows: &mut Vec<Row>) -> Result<()> {
    let s = ctx.s;
    let n = s.density;
    let client = ctx.d.client()?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = Snapshot::take(ctx.d)?;

    let req = create_req("bash");
    let began = Instant::now();
    let results: Vec<(Duration, Result<Session, koder_sdk::Error>)> = futures::stream::iter(0..n)
        .map(|_| {
            let (client, req) = (&client, &req);
            async move {
                let t = Instant::now();
                let r = client.create_session(req).await;
                (t.elapsed(), r)
            }
        })
        .buffer_unordered(s.density_concurrency)
        .collect()
        .await;
    let create_time = began.elapsed();
    let mut sessions = Vec::with_capacity(n);
    let mut lat = Vec::with_capacity(n);
    let mut create_errors = 0usize;
    let mut first_err = None;
    for (t, r) in results {
        match r {
            Ok(sess) => {
                lat.push(t);
                sessions.push(sess);
            }
            Err(e) => {
                create_errors += 1;
                first_err = first_err.or(Some(e.to_string()));
            }
        }
    }
    let outcome = density_measure(
        ctx,
        rows,
        &client,
        &sessions,
        before,
        (create_time, &lat, create_errors, first_err),
    )
    .await;

    // Teardown, timed.
    let began = Instant::now();
    let destroyed: Vec<Result<(), koder_sdk::Error>> = futures::stream::iter(sessions)
        .map(Session::destroy)
        .buffer_unordered(s.density_concurrency)
        .collect()
        .await;
    let destroy_errors = destroyed.iter().filter(|r| r.is_err()).count();
    let took = began.elapsed().as_secs_f64();
    let count = destroyed.len();
    rows.push(
        Row::info(
            "density_teardown",
            format!(
                "destroy {count} sessions ({} concurrent)",
                s.density_concurrency
            ),
            format!(
                "{took:.2} s ({:.1}/s, {destroy_errors} errors)",
                count as f64 / took.max(1e-9)
            ),
        )
        .data(json!({"seconds": took, "sessions": count, "errors": destroy_errors})),
    );
    outcome
}

type Created<'a> = (Duration, &'a [Duration], usize, Option<String>);

async fn density_measure(
    ctx: &Ctx<'_>,
    rows: &mut Vec<Row>,
    client: &Client,
    sessions: &[Session],
    before: Snapshot,
    (create_time, lat, create_errors, first_err): Created<'_>,
) -> Result<()> {
    let s = ctx.s;
    let n = s.density;
    let held = sessions.len();
    let lat_sum = Summary::of(lat);
    rows.push(
        Row::info(
            "density_create",
            format!("time to create {n} sessions ({} concurrent, empty pool)", s.density_concurrency),
            format!(
                "{:.2} s ({:.1} creates/s; per create {})",
                create_time.as_secs_f64(),
                held as f64 / create_time.as_secs_f64().max(1e-9),
                lat_sum.map_or_else(|| "-".into(), |l| l.display())
            ),
        )
        .data(json!({"seconds": create_time.as_secs_f64(), "created": held, "errors": create_errors, "latency": lat_sum})),
    );

    // Let lazy allocations and the reaper settle before reading memory.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = Snapshot::take(ctx.d)?;
    let per = |x: f64| if held == 0 { 0.0 } else { x / held as f64 };
    // Accounted: the working set (usage less inactive page cache) of the sandboxes' cgroups
    // plus the growth of the daemon's own cgroup (agent clones before they join their cgroup,
    // disk images, page cache, daemon heap).
    let delta = |f: fn(&CgroupMem) -> u64| {
        let sandboxes = f(&after.sandboxes) as f64 - f(&before.sandboxes) as f64;
        let daemon = match (&before.daemon_cgroup, &after.daemon_cgroup) {
            (Some(b), Some(a)) => Some(f(a) as f64 - f(b) as f64),
            _ => None,
        };
        (sandboxes, daemon)
    };
    let (sb_ws, dm_ws) = delta(|m| m.working_set);
    let (sb_usage, dm_usage) = delta(|m| m.usage);
    let accounted_mib = mib(per(sb_ws + dm_ws.unwrap_or(0.0)));
    let charged_mib = mib(per(sb_usage + dm_usage.unwrap_or(0.0)));
    // Machine-wide: everything, including kernel memory charged to no cgroup, but also whatever
    // else the machine did meanwhile (and reclaimable cache counts as available).
    let avail_drop_kib = (before.kib("MemAvailable") - after.kib("MemAvailable")) as f64;
    let global_mib = per(avail_drop_kib) / 1024.0;
    let kernel_keys = ["Slab", "SUnreclaim", "PageTables", "KernelStack", "Percpu"];
    let kernel_delta: BTreeMap<String, i64> = kernel_keys
        .iter()
        .map(|k| (k.to_string(), after.kib(k) - before.kib(k)))
        .collect();
    let kernel_unreclaimable: i64 = ["SUnreclaim", "PageTables", "KernelStack", "Percpu"]
        .iter()
        .map(|k| kernel_delta.get(*k).copied().unwrap_or(0))
        .sum();
    rows.push(
        Row::info(
            "density_memory",
            format!("host memory per idle session ({held} idle)"),
            format!(
                "{accounted_mib:.2} MiB working set (sandbox cgroups + daemon cgroup growth; {charged_mib:.2} MiB with reclaimable cache); machine-wide MemAvailable drop {global_mib:.2} MiB"
            ),
        )
        .target(
            "≤ 1 MiB",
            if held == 0 {
                Status::Error
            } else {
                Status::verdict(accounted_mib <= 1.0)
            },
        )
        .data(json!({
            "working_set_mib_per_session": accounted_mib,
            "charged_mib_per_session": charged_mib,
            "mem_available_drop_mib_per_session": global_mib,
            "sandbox_cgroups": [before.sandboxes, after.sandboxes],
            "daemon_cgroup": [before.daemon_cgroup, after.daemon_cgroup],
            "mem_available_kib": [before.kib("MemAvailable"), after.kib("MemAvailable")],
            "sessions": held,
        })),
    );
    let daemon_rss_delta = after.daemon.rss_kib as f64 - before.daemon.rss_kib as f64;
    let (sb_anon, dm_anon) = delta(|m| m.anon);
    let (sb_file, dm_file) = delta(|m| m.file);
    let (sb_kernel, dm_kernel) = delta(|m| m.kernel);
    let mibs = |x: f64| format!("{:.2}", mib(per(x)));
    let opt = |x: Option<f64>| x.map_or_else(|| "n/a".into(), mibs);
    rows.push(
        Row::info(
            "density_breakdown",
            "… per session, MiB: agent RSS / PSS; sandbox cgroup anon / file / kernel; daemon cgroup anon / file / kernel; machine-wide unreclaimable kernel growth",
            format!(
                "agent {:.2} / {:.2}; sandbox {} / {} / {}; daemon {} / {} / {}; kernel {:.2}",
                per(after.agent_mem.rss_kib as f64) / 1024.0,
                per(after.agent_mem.pss_kib as f64) / 1024.0,
                mibs(sb_anon),
                mibs(sb_file),
                mibs(sb_kernel),
                opt(dm_anon),
                opt(dm_file),
                opt(dm_kernel),
                per(kernel_unreclaimable as f64) / 1024.0,
            ),
        )
        .data(json!({
            "agents": after.agents,
            "cgroups": after.cgroups,
            "agent_rss_kib_total": after.agent_mem.rss_kib,
            "agent_pss_kib_total": after.agent_mem.pss_kib,
            "daemon_rss_kib": [before.daemon.rss_kib, after.daemon.rss_kib],
            "daemon_rss_kib_per_session": per(daemon_rss_delta),
            "daemon_pss_kib": [before.daemon.pss_kib, after.daemon.pss_kib],
            "kernel_kib_delta": kernel_delta,
        })),
    );

    // Held: listed as running, and every one answers an exec.
    let listed = client
        .list_sessions()
        .await?
        .iter()
        .filter(|x| x.state == SessionState::Running)
        .count();
    let req = argv(&[TRUE]);
    let execs: Vec<Result<()>> = futures::stream::iter(sessions)
        .map(|sess| {
            let req = &req;
            async move { exec_ok(client, sess.id(), req).await }
        })
        .buffer_unordered(s.density_concurrency)
        .collect()
        .await;
    let exec_errors = execs.iter().filter(|r| r.is_err()).count();
    let first_exec_err = execs
        .into_iter()
        .find_map(Result::err)
        .map(|e| e.to_string());
    let errors = create_errors + exec_errors;
    let mut result = format!(
        "{held}/{n} created, {listed} listed running, {} answered an exec; {errors} errors",
        held - exec_errors
    );
    if let Some(e) = first_err.as_ref().or(first_exec_err.as_ref()) {
        result.push_str(&format!(
            " (first: {})",
            e.chars().take(160).collect::<String>()
        ));
    }
    let status = if errors > 0 || listed < held {
        Status::Fail
    } else if n >= DENSITY_TARGET {
        Status::Pass
    } else {
        Status::Info
    };
    rows.push(
        Row::info("density_held", format!("{n} idle sessions held"), result)
            .target(
                format!("{DENSITY_TARGET} held, every one answers an exec, 0 errors"),
                status,
            )
            .data(json!({"requested": n, "created": held, "listed_running": listed, "create_errors": create_errors, "exec_errors": exec_errors})),
    );
    Ok(())
}

// ---- files ----

pub async fn files(ctx: &Ctx<'_>, rows: &mut Vec<Row>) {
    let size_mib = ctx.s.file_bytes as f64 / (1024.0 * 1024.0);
    match files_inner(ctx).await {
        Ok((up, down)) => {
            rows.push(
                Row::info(
                    "upload",
                    format!("file upload, {size_mib:.0} MiB (`PUT .../files`)"),
                    format!("{:.0} MiB/s ({:.2} s)", size_mib / up, up),
                )
                .data(json!({"mib": size_mib, "seconds": up, "mib_per_s": size_mib / up})),
            );
            rows.push(
                Row::info(
                    "download",
                    format!("file download, {size_mib:.0} MiB (`GET .../files`)"),
                    format!("{:.0} MiB/s ({:.2} s)", size_mib / down, down),
                )
                .data(json!({"mib": size_mib, "seconds": down, "mib_per_s": size_mib / down})),
            );
        }
        Err(e) => rows.push(Row::error("upload", "file upload/download", &e)),
    }
}

async fn files_inner(ctx: &Ctx<'_>) -> Result<(f64, f64)> {
    let client = ctx.d.client()?;
    let session = client.create_session(&create_req("bash")).await?;
    let result = files_run(ctx, &session).await;
    let _ = client.destroy_session(session.id()).await;
    result
}

async fn files_run(ctx: &Ctx<'_>, session: &Session) -> Result<(f64, f64)> {
    let len = ctx.s.file_bytes as usize;
    // Not all zeros and not trivially periodic, so nothing on the way can shortcut it.
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_right(13) as u8)
        .collect();
    let checksum = fnv(&data);
    let data = bytes::Bytes::from(data);
    let path = "/workspace/bench.bin";
    let began = Instant::now();
    let entry = session.upload(path, data).await?;
    let up = began.elapsed().as_secs_f64();
    if entry.size != len as u64 {
        bail!("uploaded {} bytes, the daemon reports {}", len, entry.size);
    }
    let began = Instant::now();
    let stream = session.download_stream(path).await?;
    let (got, sum) = stream
        .try_fold((0usize, FNV_OFFSET), |(n, h), chunk| async move {
            Ok((n + chunk.len(), fnv_update(h, &chunk)))
        })
        .await?;
    let down = began.elapsed().as_secs_f64();
    if got != len || sum != checksum {
        bail!("downloaded {got} bytes (checksum {sum:x}), uploaded {len} ({checksum:x})");
    }
    let _ = session.remove(path, false).await;
    Ok((up, down))
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

fn fnv_update(mut h: u64, data: &[u8]) -> u64 {
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

fn fnv(data: &[u8]) -> u64 {
    fnv_update(FNV_OFFSET, data)
}
