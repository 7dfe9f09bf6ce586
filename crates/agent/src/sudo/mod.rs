//! The `sudo` command of every sandbox: the agent's own binary, hard-linked at
//! [`koder_agent_protocol::init::SUDO_PATHS`] in the root's bottom layer and run under that
//! name.
//!
//! Sandboxes cannot elevate through a setuid binary (no_new_privs; the image store strips
//! setuid bits), so this `sudo` asks the agent's sudo service (`serve::sudo`) to run the
//! command instead, and behaves as passwordless sudo does for an account allowed everything
//! (E2B's templates give their `user` exactly that): options, the target account, the
//! environment reset to sudo's defaults, exit status and signals. Everything is decided here,
//! in the caller's process; the service only checks the request is well formed and spawns.

mod client;
mod options;
pub mod wire;

use std::collections::BTreeMap;

use crate::accounts::{account_of, find_account, find_group, Account};
use options::{shell_command, Mode, Options, Preserve, UsageError};
use wire::Request;

/// sudo's `secure_path` as Debian's sudoers sets it: the PATH of every command.
const SECURE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What the reset environment keeps of the caller's: the terminal, the locale and display
/// settings sudo keeps by default.
const KEPT: &[&str] = &[
    "TERM",
    "COLORTERM",
    "DISPLAY",
    "XAUTHORITY",
    "TZ",
    "PS1",
    "PS2",
    "LS_COLORS",
    "COLORS",
    "HOSTNAME",
    "LANG",
    "LANGUAGE",
    "LINGUAS",
];

/// Runs `sudo` with `args` (argv without its first word); returns the exit status.
pub fn main(args: Vec<std::ffi::OsString>) -> i32 {
    let args: Option<Vec<String>> = args.into_iter().map(|a| a.into_string().ok()).collect();
    let Some(args) = args else {
        eprintln!("sudo: arguments must be UTF-8 here");
        return 1;
    };
    let opts = match options::parse(&args) {
        Ok(o) => o,
        Err(UsageError(msg)) => {
            eprintln!("{msg}");
            return 1;
        }
    };
    let caller = Caller::current();
    match opts.mode {
        Mode::Help => {
            println!(
                "sudo - execute a command as another user\n\n{}",
                options::USAGE
            );
            0
        }
        Mode::Version => {
            println!("Sudo version 1.9 (koder-sandbox: run by the sandbox agent, passwordless)");
            0
        }
        Mode::Credentials => 0,
        Mode::List => list(&opts, &caller),
        Mode::Run => match request(&opts, &caller) {
            Ok(req) => client::run(req),
            Err(msg) => {
                eprintln!("sudo: {msg}");
                1
            }
        },
    }
}

/// Who runs `sudo`, where, with what.
struct Caller {
    uid: u32,
    gid: u32,
    passwd: String,
    group: String,
    env: Vec<(String, String)>,
    cwd: String,
}

impl Caller {
    fn current() -> Self {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        Caller {
            uid: rustix::process::getuid().as_raw(),
            gid: rustix::process::getgid().as_raw(),
            passwd: read("/etc/passwd"),
            group: read("/etc/group"),
            env: std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .collect(),
            cwd: std::env::current_dir()
                .ok()
                .and_then(|d| d.into_os_string().into_string().ok())
                .unwrap_or_else(|| "/".into()),
        }
    }

    fn name(&self) -> String {
        account_of(&self.passwd, self.uid)
            .map(|a| a.name)
            .unwrap_or_else(|| format!("#{}", self.uid))
    }

