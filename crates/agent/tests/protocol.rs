//! The agent server driven in-process over an in-memory pipe: protocol behaviour and hostile
//! input (broken frames, stale streams, bad requests, floods). No namespaces needed: the agent's
//! file root is a temp dir and execs run on the host.

mod common;

use std::time::Duration;

use common::{agent, connect, rt};
use koder_agent::serve::server::{serve_connection, MAX_STREAMS};
use koder_agent_protocol::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Harness {
    root: tempfile::TempDir,
    client: AgentClient,
}

fn harness() -> Harness {
    let root = tempfile::tempdir().unwrap();
    let client = connect(agent(root.path(), &[]));
    Harness { root, client }
}

fn exec(argv: &[&str]) -> ExecRequest {
    ExecRequest {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        output_limit_bytes: 1 << 20,
        ..Default::default()
    }
}

fn code(r: Result<impl std::fmt::Debug, ClientError>) -> ErrorCode {
    match r {
        Err(ClientError::Agent(e)) => e.code,
        other => panic!("expected an agent error, got {other:?}"),
    }
}

#[test]
fn health_reports_protocol_version() {
    let h = harness();
    let info = rt().block_on(h.client.health()).unwrap();
    assert_eq!(info.protocol_version, PROTOCOL_VERSION);
}

/// Sends raw bytes on a fresh connection and checks the server hangs up.
fn server_hangs_up_on(bytes: Vec<u8>) {
    let root = tempfile::tempdir().unwrap();
    let agent = agent(root.path(), &[]);
    rt().block_on(async move {
        let (mut ours, theirs) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(serve_connection(agent, theirs));
        ours.write_all(&bytes).await.unwrap();
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(2), ours.read(&mut buf))
            .await
            .expect("server kept a broken connection open")
            .unwrap();
        assert_eq!(n, 0, "server answered garbage");
        tokio::time::timeout(Duration::from_secs(2), server)
            .await
            .expect("connection task did not finish")
            .expect("connection task panicked");
    });
}

#[test]
fn oversized_frame_length_closes_the_connection() {
    let mut bytes = u32::MAX.to_be_bytes().to_vec();
    bytes.extend_from_slice(&[0u8; 32]);
    server_hangs_up_on(bytes);
}

#[test]
fn undecodable_frame_closes_the_connection() {
    let mut bytes = 5u32.to_be_bytes().to_vec();
    bytes.extend_from_slice(&[0x01, 0xff, 0xff, 0xff, 0xff]);
    server_hangs_up_on(bytes);
}

#[test]
fn stale_follow_ups_are_ignored_and_the_connection_lives_on() {
    let h = harness();
    rt().block_on(async {
        for msg in [
            ToAgent::Stdin(b"x".to_vec()),
            ToAgent::FileEnd,
            ToAgent::Cancel,
            ToAgent::Signal(9),
        ] {
            let s = h.client.open(msg).await.unwrap();
            drop(s);
        }
        assert!(h.client.health().await.is_ok());
    });
}

#[test]
fn bad_exec_requests_get_typed_errors() {
    let h = harness();
    rt().block_on(async {
        for req in [
            exec(&[]),
            exec(&[""]),
            exec(&["echo", "nul\0byte"]),
            ExecRequest {
                env: vec![("A=B".into(), "x".into())],
                ..exec(&["true"])
            },
            ExecRequest {
                env: vec![("".into(), "x".into())],
                ..exec(&["true"])
            },
        ] {
            assert_eq!(
                code(h.client.exec_collect(req).await),
                ErrorCode::InvalidRequest
            );
        }
        assert_eq!(
            code(h.client.exec_collect(exec(&["/no/such/binary"])).await),
            ErrorCode::SpawnFailed
        );
    });
}

