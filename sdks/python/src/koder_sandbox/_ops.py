"""Operation descriptors: each API method is written once, as a function that returns a request
description (``_call``), and these descriptors turn it into a blocking method on sync objects
and an awaitable one on async objects.

Objects are generic in their flavour (:class:`Sync` or :class:`Async`); a descriptor's
``__get__`` is overloaded on it, so type checkers see ``Sandbox.exec(...) -> ExecResult`` and
``AsyncSandbox.exec(...) -> Awaitable[ExecResult]`` from the one definition.
"""

from __future__ import annotations

import functools
from typing import (
    Any,
    AsyncContextManager,
    Awaitable,
    Callable,
    Concatenate,
    ContextManager,
    Generic,
    ParamSpec,
    TypeVar,
    overload,
)

from ._call import Call, DownloadCall, SseCall, WsCall
from ._transport import AsyncByteStream, AsyncEventStream, ByteStream, EventStream


class Sync:
    """Flavour marker: blocking methods."""


class Async:
    """Flavour marker: awaitable methods."""


F = TypeVar("F", Sync, Async)
P = ParamSpec("P")
T = TypeVar("T")
E = TypeVar("E")
W = TypeVar("W")
AW = TypeVar("AW")


class Bound(Generic[F]):
    """An object whose operations go through one transport (sync or async)."""

    def __init__(self, transport: Any) -> None:
        self._t = transport


def _bind(build: Callable[..., Any], obj: Any, send: Callable[[Any], Any]) -> Any:
    @functools.wraps(build)
    def bound(*args: Any, **kwargs: Any) -> Any:
        return send(build(obj, *args, **kwargs))

    return bound


class _Descriptor:
    def __init__(self, build: Callable[..., Any]) -> None:
        self._build = build
        # What help() and IDEs show for the method is the builder's signature and docstring.
        self.__doc__ = build.__doc__
        self.__name__ = build.__name__
        self.__qualname__ = build.__qualname__
        self.__module__ = build.__module__
        self.__wrapped__ = build


class op(_Descriptor, Generic[P, T]):
    """A one-shot call: returns its decoded answer (awaitable on async objects)."""

    def __init__(self, build: Callable[Concatenate[Any, P], Call[T]]) -> None:
        super().__init__(build)

    @overload
    def __get__(self, obj: None, owner: type) -> op[P, T]: ...
    @overload
    def __get__(self, obj: Bound[Sync], owner: type) -> Callable[P, T]: ...
    @overload
    def __get__(self, obj: Bound[Async], owner: type) -> Callable[P, Awaitable[T]]: ...
    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is None:
            return self
        return _bind(self._build, obj, obj._t.run)


class sse_op(_Descriptor, Generic[P, E]):
    """A call answered with events: returns an :class:`EventStream` (sync) or an awaitable
    :class:`AsyncEventStream` (async)."""

    def __init__(self, build: Callable[Concatenate[Any, P], SseCall[E]]) -> None:
        super().__init__(build)

    @overload
    def __get__(self, obj: None, owner: type) -> sse_op[P, E]: ...
    @overload
    def __get__(self, obj: Bound[Sync], owner: type) -> Callable[P, EventStream[E]]: ...
    @overload
    def __get__(
        self, obj: Bound[Async], owner: type
    ) -> Callable[P, Awaitable[AsyncEventStream[E]]]: ...
    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is None:
            return self
        return _bind(self._build, obj, obj._t.sse)


class download_op(_Descriptor, Generic[P]):
    """A download: returns a :class:`ByteStream` (sync) or an awaitable
    :class:`AsyncByteStream` (async)."""

    def __init__(self, build: Callable[Concatenate[Any, P], DownloadCall]) -> None:
        super().__init__(build)

    @overload
    def __get__(self, obj: None, owner: type) -> download_op[P]: ...
    @overload
    def __get__(self, obj: Bound[Sync], owner: type) -> Callable[P, ByteStream]: ...
    @overload
    def __get__(self, obj: Bound[Async], owner: type) -> Callable[P, Awaitable[AsyncByteStream]]: ...
    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is None:
            return self
        return _bind(self._build, obj, obj._t.download)


class _WsOp(_Descriptor, Generic[P, W, AW]):
    def __init__(
        self,
        build: Callable[Concatenate[Any, P], WsCall],
        sync_wrap: Callable[[Any], W],
        async_wrap: Callable[[Any], AW],
    ) -> None:
        super().__init__(build)
        self._wraps = (sync_wrap, async_wrap)

    @overload
    def __get__(self, obj: None, owner: type) -> _WsOp[P, W, AW]: ...
    @overload
    def __get__(self, obj: Bound[Sync], owner: type) -> Callable[P, ContextManager[W]]: ...
    @overload
    def __get__(self, obj: Bound[Async], owner: type) -> Callable[P, AsyncContextManager[AW]]: ...
    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is None:
            return self
        return _bind(self._build, obj, lambda call: obj._t.websocket(call, *self._wraps))


def ws_op(
    sync_wrap: Callable[[Any], W], async_wrap: Callable[[Any], AW]
) -> Callable[[Callable[Concatenate[Any, P], WsCall]], _WsOp[P, W, AW]]:
    """A WebSocket: returns a context manager (async context manager on async objects) that
    yields the connection wrapped in ``sync_wrap`` or ``async_wrap``."""
    return lambda build: _WsOp(build, sync_wrap, async_wrap)
