//! Whom a process runs as and who owns what it makes: `root` and `user` (uid 1000), which
//! every image has, or any other account the sandbox's own /etc/passwd names (an image's
//! `USER app`, a template step's `useradd`, or one the session's root added since), read
//! through the agent each time: the sandbox may change its accounts at any moment.

pub use koder_image::Account;

use koder_agent_protocol::{AgentClient, ClientError};
use koder_auth::Identity;

use super::{Env, Manager};
use crate::session::Live;
use crate::Error;

/// Uid/gid of the sandbox's unprivileged `user` account.
pub const SANDBOX_USER_ID: u32 = 1000;

/// The most of a sandbox's /etc/passwd read to find an account (a system's takes a few KiB).
const MAX_PASSWD: u64 = 1 << 20;
/// The longest account name taken (useradd's limit is 32 bytes; a number is shorter).
const MAX_NAME: usize = 64;

impl Manager {
    /// The account `name` of the session's sandbox.
    pub async fn account(&self, who: &Identity, id: &str, name: &str) -> Result<Account, Error> {
        let live = self.awake(who, id).await?;
        self.account_in(id, &live, Some(name)).await
    }

    /// The account `name` (root when `None`) of `live`'s sandbox.
    pub(crate) async fn account_in(
        &self,
        id: &str,
        live: &Live,
        name: Option<&str>,
    ) -> Result<Account, Error> {
        if let Some(name) = name.filter(|n| n.is_empty() || n.len() > MAX_NAME) {
            return Err(Error::InvalidArgument(format!(
                "user {:?} must be an account name of 1..={MAX_NAME} bytes",
                name.chars().take(MAX_NAME).collect::<String>()
            )));
        }
        let name = name.unwrap_or("root");
        match lookup(live.sandbox.agent(), name).await {
            Ok(Some(account)) => Ok(account),
            Ok(None) => Err(Error::UnknownAccount(name.to_string())),
            Err(e) => Err(self.agent_failed(id, e).await),
        }
    }
}

/// The account `name` of the sandbox `agent` serves, `None` when it has none of that name;
/// only an account other than `root` and `user` costs a read of its /etc/passwd.
pub(crate) async fn lookup(
    agent: &AgentClient,
    name: &str,
) -> Result<Option<Account>, ClientError> {
    if let Some(account) = Account::builtin(name) {
        return Ok(Some(account));
    }
    let passwd = match agent.read_file("/etc/passwd", MAX_PASSWD).await {
        Ok(bytes) => bytes,
        // Missing, too large, no regular file: no account is found in it.
        Err(ClientError::Agent(_)) => Vec::new(),
        Err(e) => return Err(e),
    };
    Ok(koder_image::find_account(
        &String::from_utf8_lossy(&passwd),
        name,
    ))
}

/// The agent's uid and gid for `account` (`None` for root, the agent's own) and `env` with its
/// `HOME` and `USER`.
pub(crate) fn run_as(account: &Account, mut env: Env) -> (Option<u32>, Option<u32>, Env) {
    if account.uid == 0 && account.name == "root" {
        return (None, None, env);
    }
    for (k, v) in [("HOME", &account.home), ("USER", &account.name)] {
        env.retain(|(ek, _)| ek != k);
        env.push((k.to_string(), v.clone()));
    }
    (Some(account.uid), Some(account.gid), env)
}

/// The (uid, gid) what `account` creates belongs to; `None` for root.
pub(crate) fn owner(account: &Account) -> Option<(u32, u32)> {
    (account.uid != 0).then_some((account.uid, account.gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_runs_as_the_agent_and_others_get_their_home_and_name() {
        let env = vec![("HOME".to_string(), "/root".to_string())];
        assert_eq!(
            run_as(&Account::root(), env.clone()),
            (None, None, env.clone())
        );
        let app = Account {
            name: "app".into(),
            uid: 1001,
            gid: 1002,
            home: "/srv/app".into(),
        };
        let (uid, gid, env) = run_as(&app, env);
        assert_eq!((uid, gid), (Some(1001), Some(1002)));
        assert_eq!(
            env,
            [("HOME", "/srv/app"), ("USER", "app")].map(|(k, v)| (k.to_string(), v.to_string()))
        );
        assert_eq!(owner(&app), Some((1001, 1002)));
        assert_eq!(owner(&Account::root()), None);
        assert_eq!(owner(&Account::user()), Some((1000, 1000)));
    }
}
