//! `koder.ai.sandbox.v1.Sandbox`: each call is admission, conversion and one manager call.

use std::pin::Pin;

use bytes::Bytes;
use futures::{Stream, StreamExt as _};
use koder_api_types::{CreateSnapshot, ErrorCode};
use koder_auth::{Identity, Scope};
use koder_sessions::execs::{ExecEvent, Follow};
use koder_sessions::{
    ContextOptions, LaterStdin, RunRequest, Terminal, TerminalEvent, TerminalSpec,
};
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_stream::wrappers::BroadcastStream;
use tonic::{Request, Response, Status, Streaming};

use crate::admit::{admit, admit_operator, Admitted, Places};
use crate::convert::{exec_request, invalid, preview, put_tenant, volume_meta};
use crate::proto::{self as pb, exec_event::Event, sandbox_server::Sandbox};
use crate::status::{status, OrStatus as _};
use crate::GrpcState;

type Answer<T> = Result<Response<T>, Status>;
type Events<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

pub struct SandboxService {
    s: GrpcState,
}

impl SandboxService {
    pub fn new(state: GrpcState) -> Self {
        Self { s: state }
    }

    /// Admits the call and hands back its caller and message.
    async fn admit<T>(
        &self,
        req: Request<T>,
        needed: Scope,
        places: Places,
    ) -> Result<(Admitted, T), Status> {
        let admitted = admit(&self.s, req.metadata(), needed, places).await?;
        Ok((admitted, req.into_inner()))
    }

    async fn caller<T>(&self, req: Request<T>, needed: Scope) -> Result<(Identity, T), Status> {
        let (a, msg) = self.admit(req, needed, Places::None).await?;
        Ok((a.who, msg))
    }
}

/// `events` up to and including the first item `last` says ends it (the source is not polled
/// again: a follower's channel outlives the exec); `guard` is held until the stream is done or
/// dropped (the client cancelled).
fn guarded<T, G>(
    events: impl Stream<Item = Result<T, Status>> + Send + 'static,
    last: fn(&Result<T, Status>) -> bool,
    guard: G,
) -> Events<T>
where
    T: Send + 'static,
    G: Send + 'static,
{
    let state = (Box::pin(events), Some(guard));
    Box::pin(futures::stream::unfold(
        state,
        move |(mut events, guard)| async move {
            // A finished stream gives its guard back at once.
            let guard = guard?;
            let item = events.next().await?;
            let guard = (!last(&item)).then_some(guard);
            Some((item, (events, guard)))
        },
    ))
}

/// An exec's events on the wire: `started`, the replay, then live events.
fn exec_events(follow: Follow, admitted: Admitted) -> Events<pb::ExecEvent> {
    let Follow {
        exec_id,
        replay,
        live,
        cancel_on_drop,
    } = follow;
    let started = futures::stream::once(futures::future::ready(Ok(Event::Started(
        pb::ExecStarted { exec_id },
    ))));
    let replayed = futures::stream::iter(replay).map(Ok::<_, BroadcastStreamRecvError>);
    let live = futures::stream::iter(live.map(BroadcastStream::new)).flatten();
    let events = started
        .chain(replayed.chain(live).map(|e| Ok(exec_event(e))))
        .map(|e| e.map(|event| pb::ExecEvent { event: Some(event) }));
    let last = |e: &Result<pb::ExecEvent, Status>| {
        matches!(
            e,
            Ok(pb::ExecEvent {
                event: Some(Event::Exit(_))
            }) | Err(_)
        )
    };
    // Dropping `cancel_on_drop` before the exit kills the exec.
    guarded(events, last, (cancel_on_drop, admitted.places))
}

