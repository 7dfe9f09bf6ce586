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
use koder_sessions::{FsEventKind, Watch};
use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::connect::{self, Code, RpcError, Sink};
use crate::envd::{split_parent, Target};
use crate::proto::{
    entry_info, ListDirRequest, MoveRequest, PathRequest, WatchRequest, WatcherRequest,
};

/// Events a polled watcher keeps between two polls (older ones are dropped).
const MAX_WATCHER_EVENTS: usize = 10_000;
const WATCH_KEEPALIVE: Duration = Duration::from_secs(50);
/// Names of the agent's in-progress uploads (koder-agent's `TEMP_PREFIX`).
const UPLOAD_TEMP_PREFIX: &str = ".koder-upload-";

pub async fn rpc(
    Path(method): Path<String>,
    t: Target,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match method.as_str() {
        "Stat" => {
            connect::unary(&headers, body, |r: PathRequest| async move {
                let path = t.user.resolve(&r.path);
                Ok(json!({"entry": entry_info(&stat(&t, &path).await?)}))
            })
            .await
        }
        "MakeDir" => connect::unary(&headers, body, |r: PathRequest| make_dir(t, r)).await,
        "Move" => connect::unary(&headers, body, |r: MoveRequest| move_entry(t, r)).await,
        "ListDir" => connect::unary(&headers, body, |r: ListDirRequest| list_dir(t, r)).await,
        "Remove" => {
            connect::unary(&headers, body, |r: PathRequest| async move {
                let path = t.user.resolve(&r.path);
                // envd removes like `rm -rf`.
                t.e2b
                    .manager()
                    .remove_file(&t.who, &t.id, &path, true)
                    .await?;
                Ok(json!({}))
            })
            .await
        }
        "WatchDir" => {
            connect::server_stream(&headers, body, |r: WatchRequest| watch_dir(t, r)).await
        }
        "CreateWatcher" => {
            connect::unary(&headers, body, |r: WatchRequest| create_watcher(t, r)).await
        }
        "GetWatcherEvents" => {
            connect::unary(&headers, body, |r: WatcherRequest| async move {
                let w = t
                    .ctx
                    .watchers
                    .lock()
                    .get(&r.watcher_id)
                    .map(|w| w.buf.clone());
                let buf = w.ok_or_else(|| no_watcher(&r.watcher_id))?;
                let mut b = buf.lock();
                if b.events.is_empty() {
                    if let Some(e) = b.error.take() {
                        return Err(e);
                    }
                }
                Ok(json!({"events": std::mem::take(&mut b.events)}))
            })
            .await
        }
        "RemoveWatcher" => {
            connect::unary(&headers, body, |r: WatcherRequest| async move {
                let w = t.ctx.watchers.lock().remove(&r.watcher_id);
                w.ok_or_else(|| no_watcher(&r.watcher_id))?.stop();
                Ok(json!({}))
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

async fn make_dir(t: Target, r: PathRequest) -> Result<Value, RpcError> {
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
    Ok(json!({"entry": entry_info(&entry)}))
}

async fn move_entry(t: Target, r: MoveRequest) -> Result<Value, RpcError> {
    let from = t.user.resolve(&r.source);
    let to = t.user.resolve(&r.destination);
    let entry = t.e2b.manager().move_file(&t.who, &t.id, &from, &to).await?;
    Ok(json!({"entry": entry_info(&entry)}))
}

async fn list_dir(t: Target, r: ListDirRequest) -> Result<Value, RpcError> {
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
    let entries: Vec<Value> = list.entries.iter().map(entry_info).collect();
    Ok(json!({ "entries": entries }))
}

/// A polled watcher (`CreateWatcher`/`GetWatcherEvents`/`RemoveWatcher`).
pub struct Watcher {
    buf: Arc<Mutex<WatchBuf>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct WatchBuf {
    events: Vec<Value>,
    error: Option<RpcError>,
}

impl Watcher {
    /// Ends the watch (dropping the agent stream cancels it in the sandbox).
    pub fn stop(self) {
        self.task.abort();
    }
}

fn no_watcher(id: &str) -> RpcError {
    RpcError::new(Code::NotFound, format!("watcher {id:?} not found"))
}

async fn open_watch(t: &Target, r: &WatchRequest) -> Result<(String, Watch), RpcError> {
    let path = t.user.resolve(&r.path);
    let entry = stat(t, &path).await?;
    if entry.kind != EntryType::Dir {
        return Err(RpcError::invalid(format!("{path:?} is not a directory")));
    }
    let watch = t
        .e2b
        .manager()
        .watch(&t.who, &t.id, &path, r.recursive)
        .await?;
    Ok((path, watch))
}

async fn create_watcher(t: Target, r: WatchRequest) -> Result<Value, RpcError> {
    let (root, mut watch) = open_watch(&t, &r).await?;
    let buf = Arc::new(Mutex::new(WatchBuf::default()));
    let sink = buf.clone();
    let task = tokio::spawn(async move {
        loop {
            match watch.next().await {
                Ok(event) => {
                    let mut b = sink.lock();
                    for ev in fs_events(&root, event.kind, &event.path, event.from.as_deref()) {
                        if b.events.len() >= MAX_WATCHER_EVENTS {
                            b.events.remove(0);
                        }
                        b.events.push(ev);
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
        .insert(id.clone(), Watcher { buf, task });
    Ok(json!({"watcherId": id}))
}

async fn watch_dir(t: Target, r: WatchRequest) -> Result<Response, RpcError> {
    let (root, watch) = open_watch(&t, &r).await?;
    let (sink, resp) = connect::stream_response();
    tokio::spawn(relay_watch(sink, root, watch));
    Ok(resp)
}

async fn relay_watch(sink: Sink, root: String, mut watch: Watch) {
    if !sink.send(&json!({"start": {}})).await {
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
                    for ev in fs_events(&root, event.kind, &event.path, event.from.as_deref()) {
                        if !sink.send(&json!({"filesystem": ev})).await {
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
                if !sink.send(&json!({"keepalive": {}})).await {
                    return;
                }
            }
            () = sink.closed() => return,
        }
    }
}

/// envd's (fsnotify's) events for one agent event: names relative to the watched directory;
/// a rename is RENAME of the old name and CREATE of the new one.
fn fs_events(root: &str, kind: FsEventKind, path: &str, from: Option<&str>) -> Vec<Value> {
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
    let from = from.filter(|f| !temp(f));
    let rel = |p: &str| -> String {
        let prefix = if root == "/" {
            "/".to_string()
        } else {
            format!("{root}/")
        };
        p.strip_prefix(&prefix).unwrap_or(p).to_string()
    };
    let ev = |name: String, ty: &str| json!({"name": name, "type": ty});
    match kind {
        FsEventKind::Created => vec![ev(rel(path), "EVENT_TYPE_CREATE")],
        FsEventKind::Modified => vec![ev(rel(path), "EVENT_TYPE_WRITE")],
        FsEventKind::Deleted => vec![ev(rel(path), "EVENT_TYPE_REMOVE")],
        FsEventKind::Renamed => {
            let mut out = Vec::new();
            if let Some(from) = from {
                out.push(ev(rel(from), "EVENT_TYPE_RENAME"));
            }
            out.push(ev(rel(path), "EVENT_TYPE_CREATE"));
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_events_are_relative_and_renames_pair() {
        let evs = fs_events(
            "/home/user/d",
            FsEventKind::Created,
            "/home/user/d/sub/a.txt",
            None,
        );
        assert_eq!(
            evs,
            vec![json!({"name": "sub/a.txt", "type": "EVENT_TYPE_CREATE"})]
        );
        let evs = fs_events("/", FsEventKind::Modified, "/x", None);
        assert_eq!(evs[0]["name"], "x");
        assert!(fs_events("/d", FsEventKind::Created, "/d/.koder-upload-1-0-ab", None).is_empty());
        let evs = fs_events(
            "/d",
            FsEventKind::Renamed,
            "/d/f",
            Some("/d/.koder-upload-1-0-ab"),
        );
        assert_eq!(evs, vec![json!({"name": "f", "type": "EVENT_TYPE_CREATE"})]);
        let evs = fs_events("/d", FsEventKind::Renamed, "/d/new", Some("/d/old"));
        assert_eq!(
            evs,
            vec![
                json!({"name": "old", "type": "EVENT_TYPE_RENAME"}),
                json!({"name": "new", "type": "EVENT_TYPE_CREATE"}),
            ]
        );
    }
}
