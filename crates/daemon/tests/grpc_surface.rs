//! The rest of the gRPC surface at REST parity, through the real daemon and real jail
//! sandboxes: volumes (and mounts and lifecycle on create), background execs (list, status,
//! follow to the exit, stdin, signals), network policy, preview, fork and restore.

mod common;
mod grpc_common;

use common::*;
use futures::StreamExt as _;
use grpc_common::*;
use koder_grpc::proto as pb;
use pb::exec_event::Event;
use tonic::Code;

/// Follows an exec to its exit: everything it printed on stdout, and the exit.
async fn follow_to_exit(c: &mut Client, session: &str, exec_id: &str) -> (String, pb::ExecResult) {
    let mut events = c
        .follow_exec(authed(KEY1, exec_ref(session, exec_id)))
        .await
        .expect("FollowExec")
        .into_inner();
    let mut stdout = Vec::new();
    while let Some(ev) = events.next().await {
        match ev.expect("exec event").event.expect("event") {
            Event::Stdout(b) => stdout.extend(b),
            Event::Exit(r) => return (String::from_utf8_lossy(&stdout).into_owned(), r),
            _ => {}
        }
    }
    panic!("the follow ended without an exit");
}

fn exec_ref(session: &str, exec_id: &str) -> pb::GetExecRequest {
    pb::GetExecRequest {
        session_id: session.into(),
        exec_id: exec_id.into(),
    }
}

