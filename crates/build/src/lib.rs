//! Image builds from template specs (`koder_image::template`): each step runs as root inside
//! a jail made by the session manager (the same isolation as sessions, never on the host) on
//! the base image with the earlier steps' layers stacked on it, id-mapped as a restored
//! snapshot's so the step owns what they made, with network `open` plus the build-only exemptions of `[images]
//! build_internal`. What a step changed (its sandbox's writable layer, captured by the agent)
//! is kept as the step's layer and applied onto a hard-linked copy of the parent's tree,
//! stored as an unlisted image under the step's key, so a later build reruns only the steps
//! from the first changed one. The image
//! itself (manifest with env, workdir, user, start/ready commands, build log) is stored and
//! named only once every step passed: a failed build leaves no image.
//!
//! In phases: this registry (submit, status, follow; one build runs at a time, the rest
//! queue, their owners taking turns: `turns`) → `run` (the steps) → `log` (lines kept and
//! streamed).

mod log;
mod run;
mod turns;

use std::collections::HashMap;
use std::sync::Arc;

use chrono::Utc;
use koder_api_types::{Build, BuildState, BuildStep, ErrorCode};
use koder_image::plan::Plan;
use koder_image::template::Spec;
use koder_image::{ImageStore, StoredImage};
use koder_sessions::Manager;
use koder_store::{BuildRecord, Store};
use parking_lot::Mutex;

pub use log::{Follow, LogEvent};

use log::BuildLog;

/// Finished builds kept for their status and logs, in memory and in the store (the oldest
/// forgotten first).
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
    #[error("reading the build's record: {0}")]
    Store(String),
}

impl BuildError {
    pub fn code(&self) -> ErrorCode {
        match self {
            BuildError::InvalidSpec(_) => ErrorCode::ImageBuildInvalidSpec,
            BuildError::NotFound(_) => ErrorCode::ImageBuildNotFound,
            BuildError::ImageNotFound(_) => ErrorCode::ImageNotFound,
            BuildError::NoStore => ErrorCode::NotImplemented,
            BuildError::Store(_) => ErrorCode::Internal,
        }
    }
}

/// The builds of this daemon's life in memory (a running one's log is followed here), and
/// every build's status and final log in the store, so they outlive the daemon.
pub struct Builds {
    manager: Arc<Manager>,
    store: Option<ImageStore>,
    builds: Mutex<HashMap<String, Arc<Job>>>,
    /// One build runs at a time; owners take turns.
    turns: Arc<turns::Turns>,
    records: Store,
    node: Option<String>,
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

    fn ended(&self) -> bool {
        matches!(
            self.status.lock().state,
            BuildState::Succeeded | BuildState::Failed
        )
    }
}

impl Builds {
    /// The builds of `manager`'s node, recorded in `records`. Builds of this node that a
    /// stopped daemon left queued or running are ended as failed: their sandboxes are gone.
    pub async fn start(manager: Arc<Manager>, records: Store) -> Arc<Self> {
        let me = Arc::new(Self {
            store: manager.image_store().cloned(),
            node: manager.node_id().map(str::to_owned),
            manager,
            builds: Mutex::default(),
            turns: Arc::default(),
            records,
        });
        me.end_interrupted().await;
        me
    }

    async fn end_interrupted(&self) {
        let left = match self.records.unfinished_builds(self.node.as_deref()).await {
            Ok(left) => left,
            Err(e) => {
                tracing::warn!(error = %e, "reading the builds a stopped daemon left");
                return;
            }
        };
        for mut b in left {
            let why = "the daemon stopped during the build; submit it again";
            interrupted(&mut b, why, Utc::now());
            // Only a running build's last lines were recorded: they are its log now.
            let last = format!("build failed: {why}");
            b.log_tail = b
                .log_tail
                .lines()
                .chain([last.as_str()])
                .collect::<Vec<_>>()
                .join("\n");
            let log = format!("{}\n", b.log_tail);
            tracing::info!(build = %b.build_id, "ending a build a stopped daemon left");
            if let Err(e) = self
                .records
                .put_build(self.node.as_deref(), &b, Some(&log))
                .await
            {
                tracing::warn!(build = %b.build_id, error = %e, "recording an interrupted build");
            }
        }
    }

    /// Records the job's status as it is now (with its whole log once it ended).
    async fn save(&self, job: &Job) {
        let status = job.snapshot();
        let log = job.ended().then(|| job.log.text());
        let saved = self
            .records
            .put_build(self.node.as_deref(), &status, log.as_deref())
            .await;
        if let Err(e) = saved {
            tracing::warn!(build = %status.build_id, error = %e, "recording a build");
        }
    }

