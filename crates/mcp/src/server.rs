//! The MCP server: one tool per thing an agent does in a sandbox, each a call (or a few) of the
//! daemon's REST API through `koder-sdk`, authenticated with the configured key.

use std::time::Duration;

use base64::Engine as _;
use futures::StreamExt as _;
use koder_sdk::live::ExecEvent;
use koder_sdk::types::contexts::CreateContext;
use koder_sdk::types::{self, ExecResult, ExecState};
use koder_sdk::Client;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{tool, tool_handler, tool_router, ServerHandler};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::args::{
    CellLanguage, CellTarget, CreateSessionArgs, EventsArgs, ForkArgs, ListFilesArgs, PreviewArgs,
    ReadFileArgs, ReadOutputArgs, RestoreArgs, RunCellArgs, RunCodeArgs, RunCommandArgs,
    SessionArgs, SnapshotArgs, StopProcessArgs, WriteFileArgs,
};
use cell::CellView;

mod cell;
use crate::reply::{answer, input_schema, tail, Args, ToolError, CANCELLED};

/// Output of one stream kept in a tool result (the tail: that is where errors are). The daemon
/// bounds what it keeps too; this keeps a model's context from filling with one run's output.
pub const MAX_STREAM_BYTES: usize = 64 * 1024;

const INSTRUCTIONS: &str = "Run untrusted code safely in koder-sandbox sessions (isolated \
Linux sandboxes). Create a session with create_session, then run_code (python, node, bash) or \
run_command in it, or run_cell for notebook-style work whose variables persist (figures come \
back as images), move files with write_file / read_file / list_files, save and restore a \
session's files with snapshot_session / restore_session and copy a session with fork_session, \
start servers or long jobs with start_process and read_process_output, and get_preview_url for a web server it \
listens on. Results carry stdout, stderr, exit_code and a verdict (SANDBOX-EXEC-TIMEOUT, \
SANDBOX-EXEC-KILLED-OOM, ...) when the sandbox stopped the program. Sessions expire on their \
own; kill_session ends one at once, and session_events tells what happened to one (why it \
stopped, which programs the sandbox killed), also after it ended. Failures are tool errors \
'SANDBOX-CODE: message'.";

/// The MCP server for one daemon and one API key. Cheap to clone (one per HTTP session).
#[derive(Clone)]
pub struct SandboxMcp {
    client: Client,
    tool_router: ToolRouter<Self>,
}

impl SandboxMcp {
    /// A server whose every tool call goes to `client`'s daemon with its key.
    pub fn new(client: Client) -> Self {
        SandboxMcp {
            client,
            tool_router: Self::tool_router(),
        }
    }
}

#[tool_router]
impl SandboxMcp {
    /// Create a new sandbox session and return its session_id. Every other tool needs one.
    #[tool(input_schema = input_schema::<CreateSessionArgs>())]
    async fn create_session(&self, Args(args): Args<CreateSessionArgs>) -> CallToolResult {
        answer(self.do_create(args).await)
    }

    /// List this tenant's sessions with their state and expiry.
    #[tool(annotations(read_only_hint = true))]
    async fn list_sessions(&self) -> CallToolResult {
        let listed = self.client.list_sessions().await.map_err(ToolError::from);
        answer(listed.map(|s| SessionList {
            sessions: s.into_iter().map(SessionView::from).collect(),
        }))
    }

    /// Destroy a session now: its processes end and its files are gone.
    #[tool(input_schema = input_schema::<SessionArgs>(), annotations(destructive_hint = true))]
    async fn kill_session(&self, Args(args): Args<SessionArgs>) -> CallToolResult {
        answer(self.do_kill(args).await)
    }

    /// Run source code (python, node or bash) in a session and wait for it to finish. Returns
    /// stdout, stderr, exit_code and verdict (null, or why the sandbox stopped it, e.g.
    /// SANDBOX-EXEC-TIMEOUT or SANDBOX-EXEC-KILLED-OOM).
    #[tool(input_schema = input_schema::<RunCodeArgs>())]
    async fn run_code(
        &self,
        Args(args): Args<RunCodeArgs>,
        ct: CancellationToken,
    ) -> CallToolResult {
        answer(unless_cancelled(ct, self.exec(args.and_then(RunCodeArgs::request))).await)
    }

