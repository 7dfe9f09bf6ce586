//! The official E2B Python SDK against the daemon: `commands.run("true")` interleaved batch by
//! batch with native JSON execs, and time to interactive (create → first `node -v` answered)
//! one after the other and 50 at once, each against the host's own `node -v` measured
//! interleaved in the same run. The SDK runs from the venv scripts/bench.sh and
//! scripts/e2b-tests.sh make (`/var/cache/koder-sandbox-test/e2b-venv`); without it the rows
//! say n/a.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use crate::host;
use crate::phases::{self, Ctx, RawExec};
use crate::report::{Row, Status};
use crate::stats::{fmt_ms, Summary};

const DRIVER: &str = include_str!("e2b_driver.py");

/// The venv's python when `--e2b-python` is not given: the one the project's scripts make in
/// the test cache.
pub fn default_python() -> PathBuf {
    PathBuf::from("/var/cache/koder-sandbox-test/e2b-venv/bin/python")
}

/// The driver process; killed (it is ours) if still running when dropped.
struct Driver {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Driver {
    fn start(python: &Path, ctx: &Ctx<'_>) -> Result<Driver> {
        let script = ctx.d.dir.join("e2b_driver.py");
        std::fs::write(&script, DRIVER)?;
        let mut child = Command::new(python)
            .arg(&script)
            .env("E2B_API_URL", &ctx.d.base)
            .env("E2B_SANDBOX_URL", &ctx.d.base)
            .env("E2B_API_KEY", &ctx.d.key)
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", python.display()))?;
        let stdin = child.stdin.take().context("driver stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("driver stdout")?);
        Ok(Driver {
            child,
            stdin,
            stdout,
        })
    }

    fn call(&mut self, req: Value) -> Result<Value> {
        writeln!(self.stdin, "{req}")?;
        self.stdin.flush()?;
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!("the E2B driver exited (request {req})");
        }
        let v: Value = serde_json::from_str(&line).context("E2B driver answer")?;
        if let Some(e) = v.get("error") {
            bail!(
                "E2B driver, {}: {}",
                req["op"],
                e.as_str().unwrap_or_default()
            );
        }
        Ok(v)
    }

