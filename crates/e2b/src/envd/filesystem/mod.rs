//! envd's `filesystem.Filesystem` service over the session manager's file operations.
//!
//! What the acting account creates belongs to it (uid 1000 for `user`), so the user's processes
//! can change it, as on E2B.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Path;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use koder_api_types::{EntryType, ExecRequest, FileEntry};
use koder_sessions::{Watch, WatchFlush};
use parking_lot::Mutex;

pub mod entry;
pub mod watcher;

use super::auth::Target;
use super::user::{normalize, split_parent};
use crate::connect::{self, Code, RpcError, Sink};
use crate::proto::filesystem::{
    watch_dir_response, CreateWatcherRequest, CreateWatcherResponse, EntryInfo, EventType,
    FilesystemEvent, GetWatcherEventsRequest, GetWatcherEventsResponse, ListDirRequest,
    ListDirResponse, MakeDirRequest, MakeDirResponse, MoveRequest, MoveResponse, RemoveRequest,
    RemoveResponse, RemoveWatcherRequest, RemoveWatcherResponse, StatRequest, StatResponse,
    WatchDirRequest, WatchDirResponse,
};
use entry::entry_info;
use watch_dir_response::{Event, KeepAlive, StartEvent};
use watcher::{fs_events, WatchBuf, Watcher};

const WATCH_KEEPALIVE: Duration = Duration::from_secs(50);

pub async fn rpc(
    Path(method): Path<String>,
    t: Target,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match method.as_str() {
        "Stat" => {
            connect::unary(&headers, body, |r: StatRequest| async move {
                let path = t.user.resolve(&r.path);
                let entry = followed(&t, stat(&t, &path).await?).await;
                Ok(StatResponse {
                    entry: Some(entry_info(&entry)),
                })
            })
            .await
        }
        "MakeDir" => connect::unary(&headers, body, |r: MakeDirRequest| make_dir(t, r)).await,
        "Move" => connect::unary(&headers, body, |r: MoveRequest| move_entry(t, r)).await,
        "ListDir" => connect::unary(&headers, body, |r: ListDirRequest| list_dir(t, r)).await,
        "Remove" => {
            connect::unary(&headers, body, |r: RemoveRequest| async move {
                let path = t.user.resolve(&r.path);
                // envd removes like `rm -rf` (Go's RemoveAll): a path that is not there is
                // already removed.
                match t
                    .e2b
                    .manager()
                    .remove_file(&t.who, &t.id, &path, true)
                    .await
                {
                    Ok(()) | Err(koder_sessions::Error::FileNotFound(_)) => Ok(RemoveResponse {}),
                    Err(e) => Err(e.into()),
                }
            })
            .await
        }
        "WatchDir" => {
            connect::server_stream(&headers, body, |r: WatchDirRequest| watch_dir(t, r)).await
        }
        "CreateWatcher" => {
            connect::unary(&headers, body, |r: CreateWatcherRequest| {
                create_watcher(t, r)
            })
            .await
        }
        "GetWatcherEvents" => {
            connect::unary(&headers, body, |r: GetWatcherEventsRequest| async move {
                let w = t
                    .ctx
                    .watchers
                    .lock()
                    .get(&r.watcher_id)
                    .map(|w| (w.buf.clone(), w.flush.clone()));
                let (buf, flush) = w.ok_or_else(|| no_watcher(&r.watcher_id))?;
                settled(&flush).await;
                let mut b = buf.lock();
                if b.events.is_empty() {
                    if let Some(e) = b.error.take() {
                        return Err(e);
                    }
                }
                let events = std::mem::take(&mut b.events);
                Ok(GetWatcherEventsResponse { events })
            })
            .await
        }
        "RemoveWatcher" => {
            connect::unary(&headers, body, |r: RemoveWatcherRequest| async move {
                let w = t.ctx.watchers.lock().remove(&r.watcher_id);
                w.ok_or_else(|| no_watcher(&r.watcher_id))?.stop();
                Ok(RemoveWatcherResponse {})
            })
            .await
        }
        other => RpcError::new(
            Code::Unimplemented,
            format!("filesystem.Filesystem/{other} is not a method of this service"),
        )
        .into_response(),
    }
}

