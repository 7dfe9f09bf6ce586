//! Host-side facts: baselines run without the daemon (plain spawn, one-shot bubblewrap, host
//! python), memory readings (`/proc/meminfo`, process RSS/PSS, cgroup usage) and the machine.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::daemon::{cgroup_mem, CgroupMem};

pub const BWRAP: &str = "/usr/bin/bwrap";
pub const PYTHON: &str = "/usr/bin/python3";
pub const NODE: &str = "/usr/bin/node";

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
        let took = time_one(make())?;
        if i >= warmup {
            out.push(took);
        }
    }
    Ok(out)
}

/// Runs `cmd` once (stdin and stdout null), waits for it and returns the wall time; it must
/// exit 0.
pub fn time_one(mut cmd: Command) -> Result<Duration> {
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
    Ok(took)
}

/// `threads` threads each spawning `/bin/true` (spawn + wait) in a loop for `duration`:
/// successful spawns and the wall time they took.
pub fn spawn_throughput(threads: usize, duration: Duration) -> Result<(u64, Duration)> {
    let began = Instant::now();
    let deadline = began + duration;
    let counts: Vec<Result<u64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(move || {
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        time_one(Command::new("/bin/true"))?;
                        n += 1;
                    }
                    Ok(n)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("spawn thread panicked")))
            })
            .collect()
    });
    let elapsed = began.elapsed();
    let mut total = 0;
    for c in counts {
        total += c?;
    }
    Ok((total, elapsed))
}

/// `n` copies of `make()` started at once (one thread each, released together by a barrier);
/// the wall time of each, from the barrier to its exit.
pub fn burst(n: usize, make: impl Fn() -> Command + Sync) -> Result<Vec<Duration>> {
    let barrier = std::sync::Barrier::new(n);
    let results: Vec<Result<Duration>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|_| {
                let (barrier, make) = (&barrier, &make);
                scope.spawn(move || {
                    let cmd = make();
                    barrier.wait();
                    time_one(cmd)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("burst thread panicked")))
            })
            .collect()
    });
    results.into_iter().collect()
}

/// Where Debian puts `runc`.
pub fn runc_bin() -> Option<PathBuf> {
    ["/usr/sbin/runc", "/usr/bin/runc", "/usr/local/sbin/runc"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// A running `runc` container (`sleep infinity` in a read-only root with `/usr` bound
/// read-only; pid, mount, ipc, uts and network namespaces), for the `runc exec` baseline. Its
/// state dir, bundle and cgroup belong to this run; dropping it kills and deletes the
/// container and removes the bundle.
pub struct RuncContainer {
    bin: PathBuf,
    dir: PathBuf,
    id: String,
}

impl RuncContainer {
    pub fn start(bin: &Path, work_root: &Path) -> Result<RuncContainer> {
        let id = format!("koder-bench-{}-runc", std::process::id());
        let dir = work_root.join(&id);
        if dir.exists() {
            fs::remove_dir_all(&dir)?;
        }
        let rootfs = dir.join("bundle/rootfs");
        for sub in ["usr", "proc", "dev", "sys", "tmp"] {
            fs::create_dir_all(rootfs.join(sub))?;
        }
        for (link, to) in [
            ("bin", "usr/bin"),
            ("lib", "usr/lib"),
            ("lib64", "usr/lib64"),
            ("sbin", "usr/sbin"),
        ] {
            std::os::unix::fs::symlink(to, rootfs.join(link))?;
        }
        let c = RuncContainer {
            bin: bin.to_path_buf(),
            dir,
            id,
        };
        let bundle = c.dir.join("bundle");
        let out = Command::new(&c.bin)
            .arg("spec")
            .current_dir(&bundle)
            .output()
            .context("runc spec")?;
        if !out.status.success() {
            bail!("runc spec: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        let path = bundle.join("config.json");
        let mut spec: serde_json::Value = serde_json::from_slice(&fs::read(&path)?)?;
        spec["process"]["terminal"] = false.into();
        spec["process"]["args"] = serde_json::json!(["/bin/sleep", "infinity"]);
        spec["root"] = serde_json::json!({"path": "rootfs", "readonly": true});
        spec["hostname"] = "koder-bench".into();
        if let Some(m) = spec["mounts"].as_array_mut() {
            m.push(serde_json::json!({
                "destination": "/usr", "type": "bind", "source": "/usr",
                "options": ["rbind", "ro", "nosuid", "nodev"]
            }));
        }
        spec["linux"]["cgroupsPath"] = format!("/{}", c.id).into();
        fs::write(&path, serde_json::to_vec_pretty(&spec)?)?;
        // The container's process inherits runc's stdio: a file, not a pipe nobody closes.
        let log = c.dir.join("runc.log");
        let status = Command::new(&c.bin)
            .arg("--root")
            .arg(c.dir.join("state"))
            .args(["run", "--detach", "--bundle"])
            .arg(&bundle)
            .arg(&c.id)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log)?)
            .status()
            .context("runc run")?;
        if !status.success() {
            bail!(
                "runc run: {}",
                fs::read_to_string(&log).unwrap_or_default().trim()
            );
        }
        Ok(c)
    }

    /// `runc exec <container> /bin/true`, as a command to time.
    pub fn exec_true(&self) -> Command {
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--root")
            .arg(self.dir.join("state"))
            .arg("exec")
            .arg(&self.id)
            .arg("/bin/true");
        cmd
    }
}

impl Drop for RuncContainer {
    fn drop(&mut self) {
        let state = self.dir.join("state");
        let quiet = |args: &[&str]| {
            let _ = Command::new(&self.bin)
                .arg("--root")
                .arg(&state)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        };
        quiet(&["kill", &self.id, "KILL"]);
        quiet(&["delete", "--force", &self.id]);
        let _ = fs::remove_dir_all(&self.dir);
    }
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
