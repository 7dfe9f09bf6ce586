//! File watching with inotify (never polling): created / modified / deleted / renamed events
//! below a directory, optionally recursive, debounced so a burst of writes is one event.
//!
//! A `WatchFlush` barrier sends every event up to the moment it arrives, then `WatchFlushed`.
//! "Up to now" is found in inotify's own queue: the barrier writes a byte to a private unnamed
//! file (`O_TMPFILE` in /tmp: no name a sandbox process could find; a memfd would be a pseudo
//! file, which the kernel does not report) watched by the same inotify instance, so its event
//! is queued behind every event of what happened before; once the loop reads it, those were
//! all read. Two such files take turns, so two barriers' events are never adjacent and inotify
//! never merges them into one. Without them (no /tmp), a barrier sends what was read so far.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask, Watches};
use koder_agent_protocol::{AgentError, ErrorCode, FromAgent, FsEventKind, ToAgent};
use rustix::fs::{Mode, OFlags};
use tokio::sync::mpsc;

use super::fs::Fs;
use crate::outbox::Outbox;

/// Events of one path within this window collapse into one.
const DEBOUNCE: Duration = Duration::from_millis(50);
/// Directories one watch may cover (inotify watches are a kernel resource).
const MAX_DIRS: usize = 8192;

fn mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::MODIFY
        | WatchMask::CLOSE_WRITE
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::DELETE_SELF
        | WatchMask::ONLYDIR
        | WatchMask::DONT_FOLLOW
}

struct Tree {
    watches: Watches,
    dirs: HashMap<WatchDescriptor, PathBuf>,
    recursive: bool,
    /// Entries found in directories created while watching, to be reported as created.
    early: Vec<String>,
}

impl Tree {
    /// Watches `dir` (and, when recursive, every directory below it, without following links).
    fn add(&mut self, dir: &Path) {
        if self.dirs.len() >= MAX_DIRS {
            return;
        }
        if let Ok(wd) = self.watches.add(dir, mask()) {
            self.dirs.insert(wd, dir.to_path_buf());
        }
        if !self.recursive {
            return;
        }
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                self.add(&entry.path());
            }
        }
    }
}

pub async fn run(
    fs: Arc<Fs>,
    path: String,
    recursive: bool,
    mut rx: mpsc::Receiver<ToAgent>,
    out: Outbox,
) {
    let root = match resolve(&fs, &path) {
        Ok(r) => r,
        Err(e) => {
            let _ = out.send(FromAgent::Error(e)).await;
            return;
        }
    };
    let setup = Inotify::init().and_then(|ino| {
        let watches = ino.watches();
        let stream = ino.into_event_stream(vec![0u8; 64 * 1024])?;
        Ok((watches, stream))
    });
    let (mut watches, mut events) = match setup {
        Ok(s) => s,
        Err(e) => {
            let _ = out
                .send(FromAgent::Error(AgentError::new(
                    ErrorCode::Io,
                    format!("inotify: {e}"),
                )))
                .await;
            return;
        }
    };
    let mut barrier = Barrier::new(&mut watches).ok();
    let mut tree = Tree {
        watches,
        dirs: HashMap::new(),
        recursive,
        early: Vec::new(),
    };
    tree.add(&root);
    if tree.dirs.is_empty() {
        let e = AgentError::new(ErrorCode::NotADirectory, format!("cannot watch {path:?}"));
        let _ = out.send(FromAgent::Error(e)).await;
        return;
    }
    if out.send(FromAgent::Done).await.is_err() {
        return;
    }
    // Pending events by path, flushed DEBOUNCE after the first of a batch.
    let mut pending = Pending::default();
    let mut flush_at: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            ev = events.next() => {
                let Some(Ok(ev)) = ev else { return };
                let reached = barrier.as_mut().map(|b| b.reached(&ev)).unwrap_or_default();
                if reached.is_empty() {
                    if let Some((kind, path, from)) = translate(&mut tree, &mut pending.moved_from, ev) {
                        pending.batch.merge(path, kind, from);
                        for early in std::mem::take(&mut tree.early) {
                            pending.batch.merge(early, FsEventKind::Created, None);
                        }
                        flush_at.get_or_insert_with(|| tokio::time::Instant::now() + DEBOUNCE);
                    }
                    continue;
                }
                flush_at = None;
                if !pending.send(&out).await {
                    return;
                }
                for token in reached {
                    if out.send(FromAgent::WatchFlushed { token }).await.is_err() {
                        return;
                    }
                }
            }
            () = sleep_until(flush_at) => {
                flush_at = None;
                if !pending.send(&out).await {
                    return;
                }
            }
            msg = rx.recv() => match msg {
                None | Some(ToAgent::Cancel) => return,
                Some(ToAgent::WatchFlush { token }) => {
                    if barrier.as_mut().is_none_or(|b| b.set(token).is_err()) {
                        // No barrier event will come: what was read so far is all there is.
                        if !pending.send(&out).await
                            || out.send(FromAgent::WatchFlushed { token }).await.is_err()
                        {
                            return;
                        }
                    }
                }
                Some(_) => {}
            },
        }
    }
}

