//! The tools' arguments: what an agent may send, as JSON Schema (schemars) with descriptions an
//! LLM reads, and the checks that run before anything reaches the daemon.
//!
//! Arguments come from a model and may be nonsense or hostile; every field is bounded here so a
//! bad call is a clear `SANDBOX-INVALID-ARGUMENT` tool error instead of a huge or odd request.
//! Unknown fields are refused by the extractor (`reply::Args`) against each schema, not by
//! serde's `deny_unknown_fields`, which cannot be combined with the flattened [`ExecOptions`].
//! The daemon checks everything again (limits against its maxima, paths inside the sandbox).

use std::collections::BTreeMap;

use base64::Engine as _;
use koder_sdk::types::contexts::RunCode;
use koder_sdk::types::{CreateSession, ExecRequest, Limits, Network, NetworkMode};
use rmcp::schemars::{self, JsonSchema};
use serde::Deserialize;

use crate::reply::ToolError;

/// Longest source text or shell command accepted (the daemon's request limit is close to this).
pub const MAX_CODE_BYTES: usize = 1024 * 1024;
/// Largest file `write_file` sends in one call (decoded bytes).
pub const MAX_WRITE_BYTES: usize = 8 * 1024 * 1024;
/// Largest file `read_file` returns (bytes); the default when `max_bytes` is not given is lower.
pub const MAX_READ_BYTES: u64 = 8 * 1024 * 1024;
const DEFAULT_READ_BYTES: u64 = 1024 * 1024;
const MAX_PATH_BYTES: usize = 4096;
const MAX_ID_CHARS: usize = 128;
const MAX_ENV: usize = 256;
const MAX_ENV_BYTES: usize = 64 * 1024;
const MAX_ARGV: usize = 4096;
const MAX_TIMEOUT_MS: u64 = 24 * 3600 * 1000;
const MAX_SESSION_TIMEOUT_S: u64 = 7 * 24 * 3600;
/// `read_process_output` waits at most this long for new output.
pub const MAX_WAIT_MS: u64 = 60_000;
const DEFAULT_WAIT_MS: u64 = 1_000;
const MAX_LIST_DEPTH: u32 = 10;
const MAX_ALLOW: usize = 64;
/// The sandbox's working directory, where relative paths point.
pub const WORKDIR: &str = "/workspace";

/// The interpreters a session or a run can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    Python,
    Node,
    Bash,
}

impl Language {
    pub fn as_str(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Node => "node",
            Language::Bash => "bash",
        }
    }
}

/// Outbound network of a new session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NetworkArg {
    /// No network at all (the default): only the sandbox's own loopback.
    None,
    /// TCP and DNS to the internet, mediated and audited by the daemon.
    Open,
    /// Only the hosts listed in `allow`.
    Allowlist,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
pub struct CreateSessionArgs {
    /// Interpreter the session is prepared for: `python`, `node` or `bash` (default). Any
    /// session can still run all three with `run_code`.
    #[serde(default)]
    pub language: Option<Language>,
    /// Seconds until the session is destroyed automatically (the server caps it).
    #[serde(default)]
    pub timeout_s: Option<u64>,
    /// Memory limit in MiB for everything running in the session.
    #[serde(default)]
    pub memory_mib: Option<u64>,
    /// CPU limit in thousandths of a core (1000 = one core).
    #[serde(default)]
    pub cpu_millis: Option<u32>,
    /// Disk quota of the session's writable filesystem in MiB.
    #[serde(default)]
    pub disk_mib: Option<u64>,
    /// Network access: `none` (default), `open`, or `allowlist` with `allow`.
    #[serde(default)]
    pub network: Option<NetworkArg>,
    /// Hosts (e.g. `pypi.org`, `*.github.com`) reachable with `network: allowlist`.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Environment variables for every command run in the session.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Start on a snapshot's files (a `snapshot_id` from `snapshot_session`).
    #[serde(default)]
    pub from_snapshot: Option<String>,
}

