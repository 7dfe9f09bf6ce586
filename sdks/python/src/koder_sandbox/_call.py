"""Request descriptions: what to send and how to read the answer, independent of sync/async.

Every API method builds one of these; the sync and async transports only send them. ``Call``
is a one-shot request decoded from its complete answer; ``SseCall`` an answer read as a stream
of Server-Sent Events; ``DownloadCall`` a body read in chunks; ``WsCall`` a WebSocket.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterable, Callable, Generic, Iterable, TypeVar, Union

import httpx
from httpx_sse import ServerSentEvent

from ._errors import ProtocolError, raise_for_response
from ._models import decode, to_json

T = TypeVar("T")
U = TypeVar("U")
E = TypeVar("E")

#: What an upload accepts: bytes, text (sent as UTF-8), a binary file object (read in chunks),
#: or an iterable of byte chunks (an async iterable with the async client).
Content = Union[bytes, str, Iterable[bytes], AsyncIterable[bytes]]

#: A timeout of ``None`` waits as long as the server takes: used where the server bounds the
#: wait itself (an exec's own timeout plus its agent deadline).
NO_TIMEOUT: Any = None


class _Default:
    """Marker: use the client's timeout."""


DEFAULT_TIMEOUT: Any = _Default()


@dataclass(frozen=True)
class Request:
    """One HTTP request, relative to the client's base URL."""

    method: str
    path: str
    params: list[tuple[str, str]] = field(default_factory=list)
    json: Any = None
    content: Content | None = None
    headers: dict[str, str] = field(default_factory=dict)
    timeout: Any = DEFAULT_TIMEOUT

    def send_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``httpx.Client.build_request``."""
        kw: dict[str, Any] = {"params": self.params, "headers": self.headers}
        if self.json is not None:
            kw["json"] = self.json
        if self.content is not None:
            kw["content"] = self.content
        if not isinstance(self.timeout, _Default):
            kw["timeout"] = self.timeout
        return kw


@dataclass(frozen=True)
class Call(Generic[T]):
    """A one-shot request and the decoder of its complete (successful) answer."""

    request: Request
    decode: Callable[[httpx.Response], T]

    def map(self, f: Callable[[T], U]) -> Call[U]:
        """The same request with ``f`` applied to its decoded answer."""
        inner = self.decode
        return Call(self.request, lambda r: f(inner(r)))

    def answer(self, response: httpx.Response) -> T:
        """Raises the typed error of a failed answer, else decodes it."""
        raise_for_response(response)
        return self.decode(response)


@dataclass(frozen=True)
class SseCall(Generic[E]):
    """A request answered with Server-Sent Events, each decoded by ``decode_event``
    (``None``: an event this SDK does not know, skipped)."""

    request: Request
    decode_event: Callable[[ServerSentEvent], E | None]


@dataclass(frozen=True)
class DownloadCall:
    """A request whose answer body is read in chunks."""

    request: Request


@dataclass(frozen=True)
class WsCall:
    """A WebSocket upgrade request."""

    request: Request


def with_timeout(request: Request, timeout: Any) -> Request:
    """The request with another timeout."""
    return replace(request, timeout=timeout)


def json_body(response: httpx.Response) -> Any:
    """The answer's JSON, or a ProtocolError when it is not JSON."""
    try:
        return response.json()
    except ValueError as e:
        raise ProtocolError(
            f"expected JSON from {response.request.url.path}, got {response.text[:200]!r}",
            status=response.status_code,
        ) from e


def as_model(cls: type[T]) -> Callable[[httpx.Response], T]:
    """Decoder of an answer that is one ``cls`` object."""
    return lambda r: decode(cls, json_body(r))


def as_list(cls: type[T], key: str) -> Callable[[httpx.Response], list[T]]:
    """Decoder of an answer ``{key: [cls, ...]}``."""

    def read(r: httpx.Response) -> list[T]:
        body = json_body(r)
        items = body.get(key) if isinstance(body, dict) else None
        if not isinstance(items, list):
            raise ProtocolError(f"expected {{{key!r}: [...]}}, got {str(body)[:200]}")
        return [decode(cls, item) for item in items]

    return read


def as_field(key: str, kind: type[T]) -> Callable[[httpx.Response], T]:
    """Decoder of one field of a JSON object answer."""

    def read(r: httpx.Response) -> T:
        body = json_body(r)
        value = body.get(key) if isinstance(body, dict) else None
        if not isinstance(value, kind):
            raise ProtocolError(f"expected {key!r} in the answer, got {str(body)[:200]}")
        return value

    return read


def no_content(_: httpx.Response) -> None:
    """Decoder of an answer without a body (204)."""
    return None


def as_bytes(r: httpx.Response) -> bytes:
    """Decoder of a raw body."""
    return r.content


def query(**params: Any) -> list[tuple[str, str]]:
    """Query parameters without the ``None`` ones; booleans as ``true``/``false``."""
    out: list[tuple[str, str]] = []
    for k, v in params.items():
        if v is None:
            continue
        out.append((k, ("true" if v else "false") if isinstance(v, bool) else str(v)))
    return out


def body(**fields: Any) -> dict[str, Any]:
    """A JSON body without the ``None`` fields."""
    return {k: to_json(v) for k, v in fields.items() if v is not None}
