//! Host-side facts: baselines run without the daemon (plain spawn, one-shot bubblewrap, host
//! python), memory readings (`/proc/meminfo`, process RSS/PSS, cgroup usage) and the machine.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::daemon::{cgroup_mem, CgroupMem};

pub const BWRAP: &str = "/usr/bin/bwrap";
pub const PYTHON: &str = "/usr/bin/python3";

/// The one-shot bubblewrap sandbox of the issue, around `cmd`.
pub fn bwrap_command(cmd: &[&str]) -> Command {
    let mut c = Command::new(BWRAP);
    c.args([
        "--unshare-all",
        "--die-with-parent",
        "--ro-bind",
        "/usr",
        "/usr",
        "--symlink",
        "usr/lib64",
        "/lib64",
        "--symlink",
        "usr/lib",
        "/lib",
        "--symlink",
        "usr/bin",
        "/bin",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
    ]);
    c.args(cmd);
    c
}

/// Spawns `make()` `warmup + n` times, waiting for each, and returns the last `n` wall times.
/// Every run must exit 0.
pub fn time_spawns(
    mut make: impl FnMut() -> Command,
    warmup: usize,
    n: usize,
) -> Result<Vec<Duration>> {
    let mut out = Vec::with_capacity(n);
    for i in 0..warmup + n {
        let mut cmd = make();
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let began = Instant::now();
        let result = cmd.output().context("spawning")?;
        let took = began.elapsed();
        if !result.status.success() {
            bail!(
                "{:?} failed ({}): {}",
                cmd.get_program(),
                result.status,
                String::from_utf8_lossy(&result.stderr).trim()
            );
        }
        if i >= warmup {
            out.push(took);
        }
    }
    Ok(out)
}

/// `/proc/meminfo` in KiB, by field.
pub fn meminfo() -> Result<BTreeMap<String, u64>> {
    let text = fs::read_to_string("/proc/meminfo")?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let kib = v.split_whitespace().next()?.parse().ok()?;
            Some((k.to_string(), kib))
        })
        .collect())
}

/// Resident and proportional set size of a process, in KiB.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct ProcMem {
    pub rss_kib: u64,
    pub pss_kib: u64,
}

pub fn proc_mem(pid: u32) -> Option<ProcMem> {
    let text = fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Some(ProcMem {
        rss_kib: field("Rss:"),
        pss_kib: field("Pss:"),
    })
}

/// Per-sandbox cgroups under the memory cgroup `dir`: their memory and pids.
pub fn sandbox_cgroups(dir: &Path, usage_file: &str) -> Vec<(CgroupMem, Vec<u32>)> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .map(|p| {
            let usage = cgroup_mem(&p, usage_file).unwrap_or_default();
            let pids = fs::read_to_string(p.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.parse().ok())
                .collect();
            (usage, pids)
        })
        .collect()
}

#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub os: String,
    pub cgroups: String,
    pub hostname: String,
}

pub fn machine() -> Machine {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|v| v.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let memory_gib = meminfo()
        .ok()
        .and_then(|m| m.get("MemTotal").copied())
        .map_or(0.0, |k| k as f64 / (1024.0 * 1024.0));
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let os = fs::read_to_string("/etc/os-release")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_default();
    let cgroups = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "v2".into()
    } else if Path::new("/sys/fs/cgroup/memory").is_dir() {
        "v1 (hybrid)".into()
    } else {
        "none".into()
    };
    let hostname = fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    Machine {
        cpu,
        cores,
        memory_gib,
        kernel,
        os,
        cgroups,
        hostname,
    }
}

/// 1-minute load average, to flag a busy machine in the report.
pub fn loadavg() -> f64 {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}
