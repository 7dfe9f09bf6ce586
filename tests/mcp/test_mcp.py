"""`ksandbox mcp` driven by the official `mcp` client: every tool against a real daemon, over
stdio and streamable HTTP (the `transport` parameter of the `mcp` fixture)."""

import base64
import contextlib
import hashlib
import json
import subprocess
import time
import urllib.request

import httpx2
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from conftest import DAEMON_URL, KEY, OTHER_KEY, BIN, HttpServer

pytestmark = pytest.mark.anyio

TOOLS = {
    "create_session", "list_sessions", "kill_session", "run_code", "run_command",
    "start_process", "read_process_output", "stop_process", "write_file", "read_file",
    "list_files", "get_preview_url", "run_cell", "snapshot_session", "restore_session",
    "fork_session", "session_events",
}


def text(result):
    return "".join(getattr(c, "text", "") for c in result.content)


async def call(client, tool, **args):
    result = await client.call_tool(tool, args)
    assert not result.is_error, f"{tool} failed: {text(result)}"
    # The text is the structured answer's JSON, for clients that only show text to the model.
    assert json.loads(text(result)) == result.structured_content
    return result.structured_content


async def fails(client, tool, **args):
    """The tool error's SANDBOX code, checked to be in both the text and the structured error."""
    result = await client.call_tool(tool, args)
    assert result.is_error, f"{tool} succeeded: {text(result)}"
    error = result.structured_content["error"]
    assert text(result) == f"{error['code']}: {error['message']}"
    return error["code"], error["message"]


@contextlib.asynccontextmanager
async def session(client, **args):
    created = await call(client, "create_session", **args)
    try:
        yield created["session_id"]
    finally:
        await client.call_tool("kill_session", {"session_id": created["session_id"]})


async def test_lists_every_tool_with_schemas(mcp):
    tools = {t.name: t for t in (await mcp.list_tools()).tools}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert len(tool.description) > 20, tool.name
        assert tool.input_schema["type"] == "object"
    run_code = tools["run_code"].input_schema
    assert run_code["required"] == ["session_id", "code"]
    assert {"language", "timeout_ms", "env", "cwd", "stdin"} <= set(run_code["properties"])
    assert tools["list_sessions"].annotations.read_only_hint is True
    assert tools["kill_session"].annotations.destructive_hint is True


async def test_python_session_end_to_end(mcp):
    created = await call(mcp, "create_session", language="python", timeout_s=300)
    sid = created["session_id"]
    assert created["state"] == "running" and created["language"] == "python"
    listed = await call(mcp, "list_sessions")
    assert sid in [s["session_id"] for s in listed["sessions"]]

    out = await call(mcp, "run_code", session_id=sid, code="print(6*7)")
    assert (out["stdout"], out["exit_code"], out["verdict"]) == ("42\n", 0, None)

    killed = await call(mcp, "kill_session", session_id=sid)
    assert killed == {"session_id": sid, "destroyed": True}
    code, _ = await fails(mcp, "run_code", session_id=sid, code="print(1)")
    assert code == "SANDBOX-NOT-FOUND"


async def test_languages_and_commands(mcp):
    async with session(mcp) as sid:
        node = await call(mcp, "run_code", session_id=sid, language="node", code="console.log(6*7)")
        assert node["stdout"] == "42\n"
        bash = await call(mcp, "run_code", session_id=sid, language="bash", code='echo "$((6*7))"; echo oops >&2; exit 3')
        assert (bash["stdout"], bash["stderr"], bash["exit_code"]) == ("42\n", "oops\n", 3)
        shell = await call(mcp, "run_command", session_id=sid, command='echo "$GREETING" | tr a-z A-Z; pwd', env={"GREETING": "hi"})
        assert shell["stdout"] == "HI\n/workspace\n"
        argv = await call(mcp, "run_command", session_id=sid, argv=["/usr/bin/python3", "-c", "import sys; print(sys.argv[1:]); sys.exit(5)", "a b", "$HOME"], cwd="/tmp")
        assert (argv["stdout"], argv["exit_code"]) == ("['a b', '$HOME']\n", 5)
        fed = await call(mcp, "run_command", session_id=sid, command="wc -c", stdin="12345")
        assert fed["stdout"].strip() == "5"
        who = await call(mcp, "run_command", session_id=sid, command="id -u", user="user")
        assert who["stdout"] == "1000\n"


