//! The session manager's rules that need no root, against `koder_runtime_memory::MemoryRuntime`:
//! tenancy, limits against maxima, the concurrent-session quota, exec verdicts, expiry by the
//! reaper and a dying agent. Assertions are on the typed errors' stable codes.

use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, TimeZone, Utc};
use koder_api_types::{
    codes, CreateSession, ErrorCode, ExecRequest, Limits, Session, SessionState,
};
use koder_auth::Identity;
use koder_runtime::Usage;
use koder_runtime_memory::{MemoryRuntime, Scripted};
use koder_sessions::config::PlanConfig;
use koder_sessions::{Error, LaterStdin, Manager, SessionConfig};
use koder_store::{Store, Tenant};

/// Generous bound for anything the manager does in the background.
const WITHIN: StdDuration = StdDuration::from_secs(10);

struct Fixture {
    manager: Arc<Manager>,
    runtime: MemoryRuntime,
    now: Arc<Mutex<DateTime<Utc>>>,
}

fn tenant(id: &str, plan: &str, max_sessions: Option<u32>) -> Tenant {
    Tenant {
        id: id.into(),
        name: id.into(),
        plan: plan.into(),
        max_sessions,
        daily_session_minutes: None,
        created_at: Utc::now(),
    }
}

fn who(tenant: &str) -> Identity {
    Identity {
        tenant_id: tenant.into(),
    }
}

/// No warm pool (every sandbox the runtime holds belongs to a session).
fn config() -> SessionConfig {
    SessionConfig {
        pool: Default::default(),
        ..SessionConfig::default()
    }
}

async fn fixture_with(tenants: &[Tenant], cfg: SessionConfig, runtime: MemoryRuntime) -> Fixture {
    let store = Store::open_in_memory().await.unwrap();
    for t in tenants {
        store.upsert_tenant(t).await.unwrap();
    }
    let now = Arc::new(Mutex::new(
        Utc.with_ymd_and_hms(2026, 5, 1, 12, 0, 0).unwrap(),
    ));
    let clock_now = now.clone();
    let manager = Manager::start_with_clock(
        store,
        Arc::new(runtime.clone()),
        cfg,
        Arc::new(move || *clock_now.lock().unwrap()),
    )
    .await
    .unwrap();
    Fixture {
        manager,
        runtime,
        now,
    }
}

async fn fixture(tenants: &[Tenant]) -> Fixture {
    fixture_with(tenants, config(), MemoryRuntime::new()).await
}

/// Tenant `acme` (standard plan, no session cap) on `runtime`, with one session made.
async fn acme_session(runtime: MemoryRuntime) -> (Fixture, Identity, Session) {
    let f = fixture_with(&[tenant("acme", "standard", None)], config(), runtime).await;
    let acme = who("acme");
    let s = f
        .manager
        .create(&acme, CreateSession::default())
        .await
        .expect("create");
    (f, acme, s)
}

fn code_of<T>(r: Result<T, Error>) -> ErrorCode {
    match r {
        Ok(_) => panic!("expected an error, got Ok"),
        Err(e) => e.code(),
    }
}

fn shell(cmd: &str) -> ExecRequest {
    ExecRequest {
        shell: Some(cmd.into()),
        ..Default::default()
    }
}

fn cmd(argv: &[&str]) -> ExecRequest {
    ExecRequest {
        cmd: Some(argv.iter().map(|s| s.to_string()).collect()),
        ..Default::default()
    }
}

fn no_body() -> futures::stream::Empty<Result<bytes::Bytes, std::io::Error>> {
    futures::stream::empty()
}

/// The only live sandbox of the runtime (the fixtures keep no warm pool).
fn only_sandbox(rt: &MemoryRuntime) -> Arc<koder_runtime_memory::MemorySandbox> {
    let live = rt.live();
    assert_eq!(live.len(), 1, "expected exactly one live sandbox: {live:?}");
    rt.sandbox(&live[0]).unwrap()
}

