//! Where a volume may be mounted inside a sandbox: the one checker, used by the session layer
//! on user input and by the agent again before it mounts (the agent trusts no one's check).

/// Longest target accepted, in bytes (`PATH_MAX`).
pub const MAX_MOUNT_TARGET_LEN: usize = 4096;

/// Trees a volume must never cover: the kernel interfaces the sandbox's walls are built on.
const RESERVED: &[&str] = &["/proc", "/sys", "/dev"];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MountTargetError {
    #[error("mount target must be an absolute path")]
    NotAbsolute,
    #[error("mount target contains a NUL byte")]
    Nul,
    #[error("mount target is longer than {MAX_MOUNT_TARGET_LEN} bytes")]
    TooLong,
    #[error(
        "mount target {0:?} is not normalized (empty, '.' or '..' component, or trailing '/')"
    )]
    NotNormalized(String),
    #[error("mount target cannot be /")]
    Root,
    #[error("mount target {0:?} is under {1}, which volumes may not cover")]
    Reserved(String, &'static str),
    #[error("mount target {0:?} is given twice")]
    Duplicate(String),
    #[error("mount target {inner:?} is under another target, {outer:?}")]
    Nested { outer: String, inner: String },
}

/// Checks one target: absolute, normalized (no empty, `.` or `..` component, no trailing `/`),
/// no NUL, at most [`MAX_MOUNT_TARGET_LEN`] bytes, not `/`, and neither `/proc`, `/sys`, `/dev`
/// nor anything under them.
pub fn check_mount_target(path: &str) -> Result<(), MountTargetError> {
    if path.len() > MAX_MOUNT_TARGET_LEN {
        return Err(MountTargetError::TooLong);
    }
    if path.contains('\0') {
        return Err(MountTargetError::Nul);
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(MountTargetError::NotAbsolute);
    };
    if rest.is_empty() {
        return Err(MountTargetError::Root);
    }
    if rest
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(MountTargetError::NotNormalized(path.to_string()));
    }
    match RESERVED.iter().find(|r| is_within(path, r)) {
        Some(r) => Err(MountTargetError::Reserved(path.to_string(), r)),
        None => Ok(()),
    }
}

/// Checks every target of one sandbox: each on its own ([`check_mount_target`]), and together
/// distinct with none under another (a later mount would hide or be hidden by an earlier one).
pub fn check_mount_targets(paths: &[&str]) -> Result<(), MountTargetError> {
    for path in paths {
        check_mount_target(path)?;
    }
    for (i, a) in paths.iter().enumerate() {
        for b in &paths[i + 1..] {
            if a == b {
                return Err(MountTargetError::Duplicate(a.to_string()));
            }
            let nested = |outer: &str, inner: &str| MountTargetError::Nested {
                outer: outer.to_string(),
                inner: inner.to_string(),
            };
            if is_within(b, a) {
                return Err(nested(a, b));
            }
            if is_within(a, b) {
                return Err(nested(b, a));
            }
        }
    }
    Ok(())
}

/// Whether normalized `path` is `dir` or below it (`/ab` is not below `/a`).
fn is_within(path: &str, dir: &str) -> bool {
    path.strip_prefix(dir)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use MountTargetError as E;

    #[test]
    fn accepts_normal_targets() {
        for ok in [
            "/data",
            "/workspace/data",
            "/home/user/.cache",
            "/données/ünïcødé",
            "/procfs",
            "/devices",
            "/system",
            "/tmp/x",
            "/a...b/c.d",
        ] {
            assert_eq!(check_mount_target(ok), Ok(()), "{ok:?}");
        }
        let longest = format!("/{}", "a/".repeat(2047) + "b");
        assert_eq!(longest.len(), MAX_MOUNT_TARGET_LEN);
        assert_eq!(check_mount_target(&longest), Ok(()));
    }

    #[test]
    fn refuses_hostile_targets() {
        type Expected = fn(&E) -> bool;
        let cases: &[(&str, Expected)] = &[
            ("", |e| *e == E::NotAbsolute),
            ("data", |e| *e == E::NotAbsolute),
            ("./data", |e| *e == E::NotAbsolute),
            ("/", |e| *e == E::Root),
            ("//", |e| matches!(e, E::NotNormalized(_))),
            ("//x", |e| matches!(e, E::NotNormalized(_))),
            ("/x/", |e| matches!(e, E::NotNormalized(_))),
            ("/x//y", |e| matches!(e, E::NotNormalized(_))),
            ("/a/../b", |e| matches!(e, E::NotNormalized(_))),
            ("/a/./b", |e| matches!(e, E::NotNormalized(_))),
            ("/..", |e| matches!(e, E::NotNormalized(_))),
            ("/.", |e| matches!(e, E::NotNormalized(_))),
            ("/data\0/etc", |e| *e == E::Nul),
            ("/proc", |e| matches!(e, E::Reserved(_, "/proc"))),
            ("/proc/self", |e| matches!(e, E::Reserved(_, "/proc"))),
            ("/proc/1/root", |e| matches!(e, E::Reserved(_, "/proc"))),
            ("/sys/fs/cgroup", |e| matches!(e, E::Reserved(_, "/sys"))),
            ("/dev", |e| matches!(e, E::Reserved(_, "/dev"))),
            ("/dev/shm", |e| matches!(e, E::Reserved(_, "/dev"))),
        ];
        for (bad, expected) in cases {
            let err = check_mount_target(bad).expect_err(bad);
            assert!(expected(&err), "{bad:?}: {err:?}");
        }
        let huge = format!("/{}", "x".repeat(4999));
        assert_eq!(check_mount_target(&huge), Err(E::TooLong));
        let just_over = format!("/{}", "x".repeat(MAX_MOUNT_TARGET_LEN));
        assert_eq!(check_mount_target(&just_over), Err(E::TooLong));
    }

    #[test]
    fn targets_of_one_sandbox_are_distinct_and_disjoint() {
        assert_eq!(check_mount_targets(&[]), Ok(()));
        assert_eq!(check_mount_targets(&["/a", "/ab", "/b/a"]), Ok(()));
        assert_eq!(
            check_mount_targets(&["/a", "/b", "/a"]),
            Err(E::Duplicate("/a".into()))
        );
        let nested = E::Nested {
            outer: "/a".into(),
            inner: "/a/b".into(),
        };
        assert_eq!(check_mount_targets(&["/a", "/a/b"]), Err(nested.clone()));
        assert_eq!(check_mount_targets(&["/a/b", "/a"]), Err(nested));
        assert!(matches!(
            check_mount_targets(&["/ok", "/proc/x"]),
            Err(E::Reserved(..))
        ));
    }
}
