//! Security regressions (issue 14) against real jails: recovery from a fork bomb, descriptors
//! reaching sandbox processes, address families, the agent's place outside the workload's OOM
//! domain, and what the sandbox can learn about the host.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use koder_agent_protocol::{AgentClient, FromAgent, RunOutcome, ToAgent};
use koder_runtime::{Limits, Sandbox, SandboxSpec};

/// Generous bound for the sandbox to reach a state; never a performance assertion.
const SETTLE: Duration = Duration::from_secs(30);

/// One message, its one answer.
async fn ask(agent: &AgentClient, msg: ToAgent) -> FromAgent {
    let mut s = agent.open(msg).await.expect("open stream");
    let answer = s.recv().await.expect("answer");
    s.mark_finished();
    answer
}

async fn new_context(agent: &AgentClient, language: &str) -> String {
    let msg = ToAgent::ContextCreate {
        language: language.into(),
        cwd: None,
        env: Vec::new(),
        context_id: None,
    };
    match ask(agent, msg).await {
        FromAgent::Context(info) => info.context_id,
        other => panic!("create {language} context: {other:?}"),
    }
}

/// Runs `code` in a context: (stdout, outcome).
async fn run_in(agent: &AgentClient, context_id: &str, code: &str) -> (String, RunOutcome) {
    let mut s = agent
        .open(ToAgent::ContextRun {
            context_id: context_id.into(),
            code: code.into(),
            timeout_ms: Some(20_000),
            env: Vec::new(),
            trace: None,
            default_env: Vec::new(),
        })
        .await
        .expect("open run");
    let mut stdout = String::new();
    loop {
        match s.recv().await.expect("run event") {
            FromAgent::Stdout(d) => stdout.push_str(&text(&d)),
            FromAgent::Stderr(_) => {}
            FromAgent::RunDone(outcome) => {
                s.mark_finished();
                return (stdout, outcome);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_all_recovers_a_fork_bombed_sandbox() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("killall");
    let limits = Limits {
        pids: Some(48),
        ..Default::default()
    };
    let sb = sandbox_with(
        &env,
        SandboxSpec {
            limits,
            ..Default::default()
        },
    )
    .await;
    let ctx = new_context(sb.agent(), "python").await;
    let (_, first) = run_in(sb.agent(), &ctx, "x = 41").await;
    assert!(first.error.is_none(), "{first:?}");
    let started = run(
        &sb,
        "setsid bash -c 'f(){ f | f & }; f' </dev/null >/dev/null 2>&1 & echo started",
    )
    .await;
    assert_eq!(text(&started.stdout).trim(), "started");
    // Saturated: the workload's pids limit refuses forks (the agent, in its own leaf with
    // headroom, still answers).
    let deadline = Instant::now() + SETTLE;
    let res = sb.resources().expect("jail offers resource control");
    loop {
        if res.usage().await.expect("usage").pids_max_hits > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the fork bomb never saturated pids"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let killed = sb.agent().kill_all().await.expect("kill_all");
    assert!(killed >= 10, "only {killed} processes signalled");
    // Globbing forks nothing: what is left is the agent and this shell.
    let after = run(&sb, "set -- /proc/[0-9]*; echo alive $#").await;
    assert_eq!(
        text(&after.stdout).trim(),
        "alive 2",
        "{}",
        text(&after.stderr)
    );
    // The interpreter died with everything else and comes back, without its state.
    let (stdout, again) = run_in(sb.agent(), &ctx, "print('x' in globals())").await;
    assert!(again.restarted, "{again:?}");
    assert_eq!(stdout.trim(), "False");
    sb.destroy().await.unwrap();
}

/// Lists the process's own descriptors, then says whether any of them is a listening socket
/// it could accept an agent connection on.
const FD_PROBE: &str = r#"
import os, socket
fds = sorted(int(f) for f in os.listdir("/proc/self/fd"))
listening = []
for fd in fds:
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        continue
    if s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        listening.append(fd)
    s.close()
print("fds", fds)
print("listening", listening)
"#;

fn probe_cmd() -> String {
    format!("/usr/bin/python3 -c '{FD_PROBE}'")
}

/// The probe's answer: its fd list without the one `listdir` had open, and the listeners.
fn probe_result(stdout: &str) -> (String, String) {
    let line = |key: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in {stdout:?}"))
            .trim()
            .to_string()
    };
    (line("fds "), line("listening "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_processes_hold_only_their_own_descriptors() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("fds");
    let sb = sandbox(&env).await;
    // Exec: 0-2, plus 3 for the directory listdir holds while listing.
    let out = run(&sb, &probe_cmd()).await;
    let (fds, listening) = probe_result(&text(&out.stdout));
    assert_eq!(fds, "[0, 1, 2, 3]", "{}", text(&out.stderr));
    assert_eq!(listening, "[]");
    // A shell's children inherit nothing more either.
    let ls = run(&sb, "ls /proc/self/fd | tr '\\n' ' '").await;
    assert_eq!(text(&ls.stdout).trim(), "0 1 2 3");
    // Interpreter: it holds only what its driver and Python opened (no listener), and what
    // user code starts from it inherits nothing beyond stdio.
    let ctx = new_context(sb.agent(), "python").await;
    let (stdout, _) = run_in(sb.agent(), &ctx, FD_PROBE).await;
    let (_, listening) = probe_result(&stdout);
    assert_eq!(listening, "[]");
    let child = "import subprocess; print(subprocess.run(['/usr/bin/ls', '/proc/self/fd'], \
                 capture_output=True, close_fds=False, text=True).stdout.split())";
    let (stdout, _) = run_in(sb.agent(), &ctx, child).await;
    assert_eq!(stdout.trim(), "['0', '1', '2', '3']");
    sb.destroy().await.unwrap();
}

/// Address families outside the allowlist fail as if the kernel lacked them.
const FAMILY_PROBE: &str = r#"
import socket
def attempt(family, kind, proto=0):
    try:
        socket.socket(family, kind, proto).close()
        return "ok"
    except OSError as e:
        return str(e.errno)
print("vsock", attempt(socket.AF_VSOCK, socket.SOCK_STREAM))
print("packet", attempt(socket.AF_PACKET, socket.SOCK_DGRAM))
print("alg", attempt(socket.AF_ALG, socket.SOCK_SEQPACKET))
print("netlink-generic", attempt(socket.AF_NETLINK, socket.SOCK_RAW, 16))
print("netlink-route", attempt(socket.AF_NETLINK, socket.SOCK_RAW, 0))
print("inet", attempt(socket.AF_INET, socket.SOCK_STREAM))
print("inet6", attempt(socket.AF_INET6, socket.SOCK_DGRAM))
print("unix", attempt(socket.AF_UNIX, socket.SOCK_STREAM))
try:
    socket.socketpair(socket.AF_UNIX)
    print("pair ok")
except OSError as e:
    print("pair", e.errno)
"#;

/// What [`FAMILY_PROBE`] must print: EAFNOSUPPORT (97) for the refused families.
pub const FAMILY_VERDICTS: &[&str] = &[
    "vsock 97",
    "packet 97",
    "alg 97",
    "netlink-generic 97",
    "netlink-route ok",
    "inet ok",
    "inet6 ok",
    "unix ok",
    "pair ok",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_allowed_address_families_open() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("families");
    for egress in [false, true] {
        let sb = sandbox_with(
            &env,
            SandboxSpec {
                egress,
                ..Default::default()
            },
        )
        .await;
        let out = run(&sb, &format!("/usr/bin/python3 -c '{FAMILY_PROBE}'")).await;
        let stdout = text(&out.stdout);
        let got: Vec<&str> = stdout.lines().collect();
        assert_eq!(
            got,
            FAMILY_VERDICTS,
            "egress {egress}: {}",
            text(&out.stderr)
        );
        sb.destroy().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_command_line_carries_no_configuration() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("cmdline");
    let sb = sandbox(&env).await;
    let state = env.dir.path().display().to_string();
    let inside = run(&sb, "tr '\\0' ' ' </proc/1/cmdline").await;
    assert_eq!(text(&inside.stdout).trim(), "koder-agent init");
    let host =
        std::fs::read(format!("/proc/{}/cmdline", agent_pid(&env, &sb))).expect("host cmdline");
    let host = String::from_utf8_lossy(&host);
    assert!(!host.contains('{') && !host.contains(&state), "{host}");
    sb.destroy().await.unwrap();
}

/// The agent is cloned with every signal blocked (it shares the daemon's memory until its
/// exec, and no handler of the daemon's may run there): its exec restores an empty mask, or
/// it would never see the signals it handles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_starts_with_no_signal_blocked() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("sigmask");
    let sb = sandbox(&env).await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent_pid(&env, &sb)))
        .expect("agent status");
    let blocked = status.lines().find(|l| l.starts_with("SigBlk:"));
    assert_eq!(blocked, Some("SigBlk:\t0000000000000000"), "{status}");
    sb.destroy().await.unwrap();
}

/// The host pid of the sandbox's agent, as the jail records it.
fn agent_pid(env: &Env, sb: &Arc<dyn Sandbox>) -> i32 {
    std::fs::read_to_string(
        env.dir
            .path()
            .join("sandboxes")
            .join(sb.id())
            .join("agent.pid"),
    )
    .expect("agent pid")
    .trim()
    .parse()
    .expect("pid")
}
