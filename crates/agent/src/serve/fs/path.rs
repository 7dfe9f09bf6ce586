//! Lexical handling of request paths: validation, normalisation, splitting. No system calls.

use koder_agent_protocol::MAX_PATH_BYTES;

/// Checks a raw request path before any interpretation.
pub(super) fn check_raw(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        Err("empty path")
    } else if path.contains('\0') {
        Err("path contains a NUL byte")
    } else if path.len() > MAX_PATH_BYTES {
        Err("path too long")
    } else {
        Ok(())
    }
}

/// Normalises a path lexically into an absolute path: drops empty and `.` components, `..`
/// removes the previous component (and stays at the root at the top).
pub(super) fn lexical_normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for component in path.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    if parts.is_empty() {
        return "/".to_owned();
    }
    let mut out = String::with_capacity(path.len() + 1);
    for part in parts {
        out.push('/');
        out.push_str(part);
    }
    out
}

/// The normalised absolute path as a path relative to the root descriptor.
pub(super) fn relative(abs: &str) -> &str {
    let rel = abs.trim_start_matches('/');
    if rel.is_empty() {
        "."
    } else {
        rel
    }
}

/// Parent path and last name of a normalised absolute path; `None` for the root.
pub(super) fn split_parent(abs: &str) -> Option<(&str, &str)> {
    let index = abs.rfind('/')?;
    let name = &abs[index + 1..];
    if name.is_empty() {
        return None;
    }
    let parent = if index == 0 { "/" } else { &abs[..index] };
    Some((parent, name))
}

pub(super) fn join(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lexical_normalisation() {
        assert_eq!(lexical_normalize("/"), "/");
        assert_eq!(lexical_normalize("/a//b/./c/"), "/a/b/c");
        assert_eq!(lexical_normalize("/workspace/x/.."), "/workspace");
        assert_eq!(lexical_normalize("/../../etc/passwd"), "/etc/passwd");
        assert_eq!(lexical_normalize("a/../../.."), "/");
        assert_eq!(split_parent("/"), None);
        assert_eq!(split_parent("/a"), Some(("/", "a")));
        assert_eq!(split_parent("/a/b"), Some(("/a", "b")));
    }
}