/// A traced exec's process gets the context as `TRACEPARENT` (an explicit one in the request
/// wins), and the exit carries what the agent timed: the wall time covers the process's sleep.
#[test]
fn a_traced_exec_passes_traceparent_and_reports_its_timing() {
    let h = harness();
    let trace = TraceContext {
        trace_id: [0xab; 16],
        span_id: [0x12; 8],
        sampled: true,
    };
    rt().block_on(async {
        let traced = ExecRequest {
            trace: Some(trace),
            ..exec(&["/bin/sh", "-c", "sleep 0.2; printf %s \"$TRACEPARENT\""])
        };
        let out = h.client.exec_collect(traced.clone()).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), trace.traceparent());
        let t = out.exit.timing;
        // The agent's run clock starts once the spawn returns, when the child may already be
        // a little into its sleep: most of the 0.2 s, not all of it.
        assert!(t.run_us >= 150_000, "{t:?}");
        assert!(t.spawn_us < t.run_us && t.since_exit_us < t.run_us, "{t:?}");

        let own = ExecRequest {
            env: vec![("TRACEPARENT".into(), "mine".into())],
            ..traced.clone()
        };
        let out = h.client.exec_collect(own).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "mine");

        let untraced = ExecRequest {
            trace: None,
            ..traced
        };
        let out = h.client.exec_collect(untraced).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    });
}

/// Every message of one exec, up to and including its `Exited`.
async fn exec_events(client: &AgentClient, req: ExecRequest) -> Vec<FromAgent> {
    let mut s = client.exec(req).await.unwrap();
    let mut events = Vec::new();
    loop {
        let m = s.recv().await.unwrap();
        let done = matches!(m, FromAgent::Exited(_));
        events.push(m);
        if done {
            return events;
        }
    }
}

fn exit_of(events: &[FromAgent]) -> &ExitInfo {
    match events.last() {
        Some(FromAgent::Exited(exit)) => exit,
        other => panic!("no exit last: {other:?}"),
    }
}

#[test]
fn exec_streams_start_output_then_exit() {
    let h = harness();
    rt().block_on(async {
        let req = exec(&["/bin/sh", "-c", "echo out; echo err >&2; exit 3"]);
        let events = exec_events(&h.client, req).await;
        let FromAgent::Started { pid } = events[0] else {
            panic!("no start first: {events:?}");
        };
        assert!(events.contains(&FromAgent::Stdout(b"out\n".to_vec())));
        assert!(events.contains(&FromAgent::Stderr(b"err\n".to_vec())));
        assert_eq!(exit_of(&events).exit_code, Some(3));
        assert_eq!(exit_of(&events).pid, Some(pid));
    });
}

#[test]
fn a_quiet_exec_announces_no_start_and_names_its_pid_at_the_exit() {
    let h = harness();
    rt().block_on(async {
        let req = ExecRequest {
            quiet: true,
            ..exec(&["/bin/sh", "-c", "echo $$; exit 4"])
        };
        let events = exec_events(&h.client, req).await;
        assert!(
            !events
                .iter()
                .any(|m| matches!(m, FromAgent::Started { .. })),
            "{events:?}"
        );
        let exit = exit_of(&events);
        assert_eq!(exit.exit_code, Some(4));
        let said = format!("{}\n", exit.pid.expect("the exit names the pid"));
        assert_eq!(events[0], FromAgent::Stdout(said.into_bytes()));
    });
}

#[test]
fn signals_and_stdin_reach_a_running_exec() {
    let h = harness();
    rt().block_on(async {
        let mut s = h
            .client
            .exec(ExecRequest {
                keep_stdin_open: true,
                ..exec(&["/bin/sh", "-c", "read line; echo got $line; sleep 30"])
            })
            .await
            .unwrap();
        assert!(matches!(s.recv().await.unwrap(), FromAgent::Started { .. }));
        s.send(ToAgent::Stdin(b"hello\n".to_vec())).await.unwrap();
        assert_eq!(
            s.recv().await.unwrap(),
            FromAgent::Stdout(b"got hello\n".to_vec())
        );
        s.send(ToAgent::Signal(libc::SIGTERM)).await.unwrap();
        let FromAgent::Exited(exit) = s.recv().await.unwrap() else {
            panic!("no exit")
        };
        assert_eq!(exit.signal, Some(libc::SIGTERM));
    });
}

