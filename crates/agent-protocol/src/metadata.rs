//! File metadata: small user-defined key/value pairs stored on a file as extended attributes
//! under [`XATTR_PREFIX`] — the namespace E2B's envd uses, so metadata set through either API,
//! or by a sandbox process with `setxattr(2)`, is the same.
//!
//! Keys and values are printable US-ASCII (`0x20..=0x7e`), keys non-empty, a key
//! at most [`MAX_KEY_BYTES`]; all of a file's metadata, the prefix counted once per key, at most
//! [`MAX_TOTAL_BYTES`] (E2B's own bounds: the VFS name limit and a per-inode xattr budget).
//! What a sandbox sets itself is hostile input: [`collect`] keeps only what these rules admit,
//! within the same budget.

/// The xattr namespace metadata lives in (only `user.`: unprivileged, and never the kernel's or
/// overlayfs' own `user.overlay.`).
pub const XATTR_PREFIX: &str = "user.e2b.";

/// Longest key: Linux's 255-byte xattr name limit less the prefix.
pub const MAX_KEY_BYTES: usize = 255 - XATTR_PREFIX.len();

/// Most bytes of one file's metadata: every key with its prefix, plus every value.
pub const MAX_TOTAL_BYTES: usize = 4096;

/// Why a metadata map was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    #[error("metadata keys must be non-empty")]
    EmptyKey,
    #[error("metadata key {0:?} is longer than {MAX_KEY_BYTES} bytes")]
    KeyTooLong(String),
    #[error("metadata key {0:?} must be printable US-ASCII")]
    BadKey(String),
    #[error("the metadata value of {0:?} must be printable US-ASCII")]
    BadValue(String),
    #[error("metadata key {0:?} is given twice")]
    Duplicate(String),
    #[error("metadata takes more than {MAX_TOTAL_BYTES} bytes (keys with their {XATTR_PREFIX:?} prefix, and values)")]
    TooLarge,
}

fn printable(s: &str) -> bool {
    s.bytes().all(|b| (0x20..=0x7e).contains(&b))
}

/// One pair's refusal, if any (the rules of the module doc, the total aside).
pub fn check_pair(key: &str, value: &str) -> Result<(), MetadataError> {
    if key.is_empty() {
        return Err(MetadataError::EmptyKey);
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(MetadataError::KeyTooLong(key.to_owned()));
    }
    if !printable(key) {
        return Err(MetadataError::BadKey(key.to_owned()));
    }
    if !printable(value) {
        return Err(MetadataError::BadValue(key.to_owned()));
    }
    Ok(())
}

/// Bytes one pair takes of [`MAX_TOTAL_BYTES`].
pub fn cost(key: &str, value: &str) -> usize {
    XATTR_PREFIX.len() + key.len() + value.len()
}

/// Checks a whole map as a request carries it: every pair, no key twice, the total.
pub fn check_metadata(pairs: &[(String, String)]) -> Result<(), MetadataError> {
    let mut total = 0usize;
    let mut seen = std::collections::BTreeSet::new();
    for (key, value) in pairs {
        check_pair(key, value)?;
        if !seen.insert(key.as_str()) {
            return Err(MetadataError::Duplicate(key.clone()));
        }
        total += cost(key, value);
    }
    if total > MAX_TOTAL_BYTES {
        return Err(MetadataError::TooLarge);
    }
    Ok(())
}

/// The metadata a file's raw xattrs (full names and values, as read) hold: names outside
/// [`XATTR_PREFIX`], or whose key or value the rules refuse, are skipped; pairs are taken in key
/// order while they fit [`MAX_TOTAL_BYTES`]. Sorted by key.
pub fn collect(raw: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = raw
        .into_iter()
        .filter_map(|(name, value)| {
            let key = name.strip_prefix(XATTR_PREFIX.as_bytes())?;
            let key = String::from_utf8(key.to_vec()).ok()?;
            let value = String::from_utf8(value).ok()?;
            check_pair(&key, &value).ok()?;
            Some((key, value))
        })
        .collect();
    pairs.sort();
    pairs.dedup_by(|a, b| a.0 == b.0);
    let mut total = 0usize;
    pairs.retain(|(k, v)| {
        let fits = total + cost(k, v) <= MAX_TOTAL_BYTES;
        if fits {
            total += cost(k, v);
        }
        fits
    });
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn requests_are_checked() {
        assert_eq!(
            check_metadata(&pairs(&[("author", "mish"), ("x-y.z", "a b ~")])),
            Ok(())
        );
        assert_eq!(check_metadata(&[]), Ok(()));
        let refused = [
            (pairs(&[("", "v")]), MetadataError::EmptyKey),
            (
                pairs(&[("a\nb", "v")]),
                MetadataError::BadKey("a\nb".into()),
            ),
            (
                pairs(&[("k", "bad\n")]),
                MetadataError::BadValue("k".into()),
            ),
            (pairs(&[("k", "é")]), MetadataError::BadValue("k".into())),
            (
                pairs(&[("k", "1"), ("k", "2")]),
                MetadataError::Duplicate("k".into()),
            ),
        ];
        for (p, err) in refused {
            assert_eq!(check_metadata(&p), Err(err));
        }
        let long = "k".repeat(MAX_KEY_BYTES + 1);
        assert!(matches!(
            check_metadata(&[(long, String::new())]),
            Err(MetadataError::KeyTooLong(_))
        ));
        let max_key = "k".repeat(MAX_KEY_BYTES);
        assert_eq!(check_metadata(&[(max_key, String::new())]), Ok(()));
        // The budget counts the prefix once per key.
        let value = "v".repeat(MAX_TOTAL_BYTES - XATTR_PREFIX.len() - 1);
        assert_eq!(check_metadata(&[("k".into(), value.clone())]), Ok(()));
        assert_eq!(
            check_metadata(&[("k".into(), value), ("j".into(), String::new())]),
            Err(MetadataError::TooLarge)
        );
    }

    #[test]
    fn hostile_xattrs_are_filtered_and_bounded() {
        let raw = |n: &str, v: &[u8]| (n.as_bytes().to_vec(), v.to_vec());
        let got = collect([
            raw("user.e2b.zeta", b"last"),
            raw("user.e2b.author", b"mish"),
            raw("user.other", b"not ours"),
            raw("security.selinux", b"x"),
            raw("user.e2b.", b"empty key"),
            raw("user.e2b.tab\t", b"x"),
            raw("user.e2b.bin", b"\x00\xff"),
            raw("user.e2b.nl", b"a\n"),
        ]);
        assert_eq!(got, pairs(&[("author", "mish"), ("zeta", "last")]));
        // Over the budget: whole pairs in key order while they fit, never a cut value.
        let big = vec![b'v'; 3000];
        let got = collect([
            raw("user.e2b.b", &big),
            raw("user.e2b.a", &big),
            raw("user.e2b.c", b"small"),
        ]);
        let keys: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["a", "c"]);
        assert!(got.iter().map(|(k, v)| cost(k, v)).sum::<usize>() <= MAX_TOTAL_BYTES);
        assert_eq!(check_metadata(&got), Ok(()));
    }
}
