use serde_json::{json, Value};

use super::*;
use crate::reply::parse;

fn args<T: serde::de::DeserializeOwned + JsonSchema + 'static>(v: Value) -> Result<T, ToolError> {
    let Value::Object(map) = v else {
        panic!("test arguments must be an object")
    };
    parse::<T>(map)
}

fn refused<T: std::fmt::Debug>(r: Result<T, ToolError>, needle: &str) {
    match r {
        Err(e) => {
            assert_eq!(e.code, "SANDBOX-INVALID-ARGUMENT", "{e}");
            assert!(
                e.message.contains(needle),
                "{needle:?} not in {:?}",
                e.message
            );
        }
        Ok(v) => panic!("accepted {v:?}, expected an error about {needle:?}"),
    }
}

#[test]
fn run_code_maps_to_an_exec_request() {
    let a: RunCodeArgs = args(json!({
        "session_id": "0123abcd",
        "language": "python",
        "code": "print(6*7)",
        "timeout_ms": 5000,
        "env": {"A_1": "x"},
        "cwd": "/tmp",
        "user": "user"
    }))
    .unwrap();
    let (id, req) = a.request().unwrap();
    assert_eq!(id, "0123abcd");
    assert_eq!(req.code.as_deref(), Some("print(6*7)"));
    assert_eq!(req.language.as_deref(), Some("python"));
    assert_eq!(req.timeout_ms, Some(5000));
    assert_eq!(req.cwd.as_deref(), Some("/tmp"));
    assert_eq!(req.user.as_deref(), Some("user"));
    assert_eq!(req.env.get("A_1").map(String::as_str), Some("x"));
    assert!(req.cmd.is_none() && req.shell.is_none() && !req.background);
}

#[test]
fn unknown_and_mistyped_arguments_are_tool_errors() {
    refused(
        args::<RunCodeArgs>(json!({"session_id": "s", "code": "1", "timeout": 5})),
        "unknown argument \"timeout\"",
    );
    refused(
        args::<RunCodeArgs>(json!({"session_id": "s", "code": "1", "language": "ruby"})),
        "unknown variant `ruby`",
    );
    refused(
        args::<RunCodeArgs>(json!({"session_id": "s"})),
        "missing field `code`",
    );
    refused(
        args::<RunCodeArgs>(json!({"session_id": 7, "code": "1"})),
        "invalid type",
    );
    refused(
        args::<ReadFileArgs>(json!({"session_id": "s", "path": "/a", "max_bytes": -1})),
        "invalid value",
    );
    // A hostile key cannot flood the message.
    let long = "k".repeat(10_000);
    let err = args::<SessionArgs>(json!({"session_id": "s", long.clone(): 1})).unwrap_err();
    assert!(err.message.len() < 300, "{}", err.message.len());
}

#[test]
fn ids_must_look_like_the_daemons() {
    for bad in ["", ".", "..", "a/b", "a b", "a\0b", "ünï", "a?b", "%2F"] {
        refused(
            SessionArgs {
                session_id: bad.into(),
            }
            .checked(),
            "session_id must be",
        );
    }
    refused(
        SessionArgs {
            session_id: "x".repeat(129),
        }
        .checked(),
        "session_id must be",
    );
    for good in ["0f3c9a7e2b1d4c5e8f9a0b1c2d3e4f5a", "snap-1", "a_b.c"] {
        assert!(SessionArgs {
            session_id: good.into()
        }
        .checked()
        .is_ok());
    }
    refused(
        ReadOutputArgs {
            session_id: "s".into(),
            process_id: "../x".into(),
            wait_ms: None,
        }
        .checked(),
        "process_id must be",
    );
}

