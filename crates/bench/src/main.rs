//! `koder-bench`: measures koder-sandbox against daemons it starts itself (each with its own
//! data dir and cgroup parent under the work root), prints a markdown table with targets and
//! pass/fail, and writes the same as JSON. `--smoke` runs every phase with tiny counts in
//! seconds (CI keeps the harness from rotting; no timing is asserted there).
//!
//! Daemon "pool" (warm pool `bash = 2, python = 1`): exec latency (JSON and SSE, with host
//! spawn, bwrap and `runc exec` sampled in between; then after a pause each, beside a host
//! spawn after the same pause), the E2B Python SDK (`commands.run`,
//! time to interactive vs. host `node -v`), warm create, create+exec+destroy, python, warm
//! interpreter, throughput (vs. the host spawning from as many threads), sustained creates,
//! files. Every ratio is against a baseline measured in the same run, interleaved.
//! Daemon "cold" (`pool = {}`): create with an empty pool (back to back, then after a pause
//! each), destroy, density.

mod cluster;
mod daemon;
mod e2b;
mod grpc;
mod host;
mod images;
mod microvm;
mod phases;
mod report;
mod state;
mod stats;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};
use serde::Serialize;

use crate::daemon::{Daemon, Setup};
use crate::report::{Report, Row};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
enum Phase {
    /// Host baselines: plain spawn, one-shot bwrap, `runc exec`, host python (spawn, bwrap
    /// and runc are taken interleaved by the exec phase when it runs).
    Host,
    /// Exec round trip of /bin/true in a live session, JSON and SSE, interleaved with host
    /// spawn, bwrap and `runc exec` samples.
    Exec,
    /// The E2B Python SDK: commands.run vs. native exec; time to interactive (create → node -v),
    /// one at a time and 50 at once, vs. host `node -v`.
    E2b,
    /// Session create (warm pool, empty pool), destroy, create+exec+destroy.
    Create,
    /// python3 -c pass in a session.
    Python,
    /// Warm code-interpreter context `1+1`.
    Interp,
    /// Execs/s with concurrent clients, vs. the host spawning from as many threads.
    Throughput,
    /// Creates/s sustained.
    Creates,
    /// Idle sessions: memory per session, time to create them.
    Density,
    /// File upload/download throughput.
    Files,
    /// The microVM runtime: boot, warm hand-out, exec, memory per VM.
    Microvm,
    /// Snapshot, create from snapshot, restore, fork, pause→resume.
    State,
    /// gRPC unary exec beside REST exec on a daemon with gRPC on, interleaved.
    Grpc,
    /// Images: python pack and numpy template build times (first, cached); create from a
    /// custom image vs. `host`, warm and not pooled, interleaved.
    Images,
    /// Three daemons sharing a PostgreSQL database (KODER_TEST_PG_URL) as a cluster: exec
    /// forwarded by another node beside the same exec sent to its node, interleaved; creates/s
    /// spread over the three.
    Cluster,
}

