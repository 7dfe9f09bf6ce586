use std::collections::BTreeSet;

use serde_json::Value;

use super::*;

fn server() -> SandboxMcp {
    // Port 9 (discard) on loopback: nothing listens, so every daemon call fails fast.
    SandboxMcp::new(Client::new("http://127.0.0.1:9", "k").unwrap())
}

fn structured(r: &CallToolResult) -> &Value {
    r.structured_content.as_ref().expect("structured content")
}

#[test]
fn every_tool_is_listed_with_a_description_and_an_object_schema() {
    let tools = SandboxMcp::tool_router().list_all();
    let names: BTreeSet<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    let expected = [
        "create_session",
        "list_sessions",
        "kill_session",
        "run_code",
        "run_cell",
        "snapshot_session",
        "restore_session",
        "fork_session",
        "session_events",
        "run_command",
        "start_process",
        "read_process_output",
        "stop_process",
        "write_file",
        "read_file",
        "list_files",
        "get_preview_url",
    ];
    assert_eq!(names, expected.into_iter().collect());
    for tool in &tools {
        let description = tool.description.as_deref().unwrap_or_default();
        assert!(description.len() > 20, "{}: {description:?}", tool.name);
        assert_eq!(tool.input_schema["type"], "object", "{}", tool.name);
        let props = tool
            .input_schema
            .get("properties")
            .and_then(Value::as_object);
        for (name, prop) in props.into_iter().flatten() {
            // `$ref`s to enums carry their description on the reference's side.
            assert!(
                prop.get("description").is_some(),
                "{}.{name} has no description: {prop}",
                tool.name
            );
        }
    }
}

#[tokio::test]
async fn argument_errors_are_tool_errors_with_the_code() {
    let s = server();
    let r = s
        .run_code(
            Args(Err(ToolError::invalid("missing field `code`"))),
            CancellationToken::new(),
        )
        .await;
    assert_eq!(r.is_error, Some(true));
    assert_eq!(structured(&r)["error"]["code"], "SANDBOX-INVALID-ARGUMENT");
    // Checked before any request: the daemon being down does not matter.
    let r = s
        .kill_session(Args(Ok(crate::args::SessionArgs {
            session_id: "../etc".into(),
        })))
        .await;
    assert_eq!(r.is_error, Some(true));
    assert_eq!(structured(&r)["error"]["code"], "SANDBOX-INVALID-ARGUMENT");
}

#[tokio::test]
async fn an_unreachable_daemon_is_a_transport_tool_error() {
    let r = server().list_sessions().await;
    assert_eq!(r.is_error, Some(true));
    assert_eq!(structured(&r)["error"]["code"], crate::reply::TRANSPORT);
    let text = r.content[0]
        .as_text()
        .map(|t| t.text.as_str())
        .unwrap_or("");
    assert!(text.starts_with("SANDBOX-MCP-TRANSPORT: "), "{text}");
}

fn exit(code: i32, verdict: Option<&str>) -> ExecResult {
    ExecResult {
        exec_id: "e".into(),
        exit_code: Some(code),
        signal: None,
        stdout: String::new(),
        stderr: String::new(),
        stdout_truncated: false,
        stderr_truncated: false,
        duration_ms: 3,
        peak_memory_kib: None,
        verdict: verdict.map(str::to_string),
    }
}

