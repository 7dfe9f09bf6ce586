"""The two thin transports: they send the requests ``_call`` describes, blocking or awaiting.

Everything about what a request is and what its answer means lives in ``_call``, ``_events``
and the API modules; here is only how to send it and how to iterate a streamed answer.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any, AsyncIterator, Callable, Generic, Iterator, TypeVar

import httpx
from httpx_sse import EventSource, ServerSentEvent
from httpx_ws import (
    AsyncWebSocketSession,
    HTTPXWSException,
    WebSocketSession,
    WebSocketUpgradeError,
    aconnect_ws,
    connect_ws,
)

from ._call import Call, DownloadCall, Request, SseCall, WsCall
from ._errors import ProtocolError, SandboxConnectionError, SandboxError, raise_for_response

T = TypeVar("T")
E = TypeVar("E")
W = TypeVar("W")

#: Terminal output comes in frames of up to the agent's frame limit (1 MiB).
WS_MAX_MESSAGE = 4 * 1024 * 1024


def connection_error(e: Exception) -> SandboxConnectionError:
    """A transport failure as the SDK's error."""
    return SandboxConnectionError(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)


def _is_upgrade(request: httpx.Request) -> bool:
    return str(request.headers.get("upgrade", "")).lower() == "websocket"


def read_refused_upgrade(response: httpx.Response) -> None:
    """Response hook: reads the error body of a refused WebSocket upgrade, which httpx-ws
    closes unread before it raises."""
    if _is_upgrade(response.request) and response.status_code != 101:
        response.read()


async def aread_refused_upgrade(response: httpx.Response) -> None:
    """The async client's :func:`read_refused_upgrade`."""
    if _is_upgrade(response.request) and response.status_code != 101:
        await response.aread()


def _upgrade_refused(e: WebSocketUpgradeError) -> SandboxError:
    try:
        raise_for_response(e.response)
    except SandboxError as err:
        return err
    return ProtocolError(
        f"WebSocket upgrade answered {e.response.status_code}", status=e.response.status_code
    )


class EventStream(Generic[E]):
    """A blocking iterator of typed events from a Server-Sent Events answer.

    Use it in a ``with`` block (or call :meth:`close`) to end the request early; it closes
    itself after the last event. Dropping a foreground exec's stream cancels that exec.
    """

    def __init__(
        self, response: httpx.Response, decode: Callable[[ServerSentEvent], E | None]
    ) -> None:
        self._response = response
        self._events = EventSource(response).iter_sse()
        self._decode = decode

    def __iter__(self) -> EventStream[E]:
        return self

    def __next__(self) -> E:
        try:
            while True:
                event = self._decode(next(self._events))
                if event is not None:
                    return event
        except StopIteration:
            self.close()
            raise
        except httpx.HTTPError as e:
            self.close()
            raise connection_error(e) from e
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Ends the request."""
        self._response.close()

    def __enter__(self) -> EventStream[E]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncEventStream(Generic[E]):
    """An async iterator of typed events from a Server-Sent Events answer.

    Use it in an ``async with`` block (or await :meth:`aclose`) to end the request early; it
    closes itself after the last event.
    """

    def __init__(
        self, response: httpx.Response, decode: Callable[[ServerSentEvent], E | None]
    ) -> None:
        self._response = response
        self._events = EventSource(response).aiter_sse()
        self._decode = decode

    def __aiter__(self) -> AsyncEventStream[E]:
        return self

    async def __anext__(self) -> E:
        try:
            while True:
                event = self._decode(await self._events.__anext__())
                if event is not None:
                    return event
        except StopAsyncIteration:
            await self.aclose()
            raise
        except httpx.HTTPError as e:
            await self.aclose()
            raise connection_error(e) from e
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        """Ends the request."""
        await self._response.aclose()

    async def __aenter__(self) -> AsyncEventStream[E]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class ByteStream:
    """A download read in chunks; close it (or use ``with``) when not read to the end."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response

    def iter_bytes(self, chunk_size: int | None = None) -> Iterator[bytes]:
        """Yields the body in chunks (of ``chunk_size`` bytes, except the last)."""
        try:
            yield from self._response.iter_bytes(chunk_size)
        except httpx.HTTPError as e:
            raise connection_error(e) from e
        finally:
            self.close()

    def __iter__(self) -> Iterator[bytes]:
        return self.iter_bytes()

    def read(self) -> bytes:
        """The whole (rest of the) body."""
        return b"".join(self.iter_bytes())

    def close(self) -> None:
        """Ends the request."""
        self._response.close()

    def __enter__(self) -> ByteStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncByteStream:
    """An async download read in chunks; close it (or use ``async with``) when not read to
    the end."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response

    async def iter_bytes(self, chunk_size: int | None = None) -> AsyncIterator[bytes]:
        """Yields the body in chunks (of ``chunk_size`` bytes, except the last)."""
        try:
            async for chunk in self._response.aiter_bytes(chunk_size):
                yield chunk
        except httpx.HTTPError as e:
            raise connection_error(e) from e
        finally:
            await self.aclose()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self.iter_bytes()

    async def read(self) -> bytes:
        """The whole (rest of the) body."""
        return b"".join([chunk async for chunk in self.iter_bytes()])

    async def aclose(self) -> None:
        """Ends the request."""
        await self._response.aclose()

    async def __aenter__(self) -> AsyncByteStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class SyncTransport:
    """Sends calls with an ``httpx.Client``."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http

    def _send(self, request: Request, stream: bool) -> httpx.Response:
        built = self.http.build_request(request.method, request.path, **request.send_kwargs())
        try:
            response = self.http.send(built, stream=stream)
            if stream and not response.is_success:
                try:
                    response.read()
                finally:
                    response.close()
        except httpx.HTTPError as e:
            raise connection_error(e) from e
        raise_for_response(response)
        return response

    def run(self, call: Call[T]) -> T:
        """Sends a one-shot call and decodes its answer."""
        return call.answer(self._send(call.request, stream=False))

    def sse(self, call: SseCall[E]) -> EventStream[E]:
        """Sends a call answered with events."""
        return EventStream(self._send(call.request, stream=True), call.decode_event)

    def download(self, call: DownloadCall) -> ByteStream:
        """Sends a call whose body is read in chunks."""
        return ByteStream(self._send(call.request, stream=True))

    @contextlib.contextmanager
    def websocket(
        self, call: WsCall, wrap: Callable[[WebSocketSession], W], _async_wrap: Any
    ) -> Iterator[W]:
        """Opens a WebSocket and yields it wrapped."""
        req = call.request
        with contextlib.ExitStack() as stack:
            try:
                ws: WebSocketSession = stack.enter_context(
                    connect_ws(
                        req.path,
                        self.http,
                        max_message_size_bytes=WS_MAX_MESSAGE,
                        params=req.params,
                        headers=dict(req.headers),
                    )
                )
            except WebSocketUpgradeError as e:
                raise _upgrade_refused(e) from e
            except (httpx.HTTPError, HTTPXWSException) as e:
                raise connection_error(e) from e
            yield wrap(ws)


