//! Messages exchanged on one agent connection.
//!
//! Every frame carries a stream id chosen by the daemon; all messages of one operation (an exec,
//! a file transfer, ...) share it, so many operations run concurrently on one connection.

use serde::{Deserialize, Serialize};

/// Version of this protocol; the agent reports it in [`HealthInfo`] and the client refuses an
/// agent speaking another. 2: per-stream credit (`Credit`, see [`crate::flow`]). 3: file
/// metadata (`Entry::metadata`, `WriteFileRequest::metadata`), watch barriers (`WatchFlush`).
/// 4: trace context of an exec (`ExecRequest::trace`) and what the agent timed of it
/// (`ExitInfo::timing`). 5: the same for a context run (`ContextRun::trace`,
/// `RunOutcome::timing`); execs that outlive their connection (`ExecRequest::detached`).
/// 6: execs awaited to their end announce no start (`ExecRequest::quiet`, `ExitInfo::pid`).
/// 7: a result's chart (`RichResult::chart`). 8: a result's PDF, JavaScript and other MIME
/// types (`RichResult::pdf`, `javascript`, `extra`).
pub const PROTOCOL_VERSION: u32 = 8;

/// Largest data chunk of a byte stream (stdout, stdin, relayed bytes) carried in one frame.
pub const CHUNK_BYTES: usize = 64 * 1024;

/// Largest chunk of a file transfer: bigger than [`CHUNK_BYTES`] because a file's bytes are all
/// there at once, so fewer frames (and fewer disk round trips) move the same data.
pub const FILE_CHUNK_BYTES: usize = 256 * 1024;

/// Largest encoded frame either side accepts. Bigger frames end the connection: the peer is
/// broken or hostile, and a length prefix must never make the reader allocate without bound.
pub const MAX_FRAME_BYTES: usize = 1024 * 1024;

/// Longest path accepted anywhere in the protocol (Linux PATH_MAX).
pub const MAX_PATH_BYTES: usize = 4096;

/// Most entries one `List` answer carries before it is cut and flagged as truncated.
pub const MAX_LIST_ENTRIES: usize = 5000;

/// One frame on the wire: a stream id and a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Frame<M> {
    pub stream: u64,
    pub msg: M,
}

