//! envd's request messages in protobuf's JSON mapping: lowerCamelCase names (the proto names
//! are accepted too), 64-bit and other integers as numbers or strings, bytes as base64, enums by
//! name or number, oneofs as the set member's key. Unknown fields are ignored.

use std::collections::BTreeMap;

use base64::Engine as _;
use chrono::SecondsFormat;
use koder_api_types::{EntryType, FileEntry};
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};

use crate::connect::RpcError;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ProcessConfig {
    pub cmd: String,
    pub args: Vec<String>,
    pub envs: BTreeMap<String, String>,
    pub cwd: Option<String>,
}

impl ProcessConfig {
    pub fn to_json(&self) -> Value {
        let mut v = json!({"cmd": self.cmd, "args": self.args, "envs": self.envs});
        if let Some(cwd) = &self.cwd {
            v["cwd"] = cwd.clone().into();
        }
        v
    }
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(default)]
pub struct PtySize {
    #[serde(deserialize_with = "flexible_u32")]
    pub cols: u32,
    #[serde(deserialize_with = "flexible_u32")]
    pub rows: u32,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Pty {
    pub size: Option<PtySize>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct StartRequest {
    pub process: ProcessConfig,
    pub pty: Option<Pty>,
    pub tag: Option<String>,
    pub stdin: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ProcessSelector {
    #[serde(deserialize_with = "flexible_opt_u32")]
    pub pid: Option<u32>,
    pub tag: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SelectRequest {
    pub process: ProcessSelector,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ProcessInput {
    #[serde(deserialize_with = "opt_base64")]
    pub stdin: Option<Vec<u8>>,
    #[serde(deserialize_with = "opt_base64")]
    pub pty: Option<Vec<u8>>,
}

impl ProcessInput {
    /// The bytes and whether they were meant for a terminal.
    pub fn into_parts(self) -> Result<(Vec<u8>, bool), RpcError> {
        match (self.stdin, self.pty) {
            (Some(d), None) => Ok((d, false)),
            (None, Some(d)) => Ok((d, true)),
            _ => Err(RpcError::invalid("input needs exactly one of stdin or pty")),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SendInputRequest {
    pub process: ProcessSelector,
    pub input: ProcessInput,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct StreamInputData {
    pub input: ProcessInput,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct StreamInputRequest {
    pub start: Option<SelectRequest>,
    pub data: Option<StreamInputData>,
    pub keepalive: Option<Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SendSignalRequest {
    pub process: ProcessSelector,
    pub signal: Value,
}

impl SendSignalRequest {
    /// SIGKILL or SIGTERM, the two envd signals, by enum name or number.
    pub fn signal_name(&self) -> Result<&'static str, RpcError> {
        match &self.signal {
            Value::String(s) if s == "SIGNAL_SIGKILL" => Ok("SIGKILL"),
            Value::String(s) if s == "SIGNAL_SIGTERM" => Ok("SIGTERM"),
            Value::Number(n) if n.as_u64() == Some(9) => Ok("SIGKILL"),
            Value::Number(n) if n.as_u64() == Some(15) => Ok("SIGTERM"),
            other => Err(RpcError::invalid(format!(
                "signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM, not {other}"
            ))),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct UpdateRequest {
    pub process: ProcessSelector,
    pub pty: Option<Pty>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct PathRequest {
    pub path: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct MoveRequest {
    pub source: String,
    pub destination: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ListDirRequest {
    pub path: String,
    #[serde(deserialize_with = "flexible_u32")]
    pub depth: u32,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct WatchRequest {
    pub path: String,
    pub recursive: bool,
    #[serde(alias = "include_entry")]
    pub include_entry: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct WatcherRequest {
    #[serde(alias = "watcher_id", rename = "watcherId")]
    pub watcher_id: String,
}

/// The account name of a sandbox uid/gid, as E2B reports owners (`root`, `user`).
fn account(id: u32) -> String {
    match id {
        0 => "root".into(),
        1000 => "user".into(),
        other => other.to_string(),
    }
}

/// `EntryInfo` of filesystem answers.
pub fn entry_info(e: &FileEntry) -> Value {
    let is_symlink = e.kind == EntryType::Symlink;
    let file_type = match e.kind {
        EntryType::Dir => "FILE_TYPE_DIRECTORY",
        EntryType::Symlink => "FILE_TYPE_SYMLINK",
        EntryType::File => "FILE_TYPE_FILE",
        EntryType::Other => "FILE_TYPE_UNSPECIFIED",
    };
    let mut v = json!({
        "name": e.name,
        "type": file_type,
        "path": e.path,
        "size": e.size.to_string(),
        "mode": e.mode & 0o777,
        "permissions": permissions(e.kind, e.mode),
        "owner": account(e.uid),
        "group": account(e.gid),
        "modifiedTime": e.modified_at.to_rfc3339_opts(SecondsFormat::Millis, true),
        "isSymlink": is_symlink,
    });
    if let Some(target) = &e.symlink_target {
        v["symlinkTarget"] = target.clone().into();
    }
    v
}

/// Go's `FileMode.String()` as envd reports it: `drwxr-xr-x`, `-rw-r--r--`, `Lrwxrwxrwx`.
pub fn permissions(kind: EntryType, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        EntryType::Dir => 'd',
        EntryType::Symlink => 'L',
        _ => '-',
    });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 0o7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

pub fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// Standard or URL-safe alphabet, padded or not, as protobuf JSON parsers accept.
pub fn decode_b64(s: &str) -> Result<Vec<u8>, String> {
    let normalized: String = s
        .trim_end_matches('=')
        .chars()
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(normalized)
        .map_err(|e| format!("invalid base64: {e}"))
}

fn opt_base64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
    match Option::<String>::deserialize(d)? {
        None => Ok(None),
        Some(s) => decode_b64(&s).map(Some).map_err(serde::de::Error::custom),
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Flexible {
    Num(u64),
    Str(String),
}

fn to_u32<E: serde::de::Error>(f: Flexible) -> Result<u32, E> {
    let n = match f {
        Flexible::Num(n) => n,
        Flexible::Str(s) => s.trim().parse::<u64>().map_err(E::custom)?,
    };
    u32::try_from(n).map_err(|_| E::custom(format!("{n} does not fit in 32 bits")))
}

fn flexible_u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    match Option::<Flexible>::deserialize(d)? {
        None => Ok(0),
        Some(f) => to_u32(f),
    }
}

fn flexible_opt_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    match Option::<Flexible>::deserialize(d)? {
        None => Ok(None),
        Some(f) => to_u32(f).map(Some),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::parse;

    #[test]
    fn start_request_in_the_sdk_shape() {
        let raw = br#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"1"},"cwd":"/tmp"},"stdin":false,"pty":{"size":{"cols":80,"rows":"24"}},"futureField":1}"#;
        let r: StartRequest = parse(raw).unwrap();
        assert_eq!(r.process.args, ["-l", "-c", "echo hi"]);
        assert_eq!(r.process.envs["A"], "1");
        assert_eq!(r.stdin, Some(false));
        let size = r.pty.unwrap().size.unwrap();
        assert_eq!((size.cols, size.rows), (80, 24));
    }

    #[test]
    fn selectors_inputs_and_signals() {
        let r: SendInputRequest =
            parse(br#"{"process":{"pid":"42"},"input":{"stdin":"aGkK"}}"#).unwrap();
        assert_eq!(r.process.pid, Some(42));
        assert_eq!(r.input.into_parts().unwrap(), (b"hi\n".to_vec(), false));
        let r: SendInputRequest = parse(br#"{"process":{"tag":"t"},"input":{}}"#).unwrap();
        assert!(r.input.into_parts().is_err());
        assert!(parse::<SendInputRequest>(br#"{"input":{"stdin":"***"}}"#).is_err());
        assert!(parse::<SelectRequest>(br#"{"process":{"pid":-1}}"#).is_err());
        assert!(parse::<SelectRequest>(br#"{"process":{"pid":99999999999}}"#).is_err());
        for (raw, want) in [
            (r#""SIGNAL_SIGKILL""#, Ok("SIGKILL")),
            ("15", Ok("SIGTERM")),
            (r#""SIGNAL_UNSPECIFIED""#, Err(())),
        ] {
            let r: SendSignalRequest = parse(format!(r#"{{"signal":{raw}}}"#).as_bytes()).unwrap();
            assert_eq!(r.signal_name().map_err(|_| ()), want);
        }
        let w: WatcherRequest = parse(br#"{"watcher_id":"w1"}"#).unwrap();
        assert_eq!(w.watcher_id, "w1");
    }

    #[test]
    fn base64_variants() {
        for s in ["aGk/Pz4+", "aGk_Pz4-", "aGk/Pz4+", "aA==", "aA"] {
            assert!(decode_b64(s).is_ok(), "{s}");
        }
        assert_eq!(decode_b64("aA").unwrap(), b"h");
        assert!(decode_b64("a").is_err());
    }

    #[test]
    fn entry_info_shape() {
        let e = FileEntry {
            name: "a.txt".into(),
            path: "/home/user/a.txt".into(),
            kind: EntryType::File,
            size: 5_000_000_000,
            mode: 0o100644 & 0o7777,
            modified_at: chrono::DateTime::from_timestamp_millis(1_700_000_000_123)
                .unwrap_or_default(),
            symlink_target: None,
            uid: 1000,
            gid: 0,
        };
        let v = entry_info(&e);
        assert_eq!(v["type"], "FILE_TYPE_FILE");
        assert_eq!(
            (v["owner"].as_str(), v["group"].as_str()),
            (Some("user"), Some("root"))
        );
        assert_eq!(v["size"], "5000000000");
        assert_eq!(v["mode"], 0o644);
        assert_eq!(v["permissions"], "-rw-r--r--");
        assert_eq!(v["modifiedTime"], "2023-11-14T22:13:20.123Z");
        assert_eq!(permissions(EntryType::Dir, 0o755), "drwxr-xr-x");
        assert_eq!(permissions(EntryType::Symlink, 0o777), "Lrwxrwxrwx");
    }
}
