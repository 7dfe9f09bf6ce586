//! Tests against the host's real cgroup hierarchy. They need root and skip
//! (with a printed reason) otherwise.

use std::fs;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use koder_cgroups::{
    detect, Cgroup, CgroupDriver, CgroupError, CgroupVersion, CpuQuota, Limits, V2Driver,
};

const PARENT: &str = "koder-sandbox-test";
const MIB: u64 = 1024 * 1024;

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Held for a whole test: each test's `Guard` removes the shared parent once its own group is
/// gone, which raced another test between making that parent (`detect`) and its group in it.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

type Serial = std::sync::MutexGuard<'static, ()>;

fn driver_or_skip(test: &str) -> Option<(koder_cgroups::Driver, Serial)> {
    if !is_root() {
        eprintln!("SKIP {test}: not running as root");
        return None;
    }
    // A test that failed while holding it poisoned nothing the next one uses.
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    match detect(PARENT) {
        Ok(d) => Some((d, serial)),
        Err(e) => {
            eprintln!("SKIP {test}: no usable cgroup hierarchy: {e}");
            None
        }
    }
}

/// Destroys the cgroup even when an assertion fails mid-test.
struct Guard(Box<dyn Cgroup>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Err(e) = self.0.destroy() {
            eprintln!("cleanup of {} failed: {e}", self.0.name());
        }
        // The shared parent goes once the last test's group is gone (busy until then).
        for group in self.0.paths() {
            if let Some(parent) = group.parent() {
                let _ = std::fs::remove_dir(parent);
            }
        }
    }
}

/// Kills and reaps the child if the test bails out early.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `argv` behind a shell that waits for a line on stdin, so the
/// program only execs (and allocates) after it's been moved into the
/// cgroup: v1 charges memory where it was allocated, not where it lives.
fn spawn_gated(argv: &[&str]) -> ChildGuard {
    let child = Command::new("/bin/sh")
        .arg("-c")
        .arg("read x; exec \"$@\"")
        .arg("sh")
        .args(argv)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    ChildGuard(child)
}

fn release(child: &mut ChildGuard) {
    let mut stdin = child.0.stdin.take().expect("stdin");
    stdin.write_all(b"go\n").expect("release gate");
}

/// The directory holding `file` among the cgroup's per-hierarchy dirs.
fn dir_with(cg: &dyn Cgroup, file: &str) -> PathBuf {
    cg.paths()
        .into_iter()
        .find(|d| d.join(file).exists())
        .unwrap_or_else(|| panic!("no dir with {file} in {:?}", cg.paths()))
}

fn read(p: &Path) -> String {
    fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
        .trim()
        .to_string()
}

fn proc_state(pid: u32) -> String {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("State:"))
        .unwrap_or("State: ?")
        .to_string()
}

fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if cond() {
            return true;
        }
        thread::sleep(Duration::from_millis(10));
    }
    cond()
}

