"""The API, written once: every method builds a request description and its decoder; the
descriptors of ``_ops`` make it blocking on sync objects and awaitable on async ones.

Objects: :class:`SandboxBase` (one session: exec, lifecycle, live) with :class:`Files`,
:class:`Execs` and :class:`Contexts`; the client's :class:`Sessions`, :class:`Snapshots`,
:class:`Volumes` (with :class:`VolumeFiles`), :class:`Secrets`, :class:`Webhooks` and
:class:`Admin`.
"""

from __future__ import annotations

from typing import (
    Any,
    Awaitable,
    Callable,
    Concatenate,
    Generic,
    List,
    Literal,
    Mapping,
    Optional,
    ParamSpec,
    Sequence,
    TypedDict,
    overload,
)
from urllib.parse import quote

import httpx
from httpx_sse import EventSource
from typing_extensions import Unpack

from ._call import (
    Call,
    Content,
    DownloadCall,
    Request,
    SseCall,
    WsCall,
    as_bytes,
    as_field,
    as_list,
    as_model,
    body,
    json_body,
    no_content,
    query,
)
from ._errors import NotFoundError, ProtocolError
from ._events import ExecCollector, ExecEvent, RunEvent, decode_exec_event, decode_run_event
from ._live import AsyncTerminal, AsyncWatch, Terminal, Watch
from ._models import (
    AuditPage,
    ContextInfo,
    ErrorEntry,
    ExecResult,
    ExecStatus,
    FileEntry,
    FileList,
    IssuedKey,
    Lifecycle,
    Limits,
    Network,
    RunResult,
    SecretInfo,
    SessionEventList,
    SessionInfo,
    SessionMetrics,
    SnapshotInfo,
    TenantInfo,
    UpstreamInfo,
    VolumeInfo,
    ImageInfo,
    VolumeMount,
    WebhookDelivery,
    WebhookInfo,
    decode,
    to_json,
)
from ._ops import Async, Bound, F, Sync, _Descriptor, _bind, download_op, op, sse_op, ws_op

P = ParamSpec("P")

#: For requests whose answer comes when the sandbox is done (an exec, a run, a followed
#: stream): no read deadline, because the daemon bounds them itself (the exec's timeout plus
#: its agent deadline) and streams carry keep-alives.
LONG = httpx.Timeout(None, connect=30.0)

SESSIONS = "/v1/sandbox/sessions"


def _seg(value: str) -> str:
    return quote(value, safe="")


class ExecOptions(TypedDict, total=False):
    """How to run an exec, besides ``cmd`` (exactly one of ``cmd``, ``shell``, ``code``).

    Keys:
        shell: A command line run by ``/bin/bash -c``.
        code: Source run by ``language``'s interpreter.
        language: The interpreter of ``code`` (default: the session's language).
        env: Extra environment variables.
        cwd: Working directory (default ``/workspace``).
        stdin: Text written to the program's standard input.
        timeout_ms: Kill the program after this long (server default and maximum apply).
        user: ``"root"`` (default) or ``"user"`` (uid 1000).
    """

    shell: str
    code: str
    language: str
    env: Mapping[str, str]
    cwd: str
    stdin: str
    timeout_ms: int
    user: str


def _exec_request(
    base: str, cmd: Sequence[str] | None, options: ExecOptions, **extra: Any
) -> Request:
    payload = body(cmd=list(cmd) if cmd is not None else None, **options, **extra)
    return Request("POST", f"{base}/exec", json=payload, timeout=LONG)


def _sse(request: Request) -> Request:
    request.headers["accept"] = "text/event-stream"
    return request


# --- file operations shared by sessions and volumes ---


def _read(base: str, path: str) -> Request:
    return Request("GET", f"{base}/files", params=query(path=path))


def _list(base: str, path: str, depth: int | None) -> Call[FileList]:
    return Call(
        Request("GET", f"{base}/files/list", params=query(path=path, depth=depth)),
        as_model(FileList),
    )


class _FileReads(Bound[F]):
    """Reading files: the same for a session's files and a volume's."""

    def __init__(self, transport: Any, base: str) -> None:
        super().__init__(transport)
        self._base = base

    @op
    def read(self, path: str) -> Call[bytes]:
        """Reads a whole file."""
        return Call(_read(self._base, path), as_bytes)

    @op
    def read_text(self, path: str, encoding: str = "utf-8") -> Call[str]:
        """Reads a whole file as text."""
        return Call(_read(self._base, path), as_bytes).map(lambda b: b.decode(encoding))

    @op
    def stat(self, path: str) -> Call[FileEntry]:
        """Describes one file, directory or symlink (the link itself, not its target)."""
        request = Request("GET", f"{self._base}/files/stat", params=query(path=path))
        return Call(request, as_model(FileEntry))

    @download_op
    def download(self, path: str) -> DownloadCall:
        """Reads a file as a stream of chunks (for files too big to hold at once); close the
        stream when not reading it to the end."""
        return DownloadCall(_read(self._base, path))


