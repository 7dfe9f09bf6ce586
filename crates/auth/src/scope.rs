//! What a caller may do. Four scopes, as a JWT's scope claim names them:
//!
//! | scope | grants |
//! |---|---|
//! | `sandbox:read` | reading: sessions, files, exec status and output streams, metrics, snapshots, volumes, audit |
//! | `sandbox:write` | reading, and changing state: create/delete/pause/resume/fork sessions, write files, snapshots, volumes, contexts |
//! | `sandbox:exec` | reading, and running code: exec, stdin/signals, terminals, code runs, kill-processes, preview |
//! | `sandbox:admin` | everything, the operator endpoints included |
//!
//! Every scope grants reading; `write` and `exec` are separate because running code in an
//! existing session and creating sessions (which cost quota) are different rights. A static API
//! key holds [`Scopes::TENANT`] (read, write, exec), what keys always could.

/// What one operation needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    Read,
    Write,
    Exec,
    Admin,
}

impl Scope {
    pub const ALL: [Scope; 4] = [Scope::Read, Scope::Write, Scope::Exec, Scope::Admin];

    /// The name in a token's scope claim.
    pub const fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "sandbox:read",
            Scope::Write => "sandbox:write",
            Scope::Exec => "sandbox:exec",
            Scope::Admin => "sandbox:admin",
        }
    }

    pub fn parse(name: &str) -> Option<Scope> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }

    const fn bit(self) -> u8 {
        1 << self as u8
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The scopes a caller holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scopes(u8);

impl Scopes {
    pub const NONE: Scopes = Scopes(0);
    /// A tenant's full rights: what a static API key grants.
    pub const TENANT: Scopes = Scopes(Scope::Read.bit() | Scope::Write.bit() | Scope::Exec.bit());

    /// The known scopes among `names`; others (an issuer's scopes for other services) are
    /// ignored.
    pub fn from_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Scopes {
        Scopes(
            names
                .into_iter()
                .filter_map(Scope::parse)
                .fold(0, |bits, s| bits | s.bit()),
        )
    }

    /// Whether these scopes grant an operation needing `needed`.
    pub fn allows(self, needed: Scope) -> bool {
        let holds = |s: Scope| self.0 & s.bit() != 0;
        holds(Scope::Admin)
            || match needed {
                Scope::Read => self.0 != 0,
                Scope::Admin => false,
                other => holds(other),
            }
    }

    /// The held scopes' names, for logs and error messages.
    pub fn names(self) -> Vec<&'static str> {
        Scope::ALL
            .into_iter()
            .filter(|s| self.0 & s.bit() != 0)
            .map(Scope::as_str)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scope_reads_and_only_admin_administers() {
        let read = Scopes::from_names(["sandbox:read"]);
        assert!(read.allows(Scope::Read));
        assert!(!read.allows(Scope::Write) && !read.allows(Scope::Exec));
        let exec = Scopes::from_names(["openid", "sandbox:exec", "other:thing"]);
        assert!(exec.allows(Scope::Read) && exec.allows(Scope::Exec));
        assert!(!exec.allows(Scope::Write) && !exec.allows(Scope::Admin));
        assert_eq!(exec.names(), ["sandbox:exec"]);
        let admin = Scopes::from_names(["sandbox:admin"]);
        assert!(Scope::ALL.into_iter().all(|s| admin.allows(s)));
        assert!(!Scopes::TENANT.allows(Scope::Admin));
        assert!(Scope::ALL[..3].iter().all(|s| Scopes::TENANT.allows(*s)));
        assert!(Scope::ALL.into_iter().all(|s| !Scopes::NONE.allows(s)));
    }
}