#[test]
fn dropping_an_exec_stream_kills_the_process() {
    let h = harness();
    rt().block_on(async {
        let mut s = h.client.exec(exec(&["sleep", "30"])).await.unwrap();
        let FromAgent::Started { pid } = s.recv().await.unwrap() else {
            panic!("not started")
        };
        assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
        drop(s);
        for _ in 0..100 {
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("process {pid} survived its cancelled exec");
    });
}

/// A connection that ends without a word (a microVM's save, a daemon gone) kills its execs,
/// but a detached one, which runs on with its output read and dropped: it neither blocks on
/// nor dies of a pipe nobody reads.
#[test]
fn a_lost_connection_kills_its_execs_but_detached_ones() {
    let root = tempfile::tempdir().unwrap();
    let agent = agent(root.path(), &[]);
    rt().block_on(async {
        // client ⇄ relay ⇄ server, so the connection can be cut with no message on it.
        let (client_end, relay_a) = tokio::io::duplex(1 << 16);
        let (relay_b, server_end) = tokio::io::duplex(1 << 16);
        tokio::spawn(serve_connection(agent, server_end));
        let relay = tokio::spawn(async move {
            let (mut a, mut b) = (relay_a, relay_b);
            let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
        });
        let (r, w) = tokio::io::split(client_end);
        let client = AgentClient::new(r, w);
        // Both write far more than the pipes hold once nobody reads them, counting each
        // write that got through.
        let count = root.path().join("count");
        let chatty = format!(
            "while :; do head -c 65536 /dev/zero || exit 1; echo x >> {}; sleep 0.01; done",
            count.display()
        );
        let mut pids = Vec::new();
        let mut streams = Vec::new();
        for detached in [false, true] {
            let mut s = client
                .exec(ExecRequest {
                    detached,
                    ..exec(&["sh", "-c", &chatty])
                })
                .await
                .unwrap();
            let FromAgent::Started { pid } = s.recv().await.unwrap() else {
                panic!("not started")
            };
            pids.push(pid);
            streams.push(s);
        }
        relay.abort();
        let alive = |pid: u32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|st| !st.contains(") Z "))
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while alive(pids[0]) {
            assert!(
                std::time::Instant::now() < deadline,
                "the attached exec lived on"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Long after its pipes would have filled: still running, and still writing.
        let written = || std::fs::metadata(&count).map_or(0, |m| m.len());
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = written();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(alive(pids[1]), "the detached exec died with its connection");
        assert!(
            written() > before,
            "the detached exec is blocked on its output"
        );
        // SAFETY: kill takes plain integers; the group is the exec's own (its own session).
        unsafe { libc::kill(-(pids[1] as i32), libc::SIGKILL) };
        drop(streams);
    });
}

#[test]
fn files_round_trip_and_hostile_paths_are_refused() {
    let h = harness();
    rt().block_on(async {
        let mut w = h
            .client
            .write_file(WriteFileRequest {
                path: "data/blob.bin".into(),
                mode: None,
                create_parents: true,
                max_bytes: None,
                owner: None,
                metadata: Vec::new(),
            })
            .await
            .unwrap();
        let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        w.write(&payload).await.unwrap();
        let entry = w.finish().await.unwrap();
        assert_eq!(entry.path, "/workspace/data/blob.bin");
        assert_eq!(entry.size, payload.len() as u64);
        assert_eq!(
            h.client
                .read_file("/workspace/data/blob.bin", 1 << 20)
                .await
                .unwrap(),
            payload
        );
        assert_eq!(
            code(h.client.read_file("/workspace/data/blob.bin", 10).await),
            ErrorCode::TooLarge
        );

        assert_eq!(
            code(h.client.stat("/work\0space").await),
            ErrorCode::InvalidPath
        );
        assert_eq!(
            code(h.client.stat(&"a/".repeat(3000)).await),
            ErrorCode::InvalidPath
        );
        // `..` cannot climb out of the agent's root: this is the root's own (absent) passwd.
        assert_eq!(
            code(h.client.read_file("/../../../etc/passwd", 1 << 20).await),
            ErrorCode::NotFound
        );
        std::os::unix::fs::symlink("/etc", h.root.path().join("workspace/etc-link")).unwrap();
        assert_eq!(
            code(
                h.client
                    .read_file("/workspace/etc-link/passwd", 1 << 20)
                    .await
            ),
            ErrorCode::NotFound
        );
        assert_eq!(
            code(h.client.read_file("/workspace", 10).await),
            ErrorCode::IsADirectory
        );
        assert_eq!(
            code(h.client.remove("/", true).await),
            ErrorCode::InvalidPath
        );
    });
}

#[test]
fn oversized_or_cancelled_uploads_leave_nothing() {
    let h = harness();
    rt().block_on(async {
        let req = |path: &str| WriteFileRequest {
            path: path.into(),
            mode: None,
            create_parents: false,
            max_bytes: Some(100_000),
            owner: None,
            metadata: Vec::new(),
        };
        let mut w = h.client.write_file(req("big")).await.unwrap();
        let first = w.write(&vec![7u8; 150_000]).await;
        let result = match first {
            Err(e) => Err(e),
            Ok(()) => w.finish().await.map(|_| ()),
        };
        assert_eq!(code(result), ErrorCode::TooLarge);

        let mut w = h.client.write_file(req("cancelled")).await.unwrap();
        w.write(b"partial").await.unwrap();
        drop(w);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (entries, _) = h.client.list("/workspace", 1).await.unwrap();
        assert!(entries.is_empty(), "upload debris: {entries:?}");
    });
}

#[test]
fn a_flood_of_streams_is_capped() {
    let h = harness();
    rt().block_on(async {
        let mut held = Vec::new();
        for i in 0..MAX_STREAMS {
            let req = WriteFileRequest {
                path: format!("f{i}"),
                mode: None,
                create_parents: false,
                max_bytes: None,
                owner: None,
                metadata: Vec::new(),
            };
            held.push(h.client.write_file(req).await.unwrap());
        }
        // Every upload is open on the agent once a round trip has passed behind them.
        h.client
            .health()
            .await
            .expect_err("the stream cap must refuse one more");
        drop(held);
        // Cancels travel asynchronously: wait (bounded) until every upload is discarded.
        let mut left = usize::MAX;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let (entries, _) = h.client.list("/workspace", 1).await.unwrap();
            left = entries.len();
            if left == 0 {
                break;
            }
        }
        assert_eq!(left, 0, "upload temp files left after cancel");
        assert!(h.client.health().await.is_ok());
    });
}

#[test]
fn kill_all_refuses_unless_the_agent_is_init() {
    // Off init, kill(-1) would reach processes outside any sandbox (this test runs on the host).
    let h = harness();
    let mut sleeper = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    assert_eq!(
        code(rt().block_on(h.client.kill_all())),
        ErrorCode::InvalidRequest
    );
    let alive = std::path::Path::new(&format!("/proc/{}", sleeper.id())).exists();
    let _ = sleeper.kill();
    // The agent's reaper may collect the status first; either way the child is gone.
    let _ = sleeper.wait();
    assert!(alive, "kill_all reached a process outside any sandbox");
}

#[test]
fn a_terminal_runs_as_the_requested_user_and_reports_its_pid() {
    let h = harness();
    rt().block_on(async {
        let req = PtyRequest {
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                "echo id=$(id -u):$(id -g)".into(),
            ],
            cwd: Some("/".into()),
            cols: 80,
            rows: 24,
            uid: Some(1000),
            gid: Some(1001),
            ..Default::default()
        };
        let mut s = h.client.open(ToAgent::PtyStart(req)).await.unwrap();
        let first = s.recv().await.unwrap();
        assert!(
            matches!(first, FromAgent::Started { pid } if pid > 1),
            "{first:?}"
        );
        let mut out = Vec::new();
        let exit = loop {
            match s.recv().await.unwrap() {
                FromAgent::Stdout(b) => out.extend(b),
                FromAgent::Exited(e) => break e,
                other => panic!("unexpected {other:?}"),
            }
        };
        assert_eq!(exit.exit_code, Some(0), "{}", String::from_utf8_lossy(&out));
        assert!(
            String::from_utf8_lossy(&out).contains("id=1000:1001"),
            "{}",
            String::from_utf8_lossy(&out)
        );
    });
}