fn exec_event(e: Result<ExecEvent, BroadcastStreamRecvError>) -> Event {
    match e {
        Ok(ExecEvent::Stdout(b)) => Event::Stdout(b.to_vec()),
        Ok(ExecEvent::Stderr(b)) => Event::Stderr(b.to_vec()),
        Ok(ExecEvent::Exit(result)) => {
            let mut r = pb::ExecResult::from(*result);
            // The output went out as chunks already.
            r.stdout.clear();
            r.stderr.clear();
            Event::Exit(r)
        }
        Err(BroadcastStreamRecvError::Lagged(n)) => Event::Truncated(n),
    }
}

/// A message of a streamed upload (`WriteFile`, `WriteVolumeFile`): the header first, then data.
trait UploadPart: Send + 'static {
    type Header;
    /// The rpc's name, for the errors.
    const RPC: &'static str;
    fn into_part(self) -> Option<Result<Self::Header, Vec<u8>>>;
}

impl UploadPart for pb::WriteFileRequest {
    type Header = pb::WriteFileHeader;
    const RPC: &'static str = "WriteFile";
    fn into_part(self) -> Option<Result<Self::Header, Vec<u8>>> {
        use pb::write_file_request::Part;
        self.part.map(|p| match p {
            Part::Header(h) => Ok(h),
            Part::Data(d) => Err(d),
        })
    }
}

impl UploadPart for pb::WriteVolumeFileRequest {
    type Header = pb::WriteVolumeFileHeader;
    const RPC: &'static str = "WriteVolumeFile";
    fn into_part(self) -> Option<Result<Self::Header, Vec<u8>>> {
        use pb::write_volume_file_request::Part;
        self.part.map(|p| match p {
            Part::Header(h) => Ok(h),
            Part::Data(d) => Err(d),
        })
    }
}

/// An upload's header and the body behind it (data parts only).
async fn upload<M: UploadPart>(
    mut parts: Streaming<M>,
) -> Result<(M::Header, impl Stream<Item = Result<Bytes, Status>> + Unpin), Status> {
    let header = match parts.message().await?.and_then(M::into_part) {
        Some(Ok(h)) => h,
        _ => {
            return Err(invalid(&format!(
                "the first {} message must be the header",
                M::RPC
            )))
        }
    };
    let body = parts.map(|part| match part?.into_part() {
        Some(Err(data)) => Ok(Bytes::from(data)),
        Some(Ok(_)) => Err(invalid(&format!(
            "only the first {} message is a header",
            M::RPC
        ))),
        None => Ok(Bytes::new()),
    });
    Ok((header, body))
}

/// A download as `FileChunk`s; a failed read fails the call, so a short file never looks
/// complete.
fn file_chunks<D, E>(
    chunks: impl Stream<Item = Result<D, E>> + Send + 'static,
) -> Events<pb::FileChunk>
where
    D: Into<Vec<u8>>,
    E: std::fmt::Display,
{
    let chunks = chunks.map(|c| match c {
        Ok(data) => Ok(pb::FileChunk { data: data.into() }),
        Err(e) => Err(status(ErrorCode::Internal, &e.to_string(), None)),
    });
    guarded(chunks, Result::is_err, ())
}

/// A terminal size in cells; 0 (unset) is the default 80 x 24 as over REST.
fn cells(size: Option<pb::TerminalSize>) -> Result<(u16, u16), Status> {
    let size = size.unwrap_or_default();
    let cell = |n: u32, default: u16| match n {
        0 => Ok(default),
        n => u16::try_from(n).map_err(|_| invalid("terminal sizes are 1..=65535 cells")),
    };
    Ok((cell(size.cols, 80)?, cell(size.rows, 24)?))
}

fn terminal_spec(start: pb::TerminalStart) -> Result<TerminalSpec, Status> {
    let (cols, rows) = cells(start.size)?;
    Ok(TerminalSpec {
        argv: start.argv,
        env: start.env,
        cwd: start.cwd,
        user: start.user,
        cols,
        rows,
    })
}

