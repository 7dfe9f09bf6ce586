//! Terminals: a program on a PTY in the sandbox, as a domain handle with its pid.

use bytes::Bytes;
use koder_agent_protocol::{self as proto, AgentStream, FromAgent, StreamHandle, ToAgent};
use koder_auth::Identity;

use crate::manager::account::run_as;
use crate::manager::{first_answer, validate_env};
use crate::{Error, Manager};

/// What to start on a terminal.
#[derive(Debug, Clone, Default)]
pub struct TerminalSpec {
    /// Program and arguments, exec'd directly; empty means a login shell.
    pub argv: Vec<String>,
    /// Beyond the session's environment (and the account's HOME/USER).
    pub env: std::collections::BTreeMap<String, String>,
    pub cwd: Option<String>,
    /// `root` (default), `user` or any other account of the sandbox, as for an exec.
    pub user: Option<String>,
    pub cols: u16,
    pub rows: u16,
}

/// A running terminal. Dropping it kills its process.
pub struct Terminal {
    pid: u32,
    stream: AgentStream,
}

/// What a terminal says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TerminalEvent {
    Output(Bytes),
    Exit {
        exit_code: Option<i32>,
        signal: Option<i32>,
    },
    /// The sandbox stopped answering; the terminal is gone.
    Lost(String),
}

/// Writes to a terminal; cheap to clone, usable while another task reads its events.
#[derive(Clone)]
pub struct TerminalInput(StreamHandle);

/// The terminal (or its sandbox) has ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the terminal has ended")]
pub struct TerminalEnded;

impl Terminal {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn input(&self) -> TerminalInput {
        TerminalInput(self.stream.handle())
    }

    /// The next event; after `Exit` or `Lost` there are none.
    pub async fn next(&mut self) -> TerminalEvent {
        loop {
            match self.stream.recv().await {
                Ok(FromAgent::Stdout(d) | FromAgent::Stderr(d)) => {
                    return TerminalEvent::Output(Bytes::from(d))
                }
                Ok(FromAgent::Exited(e)) => {
                    return TerminalEvent::Exit {
                        exit_code: e.exit_code,
                        signal: e.signal,
                    }
                }
                Ok(_) => {}
                Err(e) => return TerminalEvent::Lost(e.to_string()),
            }
        }
    }
}

impl TerminalInput {
    pub async fn write(&self, data: &[u8]) -> Result<(), TerminalEnded> {
        for chunk in data.chunks(proto::CHUNK_BYTES) {
            self.send(ToAgent::Stdin(chunk.to_vec())).await?;
        }
        Ok(())
    }

    pub async fn resize(&self, cols: u16, rows: u16) -> Result<(), TerminalEnded> {
        self.send(ToAgent::Resize { cols, rows }).await
    }

    /// Signals the terminal's process group (numbers outside 1..=64 are ignored by the agent).
    pub async fn signal(&self, signal: i32) -> Result<(), TerminalEnded> {
        self.send(ToAgent::Signal(signal)).await
    }

    async fn send(&self, msg: ToAgent) -> Result<(), TerminalEnded> {
        self.0.send(msg).await.map_err(|_| TerminalEnded)
    }
}

impl Manager {
    /// Starts a program on a terminal and returns it once it runs.
    pub async fn terminal(
        &self,
        who: &Identity,
        id: &str,
        spec: TerminalSpec,
    ) -> Result<Terminal, Error> {
        let live = self.awake(who, id).await?;
        let extra_env = validate_env(&spec.env)?;
        let account = self.account_in(id, &live, spec.user.as_deref()).await?;
        let (uid, gid, mut env) = run_as(&account, live.env.clone());
        for (k, v) in extra_env {
            env.retain(|(ek, _)| *ek != k);
            env.push((k, v));
        }
        let req = proto::PtyRequest {
            argv: spec.argv,
            env,
            cwd: spec.cwd,
            cols: spec.cols,
            rows: spec.rows,
            uid,
            gid,
        };
        let mut stream = match live.sandbox.agent().open(ToAgent::PtyStart(req)).await {
            Ok(s) => s,
            Err(e) => return Err(self.agent_failed(id, e).await),
        };
        match first_answer(&mut stream).await {
            Ok(FromAgent::Started { pid }) => Ok(Terminal { pid, stream }),
            Ok(_) => Err(Error::Internal("terminal did not start".into())),
            Err(e) => Err(self.agent_failed(id, e).await),
        }
    }
}
