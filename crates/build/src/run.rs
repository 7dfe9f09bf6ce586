//! Running a build: each uncached step in a fresh build sandbox on the base image with the
//! earlier steps' layers stacked on it (id-mapped, so the step owns what they made), what it
//! changed captured from the sandbox, kept as the step's layer and applied onto a hard-linked
//! copy of the parent's tree, stored under the step's key; then the image, named, once every
//! step passed.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use koder_api_types::{codes, BuildState, ErrorDetail};
use koder_image::plan::{Plan, PlanStep, StepRun};
use koder_image::store::{Manifest, Scratch, StoredImage, MANIFEST_VERSION, STEP_KIND};
use koder_image::template::BUILD_CA_FILE;
use koder_image::{ImageError, ImageStore};
use koder_sessions::{BuildSandbox, StepCommand};

use crate::{Builds, Job};

/// Longest a step may run.
const STEP_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Output of a step forwarded to the log, per stream.
const STEP_OUTPUT: u64 = 64 << 20;
/// Bounds on what one step may change.
const LAYER_BYTES: u64 = 16 << 30;
const LAYER_ENTRIES: u64 = 2_000_000;
/// The host's CA bundle: build steps' package clients trust what the host trusts.
const HOST_CA: &str = "/etc/ssl/certs/ca-certificates.crt";
/// Lines of a failed step's output in its error.
const FAILED_OUTPUT_LINES: usize = 20;
/// How often a running step's status (with the log's last lines) is recorded while its output
/// grows, so a daemon that dies mid-step leaves what the step printed.
const SAVE_EVERY: Duration = Duration::from_secs(1);

/// Why a build failed: the step (if one was running) and the error.
struct Failure {
    step: Option<usize>,
    code: &'static str,
    message: String,
}

fn failed(step: Option<usize>, why: impl std::fmt::Display) -> Failure {
    Failure {
        step,
        code: codes::IMAGE_BUILD_FAILED,
        message: why.to_string(),
    }
}

/// What a step's sandbox is made of: the build's base image, the earlier steps' layers, and
/// the tree they add up to (the step's parent).
#[derive(Clone, Copy)]
struct Base<'a> {
    image: &'a StoredImage,
    layers: &'a [std::path::PathBuf],
    tree: &'a StoredImage,
}

impl Builds {
    pub(crate) async fn run(
        self: Arc<Self>,
        job: Arc<Job>,
        store: ImageStore,
        plan: Plan,
        name: String,
        owner: String,
    ) {
        self.save(&job).await;
        let _turn = self.turns.wait(&owner).await;
        job.status.lock().state = BuildState::Running;
        self.save(&job).await;
        let result = self.steps(&job, &store, &plan, &name).await;
        let mut status = {
            let mut s = job.status.lock();
            s.finished_at = Some(Utc::now());
            match result {
                Ok(digest) => {
                    s.state = BuildState::Succeeded;
                    s.digest = Some(digest);
                }
                Err(f) => {
                    s.state = BuildState::Failed;
                    s.failed_step = f.step;
                    s.error = Some(ErrorDetail {
                        code: f.code.into(),
                        message: f.message,
                        details: None,
                    });
                }
            }
            s.clone()
        };
        match &status.error {
            Some(e) => job.log.line(format!("build failed: {}", e.message)),
            None => job.log.line(format!(
                "built {name} ({})",
                status.digest.as_deref().unwrap_or_default()
            )),
        }
        status.log_tail = job.log.tail();
        tracing::info!(build = %status.build_id, image = %name, state = ?status.state, "image build ended");
        job.log.finish(status);
        self.save(&job).await;
        if let Err(e) = self.records.prune_builds(crate::KEPT as u64).await {
            tracing::warn!(error = %e, "forgetting old builds");
        }
    }

