//! A `koder-sandbox serve` started for one benchmark phase: its own work dir (config, data dir,
//! log) under the work root, its own cgroup parent, a free loopback port and one tenant key.
//! Stopping it (SIGTERM) makes it destroy its sandboxes; dropping it also removes the cgroup
//! parent and the work dir.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub const TENANT: &str = "bench";

pub struct Daemon {
    child: Option<Child>,
    pub label: String,
    pub base: String,
    pub key: String,
    pub dir: PathBuf,
    pub cgroup_parent: String,
    pub log: PathBuf,
    /// The daemon's own memory cgroup (`<cgroup_parent>-daemon`): what the daemon allocates on
    /// behalf of sessions (agent clones, disk images, page cache, its heap) is charged here,
    /// apart from the rest of the machine.
    pub daemon_cgroup: Option<(PathBuf, &'static str)>,
    /// Its data dir is a filesystem mounted for it ([`Setup::btrfs`]).
    data_fs: bool,
    keep: bool,
}

/// The TOML tables of a daemon's config and where its data dir lives.
#[derive(Default)]
pub struct Setup<'a> {
    /// The `[sessions]` table's body.
    pub sessions: &'a str,
    /// More keys of the `[jail]` table.
    pub jail: &'a str,
    /// More tables.
    pub extra: &'a str,
    /// The data dir on a btrfs filesystem made for the daemon on a sparse file (files there
    /// share blocks when cloned).
    pub btrfs: bool,
}

impl Daemon {
    /// Starts the daemon with `sessions_toml` as its `[sessions]` table body and waits for
    /// `/healthz`.
    pub async fn start(
        bin: &Path,
        work_root: &Path,
        label: &str,
        sessions_toml: &str,
        keep: bool,
    ) -> Result<Daemon> {
        Self::start_with(bin, work_root, label, sessions_toml, "", keep).await
    }

    /// [`Daemon::start`] with more TOML tables (`extra_toml`) in its config.
    pub async fn start_with(
        bin: &Path,
        work_root: &Path,
        label: &str,
        sessions_toml: &str,
        extra_toml: &str,
        keep: bool,
    ) -> Result<Daemon> {
        let setup = Setup {
            sessions: sessions_toml,
            extra: extra_toml,
            ..Setup::default()
        };
        Self::start_full(bin, work_root, label, setup, keep).await
    }