async def test_verdicts_come_from_the_daemon(transport, connect):
    async with connect(transport=transport) as mcp, session(mcp, language="python", memory_mib=128) as sid:
        slow = await call(mcp, "run_code", session_id=sid, code="import time\nprint('start', flush=True)\ntime.sleep(30)", timeout_ms=1000)
        assert slow["verdict"] == "SANDBOX-EXEC-TIMEOUT"
        assert slow["stdout"] == "start\n"
        assert slow["duration_ms"] < 20000
        big = await call(mcp, "run_code", session_id=sid, code="x = bytearray(1024 * 1024 * 1024)\nprint('survived')")
        assert big["verdict"] == "SANDBOX-EXEC-KILLED-OOM", big
        assert "survived" not in big["stdout"]


async def test_a_session_s_events_say_why_it_ended(mcp):
    sid = (await call(mcp, "create_session", timeout_s=300))["session_id"]
    slow = await call(mcp, "run_command", session_id=sid, command="sleep 30", timeout_ms=300)
    assert slow["verdict"] == "SANDBOX-EXEC-TIMEOUT"
    await call(mcp, "kill_session", session_id=sid)
    for _ in range(100):  # the log is written just after the calls answer
        log = await call(mcp, "session_events", session_id=sid)
        if len(log["events"]) >= 3:
            break
        time.sleep(0.1)
    events = log["events"]
    assert [e["type"] for e in events] == ["session.created", "exec.verdict", "session.stopped"]
    assert events[1]["data"]["verdict"] == "SANDBOX-EXEC-TIMEOUT"
    assert events[2]["data"]["cause"] == "deleted" and log["more"] is False
    later = await call(mcp, "session_events", session_id=sid, after=events[1]["seq"])
    assert [e["seq"] for e in later["events"]] == [events[2]["seq"]]
    code, _ = await fails(mcp, "session_events", session_id="0" * 32)
    assert code == "SANDBOX-NOT-FOUND"
    code, _ = await fails(mcp, "session_events", session_id="../../v1/sandbox/sessions")
    assert code == "SANDBOX-INVALID-ARGUMENT"
    code, _ = await fails(mcp, "session_events", session_id=sid, after=2**63)
    assert code == "SANDBOX-INVALID-ARGUMENT"


async def test_cells_keep_their_state_and_show_their_figures(mcp):
    async with session(mcp) as sid:
        first = await call(mcp, "run_cell", session_id=sid, code="import math\nx = 41")
        assert first["language"] == "python" and first["error"] is None
        out = await call(mcp, "run_cell", session_id=sid, code="print('hi')\nx + 1")
        assert out["context_id"] == first["context_id"], "one context per language"
        assert (out["stdout"], out["results"][0]["text"]) == ("hi\n", "42")
        code = "import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [1, 2])\nplt.show()"
        result = await mcp.call_tool("run_cell", {"session_id": sid, "code": code})
        assert not result.is_error, text(result)
        figure = result.structured_content["results"][0]
        assert (figure["image"], figure["chart"]["type"]) == ("image/png", "bar")
        images = [c for c in result.content if c.type == "image"]
        assert len(images) == 1 and images[0].mime_type == "image/png"
        assert base64.b64decode(images[0].data)[:4] == b"\x89PNG"
        failed = await call(mcp, "run_cell", session_id=sid, code="1 / 0")
        assert failed["error"]["name"] == "ZeroDivisionError"
        ts = await call(mcp, "run_cell", session_id=sid, language="typescript",
                        code="const n: number = 2\nn * 21")
        assert ts["context_id"] != first["context_id"] and ts["results"][0]["text"] == "42"
        again = await call(mcp, "run_cell", session_id=sid, context_id=ts["context_id"], code="n")
        assert (again["language"], again["results"][0]["text"]) == ("typescript", "2")
        code, message = await fails(mcp, "run_cell", session_id=sid, code="1",
                                    context_id="nope")
        assert code == "SANDBOX-NOT-FOUND", message
        code, _ = await fails(mcp, "run_cell", session_id=sid, code="1", language="r",
                              context_id=first["context_id"])
        assert code == "SANDBOX-INVALID-ARGUMENT"


