//! E2B's template steps (`TemplateBuildStartV2`) as a `koder-build` plan: each instruction a
//! step, in order, run as its user in its working directory with the environment so far, each
//! keyed by its parent's key, what it is and what it runs with (plus a nonce when E2B forces
//! it, which forces every step after it too). Commands are fixed scripts; what the template
//! says (commands, paths, users, archives) reaches them as arguments, never as script text,
//! except a `RUN`'s command, which is the step.

use std::collections::BTreeMap;
use std::path::PathBuf;

use koder_image::plan::{Plan, PlanStep, StepRun, Upload};
use koder_image::store::{digest_of, Startup};
use koder_image::StoredImage;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::error::HttpError;

/// The recipe kind of E2B-built images: a template built on one of them inherits its user
/// and working directory.
pub const RECIPE_KIND: &str = "e2b-template";
/// E2B's defaults for a template on a plain image.
const DEFAULT_USER: &str = "user";
const DEFAULT_WORKDIR: &str = "/home/user";
/// The recipe key saying whether the template chose its working directory (a template built
/// on it keeps following its user's home otherwise).
const WORKDIR_SET: &str = "workdir_set";
/// How long a template's ready command may hold a session's hand-out.
const READY_TIMEOUT_S: u64 = 120;
const MAX_STEPS: usize = 512;
/// Where a `COPY` step's archive is written in its build sandbox (/tmp: no image keeps it).
const COPY_ARCHIVE: &str = "/tmp/.koder-copy.tar";

/// `TemplateBuildStartV2`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct StartBuild {
    pub from_image: Option<String>,
    pub from_template: Option<String>,
    pub from_image_registry: Option<serde_json::Value>,
    pub force: bool,
    pub steps: Vec<E2bStep>,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
}

/// `TemplateStep`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct E2bStep {
    #[serde(rename = "type")]
    pub kind: String,
    pub args: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files_hash: Option<String>,
    #[serde(skip_serializing)]
    pub force: bool,
    #[serde(skip_serializing)]
    pub force_upload: Option<bool>,
}

/// What later steps run with.
struct Context {
    env: BTreeMap<String, String>,
    workdir: String,
    /// Whether a `WORKDIR` chose `workdir`; until one does, it is the current user's home
    /// (E2B's working directory is unset then, and envd starts in the user's home).
    workdir_set: bool,
    user: String,
}

/// Runs `$1` with bash where the image has it (E2B's shell), in the step's working directory.
const RUN_SCRIPT: &str = "cd -- \"$KODER_WORKDIR\" || exit 1\n\
if [ -x /bin/bash ]; then exec /bin/bash -c \"$1\"; fi\n\
exec /bin/sh -c \"$1\"";
/// Creates the working directory `$1` (owned by `$2`) unless it is one already.
const WORKDIR_SCRIPT: &str =
    "set -e\nif [ ! -d \"$1\" ]; then mkdir -p -- \"$1\"; chown -- \"$2\" \"$1\"; fi";