    /// Starts the daemon as `setup` says and waits for `/healthz`.
    pub async fn start_full(
        bin: &Path,
        work_root: &Path,
        label: &str,
        setup: Setup<'_>,
        keep: bool,
    ) -> Result<Daemon> {
        let tag = format!("{}-{label}", std::process::id());
        let dir = work_root.join(format!("koder-bench-{tag}"));
        if dir.exists() {
            fs::remove_dir_all(&dir)
                .with_context(|| format!("removing stale {}", dir.display()))?;
        }
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        // Sandbox uids must traverse to their layers below the data dir.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o711))?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let mut d = Daemon {
            child: None,
            label: label.to_string(),
            base: String::new(),
            // E2B's key shape (`e2b_` + 40 hex digits), so the E2B SDK takes it as it is.
            key: format!("e2b_{:08x}{:032x}", std::process::id(), nanos),
            log: dir.join("daemon.log"),
            cgroup_parent: format!("koder-bench-{tag}"),
            dir,
            daemon_cgroup: None,
            data_fs: false,
            keep,
        };
        if setup.btrfs {
            mount_btrfs(&d.dir)?;
            d.data_fs = true;
        }
        let config = d.dir.join("koder.toml");
        fs::write(
            &config,
            format!(
                "[sessions]\n{}\n[jail]\ncgroup_parent = \"{}\"\n{}\n{}\n",
                setup.sessions, d.cgroup_parent, setup.jail, setup.extra
            ),
        )?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free loopback port")?
            .port();
        let log = fs::File::create(&d.log)?;
        let child = Command::new(bin)
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--data-dir")
            .arg(d.dir.join("data"))
            .arg("--api-key")
            .arg(format!("{TENANT}:{}", d.key))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        d.daemon_cgroup = own_memory_cgroup(&format!("{}-daemon", d.cgroup_parent), child.id());
        d.child = Some(child);
        d.base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = http.get(format!("{}/healthz", d.base)).send().await {
                if r.status().is_success() {
                    return Ok(d);
                }
            }
            if let Some(status) = d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                bail!(
                    "daemon {label} exited during start-up ({status}):\n{}",
                    d.log_tail(20)
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "daemon {label} not healthy within 30 s:\n{}",
                    d.log_tail(20)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// A client with its own connection pool (one "client" of the benchmark).
    pub fn client(&self) -> Result<koder_sdk::Client> {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()?;
        Ok(koder_sdk::Client::with_http_client(
            &self.base, &self.key, http,
        )?)
    }

    /// Warm sandboxes the pool holds for `language` (from `/metrics`): in its lane without
    /// network, or in the one with egress (filled by demand for network open/allowlist).
    pub async fn pool_ready(
        &self,
        http: &reqwest::Client,
        language: &str,
        egress: bool,
    ) -> Result<u64> {
        let text = http
            .get(format!("{}/metrics", self.base))
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?;
        // The gauge is labelled by language and image; the language's lane has one image.
        let label = format!("language=\"{language}\"}} ");
        let series = match egress {
            false => "koder_pool_ready{",
            true => "koder_pool_egress_ready{",
        };
        Ok(text
            .lines()
            .filter(|l| l.starts_with(series))
            .find_map(|l| l.split_once(&label).map(|(_, v)| v))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map_or(0, |v| v as u64))
    }

    /// Waits until the pool of `language` holds `target` sandboxes.
    pub async fn wait_pool(
        &self,
        http: &reqwest::Client,
        language: &str,
        target: u64,
        limit: Duration,
    ) -> Result<()> {
        self.wait_lane(http, language, false, target, limit).await
    }

    /// Waits until a lane of `language`'s pool holds `target` sandboxes.
    pub async fn wait_lane(
        &self,
        http: &reqwest::Client,
        language: &str,
        egress: bool,
        target: u64,
        limit: Duration,
    ) -> Result<()> {
        let deadline = Instant::now() + limit;
        while self.pool_ready(http, language, egress).await? < target {
            if Instant::now() > deadline {
                bail!("the {language} pool did not refill to {target} within {limit:?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    /// Last `n` lines of the daemon's log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// SIGTERM (the daemon destroys its sandboxes), then SIGKILL after `limit`. Returns how long
    /// the shutdown took.
    pub fn stop(&mut self, limit: Duration) -> Option<Duration> {
        let mut child = self.child.take()?;
        let began = Instant::now();
        // SAFETY: kill with our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        while began.elapsed() < limit {
            if let Ok(Some(_)) = child.try_wait() {
                return Some(began.elapsed());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!(
            "koder-bench: daemon {} did not stop within {limit:?}; killing it",
            self.label
        );
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// Removes the cgroup parent (and, should the daemon have died without tearing down, the
    /// sandboxes left in it) and the work dir.
    fn cleanup(&mut self) {
        remove_cgroup_parent(&self.cgroup_parent);
        if let Some((dir, _)) = self.daemon_cgroup.take() {
            for _ in 0..50 {
                if fs::remove_dir(&dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if std::mem::take(&mut self.data_fs) {
            // Lazily: the loop devices of sandbox disks on it let go as their sandboxes went.
            let data = self.dir.join("data");
            if let Err(e) = Command::new("umount").arg("-l").arg(&data).status() {
                eprintln!("koder-bench: unmounting {}: {e}", data.display());
            }
        }
        if !self.keep {
            if let Err(e) = fs::remove_dir_all(&self.dir) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    eprintln!("koder-bench: removing {}: {e}", self.dir.display());
                }
            }
        }
    }
}

/// Makes `<dir>/data` a btrfs filesystem on a sparse file in `dir`.
fn mount_btrfs(dir: &Path) -> Result<()> {
    let image = dir.join("btrfs.img");
    fs::File::create(&image)?.set_len(64 << 30)?;
    let run = |cmd: &mut Command| -> Result<()> {
        let out = cmd
            .output()
            .with_context(|| format!("running {cmd:?} (btrfs-progs)"))?;
        if !out.status.success() {
            bail!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(())
    };
    run(Command::new("mkfs.btrfs").arg("-q").arg(&image))?;
    let data = dir.join("data");
    fs::create_dir(&data)?;
    run(Command::new("mount")
        .args(["-t", "btrfs", "-o", "loop"])
        .arg(&image)
        .arg(&data))
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(120));
        self.cleanup();
    }
}

/// Cgroup directories of `parent` in every mounted hierarchy (v1 controllers and the v2 root).
pub fn cgroup_parent_dirs(parent: &str) -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    let mut dirs = vec![root.join(parent)];
    if let Ok(entries) = fs::read_dir(root) {
        dirs.extend(entries.flatten().map(|e| e.path().join(parent)));
    }
    dirs.retain(|d| d.is_dir());
    dirs
}

/// The memory-controller directory of `parent`: v1 `memory/<parent>` or v2 `<parent>`.
pub fn memory_cgroup(parent: &str) -> Option<(PathBuf, &'static str)> {
    let v1 = Path::new("/sys/fs/cgroup/memory").join(parent);
    if v1.join("memory.usage_in_bytes").exists() {
        return Some((v1, "memory.usage_in_bytes"));
    }
    let v2 = Path::new("/sys/fs/cgroup").join(parent);
    if v2.join("memory.current").exists() {
        return Some((v2, "memory.current"));
    }
    None
}

/// Memory of one cgroup, bytes.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct CgroupMem {
    /// `memory.usage_in_bytes` (v1) / `memory.current` (v2).
    pub usage: u64,
    /// Usage less inactive file cache (the "working set", what reclaim cannot easily take).
    pub working_set: u64,
    /// Page cache, anonymous memory and kernel memory as `memory.stat` splits them.
    pub file: u64,
    pub anon: u64,
    pub kernel: u64,
}

impl std::ops::AddAssign for CgroupMem {
    fn add_assign(&mut self, o: CgroupMem) {
        self.usage += o.usage;
        self.working_set += o.working_set;
        self.file += o.file;
        self.anon += o.anon;
        self.kernel += o.kernel;
    }
}

/// Reads a cgroup's memory (`dir` and its usage file, from [`memory_cgroup`]).
pub fn cgroup_mem(dir: &Path, usage_file: &str) -> Option<CgroupMem> {
    let usage: u64 = fs::read_to_string(dir.join(usage_file))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let stat = fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
    let key = |k: &str| {
        stat.lines()
            .find_map(|l| l.strip_prefix(k).and_then(|v| v.strip_prefix(' ')))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let v1 = usage_file == "memory.usage_in_bytes";
    let (file, anon, inactive_file, kernel) = if v1 {
        let kmem = fs::read_to_string(dir.join("memory.kmem.usage_in_bytes"))
            .ok()
            .and_then(|s| s.trim().parse().ok());
        (
            key("total_cache"),
            key("total_rss"),
            key("total_inactive_file"),
            kmem,
        )
    } else {
        (
            key("file"),
            key("anon"),
            key("inactive_file"),
            key("kernel"),
        )
    };
    Some(CgroupMem {
        usage,
        working_set: usage.saturating_sub(inactive_file.unwrap_or(0)),
        file: file.unwrap_or(0),
        anon: anon.unwrap_or(0),
        kernel: kernel.unwrap_or(0),
    })
}

/// Creates the memory cgroup `name` and moves `pid` into it (best effort: `None` when the
/// host has no usable memory hierarchy).
fn own_memory_cgroup(name: &str, pid: u32) -> Option<(PathBuf, &'static str)> {
    let (dir, file) = if Path::new("/sys/fs/cgroup/memory").is_dir() {
        (
            Path::new("/sys/fs/cgroup/memory").join(name),
            "memory.usage_in_bytes",
        )
    } else if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        (Path::new("/sys/fs/cgroup").join(name), "memory.current")
    } else {
        return None;
    };
    fs::create_dir_all(&dir).ok()?;
    if let Err(e) = fs::write(dir.join("cgroup.procs"), pid.to_string()) {
        eprintln!("koder-bench: moving the daemon into {}: {e}", dir.display());
        let _ = fs::remove_dir(&dir);
        return None;
    }
    Some((dir, file))
}

fn remove_cgroup_parent(parent: &str) {
    for dir in cgroup_parent_dirs(parent) {
        // Only a daemon that died without teardown leaves sandboxes here; they are ours (the
        // parent name is unique to this run), so their processes are killed before the rmdir.
        if let Ok(children) = fs::read_dir(&dir) {
            for child in children.flatten().map(|e| e.path()).filter(|p| p.is_dir()) {
                for _ in 0..50 {
                    let procs = fs::read_to_string(child.join("cgroup.procs")).unwrap_or_default();
                    let pids: Vec<i32> = procs.lines().filter_map(|l| l.parse().ok()).collect();
                    for pid in &pids {
                        // SAFETY: kill with a pid from our own cgroup.
                        unsafe { libc::kill(*pid, libc::SIGKILL) };
                    }
                    if fs::remove_dir(&child).is_ok() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        let _ = fs::remove_dir(&dir);
    }
}