/// Events read but not sent yet, in the order they happened.
#[derive(Default)]
struct Pending {
    batch: Batch,
    /// Halves of moves by cookie, waiting for their `MOVED_TO`.
    moved_from: HashMap<u32, String>,
}

impl Pending {
    /// Sends the batch; false once the daemon is gone.
    async fn send(&mut self, out: &Outbox) -> bool {
        // Both halves of a move are queued together: one still alone left the watched tree.
        for (_, gone) in self.moved_from.drain() {
            self.batch.merge(gone, FsEventKind::Deleted, None);
        }
        for (kind, path, from) in self.batch.take() {
            if out
                .send(FromAgent::FsEvent { kind, path, from })
                .await
                .is_err()
            {
                return false;
            }
        }
        true
    }
}

/// A debounce window's events in order: every create, rename and delete is kept (a path
/// created, renamed away and deleted within microseconds is three events), only what adds
/// nothing collapses: modifies of a path whose last event already says it changed, and the
/// second report of a create (a new directory's entries are both scanned and then seen by
/// its fresh watch).
#[derive(Default)]
struct Batch {
    events: Vec<(FsEventKind, String, Option<String>)>,
    /// Index in `events` of each path's last event.
    last: HashMap<String, usize>,
}

impl Batch {
    fn merge(&mut self, path: String, kind: FsEventKind, from: Option<String>) {
        let last = self.last.get(&path).map(|&i| self.events[i].0);
        let adds_nothing = matches!(
            (kind, last),
            (
                FsEventKind::Modified,
                Some(FsEventKind::Created | FsEventKind::Modified | FsEventKind::Renamed),
            ) | (FsEventKind::Created, Some(FsEventKind::Created))
        );
        if adds_nothing {
            return;
        }
        self.last.insert(path.clone(), self.events.len());
        self.events.push((kind, path, from));
    }

    fn take(&mut self) -> Vec<(FsEventKind, String, Option<String>)> {
        self.last.clear();
        std::mem::take(&mut self.events)
    }
}

/// The unnamed files whose writes mark barriers in the inotify queue (see the module docs).
struct Barrier {
    marks: [(OwnedFd, WatchDescriptor); 2],
    /// The next barrier's file.
    turn: usize,
    /// Tokens of barriers set and not reached, oldest first.
    waiting: VecDeque<u64>,
}

impl Barrier {
    fn new(watches: &mut Watches) -> std::io::Result<Self> {
        let mut mark = || -> std::io::Result<(OwnedFd, WatchDescriptor)> {
            let fd = rustix::fs::open(
                "/tmp",
                OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )?;
            let wd = watches.add(
                format!("/proc/self/fd/{}", fd.as_raw_fd()),
                WatchMask::MODIFY,
            )?;
            Ok((fd, wd))
        };
        Ok(Barrier {
            marks: [mark()?, mark()?],
            turn: 0,
            waiting: VecDeque::new(),
        })
    }

    /// Queues barrier `token` behind every event queued so far.
    fn set(&mut self, token: u64) -> std::io::Result<()> {
        let (fd, _) = &self.marks[self.turn];
        rustix::io::pwrite(fd, b"b", 0)?;
        self.turn = 1 - self.turn;
        self.waiting.push_back(token);
        Ok(())
    }

    /// The tokens `ev` completes: the oldest for one of the marks' events, all of them when the
    /// queue overflowed (barrier events may be among the lost); none for any other event.
    fn reached(&mut self, ev: &inotify::Event<OsString>) -> Vec<u64> {
        if ev.mask.contains(EventMask::Q_OVERFLOW) {
            return self.waiting.drain(..).collect();
        }
        if self.marks.iter().any(|(_, wd)| *wd == ev.wd) {
            return self.waiting.pop_front().into_iter().collect();
        }
        Vec::new()
    }
}

