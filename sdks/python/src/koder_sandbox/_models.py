"""The API's JSON shapes as dataclasses, and the one generic decoder that builds them.

Answers are decoded by field name and type hint, so a field the daemon adds later is ignored
instead of breaking an older SDK; a field the API promises but the answer lacks is a
:class:`~koder_sandbox.ProtocolError`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, TypeVar, Union

from ._errors import ProtocolError

T = TypeVar("T")

SessionState = Literal["starting", "running", "paused", "stopped", "lost"]
NetworkMode = Literal["none", "open", "allowlist"]
EntryType = Literal["file", "dir", "symlink", "other"]


# --- request options (also used in answers where the API echoes them) ---


@dataclass(frozen=True)
class Limits:
    """Resource limits of a session; ``None`` leaves the server's default."""

    cpu_millis: int | None = None
    memory_mib: int | None = None
    disk_mib: int | None = None
    pids: int | None = None


@dataclass(frozen=True)
class Network:
    """Network policy: ``none`` (loopback only), ``open``, or ``allowlist`` with ``allow``
    entries (``"pypi.org"``, ``"10.1.0.0/16:443"``); ``deny`` entries are refused even where
    ``allow`` (or ``open``) covers them. Answers show each entry as pinned."""

    mode: NetworkMode = "none"
    allow: list[str] = field(default_factory=list)
    deny: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Lifecycle:
    """What a session's timeout does and whether requests wake a paused session."""

    on_timeout: Literal["kill", "pause"] | None = None
    auto_resume: bool | None = None
    keep_memory: bool | None = None


@dataclass(frozen=True)
class VolumeMount:
    """A volume (name or id) to mount at an absolute ``path`` in a new session."""

    name: str
    path: str
    read_only: bool = False


# --- answers ---


@dataclass(frozen=True)
class SessionVolume:
    """A volume as a session has it mounted."""

    volume_id: str
    name: str
    path: str
    read_only: bool = False


@dataclass(frozen=True)
class SessionInfo:
    """A session as the daemon describes it."""

    id: str
    tenant_id: str
    language: str
    image: str
    runtime: str
    state: SessionState
    created_at: _dt.datetime
    expires_at: _dt.datetime
    limits: Limits
    network: Network
    metadata: dict[str, str] = field(default_factory=dict)
    end_reason: str | None = None
    volumes: list[SessionVolume] = field(default_factory=list)


@dataclass(frozen=True)
class ExecResult:
    """A finished exec. In a streamed ``exit`` event ``stdout``/``stderr`` are empty (the
    output came as events before it)."""

    exec_id: str
    duration_ms: int
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    exit_code: int | None = None
    signal: int | None = None
    peak_memory_kib: int | None = None
    verdict: str | None = None


@dataclass(frozen=True)
class ExecStatus:
    """A followed (streamed or background) exec: running, or exited with its ``result``."""

    exec_id: str
    command: list[str]
    background: bool
    state: Literal["running", "exited"]
    started_at: _dt.datetime
    pid: int | None = None
    result: ExecResult | None = None


@dataclass(frozen=True)
class FileEntry:
    """A file, directory or symlink inside a sandbox or volume."""

    name: str
    path: str
    type: EntryType
    size: int
    mode: int
    modified_at: _dt.datetime
    uid: int | None = None
    gid: int | None = None
    symlink_target: str | None = None


@dataclass(frozen=True)
class FileList:
    """A directory listing; ``truncated`` when the server cut it at its entry limit."""

    entries: list[FileEntry]
    truncated: bool = False

    def __iter__(self) -> typing.Iterator[FileEntry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


@dataclass(frozen=True)
class SessionMetrics:
    """Live resource use of a session."""

    cpu_used_ms: int
    memory_current_kib: int
    memory_peak_kib: int
    oom_kills: int
    pids_current: int
    disk_used_kib: int
    disk_total_kib: int
    memory_limit_kib: int | None = None
    pids_limit: int | None = None


@dataclass(frozen=True)
class SessionEvent:
    """One thing that happened to a session, as its webhook delivers it: ``type``
    ``session.created``, ``session.paused``, ``session.resumed``, ``session.stopped`` (``data``
    has its ``cause`` and ``reason``) or ``exec.verdict`` (an exec its limits or a signal
    ended: ``verdict``, ``exit_code``, ``signal``, ``duration_ms``). ``seq`` numbers the
    session's events from 1; ``id`` is the webhook delivery's."""

    seq: int
    id: str
    type: str
    created_at: _dt.datetime
    data: dict[str, Any]


@dataclass(frozen=True)
class SessionEventList:
    """A page of a session's event log, oldest first; when ``more``, pass the last ``seq`` as
    ``after`` for the next page."""

    events: list[SessionEvent]
    more: bool = False

    def __iter__(self) -> typing.Iterator[SessionEvent]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)


@dataclass(frozen=True)
class SnapshotInfo:
    """A captured filesystem of a session."""

    snapshot_id: str
    size_bytes: int
    image: str
    language: str
    runtime: str
    created_at: _dt.datetime
    expires_at: _dt.datetime
    name: str | None = None
    session_id: str | None = None


@dataclass(frozen=True)
class VolumeUse:
    """One session's mount of a volume."""

    session_id: str
    path: str
    read_only: bool


@dataclass(frozen=True)
class VolumeInfo:
    """A persistent volume."""

    volume_id: str
    name: str
    size_mib: int
    backend: str
    created_at: _dt.datetime
    used_bytes: int | None = None
    mounts: list[VolumeUse] = field(default_factory=list)


@dataclass(frozen=True)
class ImageLanguage:
    """A language an image's sessions can run."""

    name: str
    interpreter: str
    version: str | None = None


