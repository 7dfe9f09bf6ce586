//! The processes E2B started in a sandbox, as the sandbox's state keeps them.

use std::sync::Arc;

use bytes::Bytes;
use koder_sessions::execs::until_ended;
use koder_sessions::TerminalInput;
use parking_lot::Mutex;
use tokio::sync::broadcast;

use crate::connect::{Code, RpcError};
use crate::proto::process::ProcessConfig;

/// The signal numbers E2B sends (Linux's, as in every sandbox).
pub(super) const SIGKILL: i32 = 9;
pub(super) const SIGTERM: i32 = 15;

/// A process started through E2B.
pub struct Proc {
    pub config: ProcessConfig,
    pub tag: Option<String>,
    pub kind: Kind,
}

#[derive(Clone)]
pub enum Kind {
    /// A background exec of the manager, by its exec id.
    Exec(String),
    Pty(Arc<PtyProc>),
}

/// A process on the manager's terminal, its output fanned out to every stream following it.
pub struct PtyProc {
    pub(super) input: TerminalInput,
    pub(super) events: broadcast::Sender<PtyEvent>,
    pub(super) exit: Mutex<Option<Exit>>,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Exit {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
}

#[derive(Clone, Debug)]
pub(super) enum PtyEvent {
    Data(Bytes),
    Exit(Exit),
}

impl PtyProc {
    pub(super) fn running(&self) -> bool {
        self.exit.lock().is_none()
    }

    pub(super) async fn write(&self, data: &[u8]) -> Result<(), RpcError> {
        self.input.write(data).await.map_err(ended)
    }

    pub(super) async fn resize(&self, cols: u16, rows: u16) -> Result<(), RpcError> {
        self.input.resize(cols, rows).await.map_err(ended)
    }

    /// Sends `signal` to the terminal's processes. A SIGKILL answers once the process has
    /// exited (at most [`koder_sessions::execs::KILL_SETTLES`] later), as a killed exec does:
    /// whoever looks for it next, `kill -0 <pid>` in E2B's own tests, must not find it.
    pub(super) async fn signal(&self, pid: u32, signal: i32) -> Result<(), RpcError> {
        let events = self.events.subscribe();
        if !self.running() {
            return Err(not_found(pid));
        }
        self.input.signal(signal).await.map_err(ended)?;
        if signal == SIGKILL {
            until_ended(events, |e| matches!(e, PtyEvent::Exit(_))).await;
        }
        Ok(())
    }
}

fn ended(e: koder_sessions::TerminalEnded) -> RpcError {
    RpcError::new(Code::NotFound, e.to_string())
}

pub(super) fn not_found(pid: u32) -> RpcError {
    RpcError::new(Code::NotFound, format!("process with pid {pid} not found"))
}
