"""Fixtures for the tests against a real daemon (scripts/python-sdk-tests.sh starts it)."""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator

import pytest

import koder_sandbox as ks

from ._helpers import ADMIN_KEY, KEY1, KEY2, close, make_client, run


@pytest.fixture(scope="session", params=["sync", "async"])
def flavor(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
async def client(flavor: str) -> AsyncIterator[Any]:
    c = make_client(flavor, KEY1)
    yield c
    await close(c)


@pytest.fixture(scope="session")
async def other(flavor: str) -> AsyncIterator[Any]:
    """A client of the second tenant."""
    c = make_client(flavor, KEY2)
    yield c
    await close(c)


@pytest.fixture(scope="session")
async def admin(flavor: str) -> AsyncIterator[Any]:
    """A client with the operator key."""
    c = make_client(flavor, ADMIN_KEY)
    yield c
    await close(c)


@pytest.fixture(scope="session")
async def sb(client: Any) -> AsyncIterator[Any]:
    """One Python session shared by the tests that do not change its lifecycle."""
    s = await run(client.sessions.create("python", timeout_s=600, metadata={"suite": "shared"}))
    yield s
    await run(s.delete())


@pytest.fixture
async def fresh(client: Any) -> AsyncIterator[Any]:
    """A session of its own, for tests that pause, restore or delete it."""
    s = await run(client.sessions.create("python", timeout_s=300))
    yield s
    with contextlib.suppress(ks.NotFoundError):
        await run(s.delete())
