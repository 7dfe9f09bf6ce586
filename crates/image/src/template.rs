//! Declarative templates (issue 18, first part): the TOML spec of an image built on a base
//! image, checked, and cut into build steps, each keyed by the sha256 of its inputs and of its
//! parent's key (the base image's digest for the first), so a rebuild finds every step up to
//! the first changed one in the store and reruns only the rest. Each step is a shell command
//! ([`Step::command`]); the builder that runs them inside jails is `koder-build`.
//!
//! ```toml
//! base = "python"                      # an image of the store
//! apt = ["curl"]                       # Debian packages
//! pip = ["requests==2.32.3"]
//! npm = ["left-pad"]
//! env = { APP_MODE = "dev" }
//! workdir = "/opt/app"
//! user = "root"
//! run = ["echo built > /opt/app/built"]
//! start = "/usr/bin/python3 -m http.server 8000 --bind 127.0.0.1"
//! ready = "curl -sf http://127.0.0.1:8000/"
//! ready_timeout_s = 30
//!
//! [[files]]
//! dest = "/opt/app/hello.txt"
//! content = "hello\n"
//! mode = 0o644
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::store::{check_name, digest_of, Startup};

/// Longest a ready command may gate a session's start.
pub const MAX_READY_TIMEOUT_S: u64 = 600;

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("template spec: {0}")]
    Invalid(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub base: String,
    #[serde(default)]
    pub apt: Vec<String>,
    #[serde(default)]
    pub pip: Vec<String>,
    #[serde(default)]
    pub npm: Vec<String>,
    #[serde(default)]
    pub files: Vec<FileSpec>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub user: Option<String>,
    #[serde(default)]
    pub run: Vec<String>,
    /// Runs in each new session before it is handed out.
    pub start: Option<String>,
    /// Gates the hand-out: retried until it exits 0, for at most `ready_timeout_s`.
    pub ready: Option<String>,
    #[serde(default = "default_ready_timeout")]
    pub ready_timeout_s: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSpec {
    /// Absolute path in the image.
    pub dest: String,
    pub content: String,
    #[serde(default = "default_mode")]
    pub mode: u32,
}

fn default_ready_timeout() -> u64 {
    30
}

fn default_mode() -> u32 {
    0o644
}

/// One build step, in the order they run: packages, then files, then the run steps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    Apt { packages: Vec<String> },
    Pip { packages: Vec<String> },
    Npm { packages: Vec<String> },
    File(FileSpec),
    Run { command: String },
}

impl Spec {
    pub fn parse(text: &str) -> Result<Spec, TemplateError> {
        let spec: Spec = toml::from_str(text).map_err(|e| invalid(e.to_string()))?;
        spec.check()?;
        Ok(spec)
    }

    fn check(&self) -> Result<(), TemplateError> {
        check_name(&self.base).map_err(|e| invalid(format!("base: {e}")))?;
        for (what, packages) in [("apt", &self.apt), ("pip", &self.pip), ("npm", &self.npm)] {
            if let Some(bad) = packages.iter().find(|p| !is_package(p)) {
                return Err(invalid(format!("{what} package {bad:?}")));
            }
        }
        for f in &self.files {
            check_path(&f.dest, "files.dest")?;
            if f.mode > 0o1777 {
                return Err(invalid(format!(
                    "{}: mode {:o} (setuid and setgid are not kept)",
                    f.dest, f.mode
                )));
            }
        }
        if let Some(w) = &self.workdir {
            check_path(w, "workdir")?;
        }
        if let Some(bad) = self.env.keys().find(|k| !is_env_name(k)) {
            return Err(invalid(format!("env name {bad:?}")));
        }
        if self.ready_timeout_s == 0 || self.ready_timeout_s > MAX_READY_TIMEOUT_S {
            return Err(invalid(format!(
                "ready_timeout_s must be 1..={MAX_READY_TIMEOUT_S}"
            )));
        }
        if let Some(user) = &self.user {
            if user_id(user).is_none() && !crate::valid_account_name(user) {
                return Err(invalid(format!(
                    "user {user:?}: `root`, `user`, a numeric uid or an account name (one a run step adds, e.g. `useradd -m app`)"
                )));
            }
        }
        if self.ready.is_some() && self.start.is_none() {
            return Err(invalid("a ready command gates a start command: give one"));
        }
        Ok(())
    }

