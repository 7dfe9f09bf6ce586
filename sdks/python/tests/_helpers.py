"""Helpers of the tests: every test runs twice, with the blocking and with the async client.
Tests are written once as coroutines and go through :func:`run`, :func:`collect` and
:func:`entered`, which await what the async client answers and pass through what the blocking
one does."""

from __future__ import annotations

import contextlib
import inspect
import os
import uuid
from typing import Any, AsyncIterator

import pytest

import koder_sandbox as ks

URL = os.environ.get("DAEMON_URL", "")
KEY1 = os.environ.get("DAEMON_KEY1", "")
KEY2 = os.environ.get("DAEMON_KEY2", "")
ADMIN_KEY = os.environ.get("DAEMON_ADMIN_KEY", "")

if not URL:
    pytest.exit("DAEMON_URL is not set: run scripts/python-sdk-tests.sh", returncode=2)


async def run(value: Any) -> Any:
    """The answer of an SDK call, whichever client made it."""
    return await value if inspect.isawaitable(value) else value


async def collect(stream: Any) -> list[Any]:
    """Every item of a (sync or async) iterator, awaiting the call that returns it."""
    stream = await run(stream)
    if hasattr(stream, "__aiter__"):
        return [item async for item in stream]
    return list(stream)


@contextlib.asynccontextmanager
async def entered(cm: Any) -> AsyncIterator[Any]:
    """Enters a (sync or async) context manager."""
    if hasattr(cm, "__aenter__"):
        async with cm as value:
            yield value
    else:
        with cm as value:
            yield value


def unique(prefix: str) -> str:
    """A name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def make_client(flavor: str, key: str | None) -> Any:
    """A client of the daemon under test."""
    return ks.Client(URL, key) if flavor == "sync" else ks.AsyncClient(URL, key)


async def close(client: Any) -> None:
    """Closes a client of either flavour."""
    await run(client.close() if isinstance(client, ks.Client) else client.aclose())


