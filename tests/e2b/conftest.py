"""Fixtures for the E2B compatibility suite: the real `e2b` and `e2b-code-interpreter` SDKs
against a real koder-sandbox daemon (started by scripts/e2b-tests.sh, which sets E2B_API_URL,
E2B_SANDBOX_URL and E2B_API_KEY, and KODER_E2B_OTHER_KEY: a key of another tenant)."""

import os

import httpx
import pytest
from e2b import Sandbox
from e2b_code_interpreter import Sandbox as CodeSandbox

API_URL = os.environ["E2B_API_URL"]
API_KEY = os.environ["E2B_API_KEY"]
OTHER_KEY = os.environ["KODER_E2B_OTHER_KEY"]


@pytest.fixture(scope="session")
def sandbox():
    """One `base` sandbox shared by the tests that only run commands and touch files."""
    sb = Sandbox.create(metadata={"suite": "e2b-shared"})
    yield sb
    sb.kill()


@pytest.fixture
def fresh():
    """A sandbox of its own, for tests that pause, kill or time it out."""
    made = []

    def make(**kw):
        sb = Sandbox.create(**kw)
        made.append(sb)
        return sb

    yield make
    for sb in made:
        Sandbox.kill(sb.sandbox_id)


@pytest.fixture(scope="session")
def code_sandbox():
    sb = CodeSandbox.create()
    yield sb
    sb.kill()


@pytest.fixture
def api():
    """Raw control-plane client (E2B's wire format, checked without the SDK in between)."""
    with httpx.Client(base_url=API_URL, headers={"X-API-KEY": API_KEY}, timeout=30) as c:
        yield c


def envd(sb, port=49983, token=True):
    """Raw envd client for one sandbox."""
    headers = {"E2b-Sandbox-Id": sb.sandbox_id, "E2b-Sandbox-Port": str(port)}
    if token:
        headers["X-Access-Token"] = sb._envd_access_token
    return httpx.Client(base_url=API_URL, headers=headers, timeout=30)


def pytest_terminal_summary(terminalreporter):
    """The plain closing line scripts/test.sh and CI read; expected failures (known gaps,
    each with its reason) count as skipped."""
    stats = terminalreporter.stats
    n = lambda k: len([r for r in stats.get(k, []) if getattr(r, "when", "call") == "call" or k == "error"])
    passed, failed = n("passed"), n("failed") + n("error")
    skipped = len(stats.get("skipped", [])) + n("xfailed")
    terminalreporter.write_line(f"e2b: {passed} passed, {failed} failed, {skipped} skipped")