/// The entry at `abs` (not following a final symlink), found in its parent's listing: the
/// manager has listings but no stat. The root, or an entry a truncated listing left out, is
/// asked of `stat` inside the sandbox.
pub async fn stat(t: &Target, abs: &str) -> Result<FileEntry, RpcError> {
    let Some((parent, name)) = split_parent(abs) else {
        return stat_by_exec(t, abs).await;
    };
    let listing = t
        .e2b
        .manager()
        .list_files(&t.who, &t.id, parent, 1)
        .await
        .map_err(|e| match e {
            // A parent that is a file: the path does not exist either.
            koder_sessions::Error::Conflict(_) | koder_sessions::Error::FileNotFound(_) => {
                missing(abs)
            }
            other => other.into(),
        })?;
    if let Some(e) = listing.entries.into_iter().find(|e| e.name == name) {
        return Ok(e);
    }
    if listing.truncated {
        return stat_by_exec(t, abs).await;
    }
    Err(missing(abs))
}

/// Symlinks a Stat follows before giving up: a loop, or a chain too long to be meant.
const MAX_LINK_HOPS: usize = 8;

/// A symlink as envd's Stat reports it: the type, size and mode of what it finally points at,
/// with that target's absolute path; a dangling or looping link stays a symlink. Paths are
/// resolved lexically, as the agent resolves them inside the sandbox's root.
async fn followed(t: &Target, link: FileEntry) -> FileEntry {
    let mut current = link.clone();
    for _ in 0..MAX_LINK_HOPS {
        let (EntryType::Symlink, Some(target)) = (current.kind, current.symlink_target.as_deref())
        else {
            break;
        };
        let abs = link_target(&current.path, target);
        match stat(t, &abs).await {
            Ok(next) => current = next,
            Err(_) => return link,
        }
    }
    if current.kind == EntryType::Symlink {
        return link;
    }
    FileEntry {
        kind: current.kind,
        size: current.size,
        mode: current.mode,
        symlink_target: Some(current.path),
        metadata: current.metadata,
        ..link
    }
}

/// The absolute path a link at `link_path` with content `target` names.
fn link_target(link_path: &str, target: &str) -> String {
    if target.starts_with('/') {
        return normalize(target);
    }
    let parent = split_parent(link_path).map_or("/", |(p, _)| p);
    normalize(&format!("{parent}/{target}"))
}

fn missing(abs: &str) -> RpcError {
    RpcError::new(Code::NotFound, format!("path {abs:?} does not exist"))
}

async fn stat_by_exec(t: &Target, abs: &str) -> Result<FileEntry, RpcError> {
    let script = r#"stat -c '%F|%a|%s|%Y|%u|%g' -- "$1" && { readlink -- "$1" || true; }"#;
    let out = root_exec(t, script, &[abs]).await?;
    if out.exit_code != Some(0) {
        return Err(missing(abs));
    }
    let mut lines = out.stdout.lines();
    let fields: Vec<&str> = lines.next().unwrap_or("").split('|').collect();
    let [kind, mode, size, mtime, uid, gid] = fields[..] else {
        return Err(RpcError::new(Code::Internal, "unexpected stat output"));
    };
    let kind = match kind {
        "directory" => EntryType::Dir,
        "symbolic link" => EntryType::Symlink,
        k if k.contains("regular") => EntryType::File,
        _ => EntryType::Other,
    };
    let (_, name) = split_parent(abs).unwrap_or(("/", ""));
    Ok(FileEntry {
        name: name.to_string(),
        path: abs.to_string(),
        kind,
        size: size.parse().unwrap_or(0),
        mode: u32::from_str_radix(mode, 8).unwrap_or(0),
        modified_at: chrono::DateTime::from_timestamp(mtime.parse().unwrap_or(0), 0)
            .unwrap_or_default(),
        symlink_target: lines
            .next()
            .filter(|_| kind == EntryType::Symlink)
            .map(String::from),
        uid: uid.parse().unwrap_or(0),
        gid: gid.parse().unwrap_or(0),
        metadata: Default::default(),
    })
}

