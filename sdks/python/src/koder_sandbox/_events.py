"""Typed events of the daemon's Server-Sent Events streams, and their decoders.

Exec streams (``POST .../exec`` with SSE, ``GET .../execs/{id}/stream``): ``start``,
``stdout``/``stderr`` (``data`` text, or ``data_b64`` for bytes that are not UTF-8),
``truncated`` (this follower fell behind), ``exit`` (the result without its output).
Interpreter runs (``POST .../contexts/{cid}/run`` with SSE): ``stdout``/``stderr``, then
``result`` (the run without its output) or ``error`` (a failure after output went out).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, replace
from typing import Any, Literal, Union

from httpx_sse import ServerSentEvent

from ._errors import ProtocolError, error_from_body
from ._models import ExecResult, RunResult, decode

Stream = Literal["stdout", "stderr"]


@dataclass(frozen=True)
class ExecStart:
    """The exec started; its id names it in ``execs``."""

    exec_id: str


@dataclass(frozen=True)
class ExecOutput:
    """A chunk of output as the program printed it."""

    stream: Stream
    data: bytes

    @property
    def text(self) -> str:
        """The chunk as text (undecodable bytes replaced)."""
        return self.data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class ExecTruncated:
    """This follower fell behind and ``dropped_chunks`` output chunks were skipped."""

    dropped_chunks: int


@dataclass(frozen=True)
class ExecExit:
    """The exec ended; ``result`` has everything but the output (which came as events)."""

    result: ExecResult


ExecEvent = Union[ExecStart, ExecOutput, ExecTruncated, ExecExit]


@dataclass(frozen=True)
class RunOutput:
    """Text a run printed, as it printed it."""

    stream: Stream
    text: str


@dataclass(frozen=True)
class RunDone:
    """The run ended; ``result`` has everything but the output (which came as events)."""

    result: RunResult


RunEvent = Union[RunOutput, RunDone]


def _payload(sse: ServerSentEvent) -> Any:
    try:
        return json.loads(sse.data)
    except ValueError as e:
        raise ProtocolError(f"bad {sse.event!r} event data: {sse.data[:200]!r}") from e


def _field(payload: Any, key: str, event: str) -> Any:
    if not isinstance(payload, dict) or key not in payload:
        raise ProtocolError(f"{event!r} event without {key!r}: {str(payload)[:200]}")
    return payload[key]


def _stream(name: str) -> Stream:
    return "stdout" if name == "stdout" else "stderr"


def _chunk(payload: Any, event: str) -> bytes:
    if isinstance(payload, dict) and "data_b64" in payload:
        return base64.b64decode(payload["data_b64"])
    return str(_field(payload, "data", event)).encode()


def decode_exec_event(sse: ServerSentEvent) -> ExecEvent | None:
    """One exec stream event, or ``None`` for an event this SDK does not know."""
    name = sse.event
    if name not in ("start", "stdout", "stderr", "truncated", "exit"):
        return None
    payload = _payload(sse)
    if name == "start":
        return ExecStart(str(_field(payload, "exec_id", name)))
    if name == "stdout" or name == "stderr":
        return ExecOutput(_stream(name), _chunk(payload, name))
    if name == "truncated":
        return ExecTruncated(int(_field(payload, "dropped_chunks", name)))
    return ExecExit(decode(ExecResult, payload))


def decode_run_event(sse: ServerSentEvent) -> RunEvent | None:
    """One interpreter run event (an ``error`` event raises it), or ``None`` for an event this
    SDK does not know."""
    name = sse.event
    if name not in ("stdout", "stderr", "result", "error"):
        return None
    payload = _payload(sse)
    if name == "stdout" or name == "stderr":
        return RunOutput(_stream(name), str(_field(payload, "data", name)))
    if name == "error":
        raise error_from_body(payload, None)
    return RunDone(decode(RunResult, payload))


class ExecCollector:
    """Builds an exec's full result from its events (output joined, then the exit)."""

    def __init__(self) -> None:
        self._out: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
        self.result: ExecResult | None = None

    def add(self, event: ExecEvent) -> None:
        """Takes one event."""
        if isinstance(event, ExecOutput):
            self._out[event.stream].append(event.data)
        elif isinstance(event, ExecExit):
            self.result = replace(
                event.result,
                stdout=b"".join(self._out["stdout"]).decode("utf-8", errors="replace"),
                stderr=b"".join(self._out["stderr"]).decode("utf-8", errors="replace"),
            )

    def finish(self) -> ExecResult:
        """The result, once the exit event came."""
        if self.result is None:
            raise ProtocolError("the exec stream ended without an exit event")
        return self.result
