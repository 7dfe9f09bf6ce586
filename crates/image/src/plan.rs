//! Build plans: what `koder-build` runs, made from a template spec ([`crate::template`]) or
//! from another front end's steps (E2B's template builds): the base image, the steps in order,
//! each with its cache key (chained from its parent's) and what runs for it, and the finished
//! image's settings. The builder knows nothing of where a plan came from.

use std::path::PathBuf;

use crate::store::{Startup, StoredImage};
use crate::template::Spec;

#[derive(Debug, Clone)]
pub struct Plan {
    pub base: StoredImage,
    pub steps: Vec<PlanStep>,
    /// The finished image's environment, working directory, user and startup.
    pub env: Vec<(String, String)>,
    pub workdir: String,
    pub user: String,
    pub startup: Option<Startup>,
    /// The build's inputs, recorded in the image's manifest.
    pub recipe: serde_json::Value,
    /// The finished image's digest.
    pub digest: String,
}

#[derive(Debug, Clone)]
pub struct PlanStep {
    /// What the step is, for the log and the build's status.
    pub describe: String,
    /// Its cache key: what it made is stored under it.
    pub key: String,
    /// The step as recorded in its cached image's recipe.
    pub recipe: serde_json::Value,
    /// What runs; none for a step that only changes what later steps run with (E2B's `ENV`).
    pub run: Option<StepRun>,
}

/// A step's command, run in a build sandbox.
#[derive(Debug, Clone, Default)]
pub struct StepRun {
    /// The command as its author wrote it, for errors.
    pub shown: String,
    pub argv: Vec<String>,
    pub stdin: Vec<u8>,
    pub env: Vec<(String, String)>,
    /// Default: the agent's (the command changes directory itself).
    pub cwd: Option<String>,
    /// The account it runs as, resolved inside the sandbox (default root).
    pub user: Option<String>,
    /// A host file written into the sandbox before the command runs.
    pub upload: Option<Upload>,
}

#[derive(Debug, Clone)]
pub struct Upload {
    pub from: PathBuf,
    /// Absolute path in the build sandbox (below /tmp, which no image keeps).
    pub to: String,
}

impl Spec {
    /// The spec's build on `base`, every step a shell command run as root.
    pub fn plan(&self, base: StoredImage) -> Plan {
        let keys = self.step_keys(&base.manifest.digest);
        let steps = self
            .steps()
            .into_iter()
            .zip(&keys)
            .map(|(step, key)| {
                let (argv, stdin) = step.command();
                PlanStep {
                    describe: step.describe(),
                    key: key.clone(),
                    recipe: serde_json::to_value(&step).unwrap_or_default(),
                    run: Some(StepRun {
                        shown: step.describe(),
                        argv,
                        stdin,
                        env: self.step_env(&base.manifest.env),
                        ..StepRun::default()
                    }),
                }
            })
            .collect();
        let last = keys.last().unwrap_or(&base.manifest.digest);
        Plan {
            digest: self.image_digest(last),
            recipe: serde_json::json!({
                "kind": "template",
                "base": base.manifest.digest,
                "steps": keys,
                "spec": self,
            }),
            env: self.image_env(&base.manifest.env),
            workdir: self.workdir().into(),
            user: self
                .user
                .clone()
                .unwrap_or_else(|| base.manifest.user.clone()),
            startup: self.startup(),
            steps,
            base,
        }
    }
}
