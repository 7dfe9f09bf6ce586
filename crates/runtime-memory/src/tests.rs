use koder_agent_protocol::{
    ClientError, EntryKind, ErrorCode, ExecRequest, FromAgent, ToAgent, WriteFileRequest,
};

use super::*;

fn spec(id: &str) -> SandboxSpec {
    SandboxSpec {
        id: id.into(),
        image: "host".into(),
        ..SandboxSpec::default()
    }
}

fn req(argv: &[&str]) -> ExecRequest {
    ExecRequest {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        output_limit_bytes: 1 << 20,
        ..ExecRequest::default()
    }
}

fn agent_code(e: ClientError) -> ErrorCode {
    match e {
        ClientError::Agent(e) => e.code,
        other => panic!("not an agent error: {other}"),
    }
}

#[tokio::test]
async fn builtin_execs_answer_like_a_shell() {
    let rt = MemoryRuntime::new();
    let sb = rt.create(spec("a")).await.unwrap();
    let agent = sb.agent();
    assert_eq!(agent.health().await.unwrap().agent_version, "memory");

    let out = agent
        .exec_collect(req(&["echo", "hi", "there"]))
        .await
        .unwrap();
    assert_eq!(out.stdout, b"hi there\n");
    assert_eq!(out.exit.exit_code, Some(0));
    let out = agent
        .exec_collect(req(&["/bin/bash", "-c", "exit 4"]))
        .await
        .unwrap();
    assert_eq!(out.exit.exit_code, Some(4));
    let out = agent
        .exec_collect(req(&["sh", "-c", "frobnicate x"]))
        .await
        .unwrap();
    assert_eq!(out.exit.exit_code, Some(127));
    assert_eq!(out.stderr, b"frobnicate: command not found\n");
    let mut cat = req(&["cat"]);
    cat.stdin = b"piped".to_vec();
    assert_eq!(agent.exec_collect(cat).await.unwrap().stdout, b"piped");
    let err = agent.exec_collect(req(&["frobnicate"])).await.unwrap_err();
    assert_eq!(agent_code(err), ErrorCode::SpawnFailed);
}

#[tokio::test]
async fn a_script_decides_and_output_is_bounded() {
    let script: ExecScript = Arc::new(|r| {
        Ok(Scripted::exit(r.argv.len() as i32)
            .stdout(vec![b'x'; 200_000])
            .stderr("warn"))
    });
    let rt = MemoryRuntime::new().with_script(script);
    let sb = rt.create(spec("a")).await.unwrap();
    let mut r = req(&["a", "b", "c"]);
    r.output_limit_bytes = 100_000;
    let out = sb.agent().exec_collect(r).await.unwrap();
    assert_eq!(out.exit.exit_code, Some(3));
    assert_eq!(out.stdout.len(), 100_000);
    assert!(out.stdout_truncated && !out.stderr_truncated);
    assert_eq!(out.stderr, b"warn");
}

#[tokio::test(start_paused = true)]
async fn timeouts_signals_and_kill_all_end_a_running_exec() {
    let rt = MemoryRuntime::new();
    let sb = rt.create(spec("a")).await.unwrap();
    let agent = sb.agent().clone();

    let mut r = req(&["sleep", "60"]);
    r.timeout_ms = Some(1000);
    let out = agent.exec_collect(r).await.unwrap();
    assert!(out.exit.timed_out);
    assert_eq!((out.exit.exit_code, out.exit.signal), (None, Some(9)));

    let mut stream = agent.exec(req(&["sleep", "60"])).await.unwrap();
    assert!(matches!(
        stream.recv().await.unwrap(),
        FromAgent::Started { .. }
    ));
    stream.send(ToAgent::Signal(15)).await.unwrap();
    match stream.recv().await.unwrap() {
        FromAgent::Exited(e) => assert_eq!(e.signal, Some(15)),
        other => panic!("{other:?}"),
    }

    let running = tokio::spawn({
        let agent = agent.clone();
        async move { agent.exec_collect(req(&["sleep", "60"])).await }
    });
    while agent.health().await.unwrap().running_execs == 0 {
        tokio::task::yield_now().await;
    }
    assert_eq!(agent.kill_all().await.unwrap(), 1);
    let out = running.await.unwrap().unwrap();
    assert_eq!(out.exit.signal, Some(9));
    assert!(!out.exit.timed_out);
    // Later execs are not affected by the earlier KillAll.
    let out = agent.exec_collect(req(&["true"])).await.unwrap();
    assert_eq!(out.exit.exit_code, Some(0));
}