/// Daemon → agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToAgent {
    Health,
    Exec(ExecRequest),
    /// More standard input for the exec on this stream.
    Stdin(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Close the standard input of the exec on this stream.
    CloseStdin,
    /// Deliver a signal to the process group of the exec on this stream.
    Signal(i32),
    ReadFile(ReadFileRequest),
    /// Starts an upload; `FileChunk`s follow, then `FileEnd` commits it atomically.
    WriteFile(WriteFileRequest),
    FileChunk(#[serde(with = "serde_bytes")] Vec<u8>),
    FileEnd,
    List {
        path: String,
        depth: u32,
    },
    Stat {
        path: String,
    },
    /// `mkdir -p`; the directories it creates belong to `owner` (sandbox uid, gid) if given.
    MakeDir {
        path: String,
        owner: Option<(u32, u32)>,
    },
    Remove {
        path: String,
        recursive: bool,
    },
    Move {
        from: String,
        to: String,
    },
    /// Size and use of the filesystem holding the sandbox's writable layer.
    DiskUsage,
    /// Starts a process on a new pseudo-terminal: `Started`, output as `Stdout`, input via
    /// `Stdin`, `Resize`, `Signal`, then `Exited`.
    PtyStart(PtyRequest),
    /// Watches a directory: `Done` once watching, then `FsEvent`s until cancelled.
    Watch {
        path: String,
        recursive: bool,
    },
    /// On a watch's stream: send every event of what happened before this arrived (pending
    /// debounce included), then `WatchFlushed` with the same token.
    WatchFlush {
        token: u64,
    },
    /// TCP ports something listens on inside the sandbox → `Ports`.
    ListeningPorts,
    /// Opens a TCP connection to `port` on the sandbox's loopback → `Connected`; bytes then
    /// flow as `Stdin` (to the port) and `Stdout` (from it); `CloseStdin` half-closes;
    /// `Closed` ends it.
    Connect {
        port: u16,
    },
    /// Subscribes to the sandbox's egress: `EgressConnect` for every outgoing TCP connection
    /// and `DnsQuery` for every name lookup; the daemon answers on this same stream with
    /// `EgressDeny` and `DnsAnswer` (an allowed connection is attached with `EgressAttach`).
    EgressSubscribe,
    /// Refuse (reset) the pending connection `conn`.
    EgressDeny {
        conn: u64,
    },
    /// Answer DNS query `id`; no addresses means NXDOMAIN.
    DnsAnswer {
        id: u64,
        addrs: Vec<std::net::IpAddr>,
    },
    /// Relay the pending connection `conn` on this new stream: `Stdout` carries what the
    /// sandbox sends (starting with the bytes peeked to find SNI/Host), `Stdin` what it gets.
    EgressAttach {
        conn: u64,
    },
    /// New window size of the terminal on this stream.
    Resize {
        cols: u16,
        rows: u16,
    },
    /// Starts a long-lived interpreter (code-interpreter context) → `Context`.
    ContextCreate {
        language: String,
        /// Working directory of the interpreter (default: the sandbox's workdir).
        cwd: Option<String>,
        /// Added to the sandbox's environment for this context's interpreter.
        env: Vec<(String, String)>,
        /// The id the context is to have. With one, the create is idempotent: a context of that
        /// id and language that exists already is answered as it is (`cwd` and `env` apply
        /// only to a new one). Without one, the agent names it.
        #[serde(default)]
        context_id: Option<String>,
    },
    /// Runs code in a context: `Stdout`/`Stderr` as printed, then `RunDone`.
    ContextRun {
        context_id: String,
        code: String,
        timeout_ms: Option<u64>,
        /// Set for this run only; the context's environment is as before once it ends.
        env: Vec<(String, String)>,
        /// The W3C trace context of the run's in-sandbox span, given to the code as
        /// `TRACEPARENT` for this run (unless `env` names one).
        trace: Option<TraceContext>,
        /// Added to the sandbox's environment of the `default` context when this run makes
        /// it: the session's variables, which a warm sandbox's agent learns only with its
        /// session.
        #[serde(default)]
        default_env: Vec<(String, String)>,
    },
    ContextList,
    ContextDelete {
        context_id: String,
    },
    /// Kills and restarts a context's interpreter (its state is lost) → `Context`.
    ContextRestart {
        context_id: String,
    },
    /// MicroVM guests only: limits of the guest cgroup every sandbox process runs in → `Done`.
    GuestLimits(GuestLimits),
    /// MicroVM guests only: the guest cgroup's figures → `GuestUsage`.
    GuestUsage,
    /// MicroVM guests only: freeze (`true`) or thaw the guest cgroup → `Done`.
    GuestFreeze(bool),
    /// SIGKILL every process of the sandbox but the agent (a fork bomb, runaway background
    /// jobs); the session lives on and interpreter contexts restart on their next use →
    /// `KilledAll`.
    KillAll,
    /// Streams the sandbox's writable layer (what it changed on top of its image) as a tar:
    /// `FileChunk`s then `LayerEnd`. The caller freezes the sandbox's processes first, so the
    /// capture is of one moment. Refused beyond either bound, before reading file contents.
    CaptureLayer {
        max_bytes: u64,
        max_entries: u64,
    },
    /// Abandon the operation on this stream (an upload is discarded, an exec is killed).
    Cancel,
    /// The daemon consumed this many more cost units of what the agent sent on this stream
    /// ([`crate::flow`]).
    Credit(u32),
}

/// Limits a microVM's agent applies to the cgroup its sandbox processes run in (the VM's own
/// size is the outer bound); `None` leaves a limit as it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestLimits {
    pub memory_bytes: Option<u64>,
    pub pids: Option<u64>,
    /// Thousandths of a vCPU per wall second.
    pub cpu_millis: Option<u32>,
}

/// Counters of a sandbox's cgroup (for a microVM, the guest's; `koder_runtime::Usage` too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestUsage {
    pub memory_current_bytes: u64,
    pub memory_peak_bytes: u64,
    pub oom_kills: u64,
    pub cpu_usage_us: u64,
    pub pids_current: u64,
    pub pids_max_hits: u64,
}

