"""E2B template builds (`Template.build`) against koder-sandbox: steps (RUN, COPY, ENV, WORKDIR,
USER) built in jails, the files-by-hash upload, start and ready commands, the step cache, tags,
`Sandbox.create(template)`, failures, tenancy and hostile uploads. Run by
scripts/e2b-template-tests.sh, whose daemon runs the `base` template on the Debian bash pack
(imported as the image `e2b-base`); skipped by the plain E2B suite."""

import io
import os
import tarfile
import time
import uuid

import httpx
import pytest
from e2b import BuildException, PtySize, Sandbox, Template, wait_for_file

from conftest import API_KEY, API_URL, OTHER_KEY

pytestmark = pytest.mark.skipif(
    os.environ.get("KODER_E2B_TEMPLATES") != "1",
    reason="needs a daemon with a base image (scripts/e2b-template-tests.sh)",
)


def name(prefix="tpl"):
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def build(template, template_name, **kw):
    logs = []
    Template.build(template, template_name, cpu_count=1, memory_mb=512,
                   on_build_logs=lambda e: logs.append(e.message), **kw)
    return logs


@pytest.fixture
def context(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "main.sh").write_text("echo from main\n")
    (tmp_path / "app" / "sub").mkdir()
    (tmp_path / "app" / "sub" / "data.txt").write_text("data\n")
    os.symlink("main.sh", tmp_path / "app" / "link.sh")
    (tmp_path / "single.txt").write_text("single\n")
    return tmp_path


def test_a_template_builds_caches_and_runs_sessions(context):
    # Owners and modes hold in the build's later steps and in the template's sessions alike.
    t = (
        Template(file_context_path=str(context))
        .from_base_image()
        .set_envs({"GREETING": "hello", "MODE": "dev"})
        .copy("app", "/opt/app")
        .copy("single.txt", "/opt/single/", mode=0o644, user="root")
        .set_workdir("/opt/work")
        .run_cmd('echo "$GREETING from $(whoami) in $PWD" > built.txt')
        .run_cmd('test "$(stat -c %U /opt/app/main.sh)" = user')
        .run_cmd('test "$(stat -c %a:%U /opt/single/single.txt)" = 644:root', user="root")
        .set_start_cmd("sleep 1; echo up > /tmp/started", wait_for_file("/tmp/started"))
    )
    n = name()
    logs = build(t, n)
    assert any("step 3/" in line for line in logs), logs

    with Sandbox.create(n) as sb:
        assert sb.get_info().template_id == n
        run = lambda cmd: sb.commands.run(cmd, user="root").stdout  # noqa: E731
        assert run("cat /opt/app/main.sh /opt/app/sub/data.txt") == "echo from main\ndata\n"
        assert run("readlink /opt/app/link.sh") == "main.sh\n"
        assert run("cat /opt/single/single.txt") == "single\n"
        assert run("cat /opt/work/built.txt") == "hello from user in /opt/work\n"
        assert run("stat -c %U /opt/app/main.sh /opt/work/built.txt") == "user\nuser\n"
        assert run("stat -c %a:%U /opt/single/single.txt") == "644:root\n"
        # What `user` made in a step is `user`'s to change in the session.
        r = sb.commands.run("echo more >> /opt/work/built.txt && tail -1 /opt/work/built.txt")
        assert r.stdout == "more\n"
        assert run("echo $GREETING-$MODE") == "hello-dev\n"
        assert run("cat /tmp/started") == "up\n", "the start command ran before the hand-out"

    again = build(t, n)
    assert sum(line.endswith(": cached") for line in again) == 6, again


