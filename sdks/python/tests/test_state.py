"""Snapshots (take, list, get, delete, create from, restore), volumes and images."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

import koder_sandbox as ks

from ._helpers import run, unique


async def test_snapshot_create_from_and_restore(client: Any, other: Any, fresh: Any) -> None:
    await run(fresh.files.write("state.txt", "v1"))
    name = unique("snap")
    snap = await run(fresh.snapshot(name))
    assert isinstance(snap, ks.SnapshotInfo) and snap.name == name and snap.session_id == fresh.id
    try:
        assert snap.snapshot_id in [s.snapshot_id for s in await run(client.snapshots.list())]
        assert (await run(client.snapshots.get(snap.snapshot_id))).name == name
        with pytest.raises(ks.NotFoundError):
            await run(other.snapshots.get(snap.snapshot_id))
        copy = await run(client.sessions.create(from_snapshot=snap.snapshot_id))
        try:
            assert await run(copy.files.read_text("state.txt")) == "v1"
        finally:
            await run(copy.delete())
        await run(fresh.files.write("state.txt", "v2"))
        restored = await run(fresh.restore(snap.snapshot_id))
        assert restored.id == fresh.id and restored.state == "running"
        assert await run(fresh.files.read_text("state.txt")) == "v1"
    finally:
        await run(client.snapshots.delete(snap.snapshot_id))
    with pytest.raises(ks.NotFoundError):
        await run(client.snapshots.get(snap.snapshot_id))
    with pytest.raises(ks.NotFoundError):
        await run(client.sessions.create(from_snapshot=snap.snapshot_id))


async def test_snapshot_bad_name(sb: Any) -> None:
    with pytest.raises(ks.InvalidArgumentError):
        await run(sb.snapshot("no spaces allowed"))


async def test_volumes_files_and_mounts(client: Any, other: Any) -> None:
    name = unique("vol")
    vol = await run(client.volumes.create(name, 32))
    assert isinstance(vol, ks.VolumeInfo) and vol.name == name and vol.size_mib == 32
    try:
        assert (await run(client.volumes.get(name))).volume_id == vol.volume_id
        assert (await run(client.volumes.get(vol.volume_id))).name == name
        assert name in [v.name for v in await run(client.volumes.list())]
        with pytest.raises(ks.NotFoundError):
            await run(other.volumes.get(name))
        files = client.volumes.files(name)
        made = await run(files.mkdir("/data/deep", parents=True))
        assert made.type == "dir" and made.uid == 1000
        entry = await run(files.write("/data/deep/a.txt", "on the volume", mode=0o600))
        assert entry.size == 13 and entry.mode & 0o777 == 0o600
        with pytest.raises(ks.ConflictError):
            await run(files.write("/data/deep/a.txt", "again", overwrite=False))
        assert await run(files.read_text("/data/deep/a.txt")) == "on the volume"
        async_or_sync = await run(files.download("/data/deep/a.txt"))
        data = await run(async_or_sync.read())
        assert data == b"on the volume"
        assert [e.name for e in await run(files.list("/data"))] == ["deep"]
        st = await run(files.set_metadata("/data/deep/a.txt", uid=0, gid=0, mode=0o644))
        assert (st.uid, st.gid, st.mode & 0o777) == (0, 0, 0o644)
        assert (await run(files.stat("/data/deep/a.txt"))).uid == 0
        s = await run(
            client.sessions.create(volumes=[ks.VolumeMount(name=name, path="/mnt/vol")])
        )
        try:
            assert s.info.volumes[0].path == "/mnt/vol" and s.info.volumes[0].name == name
            out = await run(s.exec(["cat", "/mnt/vol/data/deep/a.txt"]))
            assert out.stdout == "on the volume"
            mounts = (await run(client.volumes.get(name))).mounts
            assert [m.session_id for m in mounts] == [s.id]
            with pytest.raises(ks.VolumeBusyError) as e:
                await run(client.volumes.delete(name))
            assert e.value.status == 409 and e.value.code == "SANDBOX-VOLUME-BUSY"
        finally:
            await run(s.delete())
        await run(files.remove("/data"))
        with pytest.raises(ks.NotFoundError):
            await run(files.stat("/data"))
    finally:
        with contextlib.suppress(ks.NotFoundError):
            await run(client.volumes.delete(name))
    with pytest.raises(ks.NotFoundError):
        await run(client.volumes.get(name))


async def test_volume_copy(client: Any) -> None:
    src, dst = unique("src"), unique("dst")
    await run(client.volumes.create(src, 16))
    try:
        await run(client.volumes.files(src).write("/f", "copied"))
        copy = await run(client.volumes.create(dst, from_volume=src))
        assert copy.size_mib == 16
        assert await run(client.volumes.files(dst).read_text("/f")) == "copied"
    finally:
        for v in (src, dst):
            with contextlib.suppress(ks.NotFoundError):
                await run(client.volumes.delete(v))


async def test_images(client: Any, admin: Any) -> None:
    images = await run(client.images.list())
    assert images[0].name == "host" and images[0].kind == "host", images
    host = await run(client.images.get("host"))
    assert isinstance(host, ks.ImageInfo) and host.languages, host
    assert {lang.name for lang in host.languages} >= {"python", "bash"}, host.languages
    with pytest.raises(ks.NotFoundError) as e:
        await run(client.images.get("ruby"))
    assert e.value.code == "SANDBOX-IMAGE-NOT-FOUND"
    with pytest.raises(ks.InvalidArgumentError):
        await run(client.images.get("../etc"))
    with pytest.raises(ks.PermissionDeniedError):
        await run(client.images.delete("host"))
    with pytest.raises(ks.InvalidArgumentError):
        await run(admin.images.delete("host"))