#[test]
fn lifecycle() {
    let Some((driver, _serial)) = driver_or_skip("lifecycle") else {
        return;
    };
    let name = format!("t{}-lifecycle", std::process::id());
    let guard = Guard(driver.create(&name).expect("create"));
    let cg = &*guard.0;
    assert!(driver.list().expect("list").contains(&name));

    let mut child = spawn_gated(&["sleep", "30"]);
    let pid = child.0.id();
    cg.add_process(pid).expect("add_process");
    release(&mut child);
    assert_eq!(cg.pids().expect("pids"), vec![pid]);

    cg.set_limits(&Limits {
        memory_max_bytes: Some(64 * MIB),
        cpu: Some(CpuQuota::from_millis(500)),
        pids_max: Some(16),
    })
    .expect("set_limits");
    // Raise then lower again: on v1 this exercises the memsw ordering.
    for mem in [128 * MIB, 32 * MIB, 64 * MIB] {
        cg.set_limits(&Limits {
            memory_max_bytes: Some(mem),
            cpu: Some(CpuQuota::from_millis(500)),
            pids_max: Some(16),
        })
        .unwrap_or_else(|e| panic!("set_limits {mem}: {e}"));
    }
    match driver.version() {
        CgroupVersion::V1 => {
            let mem = dir_with(cg, "memory.limit_in_bytes");
            assert_eq!(
                read(&mem.join("memory.limit_in_bytes")),
                (64 * MIB).to_string()
            );
            if mem.join("memory.memsw.limit_in_bytes").exists() {
                assert_eq!(
                    read(&mem.join("memory.memsw.limit_in_bytes")),
                    (64 * MIB).to_string()
                );
            }
            let cpu = dir_with(cg, "cpu.cfs_quota_us");
            assert_eq!(read(&cpu.join("cpu.cfs_quota_us")), "50000");
            assert_eq!(read(&cpu.join("cpu.cfs_period_us")), "100000");
            assert_eq!(read(&dir_with(cg, "pids.max").join("pids.max")), "16");
        }
        CgroupVersion::V2 => {
            let d = dir_with(cg, "memory.max");
            assert_eq!(read(&d.join("memory.max")), (64 * MIB).to_string());
            assert_eq!(read(&d.join("cpu.max")), "50000 100000");
            assert_eq!(read(&d.join("pids.max")), "16");
        }
    }

    // Memory is charged as `sleep` execs inside the group.
    let mut stats = cg.stats().expect("stats");
    assert!(
        wait_until(Duration::from_secs(2), || {
            stats = cg.stats().expect("stats");
            stats.memory_current_bytes > 0
        }),
        "memory never charged: {stats:?}"
    );
    assert_eq!(stats.pids_current, 1, "{stats:?}");
    assert_eq!(stats.oom_kills, 0);
    assert!(stats.memory_peak_bytes >= stats.memory_current_bytes);
    eprintln!("stats: {stats:?}");

    match cg.reset_memory_peak() {
        Ok(()) => {}
        Err(e) => assert!(matches!(e, CgroupError::Unsupported { .. }), "{e}"),
    }

    cg.freeze().expect("freeze");
    match driver.version() {
        CgroupVersion::V1 => {
            let f = dir_with(cg, "freezer.state");
            assert_eq!(read(&f.join("freezer.state")), "FROZEN");
        }
        CgroupVersion::V2 => {
            let d = dir_with(cg, "cgroup.events");
            assert!(read(&d.join("cgroup.events")).contains("frozen 1"));
        }
    }
    eprintln!("frozen child {}", proc_state(pid));
    cg.thaw().expect("thaw");
    if driver.version() == CgroupVersion::V1 {
        let f = dir_with(cg, "freezer.state");
        assert_eq!(read(&f.join("freezer.state")), "THAWED");
    }

    cg.kill_all().expect("kill_all");
    let status = child.0.wait().expect("wait");
    assert_eq!(status.signal(), Some(nix::libc::SIGKILL), "{status:?}");
    assert!(cg.pids().expect("pids").is_empty());

    let paths = cg.paths();
    cg.destroy().expect("destroy");
    for p in &paths {
        assert!(!p.exists(), "{} still exists", p.display());
    }
    cg.destroy().expect("destroy is idempotent");
    assert!(!driver.list().expect("list").contains(&name));
    let err = driver.open(&name).err().expect("gone");
    assert!(matches!(err, CgroupError::NotFound { .. }));
}

#[test]
fn oom_kill_is_counted() {
    let Some((driver, _serial)) = driver_or_skip("oom_kill_is_counted") else {
        return;
    };
    let python = "/usr/bin/python3";
    if !Path::new(python).exists() {
        eprintln!("SKIP oom_kill_is_counted: {python} missing");
        return;
    }
    let name = format!("t{}-oom", std::process::id());
    let guard = Guard(driver.create(&name).expect("create"));
    let cg = &*guard.0;
    let cap = 32 * MIB;
    cg.set_limits(&Limits {
        memory_max_bytes: Some(cap),
        ..Limits::default()
    })
    .expect("set_limits");

    let mut child = spawn_gated(&[python, "-c", "a = bytearray(200 * 1024 * 1024)"]);
    cg.add_process(child.0.id()).expect("add_process");
    release(&mut child);
    let status = child.0.wait().expect("wait");
    assert_eq!(
        status.signal(),
        Some(nix::libc::SIGKILL),
        "expected OOM kill, got {status:?}"
    );

    let stats = cg.stats().expect("stats");
    eprintln!("stats after OOM: {stats:?}");
    assert!(stats.oom_kills >= 1, "{stats:?}");
    assert!(
        stats.memory_peak_bytes > cap * 3 / 4 && stats.memory_peak_bytes <= cap + MIB,
        "peak {} not near cap {cap}",
        stats.memory_peak_bytes
    );
    cg.destroy().expect("destroy");
}

