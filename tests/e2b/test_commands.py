"""commands: foreground, background, stdin, stream_input, kill, connect, callbacks."""

import time

import pytest
from e2b import CommandExitException, NotFoundException, TimeoutException


def test_foreground_runs_as_user_in_home(sandbox):
    r = sandbox.commands.run('echo out; echo err >&2; id -un; echo "$HOME"; pwd')
    assert r.exit_code == 0
    assert r.stdout == "out\nuser\n/home/user\n/home/user\n"
    assert r.stderr == "err\n"
    assert r.error is None


def test_python_is_python3(sandbox):
    # The host image's shim: E2B's templates have `python`, Debian only `python3`.
    r = sandbox.commands.run("python -c 'import sys; print(sys.version_info[0])'")
    assert r.stdout == "3\n"


def test_user_has_passwordless_sudo(sandbox):
    # E2B's templates give `user` passwordless sudo; here the agent's sudo service does.
    r = sandbox.commands.run("sudo id -un; sudo -u user id -un; sudo whoami", envs={"FOO": "bar"})
    assert r.stdout == "root\nuser\nroot\n"
    # E2B's own test: a command's variables are not there for a later sudo.
    r = sandbox.commands.run('sudo echo "$FOO"')
    assert (r.exit_code, r.stdout) == (0, "\n")
    r = sandbox.commands.run("sudo apt-get --version >/dev/null && sudo touch /root/x && sudo ls /root")
    assert r.stdout == "x\n"
    # Scripts written for E2B's Debian templates become other accounts by `sudo su`.
    r = sandbox.commands.run("sudo su - user -c 'id -un; pwd'; sudo su -c 'id -un'")
    assert r.stdout == "user\n/home/user\nroot\n"


def test_root_cwd_and_envs(sandbox):
    r = sandbox.commands.run('id -u; pwd; echo "$GREETING"', user="root", cwd="/tmp",
                             envs={"GREETING": "hello there"})
    assert r.stdout == "0\n/tmp\nhello there\n"


def test_nonzero_exit_raises_with_output(sandbox):
    with pytest.raises(CommandExitException) as e:
        sandbox.commands.run("echo partial; echo bad >&2; exit 3")
    assert e.value.exit_code == 3
    assert e.value.stdout == "partial\n"
    assert e.value.stderr == "bad\n"
    assert e.value.error == "exit status 3"


def test_on_stdout_and_on_stderr_stream_in_order(sandbox):
    out, err = [], []
    sandbox.commands.run("for i in 1 2 3; do echo $i; echo e$i >&2; sleep 0.05; done",
                         on_stdout=out.append, on_stderr=err.append)
    assert "".join(out) == "1\n2\n3\n"
    assert "".join(err) == "e1\ne2\ne3\n"
    assert len(out) >= 2, "output arrives as it is produced, not in one piece"


def test_without_stdin_a_reader_sees_eof(sandbox):
    r = sandbox.commands.run("cat; echo done")
    assert r.stdout == "done\n"


def test_background_handle_list_and_wait(sandbox):
    h = sandbox.commands.run("sleep 0.5; echo bg", background=True)
    assert h.pid > 1
    listed = {p.pid: p for p in sandbox.commands.list()}
    assert h.pid in listed
    assert listed[h.pid].cmd == "/bin/bash"
    assert listed[h.pid].args == ["-l", "-c", "sleep 0.5; echo bg"]
    r = h.wait()
    assert (r.exit_code, r.stdout) == (0, "bg\n")
    assert h.pid not in {p.pid for p in sandbox.commands.list()}


def test_send_stdin_and_close_stdin(sandbox):
    h = sandbox.commands.run("cat; echo EOF", background=True, stdin=True)
    h.send_stdin("first\n")
    sandbox.commands.send_stdin(h.pid, b"second\n")
    h.close_stdin()
    r = h.wait()
    assert r.stdout == "first\nsecond\nEOF\n"


def test_stdin_of_a_process_that_exited_is_not_found(sandbox):
    # As envd: E2B's CLI (`sandbox exec` with piped input) closes stdin after the command may
    # have ended, and takes "not found" as "nothing left to close".
    h = sandbox.commands.run("true", background=True, stdin=True)
    assert h.wait().exit_code == 0
    with pytest.raises(NotFoundException):
        sandbox.commands.close_stdin(h.pid)
    with pytest.raises(NotFoundException):
        sandbox.commands.send_stdin(h.pid, "late\n")


def test_stream_input(sandbox):
    h = sandbox.commands.run("wc -c; cat /dev/null", background=True, stdin=True)
    sandbox.commands.stream_input(h.pid, ["ab", b"cd", "e\n"])
    sandbox.commands.close_stdin(h.pid)
    assert h.wait().stdout.strip() == "6"


def test_kill_then_kill_again(sandbox):
    h = sandbox.commands.run("sleep 30", background=True)
    assert sandbox.commands.kill(h.pid) is True
    # Gone when the kill answers, not some time later.
    assert h.pid not in {p.pid for p in sandbox.commands.list()}
    with pytest.raises(CommandExitException) as e:
        h.wait()
    assert e.value.exit_code == -1
    assert "killed" in (e.value.error or "")
    assert sandbox.commands.kill(h.pid) is False
    assert h.pid not in {p.pid for p in sandbox.commands.list()}


def test_disconnect_and_connect_sees_later_output(sandbox):
    h = sandbox.commands.run("echo early; sleep 1; echo late; exit 4", background=True)
    time.sleep(0.3)
    h.disconnect()
    again = sandbox.commands.connect(h.pid)
    assert again.pid == h.pid
    with pytest.raises(CommandExitException) as e:
        again.wait()
    assert e.value.exit_code == 4
    assert e.value.stdout == "late\n", "connect follows new output only, as envd does"


def test_connect_to_unknown_pid_fails(sandbox):
    with pytest.raises(Exception) as e:
        sandbox.commands.connect(999_999).wait()
    assert "not found" in str(e.value)


def test_timeout_kills_the_command(sandbox):
    started = time.monotonic()
    with pytest.raises((TimeoutException, CommandExitException)):
        sandbox.commands.run("sleep 20; echo never", timeout=1)
    assert time.monotonic() - started < 10
    time.sleep(0.5)
    assert not [p for p in sandbox.commands.list() if "sleep 20" in " ".join(p.args)]