#[test]
fn commands_need_exactly_one_form() {
    let cmd = |v: Value| args::<RunCommandArgs>(v).and_then(RunCommandArgs::request);
    refused(
        cmd(json!({"session_id": "s"})),
        "exactly one of command and argv",
    );
    refused(
        cmd(json!({"session_id": "s", "command": "ls", "argv": ["ls"]})),
        "exactly one of command and argv",
    );
    refused(
        cmd(json!({"session_id": "s", "command": "  "})),
        "must not be empty",
    );
    refused(
        cmd(json!({"session_id": "s", "argv": []})),
        "must name a program",
    );
    refused(cmd(json!({"session_id": "s", "argv": [""]})), "argv[0]");
    refused(
        cmd(json!({"session_id": "s", "argv": ["ls", "a\u{0}b"]})),
        "NUL",
    );
    let (_, req) = cmd(json!({"session_id": "s", "argv": ["ls", "-l"]})).unwrap();
    assert_eq!(req.cmd, Some(vec!["ls".to_string(), "-l".to_string()]));
    let (_, req) = cmd(json!({"session_id": "s", "command": "echo hi | wc -c"})).unwrap();
    assert_eq!(req.shell.as_deref(), Some("echo hi | wc -c"));
    let huge = "x".repeat(MAX_CODE_BYTES + 1);
    refused(cmd(json!({"session_id": "s", "command": huge})), "at most");
}

#[test]
fn exec_options_are_bounded() {
    let run = |extra: Value| {
        let mut v = json!({"session_id": "s", "code": "1"});
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        args::<RunCodeArgs>(v).and_then(RunCodeArgs::request)
    };
    refused(run(json!({"timeout_ms": 0})), "timeout_ms must be between");
    refused(run(json!({"timeout_ms": MAX_TIMEOUT_MS + 1})), "timeout_ms");
    refused(run(json!({"env": {"1X": "v"}})), "not a variable name");
    refused(run(json!({"env": {"A=B": "v"}})), "not a variable name");
    refused(run(json!({"env": {"": "v"}})), "not a variable name");
    refused(run(json!({"env": {"A": "v\u{0}"}})), "NUL");
    refused(run(json!({"cwd": ""})), "cwd must not be empty");
    refused(run(json!({"cwd": "/a\u{0}"})), "NUL");
    refused(
        run(json!({"cwd": format!("/{}", "a".repeat(5000))})),
        "at most",
    );
    refused(run(json!({"user": "admin"})), "unknown variant");
    let many: serde_json::Map<String, Value> = (0..=MAX_ENV)
        .map(|i| (format!("V{i}"), json!("x")))
        .collect();
    refused(run(json!({ "env": many })), "at most 256 variables");
}

#[test]
fn create_session_checks_network_and_limits() {
    let create = |v: Value| args::<CreateSessionArgs>(v).and_then(CreateSessionArgs::request);
    let req = create(json!({})).unwrap();
    assert_eq!(req, CreateSession::default());
    let req = create(json!({"language": "node", "memory_mib": 256, "timeout_s": 60})).unwrap();
    assert_eq!(req.language.as_deref(), Some("node"));
    assert_eq!(req.limits.and_then(|l| l.memory_mib), Some(256));
    assert_eq!(req.timeout_s, Some(60));
    refused(create(json!({"timeout_s": 0})), "timeout_s must be between");
    refused(
        create(json!({"network": "allowlist"})),
        "needs at least one host",
    );
    refused(
        create(json!({"allow": ["pypi.org"]})),
        "only used with network: allowlist",
    );
    refused(
        create(json!({"network": "open", "allow": ["a"]})),
        "only used with",
    );
    let req = create(json!({"network": "allowlist", "allow": ["pypi.org"]})).unwrap();
    let net = req.network.unwrap();
    assert_eq!(net.mode, NetworkMode::Allowlist);
    assert_eq!(net.allow, ["pypi.org"]);
    assert_eq!(
        create(json!({"network": "open"}))
            .unwrap()
            .network
            .unwrap()
            .mode,
        NetworkMode::Open
    );
    assert_eq!(create(json!({"network": "none"})).unwrap().network, None);
}

