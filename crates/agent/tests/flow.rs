//! Per-stream credit through the real agent server: a stream whose consumer stalls (a process
//! not reading its stdin, a download nobody reads) stalls only itself, and a daemon that sends
//! beyond its credit loses that stream, not the connection.

mod common;

use std::time::Duration;

use common::{agent, connect, rt};
use futures::{SinkExt, StreamExt};
use koder_agent::serve::server::serve_connection;
use koder_agent_protocol::flow::{self, STREAM_WINDOW};
use koder_agent_protocol::*;
use tokio_util::codec::{FramedRead, FramedWrite};

fn exec(argv: &[&str]) -> ExecRequest {
    ExecRequest {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        output_limit_bytes: 1 << 20,
        ..Default::default()
    }
}

async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .expect("stalled")
}

async fn echo(client: &AgentClient) {
    let out = within(client.exec_collect(exec(&["echo", "still here"])))
        .await
        .unwrap();
    assert_eq!(out.stdout, b"still here\n");
}

#[test]
fn stdin_a_process_does_not_read_stalls_only_its_own_exec() {
    let root = tempfile::tempdir().unwrap();
    let go = root.path().join("go");
    let client = connect(agent(root.path(), &[]));
    rt().block_on(async {
        // Reads nothing until told to, then counts what it was sent.
        let script = format!(
            "while [ ! -e {} ]; do sleep 0.05; done; wc -c",
            go.display()
        );
        let req = ExecRequest {
            keep_stdin_open: true,
            ..exec(&["/bin/sh", "-c", &script])
        };
        let mut stalled = client.exec(req).await.unwrap();
        let stdin = stalled.handle();
        const SENT: usize = 16 << 20; // far more than a pipe, a window and any queue hold
        let feeder = tokio::spawn(async move {
            for _ in 0..SENT / CHUNK_BYTES {
                stdin.send(ToAgent::Stdin(vec![b'x'; CHUNK_BYTES])).await?;
            }
            stdin.send(ToAgent::CloseStdin).await
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !feeder.is_finished(),
            "the process cannot have taken it all"
        );
        echo(&client).await;
        std::fs::write(&go, b"").unwrap();
        within(feeder).await.unwrap().unwrap();
        let mut out = Vec::new();
        loop {
            match within(stalled.recv()).await.unwrap() {
                FromAgent::Started { .. } => {}
                FromAgent::Stdout(d) => out.extend_from_slice(&d),
                FromAgent::Exited(e) => {
                    assert_eq!(e.exit_code, Some(0));
                    break;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(String::from_utf8_lossy(&out).trim(), SENT.to_string());
    });
}

#[test]
fn a_download_nobody_reads_stalls_only_itself_and_then_completes() {
    let root = tempfile::tempdir().unwrap();
    let client = connect(agent(root.path(), &[]));
    let data: Vec<u8> = (0..24u32 << 20).map(|i| (i % 253) as u8).collect();
    std::fs::write(root.path().join("workspace/big"), &data).unwrap();
    rt().block_on(async {
        let mut reader = client.open_read("/workspace/big", u64::MAX).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        echo(&client).await;
        assert!(client.stat("/workspace/big").await.is_ok());
        let mut got = Vec::with_capacity(data.len());
        while let Some(chunk) = within(reader.next_chunk()).await.unwrap() {
            got.extend_from_slice(&chunk);
        }
        assert!(got == data, "download corrupted ({} bytes)", got.len());
    });
}

#[test]
fn files_round_trip_in_large_chunks_of_every_size() {
    let root = tempfile::tempdir().unwrap();
    let client = connect(agent(root.path(), &[]));
    rt().block_on(async {
        for len in [
            0,
            1,
            FILE_CHUNK_BYTES - 1,
            FILE_CHUNK_BYTES,
            3 * FILE_CHUNK_BYTES + 7,
        ] {
            let data: Vec<u8> = (0..len).map(|i| (i % 241) as u8).collect();
            let req = WriteFileRequest {
                path: "/workspace/f".into(),
                mode: None,
                create_parents: false,
                max_bytes: None,
                owner: None,
                metadata: Vec::new(),
            };
            let mut w = client.write_file(req).await.unwrap();
            // Odd write sizes: the writer regroups them into whole chunks.
            for part in data.chunks(10_007) {
                w.write(part).await.unwrap();
            }
            assert_eq!(w.finish().await.unwrap().size, len as u64);
            assert!(std::fs::read(root.path().join("workspace/f")).unwrap() == data);
            let back = client.read_file("/workspace/f", u64::MAX).await.unwrap();
            assert!(back == data, "{len} bytes came back as {}", back.len());
        }
    });
}

#[test]
fn a_daemon_sending_beyond_its_credit_loses_that_stream_only() {
    let root = tempfile::tempdir().unwrap();
    let agent = agent(root.path(), &[]);
    rt().block_on(async move {
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        tokio::spawn(serve_connection(agent, theirs));
        let (r, w) = tokio::io::split(ours);
        let mut frames = FramedRead::new(r, FrameCodec::<FromAgent, ToAgent>::default());
        let mut sink = FramedWrite::new(w, FrameCodec::<FromAgent, ToAgent>::default());
        let req = ExecRequest {
            keep_stdin_open: true,
            ..exec(&["sleep", "30"])
        };
        sink.send(Frame {
            stream: 1,
            msg: ToAgent::Exec(req),
        })
        .await
        .unwrap();
        // Stdin for a process that never reads it, ignoring credit: windows more than the exec
        // takes in before it stalls (its pipe and its stdin queue).
        let chunk = ToAgent::Stdin(vec![0; CHUNK_BYTES]);
        let n = 4 * STREAM_WINDOW / flow::cost(&chunk);
        let flood = async {
            for _ in 0..n {
                sink.send(Frame {
                    stream: 1,
                    msg: chunk.clone(),
                })
                .await
                .unwrap();
            }
            sink
        };
        let read_until_error = async {
            loop {
                let frame = frames.next().await.unwrap().unwrap();
                match frame.msg {
                    FromAgent::Error(e) => {
                        assert_eq!(frame.stream, 1);
                        assert_eq!(e.code, ErrorCode::InvalidRequest);
                        assert!(e.message.contains("credit"), "{}", e.message);
                        return;
                    }
                    // Credit for what the exec took in before it stalled; the flood ignores it.
                    FromAgent::Started { .. } | FromAgent::Exited(_) | FromAgent::Credit(_) => {}
                    other => panic!("unexpected {other:?}"),
                }
            }
        };
        let (mut sink, ()) = within(async { tokio::join!(flood, read_until_error) }).await;
        // The connection still serves new streams.
        sink.send(Frame {
            stream: 2,
            msg: ToAgent::Health,
        })
        .await
        .unwrap();
        loop {
            let frame = within(frames.next()).await.unwrap().unwrap();
            if frame.stream == 2 {
                assert!(matches!(frame.msg, FromAgent::Health(_)));
                break;
            }
        }
    });
}

/// Descriptors of this process (which hosts the agent) open on `path`.
fn open_on(path: &std::path::Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target == path)
        .count()
}

#[test]
fn a_dropped_download_ends_in_the_agent_without_credit() {
    let root = tempfile::tempdir().unwrap();
    let client = connect(agent(root.path(), &[]));
    let big = root.path().join("workspace/big");
    std::fs::write(&big, vec![1u8; 24 << 20]).unwrap();
    rt().block_on(async {
        let reader = client.open_read("/workspace/big", u64::MAX).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(open_on(&big), 1, "the download is open, stalled on credit");
        drop(reader);
        for _ in 0..250 {
            if open_on(&big) == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the agent kept a dropped download open");
    });
}

#[test]
fn a_cancel_sent_while_reading_still_brings_the_exit() {
    let root = tempfile::tempdir().unwrap();
    let client = connect(agent(root.path(), &[]));
    rt().block_on(async {
        let mut s = client.exec(exec(&["sleep", "30"])).await.unwrap();
        assert!(matches!(s.recv().await.unwrap(), FromAgent::Started { .. }));
        s.handle().send(ToAgent::Cancel).await.unwrap();
        let FromAgent::Exited(exit) = within(s.recv()).await.unwrap() else {
            panic!("no exit")
        };
        assert_eq!(exit.signal, Some(libc::SIGKILL));
    });
}
