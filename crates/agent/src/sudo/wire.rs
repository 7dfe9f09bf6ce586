//! What the `sudo` command and the agent's sudo service say to each other on the service's
//! socket: one request (its stdio riding along as `SCM_RIGHTS`), then signal numbers one way
//! and one verdict the other.
//!
//! The request is `u32` little-endian length + JSON [`Request`]; every later client word is a
//! signal number (`i32` little-endian) to relay; the service's one answer is a [`Verdict`] as
//! two little-endian 32-bit words, and then it closes. Anything from the client is hostile:
//! the service bounds the request ([`MAX_REQUEST_BYTES`], [`HANDSHAKE_TIMEOUT`]) and checks
//! every field before it spawns.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The service's abstract socket name: abstract names live in the network namespace, which is
/// the sandbox's own, and the agent binds it before any sandbox process exists, so nothing else
/// can hold it.
pub const SOCKET_NAME: &[u8] = b"koder-sandbox/sudo";

/// Largest request (argv and environment together) the service reads; Linux's own limit on
/// an exec's arguments and environment is 2 MiB, a sudo command line is far below either.
pub const MAX_REQUEST_BYTES: usize = 1 << 20;

/// How long a client may take to send its request once connected.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The descriptors that ride with a request: the command's stdin, stdout and stderr.
pub const STDIO_FDS: usize = 3;

/// What to run, as whom. The client computed all of it (options, account, environment); the
/// service only checks that it is well formed: becoming any account of the sandbox is what
/// the service offers to every sandbox process, as passwordless sudo does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// The program: a path, or a name looked up in `env`'s `PATH`.
    pub program: String,
    /// argv, its first element included (a login shell's is `-bash`).
    pub argv: Vec<String>,
    /// The whole environment of the command.
    pub env: Vec<(String, String)>,
    pub cwd: String,
    pub uid: u32,
    pub gid: u32,
    /// Whether the command's stdin is a terminal of its own that it is to control (the
    /// client made it, as sudo's `use_pty` does): the command's session takes it as its
    /// controlling terminal, so job control and ^C work as at a prompt.
    #[serde(default)]
    pub terminal: bool,
}

impl Request {
    /// Why the service refuses it, if it does: what `execve` could not take.
    pub fn problem(&self) -> Option<&'static str> {
        let nul = |s: &str| s.contains('\0');
        if self.program.is_empty() || self.argv.is_empty() {
            return Some("no program");
        }
        if nul(&self.program)
            || nul(&self.cwd)
            || self.argv.iter().any(|a| nul(a))
            || self.env.iter().any(|(k, v)| nul(k) || nul(v))
        {
            return Some("a NUL byte");
        }
        if self
            .env
            .iter()
            .any(|(k, _)| k.is_empty() || k.contains('='))
        {
            return Some("an environment name that is empty or holds '='");
        }
        None
    }
}

/// How the command ended, or why it never started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The spawn failed with this errno (`EINVAL` for a request refused as malformed).
    NotStarted(i32),
    /// The working directory could not be entered (this errno).
    NoDirectory(i32),
    Exited(i32),
    Signaled(i32),
}

impl Verdict {
    pub fn encode(self) -> [u8; 8] {
        let (tag, value) = match self {
            Verdict::NotStarted(e) => (0u32, e),
            Verdict::Exited(c) => (1, c),
            Verdict::Signaled(s) => (2, s),
            Verdict::NoDirectory(e) => (3, e),
        };
        let mut out = [0u8; 8];
        out[..4].copy_from_slice(&tag.to_le_bytes());
        out[4..].copy_from_slice(&value.to_le_bytes());
        out
    }

    pub fn decode(raw: [u8; 8]) -> Option<Self> {
        let word = |at: usize| [raw[at], raw[at + 1], raw[at + 2], raw[at + 3]];
        let value = i32::from_le_bytes(word(4));
        match u32::from_le_bytes(word(0)) {
            0 => Some(Verdict::NotStarted(value)),
            1 => Some(Verdict::Exited(value)),
            2 => Some(Verdict::Signaled(value)),
            3 => Some(Verdict::NoDirectory(value)),
            _ => None,
        }
    }
}

/// The framed request: length prefix and JSON.
pub fn encode_request(req: &Request) -> Vec<u8> {
    let body = serde_json::to_vec(req).unwrap_or_default();
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// How many bytes the whole framed request takes, once its length prefix is in; `None` when
/// the prefix announces more than [`MAX_REQUEST_BYTES`].
pub fn framed_len(prefix: [u8; 4]) -> Option<usize> {
    let n = u32::from_le_bytes(prefix) as usize;
    (n <= MAX_REQUEST_BYTES).then_some(4 + n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> Request {
        Request {
            program: "id".into(),
            argv: vec!["id".into(), "-u".into()],
            env: vec![("PATH".into(), "/usr/bin".into())],
            cwd: "/".into(),
            uid: 0,
            gid: 0,
            terminal: false,
        }
    }

    #[test]
    fn a_request_round_trips_through_its_frame() {
        let framed = encode_request(&request());
        let len = framed_len(framed[..4].try_into().unwrap()).unwrap();
        assert_eq!(len, framed.len());
        let back: Request = serde_json::from_slice(&framed[4..]).unwrap();
        assert_eq!(back, request());
    }

    #[test]
    fn an_oversized_frame_is_refused_from_its_prefix() {
        assert_eq!(
            framed_len((MAX_REQUEST_BYTES as u32 + 1).to_le_bytes()),
            None
        );
        assert_eq!(framed_len(u32::MAX.to_le_bytes()), None);
        assert_eq!(framed_len(0u32.to_le_bytes()), Some(4));
    }

    #[test]
    fn malformed_requests_are_named() {
        let with = |f: fn(&mut Request)| {
            let mut r = request();
            f(&mut r);
            r.problem()
        };
        assert_eq!(request().problem(), None);
        assert!(with(|r| r.argv.clear()).is_some());
        assert!(with(|r| r.program.clear()).is_some());
        assert!(with(|r| r.argv.push("a\0b".into())).is_some());
        assert!(with(|r| r.cwd = "/\0".into()).is_some());
        assert!(with(|r| r.env.push(("A=B".into(), "c".into()))).is_some());
        assert!(with(|r| r.env.push((String::new(), "c".into()))).is_some());
        assert!(with(|r| r.env.push(("K".into(), "v\0".into()))).is_some());
    }

    #[test]
    fn verdicts_round_trip_and_unknown_tags_are_refused() {
        for v in [
            Verdict::NotStarted(libc::ENOENT),
            Verdict::Exited(0),
            Verdict::Exited(255),
            Verdict::Signaled(libc::SIGTERM),
            Verdict::NoDirectory(libc::ENOTDIR),
        ] {
            assert_eq!(Verdict::decode(v.encode()), Some(v));
        }
        let mut raw = Verdict::Exited(1).encode();
        raw[0] = 9;
        assert_eq!(Verdict::decode(raw), None);
    }
}