#[test]
fn writes_and_directories_get_the_requested_owner_when_new() {
    use std::os::unix::fs::MetadataExt;
    let h = harness();
    let owner_of = |p: &str| {
        let m = std::fs::symlink_metadata(h.root.path().join(p)).unwrap();
        (m.uid(), m.gid())
    };
    rt().block_on(async {
        let req = |path: &str, owner| WriteFileRequest {
            path: path.into(),
            mode: None,
            create_parents: true,
            max_bytes: None,
            owner,
            metadata: Vec::new(),
        };
        let mut w = h
            .client
            .write_file(req("new/dir/f.txt", Some((1000, 1000))))
            .await
            .unwrap();
        w.write(b"hi").await.unwrap();
        let entry = w.finish().await.unwrap();
        assert_eq!((entry.uid, entry.gid), (1000, 1000));
        assert_eq!(owner_of("workspace/new/dir/f.txt"), (1000, 1000));
        assert_eq!(owner_of("workspace/new/dir"), (1000, 1000));
        assert_eq!(owner_of("workspace/new"), (1000, 1000));
        assert_eq!(
            owner_of("workspace"),
            (0, 0),
            "an existing parent keeps its owner"
        );

        std::fs::write(h.root.path().join("workspace/root.txt"), "x").unwrap();
        let w = h
            .client
            .write_file(req("root.txt", Some((1000, 1000))))
            .await
            .unwrap();
        w.finish().await.unwrap();
        assert_eq!(
            owner_of("workspace/root.txt"),
            (0, 0),
            "a replaced file keeps its owner"
        );

        let e = h
            .client
            .make_dir("made/here", Some((1000, 1000)))
            .await
            .unwrap();
        assert_eq!((e.uid, e.gid), (1000, 1000));
        assert_eq!(owner_of("workspace/made"), (1000, 1000));

        let w = h
            .client
            .write_file(req("x", Some((65536, 0))))
            .await
            .unwrap();
        assert_eq!(code(w.finish().await), ErrorCode::InvalidRequest);
        assert_eq!(
            code(h.client.make_dir("y", Some((0, 70000))).await),
            ErrorCode::InvalidRequest
        );
    });
}