    fn samples(&mut self, op: &str, n: usize) -> Result<Vec<Duration>> {
        let v = self.call(json!({"op": op, "n": n}))?;
        v["ms"]
            .as_array()
            .ok_or_else(|| anyhow!("E2B driver answer without ms: {v}"))?
            .iter()
            .map(|m| {
                m.as_f64()
                    .map(|ms| Duration::from_secs_f64(ms / 1e3))
                    .ok_or_else(|| anyhow!("bad sample {m}"))
            })
            .collect()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", json!({"op": "close"}));
        let _ = self.stdin.flush();
        let began = Instant::now();
        while began.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const RUN_NAME: &str =
    "E2B Python SDK `sandbox.commands.run(\"true\")` (batches interleaved with native JSON execs)";
const NODE_NAME: &str = "`node -v` on the host (interleaved with the sequential E2B creates)";
const TTI_NAME: &str =
    "time to interactive via the E2B SDK: `Sandbox.create()` → first `commands.run(\"node -v\")` answered, one at a time (warm pool refilled between)";
const NODE_BURST_NAME: &str = "`node -v` on the host, 50 at once";
const TTI_BURST_NAME: &str =
    "time to interactive via the E2B SDK, 50 at once (threads released together)";

const TTI_POOLED_NAME: &str =
    "time to interactive via the E2B SDK, 50 at once again, once the pool grew to the first burst";

/// Commands.run and time to interactive one at a time, on the daemon with the fixed pool.
pub async fn run(ctx: &Ctx<'_>, python: &Path, rows: &mut Vec<Row>) {
    let Some(mut driver) = driver_or_rows(
        ctx,
        python,
        &[
            ("e2b_run", RUN_NAME),
            ("host_node", NODE_NAME),
            ("e2b_tti", TTI_NAME),
        ],
        rows,
    ) else {
        return;
    };
    if let Err(e) = commands_run(ctx, &mut driver, rows).await {
        rows.push(Row::error("e2b_run", RUN_NAME, &e));
    }
    if let Err(e) = tti_sequential(ctx, &mut driver, rows).await {
        rows.push(Row::error("e2b_tti", TTI_NAME, &e));
    }
}

/// Time to interactive 50 at once, on a daemon whose pool grows with demand (`min` 2, `max`
/// above the burst): the first burst finds 2 warm sandboxes and makes the pool grow to its
/// size; the second, once the pool has grown (as a second burst within the pool's demand
/// window would find it), is served from it.
pub async fn bursts(ctx: &Ctx<'_>, python: &Path, rows: &mut Vec<Row>) {
    let Some(mut driver) = driver_or_rows(
        ctx,
        python,
        &[
            ("host_node_burst", NODE_BURST_NAME),
            ("e2b_tti_burst", TTI_BURST_NAME),
            ("e2b_tti_burst_pooled", TTI_POOLED_NAME),
        ],
        rows,
    ) else {
        return;
    };
    if let Err(e) = tti_bursts(ctx, &mut driver, rows).await {
        rows.push(Row::error("e2b_tti_burst", TTI_BURST_NAME, &e));
    }
}

/// The driver, or `None` with a row for each of `rows_of` saying why not.
fn driver_or_rows(
    ctx: &Ctx<'_>,
    python: &Path,
    rows_of: &[(&'static str, &'static str)],
    rows: &mut Vec<Row>,
) -> Option<Driver> {
    let missing = if !python.exists() {
        Some(format!(
            "no E2B SDK venv at {}; scripts/bench.sh makes it",
            python.display()
        ))
    } else {
        match Command::new(python).args(["-c", "import e2b"]).output() {
            Ok(o) if o.status.success() => None,
            _ => Some(format!("{} cannot import e2b", python.display())),
        }
    };
    if let Some(why) = missing {
        for (id, name) in rows_of {
            rows.push(Row::not_available(id, *name, &why));
        }
        return None;
    }
    match Driver::start(python, ctx) {
        Ok(d) => Some(d),
        Err(e) => {
            let (id, name) = rows_of[0];
            rows.push(Row::error(id, name, &e));
            None
        }
    }
}

async fn commands_run(ctx: &Ctx<'_>, driver: &mut Driver, rows: &mut Vec<Row>) -> Result<()> {
    driver.call(json!({"op": "open"}))?;
    let client = ctx.d.client()?;
    let session = client.create_session(&phases::create_req("bash")).await?;
    let result = async {
        // The SDK's `commands.run("true")` is `/bin/bash -l -c true` as `user`: the same exec
        // natively is the baseline; a bare `/bin/true` is shown beside it.
        let same = json!({"cmd": ["/bin/bash", "-l", "-c", "true"], "user": "user"});
        let natives = [
            RawExec::with_body(ctx, &client, session.id(), same)?,
            RawExec::new(ctx, &client, session.id(), &["/bin/true"])?,
        ];
        let batch = ctx.s.e2b_batch.max(1);
        let rounds = ctx.s.e2b_run_samples.div_ceil(batch);
        // Warm-up of all, untimed.
        driver.samples("run", ctx.s.warmup.min(10))?;
        for raw in &natives {
            for _ in 0..ctx.s.warmup.min(10) {
                raw.json().await?;
            }
        }
        let mut e2b = Vec::new();
        let mut native = [Vec::new(), Vec::new()];
        for r in 0..rounds {
            let sdk_first = r % 2 == 0;
            for sdk in [sdk_first, !sdk_first] {
                if sdk {
                    e2b.extend(driver.samples("run", batch)?);
                    continue;
                }
                for _ in 0..batch {
                    for (raw, samples) in natives.iter().zip(native.iter_mut()) {
                        let t = Instant::now();
                        raw.json().await?;
                        samples.push(t.elapsed());
                    }
                }
            }
        }
        Ok::<_, anyhow::Error>((e2b, native))
    }
    .await;
    let _ = client.destroy_session(session.id()).await;
    let (e2b, [same, bare]) = result?;
    let e2b = Summary::of(&e2b).context("no E2B samples")?;
    let same = Summary::of(&same).context("no native samples")?;
    let bare = Summary::of(&bare).context("no native samples")?;
    let limit = 1.5 * same.p50_ms;
    rows.push(
        Row::info(
            "e2b_run",
            RUN_NAME,
            format!(
                "{} = {:.2} × the same exec natively (`bash -l -c true` as `user`, p50 {}); \
                 {:.2} × a native `/bin/true` (p50 {})",
                e2b.display(),
                e2b.p50_ms / same.p50_ms,
                fmt_ms(same.p50_ms),
                e2b.p50_ms / bare.p50_ms,
                fmt_ms(bare.p50_ms)
            ),
        )
        .target(
            format!("p50 ≤ 1.5 × the same native JSON exec = {}", fmt_ms(limit)),
            Status::verdict(e2b.p50_ms <= limit),
        )
        .data(json!({"e2b": e2b, "native_json": same, "native_true": bare})),
    );
    Ok(())
}

fn node_cmd() -> Command {
    let mut c = Command::new(host::NODE);
    c.arg("-v");
    c
}

async fn tti_sequential(ctx: &Ctx<'_>, driver: &mut Driver, rows: &mut Vec<Row>) -> Result<()> {
    let http = reqwest::Client::new();
    let n = ctx.s.tti_samples;
    // Warm-up: one of each, untimed.
    host::time_one(node_cmd())?;
    ctx.d
        .wait_pool(&http, "bash", ctx.s.warm_pool_bash, phases::POOL_WAIT)
        .await?;
    driver.samples("tti", 1)?;
    let (mut tti, mut node) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        ctx.d
            .wait_pool(&http, "bash", ctx.s.warm_pool_bash, phases::POOL_WAIT)
            .await?;
        // The SDK asks for internet access (its default): its sandbox comes from the lane
        // started with egress, which the warm-up's create asked the pool to fill.
        ctx.d
            .wait_lane(&http, "bash", true, 1, phases::POOL_WAIT)
            .await?;
        for sdk in [i % 2 == 0, i % 2 != 0] {
            if sdk {
                tti.extend(driver.samples("tti", 1)?);
            } else {
                node.push(host::time_one(node_cmd())?);
            }
        }
    }
    let node = Summary::of(&node).context("no node samples")?;
    let tti = Summary::of(&tti).context("no TTI samples")?;
    rows.push(
        Row::info("host_node", NODE_NAME, node.display())
            .target("baseline", Status::Info)
            .data(json!(node)),
    );
    let limit = 1.5 * node.p50_ms;
    rows.push(
        Row::info(
            "e2b_tti",
            TTI_NAME,
            format!(
                "{} = {:.2} × host `node -v`",
                tti.display(),
                tti.p50_ms / node.p50_ms
            ),
        )
        .target(
            format!("p50 ≤ 1.5 × host `node -v` = {}", fmt_ms(limit)),
            Status::verdict(tti.p50_ms <= limit),
        )
        .data(json!(tti)),
    );
    Ok(())
}

/// p95 of a burst: host burst, SDK burst, host burst (the host's samples pooled); then, once
/// the pool's lane with egress (the SDK's sandboxes) holds a sandbox per client, the SDK burst
/// again.
async fn tti_bursts(ctx: &Ctx<'_>, driver: &mut Driver, rows: &mut Vec<Row>) -> Result<()> {
    let n = ctx.s.tti_burst;
    let mut node = host::burst(n, node_cmd)?;
    let first = driver.samples("burst", n)?;
    node.extend(host::burst(n, node_cmd)?);
    let http = reqwest::Client::new();
    ctx.d
        .wait_lane(&http, "bash", true, n as u64, Duration::from_secs(300))
        .await?;
    let pooled = driver.samples("burst", n)?;
    let node = Summary::of(&node).context("no node samples")?;
    rows.push(
        Row::info(
            "host_node_burst",
            NODE_BURST_NAME.replace("50", &n.to_string()),
            format!(
                "p95 {} · p50 {} (n={}, two bursts)",
                fmt_ms(node.p95_ms),
                fmt_ms(node.p50_ms),
                node.n
            ),
        )
        .target("baseline", Status::Info)
        .data(json!(node)),
    );
    for (id, name, samples) in [
        ("e2b_tti_burst", TTI_BURST_NAME, first),
        ("e2b_tti_burst_pooled", TTI_POOLED_NAME, pooled),
    ] {
        let tti = Summary::of(&samples).context("no burst samples")?;
        let limit = 2.0 * node.p95_ms;
        rows.push(
            Row::info(
                id,
                name.replace("50", &n.to_string()),
                format!(
                    "p95 {} · p50 {} (n={}) = {:.2} × host p95",
                    fmt_ms(tti.p95_ms),
                    fmt_ms(tti.p50_ms),
                    tti.n,
                    tti.p95_ms / node.p95_ms
                ),
            )
            .target(
                format!("p95 ≤ 2 × host p95 = {}", fmt_ms(limit)),
                Status::verdict(tti.p95_ms <= limit),
            )
            .data(json!(tti)),
        );
    }
    Ok(())
}