#[derive(Debug, Parser)]
#[command(
    name = "koder-bench",
    about = "Benchmarks koder-sandbox against daemons it starts itself; prints a markdown table and writes JSON"
)]
struct Args {
    /// Every phase with tiny counts (seconds); checks the harness end to end, asserts no timing.
    #[arg(long)]
    smoke: bool,
    /// The koder-sandbox daemon binary (default: next to this executable). The agent is found
    /// next to the daemon.
    #[arg(long)]
    daemon_bin: Option<PathBuf>,
    /// Where the daemons' work dirs (config, data dir, log) are created.
    #[arg(long, default_value = "/tmp")]
    work_root: PathBuf,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also write the markdown table here.
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// Only these phases (comma-separated); default all.
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Phase>,
    /// Seconds of each throughput phase (execs/s, creates/s).
    #[arg(long)]
    duration: Option<f64>,
    /// Concurrent clients of the exec throughput phase.
    #[arg(long)]
    clients: Option<usize>,
    /// Concurrent create+destroy loops of the sustained-creates phase.
    #[arg(long)]
    create_workers: Option<usize>,
    /// Idle sessions held in the density phase.
    #[arg(long)]
    density: Option<usize>,
    /// Concurrent creates (and destroys) in the density phase.
    #[arg(long)]
    density_concurrency: Option<usize>,
    /// Size of the file uploaded and downloaded, MiB.
    #[arg(long)]
    file_mib: Option<u64>,
    /// Multiplies every latency sample count.
    #[arg(long, default_value_t = 1.0)]
    samples_scale: f64,
    /// Keep the daemons' work dirs (logs, data) after the run.
    #[arg(long)]
    keep: bool,
    /// The microVM image (`ksandbox image build --images-dir DIR`).
    #[arg(
        long,
        env = "KODER_MICROVM_IMAGES",
        default_value = "/var/cache/koder-sandbox-test/microvm-images"
    )]
    microvm_images: PathBuf,
    /// The store the tests build language packs into: `--smoke` takes the python pack from
    /// there instead of building it.
    #[arg(
        long,
        env = "KODER_PACK_CACHE",
        default_value = "/var/cache/koder-sandbox-test/packs"
    )]
    pack_cache: PathBuf,
    /// `[images] build_internal` of the images phase's daemon: address ranges (a package
    /// mirror on a private address) template builds may reach despite the SSRF guard.
    #[arg(long, value_delimiter = ',')]
    build_internal: Vec<String>,
    /// Python of a venv with the `e2b` SDK (default: the test cache's `e2b-venv/bin/python`, which
    /// scripts/bench.sh makes).
    #[arg(long, env = "KODER_E2B_PYTHON")]
    e2b_python: Option<PathBuf>,
    /// SDK `commands.run` samples (in batches interleaved with native execs).
    #[arg(long)]
    e2b_samples: Option<usize>,
    /// Sandboxes created at once in the E2B burst.
    #[arg(long)]
    tti_burst: Option<usize>,
}

/// Counts and sizes of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    pub spawn_samples: usize,
    pub exec_samples: usize,
    pub create_samples: usize,
    pub ced_samples: usize,
    pub python_samples: usize,
    pub interp_samples: usize,
    pub warmup: usize,
    pub duration_s: f64,
    pub clients: usize,
    pub create_workers: usize,
    pub density: usize,
    pub density_concurrency: usize,
    pub file_bytes: u64,
    pub warm_pool_bash: u64,
    /// Boots (and warm hand-outs) measured in the microVM phase.
    pub microvm_samples: usize,
    /// Pause after `sync` before each daemon phase.
    pub settle_s: f64,
    /// E2B SDK `commands.run("true")` samples, taken in batches of `e2b_batch` alternating
    /// with as many native JSON execs.
    pub e2b_run_samples: usize,
    pub e2b_batch: usize,
    /// Sequential E2B time-to-interactive samples, and the burst size.
    pub tti_samples: usize,
    pub tti_burst: usize,
    /// New data in the session the state phase snapshots, and its samples.
    pub state_bytes: u64,
    pub state_samples: usize,
    /// Samples of the rows measured after a pause (exec, empty-pool create).
    pub paused_samples: usize,
}

