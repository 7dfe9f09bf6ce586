//! sudo's command line, as sudo(8) reads it: options up to the first word that is not one
//! (or `--`), short options clustered (`-Eu root`), a value attached or in the next word,
//! long options with `=` or the next word, then leading `NAME=value` words, then the command.

use std::fmt;

/// What sudo is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    Run,
    /// `-l`: what the caller may run, or the full path of the command given.
    List,
    /// `-v`, `-k`, `-K` alone: refresh or drop cached credentials; nothing is cached here.
    Credentials,
    Help,
    Version,
}

/// Which of the caller's environment the command keeps.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Preserve {
    #[default]
    Reset,
    /// `-E` / `--preserve-env`.
    All,
    /// `--preserve-env=A,B`: these on top of the reset environment.
    Names(Vec<String>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub mode: Mode,
    pub user: Option<String>,
    pub group: Option<String>,
    pub preserve: Preserve,
    /// `-i`: the target's login shell, in its home.
    pub login: bool,
    /// `-s`: a shell (`$SHELL` or the target's).
    pub shell: bool,
    /// `-H`: HOME is the target's even when the environment is preserved.
    pub set_home: bool,
    /// `-D`: the command's working directory.
    pub chdir: Option<String>,
    /// Leading `NAME=value` words.
    pub assignments: Vec<(String, String)>,
    pub command: Vec<String>,
}

/// A command line sudo refuses, with sudo's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

pub const USAGE: &str = "usage: sudo -h | -K | -k | -V
usage: sudo -v [-knS] [-g group] [-u user]
usage: sudo -l [-knS] [-g group] [-U user] [-u user] [command [arg ...]]
usage: sudo [-EHknS] [--preserve-env=list] [-D directory] [-g group] [-u user] [-i | -s]
            [VAR=value] [command [arg ...]]";

/// sudo's short options by the long option each stands for.
const SHORT: &[(char, &str)] = &[
    ('A', "askpass"),
    ('B', "bell"),
    ('b', "background"),
    ('C', "close-from"),
    ('D', "chdir"),
    ('E', "preserve-env"),
    ('e', "edit"),
    ('g', "group"),
    ('H', "set-home"),
    ('h', "help"),
    ('i', "login"),
    ('K', "remove-timestamp"),
    ('k', "reset-timestamp"),
    ('l', "list"),
    ('N', "no-update"),
    ('n', "non-interactive"),
    ('P', "preserve-groups"),
    ('p', "prompt"),
    ('R', "chroot"),
    ('r', "role"),
    ('S', "stdin"),
    ('s', "shell"),
    ('T', "command-timeout"),
    ('t', "type"),
    ('U', "other-user"),
    ('u', "user"),
    ('V', "version"),
    ('v', "validate"),
];

/// The options that take a value (the rest of a short option's cluster, or the next word;
/// `=` or the next word for a long one). `--preserve-env` takes one only after `=`.
const WITH_VALUE: &[&str] = &[
    "chdir",
    "chroot",
    "close-from",
    "command-timeout",
    "group",
    "host",
    "other-user",
    "prompt",
    "role",
    "type",
    "user",
];