fn translate(
    tree: &mut Tree,
    moved_from: &mut HashMap<u32, String>,
    ev: inotify::Event<OsString>,
) -> Option<(FsEventKind, String, Option<String>)> {
    let dir = tree.dirs.get(&ev.wd)?.clone();
    if ev.mask.contains(EventMask::IGNORED) || ev.mask.contains(EventMask::DELETE_SELF) {
        tree.dirs.remove(&ev.wd);
        return None;
    }
    let path = match &ev.name {
        Some(name) => dir.join(name),
        None => dir,
    };
    let shown = path.to_string_lossy().into_owned();
    let is_dir = ev.mask.contains(EventMask::ISDIR);
    if ev.mask.contains(EventMask::CREATE) {
        if is_dir && tree.recursive {
            tree.add(&path);
            // Whatever appeared in the new directory before its watch existed would otherwise
            // go unreported (the classic recursive-inotify race).
            found_inside(&path, &mut tree.early);
        }
        Some((FsEventKind::Created, shown, None))
    } else if ev
        .mask
        .intersects(EventMask::MODIFY | EventMask::CLOSE_WRITE)
    {
        Some((FsEventKind::Modified, shown, None))
    } else if ev.mask.contains(EventMask::DELETE) {
        Some((FsEventKind::Deleted, shown, None))
    } else if ev.mask.contains(EventMask::MOVED_FROM) {
        moved_from.insert(ev.cookie, shown);
        // Moved out of the watched tree if no MOVED_TO follows; reported as deleted then.
        None
    } else if ev.mask.contains(EventMask::MOVED_TO) {
        if is_dir && tree.recursive {
            tree.add(&path);
        }
        Some((FsEventKind::Renamed, shown, moved_from.remove(&ev.cookie)))
    } else {
        None
    }
}

/// Paths below `dir` (recursively, not following links), as of now.
fn found_inside(dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        out.push(entry.path().to_string_lossy().into_owned());
        if entry.file_type().is_ok_and(|t| t.is_dir()) && out.len() < MAX_DIRS {
            found_inside(&entry.path(), out);
        }
    }
}

/// The watched path, resolved inside the sandbox root and required to be a directory.
fn resolve(fs: &Fs, path: &str) -> Result<PathBuf, AgentError> {
    let entry = fs.stat(path)?;
    if entry.kind != koder_agent_protocol::EntryKind::Dir {
        return Err(AgentError::new(
            ErrorCode::NotADirectory,
            format!("{path:?} is not a directory"),
        ));
    }
    Ok(PathBuf::from(entry.path))
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Event = (FsEventKind, String, Option<String>);

    fn ev(kind: FsEventKind, path: &str, from: Option<&str>) -> Event {
        (kind, path.into(), from.map(Into::into))
    }

    #[test]
    fn modifies_collapse_into_what_already_says_the_path_changed() {
        let mut b = Batch::default();
        b.merge("/d/new".into(), FsEventKind::Created, None);
        b.merge("/d/new".into(), FsEventKind::Modified, None);
        b.merge("/d/up".into(), FsEventKind::Renamed, Some("/d/.tmp".into()));
        b.merge("/d/up".into(), FsEventKind::Modified, None);
        b.merge("/d/old".into(), FsEventKind::Modified, None);
        b.merge("/d/old".into(), FsEventKind::Modified, None);
        b.merge("/d/new".into(), FsEventKind::Created, None);
        use FsEventKind::*;
        assert_eq!(
            b.take(),
            [
                ev(Created, "/d/new", None),
                ev(Renamed, "/d/up", Some("/d/.tmp")),
                ev(Modified, "/d/old", None),
            ]
        );
    }

    #[test]
    fn a_burst_keeps_its_order_and_every_change_of_a_path() {
        use FsEventKind::*;
        let mut b = Batch::default();
        b.merge("/b/w".into(), Created, None);
        b.merge("/b/w".into(), Modified, None);
        b.merge("/b/d".into(), Created, None);
        b.merge("/b/w2".into(), Renamed, Some("/b/w".into()));
        b.merge("/b/w2".into(), Deleted, None);
        b.merge("/b/w2".into(), Created, None);
        b.merge("/b/w2".into(), Modified, None);
        assert_eq!(
            b.take(),
            [
                ev(Created, "/b/w", None),
                ev(Created, "/b/d", None),
                ev(Renamed, "/b/w2", Some("/b/w")),
                ev(Deleted, "/b/w2", None),
                ev(Created, "/b/w2", None),
            ]
        );
        assert!(b.take().is_empty());
    }
}
