"""pty: create, input, resize, kill, as the default user."""

import threading
import time

import pytest
from e2b import CommandExitException
from e2b.sandbox.commands.command_handle import PtySize


class Screen:
    """Collects a terminal's output on a thread so input can be sent meanwhile."""

    def __init__(self, handle):
        self.handle, self.data, self.result, self.error = handle, bytearray(), None, None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.result = self.handle.wait(on_pty=self.data.extend)
        except Exception as e:  # the test inspects it
            self.error = e

    def wait_for(self, text, timeout=10):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text.encode() in self.data:
                return True
            time.sleep(0.05)
        raise AssertionError(f"{text!r} never appeared in {bytes(self.data)!r}")


def test_pty_input_resize_and_exit(sandbox):
    h = sandbox.pty.create(PtySize(rows=24, cols=80))
    assert h.pid > 1
    screen = Screen(h)
    assert h.pid in {p.pid for p in sandbox.commands.list()}
    sandbox.pty.send_stdin(h.pid, b"echo sum=$((6*7)) user=$(id -un) tty=$(test -t 0 && echo yes)\n")
    screen.wait_for("sum=42 user=user tty=yes")
    sandbox.pty.send_stdin(h.pid, b"stty size\n")
    screen.wait_for("24 80")
    sandbox.pty.resize(h.pid, PtySize(rows=30, cols=100))
    sandbox.pty.send_stdin(h.pid, b"stty size\n")
    screen.wait_for("30 100")
    sandbox.pty.send_stdin(h.pid, b"echo $TERM; exit 5\n")
    screen.thread.join(10)
    assert b"xterm-256color" in screen.data
    assert b"\x1b]7771;" not in screen.data, "the pid report is not part of the output"
    assert screen.error is not None and getattr(screen.error, "exit_code", None) == 5


def test_sudo_in_a_pty_is_a_root_shell_with_job_control(sandbox):
    h = sandbox.pty.create(PtySize(rows=24, cols=80))
    screen = Screen(h)
    sandbox.pty.send_stdin(h.pid, b"sudo -i\n")
    sandbox.pty.send_stdin(h.pid, b"echo root=$(id -u) jobs=${-//[^m]/}; stty size\n")
    screen.wait_for("root=0 jobs=m")
    screen.wait_for("24 80")
    # The window follows the session's, and ^C reaches the root shell's foreground command.
    sandbox.pty.resize(h.pid, PtySize(rows=33, cols=90))
    sandbox.pty.send_stdin(h.pid, b"sleep 30\n")
    time.sleep(0.5)
    sandbox.pty.send_stdin(h.pid, b"\x03")
    sandbox.pty.send_stdin(h.pid, b"echo after=$?; stty size; exit\n")
    screen.wait_for("after=130")
    screen.wait_for("33 90")
    sandbox.pty.send_stdin(h.pid, b"stty -a | grep -o ' icanon' | tr i I; exit 3\n")
    screen.wait_for(" Icanon")
    screen.thread.join(10)
    assert getattr(screen.error, "exit_code", None) == 3, screen.error


def test_pty_as_root_and_kill(sandbox):
    h = sandbox.pty.create(PtySize(rows=10, cols=40), user="root", cwd="/tmp",
                           envs={"MARK": "m1"})
    screen = Screen(h)
    sandbox.pty.send_stdin(h.pid, b"echo $(id -u):$(pwd):$MARK\n")
    screen.wait_for("0:/tmp:m1")
    # A process whose exit takes a while (200 MiB to unmap): the kill answers once it is gone,
    # so the next command cannot find it (E2B's own test_kill_pty checks with `kill -0`).
    sandbox.pty.send_stdin(
        h.pid,
        b"exec /usr/bin/python3 -c \"import time; b = b'x' * (200 << 20); "
        b"print('big' + 'ready', flush=True); time.sleep(100)\"\n",
    )
    screen.wait_for("bigready")
    assert sandbox.pty.kill(h.pid) is True
    assert h.pid not in [p.pid for p in sandbox.commands.list()]
    with pytest.raises(CommandExitException):
        sandbox.commands.run(f"kill -0 {h.pid}")
    screen.thread.join(10)
    assert getattr(screen.error, "exit_code", None) == -1
    assert sandbox.pty.kill(h.pid) is False