def test_tags_aliases_and_delete():
    base = name("tags")
    build(Template().from_base_image().run_cmd("echo v1 > /tmp/x"), f"{base}:v1")
    assert Template.exists(base)
    info = Template.assign_tags(f"{base}:v1", ["production", "stable"])
    assert set(info.tags) == {"production", "stable"}
    tags = {t.tag for t in Template.get_tags(base)}
    assert tags == {"v1", "production", "stable"}
    with pytest.raises(Exception):
        Template.assign_tags(f"{base}:v1", ":bad")
    with pytest.raises(Exception):
        Template.assign_tags(f"{base}:nope", "x")

    sb = Sandbox.create(f"{base}:production")
    sb.kill()
    Template.remove_tags(base, "production")
    assert {t.tag for t in Template.get_tags(base)} == {"v1", "stable"}
    with pytest.raises(Exception):
        Sandbox.create(f"{base}:production")

    # The template of one tenant is unknown to another.
    other = httpx.get(f"{API_URL}/templates/aliases/{base}", headers={"X-API-KEY": OTHER_KEY})
    assert other.status_code == 404
    api = {"X-API-KEY": API_KEY}
    created = httpx.post(f"{API_URL}/v2/sandboxes", json={"templateID": f"{base}:v1"},
                         headers={"X-API-KEY": OTHER_KEY})
    assert created.status_code in (400, 404), created.text

    assert httpx.delete(f"{API_URL}/templates/{base}", headers=api).status_code == 204
    assert not Template.exists(base)


def test_template_on_a_template_and_on_an_image():
    first = name("first")
    build(Template().from_image("e2b-base").run_cmd("echo first > /home/user/first.txt"), first)
    second = name("second")
    build(Template().from_template(first).run_cmd("cat first.txt > second.txt"), second)
    with Sandbox.create(second) as sb:
        assert sb.commands.run("cat /home/user/second.txt").stdout == "first\n"


def test_steps_as_user_use_sudo_as_e2b_templates_do():
    # E2B templates run steps as `user` and install with `sudo apt-get ...`; here sudo is the
    # sandbox agent's, in the build's sandboxes and in the template's.
    t = name("sudo")
    build(Template().from_base_image()
          .run_cmd("sudo mkdir /srv/tool && sudo chown user /srv/tool && whoami > /srv/tool/by")
          .run_cmd("sudo sh -c 'echo root-made > /etc/made-by-sudo'"), t)
    with Sandbox.create(t) as sb:
        r = sb.commands.run("cat /srv/tool/by /etc/made-by-sudo; stat -c %U /etc/made-by-sudo; sudo id -un")
        assert r.stdout == "user\nroot-made\nroot\nroot\n"


def test_accounts_a_step_adds_and_their_files_are_there_in_sessions():
    # A Dockerfile's `RUN useradd` and `USER app`, as E2B templates run them.
    t = name("accounts")
    build(Template().from_base_image()
          .run_cmd("useradd -m -s /bin/bash app", user="root")
          .run_cmd("cd /home/app && echo secret > notes && chmod 600 notes && whoami > by",
                   user="app"), t)
    with Sandbox.create(t) as sb:
        r = sb.commands.run("id -un app; stat -c %U:%a /home/app/notes; sudo -u app cat /home/app/notes "
                            "/home/app/by; cat /home/app/notes 2>&1 | grep -c 'Permission denied'")
        assert r.stdout == "app\napp:600\nsecret\napp\n1\n"
        r = sb.commands.run("sudo su - app -c 'echo changed > notes && cat notes'")
        assert r.stdout == "changed\n"
        # The SDK's `user` names any account of the sandbox, as envd resolves it.
        r = sb.commands.run("id -un; echo $HOME $USER; cat notes", user="app", cwd="~")
        assert r.stdout == "app\n/home/app app\nchanged\n"
        sb.files.write("mine.txt", "app's", user="app")
        r = sb.commands.run("stat -c %U:%G /home/app/mine.txt")
        assert r.stdout == "app:app\n"
        sb.commands.run("sudo useradd -m later")
        assert sb.commands.run("whoami", user="later").stdout == "later\n"
        for ghost in ["ghost", "no such"]:
            with pytest.raises(Exception) as e:
                sb.commands.run("whoami", user=ghost)
            assert f"invalid username: '{ghost}'" in str(e.value), str(e.value)
            with pytest.raises(Exception) as e:
                sb.files.write("x.txt", "x", user=ghost)
            assert f"invalid username: '{ghost}'" in str(e.value), str(e.value)


