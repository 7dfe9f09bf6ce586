"""envd's Connect wire format seen raw: content types, envelopes, end-of-stream frames and
hostile framing against the real daemon."""

import json
import struct

from conftest import API_KEY, envd
from e2b import Sandbox

START = "/process.Process/Start"
STREAM = {"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}


def frames(body):
    out = []
    while body:
        flags, n = struct.unpack(">BI", body[:5])
        out.append((flags, json.loads(body[5:5 + n])))
        body = body[5 + n:]
    return out


def envelope(msg, flags=0):
    raw = json.dumps(msg).encode() if not isinstance(msg, bytes) else msg
    return struct.pack(">BI", flags, len(raw)) + raw


def test_server_stream_frames(sandbox):
    req = {"process": {"cmd": "/bin/echo", "args": ["hi"]}}
    with envd(sandbox) as c:
        r = c.post(START, content=envelope(req), headers=STREAM)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/connect+json"
    got = frames(r.content)
    assert got[0][1]["event"]["start"]["pid"] > 1
    assert {"event": {"data": {"stdout": "aGkK"}}} in [m for _, m in got]
    assert got[-2][1]["event"]["end"]["exitCode"] == 0
    assert got[-1] == (2, {})


def test_unary_json_and_errors(sandbox):
    with envd(sandbox) as c:
        r = c.post("/filesystem.Filesystem/Stat", json={"path": "/nope"})
        assert r.status_code == 404
        assert r.json()["code"] == "not_found"
        r = c.post("/process.Process/List", content=b"{}", headers={"Content-Type": "text/plain"})
        assert r.status_code == 415
        r = c.post("/process.Process/Frobnicate", json={})
        assert r.json()["code"] == "unimplemented"


def test_hostile_envelopes(sandbox):
    with envd(sandbox) as c:
        truncated = envelope({"process": {"cmd": "true"}})[:-3]
        r = c.post(START, content=truncated, headers=STREAM)
        assert r.status_code == 200
        [(flags, end)] = frames(r.content)
        assert flags == 2 and end["error"]["code"] == "invalid_argument"
        huge = struct.pack(">BI", 0, 0xFFFFFFF0) + b"{}"
        [(flags, end)] = frames(c.post(START, content=huge, headers=STREAM).content)
        assert end["error"]["code"] == "resource_exhausted"
        compressed = envelope({}, flags=1)
        [(flags, end)] = frames(c.post(START, content=compressed, headers=STREAM).content)
        assert end["error"]["code"] == "unimplemented"
        r = c.post(START, content=envelope({}), headers={"Content-Type": "application/json"})
        assert r.status_code == 415
        [(flags, end)] = frames(c.post(START, content=envelope(b"[1,"), headers=STREAM).content)
        assert end["error"]["code"] == "invalid_argument"


def test_unknown_sandbox_is_502_was_not_found(sandbox):
    # What the SDK meets: a sandbox that ended, asked with its own token.
    gone = Sandbox.create()
    gone.kill()
    with envd(gone) as c:
        r = c.get("/health")
    assert r.status_code == 502
    assert "was not found" in r.json()["message"]
    # With an API key, an unknown id answers the same.
    with envd(sandbox, token=False) as c:
        r = c.get("/health", headers={"E2b-Sandbox-Id": "0" * 32, "X-API-KEY": API_KEY})
    assert r.status_code == 502
    assert "was not found" in r.json()["message"]
    # Another sandbox's token is no credential for this one.
    with envd(sandbox) as c:
        r = c.get("/health", headers={"E2b-Sandbox-Id": "0" * 32})
    assert r.status_code == 401


def test_keepalives_while_a_process_is_quiet(sandbox):
    req = {"process": {"cmd": "/bin/sleep", "args": ["2.5"]}}
    headers = {**STREAM, "Keepalive-Ping-Interval": "1"}
    with envd(sandbox) as c:
        got = frames(c.post(START, content=envelope(req), headers=headers).content)
    kinds = [next(iter(m["event"])) for flags, m in got if flags == 0]
    assert kinds[0] == "start" and kinds[-1] == "end"
    assert kinds.count("keepalive") >= 2, kinds
    assert got[-1] == (2, {})


def test_client_streaming_input(sandbox):
    h = sandbox.commands.run("cat", background=True, stdin=True)
    body = envelope({"start": {"process": {"pid": h.pid}}})
    body += envelope({"data": {"input": {"stdin": "aGVsbG8K"}}}) + envelope({"keepalive": {}})
    with envd(sandbox) as c:
        r = c.post("/process.Process/StreamInput", content=body, headers=STREAM)
        assert r.status_code == 200
        assert frames(r.content) == [(0, {}), (2, {})]
        r = c.post("/process.Process/StreamInput", content=envelope({"data": {}}), headers=STREAM)
        assert frames(r.content)[0][1]["error"]["code"] == "invalid_argument"
    sandbox.commands.close_stdin(h.pid)
    assert h.wait().stdout == "hello\n"
