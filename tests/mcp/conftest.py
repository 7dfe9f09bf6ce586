"""Fixtures for the MCP suite: the official `mcp` client package against `ksandbox mcp`
(stdio, and streamable HTTP) backed by a real daemon. scripts/mcp-tests.sh starts the daemon and
sets KSANDBOX_BIN, MCP_TEST_URL, MCP_TEST_KEY and MCP_TEST_OTHER_KEY (a key of another tenant)."""

import contextlib
import os
import queue
import re
import subprocess
import threading

import pytest
from mcp import Client, StdioServerParameters

BIN = os.environ["KSANDBOX_BIN"]
DAEMON_URL = os.environ["MCP_TEST_URL"]
KEY = os.environ["MCP_TEST_KEY"]
OTHER_KEY = os.environ["MCP_TEST_OTHER_KEY"]


@pytest.fixture
def anyio_backend():
    return "asyncio"


class HttpServer:
    """`ksandbox mcp --http 127.0.0.1:0` as a child process; `url` is its MCP endpoint."""

    def __init__(self, key, *extra, listen="127.0.0.1:0"):
        env = dict(os.environ, KSANDBOX_API_KEY=key)
        self.proc = subprocess.Popen(
            [BIN, "mcp", "--url", DAEMON_URL, "--http", listen, *extra],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(l) for l in self.proc.stderr], daemon=True).start()
        try:
            line = lines.get(timeout=20)
        except queue.Empty:
            self.stop()
            raise RuntimeError("ksandbox mcp --http did not say where it listens")
        m = re.search(r"(http://\S+/mcp)", line)
        if not m:
            self.stop()
            raise RuntimeError(f"unexpected first line: {line!r}")
        self.url = m.group(1)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="session")
def http_server():
    server = HttpServer(KEY)
    yield server
    server.stop()


def stdio_params(key):
    return StdioServerParameters(command=BIN, args=["mcp", "--url", DAEMON_URL], env={"KSANDBOX_API_KEY": key})


@pytest.fixture(params=["stdio", "http"])
def transport(request):
    return request.param


@pytest.fixture
async def mcp(transport, request):
    """A connected client on either transport (negotiating the newest protocol both know)."""
    server = stdio_params(KEY) if transport == "stdio" else request.getfixturevalue("http_server").url
    async with Client(server) as client:
        yield client


@pytest.fixture
def connect():
    """Connects with another key or protocol mode: `async with connect(key=..., mode=...)`."""

    @contextlib.asynccontextmanager
    async def make(key=KEY, mode="auto", transport="stdio"):
        if transport == "stdio":
            async with Client(stdio_params(key), mode=mode) as client:
                yield client
        else:
            server = HttpServer(key)
            try:
                async with Client(server.url, mode=mode) as client:
                    yield client
            finally:
                server.stop()

    return make


def pytest_terminal_summary(terminalreporter):
    """The plain closing line scripts/test.sh and CI read."""
    stats = terminalreporter.stats

    def count(kind):
        return len([r for r in stats.get(kind, []) if kind == "error" or getattr(r, "when", "call") == "call"])

    passed, failed = count("passed"), count("failed") + count("error")
    skipped = len(stats.get("skipped", [])) + count("xfailed")
    terminalreporter.write_line(f"mcp: {passed} passed, {failed} failed, {skipped} skipped")
