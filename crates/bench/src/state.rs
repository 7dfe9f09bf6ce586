//! State that lasts: snapshot of a session holding new files, create from the snapshot,
//! restore, fork, and a freezer pause→resume round trip, through the REST API.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use reqwest::{Client, Method};
use serde_json::{json, Value};

use crate::phases::Ctx;
use crate::report::{Row, Status};
use crate::stats::Summary;

/// Copies per fork sample (the per-copy time is the fork's time over this).
const FORK_COPIES: usize = 4;
/// Files the session's new data is spread over.
const FILES: u64 = 100;

struct Api<'a> {
    http: Client,
    base: &'a str,
    key: &'a str,
}

impl Api<'_> {
    async fn call(&self, method: Method, path: &str, body: Value) -> Result<Value> {
        let mut req = self
            .http
            .request(method, format!("{}/v1/sandbox{path}", self.base))
            .bearer_auth(self.key);
        if !body.is_null() {
            req = req.json(&body);
        }
        let resp = req.send().await?;
        let status = resp.status();
        let text = resp.text().await?;
        if !status.is_success() {
            bail!("{path}: {status}: {text}");
        }
        Ok(if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text)?
        })
    }

    async fn timed(&self, method: Method, path: &str, body: Value) -> Result<(Value, Duration)> {
        let began = Instant::now();
        let v = self.call(method, path, body).await?;
        Ok((v, began.elapsed()))
    }

    async fn session(&self, body: Value) -> Result<String> {
        let v = self.call(Method::POST, "/sessions", body).await?;
        Ok(v["id"].as_str().context("session id")?.to_string())
    }

    async fn delete(&self, id: &str) {
        let _ = self
            .http
            .delete(format!("{}/v1/sandbox/sessions/{id}", self.base))
            .bearer_auth(self.key)
            .send()
            .await;
    }
}

struct Samples {
    snapshot: Vec<Duration>,
    from_snapshot: Vec<Duration>,
    restore: Vec<Duration>,
    forks: Forks,
    pause_resume: Vec<Duration>,
    size_bytes: u64,
}

/// A row of `samples` (p50 held to `limit_ms` when given).
fn row(id: &'static str, name: String, samples: &[Duration], limit_ms: Option<f64>) -> Row {
    match Summary::of(samples) {
        Some(sum) => {
            let row = Row::info(id, name, sum.display()).data(json!(sum));
            match limit_ms {
                Some(limit) => row.target(
                    format!("p50 ≤ {limit} ms"),
                    Status::verdict(sum.p50_ms <= limit),
                ),
                None => row,
            }
        }
        None => Row::not_available(id, name, "no samples"),
    }
}

pub async fn run(ctx: &Ctx<'_>, rows: &mut Vec<Row>) {
    let mib = ctx.s.state_bytes >> 20;
    let fs = filesystem_of(&ctx.d.dir);
    match measure(ctx).await {
        Ok(s) => {
            rows.push(row(
                "snapshot",
                format!(
                    "snapshot of a session holding {mib} MiB of new files ({} MiB stored)",
                    s.size_bytes >> 20
                ),
                &s.snapshot,
                Some(1000.0),
            ));
            rows.push(row(
                "create_from_snapshot",
                format!("session create from that snapshot ({mib} MiB)"),
                &s.from_snapshot,
                Some(300.0),
            ));
            rows.push(row(
                "restore",
                format!("restore of that snapshot into a running session ({mib} MiB)"),
                &s.restore,
                Some(300.0),
            ));
            // Where the work root cannot share blocks, the copies get the files copied; the
            // targets are for a data dir that can (`forks`).
            rows.push(row(
                "fork_files",
                format!("fork of that session, per copy ({FORK_COPIES} copies per fork), data dir on {fs}"),
                &s.forks.per_copy,
                None,
            ));
            rows.push(row(
                "fork_one_files",
                format!("fork of that session into one copy, data dir on {fs}"),
                &s.forks.one,
                None,
            ));
            rows.push(row(
                "pause_resume",
                "jail pause → resume (freezer), round trip of both calls".into(),
                &s.pause_resume,
                Some(5.0),
            ));
        }
        Err(e) => rows.push(Row::error("snapshot", "state that lasts", &e)),
    }
}

async fn measure(ctx: &Ctx<'_>) -> Result<Samples> {
    let api = Api {
        http: Client::new(),
        base: &ctx.d.base,
        key: &ctx.d.key,
    };
    let (source, disk_mib) = source(ctx, &api).await?;
    let result = samples(ctx, &api, &source, disk_mib).await;
    api.delete(&source).await;
    result
}

