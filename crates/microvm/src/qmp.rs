//! The few QMP (QEMU Machine Protocol) commands the runtime needs to save a VM to a file and
//! load it back: `stop`, `cont`, `getfd` (a descriptor passed with SCM_RIGHTS), `migrate`,
//! `migrate-incoming` and `query-migrate`.
//!
//! Hand-written: QMP is one JSON object per line, and the `qapi` crate's tokio stream offers no
//! way to send a descriptor along with a command, which `getfd` needs (QEMU runs with
//! `-sandbox spawn=deny`, so `migrate exec:` is out, and it cannot open the daemon's files).
//!
//! QEMU runs as the VM's unprivileged uid and a guest that escaped into it controls what it
//! answers: every line is bounded, every command deadlined, and events are skipped in bounded
//! number.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Interest};
use tokio::net::UnixStream;

/// Longest QMP line accepted (replies here are small; a `query-migrate` is ~1 KiB).
const MAX_LINE: u64 = 64 * 1024;
/// Lines a command may be answered after (events QEMU sends meanwhile are skipped).
const MAX_SKIPPED: usize = 256;
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("QMP I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("QMP {command}: {class}: {desc}")]
    Command {
        command: String,
        class: String,
        desc: String,
    },
    #[error("QMP protocol: {0}")]
    Protocol(String),
    #[error("QMP {0} did not answer in time")]
    Timeout(String),
}

/// One line from QEMU, as far as this client cares.
#[derive(Debug, PartialEq)]
pub enum Reply {
    Greeting,
    Return(Value),
    Error { class: String, desc: String },
    Event,
}

