"""Exec: one-shot results, SSE streams, background execs with stdin and signals."""

from __future__ import annotations

from typing import Any

import pytest

import koder_sandbox as ks

from ._helpers import collect, entered, run


async def test_exec_result_fields(sb: Any) -> None:
    r = await run(sb.exec(shell="echo out; echo err >&2; exit 3"))
    assert isinstance(r, ks.ExecResult)
    assert (r.stdout, r.stderr, r.exit_code, r.verdict) == ("out\n", "err\n", 3, None)
    assert r.exec_id and r.duration_ms >= 0 and not r.stdout_truncated


async def test_exec_argv_env_cwd_stdin_user(sb: Any) -> None:
    r = await run(sb.exec(["cat"], stdin="fed through stdin"))
    assert r.stdout == "fed through stdin"
    r = await run(sb.exec(["sh", "-c", "echo $A; pwd; id -u"], env={"A": "b"}, cwd="/tmp", user="user"))
    assert r.stdout.split() == ["b", "/tmp", "1000"]


async def test_exec_code_and_language(sb: Any) -> None:
    assert (await run(sb.exec(code="print(6 * 7)"))).stdout == "42\n"
    r = await run(sb.exec(code="console.log(1 + 1)", language="node"))
    assert r.stdout == "2\n"


async def test_exec_timeout_verdict_keeps_output(sb: Any) -> None:
    r = await run(sb.exec(shell="echo before; sleep 10", timeout_ms=500))
    assert r.verdict == "SANDBOX-EXEC-TIMEOUT" and r.stdout == "before\n"


async def test_exec_bad_requests(sb: Any) -> None:
    with pytest.raises(ks.InvalidArgumentError) as e:
        await run(sb.exec(["true"], shell="true"))
    assert e.value.status == 400 and e.value.code == "SANDBOX-INVALID-ARGUMENT"
    with pytest.raises(ks.InvalidArgumentError):
        await run(sb.exec(["/no/such/program"]))


async def test_exec_stream_events(sb: Any) -> None:
    events = await collect(sb.exec_stream(shell="echo one; printf '\\377' >&2; echo two"))
    assert isinstance(events[0], ks.ExecStart)
    assert isinstance(events[-1], ks.ExecExit) and events[-1].result.exit_code == 0
    assert events[-1].result.exec_id == events[0].exec_id
    out = b"".join(e.data for e in events if isinstance(e, ks.ExecOutput) and e.stream == "stdout")
    err = b"".join(e.data for e in events if isinstance(e, ks.ExecOutput) and e.stream == "stderr")
    assert out == b"one\ntwo\n" and err == b"\xff"


async def test_exec_stream_closed_early_cancels(sb: Any) -> None:
    async with entered(await run(sb.exec_stream(shell="echo started; sleep 60"))) as stream:
        first = await run(stream.__anext__() if hasattr(stream, "__anext__") else next(stream))
        assert isinstance(first, ks.ExecStart)
        exec_id = first.exec_id
    for _ in range(50):
        status = await run(sb.execs.get(exec_id))
        if status.state == "exited":
            break
        await run(sb.exec(shell="sleep 0.1"))
    # The daemon killed it when the stream went away.
    assert status.state == "exited" and status.result.signal == 9


async def test_background_exec_stdin_wait_and_list(sb: Any) -> None:
    exec_id = await run(sb.execs.start(shell="read line; echo got $line; cat"))
    status = await run(sb.execs.get(exec_id))
    assert status.background is True and status.state == "running"
    assert status.command == ["/bin/bash", "-c", "read line; echo got $line; cat"]
    assert exec_id in [x.exec_id for x in await run(sb.execs.list())]
    await run(sb.execs.write_stdin(exec_id, "first\n"))
    await run(sb.execs.write_stdin(exec_id, b"rest"))
    await run(sb.execs.close_stdin(exec_id))
    result = await run(sb.execs.wait(exec_id))
    assert result.stdout == "got first\nrest" and result.exit_code == 0
    status = await run(sb.execs.get(exec_id))
    assert status.state == "exited" and status.result.stdout == "got first\nrest"
    events = await collect(sb.execs.stream(exec_id))
    assert isinstance(events[0], ks.ExecStart) and isinstance(events[-1], ks.ExecExit)
    replayed = b"".join(e.data for e in events if isinstance(e, ks.ExecOutput))
    assert replayed == b"got first\nrest"


async def test_background_exec_signal_and_kill(sb: Any) -> None:
    term = await run(sb.execs.start(shell="trap 'echo bye; exit 7' TERM; while true; do sleep 0.05; done"))
    await run(sb.exec(shell="sleep 0.3"))
    await run(sb.execs.signal(term, "SIGTERM"))
    result = await run(sb.execs.wait(term))
    assert result.exit_code == 7 and result.stdout == "bye\n"
    killed = await run(sb.execs.start(cmd=["sleep", "60"]))
    await run(sb.execs.kill(killed))
    result = await run(sb.execs.wait(killed))
    assert result.signal == 9 and result.exit_code is None


async def test_background_exec_errors(sb: Any) -> None:
    with pytest.raises(ks.NotFoundError):
        await run(sb.execs.get("no-such-exec"))
    with pytest.raises(ks.NotFoundError):
        await collect(sb.execs.stream("no-such-exec"))
    with pytest.raises(ks.InvalidArgumentError):
        exec_id = await run(sb.execs.start(cmd=["sleep", "5"]))
        try:
            await run(sb.execs.signal(exec_id, "SIGNOPE"))
        finally:
            await run(sb.execs.kill(exec_id))