    /// What happened to a session, oldest first, also after it ended: session.created,
    /// session.paused, session.resumed, session.stopped (data.cause: deleted, expired, quota,
    /// agent_exited, daemon_shutdown, ...; data.reason) and exec.verdict for each program the
    /// sandbox killed (data.verdict: SANDBOX-EXEC-TIMEOUT, SANDBOX-EXEC-KILLED-OOM, ...). Use it
    /// to learn why a session is gone. `more` is true when events follow the last one returned:
    /// ask again with `after` set to its `seq`.
    #[tool(input_schema = input_schema::<EventsArgs>(), annotations(read_only_hint = true))]
    async fn session_events(&self, Args(args): Args<EventsArgs>) -> CallToolResult {
        answer(self.do_events(args).await)
    }

    /// Save a session's files as a snapshot and return its snapshot_id: a point to come back
    /// to with restore_session, or to start new sessions from (create_session from_snapshot).
    /// Running processes are not saved.
    #[tool(input_schema = input_schema::<SnapshotArgs>())]
    async fn snapshot_session(&self, Args(args): Args<SnapshotArgs>) -> CallToolResult {
        answer(self.do_snapshot(args).await)
    }

    /// Put a session's files back as a snapshot saved them (undo everything since). Its
    /// processes end, background ones and interpreter variables included.
    #[tool(input_schema = input_schema::<RestoreArgs>(), annotations(destructive_hint = true))]
    async fn restore_session(&self, Args(args): Args<RestoreArgs>) -> CallToolResult {
        answer(self.do_restore(args).await)
    }

    /// Copy a session: `count` new sessions, each with the files it has now, to try different
    /// approaches side by side. Returns the new sessions; each ends on its own timeout or with
    /// kill_session.
    #[tool(input_schema = input_schema::<ForkArgs>())]
    async fn fork_session(&self, Args(args): Args<ForkArgs>) -> CallToolResult {
        answer(self.do_fork(args).await)
    }

    /// Run a notebook cell in a session's long-lived interpreter: variables, imports and
    /// definitions persist from one cell to the next (one context per language: python, node,
    /// typescript, bash, java, r). Returns stdout, stderr, the results (the last expression's
    /// value, displayed objects and tables, matplotlib figures with their chart data; figures
    /// also follow as images), the exception the code raised as `error`, and the `context_id`.
    #[tool(input_schema = input_schema::<RunCellArgs>())]
    async fn run_cell(
        &self,
        Args(args): Args<RunCellArgs>,
        ct: CancellationToken,
    ) -> CallToolResult {
        answer_with_images(unless_cancelled(ct, self.do_run_cell(args)).await)
    }

    /// Run a command in a session (a shell line in `command`, or a program with arguments in
    /// `argv`) and wait for it to finish. Returns stdout, stderr, exit_code and verdict.
    #[tool(input_schema = input_schema::<RunCommandArgs>())]
    async fn run_command(
        &self,
        Args(args): Args<RunCommandArgs>,
        ct: CancellationToken,
    ) -> CallToolResult {
        answer(unless_cancelled(ct, self.exec(args.and_then(RunCommandArgs::request))).await)
    }

    /// Start a command in the background (a server, a long job) and return its process_id at
    /// once; read its output with read_process_output, stop it with stop_process.
    #[tool(input_schema = input_schema::<RunCommandArgs>())]
    async fn start_process(&self, Args(args): Args<RunCommandArgs>) -> CallToolResult {
        answer(self.do_start(args).await)
    }

    /// Read a background process's output (everything it printed that the sandbox kept, from
    /// the start), waiting up to wait_ms for it to finish. state is `running` or `exited`; once
    /// exited, exit_code and verdict are set.
    #[tool(input_schema = input_schema::<ReadOutputArgs>(), annotations(read_only_hint = true))]
    async fn read_process_output(
        &self,
        Args(args): Args<ReadOutputArgs>,
        ct: CancellationToken,
    ) -> CallToolResult {
        answer(unless_cancelled(ct, self.do_read_output(args)).await)
    }