async def test_snapshots_restores_and_forks(mcp):
    async with session(mcp) as sid:
        async def read(session_id):
            out = await call(mcp, "read_file", session_id=session_id, path="notes.txt")
            return out["content"]

        await call(mcp, "write_file", session_id=sid, path="notes.txt", content="first")
        snap = await call(mcp, "snapshot_session", session_id=sid, name="before-change")
        assert snap["name"] == "before-change" and snap["snapshot_id"]
        await call(mcp, "write_file", session_id=sid, path="notes.txt", content="second")
        restored = await call(mcp, "restore_session", session_id=sid,
                              snapshot_id=snap["snapshot_id"])
        assert restored["session_id"] == sid and await read(sid) == "first"
        async with session(mcp, from_snapshot=snap["snapshot_id"]) as started:
            assert await read(started) == "first"
        forked = await call(mcp, "fork_session", session_id=sid, count=2)
        forks = [s["session_id"] for s in forked["sessions"]]
        try:
            assert len(forks) == 2 and sid not in forks
            await call(mcp, "write_file", session_id=forks[0], path="notes.txt", content="mine")
            assert [await read(f) for f in forks] == ["mine", "first"]
            assert await read(sid) == "first", "a fork's writes stay in the fork"
        finally:
            for f in forks:
                await mcp.call_tool("kill_session", {"session_id": f})
        code, _ = await fails(mcp, "fork_session", session_id=sid, count=0)
        assert code == "SANDBOX-INVALID-ARGUMENT"
        code, _ = await fails(mcp, "restore_session", session_id=sid, snapshot_id="nope")
        assert code == "SANDBOX-NOT-FOUND"
        code, _ = await fails(mcp, "snapshot_session", session_id=sid, name="../x")
        assert code == "SANDBOX-INVALID-ARGUMENT"


async def test_files(mcp):
    async with session(mcp) as sid:
        written = await call(mcp, "write_file", session_id=sid, path="/workspace/hello.txt", content="héllo\nwörld\n")
        assert written == {"path": "/workspace/hello.txt", "size": len("héllo\nwörld\n".encode())}
        read = await call(mcp, "read_file", session_id=sid, path="/workspace/hello.txt")
        assert (read["content"], read["encoding"], read["truncated"]) == ("héllo\nwörld\n", "utf8", False)
        # The sandbox sees the same bytes.
        cat = await call(mcp, "run_command", session_id=sid, command="sha256sum /workspace/hello.txt | cut -c1-16")
        assert cat["stdout"].strip() == hashlib.sha256("héllo\nwörld\n".encode()).hexdigest()[:16]

        blob = b"\xff\xfe" + bytes(range(256)) * 4  # not UTF-8 from its first byte
        await call(mcp, "write_file", session_id=sid, path="data.bin", content=base64.b64encode(blob).decode(), encoding="base64")
        back = await call(mcp, "read_file", session_id=sid, path="/workspace/data.bin")
        assert back["encoding"] == "base64" and base64.b64decode(back["content"]) == blob
        cut = await call(mcp, "read_file", session_id=sid, path="/workspace/data.bin", max_bytes=10)
        assert cut["encoding"] == "base64" and cut["truncated"] is True
        assert base64.b64decode(cut["content"]) == blob[:10]

        made = await call(mcp, "run_command", session_id=sid, command="mkdir -p sub/deep && echo x > sub/deep/f")
        assert made["exit_code"] == 0
        listing = await call(mcp, "list_files", session_id=sid)
        entries = {e["name"]: e for e in listing["entries"]}
        assert entries["hello.txt"]["type"] == "file" and entries["data.bin"]["size"] == len(blob)
        assert entries["sub"]["type"] == "dir"
        deep = await call(mcp, "list_files", session_id=sid, path="/workspace/sub", depth=2)
        assert "/workspace/sub/deep/f" in [e["path"] for e in deep["entries"]]

        code, _ = await fails(mcp, "read_file", session_id=sid, path="/workspace/missing.txt")
        assert code == "SANDBOX-NOT-FOUND"
        # `..` stops at the sandbox's root: this is the sandbox's own /etc/passwd.
        escaped = await call(mcp, "read_file", session_id=sid, path="/workspace/../../../etc/passwd")
        inside = await call(mcp, "run_command", session_id=sid, command="cat /etc/passwd")
        assert escaped["content"] == inside["stdout"]


