//! REST and gRPC are two faces of one domain: the same scenario over both against one daemon
//! gives the same sessions, exec results, file lists and error codes, field by field.

mod common;
mod grpc_common;

use common::*;
use grpc_common::*;
use koder_grpc::proto as pb;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tonic::Code;

const S: &str = "/v1/sandbox/sessions";

/// The gRPC code a REST status maps to.
fn grpc_code(status: StatusCode) -> Code {
    match status.as_u16() {
        400 | 413 | 415 => Code::InvalidArgument,
        401 => Code::Unauthenticated,
        402 | 403 => Code::PermissionDenied,
        404 => Code::NotFound,
        409 | 410 => Code::FailedPrecondition,
        429 | 507 => Code::ResourceExhausted,
        501 => Code::Unimplemented,
        503 => Code::Unavailable,
        504 => Code::DeadlineExceeded,
        other => panic!("unexpected status {other}"),
    }
}

/// A gRPC session as the REST JSON of the fields both faces share.
fn session_json(s: &pb::Session) -> Value {
    let limits = s.limits.unwrap_or_default();
    let network = s.network.clone().unwrap_or_default();
    let secs = |t: &Option<prost_types::Timestamp>| t.as_ref().map(|t| t.seconds).unwrap();
    json!({
        "tenant_id": s.tenant_id,
        "language": s.language,
        "image": s.image,
        "runtime": s.runtime,
        "state": s.state,
        "lifetime_s": secs(&s.expires_at) - secs(&s.created_at),
        "limits": {
            "cpu_millis": limits.cpu_millis,
            "memory_mib": limits.memory_mib,
            "disk_mib": limits.disk_mib,
            "pids": limits.pids,
        },
        "network": {"mode": network.mode, "allow": network.allow},
        "metadata": s.metadata,
        "end_reason": s.end_reason,
        "volumes": s.volumes.iter().map(|v| json!({
            "volume_id": v.volume_id, "name": v.name, "path": v.path, "read_only": v.read_only,
        })).collect::<Vec<_>>(),
    })
}

/// The same fields of a REST session.
fn rest_session_json(v: &Value) -> Value {
    let secs = |k: &str| {
        chrono::DateTime::parse_from_rfc3339(v[k].as_str().unwrap())
            .unwrap()
            .timestamp()
    };
    let limits = &v["limits"];
    json!({
        "tenant_id": v["tenant_id"],
        "language": v["language"],
        "image": v["image"],
        "runtime": v["runtime"],
        "state": v["state"],
        "lifetime_s": secs("expires_at") - secs("created_at"),
        "limits": {
            "cpu_millis": limits["cpu_millis"],
            "memory_mib": limits["memory_mib"],
            "disk_mib": limits["disk_mib"],
            "pids": limits["pids"],
        },
        "network": {"mode": v["network"]["mode"], "allow": v["network"].get("allow").cloned().unwrap_or(json!([]))},
        "metadata": v["metadata"],
        "end_reason": v.get("end_reason").cloned().unwrap_or(Value::Null),
        "volumes": v["volumes"].as_array().into_iter().flatten().map(|m| json!({
            "volume_id": m["volume_id"], "name": m["name"], "path": m["path"],
            "read_only": m.get("read_only").cloned().unwrap_or(json!(false)),
        })).collect::<Vec<_>>(),
    })
}

/// The exec fields that do not depend on timing.
fn exec_json(r: &pb::ExecResult) -> Value {
    json!({
        "exit_code": r.exit_code, "signal": r.signal, "stdout": r.stdout, "stderr": r.stderr,
        "stdout_truncated": r.stdout_truncated, "stderr_truncated": r.stderr_truncated,
        "verdict": r.verdict,
    })
}

fn rest_exec_json(v: &Value) -> Value {
    let field = |k: &str| v.get(k).cloned().unwrap_or(Value::Null);
    json!({
        "exit_code": field("exit_code"), "signal": field("signal"), "stdout": v["stdout"],
        "stderr": v["stderr"], "stdout_truncated": v["stdout_truncated"],
        "stderr_truncated": v["stderr_truncated"], "verdict": field("verdict"),
    })
}

fn entries_json(entries: &[pb::FileEntry]) -> Value {
    entries
        .iter()
        .map(|e| {
            json!({"name": e.name, "type": e.r#type, "size": e.size, "mode": e.mode,
                   "uid": e.uid, "gid": e.gid, "symlink_target": e.symlink_target})
        })
        .collect()
}