class Files(_FileReads[F]):
    """Files inside a session's sandbox. Relative paths are below ``/workspace``; nothing
    outside the sandbox's root is reachable."""

    @op
    def write(self, path: str, data: Content) -> Call[FileEntry]:
        """Writes a file atomically (replacing it), streaming ``data``: bytes, text (UTF-8), a
        binary file object, or an iterable of chunks (an async iterable with the async
        client). Over the disk quota raises :class:`QuotaExceededError` and leaves no file."""
        request = Request("PUT", f"{self._base}/files", params=query(path=path), content=data)
        return Call(request, as_model(FileEntry))

    @op
    def list(self, path: str, depth: int | None = None) -> Call[FileList]:
        """Lists a directory, ``depth`` levels deep (1 by default, at most 32)."""
        return _list(self._base, path, depth)

    @op
    def remove(self, path: str, recursive: bool = False) -> Call[None]:
        """Deletes a file, or a directory (non-empty ones only with ``recursive``)."""
        params = query(path=path, recursive=recursive or None)
        return Call(Request("DELETE", f"{self._base}/files", params=params), no_content)

    @op
    def mkdir(self, path: str) -> Call[FileEntry]:
        """Creates a directory (and its missing parents)."""
        request = Request("POST", f"{self._base}/files/mkdir", json=body(path=path))
        return Call(request, as_model(FileEntry))

    @op
    def move(self, src: str, dst: str) -> Call[FileEntry]:
        """Moves or renames a file or directory; answers the entry at its new place."""
        request = Request("POST", f"{self._base}/files/move", json={"from": src, "to": dst})
        return Call(request, as_model(FileEntry))


def _collect_exec(response: httpx.Response) -> ExecResult:
    collector = ExecCollector()
    for sse in EventSource(response).iter_sse():
        event = decode_exec_event(sse)
        if event is not None:
            collector.add(event)
    return collector.finish()


class Execs(Bound[F]):
    """Followed execs of a session: started in the background (or streamed), listed,
    followed, fed stdin, signalled."""

    def __init__(self, transport: Any, base: str) -> None:
        super().__init__(transport)
        self._base = base

    def _exec(self, exec_id: str) -> str:
        return f"{self._base}/execs/{_seg(exec_id)}"

    @op
    def start(self, cmd: Sequence[str] | None = None, **options: Unpack[ExecOptions]) -> Call[str]:
        """Starts an exec in the background and answers its id at once (see
        :class:`ExecOptions` for the options)."""
        request = _exec_request(self._base, cmd, options, background=True)
        return Call(request, as_field("exec_id", str))

    @op
    def list(self) -> Call[List[ExecStatus]]:
        """The session's followed execs (background and streamed), running or exited."""
        return Call(Request("GET", f"{self._base}/execs"), as_list(ExecStatus, "execs"))

    @op
    def get(self, exec_id: str) -> Call[ExecStatus]:
        """An exec's status; once exited, its result with the retained (most recent) output."""
        return Call(Request("GET", self._exec(exec_id)), as_model(ExecStatus))

    @sse_op
    def stream(self, exec_id: str) -> SseCall[ExecEvent]:
        """Replays an exec's retained output, then follows it live to its exit."""
        request = _sse(Request("GET", f"{self._exec(exec_id)}/stream", timeout=LONG))
        return SseCall(request, decode_exec_event)

    @op
    def wait(self, exec_id: str) -> Call[ExecResult]:
        """Waits for an exec to end; answers its result with the retained output."""
        request = _sse(Request("GET", f"{self._exec(exec_id)}/stream", timeout=LONG))
        return Call(request, _collect_exec)

    def _stdin(self, exec_id: str, data: bytes | str, close: bool) -> Call[None]:
        request = Request(
            "POST",
            f"{self._exec(exec_id)}/stdin",
            params=query(close=close or None),
            content=data,
            headers={"content-type": "application/octet-stream"},
        )
        return Call(request, no_content)

    def _signal(self, exec_id: str, signal: str | int) -> Call[None]:
        request = Request("POST", f"{self._exec(exec_id)}/signal", json={"signal": str(signal)})
        return Call(request, no_content)

    @op
    def write_stdin(self, exec_id: str, data: bytes | str, close: bool = False) -> Call[None]:
        """Writes to an exec's standard input (at most 1 MiB per call); ``close`` closes it
        after the write."""
        return self._stdin(exec_id, data, close)

    @op
    def close_stdin(self, exec_id: str) -> Call[None]:
        """Closes an exec's standard input (it reads end of file)."""
        return self._stdin(exec_id, b"", True)

    @op
    def signal(self, exec_id: str, signal: str | int) -> Call[None]:
        """Sends a signal (``"SIGTERM"``, ``"TERM"`` or a number) to an exec."""
        return self._signal(exec_id, signal)

    @op
    def kill(self, exec_id: str) -> Call[None]:
        """Kills an exec (SIGKILL)."""
        return self._signal(exec_id, "SIGKILL")


