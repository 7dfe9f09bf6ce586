"""files: write (str, bytes, stream, gzip, several), read (text, bytes, stream), list with
depth, exists, get_info, make_dir, rename, remove, watch (sync and async)."""

import asyncio
import io
import time

import pytest
from e2b import AsyncSandbox, FileNotFoundException, FileType
from e2b.exceptions import InvalidArgumentException
from e2b.sandbox.filesystem.watch_handle import FilesystemEventType


def test_write_and_read_text_and_bytes(sandbox):
    info = sandbox.files.write("notes/hello.txt", "héllo\n")
    assert (info.name, info.path, info.type) == ("hello.txt", "/home/user/notes/hello.txt", FileType.FILE)
    assert sandbox.files.read("notes/hello.txt") == "héllo\n"
    blob = bytes(range(256)) * 100
    sandbox.files.write("/tmp/blob.bin", blob)
    assert sandbox.files.read("/tmp/blob.bin", format="bytes") == bytearray(blob)


def test_stream_write_and_stream_read(sandbox):
    data = b"0123456789" * 50_000
    sandbox.files.write("big.bin", io.BytesIO(data))
    got = b"".join(sandbox.files.read("big.bin", format="stream"))
    assert got == data


def test_gzip_both_ways(sandbox):
    text = "compress me " * 1000
    sandbox.files.write("z.txt", text, gzip=True)
    assert sandbox.files.read("z.txt", gzip=True) == text
    assert sandbox.commands.run("wc -c < z.txt").stdout.strip() == str(len(text))


def test_write_several_files_multipart(sandbox):
    infos = sandbox.files.write_files([
        {"path": "multi/a.txt", "data": "A"},
        {"path": "/tmp/multi-b.txt", "data": b"B"},
    ])
    assert [i.path for i in infos] == ["/home/user/multi/a.txt", "/tmp/multi-b.txt"]
    assert sandbox.commands.run("cat multi/a.txt /tmp/multi-b.txt").stdout == "AB"


def test_written_files_belong_to_the_user(sandbox):
    sandbox.files.write("owned/deep/file.txt", "x")
    r = sandbox.commands.run("stat -c %U owned owned/deep owned/deep/file.txt; echo more >> owned/deep/file.txt; cat owned/deep/file.txt")
    assert r.stdout == "user\nuser\nuser\nxmore\n"
    sandbox.files.write("/tmp/rootfile.txt", "r", user="root")
    assert sandbox.commands.run("stat -c %U /tmp/rootfile.txt").stdout == "root\n"


def test_list_with_depth_exists_and_info(sandbox):
    sandbox.files.write("tree/a/b/c.txt", "c")
    sandbox.files.write("tree/top.txt", "top")
    one = {e.path: e for e in sandbox.files.list("tree")}
    assert set(one) == {"/home/user/tree/a", "/home/user/tree/top.txt"}
    assert one["/home/user/tree/a"].type == FileType.DIR
    assert one["/home/user/tree/top.txt"].size == 3
    deep = {e.path for e in sandbox.files.list("tree", depth=3)}
    assert "/home/user/tree/a/b/c.txt" in deep and "/home/user/tree/a/b" in deep
    assert sandbox.files.exists("tree/a/b/c.txt") is True
    assert sandbox.files.exists("tree/nope") is False
    info = sandbox.files.get_info("tree/top.txt")
    assert (info.name, info.type, info.size, info.mode, info.permissions) == \
        ("top.txt", FileType.FILE, 3, 0o644, "-rw-r--r--")
    assert abs(info.modified_time.timestamp() - time.time()) < 120
    d = sandbox.files.get_info("tree")
    assert d.type == FileType.DIR and d.permissions.startswith("d")
    assert sandbox.files.get_info("/").type == FileType.DIR