    /// Send a signal (default SIGTERM) to a background process.
    #[tool(input_schema = input_schema::<StopProcessArgs>())]
    async fn stop_process(&self, Args(args): Args<StopProcessArgs>) -> CallToolResult {
        answer(self.do_stop(args).await)
    }

    /// Write a file in a session (text, or base64 for binary), replacing an existing one.
    #[tool(input_schema = input_schema::<WriteFileArgs>())]
    async fn write_file(&self, Args(args): Args<WriteFileArgs>) -> CallToolResult {
        answer(self.do_write(args).await)
    }

    /// Read a file from a session. Text comes back as is (encoding `utf8`), anything else as
    /// base64 (encoding `base64`).
    #[tool(input_schema = input_schema::<ReadFileArgs>(), annotations(read_only_hint = true))]
    async fn read_file(&self, Args(args): Args<ReadFileArgs>) -> CallToolResult {
        answer(self.do_read(args).await)
    }

    /// List a directory in a session: name, path, type (file, dir, symlink), size, mode.
    #[tool(input_schema = input_schema::<ListFilesArgs>(), annotations(read_only_hint = true))]
    async fn list_files(&self, Args(args): Args<ListFilesArgs>) -> CallToolResult {
        answer(self.do_list(args).await)
    }

    /// The URL where the web server a session listens on can be reached (the daemon's preview
    /// proxy; requests to it need the same API key as a bearer token). Start the server with
    /// start_process first; until it listens this is SANDBOX-PREVIEW-NOT-LISTENING. With
    /// `port`, the preview is pinned to that port instead of the detected one.
    #[tool(input_schema = input_schema::<PreviewArgs>())]
    async fn get_preview_url(&self, Args(args): Args<PreviewArgs>) -> CallToolResult {
        answer(self.do_preview(args).await)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SandboxMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "koder-sandbox",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(INSTRUCTIONS)
    }
}

impl SandboxMcp {
    async fn do_create(
        &self,
        args: Result<CreateSessionArgs, ToolError>,
    ) -> Result<SessionView, ToolError> {
        let req = args?.request()?;
        let session = self.client.create_session(&req).await?;
        Ok(SessionView::from(session.info().clone()))
    }

    async fn do_kill(&self, args: Result<SessionArgs, ToolError>) -> Result<Killed, ToolError> {
        let id = args?.checked()?;
        self.client.destroy_session(&id).await?;
        Ok(Killed {
            session_id: id,
            destroyed: true,
        })
    }

    async fn exec(
        &self,
        req: Result<(String, types::ExecRequest), ToolError>,
    ) -> Result<ExecView, ToolError> {
        let (id, req) = req?;
        let result = self.client.exec(&id, &req).await?;
        Ok(ExecView::from(result))
    }

    async fn do_events(
        &self,
        args: Result<EventsArgs, ToolError>,
    ) -> Result<types::SessionEventList, ToolError> {
        let (id, after) = args?.checked()?;
        Ok(self.client.session_events(&id, after, None).await?)
    }

    async fn do_snapshot(
        &self,
        args: Result<SnapshotArgs, ToolError>,
    ) -> Result<types::Snapshot, ToolError> {
        let (id, name) = args?.checked()?;
        Ok(self.client.snapshot_session(&id, name.as_deref()).await?)
    }

    async fn do_restore(
        &self,
        args: Result<RestoreArgs, ToolError>,
    ) -> Result<SessionView, ToolError> {
        let (id, snapshot) = args?.checked()?;
        Ok(SessionView::from(
            self.client.restore_session(&id, &snapshot).await?,
        ))
    }

    async fn do_fork(&self, args: Result<ForkArgs, ToolError>) -> Result<SessionList, ToolError> {
        let (id, count) = args?.checked()?;
        let forks = self.client.fork_session(&id, count).await?;
        Ok(SessionList {
            sessions: forks.into_iter().map(SessionView::from).collect(),
        })
    }

