"""Volumes through the real E2B SDK: the team volume API, the volume content API with the
volume's own token, and `volume_mounts` on create (what a sandbox writes, the API reads back,
and the other way round)."""

import uuid

import pytest
from e2b import Sandbox, Volume
from e2b.exceptions import NotFoundException, VolumeException

from conftest import OTHER_KEY


@pytest.fixture
def volume():
    vol = Volume.create(f"v-{uuid.uuid4().hex[:12]}")
    yield vol
    Volume.destroy(vol.volume_id)


def test_volume_lifecycle_and_tenancy(volume):
    info = Volume.get_info(volume.volume_id)
    assert (info.volume_id, info.name) == (volume.volume_id, volume.name)
    assert info.token
    assert volume.volume_id in {v.volume_id for v in Volume.list()}
    # Another tenant sees no such volume.
    with pytest.raises(NotFoundException):
        Volume.get_info(volume.volume_id, api_key=OTHER_KEY)
    assert Volume.destroy("no-such-volume") is False


def test_content_api_round_trips(volume):
    volume.make_dir("/nested/deep", force=True)
    volume.write_file("/nested/deep/a.txt", "hello", uid=1000, gid=1000, mode=0o640)
    assert volume.read_file("/nested/deep/a.txt") == "hello"
    entry = volume.get_info("/nested/deep/a.txt")
    assert (entry.type.value, entry.uid, entry.gid, entry.mode, entry.size) == ("file", 1000, 1000, 0o640, 5)
    with pytest.raises(VolumeException):
        volume.write_file("/nested/deep/a.txt", "again", force=False)
    volume.write_file("/nested/deep/a.txt", "replaced", force=True)
    assert volume.read_file("/nested/deep/a.txt", format="bytes") == b"replaced"
    updated = volume.update_metadata("/nested/deep/a.txt", mode=0o600)
    assert updated.mode == 0o600
    names = {e.name for e in volume.list("/nested", depth=2)}
    assert names == {"deep", "a.txt"}
    volume.remove("/nested")
    assert volume.exists("/nested") is False


def test_a_wrong_token_is_refused(volume):
    forged = Volume.connect(volume.volume_id)
    forged._token = "0" * 64
    with pytest.raises(Exception):
        forged.read_file("/anything")


def test_sandboxes_share_a_mounted_volume(volume, fresh):
    volume.write_file("/from-api.txt", "api\n")
    sb = fresh(volume_mounts={"/mnt/vol": volume})
    out = sb.commands.run("cat /mnt/vol/from-api.txt && echo sandbox > /mnt/vol/from-sb.txt && stat -c %u /mnt/vol/from-sb.txt")
    assert out.stdout.split() == ["api", "1000"]
    assert volume.read_file("/from-sb.txt") == "sandbox\n"
    # One writer at a time.
    with pytest.raises(Exception):
        Sandbox.create(volume_mounts={"/v": volume.name})
    sb.kill()
    again = fresh(volume_mounts={"/data": volume.name})
    assert again.commands.run("cat /data/from-sb.txt").stdout == "sandbox\n"
