//! The fake agent: serves the protocol on the far end of an in-memory duplex.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use koder_agent_protocol::flow::{self, SendCredit};
use koder_agent_protocol::{
    AgentClient, AgentError, Entry, EntryKind, ErrorCode, ExecRequest, ExitInfo, Frame, FrameCodec,
    FromAgent, HealthInfo, ToAgent, WriteFileRequest, CHUNK_BYTES, MAX_LIST_ENTRIES,
    MAX_PATH_BYTES, PROTOCOL_VERSION,
};
use koder_runtime::Usage;
use parking_lot::Mutex;
use tokio::io::DuplexStream;
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, FramedWrite};
use tokio_util::sync::CancellationToken;

/// Maps an exec request to its scripted outcome; `Err` is what the agent answers instead of
/// starting it (a spawn failure, say).
pub type ExecScript = Arc<dyn Fn(&ExecRequest) -> Result<Scripted, AgentError> + Send + Sync>;

const SIGKILL: i32 = 9;
const DEFAULT_DISK_MIB: u64 = 1024;
const WORKDIR: &str = "/workspace";

/// What one scripted exec does: prints its output at once, runs for `run_for` (ended early by
/// its timeout, a signal, `KillAll` or a cancel), then exits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scripted {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit_code: i32,
    pub run_for: Duration,
    /// Dies of SIGKILL with the sandbox's OOM-kill counter bumped, as the cgroup reports it.
    pub oom_kill: bool,
    /// Bumps the pids-limit hit counter (a fork that failed) and exits with `exit_code`.
    pub pids_limit_hit: bool,
}

impl Scripted {
    pub fn exit(code: i32) -> Self {
        Self {
            exit_code: code,
            ..Self::default()
        }
    }

    pub fn stdout(mut self, out: impl Into<Vec<u8>>) -> Self {
        self.stdout = out.into();
        self
    }

    pub fn stderr(mut self, err: impl Into<Vec<u8>>) -> Self {
        self.stderr = err.into();
        self
    }

    /// A few programs, also as `sh -c`/`bash -c "<words>"`: `echo`, `true`, `false`, `exit N`,
    /// `sleep SECONDS`, `cat` (prints stdin). Other programs fail to spawn; other commands
    /// under a shell exit 127, as a real shell would.
    pub fn builtin(argv: &[String], stdin: &[u8]) -> Result<Self, AgentError> {
        let shell = argv.len() == 3
            && argv[1] == "-c"
            && ["sh", "bash"].iter().any(|s| argv[0].ends_with(s));
        let words: Vec<&str> = if shell {
            argv[2].split_whitespace().collect()
        } else {
            argv.iter().map(String::as_str).collect()
        };
        let (program, args) = words.split_first().map_or(("", &[][..]), |(p, a)| (*p, a));
        Ok(match program.rsplit('/').next().unwrap_or(program) {
            "echo" => Self::exit(0).stdout(format!("{}\n", args.join(" "))),
            "true" => Self::exit(0),
            "false" => Self::exit(1),
            "cat" => Self::exit(0).stdout(stdin),
            "exit" => match args.first().map_or(Ok(0), |n| n.parse::<i32>()) {
                Ok(code) => Self::exit(code),
                Err(_) => Self::exit(2).stderr("exit: numeric argument required\n"),
            },
            "sleep" => match args.first().and_then(|s| s.parse::<f64>().ok()) {
                Some(secs) if secs.is_finite() && secs >= 0.0 => Self {
                    run_for: Duration::from_secs_f64(secs),
                    ..Self::exit(0)
                },
                _ => Self::exit(1).stderr("sleep: invalid time interval\n"),
            },
            other if shell => Self::exit(127).stderr(format!("{other}: command not found\n")),
            other => {
                return Err(AgentError::new(
                    ErrorCode::SpawnFailed,
                    format!("{other}: no such program"),
                ))
            }
        })
    }
}

#[derive(Debug, Clone)]
enum Node {
    Dir,
    File { data: Vec<u8>, mode: u32 },
}

/// What the fake agent and the test share.
pub(crate) struct State {
    script: ExecScript,
    disk_bytes: u64,
    pub(crate) usage: Mutex<Usage>,
    pub(crate) dead: CancellationToken,
    files: Mutex<BTreeMap<String, Node>>,
    /// Cancelled and replaced by `KillAll`: every exec running then ends.
    kill_all: Mutex<CancellationToken>,
    running: AtomicU32,
    next_pid: AtomicU32,
}