    async fn do_run_cell(
        &self,
        args: Result<RunCellArgs, ToolError>,
    ) -> Result<(CellView, Vec<ContentBlock>), ToolError> {
        let (id, target, run) = args?.checked()?;
        let (context_id, language) = match target {
            CellTarget::Context(context_id) => (context_id, None),
            CellTarget::Language(language) => {
                (self.context_of(&id, language).await?, Some(language))
            }
        };
        let result = self.client.run_in_context(&id, &context_id, &run).await?;
        let language = match language {
            Some(l) => l.as_str().to_string(),
            None => self.language_of(&id, &context_id).await?,
        };
        Ok(CellView::new(context_id, language, result))
    }

    /// The session's context of `language`: the first one there is, else a new one.
    async fn context_of(&self, id: &str, language: CellLanguage) -> Result<String, ToolError> {
        let contexts = self.client.list_contexts(id).await?;
        if let Some(c) = contexts
            .into_iter()
            .find(|c| c.language == language.as_str())
        {
            return Ok(c.context_id);
        }
        let req = CreateContext {
            language: Some(language.as_str().to_string()),
            ..Default::default()
        };
        Ok(self.client.create_context(id, &req).await?.context_id)
    }

    async fn language_of(&self, id: &str, context_id: &str) -> Result<String, ToolError> {
        let contexts = self.client.list_contexts(id).await?;
        let context = contexts.into_iter().find(|c| c.context_id == context_id);
        Ok(context.map(|c| c.language).unwrap_or_default())
    }

    async fn do_start(
        &self,
        args: Result<RunCommandArgs, ToolError>,
    ) -> Result<Started, ToolError> {
        let (id, req) = args?.request()?;
        let process_id = self.client.exec_background(&id, &req).await?;
        Ok(Started {
            session_id: id,
            process_id,
        })
    }

    async fn do_read_output(
        &self,
        args: Result<ReadOutputArgs, ToolError>,
    ) -> Result<ProcessOutput, ToolError> {
        let (id, process, wait_ms) = args?.checked()?;
        let status = self.client.exec_status(&id, &process).await?;
        if let (ExecState::Exited, Some(result)) = (status.state, status.result) {
            return Ok(ProcessOutput::exited(result));
        }
        let events = self.client.follow_exec(&id, &process).await?;
        let collected = collect(events, Duration::from_millis(wait_ms)).await?;
        Ok(collected.into_output())
    }

    async fn do_stop(
        &self,
        args: Result<StopProcessArgs, ToolError>,
    ) -> Result<Signalled, ToolError> {
        let (id, process, signal) = args?.checked()?;
        self.client.exec_signal(&id, &process, &signal).await?;
        Ok(Signalled {
            process_id: process,
            signal,
        })
    }

    async fn do_write(&self, args: Result<WriteFileArgs, ToolError>) -> Result<Written, ToolError> {
        let (id, path, bytes) = args?.checked()?;
        let entry = self.client.upload(&id, &path, bytes).await?;
        Ok(Written {
            path: entry.path,
            size: entry.size,
        })
    }

    async fn do_read(
        &self,
        args: Result<ReadFileArgs, ToolError>,
    ) -> Result<FileContent, ToolError> {
        let (id, path, max) = args?.checked()?;
        let mut stream = std::pin::pin!(self.client.download_stream(&id, &path).await?);
        // One byte past the limit tells a file that is exactly `max` long from a longer one.
        let limit = usize::try_from(max).unwrap_or(usize::MAX).saturating_add(1);
        let mut bytes = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            let room = limit - bytes.len();
            bytes.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if bytes.len() == limit {
                break;
            }
        }
        let truncated = bytes.len() == limit;
        if truncated {
            bytes.pop();
        }
        Ok(FileContent::new(path, bytes, truncated))
    }

    async fn do_list(
        &self,
        args: Result<ListFilesArgs, ToolError>,
    ) -> Result<types::FileList, ToolError> {
        let (id, path, depth) = args?.checked()?;
        Ok(self.client.list_files(&id, &path, depth).await?)
    }

    async fn do_preview(&self, args: Result<PreviewArgs, ToolError>) -> Result<Preview, ToolError> {
        let (id, port) = args?.checked()?;
        let upstream = match port {
            Some(port) => self.client.pin_preview(&id, port).await?,
            None => self.client.upstream(&id).await?,
        };
        Ok(Preview {
            url: self.client.preview_url(&id)?.to_string(),
            port: upstream.port,
            url_inside_sandbox: upstream.url,
            auth: "Authorization: Bearer <the API key>",
        })
    }
}