fn rest_entries_json(v: &Value) -> Value {
    v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            json!({"name": e["name"], "type": e["type"], "size": e["size"], "mode": e["mode"],
                   "uid": e["uid"], "gid": e["gid"],
                   "symlink_target": e.get("symlink_target").cloned().unwrap_or(Value::Null)})
        })
        .collect()
}

const VF: &str = "/v1/sandbox/volumes/parity/files";

fn vfile(path: &str) -> pb::VolumeFileRequest {
    pb::VolumeFileRequest {
        volume: "parity".into(),
        path: path.into(),
    }
}

/// A volume file written over gRPC with `meta`, in two data parts.
async fn grpc_volume_write(
    c: &mut Client,
    path: &str,
    data: &[u8],
    meta: pb::VolumeFileMeta,
) -> Result<tonic::Response<pb::FileEntry>, tonic::Status> {
    use pb::write_volume_file_request::Part;
    let (a, b) = data.split_at(data.len() / 2);
    let parts = [
        Part::Header(pb::WriteVolumeFileHeader {
            volume: "parity".into(),
            path: path.into(),
            overwrite: false,
            meta: Some(meta),
            size: Some(data.len() as u64),
        }),
        Part::Data(a.to_vec()),
        Part::Data(b.to_vec()),
    ]
    .map(|p| pb::WriteVolumeFileRequest { part: Some(p) });
    c.write_volume_file(authed(KEY1, futures::stream::iter(parts)))
        .await
}

async fn grpc_volume_read(c: &mut Client, path: &str) -> Vec<u8> {
    use futures::StreamExt as _;
    let mut chunks = ok(c.read_volume_file(authed(KEY1, vfile(path))).await);
    let mut data = Vec::new();
    while let Some(chunk) = chunks.next().await {
        data.extend(chunk.expect("chunk").data);
    }
    data
}