#[tokio::test]
async fn another_tenants_session_is_indistinguishable_from_an_unknown_id() {
    let f = fixture(&[
        tenant("acme", "standard", None),
        tenant("evil", "standard", None),
    ])
    .await;
    let (acme, evil) = (who("acme"), who("evil"));
    let s = f
        .manager
        .create(&acme, CreateSession::default())
        .await
        .unwrap();
    let unknown = "0123456789abcdef0123456789abcdef";

    for id in [unknown, s.id.as_str()] {
        let m = &f.manager;
        assert_eq!(
            code_of(m.get(&evil, id).await),
            ErrorCode::NotFound,
            "get {id}"
        );
        assert_eq!(
            code_of(m.exec(&evil, id, shell("echo hi")).await),
            ErrorCode::NotFound,
            "exec {id}"
        );
        assert_eq!(
            code_of(m.list_files(&evil, id, "/workspace", 1).await),
            ErrorCode::NotFound,
            "list_files {id}"
        );
        assert_eq!(
            code_of(m.download(&evil, id, "/workspace/x").await),
            ErrorCode::NotFound,
            "download {id}"
        );
        assert_eq!(
            code_of(
                m.upload(&evil, id, "/workspace/x", Some(0), no_body(), None)
                    .await
            ),
            ErrorCode::NotFound,
            "upload {id}"
        );
        assert_eq!(
            code_of(m.kill_processes(&evil, id).await),
            ErrorCode::NotFound,
            "kill_processes {id}"
        );
        assert_eq!(
            code_of(m.destroy(&evil, id).await),
            ErrorCode::NotFound,
            "destroy {id}"
        );
    }
    assert!(f.manager.list(&evil).await.unwrap().is_empty());

    // None of that touched the owner's session.
    let got = f.manager.get(&acme, &s.id).await.unwrap();
    assert_eq!(got.state, SessionState::Running);
    assert_eq!(f.runtime.live().len(), 1);
    let out = f
        .manager
        .exec(&acme, &s.id, shell("echo hi"))
        .await
        .unwrap();
    assert_eq!(out.stdout, "hi\n");
}

