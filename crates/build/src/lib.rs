//! Image builds from template specs (`koder_image::template`): each step runs as root inside
//! a jail made by the session manager (the same isolation as sessions, never on the host) on
//! the base image with the earlier steps' layers stacked on it, id-mapped as a restored
//! snapshot's so the step owns what they made (image files belong to host root and could not
//! be changed), with network `open` plus the build-only exemptions of `[images]
//! build_internal`. What a step changed (its sandbox's writable layer, captured by the agent)
//! is kept as the step's layer and applied onto a hard-linked copy of the parent's tree,
//! stored as an unlisted image under the step's key, so a later build reruns only the steps
//! from the first changed one. The image
//! itself (manifest with env, workdir, user, start/ready commands, build log) is stored and
//! named only once every step passed: a failed build leaves no image.
//!
//! In phases: this registry (submit, status, follow; one build runs at a time, the rest
//! queue) → `run` (the steps) → `log` (lines kept and streamed).

mod log;
mod run;

use std::collections::HashMap;
use std::sync::Arc;

use chrono::Utc;
use koder_api_types::{Build, BuildState, BuildStep, ErrorCode};
use koder_image::plan::Plan;
use koder_image::template::Spec;
use koder_image::{ImageStore, StoredImage};
use koder_sessions::Manager;
use parking_lot::Mutex;

pub use log::{Follow, LogEvent};

use log::BuildLog;

/// Finished builds kept for their status and logs (the oldest forgotten first).
const KEPT: usize = 100;

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{0}")]
    InvalidSpec(String),
    #[error("no image build {0:?}")]
    NotFound(String),
    #[error("{0}")]
    ImageNotFound(String),
    #[error("this server has no image store")]
    NoStore,
}

impl BuildError {
    pub fn code(&self) -> ErrorCode {
        match self {
            BuildError::InvalidSpec(_) => ErrorCode::ImageBuildInvalidSpec,
            BuildError::NotFound(_) => ErrorCode::ImageBuildNotFound,
            BuildError::ImageNotFound(_) => ErrorCode::ImageNotFound,
            BuildError::NoStore => ErrorCode::NotImplemented,
        }
    }
}

/// Every build of this daemon's life (kept in memory: a finished image keeps its own log).
pub struct Builds {
    manager: Arc<Manager>,
    store: Option<ImageStore>,
    builds: Mutex<HashMap<String, Arc<Job>>>,
    queue: tokio::sync::Semaphore,
}

struct Job {
    status: Mutex<Build>,
    log: BuildLog,
}

impl Job {
    fn snapshot(&self) -> Build {
        let mut b = self.status.lock().clone();
        b.log_tail = self.log.tail();
        b
    }

    fn set_step(&self, index: usize, status: &str) {
        if let Some(step) = self.status.lock().steps.get_mut(index) {
            step.status = status.into();
        }
    }
}

impl Builds {
    pub fn new(manager: Arc<Manager>) -> Arc<Self> {
        Arc::new(Self {
            store: manager.image_store().cloned(),
            manager,
            builds: Mutex::default(),
            queue: tokio::sync::Semaphore::new(1),
        })
    }

    /// Parses a spec: TOML, or JSON when `json`.
    pub fn parse(text: &str, json: bool) -> Result<Spec, BuildError> {
        let spec = if json {
            serde_json::from_str::<serde_json::Value>(text)
                .map_err(|e| BuildError::InvalidSpec(format!("template spec: {e}")))
                .and_then(|v| {
                    // Through TOML, so both forms pass the same checks.
                    toml_text(&v).ok_or_else(|| {
                        BuildError::InvalidSpec("template spec: not a JSON object".into())
                    })
                })
                .and_then(|t| Spec::parse(&t).map_err(|e| BuildError::InvalidSpec(e.to_string())))?
        } else {
            Spec::parse(text).map_err(|e| BuildError::InvalidSpec(e.to_string()))?
        };
        Ok(spec)
    }