    pub fn steps(&self) -> Vec<Step> {
        let mut steps = Vec::new();
        for (packages, make) in [
            (
                &self.apt,
                (|packages| Step::Apt { packages }) as fn(Vec<String>) -> Step,
            ),
            (&self.pip, |packages| Step::Pip { packages }),
            (&self.npm, |packages| Step::Npm { packages }),
        ] {
            if !packages.is_empty() {
                steps.push(make(packages.clone()));
            }
        }
        steps.extend(self.files.iter().cloned().map(Step::File));
        steps.extend(self.run.iter().map(|command| Step::Run {
            command: command.clone(),
        }));
        steps
    }

    /// Every step's cache key, in order: sha256 of (parent key, step, the env it runs with).
    pub fn step_keys(&self, base_digest: &str) -> Vec<String> {
        let mut parent = base_digest.to_string();
        self.steps()
            .iter()
            .map(|step| {
                #[derive(Serialize)]
                struct Inputs<'a> {
                    parent: &'a str,
                    step: &'a Step,
                    env: &'a BTreeMap<String, String>,
                }
                let inputs = Inputs {
                    parent: &parent,
                    step,
                    env: &self.env,
                };
                // Strings and maps of strings always serialize.
                parent = digest_of(&inputs).unwrap_or_default();
                parent.clone()
            })
            .collect()
    }
}

/// Where a build step finds the host's CA bundle (written into the build sandbox's /tmp, which
/// no image keeps), so package clients trust what the host trusts.
pub const BUILD_CA_FILE: &str = "/tmp/.koder-build-ca.pem";
/// Where pip steps install (`pip install --user` below this `PYTHONUSERBASE`).
pub const PIP_BASE: &str = "/opt/koder/pip";
/// Where npm steps install (`npm install -g` with this prefix).
pub const NPM_PREFIX: &str = "/opt/koder/npm";

impl Step {
    /// What the step is, for the build log.
    pub fn describe(&self) -> String {
        match self {
            Step::Apt { packages } => format!("apt {}", packages.join(" ")),
            Step::Pip { packages } => format!("pip {}", packages.join(" ")),
            Step::Npm { packages } => format!("npm {}", packages.join(" ")),
            Step::File(f) => format!("file {} ({:o})", f.dest, f.mode),
            Step::Run { command } => format!("run {command}"),
        }
    }

    /// The step as an argv run by root in the build sandbox (in `$KODER_WORKDIR`, created
    /// first: see [`Spec::step_env`]) and what goes to its stdin. Packages and paths are arguments of the script, never part of
    /// its text, so no name is read by the shell.
    pub fn command(&self) -> (Vec<String>, Vec<u8>) {
        let (body, args, stdin): (String, Vec<String>, Vec<u8>) = match self {
            Step::Apt { packages } => (
                "apt-get -o APT::Sandbox::User=root update && \
                 DEBIAN_FRONTEND=noninteractive apt-get -o APT::Sandbox::User=root \
                 install -y --no-install-recommends -- \"$@\""
                    .into(),
                packages.clone(),
                Vec::new(),
            ),
            Step::Pip { packages } => (
                "python3 -m pip install --user --no-cache-dir --break-system-packages \
                 --root-user-action=ignore --disable-pip-version-check -- \"$@\""
                    .into(),
                packages.clone(),
                Vec::new(),
            ),
            Step::Npm { packages } => (
                "npm install -g --no-fund --no-audit -- \"$@\"".into(),
                packages.clone(),
                Vec::new(),
            ),
            Step::File(f) => (
                format!(
                    "mkdir -p -- \"$(dirname -- \"$1\")\" && cat > \"$1\" && chmod {:o} -- \"$1\"",
                    f.mode
                ),
                vec![f.dest.clone()],
                f.content.clone().into_bytes(),
            ),
            Step::Run { command } => (command.clone(), Vec::new(), Vec::new()),
        };
        let script =
            format!("set -e\nmkdir -p -- \"$KODER_WORKDIR\"\ncd -- \"$KODER_WORKDIR\"\n{body}");
        let mut argv = vec!["/bin/sh".into(), "-c".into(), script, "sh".into()];
        argv.extend(args);
        (argv, stdin)
    }
}

impl Spec {
    /// The working directory steps and sessions start in.
    pub fn workdir(&self) -> &str {
        self.workdir.as_deref().unwrap_or("/workspace")
    }

