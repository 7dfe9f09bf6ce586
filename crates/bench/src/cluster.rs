//! Three daemons as one cluster on loopback, sharing a PostgreSQL database of the run's own
//! (`KODER_TEST_PG_URL`, from `scripts/setup-postgres.sh`) and a cluster secret: exec of
//! `/bin/true` in a session node 1 holds, sent to node 1 itself and to node 0 (which forwards
//! it), samples interleaved (alternating which goes first); then creates/s with the create
//! loops spread over the three nodes. Skipped (an info row) without a database.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::daemon::{Daemon, TENANT};
use crate::phases;
use crate::report::Row;
use crate::Settings;

const NODES: usize = 3;

/// A database of this run's own on the test server, dropped at the end.
struct Database {
    server: String,
    name: String,
    url: String,
}

impl Database {
    fn create(server: &str) -> Result<Database> {
        let base = server
            .rsplit_once('/')
            .map(|(b, _)| b)
            .context("the PostgreSQL URL ends in /<database>")?;
        let name = format!("koder_bench_{}", std::process::id());
        let db = Database {
            server: server.into(),
            url: format!("{base}/{name}"),
            name,
        };
        db.psql(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", db.name))?;
        db.psql(&format!("CREATE DATABASE {}", db.name))?;
        Ok(db)
    }

    fn psql(&self, sql: &str) -> Result<()> {
        let out = Command::new("psql")
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", &self.server, "-c", sql])
            .output()
            .context("running psql")?;
        if !out.status.success() {
            bail!("psql {sql}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let _ = self.psql(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ));
    }
}

pub async fn run(
    daemon_bin: &Path,
    work_root: &Path,
    s: &Settings,
    keep: bool,
    rows: &mut Vec<Row>,
) {
    let name = "exec `/bin/true` forwarded by another node of a cluster";
    let Ok(server) = std::env::var("KODER_TEST_PG_URL") else {
        return rows.push(Row::info(
            "cluster_exec_forwarded",
            name,
            "skipped: no PostgreSQL (KODER_TEST_PG_URL, scripts/setup-postgres.sh)",
        ));
    };
    let db = match Database::create(&server) {
        Ok(db) => db,
        Err(e) => return rows.push(Row::error("cluster_exec_forwarded", name, &e)),
    };
    let mut nodes = match start(daemon_bin, work_root, &db, keep).await {
        Ok(nodes) => nodes,
        Err(e) => return rows.push(Row::error("cluster_exec_forwarded", "three nodes", &e)),
    };
    let http = reqwest::Client::new();
    match exec(&http, &nodes, s).await {
        Ok((local, forwarded)) => push_exec_rows(&local, &forwarded, name, rows),
        Err(e) => rows.push(Row::error("cluster_exec_forwarded", name, &e)),
    }
    let creates = "creates/s across three nodes (create + destroy loops spread over them)";
    match creates_per_s(&http, &nodes, s).await {
        Ok(row) => rows.push(row),
        Err(e) => rows.push(Row::error("cluster_creates", creates, &e)),
    }
    for d in &mut nodes {
        d.stop(Duration::from_secs(60));
    }
}

/// The nodes, each with the same key (static keys are checked by whichever node a request
/// reaches) on top of its own.
async fn start(bin: &Path, work_root: &Path, db: &Database, keep: bool) -> Result<Vec<Daemon>> {
    let secret = work_root.join(format!("koder-bench-{}-cluster.secret", std::process::id()));
    std::fs::write(&secret, hex::encode(rand::random::<[u8; 32]>()))?;
    let key = format!("e2b_{}", hex::encode(rand::random::<[u8; 20]>()));
    let nodes = start_nodes(bin, work_root, db, keep, &secret, &key).await;
    // Each daemon read the secret at its start.
    let _ = std::fs::remove_file(&secret);
    nodes
}

async fn start_nodes(
    bin: &Path,
    work_root: &Path,
    db: &Database,
    keep: bool,
    secret: &Path,
    key: &str,
) -> Result<Vec<Daemon>> {
    let mut nodes = Vec::new();
    for k in 0..NODES {
        let extra = format!(
            "[store]\nurl = \"{}\"\n[node]\nid = \"bench-{k}\"\n[cluster]\nsecret_file = \"{}\"\n\
             [auth]\napi_keys = [\"{TENANT}:{key}\"]\n",
            db.url,
            secret.display()
        );
        let sessions = "pool = { bash = 1 }\nreap_interval = 1.0\n";
        let mut d = Daemon::start_with(
            bin,
            work_root,
            &format!("cluster{k}"),
            sessions,
            &extra,
            keep,
        )
        .await?;
        d.key = key.to_string();
        nodes.push(d);
    }
    Ok(nodes)
}

async fn post(http: &reqwest::Client, d: &Daemon, path: &str, body: &Value) -> Result<Value> {
    let resp = http
        .post(format!("{}{path}", d.base))
        .bearer_auth(&d.key)
        .json(body)
        .send()
        .await?;
    let status = resp.status();
    let v: Value = resp.json().await?;
    if !status.is_success() {
        bail!("POST {path} answered {status}: {v}");
    }
    Ok(v)
}

async fn create(http: &reqwest::Client, d: &Daemon) -> Result<String> {
    let v = post(
        http,
        d,
        "/v1/sandbox/sessions",
        &json!({"language": "bash"}),
    )
    .await?;
    Ok(v["id"].as_str().context("no session id")?.to_string())
}

async fn delete(http: &reqwest::Client, d: &Daemon, id: &str) -> Result<()> {
    let status = http
        .delete(format!("{}/v1/sandbox/sessions/{id}", d.base))
        .bearer_auth(&d.key)
        .send()
        .await?
        .status();
    if !status.is_success() {
        bail!("DELETE answered {status}");
    }
    Ok(())
}

async fn exec_once(http: &reqwest::Client, d: &Daemon, path: &str, body: &Value) -> Result<()> {
    let v = post(http, d, path, body).await?;
    if v["exit_code"] != 0 {
        bail!("exec did not exit 0: {v}");
    }
    Ok(())
}

/// (local, forwarded) samples of one exec each, interleaved.
async fn exec(
    http: &reqwest::Client,
    nodes: &[Daemon],
    s: &Settings,
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let id = create(http, &nodes[1]).await?;
    let path = format!("/v1/sandbox/sessions/{id}/exec");
    let body = json!({"cmd": [phases::TRUE]});
    let once = |d| exec_once(http, d, &path, &body);
    for _ in 0..s.warmup {
        once(&nodes[1]).await?;
        once(&nodes[0]).await?;
    }
    let n = s.exec_samples;
    let (mut local, mut forwarded) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        for forwarded_first in [i % 2 == 0, i % 2 != 0] {
            let t = Instant::now();
            if forwarded_first {
                once(&nodes[0]).await?;
                forwarded.push(t.elapsed());
            } else {
                once(&nodes[1]).await?;
                local.push(t.elapsed());
            }
        }
    }
    delete(http, &nodes[1], &id).await?;
    Ok((local, forwarded))
}

fn push_exec_rows(local: &[Duration], forwarded: &[Duration], name: &str, rows: &mut Vec<Row>) {
    let (Ok(l), Ok(f)) = (phases::summary(local), phases::summary(forwarded)) else {
        return rows.push(Row::error(
            "cluster_exec_forwarded",
            name,
            &anyhow::anyhow!("no samples"),
        ));
    };
    rows.push(
        Row::info(
            "cluster_exec_local",
            "exec `/bin/true` on the node holding the session, interleaved with the forwarded execs",
            l.display(),
        )
        .data(json!(l)),
    );
    rows.push(
        Row::info(
            "cluster_exec_forwarded",
            name,
            phases::with_ratios(&f, &[("the same exec sent to its node", Some(l.p50_ms))]),
        )
        .data(json!({ "forwarded": f, "local": l })),
    );
}

/// Create + destroy loops for the phase's duration, worker `w` sending to node `w % 3`
/// (each create lands where placement puts it).
async fn creates_per_s(http: &reqwest::Client, nodes: &[Daemon], s: &Settings) -> Result<Row> {
    let workers = s.create_workers.max(NODES);
    let until = Instant::now() + Duration::from_secs_f64(s.duration_s);
    let began = Instant::now();
    let loops = (0..workers).map(|w| {
        let d = &nodes[w % NODES];
        async move {
            let mut done = 0u64;
            while Instant::now() < until {
                let id = create(http, d).await?;
                done += 1;
                delete(http, d, &id).await?;
            }
            Ok::<_, anyhow::Error>(done)
        }
    });
    let counts = futures::future::try_join_all(loops).await?;
    let total: u64 = counts.iter().sum();
    let rate = total as f64 / began.elapsed().as_secs_f64();
    Ok(Row::info(
        "cluster_creates",
        "creates/s across three nodes (create + destroy loops spread over them)",
        format!("{rate:.1}/s ({total} creates, {workers} loops)"),
    )
    .data(json!({ "creates_per_s": rate, "creates": total, "loops": workers })))
}