/// Runs `script` (bash, with `args` as `$1...`) as the sandbox's root.
async fn root_exec(
    t: &Target,
    script: &str,
    args: &[&str],
) -> Result<koder_api_types::ExecResult, RpcError> {
    let mut cmd = vec![
        "/bin/bash".to_string(),
        "-c".into(),
        script.into(),
        "koder-e2b".into(),
    ];
    cmd.extend(args.iter().map(|a| a.to_string()));
    let req = ExecRequest {
        cmd: Some(cmd),
        user: Some("root".into()),
        timeout_ms: Some(30_000),
        ..Default::default()
    };
    Ok(t.e2b.manager().exec(&t.who, &t.id, req).await?)
}

async fn make_dir(t: Target, r: MakeDirRequest) -> Result<MakeDirResponse, RpcError> {
    let path = t.user.resolve(&r.path);
    match stat(&t, &path).await {
        Ok(_) => {
            return Err(RpcError::new(
                Code::AlreadyExists,
                format!("{path:?} already exists"),
            ))
        }
        Err(e) if e.code == Code::NotFound => {}
        Err(e) => return Err(e),
    }
    let entry = t
        .e2b
        .manager()
        .make_dir(&t.who, &t.id, &path, Some(t.user.name()))
        .await
        .map_err(|e| match e {
            koder_sessions::Error::Conflict(m) => RpcError::new(Code::AlreadyExists, m),
            other => other.into(),
        })?;
    Ok(MakeDirResponse {
        entry: Some(entry_info(&entry)),
    })
}

async fn move_entry(t: Target, r: MoveRequest) -> Result<MoveResponse, RpcError> {
    let from = t.user.resolve(&r.source);
    let to = t.user.resolve(&r.destination);
    let entry = t.e2b.manager().move_file(&t.who, &t.id, &from, &to).await?;
    Ok(MoveResponse {
        entry: Some(entry_info(&entry)),
    })
}

async fn list_dir(t: Target, r: ListDirRequest) -> Result<ListDirResponse, RpcError> {
    let path = t.user.resolve(&r.path);
    let list = t
        .e2b
        .manager()
        .list_files(&t.who, &t.id, &path, r.depth.max(1))
        .await
        .map_err(|e| match e {
            koder_sessions::Error::Conflict(m) => {
                RpcError::invalid(format!("{path:?} is not a directory: {m}"))
            }
            other => other.into(),
        })?;
    let entries = list.entries.iter().map(entry_info).collect();
    Ok(ListDirResponse { entries })
}

fn no_watcher(id: &str) -> RpcError {
    RpcError::new(Code::NotFound, format!("watcher {id:?} not found"))
}

async fn open_watch(t: &Target, path: &str, recursive: bool) -> Result<(String, Watch), RpcError> {
    let path = t.user.resolve(path);
    let entry = stat(t, &path).await?;
    if entry.kind != EntryType::Dir {
        return Err(RpcError::invalid(format!("{path:?} is not a directory")));
    }
    let watch = t
        .e2b
        .manager()
        .watch(&t.who, &t.id, &path, recursive)
        .await?;
    Ok((path, watch))
}

async fn create_watcher(
    t: Target,
    r: CreateWatcherRequest,
) -> Result<CreateWatcherResponse, RpcError> {
    let (root, mut watch) = open_watch(&t, &r.path, r.recursive).await?;
    let buf = Arc::new(Mutex::new(WatchBuf::default()));
    let sink = buf.clone();
    let describe = r.include_entry.then(|| t.clone());
    let flush = watch.flusher();
    let task = tokio::spawn(async move {
        loop {
            match watch.next().await {
                Ok(event) => {
                    let evs = fs_events(&root, event.kind, &event.path, event.from.as_deref());
                    let evs = described(describe.as_ref(), &root, evs).await;
                    let mut b = sink.lock();
                    for ev in evs {
                        b.push(ev);
                    }
                }
                Err(e) => {
                    sink.lock().error = Some(RpcError::new(
                        Code::Unavailable,
                        format!("the watch ended: {e}"),
                    ));
                    return;
                }
            }
        }
    });
    let id = uuid::Uuid::new_v4().simple().to_string();
    t.ctx
        .watchers
        .lock()
        .insert(id.clone(), Watcher { buf, flush, task });
    Ok(CreateWatcherResponse { watcher_id: id })
}

