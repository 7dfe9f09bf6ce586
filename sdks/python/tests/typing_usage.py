"""Checked by mypy (scripts/python-sdk-tests.sh), never run: the one definition of each method
gives blocking types on the sync client and awaitable ones on the async client."""

from __future__ import annotations

from typing import Awaitable, List

from typing_extensions import assert_type

from koder_sandbox import (
    AsyncByteStream,
    AsyncClient,
    AsyncEventStream,
    AsyncSandbox,
    AsyncTerminal,
    ByteStream,
    Client,
    EventStream,
    ExecEvent,
    ExecResult,
    FileEntry,
    RunEvent,
    RunResult,
    Sandbox,
    SecretInfo,
    SessionInfo,
    Terminal,
    WebhookDelivery,
    WebhookInfo,
)


def sync_usage(client: Client) -> None:
    sb = client.sessions.create("python", limits={"memory_mib": 256})
    assert_type(sb, Sandbox)
    assert_type(client.sessions.list(), List[Sandbox])
    assert_type(sb.exec(shell="echo hi"), ExecResult)
    assert_type(sb.exec_stream(["ls"], cwd="/"), EventStream[ExecEvent])
    assert_type(sb.files.write("a.txt", b"x"), FileEntry)
    assert_type(sb.files.download("a.txt"), ByteStream)
    assert_type(sb.contexts.run("1 + 1"), RunResult)
    assert_type(sb.contexts.run_stream("print(1)"), EventStream[RunEvent])
    assert_type(sb.refresh(), SessionInfo)
    assert_type(sb.fork(2), List[Sandbox])
    assert_type(sb.set_network({"mode": "open"}), SessionInfo)
    assert_type(client.secrets.put("TOKEN", "v", ["api.example.com"]), SecretInfo)
    assert_type(client.webhooks.deliveries("wh_1"), List[WebhookDelivery])
    with sb.terminal() as term:
        assert_type(term, Terminal)
    with sb:
        pass


async def async_usage(client: AsyncClient) -> None:
    sb = await client.sessions.create("python")
    assert_type(sb, AsyncSandbox)
    assert_type(client.sessions.get("id"), Awaitable[AsyncSandbox])
    assert_type(await sb.exec(code="print(1)"), ExecResult)
    assert_type(await sb.exec_stream(shell="ls"), AsyncEventStream[ExecEvent])
    assert_type(await sb.files.download("a.txt"), AsyncByteStream)
    assert_type(await sb.execs.start(shell="sleep 1"), str)
    assert_type(await client.secrets.list(), List[SecretInfo])
    assert_type(await client.webhooks.create("https://hooks.example.com/k"), WebhookInfo)
    async with sb.terminal("bash") as term:
        assert_type(term, AsyncTerminal)
    async with sb:
        pass