/// A session holding `state_bytes` of new files in [`FILES`] files, and its disk size.
async fn source(ctx: &Ctx<'_>, api: &Api<'_>) -> Result<(String, u64)> {
    let disk_mib = (ctx.s.state_bytes >> 20) * 3 + 256;
    let source = api
        .session(json!({"timeout_s": 3600, "limits": {"disk_mib": disk_mib}}))
        .await?;
    let each = (ctx.s.state_bytes / FILES).max(1);
    let script = format!(
        "mkdir -p /home/user/data && for i in $(seq 1 {FILES}); do head -c {each} /dev/urandom > /home/user/data/f$i; done"
    );
    let v = api
        .call(
            Method::POST,
            &format!("/sessions/{source}/exec"),
            json!({"shell": script, "timeout_ms": 600_000}),
        )
        .await?;
    if v["exit_code"] != 0 {
        api.delete(&source).await;
        bail!("writing the files: {v}");
    }
    Ok((source, disk_mib))
}

/// Fork times: per copy of a fork into [`FORK_COPIES`], and of a fork into one.
#[derive(Default)]
struct Forks {
    per_copy: Vec<Duration>,
    one: Vec<Duration>,
}

impl Forks {
    /// One sample of each; the copies are deleted after.
    async fn sample(&mut self, api: &Api<'_>, source: &str) -> Result<()> {
        for (copies, into) in [(FORK_COPIES, &mut self.per_copy), (1, &mut self.one)] {
            let (forks, took) = api
                .timed(
                    Method::POST,
                    &format!("/sessions/{source}/fork"),
                    json!({ "count": copies }),
                )
                .await?;
            into.push(took / copies as u32);
            for f in forks["sessions"].as_array().into_iter().flatten() {
                if let Some(id) = f["id"].as_str() {
                    api.delete(id).await;
                }
            }
        }
        Ok(())
    }
}

/// The fork rows, on a daemon whose data dir shares blocks (btrfs): the copies' disks are
/// clones of the source's.
pub async fn forks(ctx: &Ctx<'_>, rows: &mut Vec<Row>) {
    let mib = ctx.s.state_bytes >> 20;
    let api = Api {
        http: Client::new(),
        base: &ctx.d.base,
        key: &ctx.d.key,
    };
    let measured = async {
        let (source, _) = source(ctx, &api).await?;
        let mut forks = Forks::default();
        let mut sampled = Ok(());
        for _ in 0..ctx.s.state_samples {
            sampled = forks.sample(&api, &source).await;
            if sampled.is_err() {
                break;
            }
        }
        api.delete(&source).await;
        sampled.map(|()| forks)
    };
    let fs = filesystem_of(&ctx.d.dir);
    match measured.await {
        Ok(f) => {
            rows.push(row(
                "fork",
                format!("fork of a session holding {mib} MiB of new files, per copy ({FORK_COPIES} copies per fork), data dir on {fs}"),
                &f.per_copy,
                Some(100.0),
            ));
            rows.push(row(
                "fork_one",
                format!("fork of that session into one copy, data dir on {fs}"),
                &f.one,
                Some(100.0),
            ));
        }
        Err(e) => rows.push(Row::error("fork", "fork", &e)),
    }
}

/// The type of the filesystem the daemon's data dir is on (`stat -f`), for the row names.
fn filesystem_of(dir: &std::path::Path) -> String {
    std::process::Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(dir.join("data"))
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| "an unknown filesystem".into())
}

async fn samples(ctx: &Ctx<'_>, api: &Api<'_>, source: &str, disk_mib: u64) -> Result<Samples> {
    let mut s = Samples {
        snapshot: Vec::new(),
        from_snapshot: Vec::new(),
        restore: Vec::new(),
        forks: Forks::default(),
        pause_resume: Vec::new(),
        size_bytes: 0,
    };
    let target = api
        .session(json!({"timeout_s": 3600, "limits": {"disk_mib": disk_mib}}))
        .await?;
    for _ in 0..ctx.s.state_samples {
        let (snap, took) = api
            .timed(
                Method::POST,
                &format!("/sessions/{source}/snapshot"),
                Value::Null,
            )
            .await?;
        s.snapshot.push(took);
        s.size_bytes = snap["size_bytes"].as_u64().unwrap_or(0);
        let sid = snap["snapshot_id"]
            .as_str()
            .context("snapshot id")?
            .to_string();

        let began = Instant::now();
        let made = api
            .session(
                json!({"from_snapshot": sid, "timeout_s": 3600, "limits": {"disk_mib": disk_mib}}),
            )
            .await?;
        s.from_snapshot.push(began.elapsed());
        api.delete(&made).await;

        let (_, took) = api
            .timed(
                Method::POST,
                &format!("/sessions/{target}/restore"),
                json!({"snapshot_id": sid}),
            )
            .await?;
        s.restore.push(took);

        s.forks.sample(api, source).await?;
        let _ = api
            .call(Method::DELETE, &format!("/snapshots/{sid}"), Value::Null)
            .await;
    }
    for _ in 0..ctx.s.state_samples * 10 {
        let began = Instant::now();
        api.call(
            Method::POST,
            &format!("/sessions/{target}/pause"),
            Value::Null,
        )
        .await?;
        api.call(
            Method::POST,
            &format!("/sessions/{target}/resume"),
            Value::Null,
        )
        .await?;
        s.pause_resume.push(began.elapsed());
    }
    api.delete(&target).await;
    Ok(s)
}