#[test]
fn pids_limit_refuses_forks() {
    let Some((driver, _serial)) = driver_or_skip("pids_limit_refuses_forks") else {
        return;
    };
    let name = format!("t{}-pids", std::process::id());
    let guard = Guard(driver.create(&name).expect("create"));
    let cg = &*guard.0;
    cg.set_limits(&Limits {
        pids_max: Some(2),
        ..Limits::default()
    })
    .expect("set_limits");
    // Tries to start 5 background sleeps; only one more fits beside sh.
    let mut child = spawn_gated(&[
        "/bin/sh",
        "-c",
        "for i in 1 2 3 4 5; do sleep 30 & done 2>/dev/null; wait",
    ]);
    cg.add_process(child.0.id()).expect("add_process");
    release(&mut child);
    let mut stats = cg.stats().expect("stats");
    assert!(
        wait_until(Duration::from_secs(2), || {
            stats = cg.stats().expect("stats");
            stats.pids_max_hits >= 1
        }),
        "no fork refused: {stats:?}"
    );
    assert!(stats.pids_current <= 2, "{stats:?}");
    cg.kill_all().expect("kill_all");
    child.0.wait().expect("wait");
}

/// A supervisor in one child group survives the OOM of a workload in its sibling, the kill is
/// counted where it happened, and a process joins a group through its `cgroup.procs` files.
#[test]
fn oom_stays_in_the_workload_child() {
    let Some((driver, _serial)) = driver_or_skip("oom_stays_in_the_workload_child") else {
        return;
    };
    let python = "/usr/bin/python3";
    if !Path::new(python).exists() {
        eprintln!("SKIP oom_stays_in_the_workload_child: {python} missing");
        return;
    }
    let name = format!("t{}-nested", std::process::id());
    let guard = Guard(driver.create(&name).expect("create"));
    let top = &*guard.0;
    top.set_limits(&Limits {
        memory_max_bytes: Some(96 * MIB),
        pids_max: Some(40),
        ..Limits::default()
    })
    .expect("top limits");
    let agent = top.create_child("agent").expect("agent child");
    let workload = top.create_child("workload").expect("workload child");
    workload
        .set_limits(&Limits {
            memory_max_bytes: Some(32 * MIB),
            cpu: Some(CpuQuota::from_millis(500)),
            pids_max: Some(8),
        })
        .expect("workload limits");

    let mut supervisor = spawn_gated(&["sleep", "30"]);
    agent
        .add_process(supervisor.0.id())
        .expect("add supervisor");
    release(&mut supervisor);

    // The hog moves itself, the way the agent's children do before exec.
    let mut join = String::new();
    for f in workload.join_files() {
        join.push_str(&format!("echo 0 > '{}' && ", f.display()));
    }
    let mut hog = ChildGuard(
        Command::new("/bin/sh")
            .arg("-c")
            .arg(format!(
                "{join}exec {python} -c 'a = bytearray(200 * 1024 * 1024)'"
            ))
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn hog"),
    );
    let status = hog.0.wait().expect("wait hog");
    assert_eq!(status.signal(), Some(nix::libc::SIGKILL), "{status:?}");
    assert!(workload.stats().expect("stats").oom_kills >= 1);
    assert_eq!(agent.stats().expect("stats").oom_kills, 0);
    assert_eq!(supervisor.0.try_wait().expect("try_wait"), None);
    assert_eq!(agent.pids().expect("pids"), vec![supervisor.0.id()]);

    // The top group's own destroy takes the children (and their members) with it.
    let paths: Vec<PathBuf> = [top.paths(), agent.paths(), workload.paths()].concat();
    top.destroy().expect("destroy");
    for p in &paths {
        assert!(!p.exists(), "{} still exists", p.display());
    }
    let status = supervisor.0.wait().expect("wait supervisor");
    assert_eq!(status.signal(), Some(nix::libc::SIGKILL), "{status:?}");
}

