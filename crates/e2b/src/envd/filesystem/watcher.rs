//! Watch events in envd's terms, and the polled watchers a sandbox keeps.

use std::sync::Arc;

use koder_sessions::{FsEventKind, WatchFlush};
use parking_lot::Mutex;

use crate::connect::RpcError;
use crate::proto::filesystem::{EventType, FilesystemEvent};

/// Events a polled watcher keeps between two polls (older ones are dropped).
const MAX_WATCHER_EVENTS: usize = 10_000;
/// Names of the agent's in-progress uploads (koder-agent's `TEMP_PREFIX`).
const UPLOAD_TEMP_PREFIX: &str = ".koder-upload-";

/// A polled watcher (`CreateWatcher`/`GetWatcherEvents`/`RemoveWatcher`).
pub struct Watcher {
    pub buf: Arc<Mutex<WatchBuf>>,
    /// Barriers on the watch `task` relays into `buf`.
    pub flush: WatchFlush,
    pub task: tokio::task::JoinHandle<()>,
}

impl Watcher {
    /// Ends the watch (dropping the agent stream cancels it in the sandbox).
    pub fn stop(self) {
        self.task.abort();
    }
}

/// What a polled watcher gathered since the last poll.
#[derive(Default)]
pub struct WatchBuf {
    pub events: Vec<FilesystemEvent>,
    /// Why the watch ended, told once the events before it were taken.
    pub error: Option<RpcError>,
}

impl WatchBuf {
    pub fn push(&mut self, ev: FilesystemEvent) {
        if self.events.len() >= MAX_WATCHER_EVENTS {
            self.events.remove(0);
        }
        self.events.push(ev);
    }
}

/// envd's (fsnotify's) events for one agent event: names relative to the watched directory;
/// a rename is RENAME of the old name and CREATE of the new one.
pub fn fs_events(
    root: &str,
    kind: FsEventKind,
    path: &str,
    from: Option<&str>,
) -> Vec<FilesystemEvent> {
    // The agent writes uploads to a hidden temporary file renamed into place: envd writes
    // in place, so only the final name is reported.
    let temp = |p: &str| {
        p.rsplit('/')
            .next()
            .unwrap_or(p)
            .starts_with(UPLOAD_TEMP_PREFIX)
    };
    if temp(path) {
        return Vec::new();
    }
    let upload = from.is_some_and(temp);
    let from = from.filter(|f| !temp(f));
    let rel = |p: &str| -> String {
        let prefix = if root == "/" {
            "/".to_string()
        } else {
            format!("{root}/")
        };
        p.strip_prefix(&prefix).unwrap_or(p).to_string()
    };
    let ev = |name: String, ty: EventType| FilesystemEvent {
        name,
        r#type: ty.into(),
        entry: None,
    };
    match kind {
        FsEventKind::Created => vec![ev(rel(path), EventType::Create)],
        FsEventKind::Modified => vec![ev(rel(path), EventType::Write)],
        FsEventKind::Deleted => vec![ev(rel(path), EventType::Remove)],
        // A finished upload: envd's in-place write is seen as create, write, chmod.
        FsEventKind::Renamed if upload => [EventType::Create, EventType::Write, EventType::Chmod]
            .into_iter()
            .map(|ty| ev(rel(path), ty))
            .collect(),
        FsEventKind::Renamed => {
            let mut out = Vec::new();
            if let Some(from) = from {
                out.push(ev(rel(from), EventType::Rename));
            }
            out.push(ev(rel(path), EventType::Create));
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn wire(events: Vec<FilesystemEvent>) -> Vec<Value> {
        events
            .into_iter()
            .map(|e| serde_json::to_value(e).unwrap())
            .collect()
    }

    #[test]
    fn watch_events_are_relative_and_renames_pair() {
        let evs = wire(fs_events(
            "/home/user/d",
            FsEventKind::Created,
            "/home/user/d/sub/a.txt",
            None,
        ));
        assert_eq!(
            evs,
            vec![json!({"name": "sub/a.txt", "type": "EVENT_TYPE_CREATE"})]
        );
        let evs = wire(fs_events("/", FsEventKind::Modified, "/x", None));
        assert_eq!(evs[0]["name"], "x");
        assert!(fs_events("/d", FsEventKind::Created, "/d/.koder-upload-1-0-ab", None).is_empty());
        let evs = wire(fs_events(
            "/d",
            FsEventKind::Renamed,
            "/d/f",
            Some("/d/.koder-upload-1-0-ab"),
        ));
        assert_eq!(
            evs,
            vec![
                json!({"name": "f", "type": "EVENT_TYPE_CREATE"}),
                json!({"name": "f", "type": "EVENT_TYPE_WRITE"}),
                json!({"name": "f", "type": "EVENT_TYPE_CHMOD"}),
            ]
        );
        let evs = wire(fs_events(
            "/d",
            FsEventKind::Renamed,
            "/d/new",
            Some("/d/old"),
        ));
        assert_eq!(
            evs,
            vec![
                json!({"name": "old", "type": "EVENT_TYPE_RENAME"}),
                json!({"name": "new", "type": "EVENT_TYPE_CREATE"}),
            ]
        );
    }
}
