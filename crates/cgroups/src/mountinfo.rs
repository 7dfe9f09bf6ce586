//! Finding cgroup hierarchies in /proc/self/mountinfo.

use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MountKind {
    /// Controllers bound to this v1 hierarchy, from the super options
    /// (e.g. `rw,cpu,cpuacct`). Named hierarchies (`name=systemd`) are
    /// kept as-is and simply never match a controller we need.
    V1 {
        controllers: Vec<String>,
    },
    V2,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CgroupMount {
    pub kind: MountKind,
    /// Root of the mount within its filesystem: "/" unless this is a bind
    /// mount of a sub-tree or we're inside a cgroup namespace.
    pub root: String,
    pub mount_point: PathBuf,
}

/// Parses mountinfo text (proc(5) format), keeping only cgroup mounts.
/// Malformed lines are skipped rather than failing detection outright.
pub(crate) fn parse(text: &str) -> Vec<CgroupMount> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<CgroupMount> {
    // id parent maj:min root mount-point opts [optional...] - fstype source superopts
    let (pre, post) = line.split_once(" - ")?;
    let pre: Vec<&str> = pre.split(' ').collect();
    if pre.len() < 6 {
        return None;
    }
    let mut post = post.split(' ');
    let fstype = post.next()?;
    let _source = post.next()?;
    let super_opts = post.next().unwrap_or("");
    let kind = match fstype {
        "cgroup2" => MountKind::V2,
        "cgroup" => MountKind::V1 {
            controllers: super_opts
                .split(',')
                .filter(|o| !matches!(*o, "rw" | "ro"))
                .map(str::to_string)
                .collect(),
        },
        _ => return None,
    };
    Some(CgroupMount {
        kind,
        root: unescape(pre[3]),
        mount_point: PathBuf::from(unescape(pre[4])),
    })
}

/// The kernel escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let oct = &b[i + 1..i + 4];
            if oct.iter().all(|c| (b'0'..=b'7').contains(c)) {
                let v = oct
                    .iter()
                    .fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:33 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn hybrid() {
        let m = parse(HYBRID);
        assert_eq!(m.len(), 7);
        assert_eq!(
            m[0],
            CgroupMount {
                kind: MountKind::V1 {
                    controllers: vec!["cpu".into()]
                },
                root: "/".into(),
                mount_point: "/sys/fs/cgroup/cpu".into(),
            }
        );
        assert_eq!(m[6].kind, MountKind::V2);
        assert_eq!(m[6].mount_point, PathBuf::from("/sys/fs/cgroup/unified"));
        assert_eq!(
            m[5].kind,
            MountKind::V1 {
                controllers: vec!["name=systemd".into()]
            }
        );
    }

    #[test]
    fn pure_v2_with_optional_fields() {
        let text = "25 22 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 master:1 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n\
                    22 1 0:21 / /proc rw - proc proc rw\n";
        let m = parse(text);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].kind, MountKind::V2);
        assert_eq!(m[0].mount_point, PathBuf::from("/sys/fs/cgroup"));
    }

    #[test]
    fn comounted_cpu_cpuacct() {
        let text = "30 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:12 - cgroup cgroup rw,cpu,cpuacct\n";
        let m = parse(text);
        assert_eq!(
            m[0].kind,
            MountKind::V1 {
                controllers: vec!["cpu".into(), "cpuacct".into()]
            }
        );
        assert_eq!(
            m[0].mount_point,
            PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")
        );
    }

    #[test]
    fn escaped_mount_point_and_garbage() {
        let text = "1 2 0:1 /sub /tmp/my\\040cg rw - cgroup2 none rw\nnot a mountinfo line\n";
        let m = parse(text);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].mount_point, PathBuf::from("/tmp/my cg"));
        assert_eq!(m[0].root, "/sub");
    }
}
