//! Sandboxes for image builds (`koder-build`): jails like every session's, on a build's base
//! image with the earlier steps' layers stacked on it (id-mapped, as a restored snapshot's, so
//! a step may change what an earlier one made), with network `open` and the build-only exemptions of `[images]
//! build_internal`. They are no sessions: no tenant, no record; their egress is audited under
//! the build's label, and a daemon restart reconciles them away with every other sandbox.
//!
//! The builder gets a [`BuildSandbox`], a domain handle (write a file, run a command with its
//! output streamed, capture what changed), never the agent itself: only the session manager
//! and the runtimes speak the agent protocol.

use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use koder_agent_protocol::{ExecRequest, FromAgent, WriteFileRequest};
use koder_netpolicy::{Mode, Policy};
use koder_runtime::{Sandbox, SandboxSpec};
use tokio::io::{AsyncRead, AsyncReadExt as _};

use super::account::{lookup, run_as};
use super::Manager;
use crate::{limits, Error};

/// A build step's command in a [`BuildSandbox`].
#[derive(Debug, Clone, Default)]
pub struct StepCommand {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Written to its stdin, which is then closed.
    pub stdin: Vec<u8>,
    pub cwd: Option<String>,
    /// The account it runs as (default root): a name or a number, looked up in the step's own
    /// /etc/passwd; its `HOME` and `USER` are set. An account the tree lacks is
    /// [`Error::UnknownAccount`] and nothing runs.
    pub user: Option<String>,
    /// Killed (its whole process group) after this long.
    pub timeout: Duration,
    /// Output bytes forwarded per stream; the rest is dropped.
    pub output_limit: u64,
}

/// How a step's command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepExit {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
}

/// A sandbox running one build step; destroyed when dropped by [`BuildSandbox::destroy`].
pub struct BuildSandbox {
    sandbox: Arc<dyn Sandbox>,
}

/// Bytes per chunk of an upload into a build sandbox.
const WRITE_CHUNK: usize = 256 * 1024;

impl BuildSandbox {
    /// Writes `from` to `path` (parents created), with `mode`, owned by root.
    pub async fn write(
        &self,
        path: &str,
        mode: u32,
        from: &mut (dyn AsyncRead + Send + Unpin),
    ) -> Result<(), Error> {
        let mut writer = self
            .sandbox
            .agent()
            .write_file(WriteFileRequest {
                path: path.into(),
                mode: Some(mode),
                create_parents: true,
                max_bytes: None,
                owner: None,
                metadata: Vec::new(),
            })
            .await?;
        let mut buf = vec![0u8; WRITE_CHUNK];
        loop {
            let n = from
                .read(&mut buf)
                .await
                .map_err(|e| Error::Internal(format!("reading what goes to {path}: {e}")))?;
            if n == 0 {
                break;
            }
            writer.write(&buf[..n]).await?;
        }
        writer.finish().await?;
        Ok(())
    }

    /// Runs `cmd` to its end, handing its output (stdout and stderr as they come) to `output`.
    pub async fn exec_logged(
        &self,
        cmd: StepCommand,
        mut output: impl FnMut(&[u8]) + Send,
    ) -> Result<StepExit, Error> {
        let agent = self.sandbox.agent();
        let name = cmd.user.as_deref().unwrap_or("root");
        let account = lookup(agent, name)
            .await?
            .ok_or_else(|| Error::UnknownAccount(name.to_string()))?;
        let (uid, gid, env) = run_as(&account, cmd.env);
        let mut stream = agent
            .exec(ExecRequest {
                argv: cmd.argv,
                env,
                cwd: cmd.cwd,
                stdin: cmd.stdin,
                timeout_ms: Some(u64::try_from(cmd.timeout.as_millis()).unwrap_or(u64::MAX)),
                output_limit_bytes: cmd.output_limit,
                uid,
                gid,
                ..ExecRequest::default()
            })
            .await?;
        loop {
            match stream.recv().await? {
                FromAgent::Stdout(d) | FromAgent::Stderr(d) => output(&d),
                FromAgent::Exited(exit) => {
                    stream.mark_finished();
                    return Ok(StepExit {
                        exit_code: exit.exit_code,
                        signal: exit.signal,
                        timed_out: exit.timed_out,
                    });
                }
                _ => {}
            }
        }
    }

    /// Kills what the step left running (it must not write during the capture), then writes
    /// what the sandbox changed (its writable layer, in `koder-layer`'s format) to `into`.
    pub async fn capture(
        &self,
        into: &Path,
        max_bytes: u64,
        max_entries: u64,
    ) -> Result<(), Error> {
        let agent = self.sandbox.agent();
        agent.kill_all().await?;
        let mut capture = agent.capture_layer(max_bytes, max_entries).await?;
        let io = |e: std::io::Error| Error::Internal(format!("writing a captured layer: {e}"));
        let mut file = std::fs::File::create(into).map_err(io)?;
        while let Some(chunk) = capture.next_chunk().await? {
            file.write_all(&chunk).map_err(io)?;
        }
        file.sync_all().map_err(io)
    }

    /// Kills every process and removes every trace of the sandbox.
    pub async fn destroy(self) {
        if let Err(e) = self.sandbox.destroy().await {
            tracing::warn!(error = %e, "destroying a build sandbox");
        }
    }
}

impl Manager {
    /// A fresh sandbox on `image` (a digest of the image store) with `layers` (layer files,
    /// bottom first: the earlier steps') stacked on it, with open egress, audited as `label`.
    /// The caller destroys it.
    pub async fn build_sandbox(
        &self,
        image: &str,
        layers: Vec<std::path::PathBuf>,
        label: &str,
    ) -> Result<BuildSandbox, Error> {
        let mut net = self.cfg.network.clone();
        net.internal
            .extend(self.cfg.images.build_internal.iter().copied());
        let policy = Policy::build(Mode::Open, &[], &[], &net).await?;
        let spec = SandboxSpec {
            id: format!("b{}", uuid::Uuid::new_v4().simple()),
            image: image.into(),
            limits: limits::to_runtime_limits(&self.cfg.default_limits),
            env: Vec::new(),
            egress: true,
            layers,
            volumes: Vec::new(),
            ..Default::default()
        };
        self.pool.make_room().await;
        let sandbox = self.runtime.create(spec).await?;
        crate::egress::start_unrecorded(
            (&self.store, &self.metrics),
            &net,
            sandbox.agent(),
            label,
            policy,
        )
        .await;
        Ok(BuildSandbox { sandbox })
    }
}
