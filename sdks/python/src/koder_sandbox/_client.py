"""The two clients: the same API (``_api.ClientBase``) over a blocking or an async httpx client."""

from __future__ import annotations

import os
from typing import Any, Mapping

import httpx

from ._api import ClientBase
from ._ops import Async, Sync
from ._transport import AsyncTransport, SyncTransport, aread_refused_upgrade, read_refused_upgrade

DEFAULT_URL = "http://127.0.0.1:7070"
#: Per-request default; execs, runs, streams and snapshots wait as long as the daemon takes.
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)


def _options(
    base_url: str | None,
    api_key: str | None,
    timeout: float | httpx.Timeout | None,
    headers: Mapping[str, str] | None,
) -> dict[str, Any]:
    url = base_url or os.environ.get("KSANDBOX_URL") or DEFAULT_URL
    key = api_key if api_key is not None else os.environ.get("KSANDBOX_API_KEY")
    all_headers = {"user-agent": "koder-sandbox-python", **(headers or {})}
    if key:
        all_headers["authorization"] = f"Bearer {key}"
    return {"base_url": url.rstrip("/"), "headers": all_headers, "timeout": timeout}


class Client(ClientBase[Sync]):
    """The blocking client of a koder-sandbox daemon.

    Args:
        base_url: The daemon's URL (default ``$KSANDBOX_URL``, else ``http://127.0.0.1:7070``).
        api_key: The tenant's API key (default ``$KSANDBOX_API_KEY``), or an operator key
            for :attr:`admin`.
        timeout: Default timeout per request in seconds (execs, runs and streams are not
            bounded by it: the daemon bounds them).
        verify: TLS verification: ``True``, ``False``, a CA bundle path or an
            ``ssl.SSLContext`` (for a daemon behind a private CA).
        headers: Extra headers on every request.
        transport: An ``httpx.BaseTransport`` to send through (tests, proxies).

    Use it as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout | None = DEFAULT_TIMEOUT,
        verify: Any = True,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.http = httpx.Client(
            **_options(base_url, api_key, timeout, headers),
            verify=verify,
            transport=transport,
            event_hooks={"response": [read_refused_upgrade]},
        )
        super().__init__(SyncTransport(self.http))

    def close(self) -> None:
        """Closes the connections."""
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(ClientBase[Async]):
    """The async client of a koder-sandbox daemon; every method is awaitable.

    Takes the arguments of :class:`Client` (``transport`` an ``httpx.AsyncBaseTransport``).
    Use it as an async context manager, or await :meth:`aclose`.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout | None = DEFAULT_TIMEOUT,
        verify: Any = True,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.http = httpx.AsyncClient(
            **_options(base_url, api_key, timeout, headers),
            verify=verify,
            transport=transport,
            event_hooks={"response": [aread_refused_upgrade]},
        )
        super().__init__(AsyncTransport(self.http))

    async def aclose(self) -> None:
        """Closes the connections."""
        await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
