use std::path::{Path, PathBuf};

use koder_api_types::ErrorCode;

use super::*;
use crate::testutil::write;

#[test]
fn names() {
    for ok in ["box1", "sbx-0f3a_9.v2", "a", &"x".repeat(MAX_NAME_LEN)] {
        validate_name(ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
    }
    for bad in [
        "",
        ".",
        "..",
        ".hidden",
        "a/b",
        "../x",
        "a\0b",
        "sp ace",
        "ünï",
        "cgroup.procs",
        "memory.max",
        &"x".repeat(MAX_NAME_LEN + 1),
    ] {
        let err = validate_name(bad)
            .err()
            .unwrap_or_else(|| panic!("{bad:?} accepted"));
        assert!(matches!(err, CgroupError::InvalidName { .. }));
    }
}

#[test]
fn cpu_quota_from_millis() {
    assert_eq!(
        CpuQuota::from_millis(1000),
        CpuQuota {
            quota_us: 100_000,
            period_us: 100_000
        }
    );
    assert_eq!(CpuQuota::from_millis(2500).quota_us, 250_000);
    assert_eq!(CpuQuota::from_millis(250).quota_us, 25_000);
    // Clamped up to the kernel's 1ms minimum.
    assert_eq!(CpuQuota::from_millis(1).quota_us, 1_000);
    assert_eq!(CpuQuota::from_millis(0).quota_us, 1_000);
    assert!(CpuQuota::from_millis(u64::MAX).validate().is_err());
}

#[test]
fn limits_validation() {
    Limits::default()
        .validate()
        .expect("empty limits are valid");
    let bad = [
        Limits {
            memory_max_bytes: Some(0),
            ..Limits::default()
        },
        Limits {
            pids_max: Some(u64::MAX),
            ..Limits::default()
        },
        Limits {
            cpu: Some(CpuQuota {
                quota_us: 50_000,
                period_us: 2_000_000,
            }),
            ..Limits::default()
        },
    ];
    for l in bad {
        assert!(matches!(
            l.validate().expect_err("invalid"),
            CgroupError::InvalidLimit(_)
        ));
    }
}

#[test]
fn error_codes_and_messages() {
    let e = CgroupError::io(
        "write",
        "/sys/fs/cgroup/x/pids.max",
        std::io::Error::from_raw_os_error(nix::libc::EINVAL),
    );
    assert!(matches!(e, CgroupError::Io { .. }));
    assert_eq!(e.code(), ErrorCode::Internal);
    let msg = e.to_string();
    assert!(msg.contains("write /sys/fs/cgroup/x/pids.max"), "{msg}");
    let path = PathBuf::from("/sys/fs/cgroup/x");
    for (e, code) in [
        (CgroupError::InvalidPid(0), ErrorCode::InvalidArgument),
        (
            CgroupError::InvalidLimit("cpu".into()),
            ErrorCode::InvalidArgument,
        ),
        (
            CgroupError::NoHierarchy("none".into()),
            ErrorCode::RuntimeUnavailable,
        ),
        (
            CgroupError::AlreadyExists { path: path.clone() },
            ErrorCode::Conflict,
        ),
        (
            CgroupError::NotFound { path: path.clone() },
            ErrorCode::NotFound,
        ),
        (
            CgroupError::Unsupported {
                what: "memory.peak",
                path: path.clone(),
            },
            ErrorCode::NotImplemented,
        ),
        (
            CgroupError::Timeout {
                what: "freeze",
                path,
                waited: std::time::Duration::from_secs(1),
            },
            ErrorCode::Internal,
        ),
    ] {
        assert_eq!(e.code(), code, "{e}");
    }
}

fn line(id: u32, mount_point: &Path, fstype: &str, opts: &str) -> String {
    format!(
        "{id} 23 0:{id} / {} rw,nosuid,nodev,noexec,relatime shared:{id} - {fstype} {fstype} {opts}\n",
        mount_point.display()
    )
}

fn v1_lines(base: &Path, comount: bool) -> String {
    let mut s = String::from("22 1 0:21 / /proc rw - proc proc rw\n");
    let mut ctrls: Vec<&str> = vec!["memory", "pids", "freezer", "name=systemd"];
    if comount {
        ctrls.push("cpu,cpuacct");
    } else {
        ctrls.extend(["cpu", "cpuacct"]);
    }
    for (i, c) in ctrls.iter().enumerate() {
        let id = 30 + i as u32;
        s += &line(id, &base.join(c), "cgroup", &format!("rw,{c}"));
    }
    s
}

#[test]
fn detect_hybrid_is_v1() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let unified = tmp.path().join("unified");
    std::fs::create_dir(&unified).expect("mkdir");
    // Hybrid: cgroup2 is mounted but every controller is bound to v1.
    write(&unified.join("cgroup.controllers"), "\n");
    let text = v1_lines(tmp.path(), false) + &line(41, &unified, "cgroup2", "rw");
    let d = detect_from_mountinfo(&text, "koder-sandbox").expect("detect");
    assert_eq!(d.version(), CgroupVersion::V1);
}

#[test]
fn detect_comounted_v1_creates_in_shared_dir() {
    let tmp = tempfile::tempdir().expect("tempdir");
    for c in ["memory", "pids", "freezer", "cpu,cpuacct"] {
        std::fs::create_dir(tmp.path().join(c)).expect("mkdir");
    }
    let d = detect_from_mountinfo(&v1_lines(tmp.path(), true), "koder-sandbox").expect("detect");
    assert_eq!(d.version(), CgroupVersion::V1);
    let cg = d.create("box").expect("create");
    let mut paths = cg.paths();
    paths.sort();
    let mut want: Vec<_> = ["cpu,cpuacct", "freezer", "memory", "pids"]
        .iter()
        .map(|c| tmp.path().join(c).join("koder-sandbox/box"))
        .collect();
    want.sort();
    assert_eq!(paths, want);
    cg.destroy().expect("destroy");
}

#[test]
fn detect_pure_v2() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("cgroup");
    std::fs::create_dir(&root).expect("mkdir");
    write(
        &root.join("cgroup.controllers"),
        "cpuset cpu io memory hugetlb pids rdma misc\n",
    );
    let text = line(25, &root, "cgroup2", "rw,nsdelegate,memory_recursiveprot");
    let d = detect_from_mountinfo(&text, "koder-sandbox").expect("detect");
    assert_eq!(d.version(), CgroupVersion::V2);
}

#[test]
fn detect_nothing_usable() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("cgroup");
    std::fs::create_dir(&root).expect("mkdir");
    write(&root.join("cgroup.controllers"), "cpu memory\n");
    let text = line(25, &root, "cgroup2", "rw")
        + &line(26, &tmp.path().join("memory"), "cgroup", "rw,memory");
    let err = detect_from_mountinfo(&text, "koder-sandbox").expect_err("must fail");
    assert!(matches!(err, CgroupError::NoHierarchy(_)));
    assert!(err.to_string().contains("freezer"), "{err}");
    assert!(matches!(
        detect_from_mountinfo("", "bad/parent").expect_err("bad parent"),
        CgroupError::InvalidName { .. }
    ));
}