impl State {
    pub(crate) fn file(&self, path: &str) -> Option<Vec<u8>> {
        match self.files.lock().get(&normalize(path).ok()?) {
            Some(Node::File { data, .. }) => Some(data.clone()),
            _ => None,
        }
    }

    pub(crate) fn put_file(&self, path: &str, data: &[u8]) {
        let req = WriteFileRequest {
            path: path.into(),
            mode: None,
            create_parents: true,
            max_bytes: None,
            owner: None,
            metadata: Vec::new(),
        };
        if let Ok(path) = self.prepare_write(&req) {
            self.commit(path, data.to_vec(), None);
        }
    }

    /// The normalised path of an upload, its parents made if asked for.
    fn prepare_write(&self, req: &WriteFileRequest) -> Result<String, AgentError> {
        let path = normalize(&req.path)?;
        let mut files = self.files.lock();
        if matches!(files.get(&path), Some(Node::Dir)) {
            return Err(AgentError::new(ErrorCode::IsADirectory, path));
        }
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        let mut parent = String::new();
        for part in parts.iter().take(parts.len().saturating_sub(1)) {
            parent.push('/');
            parent.push_str(part);
            match files.get(&parent) {
                Some(Node::Dir) => {}
                Some(Node::File { .. }) => {
                    return Err(AgentError::new(ErrorCode::NotADirectory, parent))
                }
                None if req.create_parents => {
                    files.insert(parent.clone(), Node::Dir);
                }
                None => return Err(AgentError::new(ErrorCode::NotFound, parent)),
            }
        }
        Ok(path)
    }

    fn commit(&self, path: String, data: Vec<u8>, mode: Option<u32>) -> Entry {
        let node = Node::File {
            data,
            mode: mode.unwrap_or(0o644),
        };
        let entry = entry(&path, &node);
        self.files.lock().insert(path, node);
        entry
    }

    fn lookup(&self, path: &str) -> Result<(String, Node), AgentError> {
        let path = normalize(path)?;
        let node = self.files.lock().get(&path).cloned();
        node.map(|n| (path.clone(), n))
            .ok_or_else(|| AgentError::new(ErrorCode::NotFound, path))
    }
}

/// A client connected to a new fake agent, and the state they share.
pub(crate) fn start(script: ExecScript, disk_mib: Option<u64>) -> (AgentClient, Arc<State>) {
    let files = ["/", "/tmp", "/home", "/home/user", WORKDIR]
        .map(|d| (d.to_string(), Node::Dir))
        .into();
    let state = Arc::new(State {
        script,
        disk_bytes: disk_mib.unwrap_or(DEFAULT_DISK_MIB) << 20,
        usage: Mutex::default(),
        dead: CancellationToken::new(),
        files: Mutex::new(files),
        kill_all: Mutex::default(),
        running: AtomicU32::new(0),
        next_pid: AtomicU32::new(100),
    });
    let (ours, theirs) = tokio::io::duplex(256 * 1024);
    tokio::spawn(serve(theirs, state.clone()));
    let (r, w) = tokio::io::split(ours);
    (AgentClient::new(r, w), state)
}