/// On hybrid hosts the controller-less cgroup2 mount still has the core
/// freezer and cgroup.kill, so the v2 process-control paths get real
/// kernel coverage even here.
#[test]
fn v2_core_on_controllerless_mount() {
    if !is_root() {
        eprintln!("SKIP v2_core_on_controllerless_mount: not running as root");
        return;
    }
    let root = PathBuf::from("/sys/fs/cgroup/unified");
    if !root.join("cgroup.procs").exists() {
        eprintln!(
            "SKIP v2_core_on_controllerless_mount: no {}",
            root.display()
        );
        return;
    }
    let name = format!("t{}-v2core", std::process::id());
    let dir = root.join(PARENT).join(&name);
    // create() would insist on memory/cpu/pids, which this mount lacks, so
    // make the directory by hand and use open().
    if let Err(e) = fs::create_dir_all(&dir) {
        eprintln!(
            "SKIP v2_core_on_controllerless_mount: mkdir {}: {e}",
            dir.display()
        );
        return;
    }
    let driver = V2Driver::new(root.clone(), PARENT).expect("driver");
    let guard = Guard(driver.open(&name).expect("open"));
    let cg = &*guard.0;
    assert!(driver.list().expect("list").contains(&name));

    let mut child = spawn_gated(&["sleep", "30"]);
    let pid = child.0.id();
    cg.add_process(pid).expect("add_process");
    release(&mut child);
    assert_eq!(cg.pids().expect("pids"), vec![pid]);

    // No memory controller here, so there's no memory.peak to reset.
    let err = cg.reset_memory_peak().expect_err("unsupported");
    assert!(matches!(err, CgroupError::Unsupported { .. }));

    cg.freeze().expect("freeze");
    assert!(read(&dir.join("cgroup.events")).contains("frozen 1"));
    eprintln!("frozen child {}", proc_state(pid));
    cg.thaw().expect("thaw");
    assert!(read(&dir.join("cgroup.events")).contains("frozen 0"));

    // Killing a frozen group must work too.
    cg.freeze().expect("freeze again");
    cg.kill_all().expect("kill_all");
    let status = child.0.wait().expect("wait");
    assert_eq!(status.signal(), Some(nix::libc::SIGKILL));
    cg.destroy().expect("destroy");
    assert!(!dir.exists());
}

