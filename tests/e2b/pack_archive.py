"""Packs a root tree (a language pack of the test cache) as a `docker save` archive, so a test
daemon imports it as an image (`ksandbox image import`): the image an E2B template's
`fromImage` names, registries being unreachable. Usage: pack_archive.py ROOT OUT.tar"""

import hashlib
import io
import json
import sys
import tarfile
import tempfile


def layer_of(root, out):
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as t:
        t.add(root, arcname=".", recursive=True)


def main(root, path):
    with tempfile.TemporaryFile() as layer:
        layer_of(root, layer)
        layer.seek(0)
        digest = hashlib.sha256()
        for chunk in iter(lambda: layer.read(1 << 20), b""):
            digest.update(chunk)
        diff_id = "sha256:" + digest.hexdigest()
        config = json.dumps({
            "architecture": "amd64", "os": "linux",
            "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }).encode()
        manifest = json.dumps([{"Config": "config.json", "RepoTags": [], "Layers": ["layer.tar"]}]).encode()
        with tarfile.open(path, "w") as outer:
            for name, data in [("config.json", config), ("manifest.json", manifest)]:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                outer.addfile(info, io.BytesIO(data))
            layer.seek(0, io.SEEK_END)
            info = tarfile.TarInfo("layer.tar")
            info.size = layer.tell()
            layer.seek(0)
            outer.addfile(info, layer)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
