//! The gRPC face through the real daemon and real jail sandboxes, with a client generated from
//! the same `.proto`: sessions, execs and their streams (a dropped stream kills its exec, a
//! cancelled terminal its process),
//! files (a multi-MiB streamed round trip), watch, contexts, pause/resume, snapshots, and the
//! admission rules REST has (authentication, scopes, rates, tenancy), plus reflection.

mod common;
mod grpc_common;

use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt as _;
use grpc_common::*;
use koder_auth::testing::{Issuer, SigningKey};
use koder_grpc::proto as pb;
use pb::exec_event::Event;
use tonic::Code;

/// Counts the sandbox's processes whose command line is `sleep <marker>`.
async fn sleepers(c: &mut Client, id: &str, marker: &str) -> String {
    let script = format!(
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done \
         | grep -c '^[s]leep {marker}' || true"
    );
    exec(c, KEY1, id, &script).await.stdout.trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_execs_and_streams() {
    let Some(()) = root_or_skip() else { return };
    let (_d, mut c, _) = start(BASE_CONFIG).await;
    let s = create(
        &mut c,
        KEY1,
        pb::CreateSessionRequest {
            metadata: [("job".to_string(), "grpc".to_string())].into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(s.tenant_id, "t1");
    assert_eq!(s.state, "running");
    assert_eq!(s.metadata["job"], "grpc");
    let got = ok(get_session(&mut c, KEY1, &s.id).await);
    assert_eq!(got.id, s.id);
    let listed = ok(c
        .list_sessions(authed(KEY1, pb::ListSessionsRequest {}))
        .await);
    assert!(listed.sessions.iter().any(|x| x.id == s.id));

    // Unary exec: output, exit code, and a verdict for a timeout.
    let r = exec(&mut c, KEY1, &s.id, "echo out; echo err >&2; exit 3").await;
    assert_eq!((r.stdout.as_str(), r.stderr.as_str()), ("out\n", "err\n"));
    assert_eq!(r.exit_code, Some(3));
    assert_eq!(r.verdict, None);
    let mut slow = shell(&s.id, "sleep 5");
    slow.timeout_ms = Some(300);
    let r = c.exec(authed(KEY1, slow)).await.unwrap().into_inner();
    assert_eq!(r.verdict.as_deref(), Some("SANDBOX-EXEC-TIMEOUT"));
    assert_eq!(
        refused(
            c.exec(authed(
                KEY1,
                pb::ExecRequest {
                    session_id: s.id.clone(),
                    ..Default::default()
                },
            ))
            .await
        ),
        (Code::InvalidArgument, "SANDBOX-INVALID-ARGUMENT".into())
    );

    // ExecStream: started, chunks on both streams, then the exit with its verdict.
    let mut events = c
        .exec_stream(authed(
            KEY1,
            shell(&s.id, "echo one; sleep 0.2; echo two >&2; exit 4"),
        ))
        .await
        .unwrap()
        .into_inner();
    let (mut stdout, mut stderr, mut exit, mut started) = (Vec::new(), Vec::new(), None, None);
    while let Some(ev) = events.next().await {
        match ev.unwrap().event.unwrap() {
            Event::Started(st) => started = Some(st.exec_id),
            Event::Stdout(b) => stdout.extend(b),
            Event::Stderr(b) => stderr.extend(b),
            Event::Exit(r) => exit = Some(r),
            Event::Truncated(n) => panic!("truncated {n}"),
        }
    }
    let exit = exit.expect("an exit event");
    assert_eq!(started.as_deref(), Some(exit.exec_id.as_str()));
    assert_eq!((&stdout[..], &stderr[..]), (&b"one\n"[..], &b"two\n"[..]));
    assert_eq!(exit.exit_code, Some(4));
    assert_eq!(exit.verdict, None);

    // A dropped stream kills its exec.
    let mut events = c
        .exec_stream(authed(KEY1, shell(&s.id, "echo ready; exec sleep 3001")))
        .await
        .unwrap()
        .into_inner();
    loop {
        match events.next().await.unwrap().unwrap().event.unwrap() {
            Event::Stdout(b) if b.starts_with(b"ready") => break,
            _ => {}
        }
    }
    assert_eq!(sleepers(&mut c, &s.id, "3001").await, "1");
    drop(events);
    let deadline = Instant::now() + Duration::from_secs(10);
    while sleepers(&mut c, &s.id, "3001").await != "0" {
        assert!(Instant::now() < deadline, "the exec outlived its stream");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A cancelled terminal kills its process: the client sent its input (half-closed, which
    // alone never ends a terminal) and drops the call. (tonic's client resets a stream only
    // once its request body is done: with input still open, dropping the answer is no cancel.)
    let start = pb::TerminalRequest {
        part: Some(pb::terminal_request::Part::Start(pb::TerminalStart {
            session_id: s.id.clone(),
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                "echo ready; exec sleep 3002".into(),
            ],
            ..Default::default()
        })),
    };
    let input = futures::stream::iter([start]);
    let mut out = ok(c.terminal(authed(KEY1, input)).await);
    let mut seen = String::new();
    while !seen.contains("ready") {
        match out.next().await.unwrap().unwrap().event.unwrap() {
            pb::terminal_output::Event::Output(b) => seen.push_str(&String::from_utf8_lossy(&b)),
            pb::terminal_output::Event::Exit(e) => panic!("the terminal exited: {e:?}"),
            pb::terminal_output::Event::Started(_) => {}
        }
    }
    assert_eq!(sleepers(&mut c, &s.id, "3002").await, "1");
    drop(out);
    let deadline = Instant::now() + Duration::from_secs(10);
    while sleepers(&mut c, &s.id, "3002").await != "0" {
        assert!(Instant::now() < deadline, "the terminal outlived its call");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Pause and resume.
    let p = ok(c
        .pause_session(authed(
            KEY1,
            pb::PauseSessionRequest {
                session_id: s.id.clone(),
                memory: None,
            },
        ))
        .await);
    assert_eq!(p.state, "paused");
    let r = ok(c
        .resume_session(authed(
            KEY1,
            pb::ResumeSessionRequest {
                session_id: s.id.clone(),
            },
        ))
        .await);
    assert_eq!(r.state, "running");
    assert_eq!(
        exec(&mut c, KEY1, &s.id, "echo back").await.stdout,
        "back\n"
    );

    delete_session(&mut c, KEY1, &s.id).await;
    let gone = get_session(&mut c, KEY1, &s.id)
        .await
        .map(|s| s.into_inner().state);
    // A deleted session is stopped or unknown, never running.
    match gone {
        Ok(state) => assert_eq!(state, "stopped"),
        Err(e) => assert_eq!(failure(&e).0, Code::NotFound),
    }
    let e = c
        .exec(authed(KEY1, shell(&s.id, "true")))
        .await
        .unwrap_err();
    assert!(
        matches!(e.code(), Code::NotFound | Code::FailedPrecondition),
        "{e:?}"
    );
}

/// A deterministic, not very compressible payload.
fn payload(len: usize) -> Vec<u8> {
    let mut x: u32 = 0x9e37_79b9;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_watch_contexts_and_snapshots() {
    let Some(()) = root_or_skip() else { return };
    let (_d, mut c, _) = start(BASE_CONFIG).await;
    let s = create(
        &mut c,
        KEY1,
        pb::CreateSessionRequest {
            language: Some("python".into()),
            ..Default::default()
        },
    )
    .await;
    let id = s.id.clone();

    // Watch first, so the upload is seen.
    exec(&mut c, KEY1, &id, "mkdir -p /tmp/w").await;
    let mut watch = c
        .watch_files(authed(
            KEY1,
            pb::WatchFilesRequest {
                session_id: id.clone(),
                path: "/tmp/w".into(),
                recursive: false,
            },
        ))
        .await
        .unwrap()
        .into_inner();

    // A 5 MiB file streamed in 256 KiB parts, and back.
    let data = payload(5 << 20);
    let mut parts = vec![pb::WriteFileRequest {
        part: Some(pb::write_file_request::Part::Header(pb::WriteFileHeader {
            session_id: id.clone(),
            path: "/tmp/w/big.bin".into(),
            user: None,
            size: Some(data.len() as u64),
        })),
    }];
    parts.extend(data.chunks(256 << 10).map(|c| pb::WriteFileRequest {
        part: Some(pb::write_file_request::Part::Data(c.to_vec())),
    }));
    let entry = ok(c
        .write_file(authed(KEY1, futures::stream::iter(parts)))
        .await);
    assert_eq!(entry.size, data.len() as u64);
    assert_eq!(entry.r#type, "file");
    let mut chunks = c
        .read_file(authed(
            KEY1,
            pb::ReadFileRequest {
                session_id: id.clone(),
                path: "/tmp/w/big.bin".into(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let mut back = Vec::new();
    let mut n = 0;
    while let Some(chunk) = chunks.next().await {
        back.extend(chunk.unwrap().data);
        n += 1;
    }
    assert!(n > 1, "streamed in one chunk");
    assert!(
        back == data,
        "the file came back different ({} bytes)",
        back.len()
    );
    let sum = exec(&mut c, KEY1, &id, "sha256sum /tmp/w/big.bin | cut -c1-64").await;
    assert_eq!(sum.stdout.trim().len(), 64);

    let event = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let ev = watch.next().await.unwrap().unwrap();
            if ev.path == "/tmp/w/big.bin" {
                return ev;
            }
        }
    })
    .await
    .expect("a watch event for the upload");
    assert!(
        ["created", "modified", "renamed"].contains(&event.r#type.as_str()),
        "{event:?}"
    );
    drop(watch);

    // List, move, delete.
    let list = ok(c
        .list_files(authed(
            KEY1,
            pb::ListFilesRequest {
                session_id: id.clone(),
                path: "/tmp/w".into(),
                depth: None,
            },
        ))
        .await);
    let names: Vec<_> = list.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["big.bin"]);
    let moved = ok(c
        .move_file(authed(
            KEY1,
            pb::MoveFileRequest {
                session_id: id.clone(),
                from: "/tmp/w/big.bin".into(),
                to: "/tmp/w/moved.bin".into(),
            },
        ))
        .await);
    assert_eq!(moved.path, "/tmp/w/moved.bin");
    c.delete_file(authed(
        KEY1,
        pb::DeleteFileRequest {
            session_id: id.clone(),
            path: "/tmp/w/moved.bin".into(),
            recursive: false,
        },
    ))
    .await
    .unwrap();
    let missing = c
        .read_file(authed(
            KEY1,
            pb::ReadFileRequest {
                session_id: id.clone(),
                path: "/tmp/w/moved.bin".into(),
            },
        ))
        .await;
    let e = match missing {
        Err(e) => e,
        Ok(s) => s.into_inner().next().await.unwrap().unwrap_err(),
    };
    assert_eq!(failure(&e), (Code::NotFound, "SANDBOX-NOT-FOUND".into()));
    let first_not_header = c
        .write_file(authed(
            KEY1,
            futures::stream::iter([pb::WriteFileRequest {
                part: Some(pb::write_file_request::Part::Data(b"x".to_vec())),
            }]),
        ))
        .await
        .unwrap_err();
    assert_eq!(first_not_header.code(), Code::InvalidArgument);

    // A context keeps its state between runs.
    let ctx = ok(c
        .create_context(authed(
            KEY1,
            pb::CreateContextRequest {
                session_id: id.clone(),
                ..Default::default()
            },
        ))
        .await);
    assert_eq!(ctx.language, "python");
    let run = |code: &str| pb::RunInContextRequest {
        session_id: id.clone(),
        context_id: ctx.context_id.clone(),
        code: code.into(),
        ..Default::default()
    };
    c.run_in_context(authed(KEY1, run("x = 40"))).await.unwrap();
    let r = c
        .run_in_context(authed(KEY1, run("print('hi'); x + 2")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.stdout, "hi\n");
    assert_eq!(r.results[0].text.as_deref(), Some("42"));
    assert_eq!(r.error, None);
    // A figure comes as PNG with its chart (JSON text, as `json` and `data` are).
    let code = "import matplotlib.pyplot as plt\nplt.pie([3, 1], labels=['a', 'b'])\nplt.show()";
    let r = ok(c.run_in_context(authed(KEY1, run(code))).await);
    let figure = &r.results[0];
    assert!(figure.png.is_some(), "{r:?}");
    let chart: serde_json::Value = serde_json::from_str(figure.chart.as_deref().unwrap()).unwrap();
    assert_eq!(chart["elements"][0]["angle"], 270.0, "{chart}");
    // PDF, JavaScript and a bundle's other MIME types (`extra`, JSON text).
    let code = concat!(
        "from IPython.display import Javascript\n",
        "class D:\n",
        "    def _repr_pdf_(self): return b'%PDF'\n",
        "    def _repr_mimebundle_(self, **kw): return {'application/x-t': [1]}\n",
        "display(Javascript('f()'))\nD()",
    );
    let r = ok(c.run_in_context(authed(KEY1, run(code))).await);
    let (script, doc) = (&r.results[0], &r.results[1]);
    assert_eq!(script.javascript.as_deref(), Some("f()"), "{r:?}");
    assert_eq!(
        (doc.pdf.as_deref(), doc.extra.as_deref()),
        (Some("JVBERg=="), Some(r#"{"application/x-t": [1]}"#)),
        "{r:?}"
    );
    // TypeScript contexts as on REST.
    let ts = ok(c
        .create_context(authed(
            KEY1,
            pb::CreateContextRequest {
                session_id: id.clone(),
                language: Some("ts".into()),
                ..Default::default()
            },
        ))
        .await);
    assert_eq!(ts.language, "typescript");
    let typed = pb::RunInContextRequest {
        context_id: ts.context_id.clone(),
        ..run("const n: number = 20\nn * 2 + 2")
    };
    let r = ok(c.run_in_context(authed(KEY1, typed)).await);
    assert_eq!(r.results[0].text.as_deref(), Some("42"), "{r:?}");

    // Snapshot, then a session made from it has the file.
    exec(&mut c, KEY1, &id, "echo kept > /workspace/kept.txt").await;
    let snap = ok(c
        .create_snapshot(authed(
            KEY1,
            pb::CreateSnapshotRequest {
                session_id: id.clone(),
                name: Some("grpc-snap".into()),
            },
        ))
        .await);
    assert_eq!(snap.session_id.as_deref(), Some(id.as_str()));
    let got = ok(c
        .get_snapshot(authed(
            KEY1,
            pb::GetSnapshotRequest {
                snapshot_id: snap.snapshot_id.clone(),
            },
        ))
        .await);
    assert_eq!(got, snap);
    let all = ok(c
        .list_snapshots(authed(KEY1, pb::ListSnapshotsRequest {}))
        .await);
    assert!(all
        .snapshots
        .iter()
        .any(|x| x.snapshot_id == snap.snapshot_id));
    let from = create(
        &mut c,
        KEY1,
        pb::CreateSessionRequest {
            from_snapshot: Some(snap.snapshot_id.clone()),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(from.language, "python");
    assert_eq!(
        exec(&mut c, KEY1, &from.id, "cat /workspace/kept.txt")
            .await
            .stdout,
        "kept\n"
    );
    c.delete_snapshot(authed(
        KEY1,
        pb::DeleteSnapshotRequest {
            snapshot_id: snap.snapshot_id.clone(),
        },
    ))
    .await
    .unwrap();
    assert_eq!(
        refused(
            c.get_snapshot(authed(
                KEY1,
                pb::GetSnapshotRequest {
                    snapshot_id: snap.snapshot_id.clone(),
                },
            ))
            .await
        )
        .0,
        Code::NotFound
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_tenancy_and_reflection() {
    let Some(()) = root_or_skip() else { return };
    let key = SigningKey::ec("ec");
    let issuer = Issuer::start(&[&key]).await;
    let (_d, mut c, url) = start(&format!(
        "{BASE_CONFIG}[auth]\nissuer_url = \"{}\"\njwks_min_refresh_s = 1\n\
         [tenants.acme]\nplan = \"standard\"\n\
         [limits.plans.metered]\nrequests_per_second = 1\nburst = 2\n\
         [tenants.t2]\nplan = \"metered\"\n",
        issuer.url
    ))
    .await;

    // No credentials, a wrong key, a malformed JWT: UNAUTHENTICATED.
    let none = c
        .list_sessions(tonic::Request::new(pb::ListSessionsRequest {}))
        .await
        .unwrap_err();
    assert_eq!(
        failure(&none),
        (Code::Unauthenticated, koder_api_types::codes::AUTH.into())
    );
    for bad in ["wrong-key-000000", "a.b.c"] {
        let e = c
            .list_sessions(authed(bad, pb::ListSessionsRequest {}))
            .await
            .unwrap_err();
        assert_eq!(failure(&e).0, Code::Unauthenticated, "{bad}");
    }

    // A read-only JWT reads but neither creates nor execs: PERMISSION_DENIED.
    let reader = key.sign(&issuer.claims("acme", "sandbox:read"));
    c.list_sessions(authed(&reader, pb::ListSessionsRequest {}))
        .await
        .unwrap();
    assert_eq!(
        refused(
            c.create_session(authed(&reader, pb::CreateSessionRequest::default()))
                .await
        ),
        (Code::PermissionDenied, "SANDBOX-AUTH-SCOPE".into())
    );
    let writer = key.sign(&issuer.claims("acme", "sandbox:write"));
    let s = create(&mut c, &writer, pb::CreateSessionRequest::default()).await;
    assert_eq!(s.tenant_id, "acme");
    assert_eq!(
        refused(c.exec(authed(&writer, shell(&s.id, "true"))).await).0,
        Code::PermissionDenied
    );
    assert_eq!(
        refused(c.exec_stream(authed(&writer, shell(&s.id, "true"))).await).0,
        Code::PermissionDenied
    );

    // Another tenant's session is unknown, exactly like a made-up id.
    let mine = create(&mut c, KEY1, pb::CreateSessionRequest::default()).await;
    let foreign = get_session(&mut c, KEY2, &mine.id).await.unwrap_err();
    let unknown = get_session(&mut c, KEY2, "no-such-session")
        .await
        .unwrap_err();
    assert_eq!(
        failure(&foreign),
        (Code::NotFound, "SANDBOX-NOT-FOUND".into())
    );
    assert_eq!(failure(&foreign), failure(&unknown));
    assert_eq!(foreign.message(), unknown.message());

    // t2 is over its rate now (burst 2): RESOURCE_EXHAUSTED with a retry delay; t1 is not.
    let limited = c
        .list_sessions(authed(KEY2, pb::ListSessionsRequest {}))
        .await
        .unwrap_err();
    assert_eq!(
        failure(&limited),
        (Code::ResourceExhausted, "SANDBOX-RATE-LIMITED".into())
    );
    let retry = tonic_types::StatusExt::get_details_retry_info(&limited).expect("RetryInfo");
    assert!(retry
        .retry_delay
        .is_some_and(|d| d >= Duration::from_secs(1)));
    exec(&mut c, KEY1, &mine.id, "true").await;

    // Reflection lists the service (what grpcurl asks first).
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    let channel = tonic::transport::Endpoint::from_shared(url)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut r = ServerReflectionClient::new(channel);
    let ask = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = r
        .server_reflection_info(futures::stream::iter([ask]))
        .await
        .unwrap()
        .into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) =
        answers.next().await.unwrap().unwrap().message_response
    else {
        panic!("no service list")
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&koder_grpc::SERVICE_NAME), "{names:?}");
    let ask = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::FileContainingSymbol(
            koder_grpc::SERVICE_NAME.into(),
        )),
    };
    let mut answers = r
        .server_reflection_info(futures::stream::iter([ask]))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.next().await.unwrap().unwrap().message_response;
    assert!(
        matches!(answer, Some(MessageResponse::FileDescriptorResponse(ref f)) if !f.file_descriptor_proto.is_empty()),
        "{answer:?}"
    );
}