/// Keystrokes and resizes in, the terminal's events out, until the process exits or the
/// client goes (`out` closed): then `term` is dropped, which kills its process. `places` is
/// the call's stream place, held as long.
async fn terminal_bridge<P>(
    mut term: Terminal,
    mut input: Streaming<pb::TerminalRequest>,
    out: tokio::sync::mpsc::Sender<Result<pb::TerminalOutput, Status>>,
    places: P,
) {
    use pb::terminal_output::Event as Out;
    use pb::terminal_request::Part;
    let _places = places;
    let keys = term.input();
    let mut input_open = true;
    loop {
        tokio::select! {
            msg = input.message(), if input_open => match msg {
                Ok(Some(pb::TerminalRequest { part: Some(Part::Input(data)) })) => {
                    if keys.write(&data).await.is_err() {
                        return;
                    }
                }
                Ok(Some(pb::TerminalRequest { part: Some(Part::Resize(size)) })) => {
                    match cells(Some(size)) {
                        Ok((cols, rows)) => { let _ = keys.resize(cols, rows).await; }
                        Err(e) => { let _ = out.send(Err(e)).await; return; }
                    }
                }
                Ok(Some(_)) => {
                    let _ = out.send(Err(invalid("only the first Terminal message is start"))).await;
                    return;
                }
                // Half-closed: no more input, the output goes on.
                Ok(None) => input_open = false,
                Err(_) => return,
            },
            event = term.next() => {
                let (msg, last) = match event {
                    TerminalEvent::Output(data) => (Ok(Out::Output(data.to_vec())), false),
                    TerminalEvent::Exit { exit_code, signal } => {
                        (Ok(Out::Exit(pb::TerminalExit { exit_code, signal })), true)
                    }
                    TerminalEvent::Lost(why) => (Err(status(ErrorCode::Internal, &why, None)), true),
                };
                let msg = msg.map(|event| pb::TerminalOutput { event: Some(event) });
                if out.send(msg).await.is_err() || last {
                    return;
                }
            }
            () = out.closed() => return,
        }
    }
}

#[tonic::async_trait]
impl Sandbox for SandboxService {
    async fn create_session(&self, req: Request<pb::CreateSessionRequest>) -> Answer<pb::Session> {
        let (who, msg) = self.caller(req, Scope::Write).await?;
        let create = msg.try_into()?;
        let session = self.s.manager.create(&who, create).await.or_status()?;
        Ok(Response::new(session.into()))
    }

    async fn get_session(&self, req: Request<pb::GetSessionRequest>) -> Answer<pb::Session> {
        let (who, msg) = self.caller(req, Scope::Read).await?;
        let session = self
            .s
            .manager
            .get(&who, &msg.session_id)
            .await
            .or_status()?;
        Ok(Response::new(session.into()))
    }

    async fn list_sessions(
        &self,
        req: Request<pb::ListSessionsRequest>,
    ) -> Answer<pb::ListSessionsResponse> {
        let (who, _) = self.caller(req, Scope::Read).await?;
        let sessions = self.s.manager.list(&who).await.or_status()?;
        Ok(Response::new(pb::ListSessionsResponse {
            sessions: sessions.into_iter().map(Into::into).collect(),
        }))
    }

    async fn delete_session(
        &self,
        req: Request<pb::DeleteSessionRequest>,
    ) -> Answer<pb::DeleteSessionResponse> {
        let (who, msg) = self.caller(req, Scope::Write).await?;
        self.s
            .manager
            .destroy(&who, &msg.session_id)
            .await
            .or_status()?;
        Ok(Response::new(pb::DeleteSessionResponse {}))
    }

    async fn pause_session(&self, req: Request<pb::PauseSessionRequest>) -> Answer<pb::Session> {
        let (who, msg) = self.caller(req, Scope::Write).await?;
        let memory = msg.memory.unwrap_or(true);
        let session = self
            .s
            .manager
            .pause_session(&who, &msg.session_id, memory)
            .await
            .or_status()?;
        Ok(Response::new(session.into()))
    }

    async fn resume_session(&self, req: Request<pb::ResumeSessionRequest>) -> Answer<pb::Session> {
        let (who, msg) = self.caller(req, Scope::Write).await?;
        let session = self
            .s
            .manager
            .resume(&who, &msg.session_id)
            .await
            .or_status()?;
        Ok(Response::new(session.into()))
    }