    async fn steps(
        &self,
        job: &Job,
        store: &ImageStore,
        plan: &Plan,
        name: &str,
    ) -> Result<String, Failure> {
        let total = plan.steps.len();
        let base = &plan.base;
        let mut parent = base.clone();
        // The steps so far, as layers the next step's sandbox stacks on the base.
        let mut layers = Vec::new();
        for (i, step) in plan.steps.iter().enumerate() {
            let head = format!("step {}/{total}: {}", i + 1, step.describe);
            let Some(run) = &step.run else {
                job.log.line(head);
                self.mark(job, i, "built").await;
                continue;
            };
            if let Some(cached) = store.by_digest(&step.key).map_err(|e| failed(Some(i), e))? {
                if let Err(e) = store.mark_used(&cached) {
                    tracing::warn!(step = %step.key, error = %e, "marking a cached step used");
                }
                job.log.line(format!("{head}: cached"));
                self.mark(job, i, "cached").await;
                layers.push(cached.step_layer());
                parent = cached;
                continue;
            }
            // Running before its heading is in the log: whoever reads the heading sees the step
            // running, in memory and in the saved record alike.
            job.set_step(i, "running");
            job.log.line(head);
            self.save(job).await;
            let on = Base {
                image: base,
                layers: &layers,
                tree: &parent,
            };
            match self.step(job, store, on, step, run, i).await {
                Ok(image) => {
                    self.mark(job, i, "built").await;
                    layers.push(image.step_layer());
                    parent = image;
                }
                Err(f) => {
                    self.mark(job, i, "failed").await;
                    return Err(f);
                }
            }
        }
        if koder_image::account_in_tree(&parent.root, &plan.user).is_none() {
            return Err(Failure {
                step: None,
                code: codes::IMAGE_BUILD_FAILED,
                message: format!(
                    "the image's user {:?} is no account of it: add it in a step (`useradd -m {0}`)",
                    plan.user
                ),
            });
        }
        let image = match store.by_digest(&plan.digest).map_err(|e| failed(None, e))? {
            Some(found) => found,
            None => {
                let manifest = Manifest {
                    manifest_version: MANIFEST_VERSION,
                    name: name.into(),
                    digest: plan.digest.clone(),
                    recipe: plan.recipe.clone(),
                    languages: base.manifest.languages.clone(),
                    env: plan.env.clone(),
                    workdir: plan.workdir.clone(),
                    user: plan.user.clone(),
                    created_at: Utc::now(),
                    size_bytes: parent.manifest.size_bytes,
                    build_log: job.log.tail(),
                    startup: plan.startup.clone(),
                };
                let log = job.log.text();
                let parent = parent.clone();
                let store = store.clone();
                blocking(move || {
                    let staging = store.staging(&manifest.digest)?;
                    staging.link_root_from(&parent)?;
                    std::fs::write(staging.log_path(), log)
                        .map_err(ImageError::io("write the build log"))?;
                    staging.commit(&manifest)
                })
                .await
                .map_err(|e| failed(None, e))?
            }
        };
        store
            .set_name(name, &image.manifest.digest)
            .map_err(|e| failed(None, e))?;
        self.manager
            .publish_image(name)
            .await
            .map_err(|e| failed(None, format!("sharing the image with the cluster: {e}")))?;
        Ok(plan.digest.clone())
    }

    /// Runs one step in a build sandbox on `on` and stores its result under its key: its
    /// layer, and the parent's tree with it applied.
    async fn step(
        &self,
        job: &Job,
        store: &ImageStore,
        on: Base<'_>,
        step: &PlanStep,
        run: &StepRun,
        index: usize,
    ) -> Result<StoredImage, Failure> {
        let parent = on.tree;
        let label = format!("{}-step{}", job.status.lock().build_id, index + 1);
        let sandbox = self
            .manager
            .build_sandbox(&on.image.manifest.digest, on.layers.to_vec(), &label)
            .await
            .map_err(|e| {
                failed(
                    Some(index),
                    format!("step {}: build sandbox: {e}", index + 1),
                )
            })?;
        let layer = store.scratch("build-layer");
        let ran = self
            .saving(job, in_sandbox(job, &sandbox, step, run, index, &layer))
            .await;
        sandbox.destroy().await;
        ran?;
        let manifest = Manifest {
            manifest_version: MANIFEST_VERSION,
            name: job.status.lock().name.clone(),
            digest: step.key.clone(),
            recipe: serde_json::json!({
                "kind": STEP_KIND,
                "parent": parent.manifest.digest,
                "step": step.recipe,
            }),
            startup: None,
            created_at: Utc::now(),
            size_bytes: 0,
            build_log: String::new(),
            ..parent.manifest.clone()
        };
        let parent = parent.clone();
        let store = store.clone();
        blocking(move || {
            let staging = store.staging(&manifest.digest)?;
            staging.link_root_from(&parent)?;
            apply_layer(&staging.rootfs(), &layer)?;
            let size_bytes = staging.finish_tree()?;
            std::fs::rename(layer.path(), staging.step_layer_path())
                .map_err(ImageError::io("keep the step's layer"))?;
            staging.commit(&Manifest {
                size_bytes,
                ..manifest
            })
        })
        .await
        .map_err(|e| {
            failed(
                Some(index),
                format!("step {}: storing its result: {e}", index + 1),
            )
        })
    }