    fn var(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The account and group the command runs as: `-u` (default root), `-g` (default the
/// account's own; `-g` alone keeps the caller's account).
fn target(opts: &Options, caller: &Caller) -> Result<(Account, u32), String> {
    let account = match (&opts.user, &opts.group) {
        (None, Some(_)) => account_of(&caller.passwd, caller.uid),
        (user, _) => find_account(&caller.passwd, user.as_deref().unwrap_or("root")),
    };
    let account = match (account, &opts.user) {
        (Some(a), _) => a,
        (None, Some(u)) => return Err(format!("unknown user {u}")),
        (None, None) => return Err("the target account is not in /etc/passwd".into()),
    };
    let gid = match &opts.group {
        Some(g) => find_group(&caller.group, g).ok_or_else(|| format!("unknown group {g}"))?,
        None => account.gid,
    };
    Ok((account, gid))
}

/// The request for `opts`: the program and argv (a shell for `-s`/`-i`), the environment sudo
/// would give it, its working directory and account.
fn request(opts: &Options, caller: &Caller) -> Result<Request, String> {
    let (account, gid) = target(opts, caller)?;
    let (program, argv) = if opts.login || opts.shell {
        let shell = match (opts.shell, caller.var("SHELL")) {
            (true, Some(s)) if !s.is_empty() => s.to_string(),
            _ => account.shell.clone(),
        };
        let shell = if shell.is_empty() {
            "/bin/sh".into()
        } else {
            shell
        };
        let zeroth = match opts.login {
            true => format!("-{}", shell.rsplit('/').next().unwrap_or(&shell)),
            false => shell.clone(),
        };
        let mut argv = vec![zeroth];
        if !opts.command.is_empty() {
            argv.push("-c".into());
            argv.push(shell_command(&opts.command));
        }
        (shell, argv)
    } else {
        (opts.command[0].clone(), opts.command.clone())
    };
    let cwd = match (&opts.chdir, opts.login) {
        (Some(dir), _) => dir.clone(),
        (None, true) => account.home.clone(),
        (None, false) => caller.cwd.clone(),
    };
    Ok(Request {
        env: environment(opts, caller, &account, &argv),
        program,
        argv,
        cwd,
        uid: account.uid,
        gid,
        terminal: false,
    })
}

/// sudo's environment for the command: the caller's reset to [`KEPT`] (all of it with `-E`,
/// named ones added with `--preserve-env=`), then the target's identity, `secure_path`, the
/// SUDO_* variables and the command line's own assignments.
fn environment(
    opts: &Options,
    caller: &Caller,
    account: &Account,
    argv: &[String],
) -> Vec<(String, String)> {
    let keep = |name: &str| match &opts.preserve {
        Preserve::All => true,
        Preserve::Names(names) => KEPT.contains(&name) || names.iter().any(|n| n == name),
        Preserve::Reset => KEPT.contains(&name) || name.starts_with("LC_"),
    };
    let mut env: BTreeMap<String, String> = caller
        .env
        .iter()
        .filter(|(k, _)| keep(k))
        .cloned()
        .collect();
    let mut path = SECURE_PATH.to_string();
    if let Some(shims) = std::path::Path::new(koder_agent_protocol::init::SUDO_PATHS[1]).parent() {
        if shims.is_dir() {
            path.push(':');
            path.push_str(&shims.to_string_lossy());
        }
    }
    let set_home = opts.set_home || opts.login || opts.preserve != Preserve::All;
    if set_home {
        env.insert("HOME".into(), account.home.clone());
    }
    if opts.preserve != Preserve::All || opts.login {
        env.insert("SHELL".into(), account.shell.clone());
    }
    env.insert("PATH".into(), path);
    env.insert("USER".into(), account.name.clone());
    env.insert("LOGNAME".into(), account.name.clone());
    env.insert("MAIL".into(), format!("/var/mail/{}", account.name));
    env.insert("SUDO_USER".into(), caller.name());
    env.insert("SUDO_UID".into(), caller.uid.to_string());
    env.insert("SUDO_GID".into(), caller.gid.to_string());
    env.insert("SUDO_COMMAND".into(), argv.join(" "));
    for (k, v) in &opts.assignments {
        env.insert(k.clone(), v.clone());
    }
    env.into_iter().collect()
}

/// `sudo -l`: what the caller may run (everything, without a password), or with a command,
/// the program sudo would run.
fn list(opts: &Options, caller: &Caller) -> i32 {
    let Some(program) = opts.command.first() else {
        let host = rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned();
        println!(
            "Matching Defaults entries for {user} on {host}:\n    env_reset, secure_path={SECURE_PATH}\n\nUser {user} may run the following commands on {host}:\n    (ALL : ALL) NOPASSWD: ALL",
            user = caller.name()
        );
        return 0;
    };
    let found = if program.contains('/') {
        Some(program.clone())
    } else {
        SECURE_PATH
            .split(':')
            .map(|dir| format!("{dir}/{program}"))
            .find(|p| std::path::Path::new(p).is_file())
    };
    match found {
        Some(path) => {
            let mut line = vec![path];
            line.extend(opts.command[1..].iter().cloned());
            println!("{}", line.join(" "));
            0
        }
        None => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller() -> Caller {
        Caller {
            uid: 1000,
            gid: 1000,
            passwd: "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/zsh\nnobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n".into(),
            group: "root:x:0:\nstaff:x:50:\n".into(),
            env: vec![
                ("FOO".into(), "bar".into()),
                ("TERM".into(), "xterm".into()),
                ("LC_ALL".into(), "C.UTF-8".into()),
                ("HOME".into(), "/home/user".into()),
                ("PATH".into(), "/home/user/bin:/usr/bin".into()),
                ("SHELL".into(), "/bin/zsh".into()),
            ],
            cwd: "/home/user/project".into(),
        }
    }

    fn req(line: &[&str]) -> Result<Request, String> {
        let args: Vec<String> = line.iter().map(|s| s.to_string()).collect();
        request(&options::parse(&args).unwrap(), &caller())
    }

    fn get<'a>(r: &'a Request, k: &str) -> Option<&'a str> {
        r.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn a_plain_command_runs_as_root_in_the_callers_directory_with_a_reset_environment() {
        let r = req(&["echo", "hi"]).unwrap();
        assert_eq!((r.uid, r.gid), (0, 0));
        assert_eq!(
            (r.program.as_str(), r.argv.as_slice()),
            ("echo", &["echo".to_string(), "hi".into()][..])
        );
        assert_eq!(r.cwd, "/home/user/project");
        assert_eq!(get(&r, "FOO"), None, "a caller's variable leaks");
        assert_eq!(get(&r, "TERM"), Some("xterm"));
        assert_eq!(get(&r, "LC_ALL"), Some("C.UTF-8"));
        assert_eq!(get(&r, "HOME"), Some("/root"));
        assert_eq!(get(&r, "USER"), Some("root"));
        assert_eq!(get(&r, "SUDO_USER"), Some("user"));
        assert_eq!(get(&r, "SUDO_UID"), Some("1000"));
        assert_eq!(get(&r, "SUDO_COMMAND"), Some("echo hi"));
        assert!(get(&r, "PATH").unwrap().starts_with(SECURE_PATH));
    }

    #[test]
    fn preserved_environments_and_assignments() {
        let r = req(&["-E", "env"]).unwrap();
        assert_eq!(get(&r, "FOO"), Some("bar"));
        assert_eq!(get(&r, "HOME"), Some("/home/user"), "-E keeps HOME");
        assert!(
            get(&r, "PATH").unwrap().starts_with(SECURE_PATH),
            "secure_path wins"
        );
        let r = req(&["-EH", "env"]).unwrap();
        assert_eq!(get(&r, "HOME"), Some("/root"));
        let r = req(&["--preserve-env=FOO", "env"]).unwrap();
        assert_eq!(get(&r, "FOO"), Some("bar"));
        assert_eq!(get(&r, "SHELL"), Some("/bin/bash"));
        let r = req(&["FOO=baz", "X=1", "env"]).unwrap();
        assert_eq!((get(&r, "FOO"), get(&r, "X")), (Some("baz"), Some("1")));
    }

    #[test]
    fn accounts_groups_and_refusals() {
        let r = req(&["-u", "nobody", "id"]).unwrap();
        assert_eq!((r.uid, r.gid), (65534, 65534));
        let r = req(&["-u", "#1000", "-g", "staff", "id"]).unwrap();
        assert_eq!((r.uid, r.gid), (1000, 50));
        let r = req(&["-g", "staff", "id"]).unwrap();
        assert_eq!((r.uid, r.gid), (1000, 50), "-g alone keeps the caller");
        assert_eq!(
            req(&["-u", "ghost", "id"]).unwrap_err(),
            "unknown user ghost"
        );
        assert_eq!(
            req(&["-g", "ghosts", "id"]).unwrap_err(),
            "unknown group ghosts"
        );
    }

    #[test]
    fn shells_login_shells_and_directories() {
        let r = req(&["-i"]).unwrap();
        assert_eq!(
            (r.program.as_str(), r.argv.as_slice()),
            ("/bin/bash", &["-bash".to_string()][..])
        );
        assert_eq!(r.cwd, "/root");
        let r = req(&["-i", "echo", "a b"]).unwrap();
        assert_eq!(r.argv, ["-bash", "-c", r"echo a\ b"]);
        let r = req(&["-s", "echo", "$X"]).unwrap();
        assert_eq!(r.program, "/bin/zsh", "-s takes the caller's SHELL");
        assert_eq!(r.argv, ["/bin/zsh", "-c", "echo $X"]);
        let r = req(&["-D", "/tmp", "pwd"]).unwrap();
        assert_eq!(r.cwd, "/tmp");
    }
}
