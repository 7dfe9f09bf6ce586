//! Accounts and groups as the sandbox's /etc/passwd and /etc/group name them. Read directly:
//! the agent (and its `sudo` command) is a static binary, which has no NSS to ask, and a
//! sandbox's accounts are these files. Both are the sandbox's, so hostile: a line that does not
//! parse names nothing.

/// One /etc/passwd entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
    pub shell: String,
}

/// The account called `name`, or numbered `#uid` (as sudo writes a uid).
pub fn find_account(passwd: &str, name: &str) -> Option<Account> {
    let by_uid = name.strip_prefix('#').and_then(|n| n.parse::<u32>().ok());
    accounts(passwd).find(|a| match by_uid {
        Some(uid) => a.uid == uid,
        None => a.name == name,
    })
}

/// The account numbered `uid`.
pub fn account_of(passwd: &str, uid: u32) -> Option<Account> {
    accounts(passwd).find(|a| a.uid == uid)
}

fn accounts(passwd: &str) -> impl Iterator<Item = Account> + '_ {
    passwd.lines().filter_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 7 || f[0].is_empty() || f[0].starts_with('#') {
            return None;
        }
        Some(Account {
            name: f[0].to_string(),
            uid: f[2].parse().ok()?,
            gid: f[3].parse().ok()?,
            home: f[5].to_string(),
            shell: f[6].to_string(),
        })
    })
}

/// The gid of group `name` (or `#gid`).
pub fn find_group(group: &str, name: &str) -> Option<u32> {
    if let Some(gid) = name.strip_prefix('#').and_then(|n| n.parse().ok()) {
        return Some(gid);
    }
    group.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.len() >= 3 && f[0] == name).then(|| f[2].parse().ok())?
    })
}

/// The groups a process of account `uid` (primary group `gid`) is in, as `initgroups` gives
/// them at a login: `gid` first, then every group of `group` listing the account's name (the
/// first /etc/passwd entry numbered `uid`) among its members, each once, in file order.
pub fn groups_of(passwd: &str, group: &str, uid: u32, gid: u32) -> Vec<u32> {
    let mut groups = vec![gid];
    let Some(name) = account_of(passwd, uid).map(|a| a.name) else {
        return groups;
    };
    for line in group.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 4 || f[0].is_empty() || f[0].starts_with('#') {
            continue;
        }
        let Ok(id) = f[2].parse::<u32>() else {
            continue;
        };
        if f[3].split(',').any(|m| m == name) && !groups.contains(&id) {
            groups.push(id);
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash
# a comment
broken:x:notanumber:0::/:/bin/sh
short:x:5
user:x:1000:1000:User,,,:/home/user:/bin/bash
";

    #[test]
    fn accounts_by_name_uid_and_number() {
        let root = find_account(PASSWD, "root").unwrap();
        assert_eq!((root.uid, root.gid, root.home.as_str()), (0, 0, "/root"));
        let user = find_account(PASSWD, "#1000").unwrap();
        assert_eq!(user.name, "user");
        assert_eq!(user.shell, "/bin/bash");
        assert_eq!(account_of(PASSWD, 1000), Some(user));
        assert_eq!(find_account(PASSWD, "broken"), None);
        assert_eq!(find_account(PASSWD, "short"), None);
        assert_eq!(find_account(PASSWD, "nobody"), None);
        assert_eq!(find_account(PASSWD, "#7"), None);
    }

    #[test]
    fn groups_by_name_and_number() {
        let group = "root:x:0:\nusers:x:100:user\nodd:x:\n";
        assert_eq!(find_group(group, "users"), Some(100));
        assert_eq!(find_group(group, "#42"), Some(42));
        assert_eq!(find_group(group, "odd"), None);
        assert_eq!(find_group(group, "none"), None);
    }

    #[test]
    fn an_account_s_groups_are_its_own_then_those_listing_it() {
        let group = "root:x:0:\nuser:x:1000:\n# devs:x:7:user\ndevs:x:2345:root,user\n\
                     bad:x:nan:user\nshort:x:9\nusers:x:100:usera,user\nagain:x:2345:user\n\
                     other:x:4000:usera\n";
        assert_eq!(groups_of(PASSWD, group, 1000, 1000), [1000, 2345, 100]);
        assert_eq!(groups_of(PASSWD, group, 0, 0), [0, 2345]);
        // The primary group is there once, whoever lists it.
        assert_eq!(groups_of(PASSWD, "user:x:1000:user\n", 1000, 1000), [1000]);
        // A uid no account has is in its primary group only, as is a gid given apart.
        assert_eq!(groups_of(PASSWD, group, 4242, 4242), [4242]);
        assert_eq!(groups_of(PASSWD, "", 1000, 50), [50]);
        assert_eq!(groups_of("", group, 1000, 1000), [1000]);
    }
}
