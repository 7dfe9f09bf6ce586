//! The accounts of a tree built from packages, imported from an archive or changed by a
//! template step: the tree's own are kept (its files belong to them; a Dockerfile's `USER app`
//! or a step's `useradd` names them), each line checked, and those every sandbox needs are
//! added where the tree has none of that name: `root`, `user` (uid 1000, whom execs and E2B's
//! SDKs run as) and `nobody`, with their groups and a shadow line for every account.
//!
//! Every line is hostile (an archive or a sandboxed step wrote it): one that is no account,
//! names an id outside a sandbox's (0..65536), a `root` that is not uid 0 or a `user` that is
//! not 1000 (the API runs `user`'s commands as 1000), or a name already seen is dropped; so is
//! a line that is not UTF-8 or holds a control character.

use std::collections::HashSet;
use std::io::{self, Read};
use std::path::Path;

use koder_runtime::SANDBOX_IDS;
use rustix::fs::{Mode, OFlags};

use super::{replace_file, GROUP, PASSWD};

/// Owner-only reading, as Debian's (whose group `shadow` the generated accounts lack): once a
/// sandbox's root sets a password, the hash is no other account's to read.
pub(super) const SHADOW_MODE: u32 = 0o640;

/// The most bytes of one account file read (a system's accounts take a few KiB).
const MAX_FILE: u64 = 4 << 20;
/// The generated accounts' shell when the tree has no `root` to take it from (an image with
/// any shell has this one).
const DEFAULT_SHELL: &str = "/bin/sh";

/// Rewrites `etc`'s `passwd`, `group` and `shadow` as the tree's checked accounts plus the
/// generated ones it lacks (`etc` is a directory of the tree, no symlink).
pub(crate) fn merge(etc: &Path) -> io::Result<()> {
    let passwd = merge_passwd(&read(&etc.join("passwd"))?);
    let group = merge_group(&read(&etc.join("group"))?);
    let shadow = merge_shadow(&read(&etc.join("shadow"))?, &passwd);
    replace_file(&etc.join("passwd"), &passwd, 0o644)?;
    replace_file(&etc.join("group"), &group, 0o644)?;
    replace_file(&etc.join("shadow"), &shadow, SHADOW_MODE)
}

/// A file's text, at most [`MAX_FILE`] bytes of it; empty when it is missing or no regular
/// file (a symlink is never followed).
fn read(path: &Path) -> io::Result<String> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_file() => {}
        Ok(_) => return Ok(String::new()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(String::new()),
        Err(e) => return Err(e),
    }
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let file = std::fs::File::from(rustix::fs::open(path, flags, Mode::empty())?);
    let mut bytes = Vec::new();
    file.take(MAX_FILE).read_to_end(&mut bytes)?;
    // Lines that are not UTF-8 go; the others stay byte for byte.
    Ok(bytes
        .split(|&b| b == b'\n')
        .filter_map(|l| std::str::from_utf8(l).ok())
        .fold(String::new(), |mut text, line| {
            text.push_str(line);
            text.push('\n');
            text
        }))
}

/// An account of a sandbox's /etc/passwd: whom a process runs as and where its home is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
}

impl Account {
    /// `root` and `user` (uid 1000) every image has with these ids and homes (an image's own
    /// lines for them are kept only with these ids): known without reading any file.
    pub fn builtin(name: &str) -> Option<Account> {
        match name {
            "root" => Some(Self::root()),
            "user" => Some(Self::user()),
            _ => None,
        }
    }

    pub fn root() -> Account {
        Self::fixed("root", 0, "/root")
    }

    pub fn user() -> Account {
        Self::fixed("user", 1000, "/home/user")
    }

    fn fixed(name: &str, id: u32, home: &str) -> Account {
        Account {
            name: name.into(),
            uid: id,
            gid: id,
            home: home.into(),
        }
    }
}