impl ToAgent {
    /// The message's name, for errors and logs (never its payload).
    pub fn kind(&self) -> &'static str {
        match self {
            ToAgent::Health => "Health",
            ToAgent::Exec(_) => "Exec",
            ToAgent::Stdin(_) => "Stdin",
            ToAgent::CloseStdin => "CloseStdin",
            ToAgent::Signal(_) => "Signal",
            ToAgent::ReadFile(_) => "ReadFile",
            ToAgent::WriteFile(_) => "WriteFile",
            ToAgent::FileChunk(_) => "FileChunk",
            ToAgent::FileEnd => "FileEnd",
            ToAgent::List { .. } => "List",
            ToAgent::Stat { .. } => "Stat",
            ToAgent::MakeDir { .. } => "MakeDir",
            ToAgent::Remove { .. } => "Remove",
            ToAgent::Move { .. } => "Move",
            ToAgent::DiskUsage => "DiskUsage",
            ToAgent::PtyStart(_) => "PtyStart",
            ToAgent::Watch { .. } => "Watch",
            ToAgent::WatchFlush { .. } => "WatchFlush",
            ToAgent::ListeningPorts => "ListeningPorts",
            ToAgent::EgressSubscribe => "EgressSubscribe",
            ToAgent::EgressDeny { .. } => "EgressDeny",
            ToAgent::DnsAnswer { .. } => "DnsAnswer",
            ToAgent::EgressAttach { .. } => "EgressAttach",
            ToAgent::Connect { .. } => "Connect",
            ToAgent::Resize { .. } => "Resize",
            ToAgent::ContextCreate { .. } => "ContextCreate",
            ToAgent::ContextRun { .. } => "ContextRun",
            ToAgent::ContextList => "ContextList",
            ToAgent::ContextDelete { .. } => "ContextDelete",
            ToAgent::ContextRestart { .. } => "ContextRestart",
            ToAgent::GuestLimits(_) => "GuestLimits",
            ToAgent::GuestUsage => "GuestUsage",
            ToAgent::GuestFreeze(_) => "GuestFreeze",
            ToAgent::CaptureLayer { .. } => "CaptureLayer",
            ToAgent::KillAll => "KillAll",
            ToAgent::Cancel => "Cancel",
            ToAgent::Credit(_) => "Credit",
        }
    }

    /// Messages that continue an operation rather than start one.
    pub fn is_follow_up(&self) -> bool {
        matches!(
            self,
            ToAgent::Stdin(_)
                | ToAgent::CloseStdin
                | ToAgent::Signal(_)
                | ToAgent::Resize { .. }
                | ToAgent::EgressDeny { .. }
                | ToAgent::DnsAnswer { .. }
                | ToAgent::FileChunk(_)
                | ToAgent::FileEnd
                | ToAgent::WatchFlush { .. }
                | ToAgent::Cancel
                | ToAgent::Credit(_)
        )
    }
}