    async fn fork_session(
        &self,
        req: Request<pb::ForkSessionRequest>,
    ) -> Answer<pb::ForkSessionResponse> {
        let (who, msg) = self.caller(req, Scope::Write).await?;
        let sessions = self
            .s
            .manager
            .fork(&who, &msg.session_id, msg.count.unwrap_or(1))
            .await
            .or_status()?;
        Ok(Response::new(pb::ForkSessionResponse {
            sessions: sessions.into_iter().map(Into::into).collect(),
        }))
    }

    async fn restore_session(
        &self,
        req: Request<pb::RestoreSessionRequest>,
    ) -> Answer<pb::Session> {
        let (who, msg) = self.caller(req, Scope::Write).await?;
        let session = self
            .s
            .manager
            .restore(&who, &msg.session_id, &msg.snapshot_id)
            .await
            .or_status()?;
        Ok(Response::new(session.into()))
    }

    async fn set_network(&self, req: Request<pb::SetNetworkRequest>) -> Answer<pb::Session> {
        let (who, msg) = self.caller(req, Scope::Write).await?;
        let network = msg.network.unwrap_or_default().try_into()?;
        let session = self
            .s
            .manager
            .set_network(&who, &msg.session_id, network)
            .await
            .or_status()?;
        Ok(Response::new(session.into()))
    }

    async fn pin_preview(&self, req: Request<pb::PinPreviewRequest>) -> Answer<pb::Preview> {
        let (who, msg) = self.caller(req, Scope::Exec).await?;
        let port = u16::try_from(msg.port)
            .map_err(|_| status(ErrorCode::InvalidArgument, "port must be 1..=65535", None))?;
        let upstream = self
            .s
            .manager
            .pin_preview(&who, &msg.session_id, port)
            .await
            .or_status()?;
        Ok(Response::new(preview(&msg.session_id, upstream)))
    }

    async fn exec(&self, req: Request<pb::ExecRequest>) -> Answer<pb::ExecResult> {
        let (admitted, msg) = self.admit(req, Scope::Exec, Places::Exec).await?;
        let (id, exec) = exec_request(msg);
        let result = self
            .s
            .manager
            .exec(&admitted.who, &id, exec)
            .await
            .or_status()?;
        Ok(Response::new(result.into()))
    }

    type ExecStreamStream = Events<pb::ExecEvent>;

    async fn exec_stream(&self, req: Request<pb::ExecRequest>) -> Answer<Self::ExecStreamStream> {
        let (admitted, msg) = self.admit(req, Scope::Exec, Places::ExecStream).await?;
        let (id, exec) = exec_request(msg);
        let follow = self
            .s
            .manager
            .exec_streamed(&admitted.who, &id, exec)
            .await
            .or_status()?;
        Ok(Response::new(exec_events(follow, admitted)))
    }

    async fn start_exec(&self, req: Request<pb::ExecRequest>) -> Answer<pb::ExecStarted> {
        let (admitted, msg) = self.admit(req, Scope::Exec, Places::Exec).await?;
        let (id, exec) = exec_request(msg);
        let exec_id = self
            .s
            .manager
            .exec_background(&admitted.who, &id, exec, LaterStdin::Open)
            .await
            .or_status()?
            .exec_id;
        Ok(Response::new(pb::ExecStarted { exec_id }))
    }

    async fn list_execs(
        &self,
        req: Request<pb::ListExecsRequest>,
    ) -> Answer<pb::ListExecsResponse> {
        let (who, msg) = self.caller(req, Scope::Read).await?;
        let execs = self
            .s
            .manager
            .list_execs(&who, &msg.session_id)
            .await
            .or_status()?;
        Ok(Response::new(pb::ListExecsResponse {
            execs: execs.into_iter().map(Into::into).collect(),
        }))
    }

