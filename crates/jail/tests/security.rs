//! Security regressions (issue 14) against real jails: recovery from a fork bomb, descriptors
//! reaching sandbox processes, address families, the agent's place outside the workload's OOM
//! domain, and what the sandbox can learn about the host.

mod common;

use std::time::{Duration, Instant};

use common::*;
use koder_agent_protocol::{AgentClient, FromAgent, RunOutcome, ToAgent};
use koder_runtime::{Limits, Runtime, SandboxSpec};

/// Generous bound for the sandbox to reach a state; never a performance assertion.
const SETTLE: Duration = Duration::from_secs(30);

async fn sandbox_with(
    env: &Env,
    name: &str,
    limits: Limits,
) -> std::sync::Arc<dyn koder_runtime::Sandbox> {
    env.runtime
        .create(SandboxSpec {
            id: format!("{name}{}", std::process::id()),
            image: "host".into(),
            limits,
            ..Default::default()
        })
        .await
        .expect("create sandbox")
}

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
    let sb = sandbox_with(&env, "bomb", limits).await;
    let ctx = new_context(sb.agent(), "python").await;
    let (_, first) = run_in(sb.agent(), &ctx, "x = 41").await;
    assert!(first.error.is_none(), "{first:?}");
    let started = run(
        &sb,
        "setsid bash -c 'f(){ f | f & }; f' </dev/null >/dev/null 2>&1 & echo started",
    )
    .await;
    assert_eq!(text(&started.stdout).trim(), "started");
    // Saturated: the agent can no longer start anything.
    let deadline = Instant::now() + SETTLE;
    loop {
        if sb.agent().exec_collect(shell("true")).await.is_err() {
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