#[test]
fn collected_output_keeps_the_tail_and_the_exit() {
    let mut c = Collected::default();
    assert!(!c.push(ExecEvent::Start {
        exec_id: "e".into()
    }));
    assert!(!c.push(ExecEvent::Stdout(b"hello ".to_vec())));
    assert!(!c.push(ExecEvent::Stderr(b"warn\n".to_vec())));
    assert!(!c.push(ExecEvent::Stdout(b"world\n".to_vec())));
    let out = c.into_output();
    assert_eq!(
        (
            out.state,
            out.stdout.as_str(),
            out.stderr.as_str(),
            out.exit_code
        ),
        ("running", "hello world\n", "warn\n", None)
    );

    let mut c = Collected::default();
    for _ in 0..5 {
        c.push(ExecEvent::Stdout(vec![b'a'; MAX_STREAM_BYTES]));
    }
    c.push(ExecEvent::Stdout(b"END".to_vec()));
    assert!(c.stdout.len() <= 2 * MAX_STREAM_BYTES);
    assert!(c.push(ExecEvent::Exit(exit(137, Some("SANDBOX-EXEC-KILLED-OOM")))));
    let out = c.into_output();
    assert_eq!(out.state, "exited");
    assert_eq!(out.exit_code, Some(137));
    assert_eq!(out.verdict.as_deref(), Some("SANDBOX-EXEC-KILLED-OOM"));
    assert!(out.stdout.ends_with("END") && out.stdout.len() == MAX_STREAM_BYTES);
    assert!(out.stdout_truncated);
}

#[tokio::test]
async fn collect_stops_at_the_exit_or_the_deadline() {
    let events = futures::stream::iter(vec![
        Ok(ExecEvent::Stdout(b"42\n".to_vec())),
        Ok(ExecEvent::Exit(exit(0, None))),
        Ok(ExecEvent::Stdout(b"never read".to_vec())),
    ]);
    let out = collect(events, Duration::from_secs(5))
        .await
        .unwrap()
        .into_output();
    assert_eq!((out.state, out.stdout.as_str()), ("exited", "42\n"));

    // A process that keeps running: what came so far, once the wait is over.
    let events = futures::stream::iter(vec![Ok(ExecEvent::Stdout(b"tick\n".to_vec()))])
        .chain(futures::stream::pending());
    let started = std::time::Instant::now();
    let out = collect(events, Duration::from_millis(50))
        .await
        .unwrap()
        .into_output();
    assert!(started.elapsed() >= Duration::from_millis(50));
    assert_eq!((out.state, out.stdout.as_str()), ("running", "tick\n"));

    let events = futures::stream::iter(vec![Err(koder_sdk::Error::StreamEnded)]);
    let err = collect(events, Duration::from_secs(1)).await.err().unwrap();
    assert_eq!(err.code, crate::reply::TRANSPORT);
}

#[test]
fn exec_output_is_cut_to_its_tail() {
    let mut r = exit(1, Some("SANDBOX-EXEC-TIMEOUT"));
    r.stdout = format!("{}Traceback: boom", "é".repeat(MAX_STREAM_BYTES));
    r.stderr = "err".into();
    let v = ExecView::from(r);
    assert!(v.stdout.ends_with("Traceback: boom"));
    assert!(v.stdout.len() <= MAX_STREAM_BYTES);
    assert!(v.stdout_truncated && !v.stderr_truncated);
    assert_eq!(v.verdict.as_deref(), Some("SANDBOX-EXEC-TIMEOUT"));
}

#[test]
fn file_contents_are_text_or_base64() {
    let f = FileContent::new("/a".into(), b"print(1)\n".to_vec(), false);
    assert_eq!(
        (f.encoding, f.content.as_str(), f.size),
        ("utf8", "print(1)\n", 9)
    );
    let f = FileContent::new("/b".into(), vec![0xff, 0x00, 0x41], false);
    assert_eq!((f.encoding, f.content.as_str()), ("base64", "/wBB"));
    // Cut in the middle of "é": still text, without the half character.
    let f = FileContent::new("/c".into(), vec![b'a', 0xc3], true);
    assert_eq!((f.encoding, f.content.as_str(), f.size), ("utf8", "a", 1));
    // The same bytes, not cut: the file itself is not UTF-8.
    let f = FileContent::new("/d".into(), vec![b'a', 0xc3], false);
    assert_eq!(f.encoding, "base64");
}

#[tokio::test]
async fn a_cancelled_call_stops_waiting() {
    let ct = CancellationToken::new();
    ct.cancel();
    let never = futures::future::pending::<Result<(), ToolError>>();
    let err = unless_cancelled(ct, never).await.unwrap_err();
    assert_eq!(err.code, CANCELLED);
}