    async fn get_exec(&self, req: Request<pb::GetExecRequest>) -> Answer<pb::ExecStatus> {
        let (who, msg) = self.caller(req, Scope::Read).await?;
        let exec = self
            .s
            .manager
            .exec_status(&who, &msg.session_id, &msg.exec_id)
            .await
            .or_status()?;
        Ok(Response::new(exec.into()))
    }

    type FollowExecStream = Events<pb::ExecEvent>;

    async fn follow_exec(
        &self,
        req: Request<pb::GetExecRequest>,
    ) -> Answer<Self::FollowExecStream> {
        let (admitted, msg) = self.admit(req, Scope::Read, Places::Stream).await?;
        let follow = self
            .s
            .manager
            .follow_exec(&admitted.who, &msg.session_id, &msg.exec_id)
            .await
            .or_status()?;
        Ok(Response::new(exec_events(follow, admitted)))
    }

    async fn write_stdin(
        &self,
        req: Request<pb::WriteStdinRequest>,
    ) -> Answer<pb::WriteStdinResponse> {
        let (who, msg) = self.caller(req, Scope::Exec).await?;
        self.s
            .manager
            .exec_stdin(
                &who,
                &msg.session_id,
                &msg.exec_id,
                Bytes::from(msg.data),
                msg.close,
            )
            .await
            .or_status()?;
        Ok(Response::new(pb::WriteStdinResponse {}))
    }

    async fn signal_exec(
        &self,
        req: Request<pb::SignalExecRequest>,
    ) -> Answer<pb::SignalExecResponse> {
        let (who, msg) = self.caller(req, Scope::Exec).await?;
        self.s
            .manager
            .exec_signal(&who, &msg.session_id, &msg.exec_id, &msg.signal)
            .await
            .or_status()?;
        Ok(Response::new(pb::SignalExecResponse {}))
    }

    type TerminalStream = Events<pb::TerminalOutput>;