async fn watch_dir(t: Target, r: WatchDirRequest) -> Result<Response, RpcError> {
    let (root, watch) = open_watch(&t, &r.path, r.recursive).await?;
    let (sink, resp) = connect::stream_response();
    let describe = r.include_entry.then(|| t.clone());
    tokio::spawn(relay_watch(sink, root, watch, describe));
    Ok(resp)
}

/// With `include_entry`, every event but a removal or a rename away carries its entry as it
/// is when the event arrives (stat once per name of a batch).
async fn described(
    t: Option<&Target>,
    root: &str,
    mut evs: Vec<FilesystemEvent>,
) -> Vec<FilesystemEvent> {
    let Some(t) = t else {
        return evs;
    };
    let mut last: Option<(String, Option<EntryInfo>)> = None;
    for ev in &mut evs {
        let gone = [EventType::Remove, EventType::Rename].map(i32::from);
        if gone.contains(&ev.r#type) {
            continue;
        }
        let entry = match &last {
            Some((name, entry)) if *name == ev.name => entry.clone(),
            _ => {
                let abs = if root == "/" {
                    format!("/{}", ev.name)
                } else {
                    format!("{root}/{}", ev.name)
                };
                let entry = stat(t, &abs).await.ok().map(|e| entry_info(&e));
                last = Some((ev.name.clone(), entry.clone()));
                entry
            }
        };
        ev.entry = entry;
    }
    evs
}

/// Events of an operation that finished before a poll may still be on their way from the
/// sandbox's agent (inotify there, then the agent's stream): a poll waits for the watch's
/// barrier, so it sees everything that happened before it, as envd's in-process watcher would,
/// and waits no longer than that takes. Bounded, for an agent too busy to answer.
async fn settled(flush: &WatchFlush) {
    const LONGEST: Duration = Duration::from_secs(2);
    let _ = tokio::time::timeout(LONGEST, flush.flush()).await;
}

async fn relay_watch(sink: Sink, root: String, mut watch: Watch, describe: Option<Target>) {
    if !sink.send(&watch_message(Event::Start(StartEvent {}))).await {
        return;
    }
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + WATCH_KEEPALIVE,
        WATCH_KEEPALIVE,
    );
    loop {
        tokio::select! {
            got = watch.next() => match got {
                Ok(event) => {
                    let evs = fs_events(&root, event.kind, &event.path, event.from.as_deref());
                    for ev in described(describe.as_ref(), &root, evs).await {
                        if !sink.send(&watch_message(Event::Filesystem(ev))).await {
                            return;
                        }
                    }
                }
                Err(e) => {
                    sink.end(Some(RpcError::new(Code::Unavailable, format!("the watch ended: {e}")))).await;
                    return;
                }
            },
            _ = tick.tick() => {
                if !sink.send(&watch_message(Event::Keepalive(KeepAlive {}))).await {
                    return;
                }
            }
            () = sink.closed() => return,
        }
    }
}

fn watch_message(event: Event) -> WatchDirResponse {
    WatchDirResponse { event: Some(event) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_targets_resolve_against_the_links_directory() {
        assert_eq!(link_target("/home/user/d/l", "t.txt"), "/home/user/d/t.txt");
        assert_eq!(link_target("/home/user/d/l", "../x/./y"), "/home/user/x/y");
        assert_eq!(link_target("/home/user/d/l", "/etc//passwd"), "/etc/passwd");
        // `..` never climbs above the sandbox's root.
        assert_eq!(link_target("/l", "../../../etc"), "/etc");
        assert_eq!(link_target("/l", ""), "/");
    }
}