@dataclass(frozen=True)
class ImageInfo:
    """An image sessions run on (``host``, or a language pack built from Debian)."""

    name: str
    kind: str
    workdir: str
    user: str
    names: list[str] = field(default_factory=list)
    languages: list[ImageLanguage] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    digest: str | None = None
    created_at: _dt.datetime | None = None
    size_bytes: int | None = None
    recipe: Any = None
    build_log: str | None = None
    in_use: bool = False


@dataclass(frozen=True)
class ContextInfo:
    """A code-interpreter context (one long-lived interpreter)."""

    context_id: str
    language: str
    execution_count: int
    cwd: str


@dataclass(frozen=True)
class RichOutput:
    """One displayable value of a run in every representation it offered (``png`` is base64)."""

    is_main_result: bool = False
    text: str | None = None
    html: str | None = None
    markdown: str | None = None
    json: Any = None
    png: str | None = None
    svg: str | None = None
    jpeg: str | None = None
    latex: str | None = None
    data: Any = None
    chart: Any = None
    pdf: str | None = None
    javascript: str | None = None
    extra: Any = None


@dataclass(frozen=True)
class RunError:
    """The exception a run raised (``TimeoutError``/``InterpreterDied`` when it was killed)."""

    name: str
    value: str
    traceback: str


@dataclass(frozen=True)
class RunResult:
    """A finished interpreter run. In a streamed ``result`` event ``stdout``/``stderr`` are
    empty (the output came as events before it)."""

    execution_count: int
    duration_ms: int
    restarted: bool
    results: list[RichOutput] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    error: RunError | None = None
    verdict: str | None = None


@dataclass(frozen=True)
class UpstreamInfo:
    """The session's dev server as the preview proxy reaches it."""

    url: str
    port: int
    pinned: bool
    preview_path: str


@dataclass(frozen=True)
class ErrorEntry:
    """An error a client reported for a session."""

    at: _dt.datetime
    source: str
    message: str
    stack: str | None = None


@dataclass(frozen=True)
class TenantInfo:
    """A tenant as an administrator sees it."""

    id: str
    name: str
    plan: str
    created_at: _dt.datetime
    live_sessions: int
    session_minutes_today: int
    max_sessions: int | None = None
    daily_session_minutes: int | None = None


@dataclass(frozen=True)
class IssuedKey:
    """A newly issued API key (shown once)."""

    tenant_id: str
    api_key: str


@dataclass(frozen=True)
class AuditEntry:
    """One network attempt of a sandbox."""

    id: int
    at: _dt.datetime
    session_id: str
    proto: str
    dest: str
    port: int
    allowed: bool
    reason: str
    name: str | None = None


@dataclass(frozen=True)
class SecretInfo:
    """A secret as listed: never its value."""

    name: str
    hosts: list[str]
    created_at: _dt.datetime


@dataclass(frozen=True)
class WebhookInfo:
    """A webhook endpoint; ``secret`` (what deliveries are signed with) only in the answer
    that created it."""

    id: str
    url: str
    events: list[str]
    created_at: _dt.datetime
    secret: str | None = None


@dataclass(frozen=True)
class WebhookDelivery:
    """One event sent (or being sent) to an endpoint: ``state`` ``pending``, ``delivered`` or
    ``failed`` (its attempts used up)."""

    id: str
    event_id: str
    event_type: str
    state: Literal["pending", "delivered", "failed"]
    attempts: int
    created_at: _dt.datetime
    updated_at: _dt.datetime
    next_attempt_at: _dt.datetime | None = None
    last_status: int | None = None
    last_error: str | None = None


@dataclass(frozen=True)
class AuditPage:
    """A page of audit entries, newest first; pass ``next_before`` as ``before`` for older ones."""

    entries: list[AuditEntry]
    next_before: int | None = None


# --- encoding and decoding ---


def to_json(value: Any) -> Any:
    """A request option as JSON: dataclasses become objects without their ``None`` fields."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: to_json(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if getattr(value, f.name) is not None
        }
    if isinstance(value, Mapping):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value


_FRACTION = re.compile(r"\.(\d+)")


def _parse_datetime(text: str) -> _dt.datetime:
    # fromisoformat before 3.11 takes neither "Z" nor other than 3 or 6 fraction digits.
    text = text.replace("Z", "+00:00").replace("z", "+00:00")
    text = _FRACTION.sub(lambda m: "." + m.group(1)[:6].ljust(6, "0"), text, count=1)
    return _dt.datetime.fromisoformat(text)


_hints_cache: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _hints_cache:
        _hints_cache[cls] = typing.get_type_hints(cls)
    return _hints_cache[cls]


def _convert(tp: Any, value: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        if value is None:
            return None
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _convert(inner[0], value) if len(inner) == 1 else value
    if origin is list:
        if not isinstance(value, list):
            raise TypeError(f"expected a list, got {value!r}")
        (item,) = typing.get_args(tp)
        return [_convert(item, v) for v in value]
    if origin is dict:
        if not isinstance(value, dict):
            raise TypeError(f"expected an object, got {value!r}")
        return {k: _convert(typing.get_args(tp)[1], v) for k, v in value.items()}
    if tp is _dt.datetime:
        return _parse_datetime(value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise TypeError(f"expected an object for {tp.__name__}, got {value!r}")
        hints = _hints(tp)
        known = {f.name for f in dataclasses.fields(tp)}
        return tp(**{k: _convert(hints[k], v) for k, v in value.items() if k in known})
    return value


def decode(cls: type[T], value: Any) -> T:
    """Builds ``cls`` (a dataclass of this module, or a list/dict of them) from parsed JSON."""
    try:
        return typing.cast(T, _convert(cls, value))
    except (TypeError, ValueError, KeyError) as e:
        raise ProtocolError(f"unexpected answer for {cls}: {e}") from e