/// Frames in, one task per operation, frames out; ends (closing the duplex) when the client
/// hangs up or the test kills the agent.
async fn serve(io: DuplexStream, state: Arc<State>) {
    let (r, w) = tokio::io::split(io);
    let mut frames = FramedRead::new(r, FrameCodec::<ToAgent, FromAgent>::default());
    let mut sink = FramedWrite::new(w, FrameCodec::<ToAgent, FromAgent>::default());
    let (out_tx, mut out_rx) = mpsc::channel::<Frame<FromAgent>>(64);
    // Unbounded: this loop must never wait for an operation that itself waits for this loop to
    // send its output. Follow-ups are few and tests are short, so their credit is granted back
    // as they arrive.
    let mut follow_ups: HashMap<u64, (mpsc::UnboundedSender<ToAgent>, Arc<SendCredit>)> =
        HashMap::new();
    loop {
        tokio::select! {
            _ = state.dead.cancelled() => break,
            Some(frame) = out_rx.recv() => {
                if sink.send(frame).await.is_err() {
                    break;
                }
            }
            frame = frames.next() => {
                let Some(Ok(Frame { stream, msg })) = frame else { break };
                if msg.is_follow_up() {
                    let Some((tx, credit)) = follow_ups.get(&stream) else { continue };
                    let granted = match msg {
                        ToAgent::Credit(units) => {
                            credit.grant(units);
                            continue;
                        }
                        ToAgent::Cancel => {
                            credit.lift();
                            0
                        }
                        ref msg => flow::cost(msg),
                    };
                    let _ = tx.send(msg);
                    if granted > 0 {
                        let msg = FromAgent::Credit(granted);
                        if sink.send(Frame { stream, msg }).await.is_err() {
                            break;
                        }
                    }
                    continue;
                }
                follow_ups.retain(|_, (tx, _)| !tx.is_closed());
                let (tx, rx) = mpsc::unbounded_channel();
                let credit = Arc::new(SendCredit::default());
                follow_ups.insert(stream, (tx, credit.clone()));
                let out = Out { stream, tx: out_tx.clone(), credit };
                tokio::spawn(operation(state.clone(), msg, rx, out));
            }
        }
    }
}

struct Out {
    stream: u64,
    tx: mpsc::Sender<Frame<FromAgent>>,
    credit: Arc<SendCredit>,
}

impl Out {
    /// Sends within the stream's credit, as a real agent does.
    async fn send(&self, msg: FromAgent) {
        // The agent is gone or the client hung up: nobody is left to tell.
        let Ok(permit) = self.credit.reserve(flow::cost(&msg)).await else {
            return;
        };
        let frame = Frame {
            stream: self.stream,
            msg,
        };
        if self.tx.send(frame).await.is_ok() {
            permit.forget();
        }
    }
}

type FollowUps = mpsc::UnboundedReceiver<ToAgent>;

async fn operation(state: Arc<State>, msg: ToAgent, follow_ups: FollowUps, out: Out) {
    let answer = match msg {
        ToAgent::Health => Ok(FromAgent::Health(HealthInfo {
            protocol_version: PROTOCOL_VERSION,
            agent_version: "memory".into(),
            running_execs: state.running.load(Ordering::SeqCst),
            ..HealthInfo::default()
        })),
        ToAgent::Exec(req) => return exec(&state, req, follow_ups, &out).await,
        ToAgent::WriteFile(req) => return write_file(&state, req, follow_ups, &out).await,
        ToAgent::ReadFile(req) => return read_file(&state, &req.path, req.max_bytes, &out).await,
        ToAgent::Stat { path } => state
            .lookup(&path)
            .map(|(path, node)| FromAgent::Entry(entry(&path, &node))),
        ToAgent::List { path, depth } => list(&state, &path, depth),
        ToAgent::DiskUsage => Ok(FromAgent::DiskUsage {
            total_bytes: state.disk_bytes,
            used_bytes: used_bytes(&state),
        }),
        ToAgent::CaptureLayer { max_bytes, .. } => {
            return capture(&state, max_bytes, &out).await;
        }
        ToAgent::KillAll => {
            let token = std::mem::take(&mut *state.kill_all.lock());
            token.cancel();
            Ok(FromAgent::KilledAll {
                processes: state.running.load(Ordering::SeqCst),
            })
        }
        other => Err(AgentError::new(
            ErrorCode::InvalidRequest,
            format!("the in-memory agent does not serve {}", other.kind()),
        )),
    };
    out.send(answer.unwrap_or_else(FromAgent::Error)).await;
}

/// The fake's layer format: its whole file map (a fake has no image below it), postcard-encoded.
/// Opaque to the session manager, like a real agent's tar.
type Layer = Vec<(String, Option<(Vec<u8>, u32)>)>;