#[tokio::test]
async fn limits_default_when_absent_and_are_refused_above_the_maxima() {
    let mut cfg = config();
    cfg.plans.insert(
        "small".into(),
        PlanConfig {
            max_limits: Limits {
                memory_mib: Some(1024),
                ..Default::default()
            },
        },
    );
    let defaults = cfg.default_limits;
    let max = cfg.max_limits;
    let f = fixture_with(
        &[
            tenant("acme", "standard", None),
            tenant("tiny", "small", None),
        ],
        cfg,
        MemoryRuntime::new(),
    )
    .await;
    let (acme, tiny) = (who("acme"), who("tiny"));

    // Absent: the server's defaults, on the session and in the sandbox's spec.
    let s = f
        .manager
        .create(&acme, CreateSession::default())
        .await
        .unwrap();
    assert_eq!(s.limits, defaults);
    let sb = only_sandbox(&f.runtime);
    assert_eq!(sb.spec().limits.memory_mib, defaults.memory_mib);
    assert_eq!(sb.spec().limits.pids, defaults.pids);
    assert_eq!(sb.spec().limits.cpu_millis, defaults.cpu_millis);
    assert_eq!(sb.spec().limits.disk_mib, defaults.disk_mib);
    let expires = s.expires_at - s.created_at;
    assert_eq!(expires, Duration::seconds(300), "default timeout_s");

    // Partly given: the rest defaulted.
    let s = f
        .manager
        .create(
            &acme,
            CreateSession {
                limits: Some(Limits {
                    memory_mib: Some(2048),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(s.limits.memory_mib, Some(2048));
    assert_eq!(s.limits.pids, defaults.pids);
    assert_eq!(s.limits.cpu_millis, defaults.cpu_millis);

    // Exactly at the server's maxima is allowed.
    f.manager
        .create(
            &acme,
            CreateSession {
                limits: Some(max),
                ..Default::default()
            },
        )
        .await
        .expect("at the maxima");

    let above = [
        Limits {
            memory_mib: Some(max.memory_mib.unwrap() + 1),
            ..Default::default()
        },
        Limits {
            cpu_millis: Some(max.cpu_millis.unwrap() + 1),
            ..Default::default()
        },
        Limits {
            pids: Some(max.pids.unwrap() + 1),
            ..Default::default()
        },
        Limits {
            disk_mib: Some(max.disk_mib.unwrap() + 1),
            ..Default::default()
        },
        Limits {
            memory_mib: Some(0),
            ..Default::default()
        },
    ];
    let live_before = f.runtime.live().len();
    for limits in above {
        let r = f
            .manager
            .create(
                &acme,
                CreateSession {
                    limits: Some(limits),
                    ..Default::default()
                },
            )
            .await;
        assert_eq!(code_of(r), ErrorCode::InvalidArgument, "{limits:?}");
    }
    for timeout_s in [0, 24 * 3600 + 1] {
        let r = f
            .manager
            .create(
                &acme,
                CreateSession {
                    timeout_s: Some(timeout_s),
                    ..Default::default()
                },
            )
            .await;
        assert_eq!(
            code_of(r),
            ErrorCode::InvalidArgument,
            "timeout_s {timeout_s}"
        );
    }
    assert_eq!(
        f.runtime.live().len(),
        live_before,
        "a refused create made a sandbox"
    );

    // The plan's tighter maxima: 2048 MiB is fine on the server but not for plan "small".
    let r = f
        .manager
        .create(
            &tiny,
            CreateSession {
                limits: Some(Limits {
                    memory_mib: Some(2048),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await;
    match r {
        Err(e) => {
            assert_eq!(e.code(), ErrorCode::InvalidArgument);
            assert!(e.to_string().contains("memory_mib"), "{e}");
        }
        Ok(s) => panic!("plan maxima ignored: {s:?}"),
    }
    let s = f
        .manager
        .create(
            &tiny,
            CreateSession {
                limits: Some(Limits {
                    memory_mib: Some(1024),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .expect("at the plan's maximum");
    assert_eq!(s.limits.memory_mib, Some(1024));
}

#[tokio::test]
async fn max_sessions_refuses_the_next_create_until_one_is_destroyed() {
    let f = fixture(&[
        tenant("acme", "standard", Some(2)),
        tenant("other", "standard", Some(1)),
    ])
    .await;
    let acme = who("acme");
    let a = f
        .manager
        .create(&acme, CreateSession::default())
        .await
        .unwrap();
    f.manager
        .create(&acme, CreateSession::default())
        .await
        .unwrap();
    let refused = f.manager.create(&acme, CreateSession::default()).await;
    assert_eq!(code_of(refused), ErrorCode::QuotaSessions);
    assert_eq!(f.runtime.live().len(), 2, "a refused create made a sandbox");

    // Per tenant: another tenant still has its own slot.
    f.manager
        .create(&who("other"), CreateSession::default())
        .await
        .expect("quotas are per tenant");

    f.manager.destroy(&acme, &a.id).await.unwrap();
    let gone = f.manager.get(&acme, &a.id).await.unwrap();
    assert_eq!(gone.state, SessionState::Stopped);
    assert_eq!(gone.end_reason.as_deref(), Some("deleted"));
    f.manager
        .create(&acme, CreateSession::default())
        .await
        .expect("a slot freed by destroy");
    let refused = f.manager.create(&acme, CreateSession::default()).await;
    assert_eq!(code_of(refused), ErrorCode::QuotaSessions);
}

#[tokio::test]
async fn a_failed_sandbox_create_gives_the_slot_back() {
    let f = fixture(&[tenant("acme", "standard", Some(1))]).await;
    let acme = who("acme");
    f.runtime
        .fail_next_create(koder_runtime::RuntimeError::Unavailable("no room".into()));
    let r = f.manager.create(&acme, CreateSession::default()).await;
    assert_eq!(code_of(r), ErrorCode::RuntimeUnavailable);
    f.manager
        .create(&acme, CreateSession::default())
        .await
        .expect("the failed create's slot was released");
}

/// `oom` dies of an OOM kill, `forkbomb` hits the pids limit and fails, `forkok` hits it but
/// exits 0; anything else is the double's builtins.
fn verdict_runtime() -> MemoryRuntime {
    MemoryRuntime::new().with_script(Arc::new(|req| match req.argv.first().map(String::as_str) {
        Some("oom") => Ok(Scripted {
            oom_kill: true,
            ..Scripted::default()
        }),
        Some("forkbomb") => Ok(Scripted {
            pids_limit_hit: true,
            ..Scripted::exit(1).stderr("fork: Resource temporarily unavailable\n")
        }),
        Some("forkok") => Ok(Scripted {
            pids_limit_hit: true,
            ..Scripted::exit(0)
        }),
        _ => Scripted::builtin(&req.argv, &req.stdin),
    }))
}

#[tokio::test]
async fn an_oom_kill_during_the_exec_is_the_oom_verdict() {
    let (f, acme, s) = acme_session(verdict_runtime()).await;

    let ok = f.manager.exec(&acme, &s.id, cmd(&["true"])).await.unwrap();
    assert_eq!(ok.verdict, None);
    assert_eq!(ok.exit_code, Some(0));

    let r = f.manager.exec(&acme, &s.id, cmd(&["oom"])).await.unwrap();
    assert_eq!(r.verdict.as_deref(), Some(codes::EXEC_KILLED_OOM));
    assert_eq!(r.signal, Some(9));
    assert_eq!(r.exit_code, None);

    // OOM kills counted before the exec are not this exec's: a normal exit has no verdict.
    let sb = only_sandbox(&f.runtime);
    sb.set_usage(Usage {
        oom_kills: 7,
        pids_max_hits: 7,
        ..Usage::default()
    });
    let r = f.manager.exec(&acme, &s.id, cmd(&["false"])).await.unwrap();
    assert_eq!(r.verdict, None, "stale counters made a verdict");
    assert_eq!(r.exit_code, Some(1));
    // The session survives an OOM kill of one exec.
    assert_eq!(
        f.manager.get(&acme, &s.id).await.unwrap().state,
        SessionState::Running
    );
}

#[tokio::test]
async fn a_pids_limit_hit_with_a_failed_exit_is_the_pids_verdict() {
    let (f, acme, s) = acme_session(verdict_runtime()).await;

    let r = f
        .manager
        .exec(&acme, &s.id, cmd(&["forkbomb"]))
        .await
        .unwrap();
    assert_eq!(r.verdict.as_deref(), Some(codes::EXEC_KILLED_PIDS));
    assert_eq!(r.exit_code, Some(1));

    // A refused fork the program survived (exit 0) is no verdict.
    let r = f
        .manager
        .exec(&acme, &s.id, cmd(&["forkok"]))
        .await
        .unwrap();
    assert_eq!(r.verdict, None);
    assert_eq!(r.exit_code, Some(0));
}

#[tokio::test]
async fn an_exec_past_its_timeout_is_the_timeout_verdict() {
    let (f, acme, s) = acme_session(MemoryRuntime::new()).await;

    let started = std::time::Instant::now();
    let r = f
        .manager
        .exec(
            &acme,
            &s.id,
            ExecRequest {
                timeout_ms: Some(100),
                ..shell("sleep 30")
            },
        )
        .await
        .unwrap();
    assert_eq!(r.verdict.as_deref(), Some(codes::EXEC_TIMEOUT));
    assert!(started.elapsed() < WITHIN, "the timeout did not end it");

    // Finishing inside its timeout: no verdict.
    let r = f
        .manager
        .exec(
            &acme,
            &s.id,
            ExecRequest {
                timeout_ms: Some(5_000),
                ..shell("sleep 0.01")
            },
        )
        .await
        .unwrap();
    assert_eq!(r.verdict, None);
    assert_eq!(r.exit_code, Some(0));

    // Out of range timeouts are refused before anything runs.
    for timeout_ms in [0, 3_600_001] {
        let r = f
            .manager
            .exec(
                &acme,
                &s.id,
                ExecRequest {
                    timeout_ms: Some(timeout_ms),
                    ..shell("true")
                },
            )
            .await;
        assert_eq!(
            code_of(r),
            ErrorCode::InvalidArgument,
            "timeout_ms {timeout_ms}"
        );
    }
}

#[tokio::test]
async fn the_reaper_stops_a_session_whose_timeout_passed() {
    let cfg = SessionConfig {
        reap_interval: StdDuration::from_millis(20),
        ..config()
    };
    let f = fixture_with(
        &[tenant("acme", "standard", Some(1))],
        cfg,
        MemoryRuntime::new(),
    )
    .await;
    let acme = who("acme");
    let s = f
        .manager
        .create(
            &acme,
            CreateSession {
                timeout_s: Some(60),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let sb = only_sandbox(&f.runtime);

    // Several reaper ticks before the deadline leave it running.
    tokio::time::sleep(StdDuration::from_millis(100)).await;
    assert_eq!(
        f.manager.get(&acme, &s.id).await.unwrap().state,
        SessionState::Running
    );
    assert!(!sb.is_destroyed());

    *f.now.lock().unwrap() += Duration::seconds(61);
    let stopped = tokio::time::timeout(WITHIN, async {
        loop {
            let got = f.manager.get(&acme, &s.id).await.unwrap();
            if got.state == SessionState::Stopped {
                return got;
            }
            tokio::time::sleep(StdDuration::from_millis(10)).await;
        }
    })
    .await
    .expect("the reaper did not stop the expired session");
    assert_eq!(stopped.end_reason.as_deref(), Some("expired"));
    assert!(sb.is_destroyed(), "the expired session's sandbox lives on");
    assert!(f.runtime.live().is_empty());
    assert_eq!(
        code_of(f.manager.exec(&acme, &s.id, shell("true")).await),
        ErrorCode::NotFound
    );
    f.manager
        .create(&acme, CreateSession::default())
        .await
        .expect("expiry freed the session slot");
}

#[tokio::test]
async fn a_dead_agent_stops_the_session_and_later_calls_are_session_stopped() {
    let f = fixture(&[
        tenant("acme", "standard", Some(1)),
        tenant("evil", "standard", None),
    ])
    .await;
    let acme = who("acme");
    let s = f
        .manager
        .create(&acme, CreateSession::default())
        .await
        .unwrap();
    let sb = only_sandbox(&f.runtime);
    sb.kill_agent();

    let stopped = tokio::time::timeout(WITHIN, async {
        loop {
            let got = f.manager.get(&acme, &s.id).await.unwrap();
            if got.state == SessionState::Stopped {
                return got;
            }
            tokio::time::sleep(StdDuration::from_millis(10)).await;
        }
    })
    .await
    .expect("the session outlived its agent");
    assert_eq!(stopped.end_reason.as_deref(), Some("agent exited"));
    assert!(
        sb.is_destroyed(),
        "the dead session's sandbox was not torn down"
    );

    let m = &f.manager;
    assert_eq!(
        code_of(m.exec(&acme, &s.id, shell("echo hi")).await),
        ErrorCode::SessionStopped
    );
    assert_eq!(
        code_of(m.list_files(&acme, &s.id, "/workspace", 1).await),
        ErrorCode::SessionStopped
    );
    assert_eq!(
        code_of(m.download(&acme, &s.id, "/workspace/x").await),
        ErrorCode::SessionStopped
    );
    assert_eq!(
        code_of(m.kill_processes(&acme, &s.id).await),
        ErrorCode::SessionStopped
    );
    match m.exec(&acme, &s.id, shell("true")).await {
        Err(e) => assert!(e.to_string().contains("agent exited"), "{e}"),
        Ok(r) => panic!("exec on a dead session: {r:?}"),
    }
    // Still invisible to another tenant.
    assert_eq!(
        code_of(m.exec(&who("evil"), &s.id, shell("true")).await),
        ErrorCode::NotFound
    );
    // The dead session's quota slot is free again.
    m.create(&acme, CreateSession::default())
        .await
        .expect("the dead session still holds its slot");
}

/// A runtime whose execs answer as builtins and record `field` of every agent request.
fn recording<T: Send + 'static>(
    field: fn(&koder_agent_protocol::ExecRequest) -> T,
) -> (MemoryRuntime, Arc<Mutex<Vec<T>>>) {
    let seen: Arc<Mutex<Vec<T>>> = Arc::default();
    let log = seen.clone();
    let runtime = MemoryRuntime::new().with_script(Arc::new(move |req| {
        log.lock().unwrap().push(field(req));
        Scripted::builtin(&req.argv, &req.stdin)
    }));
    (runtime, seen)
}

#[tokio::test]
async fn an_awaited_exec_asks_for_no_start_and_a_background_one_does() {
    let (runtime, quiet) = recording(|req| req.quiet);
    let (f, acme, s) = acme_session(runtime).await;
    let r = f.manager.exec(&acme, &s.id, cmd(&["true"])).await.unwrap();
    assert_eq!(r.exit_code, Some(0));
    f.manager
        .exec_background(&acme, &s.id, cmd(&["true"]), LaterStdin::Open)
        .await
        .unwrap();
    // Followers are handed the exec once it started: that one must be announced.
    assert_eq!(*quiet.lock().unwrap(), [true, false]);
}

#[tokio::test]
async fn a_background_exec_keeps_stdin_open_only_when_asked() {
    let (runtime, kept) = recording(|req| req.keep_stdin_open);
    let (f, acme, s) = acme_session(runtime).await;
    let m = &f.manager;
    let open = m
        .exec_background(&acme, &s.id, cmd(&["sleep", "30"]), LaterStdin::Open)
        .await
        .unwrap();
    let closed = m
        .exec_background(&acme, &s.id, cmd(&["sleep", "30"]), LaterStdin::Closed)
        .await
        .unwrap();
    assert_eq!(*kept.lock().unwrap(), [true, false]);
    let input = || bytes::Bytes::from_static(b"x\n");
    m.exec_stdin(&acme, &s.id, &open.exec_id, input(), false)
        .await
        .expect("an open stdin takes input");
    assert_eq!(
        code_of(
            m.exec_stdin(&acme, &s.id, &closed.exec_id, input(), false)
                .await
        ),
        ErrorCode::Conflict,
        "a closed stdin refuses input"
    );
    // An awaited exec's stdin is its request's bytes, never kept open.
    m.exec(&acme, &s.id, cmd(&["true"])).await.unwrap();
    assert_eq!(*kept.lock().unwrap(), [true, false, false]);
}

#[tokio::test]
async fn an_exited_exec_says_so_to_its_stdin_and_signals() {
    let (f, acme, s) = acme_session(MemoryRuntime::new()).await;
    let m = &f.manager;
    let done = m
        .exec_background(&acme, &s.id, cmd(&["true"]), LaterStdin::Open)
        .await
        .unwrap();
    let ended = tokio::time::timeout(WITHIN, async {
        while m
            .exec_status(&acme, &s.id, &done.exec_id)
            .await
            .unwrap()
            .result
            .is_none()
        {
            tokio::time::sleep(StdDuration::from_millis(5)).await;
        }
    })
    .await;
    assert!(ended.is_ok(), "the exec never ended");
    let input = bytes::Bytes::from_static(b"x\n");
    // Typed, not told by its message: E2B's envd turns exactly this into "process not found".
    for (what, got) in [
        (
            "stdin",
            m.exec_stdin(&acme, &s.id, &done.exec_id, input.clone(), false)
                .await,
        ),
        (
            "close",
            m.exec_stdin(&acme, &s.id, &done.exec_id, bytes::Bytes::new(), true)
                .await,
        ),
        (
            "signal",
            m.exec_signal(&acme, &s.id, &done.exec_id, "SIGTERM").await,
        ),
    ] {
        let err = got.expect_err(what);
        assert!(matches!(err, Error::ExecExited), "{what}: {err:?}");
        assert_eq!(err.code(), ErrorCode::Conflict, "{what}");
    }
}

#[tokio::test]
async fn a_session_s_events_are_logged_paged_and_outlive_it() {
    let tenants = [
        tenant("acme", "standard", None),
        tenant("evil", "standard", None),
    ];
    let f = fixture_with(&tenants, config(), verdict_runtime()).await;
    let acme = who("acme");
    let s = f
        .manager
        .create(&acme, CreateSession::default())
        .await
        .unwrap();
    let oom = f.manager.exec(&acme, &s.id, cmd(&["oom"])).await.unwrap();
    assert_eq!(oom.verdict.as_deref(), Some(codes::EXEC_KILLED_OOM));
    // A normal exit, whatever its status, is no event.
    f.manager.exec(&acme, &s.id, cmd(&["false"])).await.unwrap();
    f.manager.destroy(&acme, &s.id).await.unwrap();

    // The log is written behind the emitters' backs: wait for the stop to land.
    let log = tokio::time::timeout(WITHIN, async {
        loop {
            let log = f
                .manager
                .session_events(&acme, &s.id, 0, 500)
                .await
                .unwrap();
            if log.events.len() >= 3 {
                return log;
            }
            tokio::time::sleep(StdDuration::from_millis(10)).await;
        }
    })
    .await
    .expect("the session's events were not logged");
    let kinds: Vec<_> = log.events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds,
        ["session.created", "exec.verdict", "session.stopped"]
    );
    assert!(!log.more);
    let seqs: Vec<_> = log.events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 3]);
    assert!(log
        .events
        .iter()
        .all(|e| e.data["session_id"] == s.id.as_str()));
    assert_eq!(log.events[1].data["verdict"], codes::EXEC_KILLED_OOM);
    assert_eq!(log.events[2].data["cause"], "deleted");

    // Paging: after a number, at most a limit, and whether more follow.
    let page = f.manager.session_events(&acme, &s.id, 1, 1).await.unwrap();
    assert_eq!(page.events.len(), 1);
    assert_eq!(page.events[0].seq, 2);
    assert!(page.more);
    let rest = f.manager.session_events(&acme, &s.id, 3, 10).await.unwrap();
    assert!(rest.events.is_empty() && !rest.more);
    assert_eq!(
        code_of(f.manager.session_events(&acme, &s.id, 1 << 63, 10).await),
        ErrorCode::InvalidArgument
    );
    for limit in [0, 501] {
        assert_eq!(
            code_of(f.manager.session_events(&acme, &s.id, 0, limit).await),
            ErrorCode::InvalidArgument,
            "limit {limit}"
        );
    }

    // Another tenant's session's log is an unknown id's.
    assert_eq!(
        code_of(f.manager.session_events(&who("evil"), &s.id, 0, 10).await),
        ErrorCode::NotFound
    );
    assert_eq!(
        code_of(
            f.manager
                .session_events(&acme, "no-such-session", 0, 10)
                .await
        ),
        ErrorCode::NotFound
    );
}
