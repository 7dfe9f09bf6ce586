"""Files of a session: streaming upload and download, list, stat, remove, mkdir, move."""

from __future__ import annotations

import io
import os
from typing import Any, AsyncIterator, Iterator

import pytest

import koder_sandbox as ks

from ._helpers import entered, run, unique


async def test_write_and_read_forms(client: Any, sb: Any) -> None:
    d = "/workspace/" + unique("forms")
    entry = await run(sb.files.write(f"{d}/bytes.bin", b"\x00\x01\xff"))
    assert isinstance(entry, ks.FileEntry) and entry.size == 3 and entry.type == "file"
    assert await run(sb.files.read(f"{d}/bytes.bin")) == b"\x00\x01\xff"
    await run(sb.files.write(f"{d}/text.txt", "héllo"))
    assert await run(sb.files.read_text(f"{d}/text.txt")) == "héllo"
    await run(sb.files.write(f"{d}/file.bin", io.BytesIO(b"from a file object")))
    assert await run(sb.files.read(f"{d}/file.bin")) == b"from a file object"
    rel = unique("relative") + ".txt"
    await run(sb.files.write(rel, "below /workspace"))
    assert (await run(sb.exec(["cat", f"/workspace/{rel}"]))).stdout == "below /workspace"


def _chunks(blob: bytes, size: int) -> Iterator[bytes]:
    for i in range(0, len(blob), size):
        yield blob[i : i + size]


async def _achunks(blob: bytes, size: int) -> AsyncIterator[bytes]:
    for chunk in _chunks(blob, size):
        yield chunk


async def test_streaming_upload_and_download(client: Any, sb: Any) -> None:
    blob = os.urandom(3 * 1024 * 1024 + 17)
    path = "/workspace/" + unique("big") + ".bin"
    chunks = _chunks(blob, 256 * 1024) if isinstance(client, ks.Client) else _achunks(blob, 256 * 1024)
    entry = await run(sb.files.write(path, chunks))
    assert entry.size == len(blob)
    received = []
    async with entered(await run(sb.files.download(path))) as stream:
        if isinstance(stream, ks.ByteStream):
            received = list(stream.iter_bytes(64 * 1024))
        else:
            received = [c async for c in stream.iter_bytes(64 * 1024)]
    assert b"".join(received) == blob and len(received) > 1
    check = await run(sb.exec(shell=f"sha256sum {path} | cut -c1-64"))
    import hashlib

    assert check.stdout.strip() == hashlib.sha256(blob).hexdigest()


async def test_list_stat_mkdir_move_remove(sb: Any) -> None:
    d = "/workspace/" + unique("tree")
    made = await run(sb.files.mkdir(f"{d}/sub/deeper"))
    assert made.type == "dir" and made.path == f"{d}/sub/deeper"
    await run(sb.files.write(f"{d}/sub/a.txt", "a"))
    listing = await run(sb.files.list(d))
    assert isinstance(listing, ks.FileList) and [e.name for e in listing] == ["sub"]
    deep = await run(sb.files.list(d, depth=3))
    assert {e.path for e in deep} == {f"{d}/sub", f"{d}/sub/deeper", f"{d}/sub/a.txt"}
    st = await run(sb.files.stat(f"{d}/sub/a.txt"))
    assert (st.name, st.size, st.type, st.uid) == ("a.txt", 1, "file", 0)
    moved = await run(sb.files.move(f"{d}/sub/a.txt", f"{d}/b.txt"))
    assert moved.path == f"{d}/b.txt"
    with pytest.raises(ks.NotFoundError):
        await run(sb.files.stat(f"{d}/sub/a.txt"))
    with pytest.raises(ks.ConflictError):
        await run(sb.files.remove(f"{d}/sub"))
    await run(sb.files.remove(f"{d}/b.txt"))
    await run(sb.files.remove(d, recursive=True))
    with pytest.raises(ks.NotFoundError):
        await run(sb.files.list(d))


async def test_file_errors(sb: Any, other: Any) -> None:
    with pytest.raises(ks.NotFoundError) as e:
        await run(sb.files.read("/workspace/does-not-exist"))
    assert e.value.status == 404
    with pytest.raises(ks.NotFoundError):
        await run(sb.files.download("/workspace/does-not-exist"))
    with pytest.raises(ks.InvalidArgumentError):
        await run(sb.files.list("/workspace", depth=0))
    foreign = other.sessions.connect(sb.id)
    with pytest.raises(ks.NotFoundError):
        await run(foreign.files.read("/etc/hostname"))
    with pytest.raises(ks.NotFoundError):
        await run(foreign.files.write("/workspace/x", b"x"))


async def test_disk_quota(client: Any) -> None:
    s = await run(client.sessions.create(limits={"disk_mib": 64}))
    try:
        # Fill the disk from inside, then the upload hits ENOSPC at once; an upload far beyond
        # the daemon's per-stream window still gets its 507 (it once stalled).
        await run(s.exec(shell="dd if=/dev/zero of=/workspace/fill bs=1M count=100"))
        with pytest.raises(ks.QuotaExceededError) as e:
            await run(s.files.write("/workspace/more.bin", b"\1" * (16 * 1024 * 1024)))
        assert e.value.status == 507 and e.value.code == "SANDBOX-FS-QUOTA-EXCEEDED"
        with pytest.raises(ks.NotFoundError):
            await run(s.files.stat("/workspace/more.bin"))
    finally:
        await run(s.delete())