async fn capture(state: &State, max_bytes: u64, out: &Out) {
    let layer: Layer = state
        .files
        .lock()
        .iter()
        .map(|(path, node)| {
            let content = match node {
                Node::Dir => None,
                Node::File { data, mode } => Some((data.clone(), *mode)),
            };
            (path.clone(), content)
        })
        .collect();
    let bytes: u64 = layer
        .iter()
        .filter_map(|(_, c)| c.as_ref().map(|(d, _)| d.len() as u64))
        .sum();
    if bytes > max_bytes {
        let err = AgentError::new(ErrorCode::TooLarge, format!("{bytes} bytes > {max_bytes}"));
        return out.send(FromAgent::Error(err)).await;
    }
    let encoded = match postcard::to_allocvec(&layer) {
        Ok(e) => e,
        Err(e) => {
            let err = AgentError::new(ErrorCode::Io, e.to_string());
            return out.send(FromAgent::Error(err)).await;
        }
    };
    for chunk in encoded.chunks(CHUNK_BYTES) {
        out.send(FromAgent::FileChunk(chunk.to_vec())).await;
    }
    out.send(FromAgent::LayerEnd {
        entries: layer.len() as u64,
        bytes,
    })
    .await;
}

/// Stacks a layer [`capture`] made onto the file map.
pub(crate) fn apply_layer(state: &State, raw: &[u8]) -> Result<(), String> {
    let layer: Layer = postcard::from_bytes(raw).map_err(|e| e.to_string())?;
    let mut files = state.files.lock();
    for (path, content) in layer {
        let node = match content {
            None => Node::Dir,
            Some((data, mode)) => Node::File { data, mode },
        };
        files.insert(path, node);
    }
    Ok(())
}

/// Counts a running exec for `Health` and `KillAll` while it lives.
struct Running<'a>(&'a AtomicU32);

impl<'a> Running<'a> {
    fn new(count: &'a AtomicU32) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(count)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

enum Ending {
    Ran,
    TimedOut,
    Signalled(i32),
    Cancelled,
}

async fn exec(state: &State, req: ExecRequest, mut follow_ups: FollowUps, out: &Out) {
    let scripted = match (state.script)(&req) {
        Ok(s) => s,
        Err(e) => return out.send(FromAgent::Error(e)).await,
    };
    let _running = Running::new(&state.running);
    let killed = state.kill_all.lock().clone();
    let pid = state.next_pid.fetch_add(1, Ordering::SeqCst);
    if !req.quiet {
        out.send(FromAgent::Started { pid }).await;
    }
    let limit = usize::try_from(req.output_limit_bytes).unwrap_or(usize::MAX);
    let mut exit = ExitInfo {
        pid: Some(pid),
        ..Default::default()
    };
    for (data, truncated, stdout) in [
        (&scripted.stdout, &mut exit.stdout_truncated, true),
        (&scripted.stderr, &mut exit.stderr_truncated, false),
    ] {
        *truncated = data.len() > limit;
        for chunk in data[..data.len().min(limit)].chunks(CHUNK_BYTES) {
            let msg = if stdout {
                FromAgent::Stdout(chunk.to_vec())
            } else {
                FromAgent::Stderr(chunk.to_vec())
            };
            out.send(msg).await;
        }
    }
    let timeout = req.timeout_ms.map(Duration::from_millis);
    let ending = run(&scripted, timeout, &killed, &mut follow_ups).await;
    match ending {
        Ending::Cancelled => return,
        Ending::Ran if scripted.oom_kill => {
            state.usage.lock().oom_kills += 1;
            exit.signal = Some(SIGKILL);
        }
        Ending::Ran => exit.exit_code = Some(scripted.exit_code),
        Ending::TimedOut => {
            exit.timed_out = true;
            exit.signal = Some(SIGKILL);
        }
        Ending::Signalled(signal) => exit.signal = Some(signal),
    }
    if scripted.pids_limit_hit {
        state.usage.lock().pids_max_hits += 1;
    }
    out.send(FromAgent::Exited(exit)).await;
}

async fn run(
    scripted: &Scripted,
    timeout: Option<Duration>,
    killed: &CancellationToken,
    follow_ups: &mut FollowUps,
) -> Ending {
    let (wait, ending) = match timeout {
        Some(t) if t < scripted.run_for => (t, Ending::TimedOut),
        _ => (scripted.run_for, Ending::Ran),
    };
    let sleep = tokio::time::sleep(wait);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            _ = &mut sleep => return ending,
            _ = killed.cancelled() => return Ending::Signalled(SIGKILL),
            msg = follow_ups.recv() => match msg {
                Some(ToAgent::Signal(signal)) => return Ending::Signalled(signal),
                Some(ToAgent::Cancel) | None => return Ending::Cancelled,
                Some(_) => {}
            },
        }
    }
}