#[test]
fn files_arguments() {
    let write = |v: Value| args::<WriteFileArgs>(v).and_then(WriteFileArgs::checked);
    let (_, path, bytes) = write(
        json!({"session_id": "s", "path": "/w/a.bin", "content": "AAEC", "encoding": "base64"}),
    )
    .unwrap();
    assert_eq!((path.as_str(), bytes), ("/w/a.bin", vec![0, 1, 2]));
    let (_, path, bytes) =
        write(json!({"session_id": "s", "path": "rel.txt", "content": "hé"})).unwrap();
    assert_eq!(
        (path.as_str(), bytes),
        ("rel.txt", "hé".as_bytes().to_vec())
    );
    refused(
        write(json!({"session_id": "s", "path": "/a", "content": "!!", "encoding": "base64"})),
        "not valid base64",
    );
    refused(
        write(json!({"session_id": "s", "path": "", "content": ""})),
        "path must not be empty",
    );
    let huge = "x".repeat(MAX_WRITE_BYTES + 1);
    refused(
        write(json!({"session_id": "s", "path": "/a", "content": huge})),
        "at most",
    );

    let read = |v: Value| args::<ReadFileArgs>(v).and_then(ReadFileArgs::checked);
    assert_eq!(
        read(json!({"session_id": "s", "path": "/a"})).unwrap().2,
        DEFAULT_READ_BYTES
    );
    refused(
        read(json!({"session_id": "s", "path": "/a", "max_bytes": 0})),
        "max_bytes",
    );
    refused(
        read(json!({"session_id": "s", "path": "/a", "max_bytes": MAX_READ_BYTES + 1})),
        "max_bytes",
    );

    let list = |v: Value| args::<ListFilesArgs>(v).and_then(ListFilesArgs::checked);
    assert_eq!(list(json!({"session_id": "s"})).unwrap().1, WORKDIR);
    refused(list(json!({"session_id": "s", "depth": 0})), "depth");
    refused(list(json!({"session_id": "s", "depth": 11})), "depth");
}

#[test]
fn process_arguments() {
    let read = |v: Value| args::<ReadOutputArgs>(v).and_then(ReadOutputArgs::checked);
    assert_eq!(
        read(json!({"session_id": "s", "process_id": "p"}))
            .unwrap()
            .2,
        DEFAULT_WAIT_MS
    );
    refused(
        read(json!({"session_id": "s", "process_id": "p", "wait_ms": MAX_WAIT_MS + 1})),
        "wait_ms",
    );
    let stop = |v: Value| args::<StopProcessArgs>(v).and_then(StopProcessArgs::checked);
    assert_eq!(
        stop(json!({"session_id": "s", "process_id": "p"}))
            .unwrap()
            .2,
        "SIGTERM"
    );
    assert_eq!(
        stop(json!({"session_id": "s", "process_id": "p", "signal": "9"}))
            .unwrap()
            .2,
        "9"
    );
    refused(
        stop(json!({"session_id": "s", "process_id": "p", "signal": "TERM; rm -rf /"})),
        "signal",
    );
    refused(
        stop(json!({"session_id": "s", "process_id": "p", "signal": ""})),
        "signal",
    );
}

