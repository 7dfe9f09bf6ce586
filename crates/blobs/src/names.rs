//! Tenant and key validation, and their mapping onto store paths: the one place that decides
//! what a name may be, so no hostile name reaches a store path.

use object_store::path::Path;

use crate::BlobError;

const TENANT_MAX: usize = 128;
const KEY_MAX: usize = 512;
/// Filesystems cap a name at 255 bytes, and a local upload stages as `<segment>#<n>`.
const SEGMENT_MAX: usize = 240;
/// The directory under the configured prefix that holds one directory per tenant.
pub(crate) const TENANTS: &str = "tenants";

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

/// One path segment: 1-240 of `[A-Za-z0-9._-]`, never `.` or `..`.
fn valid_segment(s: &str) -> bool {
    !s.is_empty() && s.len() <= SEGMENT_MAX && s != "." && s != ".." && s.bytes().all(is_name_byte)
}

pub(crate) fn valid_tenant(tenant: &str) -> bool {
    tenant.len() <= TENANT_MAX && valid_segment(tenant)
}

pub(crate) fn valid_key(key: &str) -> bool {
    key.len() <= KEY_MAX && key.split('/').all(valid_segment)
}

/// Shortens a rejected name for the error message: it may be 10 KB of garbage.
fn shown(name: &str) -> String {
    let mut s: String = name.chars().take(64).collect();
    if s.len() < name.len() {
        s.push('…');
    }
    format!("{s:?}")
}

pub(crate) fn check_tenant(tenant: &str) -> Result<(), BlobError> {
    if valid_tenant(tenant) {
        Ok(())
    } else {
        Err(BlobError::InvalidKey(format!(
            "tenant {} (want 1-{TENANT_MAX} of [A-Za-z0-9._-], not . or ..)",
            shown(tenant)
        )))
    }
}

pub(crate) fn check_key(key: &str) -> Result<(), BlobError> {
    if valid_key(key) {
        Ok(())
    } else {
        Err(BlobError::InvalidKey(format!(
            "key {} (want /-separated segments of 1-{SEGMENT_MAX} of [A-Za-z0-9._-], no . or .., at most {KEY_MAX} bytes)",
            shown(key)
        )))
    }
}

/// `<prefix>/tenants/<tenant>`.
pub(crate) fn tenant_dir(prefix: &Path, tenant: &str) -> Result<Path, BlobError> {
    check_tenant(tenant)?;
    Ok(prefix.clone().join(TENANTS).join(tenant))
}

/// `<prefix>/tenants/<tenant>/<key>`.
pub(crate) fn object_path(prefix: &Path, tenant: &str, key: &str) -> Result<Path, BlobError> {
    let dir = tenant_dir(prefix, tenant)?;
    check_key(key)?;
    Ok(key.split('/').fold(dir, |p, seg| p.join(seg)))
}

/// The key of `location` inside `dir`, if it is one this crate could have written.
pub(crate) fn key_in(dir: &Path, location: &Path) -> Option<String> {
    let parts: Vec<_> = location.prefix_match(dir)?.collect();
    let key = parts
        .iter()
        .map(|p| p.as_ref())
        .collect::<Vec<_>>()
        .join("/");
    valid_key(&key).then_some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "A-b_c.d", "..a", "a..", &"x".repeat(128)] {
            assert!(valid_tenant(ok), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "a\0", "é", " ", &"x".repeat(129)] {
            assert!(!valid_tenant(bad), "{bad:?}");
        }
        let k240 = "k".repeat(240);
        let longest = format!("{k240}/{k240}/{}", "k".repeat(30));
        for ok in ["a", "snap/1.tar.zst", "a/b/c", &k240, &longest] {
            assert!(valid_key(ok), "{ok}");
        }
        for bad in [
            "",
            "/",
            "/abs",
            "a/",
            "a//b",
            "../x",
            "a/../../b",
            "a/./b",
            ".",
            "a\0b",
            "ünï",
            "a#1",
            "a\\b",
            &"k".repeat(241),
            &format!("{longest}k"),
        ] {
            assert!(!valid_key(bad), "{bad:?}");
        }
    }

    #[test]
    fn paths_stay_under_their_tenant() {
        let prefix = Path::from("pre/fix");
        let p = object_path(&prefix, "t", "a/b").unwrap();
        assert_eq!(p.as_ref(), "pre/fix/tenants/t/a/b");
        let dir = tenant_dir(&prefix, "t").unwrap();
        assert_eq!(key_in(&dir, &p).as_deref(), Some("a/b"));
        let other = tenant_dir(&prefix, "tt").unwrap();
        assert_eq!(key_in(&other, &p), None);
    }
}