async fn write_file(state: &State, req: WriteFileRequest, mut follow_ups: FollowUps, out: &Out) {
    let path = match state.prepare_write(&req) {
        Ok(p) => p,
        Err(e) => return out.send(FromAgent::Error(e)).await,
    };
    let mut data = Vec::new();
    while let Some(msg) = follow_ups.recv().await {
        match msg {
            ToAgent::FileChunk(chunk) => {
                data.extend_from_slice(&chunk);
                if req.max_bytes.is_some_and(|max| data.len() as u64 > max) {
                    let e = AgentError::new(ErrorCode::TooLarge, "upload exceeds its limit");
                    return out.send(FromAgent::Error(e)).await;
                }
            }
            ToAgent::FileEnd => {
                let entry = state.commit(path, data, req.mode);
                return out.send(FromAgent::Entry(entry)).await;
            }
            // A cancelled upload leaves nothing.
            ToAgent::Cancel => return,
            _ => {}
        }
    }
}

async fn read_file(state: &State, path: &str, max_bytes: Option<u64>, out: &Out) {
    let data = match state.lookup(path) {
        Ok((_, Node::File { data, .. })) => data,
        Ok((path, Node::Dir)) => {
            let e = AgentError::new(ErrorCode::IsADirectory, path);
            return out.send(FromAgent::Error(e)).await;
        }
        Err(e) => return out.send(FromAgent::Error(e)).await,
    };
    if max_bytes.is_some_and(|max| data.len() as u64 > max) {
        let e = AgentError::new(ErrorCode::TooLarge, format!("{} bytes", data.len()));
        return out.send(FromAgent::Error(e)).await;
    }
    for chunk in data.chunks(CHUNK_BYTES) {
        out.send(FromAgent::FileChunk(chunk.to_vec())).await;
    }
    out.send(FromAgent::FileEnd).await;
}

/// Entries under `path` down to `depth` levels (0 and 1 mean direct children), sorted by path.
fn list(state: &State, path: &str, depth: u32) -> Result<FromAgent, AgentError> {
    let (dir, node) = state.lookup(path)?;
    if !matches!(node, Node::Dir) {
        return Err(AgentError::new(ErrorCode::NotADirectory, dir));
    }
    let prefix = if dir == "/" {
        "/".to_string()
    } else {
        format!("{dir}/")
    };
    let max = depth.max(1) as usize;
    let files = state.files.lock();
    let mut entries: Vec<Entry> = files
        .iter()
        .filter(|(p, _)| {
            p.strip_prefix(&prefix)
                .is_some_and(|rest| !rest.is_empty() && rest.split('/').count() <= max)
        })
        .map(|(p, n)| entry(p, n))
        .collect();
    let truncated = entries.len() > MAX_LIST_ENTRIES;
    entries.truncate(MAX_LIST_ENTRIES);
    Ok(FromAgent::Entries { entries, truncated })
}

fn used_bytes(state: &State) -> u64 {
    state
        .files
        .lock()
        .values()
        .map(|n| match n {
            Node::File { data, .. } => data.len() as u64,
            Node::Dir => 0,
        })
        .sum()
}

/// The absolute, `.`/`..`-free form of a sandbox path; relative paths start at the workdir and
/// `..` stops at `/`, as with `RESOLVE_IN_ROOT`.
fn normalize(path: &str) -> Result<String, AgentError> {
    if path.is_empty() || path.len() > MAX_PATH_BYTES || path.contains('\0') {
        return Err(AgentError::new(ErrorCode::InvalidPath, "invalid path"));
    }
    let full = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{WORKDIR}/{path}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in full.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

fn entry(path: &str, node: &Node) -> Entry {
    let name = path
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty())
        .unwrap_or("/");
    let (kind, size, mode) = match node {
        Node::Dir => (EntryKind::Dir, 0, 0o755),
        Node::File { data, mode } => (EntryKind::File, data.len() as u64, *mode),
    };
    Entry {
        name: name.into(),
        path: path.into(),
        kind,
        size,
        mode,
        modified_ms: 0,
        symlink_target: None,
        uid: 0,
        gid: 0,
        metadata: Vec::new(),
    }
}
