"""Error paths (auth, tenancy, bad requests, plan and quota, connection) and administration."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx
import pytest

import koder_sandbox as ks

from ._helpers import close, make_client, run, unique


async def test_auth_failures(flavor: str) -> None:
    for key in ("wrong-key", None):
        c = make_client(flavor, key)
        try:
            with pytest.raises(ks.AuthError) as e:
                await run(c.sessions.list())
            assert e.value.status == 401 and e.value.code == "SANDBOX-AUTH-001"
            assert isinstance(e.value, ks.SandboxError) and e.value.message
        finally:
            await close(c)


async def test_other_tenants_session_is_not_found(sb: Any, other: Any) -> None:
    with pytest.raises(ks.NotFoundError) as e:
        await run(other.sessions.get(sb.id))
    assert e.value.status == 404 and e.value.code == "SANDBOX-NOT-FOUND"
    foreign = other.sessions.connect(sb.id)
    for call in (foreign.exec, foreign.exec_stream):
        with pytest.raises(ks.NotFoundError):
            await run(call(shell="true"))
    for op in (foreign.delete, foreign.pause, foreign.metrics, foreign.snapshot, foreign.fork):
        with pytest.raises(ks.NotFoundError):
            await run(op())
    assert sb.id not in [s.id for s in await run(other.sessions.list())]
    with pytest.raises(ks.NotFoundError) as unknown:
        await run(other.sessions.get("0" * 32))
    assert unknown.value.message == e.value.message


async def test_bad_requests(client: Any, sb: Any) -> None:
    with pytest.raises(ks.InvalidArgumentError) as e:
        await run(client.sessions.create("cobol"))
    assert e.value.status == 400
    with pytest.raises(ks.InvalidArgumentError):
        await run(client.sessions.create(limits={"memory_mib": 1, "bogus": 1}))
    with pytest.raises(ks.InvalidArgumentError):
        await run(sb.fork(1000))
    with pytest.raises(ks.InvalidArgumentError):
        await run(sb.set_timeout(0))


async def test_admin_tenants_plan_and_quota(flavor: str, admin: Any, client: Any) -> None:
    with pytest.raises(ks.PermissionDeniedError) as e:
        await run(client.admin.list_tenants())
    assert e.value.status == 403
    tenant = unique("tenant")
    info = await run(admin.admin.put_tenant(tenant, "free", max_sessions=1, name="Test"))
    assert (info.id, info.plan, info.max_sessions, info.name) == (tenant, "free", 1, "Test")
    assert (await run(admin.admin.get_tenant(tenant))).live_sessions == 0
    assert tenant in [t.id for t in await run(admin.admin.list_tenants())]
    issued = await run(admin.admin.issue_key(tenant))
    assert issued.tenant_id == tenant and issued.api_key
    c = make_client(flavor, issued.api_key)
    try:
        first = await run(c.sessions.create())
        try:
            with pytest.raises(ks.QuotaExceededError) as q:
                await run(c.sessions.create())
            assert q.value.status == 429 and q.value.code == "SANDBOX-QUOTA-SESSIONS"
        finally:
            await run(first.delete())
        await run(admin.admin.put_tenant(tenant, "none"))
        with pytest.raises(ks.PlanRequiredError) as p:
            await run(c.sessions.create())
        assert p.value.status == 402 and p.value.code == "SANDBOX-PLAN-REQUIRED"
    finally:
        await close(c)
    with pytest.raises(ks.NotFoundError):
        await run(admin.admin.get_tenant(unique("nobody")))


async def test_network_audit(client: Any) -> None:
    s = await run(client.sessions.create(network=ks.Network(mode="open")))
    try:
        # A private address is refused by the SSRF guard, and the attempt is audited.
        await run(s.exec(shell="exec 3<>/dev/tcp/10.255.255.1/80", timeout_ms=5000))
        for _ in range(50):  # the audit log is written beside the decision, not before it
            page = await run(client.network_audit(s.id))
            if page.entries:
                break
            await asyncio.sleep(0.1)
        assert isinstance(page, ks.AuditPage) and page.entries
        entry = page.entries[0]
        assert (entry.session_id, entry.dest, entry.port, entry.allowed) == (s.id, "10.255.255.1", 80, False)
        assert (await run(client.network_audit(s.id, allowed=True))).entries == []
    finally:
        await run(s.delete())


async def test_connection_error(flavor: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    c = ks.Client(f"http://127.0.0.1:{port}", "k") if flavor == "sync" else ks.AsyncClient(f"http://127.0.0.1:{port}", "k")
    try:
        with pytest.raises(ks.SandboxConnectionError) as e:
            await run(c.health())
        assert e.value.status is None and e.value.code is None
    finally:
        await close(c)


def test_error_mapping_of_other_answers() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/sandbox/sessions":
            return httpx.Response(429, headers={"retry-after": "7"},
                                  json={"error": {"code": "SANDBOX-RATE-LIMITED", "message": "slow down"}})
        if request.url.path == "/healthz":
            return httpx.Response(502, text="<html>bad gateway</html>")
        return httpx.Response(200, json={"unexpected": True})

    with ks.Client("http://daemon", "k", transport=httpx.MockTransport(answer)) as c:
        with pytest.raises(ks.RateLimitedError) as rl:
            c.sessions.list()
        assert (rl.value.retry_after, rl.value.status, rl.value.message) == (7.0, 429, "slow down")
        with pytest.raises(ks.SandboxError) as bad:
            c.health()
        assert (bad.value.status, bad.value.code) == (502, None) and "bad gateway" in bad.value.message
        with pytest.raises(ks.ProtocolError):
            c.sessions.connect("x").metrics()