pub fn parse(args: &[String]) -> Result<Options, UsageError> {
    let mut o = Options {
        mode: Mode::Run,
        user: None,
        group: None,
        preserve: Preserve::Reset,
        login: false,
        shell: false,
        set_home: false,
        chdir: None,
        assignments: Vec::new(),
        command: Vec::new(),
    };
    let mut credentials_only = false;
    let mut words = args.iter();
    let mut rest: Vec<String> = Vec::new();
    while let Some(arg) = words.next() {
        if arg == "--" {
            break;
        }
        let mut next = |shown: &str| {
            words.next().cloned().ok_or_else(|| {
                UsageError(format!(
                    "sudo: option '{shown}' requires an argument\n{USAGE}"
                ))
            })
        };
        if let Some(long) = arg.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            let shown = format!("--{name}");
            let value = match (WITH_VALUE.contains(&name), inline) {
                (true, Some(v)) => Some(v),
                (true, None) => Some(next(&shown)?),
                (false, Some(v)) if name == "preserve-env" => Some(v),
                (false, Some(_)) => {
                    return Err(UsageError(format!(
                        "sudo: option '{shown}' doesn't allow an argument\n{USAGE}"
                    )))
                }
                (false, None) => None,
            };
            apply(&mut o, &mut credentials_only, name, value, &shown)?;
            continue;
        }
        let Some(cluster) = arg.strip_prefix('-').filter(|c| !c.is_empty()) else {
            rest.push(arg.clone());
            break;
        };
        for (k, c) in cluster.char_indices() {
            let Some(&(_, name)) = SHORT.iter().find(|(short, _)| *short == c) else {
                return Err(UsageError(format!(
                    "sudo: invalid option -- '{c}'\n{USAGE}"
                )));
            };
            let shown = format!("-{c}");
            if !WITH_VALUE.contains(&name) {
                apply(&mut o, &mut credentials_only, name, None, &shown)?;
                continue;
            }
            let attached = &cluster[k + c.len_utf8()..];
            let value = match attached.is_empty() {
                true => next(&shown)?,
                false => attached.to_string(),
            };
            apply(&mut o, &mut credentials_only, name, Some(value), &shown)?;
            break;
        }
    }
    rest.extend(words.cloned());
    let mut rest = rest.into_iter().peekable();
    while let Some(kv) = rest.peek().and_then(|w| assignment(w)) {
        o.assignments.push(kv);
        rest.next();
    }
    o.command = rest.collect();
    if o.login && o.shell {
        return Err(UsageError(format!(
            "sudo: you may not specify both the -i and -s options\n{USAGE}"
        )));
    }
    if o.mode == Mode::Run && o.command.is_empty() && !o.login && !o.shell {
        if credentials_only {
            o.mode = Mode::Credentials;
        } else {
            return Err(UsageError(USAGE.to_string()));
        }
    }
    Ok(o)
}

/// Option `name` (as the long option; `shown` as the command line wrote it) with its value.
fn apply(
    o: &mut Options,
    credentials_only: &mut bool,
    name: &str,
    value: Option<String>,
    shown: &str,
) -> Result<(), UsageError> {
    match name {
        "user" => o.user = value,
        "group" => o.group = value,
        "chdir" => o.chdir = value,
        "preserve-env" => {
            o.preserve = match value {
                Some(list) => merge_names(std::mem::take(&mut o.preserve), &list),
                None => Preserve::All,
            }
        }
        "login" => o.login = true,
        "shell" => o.shell = true,
        "set-home" => o.set_home = true,
        "list" => o.mode = Mode::List,
        "help" => o.mode = Mode::Help,
        "version" => o.mode = Mode::Version,
        "validate" | "reset-timestamp" | "remove-timestamp" => *credentials_only = true,
        // No password is ever asked, nothing cached: these change nothing here.
        "non-interactive" | "stdin" | "askpass" | "bell" | "preserve-groups" | "no-update"
        | "prompt" | "close-from" | "role" | "type" | "command-timeout" | "other-user" | "host" => {
        }
        "background" | "edit" | "chroot" => {
            return Err(UsageError(format!("sudo: {shown} is not supported here")))
        }
        _ => {
            return Err(UsageError(format!(
                "sudo: unrecognized option '{shown}'\n{USAGE}"
            )))
        }
    }
    Ok(())
}

fn merge_names(current: Preserve, list: &str) -> Preserve {
    let mut names = match current {
        Preserve::All => return Preserve::All,
        Preserve::Names(n) => n,
        Preserve::Reset => Vec::new(),
    };
    names.extend(list.split(',').filter(|n| !n.is_empty()).map(String::from));
    Preserve::Names(names)
}