/// The per-exec reads through kept descriptors follow the kernel as the full `stats` does: the
/// OOM kill, the refused forks and the peak of a workload leaf, read before and after; and
/// the descriptors kept open in that leaf do not stop its parent's destroy from removing it.
#[test]
fn exec_counters_follow_the_kernel() {
    let Some((driver, _serial)) = driver_or_skip("exec_counters_follow_the_kernel") else {
        return;
    };
    let python = "/usr/bin/python3";
    if !Path::new(python).exists() {
        eprintln!("SKIP exec_counters_follow_the_kernel: {python} missing");
        return;
    }
    let name = format!("t{}-counters", std::process::id());
    let guard = Guard(driver.create(&name).expect("create"));
    let top = &*guard.0;
    let workload = top.create_child("workload").expect("workload child");
    let cap = 32 * MIB;
    workload
        .set_limits(&Limits {
            memory_max_bytes: Some(cap),
            pids_max: Some(3),
            ..Limits::default()
        })
        .expect("workload limits");
    // What the files say when opened and read afresh by path.
    let same_as_stats = |cg: &dyn Cgroup| {
        let keyed = |file: &str, key: &str| -> u64 {
            let text = read(&dir_with(cg, file).join(file));
            text.lines()
                .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
                .unwrap_or(0)
        };
        let oom_file = match driver.version() {
            CgroupVersion::V1 => "memory.oom_control",
            CgroupVersion::V2 => "memory.events",
        };
        let counters = cg.exec_counters().expect("counters");
        assert_eq!(
            (counters.oom_kills, counters.pids_max_hits),
            (keyed(oom_file, "oom_kill "), keyed("pids.events", "max ")),
        );
        counters
    };
    let before = same_as_stats(&*workload);
    assert_eq!((before.oom_kills, before.pids_max_hits), (0, 0));

    let mut hog = spawn_gated(&[python, "-c", "a = bytearray(200 * 1024 * 1024)"]);
    workload.add_process(hog.0.id()).expect("add hog");
    release(&mut hog);
    let status = hog.0.wait().expect("wait hog");
    assert_eq!(status.signal(), Some(nix::libc::SIGKILL), "{status:?}");
    let after_oom = same_as_stats(&*workload);
    assert!(after_oom.oom_kills > before.oom_kills, "{after_oom:?}");
    assert_eq!(after_oom.pids_max_hits, 0);
    let peak = workload.memory_peak().expect("peak");
    assert!(
        peak > cap * 3 / 4 && peak <= cap + MIB,
        "peak {peak} not near cap {cap}"
    );

    // The reset goes through the descriptor the peak is read from: the high-water mark starts
    // again from what the (now empty) group holds.
    match workload.reset_memory_peak() {
        Ok(()) => {
            let reset = workload.memory_peak().expect("peak");
            assert!(reset < cap / 2, "peak {reset} after reset");
        }
        Err(e) => assert!(matches!(e, CgroupError::Unsupported { .. }), "{e}"),
    }

    let mut forks = spawn_gated(&[
        "/bin/sh",
        "-c",
        "for i in 1 2 3 4 5; do sleep 30 & done 2>/dev/null; wait",
    ]);
    workload.add_process(forks.0.id()).expect("add forker");
    release(&mut forks);
    assert!(
        wait_until(Duration::from_secs(2), || {
            workload.exec_counters().expect("counters").pids_max_hits > 0
        }),
        "no fork refused"
    );
    let after_forks = same_as_stats(&*workload);
    assert_eq!(after_forks.oom_kills, after_oom.oom_kills);

    let paths: Vec<PathBuf> = [top.paths(), workload.paths()].concat();
    top.destroy()
        .expect("destroy with the leaf's descriptors still open");
    for p in &paths {
        assert!(!p.exists(), "{} still exists", p.display());
    }
    forks.0.wait().expect("wait forker");
    // What the kept descriptors read once the group is gone is an error, never stale figures.
    assert!(workload.exec_counters().is_err());
    assert!(workload.memory_peak().is_err());
}

/// The kernel renames a v1 group with its children in every hierarchy (what a create made
/// ahead relies on); cgroup2 refuses, and says so.
#[test]
fn rename_on_the_real_hierarchy() {
    let Some((driver, _serial)) = driver_or_skip("rename_on_the_real_hierarchy") else {
        return;
    };
    let (from, to) = (
        format!("t{}-ahead", std::process::id()),
        format!("t{}-named", std::process::id()),
    );
    let made = Guard(driver.create(&from).expect("create"));
    made.0.create_child("leaf").expect("child");
    match driver.version() {
        CgroupVersion::V1 => {
            let renamed = Guard(driver.rename(&from, &to).expect("rename"));
            let names = driver.list().expect("list");
            assert!(names.contains(&to) && !names.contains(&from), "{names:?}");
            for p in renamed.0.paths() {
                assert!(p.join("leaf/cgroup.procs").is_file(), "{}", p.display());
            }
            let mut child = spawn_gated(&["true"]);
            let leaf = renamed.0.open_child("leaf").expect("open leaf");
            leaf.add_process(child.0.id())
                .expect("add to the renamed leaf");
            release(&mut child);
            // The group made ahead is gone under its old name: nothing for its guard to do.
            drop(made);
        }
        CgroupVersion::V2 => {
            let err = driver.rename(&from, &to).err().expect("v2 cannot rename");
            assert!(matches!(err, CgroupError::Unsupported { .. }), "{err}");
        }
    }
}
