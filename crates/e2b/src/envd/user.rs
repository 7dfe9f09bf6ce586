//! The acting account of an envd request and how its paths resolve.

use crate::error::HttpError;

/// Users of an E2B sandbox: `user` (uid 1000, the default) and `root`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum User {
    Root,
    User,
}

impl User {
    pub fn parse(name: &str) -> Result<Self, HttpError> {
        match name {
            "user" => Ok(User::User),
            "root" => Ok(User::Root),
            other => Err(HttpError::unauthorized(format!(
                "invalid user {other:?}: this sandbox has the users \"user\" and \"root\""
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            User::Root => "root",
            User::User => "user",
        }
    }

    pub fn home(self) -> &'static str {
        match self {
            User::Root => "/root",
            User::User => "/home/user",
        }
    }

    /// Absolute, lexically normalised path of `path` as this user means it: relative paths
    /// and `~` are below the user's home.
    pub fn resolve(self, path: &str) -> String {
        let joined = if path.is_empty() || path == "~" {
            self.home().to_string()
        } else if let Some(rest) = path.strip_prefix("~/") {
            format!("{}/{rest}", self.home())
        } else if path.starts_with('/') {
            path.to_string()
        } else {
            format!("{}/{path}", self.home())
        };
        normalize(&joined)
    }
}

/// `/a/./b/../c//d` → `/a/c/d`; `..` at the root stays at the root (as the agent resolves).
pub fn normalize(abs: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in abs.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    format!("/{}", parts.join("/"))
}

/// Parent directory and last component of a normalised path; `None` for the root.
pub fn split_parent(abs: &str) -> Option<(&str, &str)> {
    let (parent, name) = abs.rsplit_once('/')?;
    if name.is_empty() {
        return None;
    }
    Some((if parent.is_empty() { "/" } else { parent }, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_against_the_users_home() {
        assert_eq!(User::User.resolve("a/b.txt"), "/home/user/a/b.txt");
        assert_eq!(User::Root.resolve("a"), "/root/a");
        assert_eq!(User::User.resolve(""), "/home/user");
        assert_eq!(User::User.resolve("~/x"), "/home/user/x");
        assert_eq!(User::User.resolve("/tmp/../etc//./x"), "/etc/x");
        assert_eq!(User::User.resolve("../../../.."), "/");
        assert_eq!(split_parent("/a/b"), Some(("/a", "b")));
        assert_eq!(split_parent("/a"), Some(("/", "a")));
        assert_eq!(split_parent("/"), None);
    }

    #[test]
    fn users() {
        assert_eq!(User::parse("user").unwrap(), User::User);
        assert_eq!(User::parse("root").unwrap().home(), "/root");
        assert_eq!(User::parse("admin").unwrap_err().status.as_u16(), 401);
    }
}