/// `NAME=value` as sudo takes it before the command: a name of letters, digits and `_`, not
/// starting with a digit.
fn assignment(word: &str) -> Option<(String, String)> {
    let (name, value) = word.split_once('=')?;
    let mut chars = name.chars();
    let first = chars.next()?;
    let ok = (first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    ok.then(|| (name.to_string(), value.to_string()))
}

/// The command as one string for `shell -c`, each character that is not a letter, digit,
/// `_`, `-` or `$` escaped with a backslash, as sudo does for `-s` and `-i`.
pub fn shell_command(words: &[String]) -> String {
    let mut out = String::new();
    for (n, word) in words.iter().enumerate() {
        if n > 0 {
            out.push(' ');
        }
        for c in word.chars() {
            if !(c.is_alphanumeric() || matches!(c, '_' | '-' | '$')) {
                out.push('\\');
            }
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(line: &[&str]) -> Result<Options, UsageError> {
        parse(&line.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn options_stop_at_the_command_and_its_own_options_are_its() {
        let o = p(&["-u", "nobody", "ls", "-l", "-u"]).unwrap();
        assert_eq!(o.user.as_deref(), Some("nobody"));
        assert_eq!(o.command, ["ls", "-l", "-u"]);
        assert_eq!(o.mode, Mode::Run);
        let o = p(&["--", "-weird-name", "x"]).unwrap();
        assert_eq!(o.command, ["-weird-name", "x"]);
    }

    #[test]
    fn clustered_short_options_and_attached_values() {
        let o = p(&["-Eu", "root", "env"]).unwrap();
        assert_eq!(o.preserve, Preserve::All);
        assert_eq!(o.user.as_deref(), Some("root"));
        let o = p(&["-unobody", "-gusers", "-HD/tmp", "id"]).unwrap();
        assert_eq!(o.user.as_deref(), Some("nobody"));
        assert_eq!(o.group.as_deref(), Some("users"));
        assert!(o.set_home);
        assert_eq!(o.chdir.as_deref(), Some("/tmp"));
        let o = p(&["-n", "-S", "-p", "pw:", "true"]).unwrap();
        assert_eq!(o.command, ["true"]);
    }

    #[test]
    fn long_options_take_equals_or_the_next_word() {
        let o = p(&["--user=nobody", "--chdir", "/srv", "--login"]).unwrap();
        assert_eq!(o.user.as_deref(), Some("nobody"));
        assert_eq!(o.chdir.as_deref(), Some("/srv"));
        assert!(o.login && o.command.is_empty());
        let o = p(&["--preserve-env=A,B", "--preserve-env=C", "env"]).unwrap();
        assert_eq!(
            o.preserve,
            Preserve::Names(vec!["A".into(), "B".into(), "C".into()])
        );
        let o = p(&["--preserve-env", "env"]).unwrap();
        assert_eq!(o.preserve, Preserve::All);
    }

    #[test]
    fn leading_assignments_are_environment_later_ones_are_arguments() {
        let o = p(&["A=1", "_B2=x=y", "env", "C=3"]).unwrap();
        assert_eq!(
            o.assignments,
            [("A".into(), "1".into()), ("_B2".into(), "x=y".into())]
        );
        assert_eq!(o.command, ["env", "C=3"]);
        // Not a name: the command itself.
        let o = p(&["1A=x", "y"]).unwrap();
        assert!(o.assignments.is_empty());
        assert_eq!(o.command, ["1A=x", "y"]);
    }

    #[test]
    fn modes_and_refusals() {
        assert_eq!(p(&["-l"]).unwrap().mode, Mode::List);
        assert_eq!(p(&["-V"]).unwrap().mode, Mode::Version);
        assert_eq!(p(&["-h"]).unwrap().mode, Mode::Help);
        assert_eq!(p(&["-v"]).unwrap().mode, Mode::Credentials);
        assert_eq!(p(&["-k"]).unwrap().mode, Mode::Credentials);
        assert_eq!(p(&["-k", "id"]).unwrap().mode, Mode::Run);
        assert_eq!(p(&["-s"]).unwrap().mode, Mode::Run);
        for bad in [
            &[][..],
            &["-x", "id"],
            &["-u"],
            &["-i", "-s"],
            &["--frob", "id"],
            &["-b", "id"],
        ] {
            assert!(p(bad).is_err(), "{bad:?}");
        }
        let e = p(&["--login=yes"]).unwrap_err();
        assert!(e.0.contains("doesn't allow an argument"), "{e}");
        assert_eq!(
            p(&["-e", "f"]).unwrap_err().0,
            "sudo: -e is not supported here"
        );
        assert_eq!(
            p(&["--chroot=/x", "id"]).unwrap_err().0,
            "sudo: --chroot is not supported here"
        );
        let e = p(&["-x"]).unwrap_err();
        assert!(e.0.starts_with("sudo: invalid option -- 'x'"), "{e}");
    }

    #[test]
    fn shell_commands_escape_like_sudo() {
        let words = [
            "echo".to_string(),
            "a b".into(),
            "$HOME".into(),
            "x;y".into(),
        ];
        assert_eq!(shell_command(&words), r"echo a\ b $HOME x\;y");
    }
}