async def test_background_process(mcp):
    async with session(mcp) as sid:
        started = await call(mcp, "start_process", session_id=sid, command="for i in 1 2 3; do echo line$i; sleep 0.2; done; echo done >&2")
        pid = started["process_id"]
        out = await call(mcp, "read_process_output", session_id=sid, process_id=pid, wait_ms=10000)
        assert out["state"] == "exited"
        assert (out["stdout"], out["stderr"], out["exit_code"]) == ("line1\nline2\nline3\n", "done\n", 0)
        # Reading again after the end gives the same kept output.
        again = await call(mcp, "read_process_output", session_id=sid, process_id=pid, wait_ms=100)
        assert again["stdout"] == out["stdout"] and again["state"] == "exited"

        long = await call(mcp, "start_process", session_id=sid, command="echo started; exec sleep 60")
        running = await call(mcp, "read_process_output", session_id=sid, process_id=long["process_id"], wait_ms=1500)
        assert (running["state"], running["stdout"], running["exit_code"]) == ("running", "started\n", None)
        await call(mcp, "stop_process", session_id=sid, process_id=long["process_id"], signal="SIGTERM")
        stopped = await call(mcp, "read_process_output", session_id=sid, process_id=long["process_id"], wait_ms=10000)
        assert stopped["state"] == "exited" and stopped["signal"] == 15, stopped

        code, _ = await fails(mcp, "read_process_output", session_id=sid, process_id="0" * 32)
        assert code == "SANDBOX-NOT-FOUND"


