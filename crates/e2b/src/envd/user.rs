//! The acting account of an envd request and how its paths resolve.

use koder_sessions::Account;

use crate::error::HttpError;

/// The account an envd request acts as: `user` (uid 1000, E2B's default), `root`, or any
/// other account of the sandbox (resolved by the session manager in its /etc/passwd).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    name: String,
    home: String,
}

impl User {
    /// E2B's `user` (uid 1000), its default.
    pub fn unprivileged() -> Self {
        Account::user().into()
    }

    /// The account `name`, without asking the sandbox for `root` and `user`.
    pub async fn resolve_in(
        manager: &koder_sessions::Manager,
        who: &koder_auth::Identity,
        id: &str,
        name: &str,
    ) -> Result<Self, HttpError> {
        if let Some(account) = Account::builtin(name) {
            return Ok(account.into());
        }
        match manager.account(who, id, name).await {
            Ok(a) => Ok(a.into()),
            // envd's words, which the SDKs show.
            Err(
                koder_sessions::Error::UnknownAccount(_)
                | koder_sessions::Error::InvalidArgument(_),
            ) => Err(HttpError::unauthorized(format!(
                "invalid username: '{name}'"
            ))),
            Err(e) => Err(e.into()),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn home(&self) -> &str {
        &self.home
    }

    /// Absolute, lexically normalised path of `path` as this user means it: relative paths
    /// and `~` are below the user's home.
    pub fn resolve(&self, path: &str) -> String {
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

impl From<Account> for User {
    fn from(a: Account) -> Self {
        Self {
            name: a.name,
            home: a.home,
        }
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
        assert_eq!(
            User::unprivileged().resolve("a/b.txt"),
            "/home/user/a/b.txt"
        );
        assert_eq!(User::from(Account::root()).resolve("a"), "/root/a");
        assert_eq!(User::unprivileged().resolve(""), "/home/user");
        assert_eq!(User::unprivileged().resolve("~/x"), "/home/user/x");
        assert_eq!(User::unprivileged().resolve("/tmp/../etc//./x"), "/etc/x");
        assert_eq!(User::unprivileged().resolve("../../../.."), "/");
        assert_eq!(split_parent("/a/b"), Some(("/a", "b")));
        assert_eq!(split_parent("/a"), Some(("/", "a")));
        assert_eq!(split_parent("/"), None);
    }
}