impl Settings {
    fn from(args: &Args) -> Settings {
        let mut s = if args.smoke {
            Settings {
                spawn_samples: 5,
                exec_samples: 20,
                create_samples: 3,
                ced_samples: 3,
                python_samples: 3,
                interp_samples: 5,
                warmup: 2,
                duration_s: 1.0,
                clients: 4,
                create_workers: 2,
                density: 4,
                density_concurrency: 2,
                file_bytes: 1 << 20,
                warm_pool_bash: 2,
                microvm_samples: 1,
                settle_s: 0.1,
                e2b_run_samples: 10,
                e2b_batch: 5,
                tti_samples: 2,
                tti_burst: 3,
                state_bytes: 4 << 20,
                state_samples: 1,
                paused_samples: 3,
            }
        } else {
            Settings {
                spawn_samples: 300,
                exec_samples: 2000,
                create_samples: 100,
                ced_samples: 50,
                python_samples: 100,
                interp_samples: 500,
                warmup: 20,
                duration_s: 20.0,
                clients: 32,
                create_workers: 4,
                density: phases::DENSITY_TARGET,
                density_concurrency: 8,
                file_bytes: 100 << 20,
                warm_pool_bash: 2,
                microvm_samples: 5,
                settle_s: 2.0,
                e2b_run_samples: 500,
                e2b_batch: 50,
                tti_samples: 30,
                tti_burst: 50,
                state_bytes: 100 << 20,
                state_samples: 5,
                paused_samples: 30,
            }
        };
        let scale = |n: usize| ((n as f64 * args.samples_scale).round() as usize).max(1);
        s.spawn_samples = scale(s.spawn_samples);
        s.exec_samples = scale(s.exec_samples);
        s.create_samples = scale(s.create_samples);
        s.ced_samples = scale(s.ced_samples);
        s.python_samples = scale(s.python_samples);
        s.interp_samples = scale(s.interp_samples);
        s.e2b_run_samples = scale(s.e2b_run_samples);
        s.tti_samples = scale(s.tti_samples);
        s.state_samples = scale(s.state_samples);
        s.paused_samples = scale(s.paused_samples);
        if let Some(v) = args.e2b_samples {
            s.e2b_run_samples = v.max(1);
        }
        if let Some(v) = args.tti_burst {
            s.tti_burst = v.max(1);
        }
        if let Some(v) = args.duration {
            s.duration_s = v.max(0.1);
        }
        if let Some(v) = args.clients {
            s.clients = v.max(1);
        }
        if let Some(v) = args.create_workers {
            s.create_workers = v.max(1);
        }
        if let Some(v) = args.density {
            s.density = v.max(1);
        }
        if let Some(v) = args.density_concurrency {
            s.density_concurrency = v.max(1);
        }
        if let Some(v) = args.file_mib {
            s.file_bytes = v.max(1) << 20;
        }
        s
    }

