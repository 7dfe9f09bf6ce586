//! An exec's output and outcome: its stdout/stderr as the process printed them (or the result
//! as JSON), the daemon's remarks on stderr, and a shell-style exit status.

use std::io::Write as _;

use futures::{Stream, StreamExt as _};
use koder_sdk::live::ExecEvent;
use koder_sdk::ExecResult;

use crate::error::Result;

/// The shell-style exit status for an exec result.
pub fn exit_status(r: &ExecResult) -> i32 {
    let code = match (r.exit_code, r.signal) {
        (Some(code), _) if (0..=255).contains(&code) => code,
        (None, Some(sig)) if (1..=127).contains(&sig) => 128 + sig,
        _ => 1,
    };
    if code == 0 && r.verdict.is_some() {
        1
    } else {
        code
    }
}

fn describe_verdict(code: &str) -> &'static str {
    match code {
        koder_sdk::codes::EXEC_KILLED_OOM => "killed: out of memory",
        koder_sdk::codes::EXEC_TIMEOUT => "killed: time limit exceeded",
        koder_sdk::codes::EXEC_KILLED_CPU => "killed: CPU limit exceeded",
        koder_sdk::codes::EXEC_KILLED_PIDS => "killed: process limit exceeded",
        koder_sdk::codes::EXEC_KILLED => "killed",
        _ => "ended abnormally",
    }
}

// Write errors (a closed pipe) must not hide the exit status, so they are dropped.
fn write_stdout(bytes: &[u8]) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(bytes);
    let _ = out.flush();
}

fn write_stderr(bytes: &[u8]) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(bytes);
    let _ = err.flush();
}

/// Prints an exec result and returns the process-style exit status.
pub fn print_result(result: &ExecResult, json: bool) -> Result<i32> {
    if json {
        super::print_line(&serde_json::to_string(result)?);
    } else {
        write_stdout(result.stdout.as_bytes());
        write_stderr(result.stderr.as_bytes());
    }
    if result.stdout_truncated {
        eprintln!("ksandbox: stdout was truncated by the daemon");
    }
    if result.stderr_truncated {
        eprintln!("ksandbox: stderr was truncated by the daemon");
    }
    if let Some(verdict) = &result.verdict {
        let signal = result
            .signal
            .map(|s| format!(" (signal {s})"))
            .unwrap_or_default();
        eprintln!("ksandbox: {verdict}: {}{signal}", describe_verdict(verdict));
    }
    Ok(exit_status(result))
}

/// Copies streamed output to stdout/stderr as it arrives; the exit status is the exec's.
/// With `json`, each event is one JSON line instead (`{"event": ..., ...}`).
pub async fn print_stream(
    events: impl Stream<Item = koder_sdk::Result<ExecEvent>>,
    json: bool,
) -> Result<i32> {
    futures::pin_mut!(events);
    while let Some(event) = events.next().await {
        let event = event?;
        if json {
            super::print_line(&event_json(&event)?.to_string());
            if let ExecEvent::Exit(result) = &event {
                return Ok(exit_status(result));
            }
            continue;
        }
        match event {
            ExecEvent::Stdout(b) => write_stdout(&b),
            ExecEvent::Stderr(b) => write_stderr(&b),
            ExecEvent::Truncated { dropped_chunks } => eprintln!(
                "ksandbox: output skipped ({dropped_chunks} chunks) while this client lagged"
            ),
            ExecEvent::Exit(result) => return print_result(&result, false),
            ExecEvent::Start { .. } => {}
        }
    }
    // The SDK reports a stream that ends before `exit`; this is only reached if it did not.
    Err(koder_sdk::Error::StreamEnded.into())
}

fn event_json(event: &ExecEvent) -> Result<serde_json::Value> {
    use serde_json::json;
    // The wire's own shape: text as `data`, other bytes as `data_b64`.
    let chunk = |name: &str, b: &[u8]| match std::str::from_utf8(b) {
        Ok(text) => json!({"event": name, "data": text}),
        Err(_) => {
            use base64::Engine as _;
            let b64 = base64::engine::general_purpose::STANDARD.encode(b);
            json!({"event": name, "data_b64": b64})
        }
    };
    Ok(match event {
        ExecEvent::Start { exec_id } => json!({"event": "start", "exec_id": exec_id}),
        ExecEvent::Stdout(b) => chunk("stdout", b),
        ExecEvent::Stderr(b) => chunk("stderr", b),
        ExecEvent::Truncated { dropped_chunks } => {
            json!({"event": "truncated", "dropped_chunks": dropped_chunks})
        }
        ExecEvent::Exit(r) => {
            let mut v = serde_json::to_value(r)?;
            if let Some(o) = v.as_object_mut() {
                o.remove("stdout");
                o.remove("stderr");
                o.insert("event".into(), "exit".into());
            }
            v
        }
    })
}