async def test_preview_url_reaches_the_sandboxs_server(mcp):
    async with session(mcp) as sid:
        code, _ = await fails(mcp, "get_preview_url", session_id=sid)
        assert code == "SANDBOX-PREVIEW-NOT-LISTENING"
        await call(mcp, "write_file", session_id=sid, path="/workspace/index.txt", content="served from the sandbox\n")
        await call(mcp, "start_process", session_id=sid, argv=["/usr/bin/python3", "-m", "http.server", "8765", "--bind", "127.0.0.1"], cwd="/workspace")
        deadline = time.monotonic() + 20
        while True:
            result = await mcp.call_tool("get_preview_url", {"session_id": sid})
            if not result.is_error:
                preview = result.structured_content
                break
            assert result.structured_content["error"]["code"] == "SANDBOX-PREVIEW-NOT-LISTENING"
            assert time.monotonic() < deadline, "the server never listened"
            time.sleep(0.2)
        assert preview["port"] == 8765
        assert preview["url"] == f"{DAEMON_URL}/v1/sandbox/sessions/{sid}/preview/"
        req = urllib.request.Request(preview["url"] + "index.txt", headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.read() == b"served from the sandbox\n"


async def test_errors_are_tool_errors_with_the_sandbox_code(mcp):
    code, message = await fails(mcp, "run_code", session_id="0" * 32, code="print(1)")
    assert code == "SANDBOX-NOT-FOUND"
    code, message = await fails(mcp, "run_code", session_id="x", code="1", language="ruby")
    assert code == "SANDBOX-INVALID-ARGUMENT" and "ruby" in message
    code, message = await fails(mcp, "run_code", session_id="x", code="1", timeout="5s")
    assert code == "SANDBOX-INVALID-ARGUMENT" and "timeout" in message
    code, _ = await fails(mcp, "kill_session", session_id="../../v1/sandbox/sessions")
    assert code == "SANDBOX-INVALID-ARGUMENT"
    code, _ = await fails(mcp, "create_session", timeout_s=10**9)
    assert code == "SANDBOX-INVALID-ARGUMENT"
    # The daemon's own checks come back the same way.
    code, _ = await fails(mcp, "create_session", memory_mib=10**9)
    assert code == "SANDBOX-INVALID-ARGUMENT"
    # An unknown tool is a protocol error, as the spec says.
    with pytest.raises(MCPError):
        await mcp.call_tool("rm_rf", {})


async def test_each_call_uses_the_configured_key(connect):
    async with connect(key=KEY) as mine, connect(key=OTHER_KEY, transport="http") as theirs:
        async with session(mine) as sid:
            code, _ = await fails(theirs, "run_code", session_id=sid, code="print(1)")
            assert code == "SANDBOX-NOT-FOUND"  # another tenant's session is an unknown one
            assert sid not in [s["session_id"] for s in (await call(theirs, "list_sessions"))["sessions"]]
    async with connect(key="e2b_" + "0" * 40) as bad:
        code, _ = await fails(bad, "list_sessions")
        assert code == "SANDBOX-AUTH-001"


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_both_protocol_generations(connect, mode):
    """`legacy`: the initialize handshake (2025-11-25); `auto`: server/discover (2026-07-28)."""
    async with connect(mode=mode, transport="http") as client:
        version = client.session.protocol_version
        assert version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
        async with session(client) as sid:
            out = await call(client, "run_code", session_id=sid, language="python", code="print(6*7)")
            assert out["stdout"] == "42\n"


async def test_http_refuses_browsers_and_foreign_hosts(http_server):
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with httpx2.AsyncClient(timeout=10) as http:
        ok = await http.post(http_server.url, json=init, headers=headers)
        assert ok.status_code == 200
        page = await http.post(http_server.url, json=init, headers={**headers, "Origin": "https://evil.example"})
        assert page.status_code == 403
        rebound = await http.post(http_server.url, json=init, headers={**headers, "Host": "evil.example"})
        assert rebound.status_code == 403


def test_http_listens_on_loopback_unless_told():
    refused = subprocess.run([BIN, "mcp", "--url", DAEMON_URL, "--http", "0.0.0.0:0"], capture_output=True, text=True, timeout=20)
    assert refused.returncode != 0 and "--allow-remote" in refused.stderr
    no_key = subprocess.run([BIN, "mcp", "--url", DAEMON_URL, "--http", "127.0.0.1:0", "--allow-remote"], capture_output=True, text=True, timeout=20, env={"PATH": "/usr/bin:/bin"})
    assert no_key.returncode != 0 and "needs an API key" in no_key.stderr


async def test_remote_http_needs_the_key_as_a_bearer_token():
    # Remote mode on loopback: the tests never listen beyond it.
    server = HttpServer(KEY, "--allow-remote", listen="127.0.0.1:0")
    try:
        url = server.url
        async with httpx2.AsyncClient(timeout=10) as http:
            bare = await http.post(url, json={}, headers={"Accept": "application/json, text/event-stream"})
            assert bare.status_code == 401
        authed = httpx2.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
        async with authed, Client(streamable_http_client(url, http_client=authed)) as client:
            assert TOOLS == {t.name for t in (await client.list_tools()).tools}
    finally:
        server.stop()