/// The account `name` in `passwd` (a running sandbox's: hostile, so a line counts only if it
/// passes the checks an image's lines pass, and a home that is no absolute path is `/`). A
/// number names the first account of that uid, or, where none has it, a nameless one (as
/// `docker run -u 1234`) with that gid and `/` as its home.
pub fn find_account(passwd: &str, name: &str) -> Option<Account> {
    let lines = keep(passwd, 7, |f| {
        id(f[2]).is_some() && id(f[3]).is_some() && fixed_id_kept(f[0], f[2])
    });
    let accounts = lines.iter().filter_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        Some(Account {
            name: f[0].to_string(),
            uid: id(f[2])?,
            gid: id(f[3])?,
            home: Some(f[5])
                .filter(|h| h.starts_with('/'))
                .unwrap_or("/")
                .to_string(),
        })
    });
    let by_uid = name
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| id(name))
        .flatten();
    match by_uid {
        None => accounts.into_iter().find(|a| a.name == name),
        Some(uid) => Some(
            accounts
                .into_iter()
                .find(|a| a.uid == uid)
                .unwrap_or_else(|| Account {
                    name: name.to_string(),
                    uid,
                    gid: uid,
                    home: "/".into(),
                }),
        ),
    }
}

/// The account `name` of the tree at `root` (its /etc/passwd read as [`merge`] reads it: no
/// link followed, bounded); `None` when it has none.
pub fn account_in_tree(root: &Path, name: &str) -> Option<Account> {
    find_account(&read(&root.join("etc/passwd")).ok()?, name)
}

/// The tree's valid passwd lines, then [`PASSWD`]'s accounts it lacks (their shell root's).
fn merge_passwd(tree: &str) -> String {
    let kept = keep(tree, 7, |f| {
        id(f[2]).is_some() && id(f[3]).is_some() && fixed_id_kept(f[0], f[2])
    });
    let root_shell = kept
        .iter()
        .find(|l| name_of(l) == "root")
        .and_then(|l| l.rsplit(':').next())
        .unwrap_or(DEFAULT_SHELL)
        .to_string();
    let generated = PASSWD.lines().map(|l| match l.rsplit_once(':') {
        Some((head, "/bin/bash")) => format!("{head}:{root_shell}"),
        _ => l.to_string(),
    });
    with_missing(kept, generated)
}

/// The tree's valid group lines (members that are no valid name dropped), then [`GROUP`]'s
/// groups it lacks.
fn merge_group(tree: &str) -> String {
    let kept = keep(tree, 4, |f| id(f[2]).is_some() && fixed_id_kept(f[0], f[2]))
        .into_iter()
        .map(|line| {
            let (head, members) = line.rsplit_once(':').unwrap_or((line.as_str(), ""));
            let members: Vec<&str> = members.split(',').filter(|m| valid_name(m)).collect();
            format!("{head}:{}", members.join(","))
        })
        .collect();
    with_missing(kept, GROUP.lines().map(String::from))
}

/// A shadow file of `passwd`'s accounts, none with a password (see [`merge_shadow`]).
pub(crate) fn shadow_of(passwd: &str) -> String {
    merge_shadow("", passwd)
}

/// The tree's shadow lines of accounts `passwd` holds, then one for each account that has
/// none: no password (`*` matches none) and no aging (an empty date of last change; a 0 there
/// would mean "change it now"). PAM's `pam_unix` refuses an account no shadow file names, so
/// without it even root's `su` to it fails; root needs no password to become anyone, and
/// `user` becomes root by `sudo`.
fn merge_shadow(tree: &str, passwd: &str) -> String {
    let accounts: HashSet<&str> = passwd.lines().map(name_of).collect();
    let kept = keep(tree, 9, |f| accounts.contains(f[0]));
    let generated = passwd
        .lines()
        .map(|l| format!("{}:*::0:99999:7:::", name_of(l)));
    with_missing(kept, generated)
}

/// The lines of `text` with `fields` fields, a valid name (the first of each name kept) and no
/// control character, for which `ok` holds.
fn keep(text: &str, fields: usize, ok: impl Fn(&[&str]) -> bool) -> Vec<String> {
    let mut seen = HashSet::new();
    text.lines()
        .filter(|l| !l.chars().any(char::is_control))
        .filter(|l| {
            let f: Vec<&str> = l.split(':').collect();
            f.len() == fields && valid_name(f[0]) && ok(&f) && seen.insert(f[0].to_string())
        })
        .map(String::from)
        .collect()
}

