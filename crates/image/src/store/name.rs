//! Image names and references. A name is what users type (`python`, `python:3.11`); a
//! reference is a name or a digest (64 hex digits). Names become file names in the store, so
//! the rules are strict: nothing that could be a path, hide a file, or read alike in another
//! script.

use super::ImageError;

pub const MAX_NAME_LEN: usize = 128;

/// Checks a name an image may be given: 1–128 bytes of `[a-z0-9._-]` starting with a letter or
/// digit, optionally one `:tag` of the same characters; not `host` (the generated image), not a
/// digest, no `..`.
pub fn check_name(name: &str) -> Result<(), ImageError> {
    let invalid = |why: &str| Err(ImageError::InvalidName(format!("{name:?}: {why}")));
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return invalid("1 to 128 characters");
    }
    if name == crate::HOST || name.starts_with("host:") {
        return invalid("`host` is the generated host image");
    }
    if is_digest(name) {
        return invalid("64 hex digits name a digest");
    }
    if name.contains("..") {
        return invalid("no `..`");
    }
    let (base, tag) = match name.split_once(':') {
        Some((base, tag)) => (base, Some(tag)),
        None => (name, None),
    };
    let part_ok = |p: &str| {
        p.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
    };
    if !part_ok(base) || !tag.is_none_or(part_ok) {
        return invalid("lowercase letters, digits, `.`, `_`, `-` (starting with a letter or digit), optionally one `:tag`");
    }
    Ok(())
}

/// A digest as the store names its directories: 64 lowercase hex digits (sha256).
pub fn is_digest(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Checks a reference: a digest or a valid name.
pub fn check_reference(reference: &str) -> Result<(), ImageError> {
    if is_digest(reference) {
        Ok(())
    } else {
        check_name(reference)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_names_are_refused() {
        let long = "a".repeat(MAX_NAME_LEN + 1);
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            "/etc",
            "a..b",
            ".hidden",
            "-x",
            "Python",
            "pythön",
            "py thon",
            "a:b:c",
            "a:",
            ":a",
            "a\0b",
            "a\nb",
            "host",
            "host:1",
            long.as_str(),
            "ｐｙｔｈｏｎ",
        ] {
            assert!(
                matches!(check_name(bad), Err(ImageError::InvalidName(_))),
                "{bad:?} accepted"
            );
        }
        let digest = "0".repeat(64);
        assert!(check_name(&digest).is_err());
        assert!(check_reference(&digest).is_ok());
        assert!(check_reference(&"A".repeat(64)).is_err());
    }

    #[test]
    fn plain_names_and_tags_pass() {
        for good in [
            "python",
            "python:3.11",
            "my-template",
            "a.b_c",
            "node:20",
            "x",
        ] {
            check_name(good).unwrap();
        }
        check_name(&"a".repeat(MAX_NAME_LEN)).unwrap();
    }
}