impl CreateSessionArgs {
    pub fn request(self) -> Result<CreateSession, ToolError> {
        if let Some(id) = &self.from_snapshot {
            check_id("from_snapshot", id)?;
        }
        if let Some(t) = self.timeout_s {
            check_range("timeout_s", t, 1, MAX_SESSION_TIMEOUT_S)?;
        }
        check_env(&self.env)?;
        if self.allow.len() > MAX_ALLOW {
            return Err(invalid(format!("allow: at most {MAX_ALLOW} hosts")));
        }
        for host in &self.allow {
            check_text("allow", host, 253)?;
        }
        let network = match (self.network, self.allow.is_empty()) {
            (Some(NetworkArg::Allowlist), true) => {
                return Err(invalid(
                    "network allowlist needs at least one host in allow",
                ))
            }
            (Some(NetworkArg::Allowlist), false) => Some(Network {
                mode: NetworkMode::Allowlist,
                allow: self.allow,
                deny: Vec::new(),
            }),
            (_, false) => return Err(invalid("allow is only used with network: allowlist")),
            (Some(NetworkArg::Open), true) => Some(Network {
                mode: NetworkMode::Open,
                allow: Vec::new(),
                deny: Vec::new(),
            }),
            (Some(NetworkArg::None), true) | (None, true) => None,
        };
        let limits = Limits {
            cpu_millis: self.cpu_millis,
            memory_mib: self.memory_mib,
            disk_mib: self.disk_mib,
            pids: None,
        };
        Ok(CreateSession {
            language: self.language.map(|l| l.as_str().to_string()),
            limits: (limits != Limits::default()).then_some(limits),
            network,
            env: self.env,
            timeout_s: self.timeout_s,
            from_snapshot: self.from_snapshot,
            ..Default::default()
        })
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct SessionArgs {
    /// Id of the session (from `create_session` or `list_sessions`).
    pub session_id: String,
}

impl SessionArgs {
    pub fn checked(self) -> Result<String, ToolError> {
        check_id("session_id", &self.session_id)?;
        Ok(self.session_id)
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct EventsArgs {
    /// Id of the session (one that has ended too: its log outlives it).
    pub session_id: String,
    /// Only the events numbered above this `seq`: the last `seq` of a previous answer, to read
    /// on from there. Default 0 (from the first).
    #[serde(default)]
    pub after: u64,
}

impl EventsArgs {
    pub fn checked(self) -> Result<(String, u64), ToolError> {
        check_id("session_id", &self.session_id)?;
        Ok((self.session_id, self.after))
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct SnapshotArgs {
    /// Id of the session whose files to save.
    pub session_id: String,
    /// A name to recognise the snapshot by (1-128 letters, digits, '-', '_' or '.').
    #[serde(default)]
    pub name: Option<String>,
}

impl SnapshotArgs {
    pub fn checked(self) -> Result<(String, Option<String>), ToolError> {
        check_id("session_id", &self.session_id)?;
        if let Some(name) = &self.name {
            check_id("name", name)?;
        }
        Ok((self.session_id, self.name))
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct RestoreArgs {
    /// Id of the session to put back.
    pub session_id: String,
    /// Id of the snapshot (from `snapshot_session`) whose files the session gets back.
    pub snapshot_id: String,
}

impl RestoreArgs {
    pub fn checked(self) -> Result<(String, String), ToolError> {
        check_id("session_id", &self.session_id)?;
        check_id("snapshot_id", &self.snapshot_id)?;
        Ok((self.session_id, self.snapshot_id))
    }
}

/// Copies one `fork_session` call may make (the daemon's own limit).
const MAX_FORKS: u32 = 100;

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct ForkArgs {
    /// Id of the session to copy.
    pub session_id: String,
    /// How many copies (1-100, default 1).
    #[serde(default)]
    pub count: Option<u32>,
}

impl ForkArgs {
    pub fn checked(self) -> Result<(String, u32), ToolError> {
        check_id("session_id", &self.session_id)?;
        let count = self.count.unwrap_or(1);
        check_range("count", u64::from(count), 1, u64::from(MAX_FORKS))?;
        Ok((self.session_id, count))
    }
}

/// What every exec shares: where, with which variables, as whom, for how long.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
pub struct ExecOptions {
    /// Working directory inside the sandbox (default `/workspace`).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment variables for this run only.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Text fed to the program's standard input.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Kill the run after this many milliseconds; the result then has verdict
    /// `SANDBOX-EXEC-TIMEOUT`. Default: the server's.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Run as `root` (default) or `user` (uid 1000).
    #[serde(default)]
    pub user: Option<User>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum User {
    Root,
    User,
}

impl ExecOptions {
    /// `req` with these options, checked.
    fn apply(self, mut req: ExecRequest) -> Result<ExecRequest, ToolError> {
        if let Some(cwd) = &self.cwd {
            check_path("cwd", cwd)?;
        }
        check_env(&self.env)?;
        if let Some(stdin) = &self.stdin {
            check_len("stdin", stdin, MAX_CODE_BYTES)?;
        }
        if let Some(t) = self.timeout_ms {
            check_range("timeout_ms", t, 1, MAX_TIMEOUT_MS)?;
        }
        req.cwd = self.cwd;
        req.env = self.env;
        req.stdin = self.stdin;
        req.timeout_ms = self.timeout_ms;
        req.user = self.user.map(|u| match u {
            User::Root => "root".to_string(),
            User::User => "user".to_string(),
        });
        Ok(req)
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct RunCodeArgs {
    /// Id of the session to run in.
    pub session_id: String,
    /// Interpreter: `python`, `node` or `bash`. Default: the session's language.
    #[serde(default)]
    pub language: Option<Language>,
    /// Source code, run as one program (print what you want to see).
    pub code: String,
    #[serde(flatten)]
    pub options: ExecOptions,
}

impl RunCodeArgs {
    pub fn request(self) -> Result<(String, ExecRequest), ToolError> {
        check_id("session_id", &self.session_id)?;
        check_nonempty_len("code", &self.code, MAX_CODE_BYTES)?;
        let req = ExecRequest {
            code: Some(self.code),
            language: self.language.map(|l| l.as_str().to_string()),
            ..Default::default()
        };
        Ok((self.session_id, self.options.apply(req)?))
    }
}

/// The interpreters `run_cell` keeps a context of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CellLanguage {
    Python,
    Node,
    /// Node with the cell's types stripped (not checked).
    Typescript,
    /// One long-lived shell: variables, functions and the directory persist.
    Bash,
    /// JShell.
    Java,
    R,
}

impl CellLanguage {
    /// The name the daemon gives a context of this language.
    pub fn as_str(self) -> &'static str {
        match self {
            CellLanguage::Python => "python",
            CellLanguage::Node => "node",
            CellLanguage::Typescript => "typescript",
            CellLanguage::Bash => "bash",
            CellLanguage::Java => "java",
            CellLanguage::R => "r",
        }
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct RunCellArgs {
    /// Id of the session to run in.
    pub session_id: String,
    /// The cell's code. Its last expression's value is returned, as in a notebook.
    pub code: String,
    /// Interpreter: `python` (default), `node`, `typescript`, `bash`, `java` or `r`. A session
    /// keeps one context per language, made by its first cell.
    #[serde(default)]
    pub language: Option<CellLanguage>,
    /// Run in this context (a `context_id` of an earlier answer) instead of the language's;
    /// give `language` or `context_id`, not both.
    #[serde(default)]
    pub context_id: Option<String>,
    /// Kill the interpreter after this many milliseconds (its variables are then lost).
    /// Default: the server's.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Extra environment variables for this cell only.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// Where a checked cell runs: a named context, or the session's context of a language.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CellTarget {
    Context(String),
    Language(CellLanguage),
}

impl RunCellArgs {
    pub fn checked(self) -> Result<(String, CellTarget, RunCode), ToolError> {
        check_id("session_id", &self.session_id)?;
        check_nonempty_len("code", &self.code, MAX_CODE_BYTES)?;
        check_env(&self.env)?;
        if let Some(t) = self.timeout_ms {
            check_range("timeout_ms", t, 1, MAX_TIMEOUT_MS)?;
        }
        let target = match (self.context_id, self.language) {
            (Some(_), Some(_)) => return Err(invalid("give language or context_id, not both")),
            (Some(id), None) => {
                check_id("context_id", &id)?;
                CellTarget::Context(id)
            }
            (None, language) => CellTarget::Language(language.unwrap_or(CellLanguage::Python)),
        };
        let run = RunCode {
            code: self.code,
            timeout_ms: self.timeout_ms,
            env: self.env,
        };
        Ok((self.session_id, target, run))
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct RunCommandArgs {
    /// Id of the session to run in.
    pub session_id: String,
    /// A shell command line, run by `/bin/bash -c` (pipes, redirections and `&&` work).
    /// Give either this or `argv`.
    #[serde(default)]
    pub command: Option<String>,
    /// A program and its arguments, run without a shell. Give either this or `command`.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    #[serde(flatten)]
    pub options: ExecOptions,
}

impl RunCommandArgs {
    pub fn request(self) -> Result<(String, ExecRequest), ToolError> {
        check_id("session_id", &self.session_id)?;
        let mut req = ExecRequest::default();
        match (self.command, self.argv) {
            (Some(command), None) => {
                check_nonempty_len("command", &command, MAX_CODE_BYTES)?;
                req.shell = Some(command);
            }
            (None, Some(argv)) => {
                check_argv(&argv)?;
                req.cmd = Some(argv);
            }
            _ => return Err(invalid("give exactly one of command and argv")),
        }
        Ok((self.session_id, self.options.apply(req)?))
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct ReadOutputArgs {
    /// Id of the session the process runs in.
    pub session_id: String,
    /// Id of the process (from `start_process`).
    pub process_id: String,
    /// How long to wait for the process to finish before answering with the output so far,
    /// in milliseconds (default 1000, at most 60000).
    #[serde(default)]
    pub wait_ms: Option<u64>,
}

impl ReadOutputArgs {
    pub fn checked(self) -> Result<(String, String, u64), ToolError> {
        check_id("session_id", &self.session_id)?;
        check_id("process_id", &self.process_id)?;
        let wait = self.wait_ms.unwrap_or(DEFAULT_WAIT_MS);
        check_range("wait_ms", wait, 0, MAX_WAIT_MS)?;
        Ok((self.session_id, self.process_id, wait))
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct StopProcessArgs {
    /// Id of the session the process runs in.
    pub session_id: String,
    /// Id of the process (from `start_process`).
    pub process_id: String,
    /// Signal to send: `SIGTERM` (default), `SIGKILL`, `SIGINT`, ... or a number.
    #[serde(default)]
    pub signal: Option<String>,
}

impl StopProcessArgs {
    pub fn checked(self) -> Result<(String, String, String), ToolError> {
        check_id("session_id", &self.session_id)?;
        check_id("process_id", &self.process_id)?;
        let signal = self.signal.unwrap_or_else(|| "SIGTERM".to_string());
        if signal.is_empty()
            || signal.len() > 16
            || !signal.bytes().all(|b| b.is_ascii_alphanumeric())
        {
            return Err(invalid(format!(
                "signal: a name like SIGTERM or a number, got {signal:?}"
            )));
        }
        Ok((self.session_id, self.process_id, signal))
    }
}

/// How file contents travel in a tool call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// Plain UTF-8 text (the default).
    #[default]
    Utf8,
    /// Base64 of the raw bytes (binary files).
    Base64,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct WriteFileArgs {
    /// Id of the session.
    pub session_id: String,
    /// Path inside the sandbox, e.g. `/workspace/main.py` (relative paths are under
    /// `/workspace`). Parent directories must exist (`run_command` with `mkdir -p` makes
    /// them); an existing file is replaced.
    pub path: String,
    /// The file's contents.
    pub content: String,
    /// `utf8` (default) or `base64` for binary contents.
    #[serde(default)]
    pub encoding: Encoding,
}

impl WriteFileArgs {
    pub fn checked(self) -> Result<(String, String, Vec<u8>), ToolError> {
        check_id("session_id", &self.session_id)?;
        check_path("path", &self.path)?;
        let bytes = match self.encoding {
            Encoding::Utf8 => self.content.into_bytes(),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(self.content.as_bytes())
                .map_err(|e| invalid(format!("content is not valid base64: {e}")))?,
        };
        if bytes.len() > MAX_WRITE_BYTES {
            return Err(invalid(format!(
                "content: at most {MAX_WRITE_BYTES} bytes per call"
            )));
        }
        Ok((self.session_id, self.path, bytes))
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct ReadFileArgs {
    /// Id of the session.
    pub session_id: String,
    /// Path inside the sandbox (relative paths are under `/workspace`).
    pub path: String,
    /// Return at most this many bytes (default 1048576, at most 8388608); a longer file is cut
    /// and the answer says `truncated`.
    #[serde(default)]
    pub max_bytes: Option<u64>,
}

impl ReadFileArgs {
    pub fn checked(self) -> Result<(String, String, u64), ToolError> {
        check_id("session_id", &self.session_id)?;
        check_path("path", &self.path)?;
        let max = self.max_bytes.unwrap_or(DEFAULT_READ_BYTES);
        check_range("max_bytes", max, 1, MAX_READ_BYTES)?;
        Ok((self.session_id, self.path, max))
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct ListFilesArgs {
    /// Id of the session.
    pub session_id: String,
    /// Directory inside the sandbox (default `/workspace`, the working directory).
    #[serde(default)]
    pub path: Option<String>,
    /// How many levels to descend (1 = the directory's own entries; at most 10).
    #[serde(default)]
    pub depth: Option<u32>,
}

impl ListFilesArgs {
    pub fn checked(self) -> Result<(String, String, Option<u32>), ToolError> {
        check_id("session_id", &self.session_id)?;
        let path = self.path.unwrap_or_else(|| WORKDIR.to_string());
        check_path("path", &path)?;
        if let Some(d) = self.depth {
            check_range("depth", u64::from(d), 1, u64::from(MAX_LIST_DEPTH))?;
        }
        Ok((self.session_id, path, self.depth))
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct PreviewArgs {
    /// Id of the session (from `create_session` or `list_sessions`).
    pub session_id: String,
    /// The port the web server listens on inside the sandbox (1-65535); the preview is pinned
    /// to it. Default: the port detected from the session's listening sockets.
    #[serde(default)]
    pub port: Option<u16>,
}

impl PreviewArgs {
    pub fn checked(self) -> Result<(String, Option<u16>), ToolError> {
        check_id("session_id", &self.session_id)?;
        if let Some(port) = self.port {
            check_range("port", u64::from(port), 1, u64::from(u16::MAX))?;
        }
        Ok((self.session_id, self.port))
    }
}

fn invalid(message: impl Into<String>) -> ToolError {
    ToolError::invalid(message)
}

fn check_range(field: &str, value: u64, min: u64, max: u64) -> Result<(), ToolError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(invalid(format!(
            "{field} must be between {min} and {max}, got {value}"
        )))
    }
}

/// Ids are what the daemon hands out (uuids, `snap-...`): refuse anything else before it
/// becomes a URL segment.
fn check_id(field: &str, id: &str) -> Result<(), ToolError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_ID_CHARS
        && !matches!(id, "." | "..")
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "{field} must be 1-{MAX_ID_CHARS} letters, digits, '-', '_' or '.', got {}",
            preview(id)
        )))
    }
}

/// Paths are resolved inside the sandbox's root by its agent (relative ones under
/// [`WORKDIR`]), so only what no path can carry is refused here.
fn check_path(field: &str, path: &str) -> Result<(), ToolError> {
    if path.is_empty() {
        return Err(invalid(format!("{field} must not be empty")));
    }
    check_text(field, path, MAX_PATH_BYTES)
}

/// No NUL (no C string carries it) and a length bound.
fn check_text(field: &str, text: &str, max: usize) -> Result<(), ToolError> {
    if text.contains('\0') {
        return Err(invalid(format!("{field} must not contain NUL characters")));
    }
    check_len(field, text, max)
}

fn check_len(field: &str, text: &str, max: usize) -> Result<(), ToolError> {
    if text.len() > max {
        return Err(invalid(format!(
            "{field} is {} bytes, at most {max} allowed",
            text.len()
        )));
    }
    Ok(())
}

fn check_nonempty_len(field: &str, text: &str, max: usize) -> Result<(), ToolError> {
    if text.trim().is_empty() {
        return Err(invalid(format!("{field} must not be empty")));
    }
    check_len(field, text, max)
}

fn check_env(env: &BTreeMap<String, String>) -> Result<(), ToolError> {
    if env.len() > MAX_ENV {
        return Err(invalid(format!("env: at most {MAX_ENV} variables")));
    }
    let mut total = 0usize;
    for (k, v) in env {
        let name_ok = !k.is_empty()
            && !k.starts_with(|c: char| c.is_ascii_digit())
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !name_ok {
            return Err(invalid(format!(
                "env: {} is not a variable name (letters, digits, '_')",
                preview(k)
            )));
        }
        check_text("env value", v, MAX_ENV_BYTES)?;
        total += k.len() + v.len();
    }
    if total > MAX_ENV_BYTES {
        return Err(invalid(format!(
            "env: at most {MAX_ENV_BYTES} bytes in all"
        )));
    }
    Ok(())
}

fn check_argv(argv: &[String]) -> Result<(), ToolError> {
    let Some(program) = argv.first() else {
        return Err(invalid("argv must name a program"));
    };
    if program.is_empty() {
        return Err(invalid("argv[0] must not be empty"));
    }
    if argv.len() > MAX_ARGV {
        return Err(invalid(format!("argv: at most {MAX_ARGV} arguments")));
    }
    let mut total = 0usize;
    for arg in argv {
        check_text("argv", arg, MAX_CODE_BYTES)?;
        total += arg.len();
    }
    if total > MAX_CODE_BYTES {
        return Err(invalid(format!(
            "argv: at most {MAX_CODE_BYTES} bytes in all"
        )));
    }
    Ok(())
}

/// A value quoted in an error message: escaped and cut, so a hostile one cannot flood it.
fn preview(text: &str) -> String {
    const MAX: usize = 64;
    let mut cut: String = text.chars().take(MAX).collect();
    if cut.len() < text.len() {
        cut.push('…');
    }
    format!("{cut:?}")
}

#[cfg(test)]
mod tests;
