//! A template image's start and ready commands: run in every new sandbox on it before the
//! sandbox is handed out, a session's as a warm pool's. The start command runs in the
//! background inside the sandbox for the sandbox's life; the ready command is retried until it
//! exits 0, bounded by the image's timeout.

use std::sync::Arc;
use std::time::{Duration, Instant};

use koder_agent_protocol::{ExecRequest, FromAgent};
use koder_image::store::Startup;
use koder_image::StoredImage;
use koder_runtime::Sandbox;

use crate::manager::account::{lookup, run_as, Account};
use crate::Error;

/// How long the start command's launch may take, and the pause between ready attempts (an
/// attempt may take the whole of what is left of the image's ready timeout: E2B's
/// `wait_for_timeout` is a `sleep` that long).
const ATTEMPT: Duration = Duration::from_secs(10);
const RETRY: Duration = Duration::from_millis(200);
/// Output kept of a ready attempt (the last one is in the error).
const OUTPUT: u64 = 4096;

/// What an image's sandboxes run before hand-out, with the image's working directory and user.
#[derive(Debug, Clone)]
pub(crate) struct Prepare {
    startup: Startup,
    cwd: String,
    user: String,
}

impl Prepare {
    /// The image's, if it has a start command.
    pub(crate) fn of(image: &StoredImage) -> Option<Arc<Prepare>> {
        let m = &image.manifest;
        m.startup.clone().map(|startup| {
            Arc::new(Prepare {
                startup,
                cwd: m.workdir.clone(),
                user: m.user.clone(),
            })
        })
    }

    fn shell(&self, account: &Account, command: &str, timeout: Duration) -> ExecRequest {
        let (uid, gid, env) = run_as(account, Vec::new());
        ExecRequest {
            argv: vec!["/bin/sh".into(), "-c".into(), command.into()],
            env,
            cwd: Some(self.cwd.clone()),
            timeout_ms: Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
            output_limit_bytes: OUTPUT,
            uid,
            gid,
            ..ExecRequest::default()
        }
    }

    /// Starts the start command and waits for the ready command; an error means the sandbox
    /// must not be handed out (the caller destroys it).
    pub(crate) async fn run(&self, sandbox: &dyn Sandbox) -> Result<(), Error> {
        let agent = sandbox.agent().clone();
        let account = lookup(&agent, &self.user).await?.ok_or_else(|| {
            Error::ImageNotReady(format!(
                "the image's user {:?} is no account of its sandboxes",
                self.user
            ))
        })?;
        // No timeout: it lives as long as the sandbox, whichever connection the agent is on
        // (a microVM saved with its memory comes back on a new one).
        let mut start = ExecRequest {
            timeout_ms: None,
            detached: true,
            ..self.shell(&account, &self.startup.start, ATTEMPT)
        };
        start.output_limit_bytes = 1024;
        let mut stream = agent.exec(start).await?;
        match stream.recv().await? {
            FromAgent::Started { .. } => {}
            other => {
                return Err(Error::ImageNotReady(format!(
                    "the image's start command did not start: {other:?}"
                )))
            }
        }
        // The stream is held (and drained) until the process ends: dropping it would end it.
        tokio::spawn(async move {
            while let Ok(msg) = stream.recv().await {
                if let FromAgent::Exited(exit) = msg {
                    tracing::debug!(?exit, "an image's start command ended");
                    stream.mark_finished();
                    break;
                }
            }
        });
        let Some(ready) = &self.startup.ready else {
            return Ok(());
        };
        let limit = Duration::from_secs(self.startup.ready_timeout_s);
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let out = agent
                .exec_collect(self.shell(&account, ready, left))
                .await?;
            if out.exit.exit_code == Some(0) {
                return Ok(());
            }
            if Instant::now() + RETRY >= deadline {
                let mut output = String::from_utf8_lossy(&out.stdout).into_owned();
                output.push_str(&String::from_utf8_lossy(&out.stderr));
                return Err(Error::ImageNotReady(format!(
                    "the image's ready command did not exit 0 within {}s (last exit {:?}, output {:?}); the session was destroyed",
                    limit.as_secs(),
                    out.exit.exit_code,
                    output.trim_end()
                )));
            }
            tokio::time::sleep(RETRY).await;
        }
    }
}