/// `kept`, then each of `generated` whose name `kept` lacks, one per line.
fn with_missing(kept: Vec<String>, generated: impl Iterator<Item = String>) -> String {
    let names: HashSet<String> = kept.iter().map(|l| name_of(l).to_string()).collect();
    let added: Vec<String> = generated.filter(|l| !names.contains(name_of(l))).collect();
    kept.into_iter().chain(added).map(|l| l + "\n").collect()
}

/// Whether an account or group of the tree may keep its id: `root` must be 0 and `user` 1000,
/// the ids everything outside the sandbox means by those names.
fn fixed_id_kept(name: &str, id: &str) -> bool {
    match name {
        "root" => id == "0",
        "user" => id == "1000",
        _ => true,
    }
}

fn name_of(line: &str) -> &str {
    line.split(':').next().unwrap_or_default()
}

/// A user or group id a sandbox has.
fn id(field: &str) -> Option<u32> {
    field.parse::<u32>().ok().filter(|&id| id < SANDBOX_IDS)
}

/// A name as shadow's `useradd` takes one (Debian's, also Samba's trailing `$`), at most 32
/// bytes: nothing a later parser could read as a field, an option or a path.
pub fn valid_name(name: &str) -> bool {
    let body = name.strip_suffix('$').unwrap_or(name);
    let mut chars = body.chars();
    name.len() <= 32
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_are_found_by_name_or_number_and_hostile_lines_never() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\n\
             app:x:1001:1002:App:/srv/app:/bin/sh\n\
             rel:x:1003:1003::home/rel:/bin/sh\n\
             big:x:70000:0::/big:/bin/sh\n\
             user:x:0:0::/home/user:/bin/sh\n\
             -rf:x:1004:1004::/x:/bin/sh\n\
             short:x:1005\n\
             app:x:1006:1006::/dup:/bin/sh\n";
        let app = find_account(passwd, "app").unwrap();
        assert_eq!(
            (app.uid, app.gid, app.home.as_str()),
            (1001, 1002, "/srv/app")
        );
        assert_eq!(find_account(passwd, "1001"), Some(app));
        assert_eq!(
            find_account(passwd, "rel").unwrap().home,
            "/",
            "relative home"
        );
        for refused in ["big", "user", "-rf", "short", "nobody", "", "app\n"] {
            assert_eq!(find_account(passwd, refused), None, "{refused:?}");
        }
        let nameless = find_account(passwd, "1234").unwrap();
        assert_eq!(
            (nameless.uid, nameless.gid, nameless.home.as_str()),
            (1234, 1234, "/")
        );
        assert_eq!(
            find_account(passwd, "70000"),
            None,
            "outside a sandbox's ids"
        );
        assert_eq!(find_account(passwd, "0").unwrap().name, "root");
    }

    #[test]
    fn a_debian_trees_accounts_are_kept_and_user_added_with_roots_shell() {
        let passwd = merge_passwd(
            "root:x:0:0:root:/root:/bin/bash\n\
             daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n\
             nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        );
        assert_eq!(
            passwd,
            "root:x:0:0:root:/root:/bin/bash\n\
             daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n\
             nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n\
             user:x:1000:1000:user:/home/user:/bin/bash\n"
        );
    }

    #[test]
    fn an_image_without_bash_gets_its_roots_shell_and_keeps_its_own_uid_1000() {
        // Alpine's root runs ash; node's images hold `node` at 1000: `user` is the same uid.
        let passwd =
            merge_passwd("root:x:0:0:root:/root:/bin/ash\nnode:x:1000:1000::/home/node:/bin/sh\n");
        assert_eq!(
            passwd,
            "root:x:0:0:root:/root:/bin/ash\n\
             node:x:1000:1000::/home/node:/bin/sh\n\
             user:x:1000:1000:user:/home/user:/bin/ash\n\
             nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        );
        // No accounts at all (a `scratch` image): the generated ones, with a shell any has.
        assert!(merge_passwd("").starts_with("root:x:0:0:root:/root:/bin/sh\n"));
    }

    #[test]
    fn hostile_lines_are_dropped() {
        let tree = "root:x:0:0:root:/root:/bin/sh\n\
                    root:x:0:0:second root:/:/bin/evil\n\
                    toor:x:0:0::/root:/bin/sh\n\
                    big:x:65536:1::/:/bin/sh\n\
                    neg:x:-1:1::/:/bin/sh\n\
                    -opt:x:5:5::/:/bin/sh\n\
                    ../x:x:6:6::/:/bin/sh\n\
                    short:x:7:7\n\
                    long:x:8:8:a:b:c:d\n\
                    cr:x:9:9:a\rb:/:/bin/sh\n\
                    app:x:1001:1001:App,,,:/home/app:/bin/sh\n\
                    machine$:x:1002:1002::/:/usr/sbin/nologin\n\
                    \u{e9}t\u{e9}:x:1003:1003::/:/bin/sh\n";
        let passwd = merge_passwd(tree);
        let names: Vec<&str> = passwd.lines().map(name_of).collect();
        assert_eq!(names, ["root", "toor", "app", "machine$", "user", "nobody"]);
        // A `root` that is not uid 0 or a `user` that is not 1000 is not kept; the generated
        // one takes its place.
        let passwd = merge_passwd("root:x:1000:1000::/root:/bin/sh\nuser:x:0:0::/:/bin/sh\n");
        assert!(
            passwd.starts_with("root:x:0:0:root:/root:/bin/sh\n"),
            "{passwd}"
        );
        assert!(passwd.contains("\nuser:x:1000:1000:"), "{passwd}");
        assert!(
            !passwd.contains("root:x:1000") && !passwd.contains("user:x:0"),
            "{passwd}"
        );
    }

    #[test]
    fn groups_keep_their_valid_members_and_get_the_generated_ones() {
        let group = merge_group(
            "root:x:0:\nsudo:x:27:app,../x,,-o\ntty:x:5:\nroot:x:9:\nbad:x:70000:\nuser:x:0:\n",
        );
        assert_eq!(
            group,
            "root:x:0:\nsudo:x:27:app\ntty:x:5:\nuser:x:1000:\nnogroup:x:65534:\n"
        );
    }

    #[test]
    fn every_account_gets_a_shadow_line_and_only_accounts_keep_theirs() {
        let passwd = "root:x:0:0::/root:/bin/sh\napp:x:1001:1001::/home/app:/bin/sh\n";
        let shadow = merge_shadow(
            "root:$6$salt$hash:19000:0:99999:7:::\nghost:*:1:0:99999:7:::\napp:!:19000::::::\n",
            passwd,
        );
        assert_eq!(
            shadow,
            "root:$6$salt$hash:19000:0:99999:7:::\napp:!:19000::::::\n"
        );
        let shadow = merge_shadow("", passwd);
        assert_eq!(shadow, "root:*::0:99999:7:::\napp:*::0:99999:7:::\n");
    }

    #[test]
    fn account_files_are_read_without_following_links_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        std::fs::write(&outside, "evil:x:0:0::/:/bin/sh\n").unwrap();
        let etc = dir.path().join("etc");
        std::fs::create_dir(&etc).unwrap();
        std::os::unix::fs::symlink(&outside, etc.join("passwd")).unwrap();
        std::fs::write(etc.join("group"), b"ok:x:10:\n\xff\xfe:x:11:\n").unwrap();
        merge(&etc).unwrap();
        let passwd = std::fs::read_to_string(etc.join("passwd")).unwrap();
        assert!(!passwd.contains("evil"), "{passwd}");
        assert_eq!(
            std::fs::read_to_string(&outside).unwrap(),
            "evil:x:0:0::/:/bin/sh\n"
        );
        let group = std::fs::read_to_string(etc.join("group")).unwrap();
        assert!(group.starts_with("ok:x:10:\nroot:x:0:\n"), "{group}");
        let big = "a:x:1:1::/:/bin/sh\n".repeat((MAX_FILE / 18 + 10) as usize);
        std::fs::write(etc.join("passwd"), big).unwrap();
        merge(&etc).unwrap();
        let len = std::fs::metadata(etc.join("passwd")).unwrap().len();
        assert!(len < 1024, "{len}");
    }
}