class Contexts(Bound[F]):
    """Code-interpreter contexts of a session: long-lived Python or Node interpreters whose
    variables persist between runs. ``"default"`` is the session's own Python context."""

    def __init__(self, transport: Any, base: str) -> None:
        super().__init__(transport)
        self._base = base

    def _ctx(self, context_id: str) -> str:
        return f"{self._base}/contexts/{_seg(context_id)}"

    @op
    def create(
        self,
        language: str | None = None,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Call[ContextInfo]:
        """Starts a context: ``language`` ``"python"`` (default), ``"node"``, ``"typescript"``
        (types stripped, not checked; the image needs the typescript package), ``"bash"``,
        ``"java"`` (JShell; the image needs a JDK) or ``"r"``, working directory ``cwd`` (an existing
        absolute path), extra ``env``."""
        payload = body(language=language, cwd=cwd, env=env)
        return Call(Request("POST", f"{self._base}/contexts", json=payload), as_model(ContextInfo))

    @op
    def list(self) -> Call[List[ContextInfo]]:
        """The session's contexts, in creation order."""
        return Call(Request("GET", f"{self._base}/contexts"), as_list(ContextInfo, "contexts"))

    def _run(
        self,
        code: str,
        context_id: str,
        timeout_ms: int | None,
        env: Mapping[str, str] | None,
    ) -> Request:
        payload = body(code=code, timeout_ms=timeout_ms, env=env)
        return Request("POST", f"{self._ctx(context_id)}/run", json=payload, timeout=LONG)

    @op
    def run(
        self,
        code: str,
        context_id: str = "default",
        *,
        timeout_ms: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Call[RunResult]:
        """Runs code in a context and answers its :class:`RunResult` (output, rich results
        such as figures and the last expression's value, the error if it raised). ``env`` is
        set for this run only."""
        return Call(self._run(code, context_id, timeout_ms, env), as_model(RunResult))

    @sse_op
    def run_stream(
        self,
        code: str,
        context_id: str = "default",
        *,
        timeout_ms: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> SseCall[RunEvent]:
        """Runs code in a context, streaming :class:`RunOutput` events as it prints, then a
        :class:`RunDone` with the result (a failure after output went out raises)."""
        return SseCall(_sse(self._run(code, context_id, timeout_ms, env)), decode_run_event)

    @op
    def restart(self, context_id: str) -> Call[ContextInfo]:
        """Restarts a context's interpreter (its state is lost)."""
        return Call(Request("POST", f"{self._ctx(context_id)}/restart"), as_model(ContextInfo))

    @op
    def delete(self, context_id: str) -> Call[None]:
        """Ends a context."""
        return Call(Request("DELETE", self._ctx(context_id)), no_content)


# --- operations answering session handles ---


class sandbox_op(_Descriptor, Generic[P]):
    """A call answering a session: returns its :class:`SandboxBase` handle."""

    def __init__(self, build: Callable[Concatenate[Any, P], Call[SessionInfo]]) -> None:
        super().__init__(build)

    @overload
    def __get__(self, obj: None, owner: type) -> sandbox_op[P]: ...
    @overload
    def __get__(self, obj: Bound[Sync], owner: type) -> Callable[P, SandboxBase[Sync]]: ...
    @overload
    def __get__(
        self, obj: Bound[Async], owner: type
    ) -> Callable[P, Awaitable[SandboxBase[Async]]]: ...
    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is None:
            return self
        t = obj._t
        return _bind(self._build, obj, lambda call: t.run(call.map(lambda s: SandboxBase(t, s))))


class sandboxes_op(_Descriptor, Generic[P]):
    """A call answering sessions: returns their :class:`SandboxBase` handles."""

    def __init__(self, build: Callable[Concatenate[Any, P], Call[List[SessionInfo]]]) -> None:
        super().__init__(build)

    @overload
    def __get__(self, obj: None, owner: type) -> sandboxes_op[P]: ...
    @overload
    def __get__(self, obj: Bound[Sync], owner: type) -> Callable[P, List[SandboxBase[Sync]]]: ...
    @overload
    def __get__(
        self, obj: Bound[Async], owner: type
    ) -> Callable[P, Awaitable[List[SandboxBase[Async]]]]: ...
    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is None:
            return self
        t = obj._t
        return _bind(
            self._build,
            obj,
            lambda call: t.run(call.map(lambda ss: [SandboxBase(t, s) for s in ss])),
        )


class SandboxBase(Bound[F]):
    """One session: a sandbox to run code in. Use :data:`Sandbox` (blocking) or
    :data:`AsyncSandbox` (async); get one from ``client.sessions``.

    Attributes:
        id: The session id.
        info: The session as last answered by the daemon (``None`` for a handle made by
            ``sessions.connect`` until :meth:`refresh`).
        files: Its files.
        execs: Its followed and background execs.
        contexts: Its code-interpreter contexts.
    """

    def __init__(self, transport: Any, session: SessionInfo | str) -> None:
        super().__init__(transport)
        self.info: SessionInfo | None = session if isinstance(session, SessionInfo) else None
        self.id: str = session.id if isinstance(session, SessionInfo) else session
        self._path = f"{SESSIONS}/{_seg(self.id)}"
        self.files: Files[F] = Files(transport, self._path)
        self.execs: Execs[F] = Execs(transport, self._path)
        self.contexts: Contexts[F] = Contexts(transport, self._path)

    def __repr__(self) -> str:
        state = self.info.state if self.info else "?"
        return f"<Sandbox {self.id} {state}>"

    def _remember(self, info: SessionInfo) -> SessionInfo:
        self.info = info
        return info

    def _session_call(self, method: str, suffix: str = "", json: Any = None) -> Call[SessionInfo]:
        request = Request(method, self._path + suffix, json=json)
        return Call(request, as_model(SessionInfo)).map(self._remember)

    def __enter__(self: SandboxBase[Sync]) -> SandboxBase[Sync]:
        return self

    def __exit__(self: SandboxBase[Sync], *exc: object) -> None:
        try:
            self.delete()
        except NotFoundError:
            pass

    async def __aenter__(self: SandboxBase[Async]) -> SandboxBase[Async]:
        return self

    async def __aexit__(self: SandboxBase[Async], *exc: object) -> None:
        try:
            await self.delete()
        except NotFoundError:
            pass

    # --- lifecycle ---

    @op
    def refresh(self) -> Call[SessionInfo]:
        """Fetches the session's current description (also kept in :attr:`info`). A deleted or
        expired session answers with state ``stopped``."""
        return self._session_call("GET")

    @op
    def delete(self) -> Call[None]:
        """Ends the session and destroys its sandbox."""
        return Call(Request("DELETE", self._path), no_content)

    @op
    def set_timeout(self, timeout_s: int) -> Call[SessionInfo]:
        """Sets the session to expire ``timeout_s`` seconds from now."""
        return self._session_call("POST", "/timeout", {"timeout_s": timeout_s})

    @op
    def pause(self, memory: bool | None = None) -> Call[SessionInfo]:
        """Pauses the session: with ``memory`` (the default) its processes are kept; with
        ``memory=False`` only its files, durably (resume boots it afresh)."""
        return self._session_call("POST", "/pause", body(memory=memory))

    @op
    def resume(self) -> Call[SessionInfo]:
        """Resumes a paused session."""
        return self._session_call("POST", "/resume")

    @sandboxes_op
    def fork(self, count: int | None = None) -> Call[List[SessionInfo]]:
        """Makes ``count`` (1–100, default 1) copies of the session with its files as they are
        now and its settings; answers their handles."""
        request = Request("POST", f"{self._path}/fork", json=body(count=count))
        return Call(request, as_list(SessionInfo, "sessions"))

    @op
    def snapshot(self, name: str | None = None) -> Call[SnapshotInfo]:
        """Captures the session's filesystem (consistently: its processes are frozen meanwhile)."""
        request = Request("POST", f"{self._path}/snapshot", json=body(name=name), timeout=LONG)
        return Call(request, as_model(SnapshotInfo))

    @op
    def restore(self, snapshot_id: str) -> Call[SessionInfo]:
        """Replaces the session's sandbox by a fresh one on a snapshot's filesystem (its
        processes end; id, limits, network, env and timeout stay)."""
        return self._session_call("POST", "/restore", {"snapshot_id": snapshot_id})

    @op
    def set_network(self, network: Network | Mapping[str, Any]) -> Call[SessionInfo]:
        """Replaces the session's network policy; its new connections and lookups follow it
        (open ones keep running)."""
        return self._session_call("PUT", "/network", to_json(network))

    @op
    def metrics(self) -> Call[SessionMetrics]:
        """Live resource use (CPU, memory, processes, disk)."""
        return Call(Request("GET", f"{self._path}/metrics"), as_model(SessionMetrics))

    @op
    def kill_processes(self) -> Call[int]:
        """Kills every process in the session and keeps it running; answers how many."""
        return Call(Request("POST", f"{self._path}/kill-processes"), as_field("killed", int))

    @op
    def events(self, after: int = 0, limit: int | None = None) -> Call[SessionEventList]:
        """The session's event log (a stopped session's too), oldest first: the events numbered
        above ``after``, at most ``limit`` (1–500, the server's 500 by default). To follow it,
        ask again with ``after`` the last ``seq`` seen. The log is written just behind the calls
        that make its events, so an event may show up a moment after its call's answer."""
        request = Request("GET", f"{self._path}/events", params=query(after=after, limit=limit))
        return Call(request, as_model(SessionEventList))

    # --- exec ---

    @op
    def exec(self, cmd: Sequence[str] | None = None, **options: Unpack[ExecOptions]) -> Call[ExecResult]:
        """Runs a program to its end and answers its result: ``cmd`` (an argv, no shell), or
        ``shell=`` or ``code=`` (see :class:`ExecOptions`). A killed program still answers
        what it printed, with its ``verdict``."""
        return Call(_exec_request(self._path, cmd, options), as_model(ExecResult))

    @sse_op
    def exec_stream(
        self, cmd: Sequence[str] | None = None, **options: Unpack[ExecOptions]
    ) -> SseCall[ExecEvent]:
        """Runs a program, streaming its events as it prints: :class:`ExecStart`,
        :class:`ExecOutput`, :class:`ExecTruncated`, then :class:`ExecExit`. Closing the
        stream early cancels the program."""
        return SseCall(_sse(_exec_request(self._path, cmd, options)), decode_exec_event)

    # --- live ---

    @ws_op(Terminal, AsyncTerminal)
    def terminal(
        self,
        cmd: str | None = None,
        args: Sequence[str] = (),
        *,
        cols: int | None = None,
        rows: int | None = None,
        cwd: str | None = None,
    ) -> WsCall:
        """Opens an interactive PTY (a context manager yielding a :class:`Terminal`, an async
        one yielding an :class:`AsyncTerminal`): the login shell, or ``cmd`` with ``args``
        exec'd directly."""
        params = query(cmd=cmd, cols=cols, rows=rows, cwd=cwd) + [("arg", a) for a in args]
        return WsCall(Request("GET", f"{self._path}/terminal", params=params))

    @ws_op(Watch, AsyncWatch)
    def watch(self, path: str, recursive: bool = False) -> WsCall:
        """Watches a directory for changes (a context manager yielding a :class:`Watch`, an
        async one yielding an :class:`AsyncWatch`)."""
        params = query(path=path, recursive=recursive or None)
        return WsCall(Request("GET", f"{self._path}/fs/watch", params=params))

    @op
    def upstream(self) -> Call[UpstreamInfo]:
        """The session's dev server (a pinned port, or the one listening) as the preview
        proxy reaches it."""
        return Call(Request("GET", f"{self._path}/upstream"), as_model(UpstreamInfo))

    @op
    def pin_preview(self, port: int) -> Call[UpstreamInfo]:
        """Pins the port the preview proxy forwards to."""
        request = Request("POST", f"{self._path}/preview", json={"port": port})
        return Call(request, as_model(UpstreamInfo))

    @op
    def report_error(
        self, source: str, message: str, stack: str | None = None
    ) -> Call[ErrorEntry]:
        """Records an error a client saw (e.g. in the app the session serves)."""
        payload = body(source=source, message=message, stack=stack)
        return Call(Request("POST", f"{self._path}/errors", json=payload), as_model(ErrorEntry))

    @op
    def errors(self) -> Call[List[ErrorEntry]]:
        """The errors reported for this session, oldest first (the last 50)."""
        return Call(Request("GET", f"{self._path}/errors"), as_list(ErrorEntry, "errors"))


#: A session handle of the blocking client.
Sandbox = SandboxBase[Sync]
#: A session handle of the async client.
AsyncSandbox = SandboxBase[Async]


class Sessions(Bound[F]):
    """This tenant's sessions."""

    @sandbox_op
    def create(
        self,
        language: str | None = None,
        *,
        image: str | None = None,
        runtime: str | None = None,
        limits: Limits | Mapping[str, int] | None = None,
        network: Network | Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: int | None = None,
        metadata: Mapping[str, str] | None = None,
        lifecycle: Lifecycle | Mapping[str, Any] | None = None,
        volumes: Sequence[VolumeMount | Mapping[str, Any]] | None = None,
        from_snapshot: str | None = None,
        secrets: Sequence[str] | None = None,
    ) -> Call[SessionInfo]:
        """Creates a session and answers its handle: ``language`` ``"python"``, ``"node"`` or
        ``"bash"`` (default), or an ``image``; ``runtime`` ``"jail"`` or ``"microvm"``;
        ``limits``, ``network`` policy, ``env``, ``timeout_s``, ``metadata``, ``lifecycle``,
        ``volumes`` to mount, or ``from_snapshot`` to start from a snapshot's files.
        ``secrets`` names the tenant's secrets (:class:`Secrets`) the session may use: its
        environment holds a placeholder for each, which the daemon replaces with the value in
        request headers to the secret's hosts (the network must be ``open`` or
        ``allowlist``)."""
        payload = body(
            language=language,
            image=image,
            runtime=runtime,
            limits=limits,
            network=network,
            env=env,
            timeout_s=timeout_s,
            metadata=metadata,
            lifecycle=lifecycle,
            volumes=list(volumes) if volumes is not None else None,
            from_snapshot=from_snapshot,
            secrets=list(secrets) if secrets is not None else None,
        )
        return Call(Request("POST", SESSIONS, json=payload, timeout=LONG), as_model(SessionInfo))

    @sandbox_op
    def get(self, session_id: str) -> Call[SessionInfo]:
        """Fetches a session by id (another tenant's answers :class:`NotFoundError`)."""
        return Call(Request("GET", f"{SESSIONS}/{_seg(session_id)}"), as_model(SessionInfo))

    @sandboxes_op
    def list(self) -> Call[List[SessionInfo]]:
        """This tenant's sessions that have not ended."""
        return Call(Request("GET", SESSIONS), as_list(SessionInfo, "sessions"))

    def connect(self, session_id: str) -> SandboxBase[F]:
        """A handle of a session by id, without asking the daemon."""
        return SandboxBase(self._t, session_id)


class Snapshots(Bound[F]):
    """This tenant's snapshots (``sandbox.snapshot()`` takes one)."""

    @op
    def list(self) -> Call[List[SnapshotInfo]]:
        """This tenant's snapshots."""
        request = Request("GET", "/v1/sandbox/snapshots")
        return Call(request, as_list(SnapshotInfo, "snapshots"))

    @op
    def get(self, snapshot_id: str) -> Call[SnapshotInfo]:
        """One snapshot."""
        request = Request("GET", f"/v1/sandbox/snapshots/{_seg(snapshot_id)}")
        return Call(request, as_model(SnapshotInfo))

    @op
    def delete(self, snapshot_id: str) -> Call[None]:
        """Deletes a snapshot."""
        request = Request("DELETE", f"/v1/sandbox/snapshots/{_seg(snapshot_id)}")
        return Call(request, no_content)


class Images(Bound[F]):
    """The images sessions run on (``"image": name`` on create)."""

    @op
    def list(self) -> Call[List[ImageInfo]]:
        """Every image of the daemon, ``host`` first."""
        return Call(Request("GET", "/v1/sandbox/images"), as_list(ImageInfo, "images"))

    @op
    def get(self, name: str) -> Call[ImageInfo]:
        """One image by any of its names (``python``, ``python:3.11``), with its build log."""
        return Call(Request("GET", f"/v1/sandbox/images/{_seg(name)}"), as_model(ImageInfo))

    @op
    def delete(self, name: str) -> Call[ImageInfo]:
        """Deletes an image and all its names (admin keys only); one in use by a session or a
        warm pool raises :class:`ConflictError` (``SANDBOX-IMAGE-IN-USE``)."""
        request = Request("DELETE", f"/v1/sandbox/images/{_seg(name)}")
        return Call(request, as_model(ImageInfo))


class VolumeFiles(_FileReads[F]):
    """Files of a volume, without a session. Paths are from the volume's root; new files
    and directories belong to ``uid``/``gid`` (default 1000) with ``mode``."""

    @op
    def write(
        self,
        path: str,
        data: Content,
        *,
        overwrite: bool | None = None,
        uid: int | None = None,
        gid: int | None = None,
        mode: int | None = None,
    ) -> Call[FileEntry]:
        """Writes a file, streaming ``data`` (as for session files); ``overwrite=False``
        refuses an existing file (:class:`ConflictError`)."""
        params = query(path=path, overwrite=overwrite, uid=uid, gid=gid, mode=mode)
        request = Request("PUT", f"{self._base}/files", params=params, content=data)
        return Call(request, as_model(FileEntry))

    @op
    def list(self, path: str = "/", depth: int | None = None) -> Call[FileList]:
        """Lists a directory, ``depth`` levels deep (1 by default)."""
        return _list(self._base, path, depth)

    @op
    def remove(self, path: str) -> Call[None]:
        """Deletes a file or a directory with everything in it."""
        request = Request("DELETE", f"{self._base}/files", params=query(path=path))
        return Call(request, no_content)

    @op
    def mkdir(
        self,
        path: str,
        *,
        parents: bool | None = None,
        uid: int | None = None,
        gid: int | None = None,
        mode: int | None = None,
    ) -> Call[FileEntry]:
        """Creates a directory; with ``parents`` its missing parents too (an existing
        directory is then fine)."""
        payload = body(path=path, parents=parents, uid=uid, gid=gid, mode=mode)
        request = Request("POST", f"{self._base}/files/mkdir", json=payload)
        return Call(request, as_model(FileEntry))

    @op
    def set_metadata(
        self,
        path: str,
        *,
        uid: int | None = None,
        gid: int | None = None,
        mode: int | None = None,
    ) -> Call[FileEntry]:
        """Changes a file's owner or permission bits (what is left out stays)."""
        payload = body(uid=uid, gid=gid, mode=mode)
        request = Request("PATCH", f"{self._base}/files", params=query(path=path), json=payload)
        return Call(request, as_model(FileEntry))


class Volumes(Bound[F]):
    """This tenant's persistent volumes (named or by id)."""

    def _vol(self, volume: str) -> str:
        return f"/v1/sandbox/volumes/{_seg(volume)}"

    @op
    def create(
        self, name: str, size_mib: int | None = None, *, from_volume: str | None = None
    ) -> Call[VolumeInfo]:
        """Creates a volume of ``size_mib`` (server default otherwise), or a copy of
        ``from_volume``."""
        payload = body(name=name, size_mib=size_mib, from_volume=from_volume)
        request = Request("POST", "/v1/sandbox/volumes", json=payload, timeout=LONG)
        return Call(request, as_model(VolumeInfo))

    @op
    def list(self) -> Call[List[VolumeInfo]]:
        """This tenant's volumes."""
        return Call(Request("GET", "/v1/sandbox/volumes"), as_list(VolumeInfo, "volumes"))

    @op
    def get(self, volume: str) -> Call[VolumeInfo]:
        """One volume (id or name)."""
        return Call(Request("GET", self._vol(volume)), as_model(VolumeInfo))

    @op
    def delete(self, volume: str) -> Call[None]:
        """Deletes a volume (:class:`VolumeBusyError` while a session has it mounted)."""
        return Call(Request("DELETE", self._vol(volume)), no_content)

    def files(self, volume: str) -> VolumeFiles[F]:
        """The files of a volume (id or name)."""
        return VolumeFiles(self._t, self._vol(volume))


class Secrets(Bound[F]):
    """This tenant's secrets: values sealed at rest, never answered, injected at egress into
    the request headers of sessions created with them (``secrets=`` on create)."""

    @op
    def put(self, name: str, value: str, hosts: Sequence[str]) -> Call[SecretInfo]:
        """Creates or replaces the secret ``name`` (the environment variable sessions see),
        sent only to ``hosts`` (``"api.example.com"``, ``"*.example.com:443"``). Running
        sessions bound to it take a new value from their next connection on."""
        payload = {"name": name, "value": value, "hosts": list(hosts)}
        return Call(Request("POST", "/v1/sandbox/secrets", json=payload), as_model(SecretInfo))

    @op
    def list(self) -> Call[List[SecretInfo]]:
        """This tenant's secrets, without their values."""
        return Call(Request("GET", "/v1/sandbox/secrets"), as_list(SecretInfo, "secrets"))

    @op
    def delete(self, name: str) -> Call[None]:
        """Deletes a secret; sessions bound to it inject it no more."""
        return Call(Request("DELETE", f"/v1/sandbox/secrets/{_seg(name)}"), no_content)


class Webhooks(Bound[F]):
    """This tenant's webhook endpoints: session lifecycle events and exec verdicts, POSTed
    as JSON signed with the endpoint's secret (``Koder-Signature: t=<unix s>,v1=<hex
    HMAC-SHA256(secret, "<t>.<raw body>")>``)."""

    @op
    def create(
        self,
        url: str,
        events: Sequence[str] | None = None,
        secret: str | None = None,
    ) -> Call[WebhookInfo]:
        """Registers ``url`` for ``events`` (``session.created``, ``session.paused``,
        ``session.resumed``, ``session.stopped``, ``exec.verdict``; none: all). Without a
        ``secret`` (16-256 characters) one is made; either way this answer is the only one
        that shows it."""
        payload = body(url=url, events=list(events) if events is not None else None, secret=secret)
        request = Request("POST", "/v1/sandbox/webhooks", json=payload)
        return Call(request, as_model(WebhookInfo))

    @op
    def list(self) -> Call[List[WebhookInfo]]:
        """This tenant's endpoints, without their secrets."""
        request = Request("GET", "/v1/sandbox/webhooks")
        return Call(request, as_list(WebhookInfo, "webhooks"))

    @op
    def deliveries(self, webhook_id: str) -> Call[List[WebhookDelivery]]:
        """An endpoint's deliveries, newest first (at most 100)."""
        request = Request("GET", f"/v1/sandbox/webhooks/{_seg(webhook_id)}/deliveries")
        return Call(request, as_list(WebhookDelivery, "deliveries"))

    @op
    def delete(self, webhook_id: str) -> Call[None]:
        """Removes an endpoint; its queued deliveries are dropped."""
        request = Request("DELETE", f"/v1/sandbox/webhooks/{_seg(webhook_id)}")
        return Call(request, no_content)


class Admin(Bound[F]):
    """Tenant administration; needs a client made with an operator (admin) key."""

    @op
    def list_tenants(self) -> Call[List[TenantInfo]]:
        """Every tenant."""
        request = Request("GET", "/v1/sandbox/admin/tenants")
        return Call(request, as_list(TenantInfo, "tenants"))

    @op
    def get_tenant(self, tenant_id: str) -> Call[TenantInfo]:
        """One tenant."""
        request = Request("GET", f"/v1/sandbox/admin/tenants/{_seg(tenant_id)}")
        return Call(request, as_model(TenantInfo))

    @op
    def put_tenant(
        self,
        tenant_id: str,
        plan: str,
        *,
        max_sessions: int | None = None,
        daily_session_minutes: int | None = None,
        name: str | None = None,
    ) -> Call[TenantInfo]:
        """Creates or updates a tenant: its ``plan`` (``none`` has no sandbox access) and
        quotas."""
        payload = body(
            plan=plan,
            max_sessions=max_sessions,
            daily_session_minutes=daily_session_minutes,
            name=name,
        )
        request = Request("PUT", f"/v1/sandbox/admin/tenants/{_seg(tenant_id)}", json=payload)
        return Call(request, as_model(TenantInfo))

    @op
    def issue_key(self, tenant_id: str) -> Call[IssuedKey]:
        """Issues a new API key for a tenant (shown only in this answer)."""
        request = Request("POST", f"/v1/sandbox/admin/tenants/{_seg(tenant_id)}/keys")
        return Call(request, as_model(IssuedKey))


class ClientBase(Bound[F]):
    """What both clients offer; see :class:`Client` and :class:`AsyncClient`.

    Attributes:
        sessions: This tenant's sessions.
        snapshots: This tenant's snapshots.
        volumes: This tenant's volumes.
        secrets: This tenant's secrets.
        webhooks: This tenant's webhook endpoints.
        images: The daemon's images.
        admin: Tenant administration (needs an admin key).
    """

    def __init__(self, transport: Any) -> None:
        super().__init__(transport)
        self.sessions: Sessions[F] = Sessions(transport)
        self.snapshots: Snapshots[F] = Snapshots(transport)
        self.volumes: Volumes[F] = Volumes(transport)
        self.secrets: Secrets[F] = Secrets(transport)
        self.webhooks: Webhooks[F] = Webhooks(transport)
        self.images: Images[F] = Images(transport)
        self.admin: Admin[F] = Admin(transport)

    @op
    def health(self) -> Call[bool]:
        """Whether the daemon serves requests (``/healthz``)."""
        return Call(Request("GET", "/healthz"), lambda r: json_body(r).get("status") == "ok")

    @op
    def network_audit(
        self,
        session_id: str | None = None,
        *,
        allowed: bool | None = None,
        before: int | None = None,
        limit: int | None = None,
    ) -> Call[AuditPage]:
        """Network attempts of this tenant's sandboxes, newest first."""
        params = query(session_id=session_id, allowed=allowed, before=before, limit=limit)
        request = Request("GET", "/v1/sandbox/audit/network", params=params)
        return Call(request, as_model(AuditPage))


__all__ = [
    "ExecOptions",
    "SandboxBase",
    "Sandbox",
    "AsyncSandbox",
    "Files",
    "Execs",
    "Contexts",
    "Sessions",
    "Snapshots",
    "Images",
    "Volumes",
    "VolumeFiles",
    "Secrets",
    "Webhooks",
    "Admin",
    "ClientBase",
]
