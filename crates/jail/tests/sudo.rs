//! `sudo` in real jails: a sandbox account runs commands as root (or anyone) through the
//! agent's sudo service, with sudo's environment, exit statuses and signals, under the same
//! walls as any sandbox process; the command dies with the exec that ran it; hostile clients
//! of the service change nothing. `su` works for root as on Debian.

mod common;

use std::sync::Arc;

use common::*;
use koder_agent_protocol::{ExecOutput, ExecRequest};
use koder_runtime::Sandbox;

/// Runs `cmd` in bash as the sandbox's `user` (uid 1000).
async fn as_user(sb: &Arc<dyn Sandbox>, cmd: &str) -> ExecOutput {
    as_user_with(sb, cmd, 20_000).await
}

async fn as_user_with(sb: &Arc<dyn Sandbox>, cmd: &str, timeout_ms: u64) -> ExecOutput {
    let req = ExecRequest {
        uid: Some(1000),
        gid: Some(1000),
        timeout_ms: Some(timeout_ms),
        cwd: Some("/home/user".into()),
        ..shell(cmd)
    };
    sb.agent().exec_collect(req).await.expect("exec")
}

#[tokio::test]
async fn the_sandbox_user_runs_commands_as_root_with_sudos_environment() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("sudo-env");
    let sb = sandbox(&env).await;
    let out = as_user(
        &sb,
        "id -u; sudo id -u; sudo -u nobody id -un; sudo -g nogroup id -gn; \
         export FOO=bar; sudo printenv FOO || echo reset; sudo -E printenv FOO; \
         sudo --preserve-env=FOO printenv FOO; sudo BAZ=1 printenv BAZ; \
         sudo printenv HOME USER SUDO_USER SUDO_UID; sudo pwd; sudo -i pwd; sudo -D /tmp pwd; \
         sudo -s echo 'a b'; sudo -l | tail -1; sudo -v && echo validated",
    )
    .await;
    assert_eq!(
        text(&out.stdout),
        "1000\n0\nnobody\nnogroup\nreset\nbar\nbar\n1\n/root\nroot\nuser\n1000\n\
         /home/user\n/root\n/tmp\na b\n    (ALL : ALL) NOPASSWD: ALL\nvalidated\n",
        "stderr: {}",
        text(&out.stderr)
    );
    // E2B's own test: a variable of an earlier command is not there for a later sudo.
    let out = as_user(&sb, "sudo echo \"$FOO\"").await;
    assert_eq!(
        (out.exit.exit_code, text(&out.stdout)),
        (Some(0), "\n".into())
    );
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn sudo_passes_stdio_exit_statuses_and_signals_through() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("sudo-io");
    let sb = sandbox(&env).await;
    let out = as_user(
        &sb,
        "echo piped | sudo cat; sudo sh -c 'echo to-stderr >&2; exit 7'; echo status=$?; \
         sudo sh -c 'kill -TERM $$'; echo status=$?; \
         sudo no-such-command; echo status=$?; sudo -x; echo status=$?; \
         sudo -D /no-such-dir pwd; echo status=$?; \
         sudo sh -c 'trap \"echo got-int; exit 3\" INT; echo ready; touch /tmp/ready; sleep 10 & wait' & \
         until [ -e /tmp/ready ]; do sleep 0.05; done; kill -INT $!; wait $!; echo status=$?; \
         sudo touch /root/made && sudo stat -c %U /root/made; touch /root/nope 2>/dev/null || echo denied",
    )
    .await;
    assert_eq!(
        text(&out.stdout),
        "piped\nstatus=7\nstatus=143\nstatus=1\nstatus=1\nstatus=1\nready\ngot-int\nstatus=3\nroot\ndenied\n",
        "stderr: {}",
        text(&out.stderr)
    );
    let stderr = text(&out.stderr);
    assert!(stderr.contains("to-stderr"), "{stderr}");
    assert!(
        stderr.contains("sudo: no-such-command: command not found"),
        "{stderr}"
    );
    assert!(stderr.contains("sudo: invalid option -- 'x'"), "{stderr}");
    assert!(
        stderr.contains("sudo: unable to change directory to /no-such-dir: No such file"),
        "{stderr}"
    );
    sb.destroy().await.unwrap();
}

/// `su` and `runuser` (util-linux's, through PAM) let root become any account without a
/// password, as on Debian, so `sudo su user -c ...` works; an account without a password
/// cannot become another by `su`.
#[tokio::test]
async fn root_becomes_any_account_by_su_and_others_cannot() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("sudo-su");
    let sb = sandbox(&env).await;
    let out = as_user(
        &sb,
        "sudo su user -c 'id -un'; sudo su - user -c pwd; sudo su -c 'id -un'; \
         sudo runuser -u nobody -- id -un; su -c true root </dev/null; echo status=$?",
    )
    .await;
    assert_eq!(
        text(&out.stdout),
        "user\n/home/user\nroot\nnobody\nstatus=1\n",
        "stderr: {}",
        text(&out.stderr)
    );
    sb.destroy().await.unwrap();
}

