//! The messages of a Start or Connect stream.

use crate::proto::process::process_event::{
    data_event::Output, DataEvent, EndEvent, Event, KeepAlive, StartEvent,
};
use crate::proto::process::{ProcessEvent, StartResponse};

/// One stream message. `ConnectResponse` is the same message, so both streams send this.
fn message(event: Event) -> StartResponse {
    StartResponse {
        event: Some(ProcessEvent { event: Some(event) }),
    }
}

pub(super) fn start(pid: u32) -> StartResponse {
    message(Event::Start(StartEvent { pid }))
}

pub(super) fn keepalive() -> StartResponse {
    message(Event::Keepalive(KeepAlive {}))
}

pub(super) fn data(output: Output) -> StartResponse {
    message(Event::Data(DataEvent {
        output: Some(output),
    }))
}

/// envd's end event: Go's `ProcessState` as `exitCode` (-1 when signalled), `exited`,
/// `status` ("exit status 1", "signal: killed") and an `error` for anything but success.
pub(super) fn end(
    exit_code: Option<i32>,
    signal: Option<i32>,
    why: Option<String>,
) -> StartResponse {
    let status = match (exit_code, signal) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(s)) => format!("signal: {}", signal_text(s)),
        (None, None) => "unknown".to_string(),
    };
    let error = (exit_code != Some(0)).then(|| why.unwrap_or_else(|| status.clone()));
    message(Event::End(EndEvent {
        exit_code: exit_code.unwrap_or(-1),
        exited: exit_code.is_some(),
        status,
        error,
    }))
}

/// Go's signal descriptions for the signals processes usually die of.
fn signal_text(sig: i32) -> String {
    match sig {
        1 => "hangup".into(),
        2 => "interrupt".into(),
        3 => "quit".into(),
        6 => "aborted".into(),
        9 => "killed".into(),
        11 => "segmentation fault".into(),
        13 => "broken pipe".into(),
        15 => "terminated".into(),
        n => format!("signal {n}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, to_value};

    #[test]
    fn end_events_follow_gos_process_state() {
        let ok = to_value(end(Some(0), None, None)).unwrap();
        assert_eq!(
            ok,
            json!({"event": {"end": {"exitCode": 0, "exited": true, "status": "exit status 0"}}})
        );
        let failed = to_value(end(Some(3), None, None)).unwrap();
        assert_eq!(failed["event"]["end"]["error"], "exit status 3");
        let killed = end(None, Some(9), Some("SANDBOX-EXEC-KILLED: killed".into()));
        let killed = to_value(killed).unwrap();
        assert_eq!(killed["event"]["end"]["exitCode"], -1);
        assert_eq!(killed["event"]["end"]["exited"], false);
        assert_eq!(killed["event"]["end"]["status"], "signal: killed");
        assert_eq!(
            killed["event"]["end"]["error"],
            "SANDBOX-EXEC-KILLED: killed"
        );
    }

    #[test]
    fn stream_messages_in_the_sdk_shape() {
        assert_eq!(
            to_value(data(Output::Stdout(b"hi\n".to_vec()))).unwrap(),
            json!({"event": {"data": {"stdout": "aGkK"}}})
        );
        assert_eq!(
            to_value(start(42)).unwrap(),
            json!({"event": {"start": {"pid": 42}}})
        );
        assert_eq!(
            to_value(keepalive()).unwrap(),
            json!({"event": {"keepalive": {}}})
        );
    }
}