async fn start_exec(c: &mut Client, session: &str, cmd: &str) -> String {
    c.start_exec(authed(KEY1, shell(session, cmd)))
        .await
        .expect("StartExec")
        .into_inner()
        .exec_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_mounts_and_lifecycle_on_create() {
    let Some(()) = root_or_skip() else { return };
    let (_d, mut c, _) = start(BASE_CONFIG).await;
    let v = ok(c
        .create_volume(authed(
            KEY1,
            pb::CreateVolumeRequest {
                name: "data".into(),
                size_mib: Some(64),
                from_volume: None,
            },
        ))
        .await);
    assert_eq!((v.name.as_str(), v.size_mib), ("data", 64));
    assert_eq!(
        refused(
            c.create_volume(authed(
                KEY1,
                pb::CreateVolumeRequest {
                    name: "data".into(),
                    ..Default::default()
                },
            ))
            .await
        )
        .0,
        Code::FailedPrecondition
    );

    let s = create(
        &mut c,
        KEY1,
        pb::CreateSessionRequest {
            volumes: vec![pb::VolumeMount {
                name: "data".into(),
                path: "/data".into(),
                read_only: false,
            }],
            lifecycle: Some(pb::Lifecycle {
                on_timeout: "pause".into(),
                auto_resume: true,
                keep_memory: false,
            }),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(s.volumes.len(), 1);
    assert_eq!(
        (s.volumes[0].volume_id.as_str(), s.volumes[0].path.as_str()),
        (v.volume_id.as_str(), "/data")
    );
    let r = exec(&mut c, KEY1, &s.id, "echo kept > /data/f && cat /data/f").await;
    assert_eq!(r.stdout, "kept\n");

    let got = ok(c
        .get_volume(authed(
            KEY1,
            pb::GetVolumeRequest {
                volume: "data".into(),
            },
        ))
        .await);
    assert_eq!(got.volume_id, v.volume_id);
    assert_eq!(got.mounts.len(), 1);
    assert_eq!(got.mounts[0].session_id, s.id);
    assert_eq!(
        refused(
            c.delete_volume(authed(
                KEY1,
                pb::DeleteVolumeRequest {
                    volume: "data".into(),
                },
            ))
            .await
        ),
        (Code::FailedPrecondition, "SANDBOX-VOLUME-BUSY".into())
    );
    // Another tenant sees no such volume.
    assert_eq!(
        refused(
            c.get_volume(authed(
                KEY2,
                pb::GetVolumeRequest {
                    volume: v.volume_id.clone(),
                },
            ))
            .await
        )
        .0,
        Code::NotFound
    );
    assert_eq!(
        refused(
            c.create_session(authed(
                KEY1,
                pb::CreateSessionRequest {
                    lifecycle: Some(pb::Lifecycle {
                        on_timeout: "sleep".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ))
            .await
        )
        .0,
        Code::InvalidArgument
    );

    delete_session(&mut c, KEY1, &s.id).await;
    c.delete_volume(authed(
        KEY1,
        pb::DeleteVolumeRequest {
            volume: "data".into(),
        },
    ))
    .await
    .unwrap();
    let listed = ok(c
        .list_volumes(authed(KEY1, pb::ListVolumesRequest {}))
        .await);
    assert!(listed.volumes.is_empty(), "{listed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_execs_stdin_and_signals() {
    let Some(()) = root_or_skip() else { return };
    let (_d, mut c, _) = start(BASE_CONFIG).await;
    let s = create(&mut c, KEY1, pb::CreateSessionRequest::default()).await;

    let reader = start_exec(&mut c, &s.id, "read line; echo got $line").await;
    let status = ok(c.get_exec(authed(KEY1, exec_ref(&s.id, &reader))).await);
    assert_eq!(
        (status.state.as_str(), status.background),
        ("running", true)
    );
    assert!(status.pid.is_some());
    c.write_stdin(authed(
        KEY1,
        pb::WriteStdinRequest {
            session_id: s.id.clone(),
            exec_id: reader.clone(),
            data: b"hello\n".to_vec(),
            close: true,
        },
    ))
    .await
    .unwrap();
    let (out, exit) = follow_to_exit(&mut c, &s.id, &reader).await;
    assert_eq!(out, "got hello\n");
    assert_eq!(exit.exit_code, Some(0));

    let sleeper = start_exec(&mut c, &s.id, "exec sleep 300").await;
    let listed = ok(c
        .list_execs(authed(
            KEY1,
            pb::ListExecsRequest {
                session_id: s.id.clone(),
            },
        ))
        .await);
    let ids: Vec<_> = listed.execs.iter().map(|e| e.exec_id.as_str()).collect();
    assert!(ids.contains(&reader.as_str()) && ids.contains(&sleeper.as_str()));
    assert_eq!(
        refused(
            c.signal_exec(authed(
                KEY1,
                pb::SignalExecRequest {
                    session_id: s.id.clone(),
                    exec_id: sleeper.clone(),
                    signal: "NOPE".into(),
                },
            ))
            .await
        )
        .0,
        Code::InvalidArgument
    );
    c.signal_exec(authed(
        KEY1,
        pb::SignalExecRequest {
            session_id: s.id.clone(),
            exec_id: sleeper.clone(),
            signal: "KILL".into(),
        },
    ))
    .await
    .unwrap();
    let (_, exit) = follow_to_exit(&mut c, &s.id, &sleeper).await;
    assert_eq!(exit.signal, Some(9));
    let done = ok(c.get_exec(authed(KEY1, exec_ref(&s.id, &sleeper))).await);
    assert_eq!(done.state, "exited");
    assert_eq!(done.result.and_then(|r| r.signal), Some(9));
    // Another tenant's call on the exec is NOT_FOUND.
    assert_eq!(
        refused(c.get_exec(authed(KEY2, exec_ref(&s.id, &sleeper))).await).0,
        Code::NotFound
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_preview_fork_and_restore() {
    let Some(()) = root_or_skip() else { return };
    let (_d, mut c, _) = start(BASE_CONFIG).await;
    // A session's egress policy can change only when it was made with one.
    let s = create(
        &mut c,
        KEY1,
        pb::CreateSessionRequest {
            network: Some(pb::Network {
                mode: "allowlist".into(),
                ..Default::default()
            }),
            ..Default::default()
        },
    )
    .await;

    let updated = ok(c
        .set_network(authed(
            KEY1,
            pb::SetNetworkRequest {
                session_id: s.id.clone(),
                network: Some(pb::Network {
                    mode: "allowlist".into(),
                    allow: vec!["*.wild.test".into()],
                    deny: vec![],
                }),
            },
        ))
        .await);
    let network = updated.network.expect("network");
    assert_eq!(
        (network.mode.as_str(), &network.allow[..]),
        ("allowlist", &["*.wild.test".to_string()][..])
    );

    let pin = |port| {
        authed(
            KEY1,
            pb::PinPreviewRequest {
                session_id: s.id.clone(),
                port,
            },
        )
    };
    assert_eq!(
        refused(c.pin_preview(pin(8123)).await),
        (Code::Unavailable, "SANDBOX-PREVIEW-NOT-LISTENING".into())
    );
    assert_eq!(
        refused(c.pin_preview(pin(70000)).await).0,
        Code::InvalidArgument
    );
    start_exec(
        &mut c,
        &s.id,
        "exec python3 -m http.server 8123 --bind 127.0.0.1",
    )
    .await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let preview = loop {
        match c.pin_preview(pin(8123)).await {
            Ok(p) => break p.into_inner(),
            Err(e) if e.code() == Code::Unavailable => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "never listened: {e:?}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{e:?}"),
        }
    };
    assert_eq!((preview.port, preview.pinned), (8123, true));
    assert_eq!(
        preview.preview_path,
        format!("/v1/sandbox/sessions/{}/preview/", s.id)
    );

    exec(&mut c, KEY1, &s.id, "echo before > /workspace/f").await;
    let snap = ok(c
        .create_snapshot(authed(
            KEY1,
            pb::CreateSnapshotRequest {
                session_id: s.id.clone(),
                name: None,
            },
        ))
        .await);
    let forks = ok(c
        .fork_session(authed(
            KEY1,
            pb::ForkSessionRequest {
                session_id: s.id.clone(),
                count: None,
            },
        ))
        .await);
    assert_eq!(forks.sessions.len(), 1);
    let fork = &forks.sessions[0];
    assert_ne!(fork.id, s.id);
    assert_eq!(
        exec(&mut c, KEY1, &fork.id, "cat /workspace/f")
            .await
            .stdout,
        "before\n"
    );

    exec(&mut c, KEY1, &s.id, "echo after > /workspace/f").await;
    let restored = ok(c
        .restore_session(authed(
            KEY1,
            pb::RestoreSessionRequest {
                session_id: s.id.clone(),
                snapshot_id: snap.snapshot_id.clone(),
            },
        ))
        .await);
    assert_eq!(
        (restored.id.as_str(), restored.state.as_str()),
        (s.id.as_str(), "running")
    );
    assert_eq!(
        exec(&mut c, KEY1, &s.id, "cat /workspace/f").await.stdout,
        "before\n"
    );
    assert_eq!(
        refused(
            c.restore_session(authed(
                KEY1,
                pb::RestoreSessionRequest {
                    session_id: s.id.clone(),
                    snapshot_id: "snap-none".into(),
                },
            ))
            .await
        )
        .0,
        Code::NotFound
    );
}

/// Terminal output until `want` shows (`None`: until the exit, which comes back), bounded.
async fn read_until(
    out: &mut tonic::Streaming<pb::TerminalOutput>,
    want: Option<&str>,
) -> Option<pb::TerminalExit> {
    use pb::terminal_output::Event as Out;
    let mut seen = String::new();
    let wait = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        while let Some(msg) = out.next().await {
            match msg.expect("terminal output").event.expect("event") {
                Out::Output(b) => {
                    seen.push_str(&String::from_utf8_lossy(&b));
                    if want.is_some_and(|w| seen.contains(w)) {
                        return None;
                    }
                }
                Out::Exit(e) => return Some(e),
                Out::Started(_) => {}
            }
        }
        panic!("the terminal ended; saw {seen:?}");
    });
    wait.await.unwrap_or_else(|_| panic!("no {want:?} in time"))
}

/// The messages sent on `rx`, as a client stream.
fn requests(
    rx: tokio::sync::mpsc::Receiver<pb::TerminalRequest>,
) -> impl futures::Stream<Item = pb::TerminalRequest> {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_input_resize_output_and_exit() {
    use pb::terminal_request::Part;
    let Some(()) = root_or_skip() else { return };
    let (_d, mut c, _) = start(BASE_CONFIG).await;
    let s = create(&mut c, KEY1, pb::CreateSessionRequest::default()).await;
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let part = |p| pb::TerminalRequest { part: Some(p) };
    tx.send(part(Part::Start(pb::TerminalStart {
        session_id: s.id.clone(),
        argv: vec!["/bin/sh".into()],
        size: Some(pb::TerminalSize { cols: 90, rows: 20 }),
        ..Default::default()
    })))
    .await
    .unwrap();
    let mut out = ok(c.terminal(authed(KEY1, requests(rx))).await);
    let first = out.next().await.unwrap().unwrap().event;
    assert!(
        matches!(first, Some(pb::terminal_output::Event::Started(pid)) if pid > 0),
        "{first:?}"
    );
    tx.send(part(Part::Input(
        b"stty size; echo sum-$((40+2))\n".to_vec(),
    )))
    .await
    .unwrap();
    assert_eq!(read_until(&mut out, Some("sum-42")).await, None);
    tx.send(part(Part::Resize(pb::TerminalSize {
        cols: 100,
        rows: 30,
    })))
    .await
    .unwrap();
    tx.send(part(Part::Input(b"stty size\n".to_vec())))
        .await
        .unwrap();
    assert_eq!(read_until(&mut out, Some("30 100")).await, None);
    tx.send(part(Part::Input(b"exit 7\n".to_vec())))
        .await
        .unwrap();
    let exit = read_until(&mut out, None).await.expect("an exit");
    assert_eq!(exit.exit_code, Some(7));

    // The first message must be the start.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(part(Part::Input(b"x".to_vec()))).await.unwrap();
    let refused = c.terminal(authed(KEY1, requests(rx))).await;
    assert_eq!(
        refused.map(|_| ()).unwrap_err().code(),
        Code::InvalidArgument
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_administration_for_operators_only() {
    const ADMIN_KEY: &str = "admin-key-grpc-0123456789";
    let Some(()) = root_or_skip() else { return };
    let config = format!("{BASE_CONFIG}[auth]\nadmin_keys = [\"{ADMIN_KEY}\"]\n");
    let (d, mut c, _) = start(&config).await;
    // A tenant's key is refused, as on REST; no key is unauthenticated.
    assert_eq!(
        refused(
            c.list_tenants(authed(KEY1, pb::ListTenantsRequest {}))
                .await
        )
        .0,
        Code::PermissionDenied
    );
    assert_eq!(
        refused(
            c.list_tenants(tonic::Request::new(pb::ListTenantsRequest {}))
                .await
        )
        .0,
        Code::Unauthenticated
    );
    let put = ok(c
        .put_tenant(authed(
            ADMIN_KEY,
            pb::PutTenantRequest {
                tenant_id: "newco".into(),
                name: Some("New Co".into()),
                plan: "standard".into(),
                max_sessions: Some(3),
                daily_session_minutes: None,
            },
        ))
        .await);
    assert_eq!(
        (put.id.as_str(), put.name.as_str(), put.max_sessions),
        ("newco", "New Co", Some(3))
    );
    let got = ok(c
        .get_tenant(authed(
            ADMIN_KEY,
            pb::GetTenantRequest {
                tenant_id: "newco".into(),
            },
        ))
        .await);
    // The store keeps milliseconds; the answer to the put had the clock's nanoseconds.
    let second = |t: &pb::Tenant| t.created_at.as_ref().map(|t| t.seconds);
    assert_eq!(second(&got), second(&put));
    assert_eq!(
        pb::Tenant {
            created_at: None,
            ..got
        },
        pb::Tenant {
            created_at: None,
            ..put
        }
    );
    // An issued key works at once, over either face; only operators issue.
    let issue = |key: &str, tenant: &str| {
        authed(
            key,
            pb::IssueKeyRequest {
                tenant_id: tenant.into(),
            },
        )
    };
    assert_eq!(
        refused(c.issue_key(issue(KEY1, "newco")).await).0,
        Code::PermissionDenied
    );
    assert_eq!(
        refused(c.issue_key(issue(ADMIN_KEY, "ghost")).await).0,
        Code::NotFound
    );
    let issued = ok(c.issue_key(issue(ADMIN_KEY, "newco")).await);
    assert_eq!(issued.tenant_id, "newco");
    let mine = ok(c
        .list_sessions(authed(&issued.api_key, pb::ListSessionsRequest {}))
        .await);
    assert!(mine.sessions.is_empty());
    let rest = reqwest::Client::new()
        .post(format!("{}/v1/sandbox/admin/tenants/newco/keys", d.base))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(rest.status(), 201);
    let by_rest: serde_json::Value = rest.json().await.unwrap();
    let rest_key = by_rest["api_key"].as_str().unwrap();
    assert_ne!(rest_key, issued.api_key);
    ok(
        c.list_sessions(authed(rest_key, pb::ListSessionsRequest {}))
            .await,
    );

    let all = ok(c
        .list_tenants(authed(ADMIN_KEY, pb::ListTenantsRequest {}))
        .await);
    let ids: Vec<_> = all.tenants.iter().map(|t| t.id.as_str()).collect();
    assert!(ids.contains(&"newco") && ids.contains(&"t1"), "{ids:?}");
    assert_eq!(
        refused(
            c.get_tenant(authed(
                ADMIN_KEY,
                pb::GetTenantRequest {
                    tenant_id: "ghost".into(),
                },
            ))
            .await
        )
        .0,
        Code::NotFound
    );
}

/// A session's event log over both faces: what happened to it, in order, after it stopped,
/// paged, and nobody else's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_s_event_log_over_both_faces() {
    use reqwest::{Method, StatusCode};
    use serde_json::{json, Value};

    let Some(()) = root_or_skip() else { return };
    let (d, mut c, _) = start(BASE_CONFIG).await;
    let id = d.create(json!({})).await;
    let r = d
        .exec(&id, json!({"cmd": ["sleep", "30"], "timeout_ms": 200}))
        .await;
    assert_eq!(r["verdict"], "SANDBOX-EXEC-TIMEOUT", "{r}");
    for step in ["pause", "resume"] {
        let (status, v) = d
            .json(
                Method::POST,
                &format!("/v1/sandbox/sessions/{id}/{step}"),
                json!({}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{step}: {v}");
    }
    let (status, _) = d
        .json(
            Method::DELETE,
            &format!("/v1/sandbox/sessions/{id}"),
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    let events = format!("/v1/sandbox/sessions/{id}/events");
    // The log is written behind the answers: wait for the stop to land.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let log = loop {
        let log = d.json(Method::GET, &events, Value::Null).await.1;
        if log["events"].as_array().is_some_and(|e| e.len() >= 5) {
            break log;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the log never held five events: {log}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let kinds: Vec<_> = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        kinds,
        [
            "session.created",
            "exec.verdict",
            "session.paused",
            "session.resumed",
            "session.stopped"
        ]
    );
    assert_eq!(log["more"], false);
    assert_eq!(log["events"][1]["data"]["verdict"], "SANDBOX-EXEC-TIMEOUT");
    assert_eq!(log["events"][4]["data"]["cause"], "deleted");
    assert_eq!(log["events"][0]["data"]["session_id"], id.as_str());

    // gRPC lists the same events, field for field.
    let page = ok(c
        .list_session_events(authed(
            KEY1,
            pb::ListSessionEventsRequest {
                session_id: id.clone(),
                ..Default::default()
            },
        ))
        .await);
    assert!(!page.more);
    let over_grpc: Vec<Value> = page
        .events
        .iter()
        .map(|e| {
            let at = e.created_at.as_ref().unwrap();
            let at = chrono::DateTime::from_timestamp(at.seconds, at.nanos as u32).unwrap();
            json!({
                "seq": e.seq, "id": e.id, "type": e.r#type, "created_at": at,
                "data": serde_json::from_str::<Value>(&e.data_json).unwrap(),
            })
        })
        .collect();
    let over_rest: Vec<Value> = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let mut e = e.clone();
            let at: chrono::DateTime<chrono::Utc> =
                serde_json::from_value(e["created_at"].clone()).unwrap();
            e["created_at"] = json!(at);
            e
        })
        .collect();
    assert_eq!(over_grpc, over_rest);

    // Paged by number on both faces.
    let (_, v) = d
        .json(
            Method::GET,
            &format!("{events}?after=2&limit=2"),
            Value::Null,
        )
        .await;
    let seqs: Vec<_> = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].clone())
        .collect();
    assert_eq!((seqs, &v["more"]), (vec![json!(3), json!(4)], &json!(true)));
    let page = ok(c
        .list_session_events(authed(
            KEY1,
            pb::ListSessionEventsRequest {
                session_id: id.clone(),
                after: Some(4),
                limit: Some(10),
            },
        ))
        .await);
    assert_eq!(page.events.iter().map(|e| e.seq).collect::<Vec<_>>(), [5]);

    // Bad pages are refused; another tenant sees no such session.
    for q in [
        "limit=0",
        "limit=501",
        "after=-1",
        "after=x",
        "after=9223372036854775808",
        "since=1",
    ] {
        let (status, v) = d
            .json(Method::GET, &format!("{events}?{q}"), Value::Null)
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{q}: {v}");
        assert_eq!(error_code(&v), "SANDBOX-INVALID-ARGUMENT", "{q}");
    }
    let (status, _) = d.json_as(KEY2, Method::GET, &events, Value::Null).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (code, _) = refused(
        c.list_session_events(authed(
            KEY2,
            pb::ListSessionEventsRequest {
                session_id: id.clone(),
                ..Default::default()
            },
        ))
        .await,
    );
    assert_eq!(code, Code::NotFound);
    let (code, _) = refused(
        c.list_session_events(authed(
            KEY1,
            pb::ListSessionEventsRequest {
                session_id: id,
                limit: Some(0),
                ..Default::default()
            },
        ))
        .await,
    );
    assert_eq!(code, Code::InvalidArgument);
}