/// Agent → daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FromAgent {
    Health(HealthInfo),
    Started {
        pid: u32,
    },
    Stdout(#[serde(with = "serde_bytes")] Vec<u8>),
    Stderr(#[serde(with = "serde_bytes")] Vec<u8>),
    Exited(ExitInfo),
    /// File bytes of a `ReadFile`; `FileEnd` follows the last chunk.
    FileChunk(#[serde(with = "serde_bytes")] Vec<u8>),
    FileEnd,
    Entry(Entry),
    Entries {
        entries: Vec<Entry>,
        truncated: bool,
    },
    DiskUsage {
        total_bytes: u64,
        used_bytes: u64,
    },
    FsEvent {
        kind: FsEventKind,
        path: String,
        /// The old path of a rename, when the watcher saw both halves.
        from: Option<String>,
    },
    /// On a watch's stream: every event before the `WatchFlush` of this token was sent.
    WatchFlushed {
        token: u64,
    },
    Ports(Vec<u16>),
    GuestUsage(GuestUsage),
    /// Answer to `KillAll`: how many processes were signalled.
    KilledAll {
        processes: u32,
    },
    /// End of a `CaptureLayer` stream: entries archived and bytes of file content in it.
    LayerEnd {
        entries: u64,
        bytes: u64,
    },
    /// A sandbox process connects to `ip:port`; `sni`/`host` are what its first bytes named.
    EgressConnect {
        conn: u64,
        ip: std::net::IpAddr,
        port: u16,
        sni: Option<String>,
        host: Option<String>,
    },
    DnsQuery {
        id: u64,
        name: String,
        /// 1 = A, 28 = AAAA, other types are answered empty.
        qtype: u16,
    },
    Connected,
    Closed,
    Context(ContextInfo),
    Contexts(Vec<ContextInfo>),
    RunDone(RunOutcome),
    Done,
    Error(AgentError),
    /// The agent consumed this many more cost units of what the daemon sent on this stream
    /// ([`crate::flow`]).
    Credit(u32),
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// argv; `argv[0]` is looked up in `PATH` when it has no slash.
    pub argv: Vec<String>,
    /// Added to (and overriding) the sandbox's default environment.
    pub env: Vec<(String, String)>,
    pub cwd: Option<String>,
    /// Written to stdin first.
    #[serde(with = "serde_bytes")]
    pub stdin: Vec<u8>,
    /// Keep stdin open after `stdin` for `Stdin`/`CloseStdin` messages; otherwise it is closed.
    pub keep_stdin_open: bool,
    /// Hard limit; on expiry the whole process group is killed with SIGKILL.
    pub timeout_ms: Option<u64>,
    /// Bytes forwarded per stream; the rest is read and dropped and the stream flagged truncated.
    pub output_limit_bytes: u64,
    /// Sandbox uid/gid to run as (default 0, the sandbox's own root).
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// The W3C trace context of the in-sandbox work, given to the process as `TRACEPARENT`
    /// (unless `env` names one) so instrumented code joins the trace.
    pub trace: Option<TraceContext>,
    /// Runs on when its stream goes without a word (the connection closed: a microVM saved
    /// with its memory, a daemon gone): only `Cancel`, a signal or the timeout ends it, and
    /// its output is read and dropped once nobody takes it. Otherwise a closed connection
    /// kills it, as `Cancel` does.
    pub detached: bool,
    /// The caller waits for the exit and needs no `Started`: none is sent (one message and one
    /// wake-up less on each side of every exec); the pid comes with `Exited`.
    pub quiet: bool,
}

/// A W3C trace context (`traceparent`, version 00): the span in-sandbox work is a child of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub sampled: bool,
}

impl TraceContext {
    /// The `traceparent` header value.
    pub fn traceparent(&self) -> String {
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        format!(
            "00-{}-{}-{}",
            hex(&self.trace_id),
            hex(&self.span_id),
            if self.sampled { "01" } else { "00" }
        )
    }
}

/// What the agent timed of an exec, on its own monotonic clock (in microseconds): the daemon
/// places it on its own clock by the moment `Exited` arrives, so a guest's clock never
/// matters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecTiming {
    /// From the request's arrival to the process running.
    pub spawn_us: u64,
    /// The process's wall time, from its start to its exit.
    pub run_us: u64,
    /// From the exit to this answer (output still drained).
    pub since_exit_us: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PtyRequest {
    /// The program and its arguments, exec'd directly; empty means the default login shell.
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: Option<String>,
    pub cols: u16,
    pub rows: u16,
    /// Sandbox uid/gid to run as (default 0, the sandbox's own root), as for an exec.
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitInfo {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration_ms: u64,
    /// The exec's timing inside the sandbox (zero for a terminal's process).
    pub timing: ExecTiming,
    /// The process's pid in the sandbox.
    pub pid: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadFileRequest {
    pub path: String,
    /// Refuse (with `TooLarge`) files bigger than this.
    pub max_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteFileRequest {
    pub path: String,
    /// Permission bits of a new file (default 0644).
    pub mode: Option<u32>,
    /// Create missing parent directories.
    pub create_parents: bool,
    /// Abort with `TooLarge` once more than this many bytes arrived.
    pub max_bytes: Option<u64>,
    /// Sandbox `(uid, gid)` owning a new file (default: the agent's, root). A replaced file
    /// keeps its owner.
    pub owner: Option<(u32, u32)>,
    /// The new file's metadata ([`crate::metadata`]), checked by
    /// [`check_metadata`](crate::metadata::check_metadata). The file is new on every upload,
    /// so whatever metadata the file it replaces had is gone.
    pub metadata: Vec<(String, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub name: String,
    pub path: String,
    pub kind: EntryKind,
    pub size: u64,
    pub mode: u32,
    /// Modification time, milliseconds since the Unix epoch.
    pub modified_ms: i64,
    pub symlink_target: Option<String>,
    /// Owner inside the sandbox (0 = root, 1000 = user).
    pub uid: u32,
    pub gid: u32,
    /// The file's metadata ([`crate::metadata`]), sorted by key; always empty for anything
    /// but regular files and directories.
    pub metadata: Vec<(String, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FsEventKind {
    Created,
    Modified,
    Deleted,
    Renamed,
}

/// A code-interpreter context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextInfo {
    pub context_id: String,
    pub language: String,
    pub execution_count: u64,
    pub cwd: String,
}

/// The end of one `ContextRun`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunOutcome {
    /// Rich outputs in display order; the last expression's value has `is_main_result`.
    pub results: Vec<RichResult>,
    pub error: Option<RunError>,
    pub execution_count: u64,
    pub timed_out: bool,
    /// The interpreter was killed (timeout, crash, OOM) and started afresh: state is gone.
    pub restarted: bool,
    pub duration_ms: u64,
    /// The run's timing inside the sandbox: `spawn_us` from the request's arrival to the code
    /// handed to the interpreter (waiting for the context, starting a dead interpreter again),
    /// `run_us` the interpreter's work, `since_exit_us` what came after (a restart).
    pub timing: ExecTiming,
}

/// One displayable value in the representations it offers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RichResult {
    pub is_main_result: bool,
    pub text: Option<String>,
    pub html: Option<String>,
    pub markdown: Option<String>,
    /// JSON text (already serialised by the interpreter).
    pub json: Option<String>,
    /// base64 PNG.
    pub png: Option<String>,
    pub svg: Option<String>,
    /// base64 JPEG.
    pub jpeg: Option<String>,
    /// LaTeX source (`_repr_latex_`: sympy expressions, formulas).
    pub latex: Option<String>,
    /// Tabular data (a pandas DataFrame) as JSON text: each column's name → its values.
    pub data: Option<String>,
    /// The chart a matplotlib figure draws, as JSON text in E2B's `chart` format.
    pub chart: Option<String>,
    /// base64 PDF (`_repr_pdf_`).
    pub pdf: Option<String>,
    /// JavaScript source (`application/javascript`: `IPython.display.Javascript`, Bokeh).
    pub javascript: Option<String>,
    /// The other MIME types a bundle offered (`application/vnd.plotly.v1+json`, ...), as JSON
    /// text of an object from each type to its value (E2B's `extra`).
    pub extra: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunError {
    pub name: String,
    pub value: String,
    pub traceback: String,
}

/// What the agent found itself able to enforce when it set the sandbox up.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthInfo {
    pub protocol_version: u32,
    pub agent_version: String,
    pub uptime_ms: u64,
    pub no_new_privs: bool,
    pub seccomp: bool,
    /// Landlock ABI in force, 0 when the kernel offers none.
    pub landlock_abi: u32,
    pub running_execs: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    NotFound,
    AlreadyExists,
    NotADirectory,
    IsADirectory,
    DirectoryNotEmpty,
    PermissionDenied,
    InvalidPath,
    InvalidRequest,
    NoSpace,
    TooLarge,
    SpawnFailed,
    Io,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct AgentError {
    pub code: ErrorCode,
    pub message: String,
}

impl AgentError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_context_is_written_as_a_w3c_traceparent() {
        let mut cx = TraceContext {
            trace_id: [0x4b; 16],
            span_id: [0, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7],
            sampled: true,
        };
        assert_eq!(
            cx.traceparent(),
            "00-4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b-00f067aa0ba902b7-01"
        );
        cx.sampled = false;
        assert!(cx.traceparent().ends_with("-00"));
    }
}