/// The session-less file API of volume `parity` over both faces: what one writes the other
/// reads, lists and stats alike, and both refuse the same way.
async fn volume_files_agree(d: &Daemon, c: &mut Client) {
    let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let rest_put = d
        .req(
            Method::PUT,
            &format!("{VF}?path=/r/rest.bin&mode=416"),
            KEY1,
        )
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(rest_put.status(), StatusCode::NOT_FOUND, "no parent /r yet");
    let (st, dir) = d
        .json(
            Method::POST,
            &format!("{VF}/mkdir"),
            json!({"path": "/r", "uid": 0}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{dir}");
    let gdir = ok(c
        .make_volume_dir(authed(
            KEY1,
            pb::MakeVolumeDirRequest {
                volume: "parity".into(),
                path: "/g".into(),
                parents: false,
                meta: Some(pb::VolumeFileMeta {
                    uid: Some(0),
                    ..Default::default()
                }),
            },
        ))
        .await);
    assert_eq!(
        (gdir.r#type.as_str(), gdir.mode, gdir.uid, gdir.gid),
        ("dir", dir["mode"].as_u64().unwrap() as u32, 0, 0)
    );
    let rest_put = d
        .req(Method::PUT, &format!("{VF}?path=/r/f.bin&mode=416"), KEY1)
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(rest_put.status(), StatusCode::CREATED);
    let meta = pb::VolumeFileMeta {
        mode: Some(0o640),
        ..Default::default()
    };
    let g = ok(grpc_volume_write(c, "/g/f.bin", &body, meta).await);
    assert_eq!(grpc_volume_read(c, "/r/f.bin").await, body);
    let rest_get = d
        .req(Method::GET, &format!("{VF}?path=/g/f.bin"), KEY1)
        .send()
        .await
        .unwrap();
    assert_eq!(rest_get.bytes().await.unwrap(), body);
    let (_, rest_stat) = d
        .json(
            Method::GET,
            &format!("{VF}/stat?path=/r/f.bin"),
            Value::Null,
        )
        .await;
    let gstat = ok(c.stat_volume_file(authed(KEY1, vfile("/g/f.bin"))).await);
    assert_eq!(
        rest_entries_json(&json!({ "entries": [rest_stat] })),
        entries_json(std::slice::from_ref(&gstat))
    );
    assert_eq!(entries_json(&[g]), entries_json(&[gstat]));

    // Metadata, then the listing of the root, two levels deep.
    let (st, chmod) = d
        .json(
            Method::PATCH,
            &format!("{VF}?path=/r/f.bin"),
            json!({"mode": 0o600, "uid": 0}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{chmod}");
    let gchmod = ok(c
        .set_volume_file_metadata(authed(
            KEY1,
            pb::SetVolumeFileMetadataRequest {
                volume: "parity".into(),
                path: "/g/f.bin".into(),
                meta: Some(pb::VolumeFileMeta {
                    uid: Some(0),
                    gid: None,
                    mode: Some(0o600),
                }),
            },
        ))
        .await);
    assert_eq!((gchmod.mode & 0o7777, gchmod.uid), (0o600, 0));
    let (_, rest_list) = d
        .json(
            Method::GET,
            &format!("{VF}/list?path=/&depth=2"),
            Value::Null,
        )
        .await;
    let glist = ok(c
        .list_volume_files(authed(
            KEY1,
            pb::ListVolumeFilesRequest {
                volume: "parity".into(),
                path: "/".into(),
                depth: Some(2),
            },
        ))
        .await);
    let names = |v: Value| {
        let mut v: Vec<Value> = v.as_array().unwrap().clone();
        v.sort_by_key(|e| e["name"].to_string());
        v
    };
    assert_eq!(
        names(rest_entries_json(&rest_list)),
        names(entries_json(&glist.entries))
    );

    // The same refusals: an existing file without overwrite, a missing path, a bad depth.
    let exists = grpc_volume_write(c, "/r/f.bin", b"x", pb::VolumeFileMeta::default())
        .await
        .unwrap_err();
    let rest_exists = d
        .req(Method::PUT, &format!("{VF}?path=/g/f.bin"), KEY1)
        .body("x")
        .send()
        .await
        .unwrap();
    let rest_refusals = [
        (
            rest_exists.status(),
            rest_exists.json::<Value>().await.unwrap(),
        ),
        d.json(Method::GET, &format!("{VF}/stat?path=/nope"), Value::Null)
            .await,
        d.json(
            Method::GET,
            &format!("{VF}/list?path=/&depth=0"),
            Value::Null,
        )
        .await,
    ];
    let grpc_refusals = [
        exists,
        c.stat_volume_file(authed(KEY1, vfile("/nope")))
            .await
            .unwrap_err(),
        c.list_volume_files(authed(
            KEY1,
            pb::ListVolumeFilesRequest {
                volume: "parity".into(),
                path: "/".into(),
                depth: Some(0),
            },
        ))
        .await
        .unwrap_err(),
    ];
    for ((status, body), e) in rest_refusals.into_iter().zip(grpc_refusals) {
        assert_eq!(
            failure(&e),
            (grpc_code(status), error_code(&body).to_string()),
            "{body}"
        );
    }

    // Deleting over one face is seen over the other.
    let del = d
        .req(Method::DELETE, &format!("{VF}?path=/g"), KEY1)
        .send()
        .await
        .unwrap();
    assert_eq!(del.status(), StatusCode::NO_CONTENT);
    ok(c.delete_volume_file(authed(KEY1, vfile("/r"))).await);
    let empty = ok(c
        .list_volume_files(authed(
            KEY1,
            pb::ListVolumeFilesRequest {
                volume: "parity".into(),
                path: "/".into(),
                depth: None,
            },
        ))
        .await);
    let (_, rest_empty) = d
        .json(Method::GET, &format!("{VF}/list?path=/"), Value::Null)
        .await;
    assert_eq!(rest_entries_json(&rest_empty), entries_json(&empty.entries));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_and_grpc_agree() {
    let Some(()) = root_or_skip() else { return };
    let (d, mut c, _) = start(BASE_CONFIG).await;

    // The same session over both.
    let (status, rest) = d
        .json(
            Method::POST,
            S,
            json!({"language": "python", "timeout_s": 600, "metadata": {"k": "v"},
                   "limits": {"memory_mib": 256, "pids": 64}, "env": {"GREETING": "hi"}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{rest}");
    let grpc = create(
        &mut c,
        KEY1,
        pb::CreateSessionRequest {
            language: Some("python".into()),
            timeout_s: Some(600),
            metadata: [("k".to_string(), "v".to_string())].into(),
            limits: Some(pb::Limits {
                memory_mib: Some(256),
                pids: Some(64),
                ..Default::default()
            }),
            env: [("GREETING".to_string(), "hi".to_string())].into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(rest_session_json(&rest), session_json(&grpc));
    let rest_id = rest["id"].as_str().unwrap().to_string();
    let (_, got) = d
        .json(Method::GET, &format!("{S}/{}", grpc.id), Value::Null)
        .await;
    assert_eq!(
        rest_session_json(&got),
        session_json(&grpc),
        "REST reads the gRPC session"
    );

    // The same execs on each session, each over its own face.
    let cases = [
        json!({"shell": "echo $GREETING; echo warn >&2; exit 2"}),
        json!({"cmd": ["/bin/echo", "a", "b"]}),
        json!({"code": "print(6 * 7)"}),
        json!({"shell": "cat", "stdin": "piped"}),
        json!({"shell": "pwd; echo $X", "cwd": "/tmp", "env": {"X": "y"}}),
        json!({"shell": "kill -9 $$"}),
        json!({"shell": "sleep 5", "timeout_ms": 300}),
    ];
    for case in &cases {
        let rest_r = d.exec(&rest_id, case.clone()).await;
        let mut req: pb::ExecRequest = pb::ExecRequest {
            session_id: grpc.id.clone(),
            cmd: case["cmd"]
                .as_array()
                .map(|a| a.iter().map(|x| x.as_str().unwrap().to_string()).collect())
                .unwrap_or_default(),
            shell: case["shell"].as_str().map(String::from),
            code: case["code"].as_str().map(String::from),
            stdin: case["stdin"].as_str().map(String::from),
            cwd: case["cwd"].as_str().map(String::from),
            timeout_ms: case["timeout_ms"].as_u64(),
            ..Default::default()
        };
        if let Some(env) = case["env"].as_object() {
            req.env = env
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect();
        }
        let grpc_r = c.exec(authed(KEY1, req)).await.unwrap().into_inner();
        assert_eq!(rest_exec_json(&rest_r), exec_json(&grpc_r), "{case}");
    }

    // The same files, listed over both faces on both sessions.
    for id in [&rest_id, &grpc.id] {
        exec(
            &mut c,
            KEY1,
            id,
            "mkdir -p /tmp/p/sub && printf abc > /tmp/p/a.txt && ln -s a.txt /tmp/p/link \
             && chmod 640 /tmp/p/a.txt",
        )
        .await;
    }
    let mut lists = Vec::new();
    for id in [&rest_id, &grpc.id] {
        let (status, v) = d
            .json(
                Method::GET,
                &format!("{S}/{id}/files/list?path=/tmp/p&depth=2"),
                Value::Null,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        let g = c
            .list_files(authed(
                KEY1,
                pb::ListFilesRequest {
                    session_id: id.clone(),
                    path: "/tmp/p".into(),
                    depth: Some(2),
                },
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(rest_entries_json(&v), entries_json(&g.entries));
        assert_eq!(v["truncated"], g.truncated);
        lists.push(entries_json(&g.entries));
    }
    assert_eq!(lists[0], lists[1]);

    // The same failures carry the same codes.
    let missing = "/tmp/p/none";
    let failures: Vec<(StatusCode, Value, tonic::Status)> = vec![
        {
            let (st, v) = d
                .json(Method::POST, &format!("{S}/{rest_id}/exec"), json!({}))
                .await;
            let e = c
                .exec(authed(
                    KEY1,
                    pb::ExecRequest {
                        session_id: grpc.id.clone(),
                        ..Default::default()
                    },
                ))
                .await
                .unwrap_err();
            (st, v, e)
        },
        {
            let (st, v) = d
                .json(Method::GET, &format!("{S}/no-such-session"), Value::Null)
                .await;
            let e = c
                .get_session(authed(
                    KEY1,
                    pb::GetSessionRequest {
                        session_id: "no-such-session".into(),
                    },
                ))
                .await
                .unwrap_err();
            (st, v, e)
        },
        {
            let (st, v) = d
                .json_as(KEY2, Method::GET, &format!("{S}/{rest_id}"), Value::Null)
                .await;
            let e = c
                .get_session(authed(
                    KEY2,
                    pb::GetSessionRequest {
                        session_id: grpc.id.clone(),
                    },
                ))
                .await
                .unwrap_err();
            (st, v, e)
        },
        {
            let (st, v) = d
                .json_as("not-a-key-12345", Method::GET, S, Value::Null)
                .await;
            let e = c
                .list_sessions(authed("not-a-key-12345", pb::ListSessionsRequest {}))
                .await
                .unwrap_err();
            (st, v, e)
        },
        {
            let (st, v) = d
                .json(
                    Method::POST,
                    &format!("{S}/{rest_id}/exec"),
                    json!({"shell": "true", "timeout_ms": 0}),
                )
                .await;
            let mut req = shell(&grpc.id, "true");
            req.timeout_ms = Some(0);
            let e = c.exec(authed(KEY1, req)).await.unwrap_err();
            (st, v, e)
        },
        {
            let (st, v) = d
                .json(
                    Method::DELETE,
                    &format!("{S}/{rest_id}/files?path={missing}"),
                    Value::Null,
                )
                .await;
            let e = c
                .delete_file(authed(
                    KEY1,
                    pb::DeleteFileRequest {
                        session_id: grpc.id.clone(),
                        path: missing.into(),
                        recursive: false,
                    },
                ))
                .await
                .unwrap_err();
            (st, v, e)
        },
        {
            let (st, v) = d
                .json(
                    Method::POST,
                    S,
                    json!({"from_snapshot": "snap-0000000000000000"}),
                )
                .await;
            let e = c
                .create_session(authed(
                    KEY1,
                    pb::CreateSessionRequest {
                        from_snapshot: Some("snap-0000000000000000".into()),
                        ..Default::default()
                    },
                ))
                .await
                .unwrap_err();
            (st, v, e)
        },
    ];
    for (status, body, e) in failures {
        let (code, sandbox) = failure(&e);
        assert_eq!(sandbox, error_code(&body), "{body} vs {e:?}");
        assert_eq!(code, grpc_code(status), "{body} vs {e:?}");
        assert!(
            e.message()
                .ends_with(body["error"]["message"].as_str().unwrap()),
            "{body} vs {e:?}"
        );
    }

    // Ending either session is seen the same over both faces.
    d.json(Method::DELETE, &format!("{S}/{}", grpc.id), Value::Null)
        .await;
    c.delete_session(authed(
        KEY1,
        pb::DeleteSessionRequest {
            session_id: rest_id.clone(),
        },
    ))
    .await
    .unwrap();
    for id in [&rest_id, &grpc.id] {
        let (status, v) = d.json(Method::GET, &format!("{S}/{id}"), Value::Null).await;
        let g = c
            .get_session(authed(
                KEY1,
                pb::GetSessionRequest {
                    session_id: id.clone(),
                },
            ))
            .await;
        match g {
            Ok(s) => {
                assert_eq!(status, StatusCode::OK);
                assert_eq!(rest_session_json(&v), session_json(&s.into_inner()));
            }
            Err(e) => {
                assert_eq!(grpc_code(status), e.code());
                assert_eq!(error_code(&v), failure(&e).1);
            }
        }
    }

    // A volume made over REST reads the same over gRPC, and a session mounting it is the same
    // session over both.
    let (status, vol) = d
        .json(
            Method::POST,
            "/v1/sandbox/volumes",
            json!({"name": "parity", "size_mib": 64}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{vol}");
    let got = ok(c
        .get_volume(authed(
            KEY1,
            pb::GetVolumeRequest {
                volume: "parity".into(),
            },
        ))
        .await);
    assert_eq!(
        (
            got.volume_id.as_str(),
            got.name.as_str(),
            got.size_mib,
            got.backend.as_str()
        ),
        (
            vol["volume_id"].as_str().unwrap(),
            "parity",
            vol["size_mib"].as_u64().unwrap(),
            vol["backend"].as_str().unwrap()
        )
    );
    volume_files_agree(&d, &mut c).await;
    let mounted = create(
        &mut c,
        KEY1,
        pb::CreateSessionRequest {
            volumes: vec![pb::VolumeMount {
                name: "parity".into(),
                path: "/data".into(),
                read_only: true,
            }],
            ..Default::default()
        },
    )
    .await;
    let (_, rest_view) = d
        .json(Method::GET, &format!("{S}/{}", mounted.id), Value::Null)
        .await;
    assert_eq!(rest_session_json(&rest_view), session_json(&mounted));
    assert_eq!(mounted.volumes.len(), 1, "{mounted:?}");
}