/// Parses one line; anything that is none of QMP's message shapes is a protocol error.
pub fn parse_reply(line: &[u8]) -> Result<Reply, QmpError> {
    let v: Value =
        serde_json::from_slice(line).map_err(|e| QmpError::Protocol(format!("not JSON ({e})")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| QmpError::Protocol("not an object".into()))?;
    if let Some(ret) = obj.get("return") {
        return Ok(Reply::Return(ret.clone()));
    }
    if let Some(err) = obj.get("error") {
        let field = |k: &str| {
            err.get(k)
                .and_then(Value::as_str)
                .unwrap_or("?")
                .chars()
                .take(512)
                .collect::<String>()
        };
        return Ok(Reply::Error {
            class: field("class"),
            desc: field("desc"),
        });
    }
    if obj.contains_key("event") {
        return Ok(Reply::Event);
    }
    if obj.contains_key("QMP") {
        return Ok(Reply::Greeting);
    }
    Err(QmpError::Protocol("unknown message".into()))
}

/// Where a migration is, from a `query-migrate` answer.
#[derive(Debug, PartialEq, Eq)]
pub enum MigrationState {
    Running,
    Completed,
    Failed(String),
}

pub fn migration_state(ret: &Value) -> MigrationState {
    match ret.get("status").and_then(Value::as_str) {
        Some("completed") => MigrationState::Completed,
        Some("failed" | "cancelled" | "cancelling") => MigrationState::Failed(
            ret.get("error-desc")
                .and_then(Value::as_str)
                .unwrap_or("migration failed")
                .chars()
                .take(512)
                .collect(),
        ),
        // None: not started yet (no status while nothing ran); setup, active, device, ...
        _ => MigrationState::Running,
    }
}

/// A QMP session in command mode.
pub struct Qmp {
    stream: BufReader<UnixStream>,
}

impl Qmp {
    /// Connects to the monitor socket (waiting until `deadline` for QEMU to create it), reads
    /// the greeting and leaves capabilities negotiation.
    pub async fn connect(path: &Path, deadline: Instant) -> Result<Self, QmpError> {
        let stream = loop {
            match UnixStream::connect(path).await {
                Ok(s) => break s,
                Err(e) if Instant::now() > deadline => return Err(e.into()),
                Err(_) => tokio::time::sleep(POLL).await,
            }
        };
        let mut qmp = Self {
            stream: BufReader::new(stream),
        };
        let greeting = tokio::time::timeout(COMMAND_TIMEOUT, qmp.read_line())
            .await
            .map_err(|_| QmpError::Timeout("greeting".into()))??;
        if parse_reply(&greeting)? != Reply::Greeting {
            return Err(QmpError::Protocol("no greeting".into()));
        }
        qmp.execute("qmp_capabilities", json!({})).await?;
        Ok(qmp)
    }

    async fn read_line(&mut self) -> Result<Vec<u8>, QmpError> {
        let mut line = Vec::new();
        let n = (&mut self.stream)
            .take(MAX_LINE)
            .read_until(b'\n', &mut line)
            .await?;
        if n == 0 {
            return Err(QmpError::Protocol("QEMU closed the monitor".into()));
        }
        if line.last() != Some(&b'\n') {
            return Err(QmpError::Protocol("line too long".into()));
        }
        Ok(line)
    }

    /// Runs `command` and returns its `return` value.
    pub async fn execute(&mut self, command: &str, arguments: Value) -> Result<Value, QmpError> {
        self.execute_with_fd(command, arguments, None).await
    }

    /// Runs `command`, passing `fd` with it (SCM_RIGHTS), as `getfd` wants.
    pub async fn execute_with_fd(
        &mut self,
        command: &str,
        arguments: Value,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<Value, QmpError> {
        let mut line = serde_json::to_vec(&json!({ "execute": command, "arguments": arguments }))
            .map_err(|e| QmpError::Protocol(e.to_string()))?;
        line.push(b'\n');
        let exchange = async {
            match fd {
                Some(fd) => self.send_with_fd(&line, fd).await?,
                None => self.stream.get_mut().write_all(&line).await?,
            }
            for _ in 0..MAX_SKIPPED {
                match parse_reply(&self.read_line().await?)? {
                    Reply::Return(v) => return Ok(v),
                    Reply::Error { class, desc } => {
                        return Err(QmpError::Command {
                            command: command.to_string(),
                            class,
                            desc,
                        })
                    }
                    Reply::Event | Reply::Greeting => {}
                }
            }
            Err(QmpError::Protocol(format!("no answer to {command}")))
        };
        tokio::time::timeout(COMMAND_TIMEOUT, exchange)
            .await
            .map_err(|_| QmpError::Timeout(command.to_string()))?
    }

    async fn send_with_fd(&mut self, line: &[u8], fd: BorrowedFd<'_>) -> Result<(), QmpError> {
        use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
        let stream = self.stream.get_mut();
        let mut sent = 0;
        while sent < line.len() {
            let n = stream
                .async_io(Interest::WRITABLE, || {
                    let fds = [fd];
                    let mut space =
                        [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
                    let mut ancillary = SendAncillaryBuffer::new(&mut space);
                    // The descriptor goes with the first byte; QEMU takes it from that read.
                    if sent == 0 {
                        ancillary.push(SendAncillaryMessage::ScmRights(&fds));
                    }
                    rustix::net::sendmsg(
                        stream.as_fd(),
                        &[std::io::IoSlice::new(&line[sent..])],
                        &mut ancillary,
                        SendFlags::NOSIGNAL,
                    )
                    .map_err(std::io::Error::from)
                })
                .await?;
            sent += n;
        }
        Ok(())
    }

    /// Polls `query-migrate` until the migration completed (or failed, or `deadline` passed).
    pub async fn wait_migration(&mut self, deadline: Instant) -> Result<(), QmpError> {
        loop {
            match migration_state(&self.execute("query-migrate", json!({})).await?) {
                MigrationState::Completed => return Ok(()),
                MigrationState::Failed(why) => {
                    return Err(QmpError::Command {
                        command: "migrate".into(),
                        class: "failed".into(),
                        desc: why,
                    })
                }
                MigrationState::Running if Instant::now() > deadline => {
                    return Err(QmpError::Timeout("migration".into()))
                }
                MigrationState::Running => tokio::time::sleep(POLL).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn replies() {
        assert_eq!(
            parse_reply(br#"{"QMP": {"version": {}, "capabilities": []}}"#).unwrap(),
            Reply::Greeting
        );
        assert_eq!(
            parse_reply(b"{\"return\": {}}\r\n").unwrap(),
            Reply::Return(json!({}))
        );
        assert_eq!(
            parse_reply(br#"{"event": "STOP", "timestamp": {}}"#).unwrap(),
            Reply::Event
        );
        let long = "x".repeat(10_000);
        let err = format!(r#"{{"error": {{"class": "GenericError", "desc": "{long}"}}}}"#);
        match parse_reply(err.as_bytes()).unwrap() {
            Reply::Error { class, desc } => {
                assert_eq!(class, "GenericError");
                assert_eq!(desc.len(), 512);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse_reply(br#"{"error": 5}"#).unwrap(),
            Reply::Error { .. }
        ));
        for hostile in [
            &b"not json"[..],
            b"[1,2]",
            b"{}",
            b"\"return\"",
            b"{\"return\": ",
        ] {
            assert!(parse_reply(hostile).is_err(), "{hostile:?}");
        }
    }

    #[test]
    fn migration_states() {
        assert_eq!(
            migration_state(&json!({"status": "completed"})),
            MigrationState::Completed
        );
        assert_eq!(
            migration_state(&json!({"status": "active"})),
            MigrationState::Running
        );
        assert_eq!(migration_state(&json!({})), MigrationState::Running);
        assert_eq!(
            migration_state(&json!({"status": "failed", "error-desc": "disk full"})),
            MigrationState::Failed("disk full".into())
        );
        assert_eq!(
            migration_state(&json!({"status": "failed", "error-desc": 7})),
            MigrationState::Failed("migration failed".into())
        );
    }

    /// A stand-in monitor: greeting, events before answers, a descriptor passed with `getfd`,
    /// and one that never ends its line.
    #[tokio::test]
    async fn commands_skip_events_take_fds_and_bound_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qmp.sock");
        let listener = UnixListener::bind(&path).unwrap();
        // A thread of its own: it blocks, and the test's runtime has one thread.
        let server = std::thread::spawn(move || {
            let (std, _) = listener.accept().unwrap();
            use std::io::{BufRead, Write};
            let mut w = std.try_clone().unwrap();
            let mut r = std::io::BufReader::new(std.try_clone().unwrap());
            w.write_all(b"{\"QMP\": {}}\r\n").unwrap();
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            assert!(line.contains("qmp_capabilities"), "{line}");
            w.write_all(b"{\"return\": {}}\r\n").unwrap();
            // getfd: the descriptor arrives with the command's bytes.
            let mut buf = [0u8; 4096];
            let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut anc = rustix::net::RecvAncillaryBuffer::new(&mut space);
            let got = rustix::net::recvmsg(
                &std,
                &mut [std::io::IoSliceMut::new(&mut buf)],
                &mut anc,
                rustix::net::RecvFlags::empty(),
            )
            .unwrap();
            let text = String::from_utf8_lossy(&buf[..got.bytes]).into_owned();
            assert!(text.contains("\"getfd\""), "{text}");
            let fds: Vec<_> = anc
                .drain()
                .filter_map(|m| match m {
                    rustix::net::RecvAncillaryMessage::ScmRights(fds) => Some(fds.count()),
                    _ => None,
                })
                .collect();
            assert_eq!(fds, [1]);
            w.write_all(
                b"{\"event\": \"RESUME\"}\r\n{\"event\": \"STOP\"}\r\n{\"return\": {}}\r\n",
            )
            .unwrap();
            line.clear();
            r.read_line(&mut line).unwrap();
            w.write_all(b"{\"error\": {\"class\": \"GenericError\", \"desc\": \"no\"}}\n")
                .unwrap();
            line.clear();
            r.read_line(&mut line).unwrap();
            w.write_all(&vec![b'x'; 70_000]).unwrap();
        });
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut qmp = Qmp::connect(&path, deadline).await.unwrap();
        let file = tempfile::tempfile().unwrap();
        qmp.execute_with_fd("getfd", json!({"fdname": "f"}), Some(file.as_fd()))
            .await
            .unwrap();
        match qmp.execute("cont", json!({})).await {
            Err(QmpError::Command { class, desc, .. }) => {
                assert_eq!((class.as_str(), desc.as_str()), ("GenericError", "no"))
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            qmp.execute("stop", json!({})).await,
            Err(QmpError::Protocol(_))
        ));
        server.join().unwrap();
    }
}