/// A cell's answer: its view as structured content (and its JSON text), then its figures as
/// images.
fn answer_with_images(outcome: Result<(CellView, Vec<ContentBlock>), ToolError>) -> CallToolResult {
    match outcome {
        Ok((view, images)) => {
            let mut result = answer(Ok(view));
            if result.is_error != Some(true) {
                result.content.extend(images);
            }
            result
        }
        Err(e) => e.into_result(),
    }
}

/// `work`, abandoned when the client cancels the call or goes away (rmcp runs each call as a
/// task of its own and only signals `ct`): no one would read the answer. A run already started
/// in the sandbox still ends by its own timeout.
async fn unless_cancelled<T>(
    ct: CancellationToken,
    work: impl std::future::Future<Output = Result<T, ToolError>>,
) -> Result<T, ToolError> {
    tokio::select! {
        done = work => done,
        () = ct.cancelled() => Err(ToolError::new(CANCELLED, "the client cancelled the call")),
    }
}

/// Follows an exec's events for at most `wait`: replayed output first, then live output, until
/// it exits.
async fn collect(
    events: impl futures::Stream<Item = koder_sdk::Result<ExecEvent>>,
    wait: Duration,
) -> Result<Collected, ToolError> {
    let mut events = std::pin::pin!(events);
    let deadline = tokio::time::sleep(wait);
    let mut deadline = std::pin::pin!(deadline);
    let mut out = Collected::default();
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(event)) => {
                    if out.push(event) {
                        break;
                    }
                }
                Some(Err(e)) => return Err(e.into()),
                None => break,
            },
            () = &mut deadline => break,
        }
    }
    Ok(out)
}

/// What `read_process_output` saw of a running exec: its output's tails and maybe its end.
#[derive(Default)]
struct Collected {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    dropped: bool,
    exit: Option<ExecResult>,
}

impl Collected {
    /// Adds one event; true once the exec has exited.
    fn push(&mut self, event: ExecEvent) -> bool {
        match event {
            ExecEvent::Stdout(b) => keep_tail(&mut self.stdout, &b, &mut self.dropped),
            ExecEvent::Stderr(b) => keep_tail(&mut self.stderr, &b, &mut self.dropped),
            ExecEvent::Truncated { .. } => self.dropped = true,
            ExecEvent::Start { .. } => {}
            ExecEvent::Exit(result) => {
                self.exit = Some(result);
                return true;
            }
        }
        false
    }

    fn into_output(self) -> ProcessOutput {
        let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
        let (stdout, stdout_cut) = tail(text(self.stdout), MAX_STREAM_BYTES);
        let (stderr, stderr_cut) = tail(text(self.stderr), MAX_STREAM_BYTES);
        let exit = self.exit.as_ref();
        ProcessOutput {
            state: if exit.is_some() { "exited" } else { "running" },
            exit_code: exit.and_then(|r| r.exit_code),
            signal: exit.and_then(|r| r.signal),
            verdict: exit.and_then(|r| r.verdict.clone()),
            stdout,
            stderr,
            stdout_truncated: stdout_cut || self.dropped,
            stderr_truncated: stderr_cut || self.dropped,
        }
    }
}

/// Appends `chunk` keeping at most twice the result bound (the final cut is in `tail`).
fn keep_tail(buf: &mut Vec<u8>, chunk: &[u8], dropped: &mut bool) {
    buf.extend_from_slice(chunk);
    if buf.len() > 2 * MAX_STREAM_BYTES {
        let excess = buf.len() - MAX_STREAM_BYTES;
        buf.drain(..excess);
        *dropped = true;
    }
}