    async fn terminal(
        &self,
        req: Request<Streaming<pb::TerminalRequest>>,
    ) -> Answer<Self::TerminalStream> {
        let (admitted, mut parts) = self.admit(req, Scope::Exec, Places::Stream).await?;
        let start = match parts.message().await? {
            Some(pb::TerminalRequest {
                part: Some(pb::terminal_request::Part::Start(start)),
            }) => start,
            _ => return Err(invalid("the first Terminal message must be start")),
        };
        let session_id = start.session_id.clone();
        let spec = terminal_spec(start)?;
        // The process starts before the answer, so a bad command fails the call itself.
        let term = self
            .s
            .manager
            .terminal(&admitted.who, &session_id, spec)
            .await
            .or_status()?;
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let started = pb::TerminalOutput {
            event: Some(pb::terminal_output::Event::Started(term.pid())),
        };
        // Never full: the channel was just made.
        let _ = tx.try_send(Ok(started));
        tokio::spawn(terminal_bridge(term, parts, tx, admitted.places));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    type ReadFileStream = Events<pb::FileChunk>;

    async fn read_file(&self, req: Request<pb::ReadFileRequest>) -> Answer<Self::ReadFileStream> {
        let (who, msg) = self.caller(req, Scope::Read).await?;
        let reader = self
            .s
            .manager
            .download(&who, &msg.session_id, &msg.path)
            .await
            .or_status()?;
        let chunks = futures::stream::unfold(reader, |mut r| async move {
            r.next_chunk().await.transpose().map(|c| (c, r))
        });
        Ok(Response::new(file_chunks(chunks)))
    }

    async fn write_file(
        &self,
        req: Request<Streaming<pb::WriteFileRequest>>,
    ) -> Answer<pb::FileEntry> {
        let (who, parts) = self.caller(req, Scope::Write).await?;
        let (header, body) = upload(parts).await?;
        let entry = self
            .s
            .manager
            .upload(
                &who,
                &header.session_id,
                &header.path,
                header.size,
                body,
                header.user.as_deref(),
            )
            .await
            .or_status()?;
        Ok(Response::new(entry.into()))
    }

    async fn list_files(
        &self,
        req: Request<pb::ListFilesRequest>,
    ) -> Answer<pb::ListFilesResponse> {
        let (who, msg) = self.caller(req, Scope::Read).await?;
        let list = self
            .s
            .manager
            .list_files(&who, &msg.session_id, &msg.path, msg.depth.unwrap_or(1))
            .await
            .or_status()?;
        Ok(Response::new(list.into()))
    }

    async fn delete_file(
        &self,
        req: Request<pb::DeleteFileRequest>,
    ) -> Answer<pb::DeleteFileResponse> {
        let (who, msg) = self.caller(req, Scope::Write).await?;
        self.s
            .manager
            .remove_file(&who, &msg.session_id, &msg.path, msg.recursive)
            .await
            .or_status()?;
        Ok(Response::new(pb::DeleteFileResponse {}))
    }

    async fn move_file(&self, req: Request<pb::MoveFileRequest>) -> Answer<pb::FileEntry> {
        let (who, msg) = self.caller(req, Scope::Write).await?;
        let entry = self
            .s
            .manager
            .move_file(&who, &msg.session_id, &msg.from, &msg.to)
            .await
            .or_status()?;
        Ok(Response::new(entry.into()))
    }

    type WatchFilesStream = Events<pb::FileEvent>;

    async fn watch_files(
        &self,
        req: Request<pb::WatchFilesRequest>,
    ) -> Answer<Self::WatchFilesStream> {
        let (admitted, msg) = self.admit(req, Scope::Read, Places::Stream).await?;
        let watch = self
            .s
            .manager
            .watch(&admitted.who, &msg.session_id, &msg.path, msg.recursive)
            .await
            .or_status()?;
        let events = futures::stream::unfold(watch, |mut w| async move {
            let next = w.next().await.map(Into::into).or_status();
            Some((next, w))
        });
        Ok(Response::new(guarded(
            events,
            Result::is_err,
            admitted.places,
        )))
    }

    async fn create_context(&self, req: Request<pb::CreateContextRequest>) -> Answer<pb::Context> {
        let (who, msg) = self.caller(req, Scope::Write).await?;
        let language = msg.language.as_deref().unwrap_or("python");
        let opts = ContextOptions {
            cwd: msg.cwd,
            env: msg.env,
            ..ContextOptions::default()
        };
        let info = self
            .s
            .manager
            .create_context(&who, &msg.session_id, language, opts)
            .await
            .or_status()?;
        Ok(Response::new(info.into()))
    }

    async fn run_in_context(
        &self,
        req: Request<pb::RunInContextRequest>,
    ) -> Answer<pb::ContextRunResult> {
        let (admitted, msg) = self.admit(req, Scope::Exec, Places::Exec).await?;
        let run = RunRequest {
            code: msg.code,
            timeout_ms: msg.timeout_ms,
            env: msg.env,
        };
        let result = self
            .s
            .manager
            .run_in_context(&admitted.who, &msg.session_id, &msg.context_id, run, None)
            .await
            .or_status()?;
        Ok(Response::new(result.into()))
    }

    async fn create_snapshot(
        &self,
        req: Request<pb::CreateSnapshotRequest>,
    ) -> Answer<pb::Snapshot> {
        let (who, msg) = self.caller(req, Scope::Write).await?;
        let snap = self
            .s
            .manager
            .snapshot(&who, &msg.session_id, CreateSnapshot { name: msg.name })
            .await
            .or_status()?;
        Ok(Response::new(snap.into()))
    }

    async fn get_snapshot(&self, req: Request<pb::GetSnapshotRequest>) -> Answer<pb::Snapshot> {
        let (who, msg) = self.caller(req, Scope::Read).await?;
        let snap = self
            .s
            .manager
            .get_snapshot(&who, &msg.snapshot_id)
            .await
            .or_status()?;
        Ok(Response::new(snap.into()))
    }

    async fn list_session_events(
        &self,
        req: Request<pb::ListSessionEventsRequest>,
    ) -> Answer<pb::ListSessionEventsResponse> {
        let (who, msg) = self.caller(req, Scope::Read).await?;
        let limit = msg
            .limit
            .map_or(koder_sessions::EVENTS_PAGE_MAX, |l| l as usize);
        let page = self
            .s
            .manager
            .session_events(&who, &msg.session_id, msg.after.unwrap_or(0), limit)
            .await
            .or_status()?;
        Ok(Response::new(page.into()))
    }

    async fn list_snapshots(
        &self,
        req: Request<pb::ListSnapshotsRequest>,
    ) -> Answer<pb::ListSnapshotsResponse> {
        let (who, _) = self.caller(req, Scope::Read).await?;
        let snaps = self.s.manager.list_snapshots(&who).await.or_status()?;
        Ok(Response::new(pb::ListSnapshotsResponse {
            snapshots: snaps.into_iter().map(Into::into).collect(),
        }))
    }

    async fn delete_snapshot(
        &self,
        req: Request<pb::DeleteSnapshotRequest>,
    ) -> Answer<pb::DeleteSnapshotResponse> {
        let (who, msg) = self.caller(req, Scope::Write).await?;
        self.s
            .manager
            .delete_snapshot(&who, &msg.snapshot_id)
            .await
            .or_status()?;
        Ok(Response::new(pb::DeleteSnapshotResponse {}))
    }

    async fn create_volume(&self, req: Request<pb::CreateVolumeRequest>) -> Answer<pb::Volume> {
        let (who, msg) = self.caller(req, Scope::Write).await?;
        let volume = self
            .s
            .manager
            .create_volume(&who, msg.into())
            .await
            .or_status()?;
        Ok(Response::new(volume.into()))
    }

    async fn get_volume(&self, req: Request<pb::GetVolumeRequest>) -> Answer<pb::Volume> {
        let (who, msg) = self.caller(req, Scope::Read).await?;
        let volume = self
            .s
            .manager
            .get_volume(&who, &msg.volume)
            .await
            .or_status()?;
        Ok(Response::new(volume.into()))
    }

    async fn list_volumes(
        &self,
        req: Request<pb::ListVolumesRequest>,
    ) -> Answer<pb::ListVolumesResponse> {
        let (who, _) = self.caller(req, Scope::Read).await?;
        let list = self.s.manager.list_volumes(&who).await.or_status()?;
        Ok(Response::new(pb::ListVolumesResponse {
            volumes: list.volumes.into_iter().map(Into::into).collect(),
        }))
    }

    async fn delete_volume(
        &self,
        req: Request<pb::DeleteVolumeRequest>,
    ) -> Answer<pb::DeleteVolumeResponse> {
        let (who, msg) = self.caller(req, Scope::Write).await?;
        self.s
            .manager
            .delete_volume(&who, &msg.volume)
            .await
            .or_status()?;
        Ok(Response::new(pb::DeleteVolumeResponse {}))
    }

    type ReadVolumeFileStream = Events<pb::FileChunk>;

    async fn read_volume_file(
        &self,
        req: Request<pb::VolumeFileRequest>,
    ) -> Answer<Self::ReadVolumeFileStream> {
        let (who, msg) = self.caller(req, Scope::Read).await?;
        let file = self
            .s
            .manager
            .volume_download(&who, &msg.volume, &msg.path)
            .await
            .or_status()?;
        Ok(Response::new(file_chunks(file.into_stream())))
    }

    async fn write_volume_file(
        &self,
        req: Request<Streaming<pb::WriteVolumeFileRequest>>,
    ) -> Answer<pb::FileEntry> {
        let (who, parts) = self.caller(req, Scope::Write).await?;
        let (header, body) = upload(parts).await?;
        let entry = self
            .s
            .manager
            .volume_upload(
                &who,
                &header.volume,
                &header.path,
                header.overwrite,
                volume_meta(header.meta),
                header.size,
                body,
            )
            .await
            .or_status()?;
        Ok(Response::new(entry.into()))
    }

    async fn list_volume_files(
        &self,
        req: Request<pb::ListVolumeFilesRequest>,
    ) -> Answer<pb::ListFilesResponse> {
        let (who, msg) = self.caller(req, Scope::Read).await?;
        let entries = self
            .s
            .manager
            .volume_list(&who, &msg.volume, &msg.path, msg.depth.unwrap_or(1))
            .await
            .or_status()?;
        Ok(Response::new(pb::ListFilesResponse {
            entries: entries.into_iter().map(Into::into).collect(),
            truncated: false,
        }))
    }

    async fn stat_volume_file(&self, req: Request<pb::VolumeFileRequest>) -> Answer<pb::FileEntry> {
        let (who, msg) = self.caller(req, Scope::Read).await?;
        let entry = self
            .s
            .manager
            .volume_stat(&who, &msg.volume, &msg.path)
            .await
            .or_status()?;
        Ok(Response::new(entry.into()))
    }

    async fn delete_volume_file(
        &self,
        req: Request<pb::VolumeFileRequest>,
    ) -> Answer<pb::DeleteFileResponse> {
        let (who, msg) = self.caller(req, Scope::Write).await?;
        self.s
            .manager
            .volume_remove(&who, &msg.volume, &msg.path)
            .await
            .or_status()?;
        Ok(Response::new(pb::DeleteFileResponse {}))
    }

    async fn set_volume_file_metadata(
        &self,
        req: Request<pb::SetVolumeFileMetadataRequest>,
    ) -> Answer<pb::FileEntry> {
        let (who, msg) = self.caller(req, Scope::Write).await?;
        let entry = self
            .s
            .manager
            .volume_set_metadata(&who, &msg.volume, &msg.path, volume_meta(msg.meta))
            .await
            .or_status()?;
        Ok(Response::new(entry.into()))
    }

    async fn make_volume_dir(
        &self,
        req: Request<pb::MakeVolumeDirRequest>,
    ) -> Answer<pb::FileEntry> {
        let (who, msg) = self.caller(req, Scope::Write).await?;
        let entry = self
            .s
            .manager
            .volume_make_dir(
                &who,
                &msg.volume,
                &msg.path,
                msg.parents,
                volume_meta(msg.meta),
            )
            .await
            .or_status()?;
        Ok(Response::new(entry.into()))
    }

    async fn list_tenants(
        &self,
        req: Request<pb::ListTenantsRequest>,
    ) -> Answer<pb::ListTenantsResponse> {
        admit_operator(&self.s, req.metadata()).await?;
        let tenants = self.s.manager.list_tenants().await.or_status()?;
        Ok(Response::new(pb::ListTenantsResponse {
            tenants: tenants.into_iter().map(Into::into).collect(),
        }))
    }

    async fn get_tenant(&self, req: Request<pb::GetTenantRequest>) -> Answer<pb::Tenant> {
        admit_operator(&self.s, req.metadata()).await?;
        let tenant = self
            .s
            .manager
            .get_tenant(&req.into_inner().tenant_id)
            .await
            .or_status()?;
        Ok(Response::new(tenant.into()))
    }

    async fn put_tenant(&self, req: Request<pb::PutTenantRequest>) -> Answer<pb::Tenant> {
        admit_operator(&self.s, req.metadata()).await?;
        let (id, put) = put_tenant(req.into_inner());
        let tenant = self.s.manager.put_tenant(&id, put).await.or_status()?;
        Ok(Response::new(tenant.into()))
    }

    async fn issue_key(&self, req: Request<pb::IssueKeyRequest>) -> Answer<pb::IssuedKey> {
        admit_operator(&self.s, req.metadata()).await?;
        let issued = self
            .s
            .manager
            .issue_key(&self.s.auth, &req.into_inner().tenant_id)
            .await
            .or_status()?;
        Ok(Response::new(issued.into()))
    }
}