/// A root command started by sudo is under the walls of every sandbox process: the same
/// bounding set and no_new_privs as root's own execs; and sudo itself shows the sandbox
/// nothing of the host.
#[tokio::test]
async fn sudo_commands_keep_the_sandbox_walls() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("sudo-walls");
    let sb = sandbox(&env).await;
    let probe = "grep -E '^(CapBnd|NoNewPrivs|Seccomp):' /proc/self/status";
    let as_root = run(&sb, probe).await;
    let via_sudo = as_user(&sb, &format!("sudo {probe}")).await;
    assert!(text(&as_root.stdout).contains("NoNewPrivs:\t1"));
    assert_eq!(text(&via_sudo.stdout), text(&as_root.stdout));
    // sudo is a file of the root's bottom layer: no mount of its own, no host path shown.
    let mounts = text(&run(&sb, "cat /proc/self/mountinfo").await.stdout);
    assert!(!mounts.contains("sudo"), "{mounts}");
    assert!(
        !mounts.contains(&*env.dir.path().to_string_lossy()),
        "{mounts}"
    );
    sb.destroy().await.unwrap();
}

/// The exec that ran sudo is killed (its timeout): the command sudo started, in a session of
/// its own, dies with it.
#[tokio::test]
async fn a_killed_exec_takes_its_sudo_command_along() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("sudo-kill");
    let sb = sandbox(&env).await;
    let out = as_user_with(
        &sb,
        "sudo sh -c 'echo $$ > /tmp/pid; exec sleep 300'",
        3_000,
    )
    .await;
    assert!(out.exit.timed_out, "{out:?}");
    // No pid file would make the check below pass without checking anything.
    let check = "test -s /tmp/pid || { echo no-pid; exit; }; \
                 for i in $(seq 100); do kill -0 $(cat /tmp/pid) 2>/dev/null || { echo gone; exit; }; sleep 0.1; done; echo alive";
    assert_eq!(text(&run(&sb, check).await.stdout), "gone\n");
    sb.destroy().await.unwrap();
}

/// Garbage, an oversized frame, a request without its descriptors or with too many, and
/// malformed requests: each is refused or dropped, and sudo works as before.
#[tokio::test]
async fn hostile_clients_of_the_sudo_service_change_nothing() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("sudo-hostile");
    let sb = sandbox(&env).await;
    let script = r#"
import json, os, socket, struct
NAME = "\0koder-sandbox/sudo"
def conn():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(NAME)
    s.settimeout(15)
    return s
def answer(s):
    try:
        return s.recv(8)
    except ConnectionResetError:
        return b""  # closed with the request unread
def frame(body):
    return struct.pack("<I", len(body)) + body
req = {"program": "id", "argv": ["id"], "env": [["PATH", "/usr/bin"]], "cwd": "/", "uid": 0, "gid": 0}
good = json.dumps(req).encode()
results = []
s = conn(); s.sendall(b"\xff" * 64); s.shutdown(socket.SHUT_WR); results.append(answer(s))
s = conn(); s.sendall(struct.pack("<I", 0xFFFFFFFF)); results.append(answer(s))
s = conn(); s.sendall(frame(good)); s.shutdown(socket.SHUT_WR); results.append(answer(s))
s = conn(); socket.send_fds(s, [frame(good)], [0, 1, 2, 0, 1, 2, 0, 1]); results.append(answer(s))
s = conn(); socket.send_fds(s, [frame(b"{not json")], [0, 1, 2]); results.append(answer(s))
bad = dict(req, argv=[])
s = conn(); socket.send_fds(s, [frame(json.dumps(bad).encode())], [0, 1, 2]); results.append(answer(s))
nul = dict(req, env=[["A=B", "x"]])
s = conn(); socket.send_fds(s, [frame(json.dumps(nul).encode())], [0, 1, 2]); results.append(answer(s))
for r in results:
    print(r.hex() or "closed")
"#;
    let out = as_user(
        &sb,
        &format!("/usr/bin/python3 - <<'EOF'\n{script}\nEOF\nsudo id -u"),
    )
    .await;
    let einval = format!("00000000{}", hex_le(22)); // EINVAL
    assert_eq!(
        text(&out.stdout),
        format!("closed\nclosed\nclosed\nclosed\nclosed\n{einval}\n{einval}\n0\n"),
        "stderr: {}",
        text(&out.stderr)
    );
    sb.destroy().await.unwrap();
}

fn hex_le(v: i32) -> String {
    v.to_le_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

/// At a terminal, the command gets a terminal of its own that it controls (sudo's use_pty):
/// an interactive shell there has job control, and the caller's terminal has its settings back
/// afterwards; without a terminal, the command has none either.
#[tokio::test]
async fn at_a_terminal_the_command_controls_a_terminal_of_its_own() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("sudo-tty");
    let sb = sandbox(&env).await;
    // `script` runs the lines at a terminal, as a PTY session would. At the end of its input
    // (/dev/null) it types an end-of-file character into the terminal, a NUL here, which the
    // terminal echoes as `^@` when it lands during the run: not the command's output.
    let out = as_user(
        &sb,
        "cat > /tmp/at-a-terminal <<'EOF'\n\
         sudo bash -ic 'case $- in *m*) echo job-control;; esac; tty'\n\
         stty -a | grep -q -- ' icanon' && echo settings-restored\n\
         EOF\n\
         script -qec 'bash /tmp/at-a-terminal' /dev/null \
         | tr -d '\\r' | sed 's/\\^@//g'; sudo tty",
    )
    .await;
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout:?} {}", text(&out.stderr));
    assert_eq!(lines[0], "job-control");
    assert!(lines[1].starts_with("/dev/pts/"), "{stdout:?}");
    assert_eq!(lines[2..], ["settings-restored", "not a tty"]);
    sb.destroy().await.unwrap();
}