    /// Queues a build of `spec` into the image `name`; answers at once.
    pub fn submit(self: &Arc<Self>, spec: Spec, name: &str) -> Result<Build, BuildError> {
        let base = self.base(&spec.base)?;
        self.submit_plan(spec.plan(base), name)
    }

    /// The image `reference` names in this server's store, as a build's base.
    pub fn base(&self, reference: &str) -> Result<StoredImage, BuildError> {
        let store = self.store.as_ref().ok_or(BuildError::NoStore)?;
        store
            .get(reference)
            .map_err(|e| BuildError::ImageNotFound(format!("base {reference:?}: {e}")))
    }

    /// Queues the build `plan` into the image `name`; answers at once.
    pub fn submit_plan(self: &Arc<Self>, plan: Plan, name: &str) -> Result<Build, BuildError> {
        let store = self.store.clone().ok_or(BuildError::NoStore)?;
        koder_image::store::check_name(name)
            .map_err(|e| BuildError::InvalidSpec(format!("name: {e}")))?;
        let id = format!("bld-{}", uuid::Uuid::new_v4().simple());
        let status = Build {
            build_id: id.clone(),
            name: name.into(),
            state: BuildState::Queued,
            steps: plan
                .steps
                .iter()
                .map(|step| BuildStep {
                    step: step.describe.clone(),
                    key: step.key.clone(),
                    status: "pending".into(),
                })
                .collect(),
            failed_step: None,
            error: None,
            digest: None,
            log_tail: String::new(),
            created_at: Utc::now(),
            finished_at: None,
        };
        let job = Arc::new(Job {
            status: Mutex::new(status),
            log: BuildLog::new(),
        });
        self.remember(&id, job.clone());
        let me = self.clone();
        let name = name.to_string();
        tokio::spawn(async move { me.run(job, store, plan, name).await });
        self.get(&id)
    }

    /// The whole log of a build so far (a finished image keeps its own as `build.log`).
    pub fn log_lines(&self, id: &str) -> Result<Vec<String>, BuildError> {
        Ok(self.job(id)?.log.follow().replay)
    }

    fn remember(&self, id: &str, job: Arc<Job>) {
        let mut builds = self.builds.lock();
        if builds.len() >= KEPT {
            let oldest = builds
                .iter()
                .filter(|(_, j)| j.status.lock().finished_at.is_some())
                .min_by_key(|(_, j)| j.status.lock().created_at)
                .map(|(id, _)| id.clone());
            if let Some(oldest) = oldest {
                builds.remove(&oldest);
            }
        }
        builds.insert(id.into(), job);
    }

    fn job(&self, id: &str) -> Result<Arc<Job>, BuildError> {
        self.builds
            .lock()
            .get(id)
            .cloned()
            .ok_or_else(|| BuildError::NotFound(id.into()))
    }

    pub fn get(&self, id: &str) -> Result<Build, BuildError> {
        Ok(self.job(id)?.snapshot())
    }

    /// The build's log so far and, while it runs, its new lines and final status.
    pub fn follow(&self, id: &str) -> Result<Follow, BuildError> {
        Ok(self.job(id)?.log.follow())
    }
}

/// A JSON spec as TOML text (TOML has no null: a null field is left out).
fn toml_text(v: &serde_json::Value) -> Option<String> {
    let mut v = v.clone();
    let object = v.as_object_mut()?;
    object.retain(|_, value| !value.is_null());
    let value: toml::Value = serde_json::from_value(v).ok()?;
    toml::to_string(&value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_toml_specs_pass_the_same_checks() {
        let toml = Builds::parse("base = \"python\"\npip = [\"six\"]\n", false).unwrap();
        let json =
            Builds::parse(r#"{"base": "python", "pip": ["six"], "user": null}"#, true).unwrap();
        assert_eq!(toml, json);
        for bad in [r#"{"base": "python", "pip": ["--evil"]}"#, "[1]", "{"] {
            assert!(matches!(
                Builds::parse(bad, true),
                Err(BuildError::InvalidSpec(_))
            ));
        }
    }
}
