"""Egress: secrets (sealed, never answered, bound to a session as placeholders), a running
session's network policy replaced, and webhooks delivered, signed, to a receiver of the test's
own (scripts/python-sdk-tests.sh lets the daemon send to loopback)."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

import koder_sandbox as ks

from ._helpers import run


async def test_secrets_are_kept_listed_bound_and_deleted(client: Any, other: Any) -> None:
    name = f"PY_TOKEN_{uuid.uuid4().hex[:8].upper()}"
    value = f"sv-{uuid.uuid4().hex}"
    made = await run(client.secrets.put(name, value, ["api.test:8080"]))
    assert isinstance(made, ks.SecretInfo)
    assert (made.name, made.hosts) == (name, ["api.test:8080"])
    try:
        mine = [s for s in await run(client.secrets.list()) if s.name == name]
        assert [s.hosts for s in mine] == [["api.test:8080"]]
        assert name not in [s.name for s in await run(other.secrets.list())]
        replaced = await run(client.secrets.put(name, value + "-2", ["*.api.test"]))
        assert replaced.hosts == ["*.api.test"]
        sandbox = await run(client.sessions.create(network={"mode": "open"}, secrets=[name]))
        try:
            seen = (await run(sandbox.exec(shell=f"printenv {name}"))).stdout.strip()
            assert seen.startswith("KSECRET_") and value not in seen
        finally:
            await run(sandbox.delete())
        with pytest.raises(ks.NotFoundError):
            await run(client.sessions.create(network={"mode": "open"}, secrets=["NO_SUCH_SECRET"]))
        with pytest.raises(ks.InvalidArgumentError):
            await run(client.sessions.create(secrets=[name]))  # no network to inject into
        with pytest.raises(ks.InvalidArgumentError):
            await run(client.secrets.put("1BAD", "v", ["a.test"]))
        with pytest.raises(ks.InvalidArgumentError):
            await run(client.secrets.put("HEADER", "v\r\nX-Evil: 1", ["a.test"]))
    finally:
        await run(client.secrets.delete(name))
    with pytest.raises(ks.NotFoundError):
        await run(client.secrets.delete(name))


async def test_a_running_session_s_network_is_replaced(client: Any) -> None:
    sandbox = await run(client.sessions.create(network={"mode": "open"}))
    try:
        info = await run(sandbox.set_network(ks.Network(mode="allowlist")))
        assert (info.network.mode, info.network.allow) == ("allowlist", [])
        assert sandbox.info.network.mode == "allowlist"
        info = await run(sandbox.set_network({"mode": "open", "deny": ["10.0.0.0/8"]}))
        assert (info.network.mode, info.network.deny) == ("open", ["10.0.0.0/8"])
        with pytest.raises(ks.InvalidArgumentError):
            await run(sandbox.set_network({"mode": "open", "allow": ["pypi.org"]}))
        with pytest.raises(ks.InvalidArgumentError):
            await run(sandbox.set_network({"mode": "allowlist", "allow": ["not a host"]}))
    finally:
        await run(sandbox.delete())
    closed = await run(client.sessions.create())
    try:
        with pytest.raises(ks.ConflictError):  # created without network: no egress path
            await run(closed.set_network({"mode": "open"}))
    finally:
        await run(closed.delete())


class _Receiver(BaseHTTPRequestHandler):
    received: list[tuple[dict[str, str], bytes]]

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.received.append(({k.lower(): v for k, v in self.headers.items()}, raw))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    received: list[tuple[dict[str, str], bytes]] = []
    handler = type("Handler", (_Receiver,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", received
    finally:
        server.shutdown()
        server.server_close()


async def test_webhooks_deliver_signed_events(
    client: Any, other: Any, receiver: tuple[str, list[tuple[dict[str, str], bytes]]]
) -> None:
    url, received = receiver
    hook = await run(client.webhooks.create(url, events=["session.created"]))
    assert isinstance(hook, ks.WebhookInfo) and hook.secret and hook.events == ["session.created"]
    try:
        listed = [w for w in await run(client.webhooks.list()) if w.id == hook.id]
        assert [(w.url, w.secret) for w in listed] == [(url, None)]
        assert hook.id not in [w.id for w in await run(other.webhooks.list())]
        with pytest.raises(ks.NotFoundError):
            await run(other.webhooks.deliveries(hook.id))

        sandbox = await run(client.sessions.create())
        await run(sandbox.delete())
        mine: list[tuple[dict[str, str], bytes]] = []
        for _ in range(100):  # delivered just after the create answered
            mine = [(h, b) for h, b in received if json.loads(b)["data"]["session_id"] == sandbox.id]
            if mine:
                break
            await asyncio.sleep(0.1)
        assert len(mine) == 1, "one event: the stop is not subscribed"
        headers, raw = mine[0]
        event = ks.verify_webhook(hook.secret, headers["koder-signature"], raw)
        assert event["type"] == "session.created" and headers["koder-event-id"] == event["id"]
        with pytest.raises(ks.WebhookSignatureError):
            ks.verify_webhook(hook.secret + "x", headers["koder-signature"], raw)

        delivered: list[ks.WebhookDelivery] = []
        for _ in range(100):  # recorded just after the receiver answered
            log = await run(client.webhooks.deliveries(hook.id))
            delivered = [d for d in log if d.event_id == event["id"]]
            if delivered and delivered[0].state == "delivered":
                break
            await asyncio.sleep(0.1)
        assert [(d.state, d.attempts, d.last_status) for d in delivered] == [("delivered", 1, 204)]
        with pytest.raises(ks.InvalidArgumentError):
            await run(client.webhooks.create(url, events=["no.such.event"]))
    finally:
        await run(client.webhooks.delete(hook.id))
    with pytest.raises(ks.NotFoundError):
        await run(client.webhooks.delete(hook.id))


# The example of docs/API-ADDITIONS.md "Webhooks".
SIGNED = "t=1,v1=3dd49b2593d0f9a349e9e71c4bde3e2b862c2be4003fe9b4ba81332029310158"


def test_verify_webhook_takes_only_the_secret_s_fresh_signature() -> None:
    assert ks.verify_webhook("k", SIGNED, b"{}", now=1) == {}
    edge = 1 + ks.WEBHOOK_TOLERANCE_S
    assert ks.verify_webhook("k", f"v1=00,{SIGNED},v2=x", b"{}", now=edge) == {}
    for secret, signature, body, now in [
        ("K", SIGNED, b"{}", 1),  # another secret
        ("k", SIGNED, b"{ }", 1),  # an altered body
        ("k", SIGNED, b"{}", edge + 1),  # too old
        ("k", SIGNED, b"{}", 1 - ks.WEBHOOK_TOLERANCE_S - 1),  # from the future
        ("k", SIGNED.replace("t=1", "t=2"), b"{}", 2),  # another time
        ("k", SIGNED.split(",")[1], b"{}", 1),  # no time
        ("k", "t=1", b"{}", 1),  # no signature
        ("k", "", b"{}", 1),
        ("k", "t=one,v1=zz", b"{}", 1),
        ("k", "t=1,v1=\u00e9", b"{}", 1),  # not ASCII
        ("k", "t=\u0661,v1=" + SIGNED.split("v1=")[1], b"{}", 1),  # a digit, not ASCII
    ]:
        with pytest.raises(ks.WebhookSignatureError):
            ks.verify_webhook(secret, signature, body, now=now)
