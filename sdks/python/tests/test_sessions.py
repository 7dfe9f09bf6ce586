"""Sessions: create with options, get, list, connect, timeout, lifecycle, fork, metrics, event
log."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import koder_sandbox as ks

from ._helpers import collect, run


async def test_health(client: Any) -> None:
    assert await run(client.health()) is True


async def test_create_with_options_and_get(client: Any) -> None:
    s = await run(
        client.sessions.create(
            "python",
            limits=ks.Limits(memory_mib=256, pids=128),
            network=ks.Network(mode="none"),
            env={"GREETING": "hello"},
            timeout_s=120,
            metadata={"owner": "pytest"},
            lifecycle=ks.Lifecycle(on_timeout="kill"),
        )
    )
    try:
        assert isinstance(s, ks.SandboxBase)
        assert s.info is not None and s.info.state == "running"
        assert s.info.language == "python"
        assert s.info.limits.memory_mib == 256 and s.info.limits.pids == 128
        assert s.info.network.mode == "none"
        assert s.info.metadata == {"owner": "pytest"}
        r = await run(s.exec(shell="echo $GREETING"))
        assert r.stdout == "hello\n"
        got = await run(client.sessions.get(s.id))
        assert got.id == s.id and got.info.metadata == {"owner": "pytest"}
        listed = await run(client.sessions.list())
        assert s.id in [x.id for x in listed]
        assert all(isinstance(x.info, ks.SessionInfo) for x in listed)
    finally:
        await run(s.delete())
    after = await run(s.refresh())
    assert after.state == "stopped" and after.end_reason == "deleted"
    assert s.id not in [x.id for x in await run(client.sessions.list())]
    with pytest.raises(ks.NotFoundError):
        await run(s.exec(shell="true"))


async def test_connect_refresh_and_timeout(client: Any, sb: Any) -> None:
    handle = client.sessions.connect(sb.id)
    assert handle.info is None
    info = await run(handle.refresh())
    assert handle.info == info and info.id == sb.id and info.metadata == {"suite": "shared"}
    before = info.expires_at
    updated = await run(handle.set_timeout(900))
    assert updated.expires_at > before


async def test_pause_and_resume(fresh: Any) -> None:
    await run(fresh.files.write("/tmp/kept", "x"))
    paused = await run(fresh.pause())
    assert paused.state == "paused" and fresh.info.state == "paused"
    with pytest.raises(ks.ConflictError) as e:
        await run(fresh.exec(shell="true"))
    assert e.value.status == 409 and e.value.code == "SANDBOX-CONFLICT"
    resumed = await run(fresh.resume())
    assert resumed.state == "running"
    assert (await run(fresh.exec(shell="cat /tmp/kept"))).stdout == "x"
    await run(fresh.files.write("/workspace/disk.txt", "on disk"))
    assert (await run(fresh.pause(memory=False))).state == "paused"
    assert (await run(fresh.resume())).state == "running"
    assert await run(fresh.files.read_text("/workspace/disk.txt")) == "on disk"


async def test_fork(client: Any, fresh: Any) -> None:
    await run(fresh.files.write("forked.txt", "from the source"))
    copies = await run(fresh.fork(2))
    try:
        assert len(copies) == 2 and len({c.id for c in copies} | {fresh.id}) == 3
        for c in copies:
            assert c.info.state == "running"
            assert await run(c.files.read_text("forked.txt")) == "from the source"
    finally:
        for c in copies:
            await run(c.delete())


async def test_metrics_and_kill_processes(sb: Any) -> None:
    m = await run(sb.metrics())
    assert isinstance(m, ks.SessionMetrics) and m.disk_total_kib > 0 and m.pids_current >= 0
    exec_id = await run(sb.execs.start(shell="sleep 300"))
    killed = await run(sb.kill_processes())
    assert killed >= 1
    result = await run(sb.execs.wait(exec_id))
    assert result.verdict == "SANDBOX-EXEC-KILLED"


async def test_event_log(client: Any, other: Any) -> None:
    s = await run(client.sessions.create())
    try:
        r = await run(s.exec(shell="sleep 30", timeout_ms=200))
        assert r.verdict == "SANDBOX-EXEC-TIMEOUT"
    finally:
        await run(s.delete())
    for _ in range(100):  # the log is written after the calls answer, not before
        log = await run(s.events())
        if len(log) >= 3:
            break
        await asyncio.sleep(0.1)
    assert isinstance(log, ks.SessionEventList) and log.more is False
    assert [(e.seq, e.type) for e in log] == [
        (1, "session.created"),
        (2, "exec.verdict"),
        (3, "session.stopped"),
    ]
    assert all(isinstance(e, ks.SessionEvent) and e.data["session_id"] == s.id for e in log)
    assert log.events[1].data["verdict"] == "SANDBOX-EXEC-TIMEOUT"
    assert log.events[2].data["cause"] == "deleted"
    page = await run(s.events(after=1, limit=1))
    assert [e.seq for e in page] == [2] and page.more is True
    assert page.events[0].id == log.events[1].id
    with pytest.raises(ks.InvalidArgumentError):
        await run(s.events(limit=0))
    with pytest.raises(ks.NotFoundError):
        await run(other.sessions.connect(s.id).events())


async def test_errors_ring(sb: Any) -> None:
    entry = await run(sb.report_error("browser", "TypeError: x is undefined", stack="at f()"))
    assert entry.source == "browser" and entry.stack == "at f()"
    errors = await run(sb.errors())
    assert errors[-1].message == "TypeError: x is undefined"


async def test_preview_pin_and_upstream(sb: Any) -> None:
    # The port is pinned, but nothing listens there yet: the daemon says so with 503.
    with pytest.raises(ks.UnavailableError) as e:
        await run(sb.pin_preview(8765))
    assert e.value.code == "SANDBOX-PREVIEW-NOT-LISTENING" and e.value.status == 503
    with pytest.raises(ks.UnavailableError):
        await run(sb.upstream())
    exec_id = await run(sb.execs.start(cmd=["python3", "-m", "http.server", "8765"], cwd="/tmp"))
    try:
        for _ in range(100):
            try:
                up = await run(sb.upstream())
                break
            except ks.UnavailableError:
                await run(sb.exec(shell="sleep 0.1"))
        assert up.port == 8765 and up.pinned is True and "/preview" in up.preview_path
        pinned = await run(sb.pin_preview(8765))
        assert pinned.pinned is True and pinned.url.endswith(":8765")
    finally:
        await run(sb.execs.kill(exec_id))


async def test_fork_list_is_handles(client: Any, sb: Any) -> None:
    listed = await collect(client.sessions.list())
    mine = [s for s in listed if s.id == sb.id]
    assert mine and mine[0].info.metadata == {"suite": "shared"}
