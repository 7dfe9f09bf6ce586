"""envd and control-plane semantics the SDK relies on beyond the happy path: what a symlink's
info says, removing what is not there, listing by start time, metrics over a time range, a
sandbox killed under a running command, and an MCP gateway that cannot start."""

import datetime
import time
import uuid
from typing import Any, cast

import pytest
from e2b import Sandbox, SandboxException, SandboxQuery, SandboxState, TimeoutException
from e2b.sandbox.filesystem.filesystem import FileType


def test_symlink_info_follows_to_its_target(sandbox):
    d = f"links-{uuid.uuid4().hex[:8]}"
    sandbox.files.make_dir(d)
    sandbox.files.write(f"{d}/target.txt", "hello")
    sandbox.commands.run(f"ln -s target.txt {d}/to-file && ln -s . {d}/to-dir "
                         f"&& ln -s nowhere {d}/dangling && ln -s loop {d}/loop", cwd="/home/user")
    info = sandbox.files.get_info(f"{d}/to-file")
    assert info.type == FileType.FILE
    assert info.symlink_target == f"/home/user/{d}/target.txt"
    assert info.size == 5
    assert sandbox.files.get_info(f"{d}/to-dir").type == FileType.DIR
    # A link that leads nowhere, or around in a circle, stays a link.
    for name in ["dangling", "loop"]:
        info = sandbox.files.get_info(f"{d}/{name}")
        assert info.symlink_target is not None
        assert info.type not in (FileType.FILE, FileType.DIR)
    sandbox.files.remove(d)


def test_removing_a_missing_path_is_not_an_error(sandbox):
    sandbox.files.remove(f"never-there-{uuid.uuid4().hex}")
    sandbox.files.remove("/home/user/nested/missing/deeper")


def test_list_filters_by_start_time(fresh):
    tag = uuid.uuid4().hex
    sb = fresh(metadata={"started": tag})
    started = sb.get_info().started_at

    def listed(after):
        q = SandboxQuery(metadata={"started": tag}, started_after=after)
        return [s.sandbox_id for s in Sandbox.list(query=q).next_items()]

    assert sb.sandbox_id in listed(started)
    assert sb.sandbox_id not in listed(started + datetime.timedelta(seconds=1))


def test_metrics_only_inside_the_requested_range(fresh):
    sb = fresh()
    now = datetime.datetime.now(datetime.timezone.utc)
    assert len(sb.get_metrics(start=now - datetime.timedelta(minutes=1), end=now)) == 1
    before = now - datetime.timedelta(hours=1)
    assert sb.get_metrics(start=before, end=before + datetime.timedelta(minutes=30)) == []
    later = now + datetime.timedelta(hours=1)
    assert sb.get_metrics(start=later) == []


def test_metrics_range_must_be_unix_seconds(api, fresh):
    sb = fresh()
    r = api.get(f"/sandboxes/{sb.sandbox_id}/metrics", params={"start": "yesterday"})
    assert r.status_code == 400, r.text
    assert "unix time" in r.json()["message"]


def test_list_refuses_a_bad_start_time(api):
    r = api.get("/v2/sandboxes", params={"startedAfter": "soon"})
    assert r.status_code == 400, r.text
    assert "RFC 3339" in r.json()["message"]


def test_killing_the_sandbox_ends_a_running_command_as_gone(fresh):
    sb = fresh()
    cmd = sb.commands.run("sleep 60", background=True)
    sb.kill()
    started = time.monotonic()
    with pytest.raises(TimeoutException) as e:
        cmd.wait()
    assert "sandbox was killed or reached its end of life" in str(e.value)
    assert time.monotonic() - started < 30


def test_a_command_killed_by_signal_still_ends_normally(sandbox):
    cmd = sandbox.commands.run("sleep 60", background=True)
    assert sandbox.commands.kill(cmd.pid)
    with pytest.raises(SandboxException) as e:
        cmd.wait()
    # The process ended (killed); the sandbox did not go away.
    assert "end of life" not in str(e.value)
    assert sandbox.commands.run("echo alive").stdout == "alive\n"


def test_an_mcp_gateway_that_cannot_start_leaves_no_sandbox():
    tag = {"mcp-test": uuid.uuid4().hex}
    with pytest.raises(SandboxException, match="Failed to start MCP gateway"):
        Sandbox.create("base", metadata=tag, mcp=cast(Any, {"some_server": {}}))
    q = SandboxQuery(state=[SandboxState.RUNNING], metadata=tag)
    assert Sandbox.list(query=q).next_items() == []


def test_mcp_must_be_an_object(api):
    r = api.post("/sandboxes", json={"templateID": "base", "mcp": ["not", "an", "object"]})
    assert r.status_code == 400, r.text
    assert "mcp" in r.json()["message"]