    /// Marks step `index` with `status`, recorded at once.
    async fn mark(&self, job: &Job, index: usize, status: &str) {
        job.set_step(index, status);
        self.save(job).await;
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

    /// Queues a build of `spec` into the image `name` for `owner` (whose queue it joins: see
    /// `turns`); answers at once.
    pub fn submit(
        self: &Arc<Self>,
        spec: Spec,
        name: &str,
        owner: &str,
    ) -> Result<Build, BuildError> {
        let base = self.base(&spec.base)?;
        self.submit_plan(spec.plan(base), name, owner)
    }

    /// The image `reference` names in this server's store, as a build's base.
    pub fn base(&self, reference: &str) -> Result<StoredImage, BuildError> {
        let store = self.store.as_ref().ok_or(BuildError::NoStore)?;
        store
            .get(reference)
            .map_err(|e| BuildError::ImageNotFound(format!("base {reference:?}: {e}")))
    }

    /// Queues the build `plan` into the image `name` for `owner`; answers at once.
    pub fn submit_plan(
        self: &Arc<Self>,
        plan: Plan,
        name: &str,
        owner: &str,
    ) -> Result<Build, BuildError> {
        let store = self.store.clone().ok_or(BuildError::NoStore)?;
        koder_image::store::check_name(name)
            .map_err(|e| BuildError::InvalidSpec(format!("name: {e}")))?;
        let id = format!("bld-{}", uuid::Uuid::new_v4().simple());
        let steps = plan
            .steps
            .iter()
            .map(|step| (step.describe.clone(), step.key.clone()));
        let status = queued(&id, name, steps);
        let job = Arc::new(Job {
            status: Mutex::new(status),
            log: BuildLog::new(),
        });
        let queued = job.snapshot();
        self.remember(&id, job.clone());
        let me = self.clone();
        let (name, owner) = (name.to_string(), owner.to_string());
        tokio::spawn(async move { me.run(job, store, plan, name, owner).await });
        Ok(queued)
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

    fn job(&self, id: &str) -> Option<Arc<Job>> {
        self.builds.lock().get(id).cloned()
    }

    /// A build this daemon no longer holds (an earlier daemon's, or another node's), as
    /// recorded.
    async fn recorded(&self, id: &str) -> Result<BuildRecord, BuildError> {
        match self.records.get_build(id).await {
            Ok(Some(record)) => Ok(record),
            Ok(None) => Err(BuildError::NotFound(id.into())),
            Err(e) => Err(BuildError::Store(e.to_string())),
        }
    }

    pub async fn get(&self, id: &str) -> Result<Build, BuildError> {
        match self.job(id) {
            Some(job) => Ok(job.snapshot()),
            None => Ok(self.recorded(id).await?.status),
        }
    }

    /// The build's log so far and, while it runs here, its new lines and final status.
    pub async fn follow(&self, id: &str) -> Result<Follow, BuildError> {
        if let Some(job) = self.job(id) {
            return Ok(job.log.follow());
        }
        let record = self.recorded(id).await?;
        let ended = record.log.is_some();
        Ok(Follow {
            replay: record.log.as_deref().map(log::lines).unwrap_or_default(),
            live: None,
            done: ended.then(|| Box::new(record.status)),
        })
    }

    /// The whole log of a build so far (a finished image keeps its own as `build.log`).
    pub async fn log_lines(&self, id: &str) -> Result<Vec<String>, BuildError> {
        Ok(self.follow(id).await?.replay)
    }
}

/// A new build's status: queued, every step `(description, key)` pending.
fn queued(id: &str, name: &str, steps: impl Iterator<Item = (String, String)>) -> Build {
    Build {
        build_id: id.into(),
        name: name.into(),
        state: BuildState::Queued,
        steps: steps
            .map(|(step, key)| BuildStep {
                step,
                key,
                status: "pending".into(),
            })
            .collect(),
        failed_step: None,
        error: None,
        digest: None,
        log_tail: String::new(),
        created_at: Utc::now(),
        finished_at: None,
    }
}

/// Ends a build that can no longer run: failed at its running step, if any.
fn interrupted(b: &mut Build, why: &str, now: chrono::DateTime<Utc>) {
    let running = b.steps.iter().position(|s| s.status == "running");
    if let Some(i) = running {
        b.steps[i].status = "failed".into();
    }
    b.state = BuildState::Failed;
    b.failed_step = running;
    b.finished_at = Some(now);
    b.error = Some(koder_api_types::ErrorDetail {
        code: koder_api_types::codes::IMAGE_BUILD_FAILED.into(),
        message: why.into(),
        details: None,
    });
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
    fn an_interrupted_build_fails_at_its_running_step() {
        let step = |status: &str| BuildStep {
            step: "RUN x".into(),
            key: "k".into(),
            status: status.into(),
        };
        let mut b = queued("bld-1", "img", std::iter::empty());
        b.state = BuildState::Running;
        b.steps = vec![step("cached"), step("running"), step("pending")];
        let now = Utc::now();
        interrupted(&mut b, "gone", now);
        assert_eq!(b.state, BuildState::Failed);
        assert_eq!(b.failed_step, Some(1));
        let statuses: Vec<&str> = b.steps.iter().map(|s| s.status.as_str()).collect();
        assert_eq!(statuses, ["cached", "failed", "pending"]);
        assert_eq!(b.finished_at, Some(now));
        let error = b.error.clone().unwrap();
        assert_eq!(error.code, koder_api_types::codes::IMAGE_BUILD_FAILED);
        assert_eq!(error.message, "gone");
        // Still queued: no step ran, none failed.
        b.steps = vec![step("pending")];
        interrupted(&mut b, "gone", now);
        assert_eq!(b.failed_step, None);
    }

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