    /// Awaits `work`, recording the job's status every [`SAVE_EVERY`] in which its log grew.
    async fn saving<T>(&self, job: &Job, work: impl std::future::Future<Output = T>) -> T {
        let mut work = std::pin::pin!(work);
        let mut saved = job.log.written();
        let start = tokio::time::Instant::now() + SAVE_EVERY;
        let mut tick = tokio::time::interval_at(start, SAVE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                out = &mut work => return out,
                _ = tick.tick() => {
                    let written = job.log.written();
                    if written != saved {
                        saved = written;
                        self.save(job).await;
                    }
                }
            }
        }
    }
}

/// The step's command (as its user, its upload written first), its output into the log,
/// then the sandbox's writable layer into `layer`.
async fn in_sandbox(
    job: &Job,
    sandbox: &BuildSandbox,
    step: &PlanStep,
    run: &StepRun,
    index: usize,
    layer: &Scratch,
) -> Result<(), Failure> {
    let fail = |e: &dyn std::fmt::Display| failed(Some(index), format!("step {}: {e}", index + 1));
    let ca = tokio::fs::read(HOST_CA).await.unwrap_or_default();
    sandbox
        .write(BUILD_CA_FILE, 0o644, &mut ca.as_slice())
        .await
        .map_err(|e| fail(&e))?;
    if let Some(upload) = &run.upload {
        let mut file = tokio::fs::File::open(&upload.from)
            .await
            .map_err(|e| fail(&e))?;
        sandbox
            .write(&upload.to, 0o600, &mut file)
            .await
            .map_err(|e| fail(&e))?;
    }
    let mut output = Vec::new();
    let exit = sandbox
        .exec_logged(
            StepCommand {
                argv: run.argv.clone(),
                env: run.env.clone(),
                stdin: run.stdin.clone(),
                cwd: run.cwd.clone(),
                user: run.user.clone(),
                timeout: STEP_TIMEOUT,
                output_limit: STEP_OUTPUT,
            },
            |d| {
                job.log.output(d);
                output.extend_from_slice(d);
                let keep = output.len().saturating_sub(64 * 1024);
                output.drain(..keep);
            },
        )
        .await
        .map_err(|e| match e {
            koder_sessions::Error::UnknownAccount(user) => Failure {
                step: Some(index),
                code: codes::IMAGE_BUILD_STEP_FAILED,
                message: format!(
                    "step {}: failed to run command '{}': command failed: unauthenticated: invalid username: '{user}'",
                    index + 1,
                    run.shown
                ),
            },
            e => fail(&e),
        })?;
    if exit.exit_code != Some(0) {
        let text = String::from_utf8_lossy(&output);
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(FAILED_OUTPUT_LINES)..].join("\n");
        let how = match (exit.exit_code, exit.signal) {
            _ if exit.timed_out => format!("timed out after {}s", STEP_TIMEOUT.as_secs()),
            (Some(code), _) => format!("exited with {code}"),
            (None, Some(sig)) => format!("was killed by signal {sig}"),
            _ => "ended without an exit status".into(),
        };
        return Err(Failure {
            step: Some(index),
            code: codes::IMAGE_BUILD_STEP_FAILED,
            message: format!("step {} ({}) {how}:\n{tail}", index + 1, step.describe),
        });
    }
    sandbox
        .capture(layer.path(), LAYER_BYTES, LAYER_ENTRIES)
        .await
        .map_err(|e| fail(&e))
}

/// Applies a captured layer onto a tree (a staging copy, the daemon's alone): an entry
/// replaces what is there (never written into: the tree's files are links to the parent's).
fn apply_layer(root: &std::path::Path, layer: &Scratch) -> Result<(), ImageError> {
    let dir = std::fs::File::open(root).map_err(ImageError::io("open the staging tree"))?;
    let file = std::fs::File::open(layer.path()).map_err(ImageError::io("open the layer"))?;
    let opts = koder_layer::ApplyOptions {
        limits: koder_layer::Limits {
            max_bytes: LAYER_BYTES,
            max_entries: LAYER_ENTRIES,
        },
        // The sandbox's own ids, as the step left them: the finished tree keeps them (its
        // sessions mount it id-mapped); `finish_tree` clears setuid bits.
        owners: koder_layer::Owners::AsIs,
    };
    koder_layer::apply(
        std::os::fd::AsFd::as_fd(&dir),
        std::io::BufReader::with_capacity(256 * 1024, file),
        &opts,
    )
    .map(drop)
    .map_err(|e| ImageError::Build(format!("applying the step's layer: {e}")))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ImageError> + Send + 'static,
) -> Result<T, ImageError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ImageError::Build(format!("build task: {e}")))?
}