#[test]
fn flattened_options_are_in_the_schema() {
    let schema = crate::reply::input_schema::<RunCodeArgs>();
    let props = schema["properties"].as_object().unwrap();
    for name in [
        "session_id",
        "language",
        "code",
        "cwd",
        "env",
        "stdin",
        "timeout_ms",
        "user",
    ] {
        assert!(props.contains_key(name), "{name} missing from {props:?}");
    }
    let required: Vec<&str> = schema["required"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(required, ["session_id", "code"]);
}

#[test]
fn a_preview_port_is_optional_and_bounded() {
    let p = args::<PreviewArgs>(json!({"session_id": "s"})).unwrap();
    assert_eq!(p.checked().unwrap(), ("s".to_string(), None));
    let p = args::<PreviewArgs>(json!({"session_id": "s", "port": 8000})).unwrap();
    assert_eq!(p.checked().unwrap(), ("s".to_string(), Some(8000)));
    refused(
        args::<PreviewArgs>(json!({"session_id": "s", "port": 0})).and_then(PreviewArgs::checked),
        "port must be between 1 and 65535",
    );
    assert!(args::<PreviewArgs>(json!({"session_id": "s", "port": 70000})).is_err());
    let schema = serde_json::to_value(schemars::schema_for!(PreviewArgs)).unwrap();
    assert!(
        schema["properties"]["port"]["description"].is_string(),
        "{schema}"
    );
}

#[test]
fn run_cell_goes_to_a_context_or_a_languages_context() {
    let a: RunCellArgs = args(json!({
        "session_id": "s1", "code": "x = 1", "timeout_ms": 900, "env": {"A": "b"}
    }))
    .unwrap();
    let (id, target, run) = a.checked().unwrap();
    assert_eq!(
        (id.as_str(), target),
        ("s1", CellTarget::Language(CellLanguage::Python))
    );
    assert_eq!((run.code.as_str(), run.timeout_ms), ("x = 1", Some(900)));
    assert_eq!(run.env.get("A").map(String::as_str), Some("b"));
    let a: RunCellArgs =
        args(json!({"session_id": "s1", "code": "1", "language": "typescript"})).unwrap();
    assert_eq!(
        a.checked().unwrap().1,
        CellTarget::Language(CellLanguage::Typescript)
    );
    let a: RunCellArgs =
        args(json!({"session_id": "s1", "code": "1", "context_id": "c-1"})).unwrap();
    assert_eq!(a.checked().unwrap().1, CellTarget::Context("c-1".into()));
    let both = json!({"session_id": "s1", "code": "1", "context_id": "c", "language": "r"});
    refused(
        args::<RunCellArgs>(both).and_then(RunCellArgs::checked),
        "not both",
    );
    let hostile = json!({"session_id": "s1", "code": "1", "context_id": "../x"});
    refused(
        args::<RunCellArgs>(hostile).and_then(RunCellArgs::checked),
        "context_id",
    );
    let blank = json!({"session_id": "s1", "code": "  "});
    refused(
        args::<RunCellArgs>(blank).and_then(RunCellArgs::checked),
        "code must not be empty",
    );
    let cobol = json!({"session_id": "s1", "code": "1", "language": "cobol"});
    refused(args::<RunCellArgs>(cobol), "unknown variant `cobol`");
}

#[test]
fn snapshot_restore_and_fork_arguments_are_checked() {
    let a: SnapshotArgs = args(json!({"session_id": "s1", "name": "before-change"})).unwrap();
    assert_eq!(
        a.checked().unwrap(),
        ("s1".into(), Some("before-change".into()))
    );
    let a: SnapshotArgs = args(json!({"session_id": "s1"})).unwrap();
    assert_eq!(a.checked().unwrap().1, None);
    let bad = json!({"session_id": "s1", "name": "a/b"});
    refused(
        args::<SnapshotArgs>(bad).and_then(SnapshotArgs::checked),
        "name",
    );
    let a: RestoreArgs = args(json!({"session_id": "s1", "snapshot_id": "snap-1"})).unwrap();
    assert_eq!(a.checked().unwrap(), ("s1".into(), "snap-1".into()));
    let bad = json!({"session_id": "s1", "snapshot_id": ".."});
    refused(
        args::<RestoreArgs>(bad).and_then(RestoreArgs::checked),
        "snapshot_id",
    );
    let a: ForkArgs = args(json!({"session_id": "s1"})).unwrap();
    assert_eq!(a.checked().unwrap(), ("s1".into(), 1));
    for count in [0, 101] {
        let bad = json!({"session_id": "s1", "count": count});
        refused(
            args::<ForkArgs>(bad).and_then(ForkArgs::checked),
            "count must be between 1 and 100",
        );
    }
    let a: CreateSessionArgs = args(json!({"from_snapshot": "snap-1"})).unwrap();
    assert_eq!(
        a.request().unwrap().from_snapshot.as_deref(),
        Some("snap-1")
    );
    let bad = json!({"from_snapshot": "a b"});
    refused(
        args::<CreateSessionArgs>(bad).and_then(CreateSessionArgs::request),
        "from_snapshot",
    );
}