    /// The environment of the finished image (and of every step): `base`'s, where pip and npm
    /// install to (below /opt, whatever the base), then the spec's own.
    pub fn image_env(&self, base: &[(String, String)]) -> Vec<(String, String)> {
        let mut env: BTreeMap<String, String> = base.iter().cloned().collect();
        let mut path = Vec::new();
        if !self.pip.is_empty() {
            env.insert("PYTHONUSERBASE".into(), PIP_BASE.into());
            path.push(format!("{PIP_BASE}/bin"));
        }
        if !self.npm.is_empty() {
            env.insert("NPM_CONFIG_PREFIX".into(), NPM_PREFIX.into());
            env.insert("NODE_PATH".into(), format!("{NPM_PREFIX}/lib/node_modules"));
            path.push(format!("{NPM_PREFIX}/bin"));
        }
        if !path.is_empty() {
            let old = env
                .get("PATH")
                .cloned()
                .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
            path.push(old);
            env.insert("PATH".into(), path.join(":"));
        }
        env.extend(self.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        env.into_iter().collect()
    }

    /// The environment every step runs with: the image's ([`Spec::image_env`]), where the CA
    /// bundle is and the step's working directory.
    pub fn step_env(&self, base: &[(String, String)]) -> Vec<(String, String)> {
        step_env(self.image_env(base), self.workdir())
    }

    /// What sessions on the image run before they are handed out.
    pub fn startup(&self) -> Option<Startup> {
        self.start.as_ref().map(|start| Startup {
            start: start.clone(),
            ready: self.ready.clone(),
            ready_timeout_s: self.ready_timeout_s,
        })
    }

    /// The digest of the finished image: its last step (or base) and what the manifest adds.
    pub fn image_digest(&self, last: &str) -> String {
        #[derive(Serialize)]
        struct Final<'a> {
            kind: &'static str,
            last: &'a str,
            env: &'a BTreeMap<String, String>,
            workdir: &'a str,
            user: &'a str,
            startup: Option<Startup>,
        }
        digest_of(&Final {
            kind: "template",
            last,
            env: &self.env,
            workdir: self.workdir(),
            user: self.user.as_deref().unwrap_or("root"),
            startup: self.startup(),
        })
        .unwrap_or_default()
    }
}

/// The environment a build step runs with: `env`, where the host's CA bundle is (so package
/// clients trust what the host trusts) and its working directory (`$KODER_WORKDIR`).
pub fn step_env(mut env: Vec<(String, String)>, workdir: &str) -> Vec<(String, String)> {
    for k in [
        "PIP_CERT",
        "REQUESTS_CA_BUNDLE",
        "SSL_CERT_FILE",
        "NODE_EXTRA_CA_CERTS",
        "NPM_CONFIG_CAFILE",
    ] {
        env.push((k.into(), BUILD_CA_FILE.into()));
    }
    env.push(("KODER_WORKDIR".into(), workdir.into()));
    env
}

/// The steps to run: from the first whose key `cached` does not know (all of them cached:
/// `keys.len()`).
pub fn first_uncached(keys: &[String], cached: impl Fn(&str) -> bool) -> usize {
    keys.iter().position(|k| !cached(k)).unwrap_or(keys.len())
}

/// A package name (with a version pin) that no tool reads as an option or a shell word.
fn is_package(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with('-')
        && p.len() <= 214
        && p.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._+-:=<>~@/^[],!".contains(&b))
}

/// The sandbox uid of a spec's `user` (the accounts every image has, or a number).
pub fn user_id(user: &str) -> Option<u32> {
    match user {
        "root" => Some(0),
        "user" => Some(1000),
        n => n.parse().ok().filter(|uid| *uid < 65534),
    }
}

fn is_env_name(k: &str) -> bool {
    !k.is_empty()
        && !k.starts_with(|c: char| c.is_ascii_digit())
        && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn check_path(path: &str, what: &str) -> Result<(), TemplateError> {
    let ok = path.starts_with('/') && !path.contains('\0') && !path.split('/').any(|c| c == "..");
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "{what} {path:?} must be absolute, without `..`"
        )))
    }
}