def test_make_dir_rename_remove(sandbox):
    assert sandbox.files.make_dir("made/x/y") is True
    assert sandbox.files.make_dir("made/x/y") is False
    assert sandbox.commands.run("stat -c %U made/x/y; touch made/x/y/ok && echo ok").stdout == "user\nok\n"
    sandbox.files.write("made/x/y/f.txt", "f")
    moved = sandbox.files.rename("made/x/y/f.txt", "made/g.txt")
    assert moved.path == "/home/user/made/g.txt" and moved.type == FileType.FILE
    assert sandbox.files.read("made/g.txt") == "f"
    assert sandbox.files.exists("made/x/y/f.txt") is False
    sandbox.files.remove("made")
    assert sandbox.files.exists("made") is False


def test_missing_files_raise(sandbox):
    with pytest.raises(FileNotFoundException):
        sandbox.files.read("does/not/exist.txt")
    with pytest.raises(FileNotFoundException):
        sandbox.files.get_info("does/not/exist.txt")
    with pytest.raises(FileNotFoundException):
        sandbox.files.list("does/not")


def test_watch_sync(sandbox):
    sandbox.files.make_dir("watched")
    w = sandbox.files.watch_dir("watched", recursive=True)
    seen = []

    def until(done):
        deadline = time.monotonic() + 10
        while not done() and time.monotonic() < deadline:
            seen.extend((e.name, e.type) for e in w.get_new_events())
            time.sleep(0.1)
        assert done(), seen

    try:
        sandbox.files.write("watched/new.txt", "1")
        sandbox.commands.run("mkdir watched/sub")
        # A new directory is watched once its creation is seen (as with inotify in envd).
        until(lambda: ("sub", FilesystemEventType.CREATE) in seen)
        sandbox.commands.run("echo x > watched/sub/inner.txt && mv watched/new.txt watched/renamed.txt")
        until(lambda: ("renamed.txt", FilesystemEventType.CREATE) in seen
              and any(n == "sub/inner.txt" for n, _ in seen))
        # Events are debounced by the sandbox's watcher: a new file may show as created or
        # as written; the upload's temporary file never shows.
        assert {t for n, t in seen if n == "new.txt"} & {FilesystemEventType.CREATE, FilesystemEventType.WRITE}, seen
        assert not [n for n, _ in seen if n.startswith(".koder-upload")], seen
        assert ("new.txt", FilesystemEventType.RENAME) in seen, seen
    finally:
        w.stop()
    with pytest.raises(Exception):
        w.get_new_events()


async def test_watch_async(sandbox):
    sb = await AsyncSandbox.connect(sandbox.sandbox_id)
    await sb.files.make_dir("awatched")
    events = []
    got_it = asyncio.Event()

    def on_event(e):
        events.append((e.name, e.type))
        if e.name == "a.txt":
            got_it.set()

    handle = await sb.files.watch_dir("awatched", on_event=on_event)
    try:
        await sb.commands.run("echo data > awatched/a.txt")
        await asyncio.wait_for(got_it.wait(), 10)
        assert events[0] == ("a.txt", FilesystemEventType.CREATE), events
    finally:
        await handle.stop()


def test_watch_missing_dir_fails(sandbox):
    with pytest.raises(FileNotFoundException):
        sandbox.files.watch_dir("no/such/dir")


def test_a_poll_right_after_a_write_sees_it_with_its_entry(sandbox):
    sandbox.files.make_dir("polled")
    sandbox.files.write("polled/f.txt", "old")
    w = sandbox.files.watch_dir("polled", include_entry=True)
    try:
        sandbox.files.write("polled/f.txt", "new")
        # No sleep: the answer waits for the events of the write that already finished.
        events = w.get_new_events()
        assert [e.type for e in events if e.name == "f.txt"] == [
            FilesystemEventType.CREATE, FilesystemEventType.WRITE, FilesystemEventType.CHMOD,
        ], events
        entry = events[1].entry
        assert entry is not None and entry.path == "/home/user/polled/f.txt", events
        assert entry.type == FileType.FILE and entry.size == 3
        assert w.get_new_events() == []
    finally:
        w.stop()


