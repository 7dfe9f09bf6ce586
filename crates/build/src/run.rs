//! Running a build: each uncached step in a fresh build sandbox on the base image with the
//! earlier steps' layers stacked on it (id-mapped, so the step owns what they made), what it
//! changed captured from the sandbox, kept as the step's layer and applied onto a hard-linked
//! copy of the parent's tree, stored under the step's key; then the image, named, once every
//! step passed.

use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use koder_agent_protocol::{ExecRequest, FromAgent, WriteFileRequest};
use koder_api_types::{codes, BuildState, ErrorDetail};
use koder_image::store::{Manifest, Scratch, StoredImage, MANIFEST_VERSION, STEP_KIND};
use koder_image::template::{Spec, Step, BUILD_CA_FILE};
use koder_image::{ImageError, ImageStore};
use koder_runtime::Sandbox;

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
        base: StoredImage,
        spec: Spec,
        name: String,
    ) {
        let _turn = self.queue.acquire().await;
        job.status.lock().state = BuildState::Running;
        let result = self.steps(&job, &store, base, &spec, &name).await;
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
    }

    async fn steps(
        &self,
        job: &Job,
        store: &ImageStore,
        base: StoredImage,
        spec: &Spec,
        name: &str,
    ) -> Result<String, Failure> {
        let steps = spec.steps();
        let keys = spec.step_keys(&base.manifest.digest);
        let total = steps.len();
        let mut parent = base.clone();
        // The steps so far, as layers the next step's sandbox stacks on the base.
        let mut layers = Vec::new();
        for (i, (step, key)) in steps.iter().zip(&keys).enumerate() {
            let head = format!("step {}/{total}: {}", i + 1, step.describe());
            if let Some(cached) = store.by_digest(key).map_err(|e| failed(Some(i), e))? {
                job.log.line(format!("{head}: cached"));
                job.set_step(i, "cached");
                layers.push(cached.step_layer());
                parent = cached;
                continue;
            }
            job.log.line(head);
            job.set_step(i, "running");
            let on = Base {
                image: &base,
                layers: &layers,
                tree: &parent,
            };
            match self.step(job, store, on, spec, step, key, i).await {
                Ok(image) => {
                    job.set_step(i, "built");
                    layers.push(image.step_layer());
                    parent = image;
                }
                Err(f) => {
                    job.set_step(i, "failed");
                    return Err(f);
                }
            }
        }
        let digest = spec.image_digest(&parent.manifest.digest);
        let image = match store.by_digest(&digest).map_err(|e| failed(None, e))? {
            Some(found) => found,
            None => {
                let manifest = Manifest {
                    manifest_version: MANIFEST_VERSION,
                    name: name.into(),
                    digest: digest.clone(),
                    recipe: serde_json::json!({
                        "kind": "template",
                        "base": base.manifest.digest,
                        "steps": keys,
                        "spec": spec,
                    }),
                    languages: base.manifest.languages.clone(),
                    env: spec.image_env(&base.manifest.env),
                    workdir: spec.workdir().into(),
                    user: spec
                        .user
                        .clone()
                        .unwrap_or_else(|| base.manifest.user.clone()),
                    created_at: Utc::now(),
                    size_bytes: parent.manifest.size_bytes,
                    build_log: job.log.tail(),
                    startup: spec.startup(),
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
        Ok(digest)
    }

    /// Runs one step in a build sandbox on `on` and stores its result under `key`: its layer,
    /// and the parent's tree with it applied.
    #[allow(clippy::too_many_arguments)]
    async fn step(
        &self,
        job: &Job,
        store: &ImageStore,
        on: Base<'_>,
        spec: &Spec,
        step: &Step,
        key: &str,
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
            .in_sandbox(job, &*sandbox, parent, spec, step, index, &layer)
            .await;
        if let Err(e) = sandbox.destroy().await {
            tracing::warn!(error = %e, "destroying a build sandbox");
        }
        ran?;
        let manifest = Manifest {
            manifest_version: MANIFEST_VERSION,
            name: job.status.lock().name.clone(),
            digest: key.into(),
            recipe: serde_json::json!({
                "kind": STEP_KIND,
                "parent": parent.manifest.digest,
                "step": step,
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

    /// The step's command, its output into the log, then the sandbox's writable layer into
    /// `layer`.
    #[allow(clippy::too_many_arguments)]
    async fn in_sandbox(
        &self,
        job: &Job,
        sandbox: &dyn Sandbox,
        parent: &StoredImage,
        spec: &Spec,
        step: &Step,
        index: usize,
        layer: &Scratch,
    ) -> Result<(), Failure> {
        let fail =
            |e: &dyn std::fmt::Display| failed(Some(index), format!("step {}: {e}", index + 1));
        let agent = sandbox.agent();
        let ca = tokio::fs::read(HOST_CA).await.unwrap_or_default();
        let mut writer = agent
            .write_file(WriteFileRequest {
                path: BUILD_CA_FILE.into(),
                mode: Some(0o644),
                create_parents: true,
                max_bytes: None,
                owner: None,
                metadata: Vec::new(),
            })
            .await
            .map_err(|e| fail(&e))?;
        writer.write(&ca).await.map_err(|e| fail(&e))?;
        writer.finish().await.map_err(|e| fail(&e))?;

        let (argv, stdin) = step.command();
        let mut stream = agent
            .exec(ExecRequest {
                argv,
                env: spec.step_env(&parent.manifest.env),
                stdin,
                timeout_ms: Some(STEP_TIMEOUT.as_millis() as u64),
                output_limit_bytes: STEP_OUTPUT,
                ..ExecRequest::default()
            })
            .await
            .map_err(|e| fail(&e))?;
        let mut output = Vec::new();
        let exit = loop {
            match stream.recv().await.map_err(|e| fail(&e))? {
                FromAgent::Stdout(d) | FromAgent::Stderr(d) => {
                    job.log.output(&d);
                    output.extend_from_slice(&d);
                    let keep = output.len().saturating_sub(64 * 1024);
                    output.drain(..keep);
                }
                FromAgent::Exited(exit) => {
                    stream.mark_finished();
                    break exit;
                }
                _ => {}
            }
        };
        if exit.exit_code != Some(0) {
            let text = String::from_utf8_lossy(&output);
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(FAILED_OUTPUT_LINES)..].join("\n");
            let how = match (exit.exit_code, exit.signal) {
                (Some(code), _) => format!("exited with {code}"),
                (None, Some(sig)) => format!("was killed by signal {sig}"),
                _ => "ended without an exit status".into(),
            };
            return Err(Failure {
                step: Some(index),
                code: codes::IMAGE_BUILD_STEP_FAILED,
                message: format!("step {} ({}) {how}:\n{tail}", index + 1, step.describe()),
            });
        }
        // What it left running must not write during the capture.
        agent.kill_all().await.map_err(|e| fail(&e))?;
        let mut capture = agent
            .capture_layer(LAYER_BYTES, LAYER_ENTRIES)
            .await
            .map_err(|e| fail(&e))?;
        let mut file = std::fs::File::create(layer.path()).map_err(|e| fail(&e))?;
        while let Some(chunk) = capture.next_chunk().await.map_err(|e| fail(&e))? {
            file.write_all(&chunk).map_err(|e| fail(&e))?;
        }
        file.sync_all().map_err(|e| fail(&e))
    }
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
        // Host root's in the end (`finish_tree`); setuid bits are cleared there too.
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