/// Makes the account `$1` unless it exists, as E2B does (`useradd -m`, or busybox `adduser -D`
/// on an image without it: a home in /home, no password).
const USER_SCRIPT: &str = "id -- \"$1\" >/dev/null 2>&1 && exit 0\n\
if command -v useradd >/dev/null 2>&1; then exec useradd -m -- \"$1\"; fi\n\
exec adduser -D -g '' -- \"$1\"";
/// Copies what `$2` matches in the archive `$1` to `$3` (relative to the working directory),
/// owned by `$4`, with mode `$5` (when given). As Docker's COPY: a directory's contents, a
/// file to the path (or into it, when it ends with `/` or is a directory), several matches
/// into the directory. Owner and mode are set in the unpacked copy, so files already at the
/// destination keep theirs; a link keeps its target's mode.
const COPY_SCRIPT: &str = r#"set -e
archive=$1 src=${2#./} dest=$3 owner=$4 mode=$5
case $dest in /*) ;; *) dest=$KODER_WORKDIR/$dest ;; esac
work=$(mktemp -d /tmp/.koder-copy.XXXXXX)
tar -x --no-same-owner -f "$archive" -C "$work"
cd "$work"
IFS=
set -- $src
if [ ! -e "$1" ] && [ ! -L "$1" ]; then echo "COPY: nothing matches $src" >&2; exit 1; fi
for m; do
  if [ -n "$owner" ]; then chown -hR -- "$owner" "$m"; fi
  if [ -n "$mode" ] && [ ! -L "$m" ]; then chmod -R -- "$mode" "$m"; fi
done
if [ $# -eq 1 ] && [ "$1" = "$src" ] && [ -d "$1" ] && [ ! -L "$1" ]; then
  mkdir -p -- "$dest"
  cp -a -- "$1"/. "$dest"/
elif [ $# -eq 1 ] && [ "$1" = "$src" ] && [ "${dest%/}" = "$dest" ] && [ ! -d "$dest" ]; then
  mkdir -p -- "$(dirname -- "$dest")"
  cp -a -- "$1" "$dest"
else
  mkdir -p -- "$dest"
  for m; do cp -a -- "$m" "$dest"/; done
fi
rm -rf -- "$work""#;

/// The plan of E2B's `req` on `base`; `files` finds a `COPY` step's uploaded archive by its
/// files hash.
pub fn plan(
    base: StoredImage,
    req: &StartBuild,
    files: impl Fn(&str) -> Option<PathBuf>,
) -> Result<Plan, HttpError> {
    if req.steps.len() > MAX_STEPS {
        return Err(HttpError::bad_request(format!(
            "a template has at most {MAX_STEPS} steps"
        )));
    }
    let inherits = base.manifest.recipe["kind"] == RECIPE_KIND;
    let mut ctx = Context {
        env: base.manifest.env.iter().cloned().collect(),
        workdir: if inherits {
            base.manifest.workdir.clone()
        } else {
            DEFAULT_WORKDIR.into()
        },
        // Images built before this was recorded had it set.
        workdir_set: inherits && base.manifest.recipe[WORKDIR_SET].as_bool().unwrap_or(true),
        user: if inherits {
            base.manifest.user.clone()
        } else {
            DEFAULT_USER.into()
        },
    };
    let mut parent = base.manifest.digest.clone();
    let mut forced = req.force;
    let mut steps = Vec::with_capacity(req.steps.len());
    for (i, step) in req.steps.iter().enumerate() {
        let number = i + 1;
        let (describe, run) = step_of(step, number, &mut ctx, &base, &files)?;
        forced |= step.force;
        let key = digest_of(&json!({
            "parent": parent,
            "step": step,
            "env": ctx.env,
            "workdir": ctx.workdir,
            "user": ctx.user,
            "nonce": forced.then(|| uuid::Uuid::new_v4().to_string()),
        }))
        .map_err(|e| HttpError::new(500, format!("step {number}: {e}")))?;
        parent = key.clone();
        steps.push(PlanStep {
            describe,
            key,
            recipe: serde_json::to_value(step).unwrap_or_default(),
            run,
        });
    }
    let startup = startup(req)?;
    let env: Vec<(String, String)> = ctx.env.into_iter().collect();
    let digest = digest_of(&json!({
        "kind": RECIPE_KIND,
        "last": parent,
        "env": env,
        "workdir": ctx.workdir,
        "user": ctx.user,
        "startup": startup,
    }))
    .map_err(|e| HttpError::new(500, e.to_string()))?;
    Ok(Plan {
        recipe: json!({
            "kind": RECIPE_KIND,
            "base": base.manifest.digest,
            "steps": req.steps,
            "keys": steps.iter().map(|s| &s.key).collect::<Vec<_>>(),
            WORKDIR_SET: ctx.workdir_set,
        }),
        digest,
        env,
        workdir: ctx.workdir,
        user: ctx.user,
        startup,
        steps,
        base,
    })
}

/// One instruction: what it is, for the log, and what runs (none for `ENV`).
fn step_of(
    step: &E2bStep,
    number: usize,
    ctx: &mut Context,
    base: &StoredImage,
    files: &impl Fn(&str) -> Option<PathBuf>,
) -> Result<(String, Option<StepRun>), HttpError> {
    let bad = |why: String| HttpError::bad_request(format!("step {number} ({}): {why}", step.kind));
    if let Some(arg) = step.args.iter().find(|a| a.contains('\0')) {
        return Err(bad(format!("argument {arg:?} holds a NUL")));
    }
    let args = &step.args;
    let script = |text: &str, args: &[&str]| {
        let mut argv: Vec<String> = vec!["/bin/sh".into(), "-c".into(), text.into(), "sh".into()];
        argv.extend(args.iter().map(|a| a.to_string()));
        argv
    };
    match (step.kind.as_str(), args.as_slice()) {
        ("ENV", pairs) if !pairs.is_empty() && pairs.len() % 2 == 0 => {
            for pair in pairs.chunks(2) {
                if !is_env_name(&pair[0]) {
                    return Err(bad(format!("invalid variable name {:?}", pair[0])));
                }
                ctx.env.insert(pair[0].clone(), pair[1].clone());
            }
            let shown: Vec<String> = pairs.chunks(2).map(|p| format!("{}={}", p[0], p[1])).collect();
            Ok((format!("ENV {}", shown.join(" ")), None))
        }
        ("WORKDIR", [dir]) if !dir.is_empty() => {
            ctx.workdir = absolute(dir, &ctx.workdir);
            ctx.workdir_set = true;
            let run = root_run(
                ctx,
                format!("WORKDIR {dir}"),
                script(WORKDIR_SCRIPT, &[ctx.workdir.as_str(), ctx.user.as_str()]),
            );
            Ok((format!("WORKDIR {}", ctx.workdir), Some(run)))
        }
        ("USER", [user]) if !user.is_empty() => {
            let run = root_run(ctx, format!("USER {user}"), script(USER_SCRIPT, &[user.as_str()]));
            ctx.user = user.clone();
            if !ctx.workdir_set {
                ctx.workdir = home_of(base, user);
            }
            Ok((format!("USER {user}"), Some(run)))
        }
        ("RUN", [command, rest @ ..]) if rest.len() <= 1 => {
            let user = rest
                .first()
                .filter(|u| !u.is_empty())
                .unwrap_or(&ctx.user)
                .clone();
            // HOME and USER are the account's, from the step's /etc/passwd.
            let env = step_env(ctx);
            Ok((
                format!("RUN {command}"),
                Some(StepRun {
                    shown: command.clone(),
                    argv: script(RUN_SCRIPT, &[command.as_str()]),
                    env,
                    user: Some(user),
                    ..StepRun::default()
                }),
            ))
        }
        ("COPY", [src, dest, rest @ ..]) if rest.len() <= 2 => {
            let owner = rest.first().filter(|o| !o.is_empty()).unwrap_or(&ctx.user);
            let mode = rest.get(1).map(String::as_str).unwrap_or("");
            if !mode.is_empty()
                && (mode.len() > 4 || !mode.bytes().all(|b| (b'0'..=b'7').contains(&b)))
            {
                return Err(bad(format!("mode {mode:?} is no octal mode")));
            }
            if src.is_empty() || src.starts_with('/') || src.split('/').any(|c| c == "..") {
                return Err(bad(format!(
                    "source {src:?} must be a relative path inside the build context"
                )));
            }
            let hash = step
                .files_hash
                .as_deref()
                .ok_or_else(|| bad("no filesHash".into()))?;
            let from = files(hash).ok_or_else(|| {
                bad(format!(
                    "the files of hash {hash} were not uploaded (GET /templates/{{id}}/files/{hash} gives the upload URL)"
                ))
            })?;
            let mut run = root_run(
                ctx,
                format!("COPY {src} {dest}"),
                script(COPY_SCRIPT, &[COPY_ARCHIVE, src.as_str(), dest.as_str(), owner.as_str(), mode]),
            );
            run.upload = Some(Upload {
                from,
                to: COPY_ARCHIVE.into(),
            });
            Ok((format!("COPY {src} {dest}"), Some(run)))
        }
        (kind @ ("ENV" | "WORKDIR" | "USER" | "RUN" | "COPY"), _) => Err(bad(format!(
            "wrong arguments for {kind}: {args:?}"
        ))),
        (other, _) => Err(bad(format!(
            "unsupported step type {other:?} (koder-sandbox builds RUN, COPY, ENV, WORKDIR and USER)"
        ))),
    }
}

/// `user`'s home as far as a plan can tell before any step runs: the base tree's account (its
/// /etc/passwd was checked when the tree was stored), else where `useradd -m` and the `USER`
/// step put one.
fn home_of(base: &StoredImage, user: &str) -> String {
    match koder_image::account_in_tree(&base.root, user) {
        Some(account) => account.home,
        None if user == "root" => "/root".into(),
        None => format!("/home/{user}"),
    }
}

fn root_run(ctx: &Context, shown: String, argv: Vec<String>) -> StepRun {
    StepRun {
        shown,
        argv,
        env: step_env(ctx),
        ..StepRun::default()
    }
}

fn step_env(ctx: &Context) -> Vec<(String, String)> {
    koder_image::template::step_env(
        ctx.env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        &ctx.workdir,
    )
}

/// A template's start and ready commands as the image's startup: a ready command alone gates
/// the hand-out on itself.
fn startup(req: &StartBuild) -> Result<Option<Startup>, HttpError> {
    let nonempty = |c: &Option<String>| c.clone().filter(|c| !c.trim().is_empty());
    let (start, ready) = (nonempty(&req.start_cmd), nonempty(&req.ready_cmd));
    if [&start, &ready]
        .iter()
        .any(|c| c.as_deref().is_some_and(|c| c.contains('\0')))
    {
        return Err(HttpError::bad_request("startCmd and readyCmd hold no NUL"));
    }
    Ok(match (start, ready) {
        (None, None) => None,
        (start, ready) => Some(Startup {
            start: start.unwrap_or_else(|| "true".into()),
            ready,
            ready_timeout_s: READY_TIMEOUT_S,
        }),
    })
}

/// `dir` against the working directory, `.` and `..` resolved (never above `/`).
fn absolute(dir: &str, workdir: &str) -> String {
    let joined = if dir.starts_with('/') {
        dir.to_string()
    } else {
        format!("{workdir}/{dir}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

fn is_env_name(k: &str) -> bool {
    !k.is_empty()
        && !k.starts_with(|c: char| c.is_ascii_digit())
        && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use koder_image::store::Manifest;

    fn base() -> StoredImage {
        StoredImage {
            manifest: Manifest {
                env: vec![("PATH".into(), "/usr/bin:/bin".into())],
                ..Manifest::new("bash", &"a".repeat(64), json!({"kind": "pack"}))
            },
            names: vec!["bash".into()],
            root: PathBuf::from("/nonexistent"),
        }
    }

    fn step(kind: &str, args: &[&str]) -> E2bStep {
        E2bStep {
            kind: kind.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            ..E2bStep::default()
        }
    }

    fn no_files(_: &str) -> Option<PathBuf> {
        None
    }

    #[test]
    fn without_a_workdir_steps_work_in_the_users_home() {
        let req = StartBuild {
            steps: vec![
                step("USER", &["guest"]),
                step("RUN", &["pwd"]),
                step("WORKDIR", &["app"]),
                step("USER", &["root"]),
                step("RUN", &["pwd"]),
            ],
            ..StartBuild::default()
        };
        let plan = plan(base(), &req, no_files).unwrap();
        let dir = |i: usize| {
            let run = plan.steps[i].run.as_ref().unwrap();
            run.env
                .iter()
                .find(|(k, _)| k == "KODER_WORKDIR")
                .map(|(_, v)| v.clone())
        };
        assert_eq!(dir(1).as_deref(), Some("/home/guest"));
        assert_eq!(
            dir(4).as_deref(),
            Some("/home/guest/app"),
            "a WORKDIR holds"
        );
        assert_eq!(plan.workdir, "/home/guest/app");
        assert_eq!(plan.recipe["workdir_set"], true);
        let unset = StartBuild {
            steps: vec![step("USER", &["root"])],
            ..StartBuild::default()
        };
        let plan = super::plan(base(), &unset, no_files).unwrap();
        assert_eq!(
            (plan.workdir.as_str(), &plan.recipe["workdir_set"]),
            ("/root", &json!(false))
        );
    }

    #[test]
    fn steps_run_in_order_with_the_context_so_far() {
        let req = StartBuild {
            steps: vec![
                step("RUN", &["echo one"]),
                step("ENV", &["A", "1", "B", "2"]),
                step("WORKDIR", &["app"]),
                step("USER", &["root"]),
                step("RUN", &["whoami", "user"]),
            ],
            start_cmd: Some("serve".into()),
            ready_cmd: Some("sleep 1".into()),
            ..StartBuild::default()
        };
        let plan = plan(base(), &req, no_files).unwrap();
        assert_eq!(plan.steps.len(), 5);
        let first = plan.steps[0].run.as_ref().unwrap();
        assert_eq!(first.user.as_deref(), Some("user"), "E2B's default user");
        assert!(first
            .env
            .contains(&("KODER_WORKDIR".into(), "/home/user".into())));
        assert_eq!(first.argv.last().unwrap(), "echo one");
        assert!(plan.steps[1].run.is_none(), "ENV only changes what follows");
        let workdir = plan.steps[2].run.as_ref().unwrap();
        assert_eq!(workdir.argv[4..], ["/home/user/app", "user"]);
        let last = plan.steps[4].run.as_ref().unwrap();
        assert_eq!(last.user.as_deref(), Some("user"), "a RUN's own user wins");
        assert!(last.env.contains(&("A".into(), "1".into())));
        assert!(last
            .env
            .contains(&("KODER_WORKDIR".into(), "/home/user/app".into())));
        assert_eq!(
            (plan.user.as_str(), plan.workdir.as_str()),
            ("root", "/home/user/app")
        );
        assert!(plan.env.contains(&("B".into(), "2".into())));
        assert_eq!(
            plan.startup.as_ref().unwrap().ready.as_deref(),
            Some("sleep 1")
        );

        let again = super::plan(base(), &req, no_files).unwrap();
        let keys = |p: &Plan| p.steps.iter().map(|s| s.key.clone()).collect::<Vec<_>>();
        assert_eq!(keys(&plan), keys(&again), "keys are stable");
        assert_eq!(plan.digest, again.digest);

        let mut changed = req;
        changed.steps[1].args[1] = "other".into();
        let changed_plan = super::plan(base(), &changed, no_files).unwrap();
        assert_eq!(changed_plan.steps[0].key, plan.steps[0].key);
        assert_ne!(
            changed_plan.steps[2].key, plan.steps[2].key,
            "env keys later steps"
        );

        changed.steps[2].force = true;
        let forced = super::plan(base(), &changed, no_files).unwrap();
        let forced_again = super::plan(base(), &changed, no_files).unwrap();
        assert_eq!(forced.steps[1].key, forced_again.steps[1].key);
        assert_ne!(forced.steps[2].key, forced_again.steps[2].key, "forced");
        assert_ne!(forced.steps[4].key, forced_again.steps[4].key, "and after");
    }

    #[test]
    fn copy_needs_its_upload_and_a_safe_source() {
        let copy = |src: &str| E2bStep {
            files_hash: Some("f".repeat(64)),
            ..step("COPY", &[src, "dest/", "", "0755"])
        };
        let req = |s: E2bStep| StartBuild {
            steps: vec![s],
            ..StartBuild::default()
        };
        let file = |_: &str| Some(PathBuf::from("/files/x"));
        let plan = plan(base(), &req(copy("folder/*")), file).unwrap();
        let run = plan.steps[0].run.as_ref().unwrap();
        assert_eq!(
            run.argv[4..],
            [COPY_ARCHIVE, "folder/*", "dest/", "user", "0755"]
        );
        assert_eq!(run.upload.as_ref().unwrap().from, PathBuf::from("/files/x"));
        assert!(run.user.is_none(), "COPY runs as root and chowns");
        assert!(super::plan(base(), &req(copy("folder")), no_files).is_err());
        for bad in ["/etc", "../x", "a/../../b"] {
            assert!(super::plan(base(), &req(copy(bad)), file).is_err(), "{bad}");
        }
        let mut bad_mode = copy("a");
        bad_mode.args[3] = "u+s".into();
        assert!(super::plan(base(), &req(bad_mode), file).is_err());
    }

    #[test]
    fn malformed_steps_are_refused() {
        for bad in [
            step("ENV", &["A"]),
            step("ENV", &["1A", "x"]),
            step("WORKDIR", &[]),
            step("RUN", &[]),
            step("RUN", &["x", "user", "extra"]),
            step("ADD", &["x", "y"]),
            step("RUN", &["a\0b"]),
        ] {
            let req = StartBuild {
                steps: vec![bad.clone()],
                ..StartBuild::default()
            };
            assert!(plan(base(), &req, no_files).is_err(), "{bad:?}");
        }
        assert_eq!(absolute("../x/./y", "/home/user"), "/home/x/y");
        assert_eq!(absolute("/../..", "/a"), "/");
    }
}