fn invalid(why: impl Into<String>) -> TemplateError {
    TemplateError::Invalid(why.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = r#"
base = "bash"
pip = ["requests==2.32.3"]
env = { GREETING = "hello" }
workdir = "/opt/app"
run = ["echo one > /opt/app/one", "echo two > /opt/app/two"]
start = "/usr/bin/python3 -m http.server 8000 --bind 127.0.0.1"
ready = "test -e /tmp/ready"

[[files]]
dest = "/opt/app/hello.txt"
content = "hello\n"
"#;

    const BASE: &str = "3cbc00054439a650e516aae4a60363a83685f424ffcb21f30c8c663513da41c9";

    #[test]
    fn a_spec_becomes_ordered_steps() {
        let spec = Spec::parse(SPEC).unwrap();
        let steps = spec.steps();
        assert_eq!(steps.len(), 4);
        assert!(matches!(&steps[0], Step::Pip { packages } if packages == &["requests==2.32.3"]));
        assert!(
            matches!(&steps[1], Step::File(f) if f.dest == "/opt/app/hello.txt" && f.mode == 0o644)
        );
        assert!(matches!(&steps[3], Step::Run { command } if command.contains("two")));
        assert_eq!(spec.ready_timeout_s, 30);
    }

    #[test]
    fn changing_a_step_changes_its_key_and_those_after_it_only() {
        let spec = Spec::parse(SPEC).unwrap();
        let keys = spec.step_keys(BASE);
        assert_eq!(keys, spec.step_keys(BASE), "keys are stable");
        assert!(keys.iter().all(|k| crate::store::is_digest(k)));
        assert_eq!(first_uncached(&keys, |k| keys.contains(&k.to_string())), 4);

        let mut last = spec.clone();
        last.run[1] = "echo three > /opt/app/two".into();
        let changed = last.step_keys(BASE);
        assert_eq!(changed[..3], keys[..3]);
        assert_ne!(changed[3], keys[3]);
        assert_eq!(
            first_uncached(&changed, |k| keys.contains(&k.to_string())),
            3
        );

        let mut file = spec.clone();
        file.files[0].content = "bye\n".into();
        let changed = file.step_keys(BASE);
        assert_eq!(changed[0], keys[0]);
        assert!(changed[1..].iter().zip(&keys[1..]).all(|(a, b)| a != b));

        let mut env = spec.clone();
        env.env.insert("MORE".into(), "x".into());
        assert_ne!(env.step_keys(BASE)[0], keys[0], "steps run with the env");
        assert_ne!(
            spec.step_keys(&"0".repeat(64))[0],
            keys[0],
            "a new base rebuilds"
        );
    }

    #[test]
    fn steps_pass_names_as_arguments_never_as_script_text() {
        let spec = Spec::parse(SPEC).unwrap();
        let (argv, stdin) = spec.steps()[0].command();
        assert_eq!(argv[..2], ["/bin/sh", "-c"]);
        assert!(!argv[2].contains("requests"), "{}", argv[2]);
        assert_eq!(argv.last().unwrap(), "requests==2.32.3");
        assert!(stdin.is_empty());
        let (argv, stdin) = spec.steps()[1].command();
        assert_eq!(argv.last().unwrap(), "/opt/app/hello.txt");
        assert!(argv[2].contains("chmod 644"));
        assert_eq!(stdin, b"hello\n");
        let env = spec.step_env(&[("PATH".into(), "/usr/bin".into())]);
        assert!(env.contains(&("KODER_WORKDIR".into(), "/opt/app".into())));
        assert!(env.contains(&("PATH".into(), format!("{PIP_BASE}/bin:/usr/bin"))));
        assert!(env.contains(&("GREETING".into(), "hello".into())));
        let startup = spec.startup().unwrap();
        assert_eq!(startup.ready.as_deref(), Some("test -e /tmp/ready"));
        assert_ne!(spec.image_digest(BASE), spec.image_digest(&"1".repeat(64)));
    }

    #[test]
    fn hostile_or_broken_specs_are_refused() {
        for bad in [
            "base = \"../x\"",
            "base = \"bash\"\npip = [\"--index-url=http://evil\"]",
            "base = \"bash\"\napt = [\"curl; rm -rf /\"]",
            "base = \"bash\"\n[[files]]\ndest = \"/opt/../../etc/passwd\"\ncontent = \"\"",
            "base = \"bash\"\n[[files]]\ndest = \"relative\"\ncontent = \"\"",
            "base = \"bash\"\n[[files]]\ndest = \"/x\"\ncontent = \"\"\nmode = 0o4755",
            "base = \"bash\"\nenv = { \"A=B\" = \"x\" }",
            "base = \"bash\"\nready = \"true\"",
            "base = \"bash\"\nstart = \"x\"\nready = \"true\"\nready_timeout_s = 100000",
            "base = \"bash\"\nunknown = 1",
            "base = \"bash\"\nuser = \"-rf\"",
            "base = \"bash\"\nuser = \"a b\"",
            "base = \"bash\"\nuser = \"70000\"",
            "pip = []",
        ] {
            assert!(Spec::parse(bad).is_err(), "{bad}");
        }
    }
}
