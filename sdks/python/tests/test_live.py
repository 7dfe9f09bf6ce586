"""Terminal and file watch over WebSocket, and code-interpreter contexts."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import koder_sandbox as ks

from ._helpers import collect, entered, run, unique


async def _read_until(term: Any, needle: bytes, limit: int = 200) -> bytes:
    seen = b""
    for _ in range(limit):
        item = await run(term.recv(timeout=10))
        if isinstance(item, ks.TerminalExit):
            break
        seen += item
        if needle in seen:
            break
    return seen


async def test_terminal_shell_resize_and_exit(sb: Any) -> None:
    async with entered(sb.terminal(cols=100, rows=30)) as term:
        await run(term.send("stty size\n"))
        assert b"30 100" in await _read_until(term, b"30 100")
        await run(term.resize(120, 40))
        await run(term.send(b"stty size; exit 5\n"))
        assert b"40 120" in await _read_until(term, b"40 120")
        rest = [c async for c in term] if hasattr(term, "__aiter__") else list(term)
        assert isinstance(rest, list)
        assert term.exit == ks.TerminalExit(exit_code=5, signal=None)


async def test_terminal_command_with_args(sb: Any) -> None:
    async with entered(sb.terminal("printf", ["%s-%s", "a b", "c"], cwd="/tmp")) as term:
        out = b"".join(await collect(term))
    assert out == b"a b-c" and term.exit.exit_code == 0


async def test_terminal_errors(sb: Any, other: Any) -> None:
    with pytest.raises(ks.NotFoundError):
        async with entered(other.sessions.connect(sb.id).terminal()):
            pass
    with pytest.raises(ks.InvalidArgumentError):
        async with entered(sb.terminal(cols=70000)):
            pass


async def test_watch_sees_changes(sb: Any) -> None:
    d = "/workspace/" + unique("watched")
    await run(sb.files.mkdir(d))
    async with entered(sb.watch(d, recursive=True)) as watch:
        await run(sb.exec(shell=f"sleep 0.2; echo x > {d}/new.txt; mv {d}/new.txt {d}/renamed.txt"))
        events = []
        while not any(e.type == "renamed" for e in events):
            events.append(await run(watch.next(timeout=10)))
    assert all(isinstance(e, ks.FsEvent) for e in events)
    assert (f"{d}/new.txt", "created") in [(e.path, e.type) for e in events]
    renamed = [e for e in events if e.type == "renamed"][0]
    assert renamed.path == f"{d}/renamed.txt" and renamed.from_path == f"{d}/new.txt"


async def test_watch_errors(sb: Any, other: Any) -> None:
    with pytest.raises(ks.NotFoundError):
        async with entered(other.sessions.connect(sb.id).watch("/workspace")):
            pass
    with pytest.raises(ks.NotFoundError):
        async with entered(sb.watch("/workspace/" + unique("missing"))) as w:
            await run(w.next(timeout=5))


async def test_contexts_state_rich_results_and_errors(sb: Any) -> None:
    ctx = await run(sb.contexts.create("python", cwd="/tmp", env={"CTX_VAR": "set"}))
    assert isinstance(ctx, ks.ContextInfo) and ctx.cwd == "/tmp" and ctx.language == "python"
    try:
        r = await run(sb.contexts.run("import os\nx = 21\nprint(os.environ['CTX_VAR'])", ctx.context_id))
        assert r.stdout == "set\n" and r.error is None and r.execution_count == 1
        r = await run(sb.contexts.run("{'double': x * 2}", ctx.context_id))
        main = [o for o in r.results if o.is_main_result]
        assert main and main[0].json == {"double": 42} and "42" in (main[0].text or "")
        r = await run(sb.contexts.run("import os; os.environ.get('RUN_VAR')", ctx.context_id, env={"RUN_VAR": "once"}))
        assert r.results[0].text == "'once'"
        r = await run(sb.contexts.run("1 / 0", ctx.context_id))
        assert r.error is not None and r.error.name == "ZeroDivisionError"
        r = await run(sb.contexts.run("import time; time.sleep(5)", ctx.context_id, timeout_ms=300))
        assert r.restarted is True and r.verdict == "SANDBOX-EXEC-TIMEOUT"
        assert ctx.context_id in [c.context_id for c in await run(sb.contexts.list())]
        restarted = await run(sb.contexts.restart(ctx.context_id))
        assert restarted.execution_count == 0
        r = await run(sb.contexts.run("'x' in dir()", ctx.context_id))
        assert r.results[0].text == "False"
    finally:
        await run(sb.contexts.delete(ctx.context_id))
    with pytest.raises(ks.NotFoundError):
        await run(sb.contexts.run("1", ctx.context_id))


async def test_context_run_stream_and_default_and_node(sb: Any) -> None:
    events = await collect(sb.contexts.run_stream("import sys\nprint('a')\nprint('b', file=sys.stderr)\n7"))
    outs = [e for e in events if isinstance(e, ks.RunOutput)]
    assert "".join(e.text for e in outs if e.stream == "stdout") == "a\n"
    assert "".join(e.text for e in outs if e.stream == "stderr") == "b\n"
    assert isinstance(events[-1], ks.RunDone) and events[-1].result.results[0].text == "7"
    node = await run(sb.contexts.create("node"))
    try:
        r = await run(sb.contexts.run("let y = 4; y * 10", node.context_id))
        assert r.results[0].text == "40"
    finally:
        await run(sb.contexts.delete(node.context_id))
    with pytest.raises(ks.NotFoundError):
        await collect(sb.contexts.run_stream("1", "no-such-context"))


async def test_concurrent_async_calls(client: Any, sb: Any) -> None:
    if isinstance(client, ks.Client):
        pytest.skip("concurrency through one event loop is the async client's")
    results = await asyncio.gather(*(sb.exec(shell=f"echo {i}") for i in range(5)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(5)]
