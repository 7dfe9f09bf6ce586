//! File watches: inotify in the sandbox, as a stream of domain events.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use koder_agent_protocol::{self as proto, AgentStream, FromAgent, StreamHandle, ToAgent};
use koder_auth::Identity;
use tokio::sync::watch;

use crate::manager::first_answer;
use crate::{Error, Manager};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsEventKind {
    Created,
    Modified,
    Deleted,
    Renamed,
}

/// One change under a watched directory (absolute in-sandbox paths).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsEvent {
    pub kind: FsEventKind,
    pub path: String,
    /// The old path of a rename whose both halves were seen.
    pub from: Option<String>,
}

/// A running watch; dropping it stops watching.
pub struct Watch {
    stream: AgentStream,
    /// The newest barrier token [`next`](Self::next) passed.
    flushed: watch::Sender<u64>,
    tokens: Arc<AtomicU64>,
}

/// Asks a [`Watch`] for every event of what happened so far (see [`WatchFlush::flush`]).
#[derive(Clone)]
pub struct WatchFlush {
    handle: StreamHandle,
    flushed: watch::Receiver<u64>,
    tokens: Arc<AtomicU64>,
}

impl WatchFlush {
    /// Returns once every event of what happened in the sandbox before this call was returned
    /// by the watch's [`Watch::next`] and the caller asked for the next one after them (or the
    /// watch ended). Only as long as that takes: no settling delay.
    pub async fn flush(&self) -> Result<(), Error> {
        let token = self.tokens.fetch_add(1, Ordering::Relaxed) + 1;
        self.handle.send(ToAgent::WatchFlush { token }).await?;
        let mut flushed = self.flushed.clone();
        // An ended watch drops the sender: no more events will come either.
        let _ = flushed.wait_for(|done| *done >= token).await;
        Ok(())
    }
}

impl Watch {
    fn new(stream: AgentStream) -> Self {
        Watch {
            stream,
            flushed: watch::Sender::new(0),
            tokens: Arc::new(AtomicU64::new(0)),
        }
    }

    /// A handle for barriers on this watch, usable while another task calls `next`.
    pub fn flusher(&self) -> WatchFlush {
        WatchFlush {
            handle: self.stream.handle(),
            flushed: self.flushed.subscribe(),
            tokens: self.tokens.clone(),
        }
    }

    /// The next event, or why the watch ended (it has no more events after an error).
    pub async fn next(&mut self) -> Result<FsEvent, Error> {
        loop {
            match self.stream.recv().await {
                Ok(FromAgent::WatchFlushed { token }) => {
                    self.flushed.send_modify(|done| *done = (*done).max(token));
                }
                Ok(FromAgent::FsEvent { kind, path, from }) => {
                    return Ok(FsEvent {
                        kind: kind.into(),
                        path,
                        from,
                    })
                }
                Ok(_) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl From<proto::FsEventKind> for FsEventKind {
    fn from(k: proto::FsEventKind) -> Self {
        match k {
            proto::FsEventKind::Created => FsEventKind::Created,
            proto::FsEventKind::Modified => FsEventKind::Modified,
            proto::FsEventKind::Deleted => FsEventKind::Deleted,
            proto::FsEventKind::Renamed => FsEventKind::Renamed,
        }
    }
}

impl Manager {
    /// Watches a directory in the sandbox; returns once watching.
    pub async fn watch(
        &self,
        who: &Identity,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<Watch, Error> {
        let live = self.awake(who, id).await?;
        if path.is_empty() || path.contains('\0') || path.len() > proto::MAX_PATH_BYTES {
            return Err(Error::InvalidArgument(
                "path must be a directory path".into(),
            ));
        }
        let first = ToAgent::Watch {
            path: path.into(),
            recursive,
        };
        let mut stream = match live.sandbox.agent().open(first).await {
            Ok(s) => s,
            Err(e) => return Err(self.agent_failed(id, e).await),
        };
        match first_answer(&mut stream).await {
            Ok(FromAgent::Done) => Ok(Watch::new(stream)),
            Ok(_) => Err(Error::Internal("watch did not start".into())),
            Err(e) => Err(self.agent_failed(id, e).await),
        }
    }
}