def test_the_templates_last_user_and_workdir_are_its_sandboxes_defaults():
    # E2B persists a template's last USER and WORKDIR to its sandboxes: commands, files and
    # the start command act as that user there unless they name another.
    # USER makes an account the image lacks, as E2B's does.
    t = name("defaults")
    build(Template().from_base_image()
          .set_user("app")
          .run_cmd("whoami > ~/made-by; echo $HOME >> ~/made-by")
          .set_workdir("/srv/work")
          .set_start_cmd("whoami > /tmp/started-by; pwd >> /tmp/started-by",
                         wait_for_file("/tmp/started-by")), t)
    with Sandbox.create(t) as sb:
        assert sb.commands.run("whoami; pwd; echo $HOME").stdout == "app\n/srv/work\n/home/app\n"
        assert sb.files.read("/tmp/started-by") == "app\n/srv/work\n"
        assert sb.files.read("/home/app/made-by") == "app\n/home/app\n"
        sb.files.write("rel.txt", "relative to the user's home")
        assert sb.commands.run("stat -c %U /home/app/rel.txt").stdout == "app\n"
        r = sb.commands.run("whoami; pwd", user="user")
        assert r.stdout == "user\n/srv/work\n"
        assert sb.commands.run("whoami", user="root").stdout == "root\n"
        term = sb.pty.create(size=PtySize(rows=24, cols=80))
        out = []
        sb.pty.send_stdin(term.pid, b"whoami; pwd; exit\n")
        term.wait(on_pty=lambda d: out.append(d))
        text = b"".join(out).decode()
        assert "app\r\n/srv/work\r\n" in text, text
    # Without a WORKDIR, steps and sandboxes work in the user's home (E2B's docs' example).
    guest = name("guest")
    logs = build(Template().from_base_image().set_user("guest").run_cmd("whoami; pwd"), guest)
    assert "/home/guest" in "\n".join(logs), logs
    with Sandbox.create(guest) as sb:
        assert sb.commands.run("whoami; pwd").stdout == "guest\n/home/guest\n"
    # A template on it inherits them; a plain one keeps E2B's `user` in /home/user.
    child = name("child")
    build(Template().from_template(t).run_cmd("whoami > by"), child)
    with Sandbox.create(child) as sb:
        assert sb.commands.run("cat by; whoami").stdout == "app\napp\n"
    with Sandbox.create() as sb:
        assert sb.commands.run("whoami; pwd").stdout == "user\n/home/user\n"


def test_failing_steps_say_which_and_leave_no_template():
    n = name("fails")
    t = Template().from_base_image().run_cmd("echo ok").run_cmd("echo broken >&2; exit 3")
    with pytest.raises(BuildException) as e:
        build(t, n)
    assert "exited with 3" in str(e.value) and "broken" in str(e.value), str(e.value)
    assert not Template.exists(n)

    t = Template().from_base_image().skip_cache().run_cmd("whoami", user="root123")
    with pytest.raises(BuildException) as e:
        build(t, name("nouser"))
    assert ("failed to run command 'whoami': command failed: unauthenticated: "
            "invalid username: 'root123'") in str(e.value)

    with pytest.raises(BuildException) as e:
        build(Template().from_image("alpine:3.20").run_cmd("true"), name("registry"))
    assert "registry" in str(e.value)


