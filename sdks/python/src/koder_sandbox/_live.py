"""Terminal and file watch over WebSocket: message decoding shared, thin sync/async wrappers.

Terminal: binary frames are the PTY's bytes both ways; text frames are JSON control
(``{"type":"resize","cols","rows"}`` from us; ``exit`` and ``error`` from the daemon).
Watch: text frames ``{"type": "created"|"modified"|"deleted"|"renamed", "path", "at", "from"?}``.
"""

from __future__ import annotations

import datetime as _dt
import json
import queue
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterator, Literal, Union

import httpx_ws
import wsproto.events
from httpx_ws import AsyncWebSocketSession, WebSocketSession

from ._errors import ProtocolError, SandboxConnectionError, SandboxError
from ._models import decode

FsEventType = Literal["created", "modified", "deleted", "renamed"]


@dataclass(frozen=True)
class TerminalExit:
    """The terminal's program ended."""

    exit_code: int | None = None
    signal: int | None = None


@dataclass(frozen=True)
class FsEvent:
    """A change under a watched path; ``from_path`` is the old path of a rename when both
    halves were seen."""

    type: FsEventType
    path: str
    at: _dt.datetime
    from_path: str | None = None


def _control(text: str) -> dict[str, Any]:
    try:
        msg = json.loads(text)
    except ValueError as e:
        raise ProtocolError(f"bad control message: {text[:200]!r}") from e
    if not isinstance(msg, dict):
        raise ProtocolError(f"bad control message: {text[:200]!r}")
    if msg.get("type") == "error":
        raise SandboxError(str(msg.get("message", "")))
    return msg


def terminal_message(event: wsproto.events.Event) -> bytes | TerminalExit | None:
    """Terminal output, the exit, or ``None`` for a message to skip; an error message raises."""
    if isinstance(event, wsproto.events.BytesMessage):
        return bytes(event.data)
    if isinstance(event, wsproto.events.TextMessage):
        msg = _control(event.data)
        if msg.get("type") == "exit":
            return TerminalExit(msg.get("exit_code"), msg.get("signal"))
    return None


def watch_message(event: wsproto.events.Event) -> FsEvent | None:
    """A file event, or ``None`` for a message to skip; an error message raises."""
    if not isinstance(event, wsproto.events.TextMessage):
        return None
    msg = _control(event.data)
    if msg.get("type") not in ("created", "modified", "deleted", "renamed"):
        return None
    if "from" in msg:
        msg["from_path"] = msg.pop("from")
    return decode(FsEvent, msg)


def resize_message(cols: int, rows: int) -> str:
    """The control message that resizes the terminal."""
    return json.dumps({"type": "resize", "cols": cols, "rows": rows})


def _receive(ws: WebSocketSession, timeout: float | None) -> wsproto.events.Event:
    try:
        return ws.receive(timeout)
    except queue.Empty as e:
        raise TimeoutError("nothing received in time") from e
    except httpx_ws.WebSocketDisconnect as e:
        raise EOFError("the daemon closed the WebSocket") from e
    except httpx_ws.WebSocketNetworkError as e:
        raise SandboxConnectionError("the WebSocket connection broke") from e


async def _areceive(ws: AsyncWebSocketSession, timeout: float | None) -> wsproto.events.Event:
    try:
        return await ws.receive(timeout)
    except httpx_ws.WebSocketDisconnect as e:
        raise EOFError("the daemon closed the WebSocket") from e
    except httpx_ws.WebSocketNetworkError as e:
        raise SandboxConnectionError("the WebSocket connection broke") from e


def _as_bytes(data: bytes | str) -> bytes:
    return data.encode() if isinstance(data, str) else data


TerminalItem = Union[bytes, TerminalExit]


class Terminal:
    """An interactive PTY in a session (blocking). Iterate it for output chunks; the
    iteration ends when the program exits (then :attr:`exit` is set)."""

    def __init__(self, ws: WebSocketSession) -> None:
        self._ws = ws
        self.exit: TerminalExit | None = None

    def send(self, data: bytes | str) -> None:
        """Types ``data`` (text is sent as UTF-8)."""
        self._ws.send_bytes(_as_bytes(data))

    def resize(self, cols: int, rows: int) -> None:
        """Resizes the terminal."""
        self._ws.send_text(resize_message(cols, rows))

    def recv(self, timeout: float | None = None) -> bytes | TerminalExit:
        """The next output chunk or the exit; raises ``TimeoutError`` after ``timeout`` s and
        ``EOFError`` once the terminal is closed."""
        while True:
            item = terminal_message(_receive(self._ws, timeout))
            if isinstance(item, TerminalExit):
                self.exit = item
            if item is not None:
                return item

    def __iter__(self) -> Iterator[bytes]:
        while self.exit is None:
            try:
                item = self.recv()
            except EOFError:
                return
            if isinstance(item, bytes):
                yield item

    def close(self) -> None:
        """Closes the terminal (its program gets a hang-up)."""
        self._ws.close()


class AsyncTerminal:
    """An interactive PTY in a session (async). Iterate it with ``async for`` for output
    chunks; the iteration ends when the program exits (then :attr:`exit` is set)."""

    def __init__(self, ws: AsyncWebSocketSession) -> None:
        self._ws = ws
        self.exit: TerminalExit | None = None

    async def send(self, data: bytes | str) -> None:
        """Types ``data`` (text is sent as UTF-8)."""
        await self._ws.send_bytes(_as_bytes(data))

    async def resize(self, cols: int, rows: int) -> None:
        """Resizes the terminal."""
        await self._ws.send_text(resize_message(cols, rows))

    async def recv(self, timeout: float | None = None) -> bytes | TerminalExit:
        """The next output chunk or the exit; raises ``TimeoutError`` after ``timeout`` s and
        ``EOFError`` once the terminal is closed."""
        while True:
            item = terminal_message(await _areceive(self._ws, timeout))
            if isinstance(item, TerminalExit):
                self.exit = item
            if item is not None:
                return item

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while self.exit is None:
            try:
                item = await self.recv()
            except EOFError:
                return
            if isinstance(item, bytes):
                yield item

    async def close(self) -> None:
        """Closes the terminal (its program gets a hang-up)."""
        await self._ws.close()


class Watch:
    """File events under a watched path (blocking). Iterate it, or call :meth:`next`."""

    def __init__(self, ws: WebSocketSession) -> None:
        self._ws = ws

    def next(self, timeout: float | None = None) -> FsEvent:
        """The next event; raises ``TimeoutError`` after ``timeout`` s and ``EOFError`` once
        the watch is closed."""
        while True:
            item = watch_message(_receive(self._ws, timeout))
            if item is not None:
                return item

    def __iter__(self) -> Iterator[FsEvent]:
        while True:
            try:
                yield self.next()
            except EOFError:
                return

    def close(self) -> None:
        """Stops watching."""
        self._ws.close()


class AsyncWatch:
    """File events under a watched path (async). Iterate it with ``async for``, or await
    :meth:`next`."""

    def __init__(self, ws: AsyncWebSocketSession) -> None:
        self._ws = ws

    async def next(self, timeout: float | None = None) -> FsEvent:
        """The next event; raises ``TimeoutError`` after ``timeout`` s and ``EOFError`` once
        the watch is closed."""
        while True:
            item = watch_message(await _areceive(self._ws, timeout))
            if item is not None:
                return item

    async def __aiter__(self) -> AsyncIterator[FsEvent]:
        while True:
            try:
                yield await self.next()
            except EOFError:
                return

    async def close(self) -> None:
        """Stops watching."""
        await self._ws.close()