#[tokio::test]
async fn files_live_in_the_sandbox_map() {
    let rt = MemoryRuntime::new();
    let sb = rt.create(spec("a")).await.unwrap();
    let agent = sb.agent();
    let upload = |path: &str, create_parents| WriteFileRequest {
        path: path.into(),
        mode: Some(0o600),
        create_parents,
        max_bytes: Some(10),
        owner: None,
        metadata: Vec::new(),
    };

    let mut w = agent.write_file(upload("notes.txt", false)).await.unwrap();
    w.write(b"hello").await.unwrap();
    let entry = w.finish().await.unwrap();
    assert_eq!(
        (entry.path.as_str(), entry.size, entry.mode),
        ("/workspace/notes.txt", 5, 0o600)
    );
    assert_eq!(
        agent.read_file("/workspace/notes.txt", 100).await.unwrap(),
        b"hello"
    );
    assert_eq!(
        sb_file(&rt, "a", "/workspace/../workspace/notes.txt"),
        Some(b"hello".to_vec())
    );

    let err = agent.write_file(upload("/a/b/c", false)).await.unwrap();
    assert_eq!(
        agent_code(err.finish().await.unwrap_err()),
        ErrorCode::NotFound
    );
    let mut w = agent.write_file(upload("/a/b/c", true)).await.unwrap();
    w.write(b"deep").await.unwrap();
    w.finish().await.unwrap();
    let mut w = agent.write_file(upload("/big", true)).await.unwrap();
    w.write(&[0; 11]).await.unwrap();
    assert_eq!(
        agent_code(w.finish().await.unwrap_err()),
        ErrorCode::TooLarge
    );
    let mut dropped = agent.write_file(upload("/dropped", true)).await.unwrap();
    dropped.write(b"x").await.unwrap();
    drop(dropped);
    assert_eq!(
        agent_code(agent.stat("/dropped").await.unwrap_err()),
        ErrorCode::NotFound
    );
    assert_eq!(
        agent_code(agent.stat("/big").await.unwrap_err()),
        ErrorCode::NotFound
    );

    let (entries, truncated) = agent.list("/a", 0).await.unwrap();
    assert!(!truncated);
    let names: Vec<_> = entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(names, ["/a/b"]);
    let (entries, _) = agent.list("/a", 2).await.unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(agent.stat("/a/b").await.unwrap().kind, EntryKind::Dir);
    let err = agent.read_file("/a/b/c", 2).await.unwrap_err();
    assert_eq!(agent_code(err), ErrorCode::TooLarge);
    assert_eq!(
        agent_code(agent.read_file("/a", 9).await.unwrap_err()),
        ErrorCode::IsADirectory
    );
    assert_eq!(agent.disk_usage().await.unwrap(), (1024 << 20, 9));

    let err = agent
        .open(ToAgent::ListeningPorts)
        .await
        .unwrap()
        .recv()
        .await
        .unwrap_err();
    assert_eq!(agent_code(err), ErrorCode::InvalidRequest);
}

fn sb_file(rt: &MemoryRuntime, id: &str, path: &str) -> Option<Vec<u8>> {
    rt.sandbox(id).unwrap().file(path)
}

#[tokio::test]
async fn usage_limits_and_freezing_are_steerable() {
    let script: ExecScript = Arc::new(|r| {
        Ok(Scripted {
            oom_kill: r.argv[0] == "hog",
            pids_limit_hit: r.argv[0] == "forker",
            ..Scripted::exit(1)
        })
    });
    let rt = MemoryRuntime::new().with_script(script);
    let sb = rt.create(spec("a")).await.unwrap();
    let rc = sb.resources().unwrap();
    let out = sb.agent().exec_collect(req(&["hog"])).await.unwrap();
    assert_eq!((out.exit.exit_code, out.exit.signal), (None, Some(9)));
    sb.agent().exec_collect(req(&["forker"])).await.unwrap();
    let usage = rc.usage().await.unwrap();
    assert_eq!((usage.oom_kills, usage.pids_max_hits), (1, 1));

    let handle = rt.sandbox("a").unwrap();
    handle.set_usage(Usage {
        memory_current_bytes: 10,
        memory_peak_bytes: 50,
        ..usage
    });
    rc.reset_memory_peak().await.unwrap();
    assert_eq!(rc.usage().await.unwrap().memory_peak_bytes, 10);
    let limits = Limits {
        memory_mib: Some(64),
        ..Limits::default()
    };
    rc.set_limits(&limits).await.unwrap();
    assert_eq!(handle.limits(), limits);
    rc.freeze().await.unwrap();
    assert!(handle.is_frozen());
    rc.thaw().await.unwrap();
    assert!(!handle.is_frozen());

    let bare = MemoryRuntime::new().without_resources();
    assert!(bare.create(spec("b")).await.unwrap().resources().is_none());
}

#[tokio::test]
async fn agent_death_destroy_and_create_failures() {
    let rt = MemoryRuntime::new();
    let a = rt.create(spec("a")).await.unwrap();
    let b = rt.create(spec("b")).await.unwrap();
    rt.sandbox("a").unwrap().kill_agent();
    a.agent().closed().await;
    assert!(matches!(
        a.agent().health().await,
        Err(ClientError::Disconnected)
    ));
    assert!(b.agent().health().await.is_ok());

    let err = rt.create(spec("b")).await.err().unwrap();
    assert!(matches!(err, RuntimeError::InvalidSpec(_)), "{err}");
    assert!(rt.create(spec("-bad")).await.is_err());
    b.destroy().await.unwrap();
    b.destroy().await.unwrap();
    b.agent().closed().await;
    assert!(b.resources().unwrap().usage().await.is_err());
    assert_eq!(rt.live(), ["a"]);
    // A destroyed id can be used again.
    rt.create(spec("b")).await.unwrap();

    rt.fail_next_create(RuntimeError::Exhausted("full".into()));
    let err = rt.create(spec("c")).await.err().unwrap();
    assert!(matches!(err, RuntimeError::Exhausted(_)), "{err}");
    assert!(rt.sandbox("c").is_none());
    rt.create(spec("c")).await.unwrap();

    rt.leave_over(["old-1".to_string()]);
    assert_eq!(rt.reconcile().await.unwrap().sandboxes_removed, ["old-1"]);
    assert!(rt.reconcile().await.unwrap().sandboxes_removed.is_empty());
}