UPLOAD_CHUNK = 256 * 1024


async def _chunks_of(content: Any) -> AsyncIterator[bytes]:
    if hasattr(content, "read"):
        while chunk := content.read(UPLOAD_CHUNK):
            yield chunk
    else:
        for chunk in content:
            yield chunk


def async_content(request: Request) -> Request:
    """The request with a file object or sync iterable body made an async iterable, which is
    what an ``httpx.AsyncClient`` can send."""
    content = request.content
    if content is None or isinstance(content, (bytes, str)) or hasattr(content, "__aiter__"):
        return request
    return replace(request, content=_chunks_of(content))


class AsyncTransport:
    """Sends calls with an ``httpx.AsyncClient``."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def _send(self, request: Request, stream: bool) -> httpx.Response:
        request = async_content(request)
        built = self.http.build_request(request.method, request.path, **request.send_kwargs())
        try:
            response = await self.http.send(built, stream=stream)
            if stream and not response.is_success:
                try:
                    await response.aread()
                finally:
                    await response.aclose()
        except httpx.HTTPError as e:
            raise connection_error(e) from e
        raise_for_response(response)
        return response

    async def run(self, call: Call[T]) -> T:
        """Sends a one-shot call and decodes its answer."""
        return call.answer(await self._send(call.request, stream=False))

    async def sse(self, call: SseCall[E]) -> AsyncEventStream[E]:
        """Sends a call answered with events."""
        return AsyncEventStream(await self._send(call.request, stream=True), call.decode_event)

    async def download(self, call: DownloadCall) -> AsyncByteStream:
        """Sends a call whose body is read in chunks."""
        return AsyncByteStream(await self._send(call.request, stream=True))

    @contextlib.asynccontextmanager
    async def websocket(
        self, call: WsCall, _sync_wrap: Any, wrap: Callable[[AsyncWebSocketSession], W]
    ) -> AsyncIterator[W]:
        """Opens a WebSocket and yields it wrapped."""
        req = call.request
        async with contextlib.AsyncExitStack() as stack:
            try:
                ws: AsyncWebSocketSession = await stack.enter_async_context(
                    aconnect_ws(
                        req.path,
                        self.http,
                        max_message_size_bytes=WS_MAX_MESSAGE,
                        params=req.params,
                        headers=dict(req.headers),
                    )
                )
            except WebSocketUpgradeError as e:
                raise _upgrade_refused(e) from e
            except (httpx.HTTPError, HTTPXWSException) as e:
                raise connection_error(e) from e
            yield wrap(ws)