def test_a_poll_waits_exactly_for_what_happened_before_it(sandbox):
    sandbox.files.make_dir("burst")
    w = sandbox.files.watch_dir("burst")
    try:
        # One command, many files: the poll after it has every one of them, in one answer.
        sandbox.commands.run("for i in $(seq 1 40); do echo $i > burst/f$i; done; mkdir burst/d")
        names = {e.name for e in w.get_new_events()}
        assert {f"f{i}" for i in range(1, 41)} | {"d"} <= names, names
        # Nothing happened since: the answer comes without a settling delay (the agent's
        # barrier, not a timer); the fastest of a few polls shows it even on a loaded host.
        fastest = min(_timed(w.get_new_events) for _ in range(5))
        assert fastest < 0.09, fastest
    finally:
        w.stop()


def test_a_burst_of_one_command_is_reported_in_order(sandbox):
    sandbox.files.make_dir("burst4")
    w = sandbox.files.watch_dir("burst4")
    try:
        sandbox.commands.run("cd burst4 && echo x > w; mkdir d; mv w w2; rm w2")
        events = [(e.type, e.name) for e in w.get_new_events()]
        # envd reports writes and mode changes of a new file as it sees them; every other
        # event is there once, in order, the rename as RENAME of the old name then CREATE.
        key = [ev for ev in events if ev[0] not in (
            FilesystemEventType.WRITE, FilesystemEventType.CHMOD)]
        assert key == [
            (FilesystemEventType.CREATE, "w"),
            (FilesystemEventType.CREATE, "d"),
            (FilesystemEventType.RENAME, "w"),
            (FilesystemEventType.CREATE, "w2"),
            (FilesystemEventType.REMOVE, "w2"),
        ], events
        assert w.get_new_events() == []
    finally:
        w.stop()


def _timed(f):
    start = time.monotonic()
    assert f() == []
    return time.monotonic() - start


def test_file_metadata_bounds_are_the_servers_too(sandbox):
    # Within what the SDK checks itself, beyond what a file may hold: refused, nothing written.
    with pytest.raises(InvalidArgumentException):
        sandbox.files.write("meta-big.txt", "x", metadata={"k": "v" * 4096})
    with pytest.raises(InvalidArgumentException):
        sandbox.files.write("meta-big.txt", "x", metadata={"k" * 247: "v"})
    assert sandbox.files.exists("meta-big.txt") is False
    info = sandbox.files.write("meta-ok.txt", "x", metadata={"k" * 246: "v"})
    assert info.metadata == {"k" * 246: "v"}
    # A sandbox process's own xattrs outside user.e2b. are not metadata.
    sandbox.commands.run(
        "/usr/bin/python3 -c \"import os; os.setxattr('meta-ok.txt', 'user.other', b'x')\""
    )
    assert sandbox.files.get_info("meta-ok.txt").metadata == {"k" * 246: "v"}


def test_signed_urls_need_no_header(fresh):
    import urllib.error
    import urllib.request

    sb = fresh(secure=True)
    sb.files.write("signed.txt", "signed content")
    with urllib.request.urlopen(sb.download_url("signed.txt", "user", 60)) as resp:
        assert resp.read() == b"signed content"
    # Uploading through a signed URL, then reading it back.
    req = urllib.request.Request(sb.upload_url("up.txt", "user"), data=b"uploaded",
                                 headers={"Content-Type": "application/octet-stream"}, method="POST")
    with urllib.request.urlopen(req) as resp:
        assert resp.status == 200
    assert sb.files.read("up.txt") == "uploaded"
    # A read signature is no write signature; an expired or tampered one is refused.
    read_url = sb.download_url("up.txt", "user")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(read_url, data=b"x", method="POST"))
    assert e.value.code == 401
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(sb.download_url("signed.txt", "user", use_signature_expiration=-60))
    assert e.value.code == 401
    assert e.value.read() == b'{"code":401,"message":"signature is already expired"}'
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(read_url.replace("signature=v1_", "signature=v1_A"))
    assert e.value.code == 401