#[test]
fn a_watch_flush_sends_every_event_before_it_at_once() {
    // The watcher watches the path it resolved as it is (after the agent's pivot, the
    // sandbox's): with the host's root as the file root, a temp dir is watched where it is.
    let dir = tempfile::tempdir().unwrap();
    let client = connect(agent(std::path::Path::new("/"), &[]));
    rt().block_on(async {
        let mut s = client
            .open(ToAgent::Watch {
                path: dir.path().to_string_lossy().into_owned(),
                recursive: false,
            })
            .await
            .unwrap();
        assert_eq!(s.recv().await.unwrap(), FromAgent::Done);
        for round in 1..=3u64 {
            let names: Vec<String> = (0..20).map(|i| format!("r{round}-{i}")).collect();
            for n in &names {
                std::fs::write(dir.path().join(n), b"x").unwrap();
            }
            // Two barriers back to back: each answered once, in order.
            s.send(ToAgent::WatchFlush { token: round * 2 })
                .await
                .unwrap();
            s.send(ToAgent::WatchFlush {
                token: round * 2 + 1,
            })
            .await
            .unwrap();
            let mut seen = std::collections::BTreeSet::new();
            let started = std::time::Instant::now();
            loop {
                match tokio::time::timeout(Duration::from_secs(5), s.recv())
                    .await
                    .unwrap()
                    .unwrap()
                {
                    FromAgent::FsEvent { path, .. } => {
                        seen.insert(path.rsplit('/').next().unwrap().to_string());
                    }
                    FromAgent::WatchFlushed { token } => {
                        assert_eq!(token, round * 2);
                        break;
                    }
                    other => panic!("{other:?}"),
                }
            }
            // Every write before the barrier was reported before its answer.
            for n in &names {
                assert!(seen.contains(n), "round {round}: {n} missing from {seen:?}");
            }
            let next = tokio::time::timeout(Duration::from_secs(5), s.recv())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(
                next,
                FromAgent::WatchFlushed {
                    token: round * 2 + 1
                }
            );
            // No debounce wait: answered as soon as inotify's queue was read.
            assert!(started.elapsed() < Duration::from_secs(2));
        }
        // A flush with nothing pending is answered too.
        s.send(ToAgent::WatchFlush { token: 99 }).await.unwrap();
        let next = tokio::time::timeout(Duration::from_secs(5), s.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(next, FromAgent::WatchFlushed { token: 99 });
    });
}