/// A session as tools show it.
#[derive(Serialize)]
struct SessionView {
    session_id: String,
    language: String,
    state: &'static str,
    runtime: String,
    created_at: String,
    expires_at: String,
    limits: types::Limits,
    network: types::Network,
    #[serde(skip_serializing_if = "Option::is_none")]
    end_reason: Option<String>,
}

impl From<types::Session> for SessionView {
    fn from(s: types::Session) -> Self {
        SessionView {
            session_id: s.id,
            language: s.language,
            state: s.state.as_str(),
            runtime: s.runtime,
            created_at: s.created_at.to_rfc3339(),
            expires_at: s.expires_at.to_rfc3339(),
            limits: s.limits,
            network: s.network,
            end_reason: s.end_reason,
        }
    }
}

#[derive(Serialize)]
struct SessionList {
    sessions: Vec<SessionView>,
}

#[derive(Serialize)]
struct Killed {
    session_id: String,
    destroyed: bool,
}

/// A finished exec as tools show it.
#[derive(Serialize)]
struct ExecView {
    exit_code: Option<i32>,
    signal: Option<i32>,
    verdict: Option<String>,
    stdout: String,
    stderr: String,
    stdout_truncated: bool,
    stderr_truncated: bool,
    duration_ms: u64,
    peak_memory_kib: Option<u64>,
}

impl From<ExecResult> for ExecView {
    fn from(r: ExecResult) -> Self {
        let (stdout, stdout_cut) = tail(r.stdout, MAX_STREAM_BYTES);
        let (stderr, stderr_cut) = tail(r.stderr, MAX_STREAM_BYTES);
        ExecView {
            exit_code: r.exit_code,
            signal: r.signal,
            verdict: r.verdict,
            stdout,
            stderr,
            stdout_truncated: r.stdout_truncated || stdout_cut,
            stderr_truncated: r.stderr_truncated || stderr_cut,
            duration_ms: r.duration_ms,
            peak_memory_kib: r.peak_memory_kib,
        }
    }
}

#[derive(Serialize)]
struct Started {
    session_id: String,
    process_id: String,
}

#[derive(Serialize)]
struct ProcessOutput {
    state: &'static str,
    exit_code: Option<i32>,
    signal: Option<i32>,
    verdict: Option<String>,
    stdout: String,
    stderr: String,
    stdout_truncated: bool,
    stderr_truncated: bool,
}

impl ProcessOutput {
    fn exited(r: ExecResult) -> Self {
        let view = ExecView::from(r);
        ProcessOutput {
            state: "exited",
            exit_code: view.exit_code,
            signal: view.signal,
            verdict: view.verdict,
            stdout: view.stdout,
            stderr: view.stderr,
            stdout_truncated: view.stdout_truncated,
            stderr_truncated: view.stderr_truncated,
        }
    }
}

#[derive(Serialize)]
struct Signalled {
    process_id: String,
    signal: String,
}

#[derive(Serialize)]
struct Written {
    path: String,
    size: u64,
}

#[derive(Serialize)]
struct FileContent {
    path: String,
    encoding: &'static str,
    content: String,
    size: usize,
    truncated: bool,
}

impl FileContent {
    fn new(path: String, bytes: Vec<u8>, truncated: bool) -> Self {
        let (encoding, content, size) = match std::str::from_utf8(&bytes) {
            Ok(text) => ("utf8", text.to_string(), bytes.len()),
            // The cut may split a character: text whose only flaw is an incomplete end stays text.
            Err(e) if truncated && e.error_len().is_none() => {
                let valid = e.valid_up_to();
                let text = String::from_utf8_lossy(&bytes[..valid]).into_owned();
                ("utf8", text, valid)
            }
            Err(_) => (
                "base64",
                base64::engine::general_purpose::STANDARD.encode(&bytes),
                bytes.len(),
            ),
        };
        FileContent {
            path,
            encoding,
            content,
            size,
            truncated,
        }
    }
}

#[derive(Serialize)]
struct Preview {
    url: String,
    port: u16,
    url_inside_sandbox: String,
    auth: &'static str,
}

#[cfg(test)]
mod tests;
