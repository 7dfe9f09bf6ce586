//! Fake cgroupfs trees for unit tests. Plain directories don't grow control
//! files on mkdir, so tests call `create()` and then `populate_*` the new
//! directory with what the kernel would have put there.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use crate::V1Controller;

pub(crate) fn write(path: &Path, content: &str) {
    fs::write(path, content).expect("write fake control file");
}

pub(crate) fn read(path: &Path) -> String {
    fs::read_to_string(path).expect("read fake control file")
}

/// v1 roots under `base`; `comount` puts cpu and cpuacct in one hierarchy
/// like most distros do.
pub(crate) fn v1_roots(base: &Path, comount: bool) -> HashMap<V1Controller, PathBuf> {
    let mut roots = HashMap::new();
    for c in V1Controller::ALL {
        let dir = match c {
            V1Controller::Cpu | V1Controller::Cpuacct if comount => base.join("cpu,cpuacct"),
            _ => base.join(c.name()),
        };
        fs::create_dir_all(&dir).expect("mkdir fake root");
        write(&dir.join("cgroup.procs"), "1\n");
        roots.insert(c, dir);
    }
    roots
}

pub(crate) const UNLIMITED_V1: &str = "9223372036854771712\n";

pub(crate) fn populate_v1(dirs: &[PathBuf]) {
    for d in dirs {
        write(&d.join("cgroup.procs"), "");
        write(&d.join("tasks"), "");
        // Which hierarchy is this? Tests name roots after the controller.
        let hier = d
            .parent()
            .and_then(Path::parent)
            .and_then(Path::file_name)
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        for ctrl in hier.split(',') {
            match ctrl {
                "memory" => {
                    write(&d.join("memory.limit_in_bytes"), UNLIMITED_V1);
                    write(&d.join("memory.memsw.limit_in_bytes"), UNLIMITED_V1);
                    write(&d.join("memory.swappiness"), "60\n");
                    write(&d.join("memory.usage_in_bytes"), "1060864\n");
                    write(&d.join("memory.max_usage_in_bytes"), "33554432\n");
                    write(
                        &d.join("memory.oom_control"),
                        "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
                    );
                    write(&d.join("memory.failcnt"), "1234\n");
                }
                "cpu" => {
                    write(&d.join("cpu.cfs_quota_us"), "-1\n");
                    write(&d.join("cpu.cfs_period_us"), "100000\n");
                    write(
                        &d.join("cpu.stat"),
                        "nr_periods 10\nnr_throttled 4\nthrottled_time 2500000\nnr_bursts 0\nburst_time 0\n",
                    );
                }
                "cpuacct" => write(&d.join("cpuacct.usage"), "61100275410\n"),
                "pids" => {
                    write(&d.join("pids.max"), "max\n");
                    write(&d.join("pids.current"), "2\n");
                    write(&d.join("pids.events"), "max 4\n");
                }
                "freezer" => write(&d.join("freezer.state"), "THAWED\n"),
                _ => {}
            }
        }
    }
}

/// A v2 root with our controllers available but not yet delegated, and
/// the parent directory pre-made (a plain mkdir wouldn't get its files).
pub(crate) fn v2_root(base: &Path, parent: &str) -> PathBuf {
    let root = base.join("unified");
    fs::create_dir_all(root.join(parent)).expect("mkdir fake v2 root");
    write(
        &root.join("cgroup.controllers"),
        "cpuset cpu io memory hugetlb pids rdma misc\n",
    );
    write(&root.join("cgroup.subtree_control"), "\n");
    write(&root.join("cgroup.procs"), "1\n");
    write(
        &root.join(parent).join("cgroup.controllers"),
        "cpu memory pids\n",
    );
    write(&root.join(parent).join("cgroup.subtree_control"), "\n");
    root
}

pub(crate) fn populate_v2(d: &Path) {
    for (file, content) in [
        ("cgroup.procs", ""),
        ("cgroup.freeze", "0\n"),
        ("cgroup.kill", ""),
        ("cgroup.events", "populated 1\nfrozen 0\n"),
        ("memory.max", "max\n"),
        ("memory.swap.max", "max\n"),
        ("memory.current", "2154496\n"),
        ("memory.peak", "8388608\n"),
        (
            "memory.events",
            "low 0\nhigh 0\nmax 5\noom 2\noom_kill 2\noom_group_kill 0\n",
        ),
        ("cpu.max", "max 100000\n"),
        (
            "cpu.stat",
            "usage_usec 1234\nuser_usec 1000\nsystem_usec 234\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n",
        ),
        ("pids.max", "max\n"),
        ("pids.current", "1\n"),
        ("pids.events", "max 4\n"),
    ] {
        write(&d.join(file), content);
    }
}