    pub fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.duration_s)
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        if args.smoke {
            println!("koder-bench: skipped: needs root (real sandboxes and cgroups)");
            return ExitCode::SUCCESS;
        }
        eprintln!("koder-bench: needs root (real sandboxes and cgroups)");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("koder-bench: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async {
        tokio::select! {
            r = run(&args) => r.map(Some),
            _ = tokio::signal::ctrl_c() => {
                eprintln!("koder-bench: interrupted; cleaning up");
                Ok(None)
            }
            _ = sigterm() => {
                eprintln!("koder-bench: terminated; cleaning up");
                Ok(None)
            }
        }
    });
    match outcome {
        Ok(Some(report)) if !report.has_errors() => ExitCode::SUCCESS,
        Ok(Some(_)) => {
            eprintln!("koder-bench: some measurements failed (see the table)");
            ExitCode::FAILURE
        }
        Ok(None) => ExitCode::from(130),
        Err(e) => {
            eprintln!("koder-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> Result<Report> {
    let started = Instant::now();
    let started_at = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string();
    let settings = Settings::from(args);
    let load = host::loadavg();
    let wants = |p: Phase| args.only.is_empty() || args.only.contains(&p);
    let daemon_bin = match &args.daemon_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("this executable has no directory")?
            .join("koder-sandbox"),
    };
    let build = if daemon_bin.components().any(|c| c.as_os_str() == "release") {
        "release"
    } else if daemon_bin.components().any(|c| c.as_os_str() == "debug") {
        "debug"
    } else {
        "unknown"
    };
    let mut rows: Vec<Row> = Vec::new();
    let progress = |what: &str| {
        eprintln!(
            "koder-bench: [{:>5.1}s] {what}",
            started.elapsed().as_secs_f64()
        )
    };

    // Host baselines first, with nothing else running.
    let mut baselines = phases::Baselines::default();
    if wants(Phase::Host) || wants(Phase::Exec) || wants(Phase::Create) || wants(Phase::Python) {
        progress("host baselines");
        // With the exec phase, spawn/bwrap/runc are sampled there, interleaved with the execs.
        let standalone = !wants(Phase::Exec) && (wants(Phase::Host) || wants(Phase::Create));
        baselines = phases::host_baselines(&settings, &args.work_root, standalone, &mut rows);
    }

    let pool_phases = [
        Phase::Exec,
        Phase::E2b,
        Phase::Create,
        Phase::Python,
        Phase::Interp,
        Phase::Throughput,
        Phase::Creates,
        Phase::Files,
        Phase::State,
    ];
    if pool_phases.iter().any(|&p| wants(p)) {
        settle(&settings).await;
        progress("starting the daemon with a warm pool");
        let pool_toml = format!(
            "pool = {{ bash = {}, python = 1 }}\nreap_interval = 1.0\n",
            settings.warm_pool_bash
        );
        match Daemon::start(&daemon_bin, &args.work_root, "pool", &pool_toml, args.keep).await {
            Ok(mut d) => {
                if wants(Phase::Exec) {
                    progress("exec latency (JSON, SSE; host spawn, bwrap, runc exec interleaved)");
                    let none = phases::Baselines::default();
                    let ctx = phases::Ctx {
                        d: &d,
                        s: &settings,
                        base: &none,
                    };
                    phases::exec_latency(&ctx, &mut baselines, &mut rows).await;
                    progress("exec after a pause (host spawn after the same pause interleaved)");
                    phases::exec_after_pause(&ctx, &mut rows).await;
                }
                let ctx = phases::Ctx {
                    d: &d,
                    s: &settings,
                    base: &baselines,
                };
                if wants(Phase::E2b) {
                    progress("E2B Python SDK: commands.run, time to interactive");
                    let python = args.e2b_python.clone().unwrap_or_else(e2b::default_python);
                    e2b::run(&ctx, &python, &mut rows).await;
                }
                if wants(Phase::Create) {
                    progress("warm create, create+exec+destroy");
                    phases::warm_create(&ctx, &mut rows).await;
                }
                if wants(Phase::Python) {
                    progress("python in a session");
                    phases::python(&ctx, &mut rows).await;
                }
                if wants(Phase::Interp) {
                    progress("warm interpreter");
                    phases::interp(&ctx, &mut rows).await;
                }
                if wants(Phase::Throughput) {
                    progress("exec throughput");
                    phases::exec_throughput(&ctx, &mut rows).await;
                }
                if wants(Phase::Creates) {
                    progress("sustained creates");
                    phases::create_throughput(&ctx, &mut rows).await;
                }
                if wants(Phase::Files) {
                    progress("file transfer");
                    phases::files(&ctx, &mut rows).await;
                }
                if wants(Phase::State) {
                    progress("snapshots, restore, fork, pause");
                    state::run(&ctx, &mut rows).await;
                }
                if rows.iter().any(|r| r.status == report::Status::Error) {
                    eprintln!("koder-bench: daemon log tail:\n{}", d.log_tail(20));
                }
                d.stop(Duration::from_secs(120));
            }
            Err(e) => rows.push(Row::error("daemon_pool", "daemon with a warm pool", &e)),
        }
    }

    if wants(Phase::E2b) {
        settle(&settings).await;
        progress("E2B Python SDK: bursts on a pool that grows with demand");
        let pool_toml = format!(
            "pool = {{ bash = {{ min = {}, max = {} }} }}\nreap_interval = 1.0\n",
            settings.warm_pool_bash,
            settings.tti_burst + 8
        );
        match Daemon::start(&daemon_bin, &args.work_root, "burst", &pool_toml, args.keep).await {
            Ok(d) => {
                let ctx = phases::Ctx {
                    d: &d,
                    s: &settings,
                    base: &baselines,
                };
                let python = args.e2b_python.clone().unwrap_or_else(e2b::default_python);
                e2b::bursts(&ctx, &python, &mut rows).await;
            }
            Err(e) => rows.push(Row::error(
                "e2b_tti_burst",
                "daemon with a pool that grows",
                &e,
            )),
        }
    }

    if wants(Phase::State) {
        progress("fork on a data dir that shares blocks (btrfs)");
        let setup = Setup {
            sessions: "pool = {}\n",
            btrfs: true,
            ..Setup::default()
        };
        match Daemon::start_full(&daemon_bin, &args.work_root, "btrfs", setup, args.keep).await {
            Ok(d) => {
                let ctx = phases::Ctx {
                    d: &d,
                    s: &settings,
                    base: &baselines,
                };
                state::forks(&ctx, &mut rows).await;
            }
            Err(e) => rows.push(Row::error("fork", "daemon with its data dir on btrfs", &e)),
        }
    }

    if wants(Phase::Create) || wants(Phase::Density) {
        // The previous phases leave a writeback backlog (disk images, the big file, removed
        // data dirs) that would otherwise be paid by this phase's creates and destroys.
        settle(&settings).await;
        progress("starting the daemon with an empty pool");
        // Room for every density session (the default cap is 1024 sandboxes).
        let jail = format!("max_sandboxes = {}\n", settings.density + 64);
        let setup = Setup {
            sessions: "pool = {}\nreap_interval = 1.0\n",
            jail: &jail,
            ..Setup::default()
        };
        match Daemon::start_full(&daemon_bin, &args.work_root, "cold", setup, args.keep).await {
            Ok(mut d) => {
                let ctx = phases::Ctx {
                    d: &d,
                    s: &settings,
                    base: &baselines,
                };
                if wants(Phase::Create) {
                    progress("cold create and destroy");
                    phases::cold_create(&ctx, &mut rows).await;
                    progress("cold create after a pause");
                    phases::cold_create_after_pause(&ctx, &mut rows).await;
                }
                if wants(Phase::Density) {
                    progress(&format!("density: {} idle sessions", settings.density));
                    phases::density(&ctx, &mut rows).await;
                }
                d.stop(Duration::from_secs(300));
            }
            Err(e) => rows.push(Row::error("daemon_cold", "daemon with an empty pool", &e)),
        }
    }
    if wants(Phase::Grpc) {
        settle(&settings).await;
        progress("gRPC exec beside REST exec (interleaved)");
        grpc::run(
            &daemon_bin,
            &args.work_root,
            &settings,
            args.keep,
            &mut rows,
        )
        .await;
    }
    if wants(Phase::Images) {
        settle(&settings).await;
        progress("images: pack and template builds, create from a custom image");
        let opts = images::Options {
            pack_cache: &args.pack_cache,
            build_internal: &args.build_internal,
            smoke: args.smoke,
        };
        images::run(
            &daemon_bin,
            &args.work_root,
            &settings,
            &opts,
            args.keep,
            &mut rows,
        )
        .await;
    }
    if wants(Phase::Cluster) {
        settle(&settings).await;
        progress("a cluster of three: forwarded exec, creates/s");
        cluster::run(
            &daemon_bin,
            &args.work_root,
            &settings,
            args.keep,
            &mut rows,
        )
        .await;
    }
    if wants(Phase::Microvm) {
        settle(&settings).await;
        progress("microVM runtime");
        microvm::run(
            &daemon_bin,
            &args.work_root,
            &args.microvm_images,
            &settings,
            args.keep,
            &mut rows,
        )
        .await;
    }
    progress("done");
    rows.sort_by_key(|r| {
        phases::ORDER
            .iter()
            .position(|id| *id == r.id)
            .unwrap_or(usize::MAX)
    });

    let report = Report {
        tool: "koder-bench",
        started_at,
        duration_s: started.elapsed().as_secs_f64(),
        mode: if args.smoke { "smoke" } else { "full" },
        build,
        machine: host::machine(),
        load_avg_1m_at_start: load,
        load_avg_1m_at_end: host::loadavg(),
        settings: serde_json::to_value(&settings)?,
        rows,
    };
    let md = report.markdown();
    println!("{md}");
    if let Some(path) = &args.markdown {
        write_file(path, md.as_bytes())?;
    }
    if let Some(path) = &args.json {
        write_file(path, &serde_json::to_vec_pretty(&report)?)?;
    }
    Ok(report)
}

/// Resolves on SIGTERM (so `timeout` and service managers get the same clean-up as Ctrl-C).
async fn sigterm() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut s) => {
            s.recv().await;
        }
        Err(_) => std::future::pending().await,
    }
}

/// Flushes dirty data to disk and lets the machine calm down between phases.
async fn settle(s: &Settings) {
    let _ = tokio::task::spawn_blocking(|| {
        // SAFETY: sync has no preconditions.
        unsafe { libc::sync() };
    })
    .await;
    tokio::time::sleep(Duration::from_secs_f64(s.settle_s)).await;
}

fn write_file(path: &std::path::Path, data: &[u8]) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, data).with_context(|| format!("writing {}", path.display()))
}
