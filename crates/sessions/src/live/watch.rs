//! File watches: inotify in the sandbox, as a stream of domain events.

use koder_agent_protocol::{self as proto, AgentStream, FromAgent, ToAgent};
use koder_auth::Identity;

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
}

impl Watch {
    /// The next event, or why the watch ended (it has no more events after an error).
    pub async fn next(&mut self) -> Result<FsEvent, Error> {
        loop {
            match self.stream.recv().await {
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
            Ok(FromAgent::Done) => Ok(Watch { stream }),
            Ok(_) => Err(Error::Internal("watch did not start".into())),
            Err(e) => Err(self.agent_failed(id, e).await),
        }
    }
}
