//! Archive paths, validated before anything touches the disk.

use crate::{LayerError, MAX_DEPTH, MAX_NAME, MAX_PATH};

/// A path an entry may name: relative, every component 1..=`MAX_NAME` bytes and neither `.`
/// nor `..`, no NUL, at most `MAX_PATH` bytes and `MAX_DEPTH` components. A single trailing
/// `/` (directories) is dropped.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct EntryPath(Vec<u8>);

impl EntryPath {
    pub(crate) fn parse(raw: &[u8]) -> Result<Self, LayerError> {
        let path = raw.strip_suffix(b"/").unwrap_or(raw);
        let why = if path.is_empty() {
            Some("empty path")
        } else if path.contains(&0) {
            Some("NUL in path")
        } else if path.len() > MAX_PATH {
            Some("path too long")
        } else if path.starts_with(b"/") {
            Some("absolute path")
        } else {
            Self::component_fault(path)
        };
        match why {
            Some(why) => Err(LayerError::forbidden(raw, why)),
            None => Ok(Self(path.to_vec())),
        }
    }

    fn component_fault(path: &[u8]) -> Option<&'static str> {
        let mut depth = 0;
        for name in path.split(|b| *b == b'/') {
            depth += 1;
            match name {
                b"" => return Some("empty path component"),
                b"." => return Some("`.` component"),
                b".." => return Some("`..` component"),
                _ if name.len() > MAX_NAME => return Some("name too long"),
                _ => {}
            }
        }
        (depth > MAX_DEPTH).then_some("path too deep")
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Parent (empty for a top-level entry) and final name.
    pub(crate) fn split(&self) -> (&[u8], &[u8]) {
        match self.0.iter().rposition(|b| *b == b'/') {
            Some(i) => (&self.0[..i], &self.0[i + 1..]),
            None => (&[], &self.0),
        }
    }

    /// Whether this path is `dir` or lies below it.
    pub(crate) fn is_within(&self, dir: &EntryPath) -> bool {
        self.0
            .strip_prefix(dir.0.as_slice())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(b"/"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_relative_paths() {
        for ok in [
            &b"a"[..],
            b"a/b",
            b"a/b/",
            b"\xff\n name",
            b"...",
            b".a/..b",
        ] {
            assert!(EntryPath::parse(ok).is_ok(), "{ok:?}");
        }
        assert_eq!(EntryPath::parse(b"a/b/").unwrap().as_bytes(), b"a/b");
        assert_eq!(
            EntryPath::parse(b"a/b/c").unwrap().split(),
            (&b"a/b"[..], &b"c"[..])
        );
        assert_eq!(
            EntryPath::parse(b"c").unwrap().split(),
            (&b""[..], &b"c"[..])
        );
    }

    #[test]
    fn refuses_escapes_and_oddities() {
        let long_name = vec![b'x'; MAX_NAME + 1];
        let long_path = [&b"a/"[..]; 2100].concat();
        let deep = [&b"a/"[..]; MAX_DEPTH + 1].concat();
        for bad in [
            &b""[..],
            b"/",
            b"/abs",
            b"..",
            b"../x",
            b"a/../../x",
            b"a/..",
            b".",
            b"./a",
            b"a/./b",
            b"a//b",
            b"a//",
            b"a\0b",
            &long_name,
            &long_path,
            &deep,
        ] {
            assert!(
                matches!(EntryPath::parse(bad), Err(LayerError::Forbidden { .. })),
                "{:?}",
                bad.escape_ascii().to_string()
            );
        }
    }

    #[test]
    fn within_is_by_component() {
        let p = |s: &[u8]| EntryPath::parse(s).unwrap();
        assert!(p(b"a/b").is_within(&p(b"a")));
        assert!(p(b"a").is_within(&p(b"a")));
        assert!(!p(b"ab").is_within(&p(b"a")));
        assert!(!p(b"a").is_within(&p(b"a/b")));
    }
}