def tar_of(entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for info, data in entries:
            t.addfile(info, io.BytesIO(data) if data else None)
    return buf.getvalue()


def file_entry(path, data=b"x"):
    info = tarfile.TarInfo(path)
    info.size = len(data)
    return info, data


def test_uploads_are_signed_and_hostile_archives_refused():
    api = {"X-API-KEY": API_KEY}
    n = name("upload")
    digest = uuid.uuid4().hex * 2
    link = httpx.get(f"{API_URL}/templates/{n}/files/{digest}", headers=api)
    assert link.status_code == 201, link.text
    assert link.json()["present"] is False
    url = link.json()["url"]
    assert url.startswith(API_URL)

    device = tarfile.TarInfo("dev/null")
    device.type = tarfile.CHRTYPE
    symlink = tarfile.TarInfo("esc")
    symlink.type = tarfile.SYMTYPE
    symlink.linkname = "/etc"
    for bad in [[file_entry("../escape")], [file_entry("/etc/passwd")], [(device, None)],
                [(symlink, None), file_entry("esc/passwd")]]:
        r = httpx.put(url, content=tar_of(bad))
        assert r.status_code == 400, r.text
        assert r.json()["message"].startswith("SANDBOX-IMAGE-FORBIDDEN-ENTRY"), r.text
    r = httpx.put(url, content=b"not an archive" * 100)
    assert r.status_code == 400 and "SANDBOX-IMAGE-INVALID-ARCHIVE" in r.text, r.text
    assert httpx.get(f"{API_URL}/templates/{n}/files/{digest}", headers=api).json()["present"] is False

    forged = url.replace("signature=", "signature=0")
    assert httpx.put(forged, content=tar_of([file_entry("ok")])).status_code == 401
    assert httpx.put(url, content=tar_of([file_entry("ok")])).status_code == 200
    assert httpx.get(f"{API_URL}/templates/{n}/files/{digest}", headers=api).json()["present"] is True
    # Another tenant's view of the same hash is its own.
    other = httpx.get(f"{API_URL}/templates/{n}/files/{digest}", headers={"X-API-KEY": OTHER_KEY})
    assert other.json()["present"] is False


def test_malformed_requests_get_e2b_errors():
    api = {"X-API-KEY": API_KEY}
    r = httpx.post(f"{API_URL}/v3/templates", json={"name": "Bad Name"}, headers=api)
    assert r.status_code == 400 and r.json()["code"] == 400
    r = httpx.post(f"{API_URL}/v3/templates", json={"name": "base"}, headers=api)
    assert r.status_code == 400
    r = httpx.post(f"{API_URL}/v3/templates", json={"name": name()}, headers=api)
    assert r.status_code == 202
    template, build_id = r.json()["templateID"], r.json()["buildID"]
    status = httpx.get(f"{API_URL}/templates/{template}/builds/{build_id}/status", headers=api)
    assert status.json()["status"] == "waiting"
    start = f"{API_URL}/v2/templates/{template}/builds/{build_id}"
    r = httpx.post(start, json={"fromImage": "e2b-base", "steps": [{"type": "ADD", "args": ["a", "b"]}]},
                   headers=api)
    assert r.status_code == 400 and "unsupported step type" in r.json()["message"]
    r = httpx.post(start, json={"fromImage": "e2b-base", "steps": []}, headers=api)
    assert r.status_code == 409, "a refused build is not started again"
    assert httpx.get(f"{API_URL}/templates/{template}/builds/{build_id}/status",
                     headers={"X-API-KEY": OTHER_KEY}).status_code == 404


def test_builds_started_in_the_background_say_building_even_while_queued():
    # Builds run one at a time here; the second waits in the queue, and still reads
    # "building" from its start on, as in E2B ("waiting" is a build not started yet).
    t = Template().from_base_image().skip_cache().run_cmd("sleep 2")
    infos = [Template.build_in_background(t, name("bg")) for _ in range(2)]
    for info in infos:
        assert Template.get_build_status(info).status.value == "building"
    for info in infos:
        deadline = time.monotonic() + 120
        while Template.get_build_status(info).status.value == "building":
            assert time.monotonic() < deadline, "the build never ended"
            time.sleep(0.2)
        assert Template.get_build_status(info).status.value == "ready"
