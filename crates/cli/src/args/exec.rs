use std::path::PathBuf;

use clap::Args;

use super::{parse_kv, LocalOpts, SessionOpts};

/// Exec settings shared by `exec` and `run`.
#[derive(Debug, Clone, Default, Args)]
pub struct ExecOpts {
    /// Working directory inside the sandbox.
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// Environment variable for the process; repeatable.
    #[arg(long = "env", short = 'e', value_name = "K=V", value_parser = parse_kv)]
    pub env: Vec<(String, String)>,
    /// Kill the process after this many milliseconds.
    #[arg(long, value_name = "MS")]
    pub timeout_ms: Option<u64>,
    /// Feed this file (or `-` for standard input) to the process.
    #[arg(long, value_name = "FILE|-")]
    pub stdin_file: Option<String>,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Session id.
    pub session: String,
    /// Run this command line with /bin/bash -c.
    #[arg(long, conflicts_with = "cmd")]
    pub shell: Option<String>,
    /// Print output as it is produced (the default when stdout is a terminal).
    #[arg(long, conflicts_with_all = ["no_stream", "background"])]
    pub stream: bool,
    /// Wait for the end and print everything at once.
    #[arg(long)]
    pub no_stream: bool,
    /// Start in the background and print the exec id (see `ksandbox logs`).
    #[arg(long)]
    pub background: bool,
    #[command(flatten)]
    pub exec: ExecOpts,
    #[command(flatten)]
    pub c: LocalOpts,
    /// The argv to run (no shell).
    #[arg(
        trailing_var_arg = true,
        required_unless_present = "shell",
        value_name = "CMD"
    )]
    pub cmd: Vec<String>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Language (inferred from --file's extension when omitted).
    #[arg(value_parser = super::language_parser())]
    pub language: Option<String>,
    /// Source code to run.
    #[arg(short = 'c', long = "code", conflicts_with_all = ["file", "args"])]
    pub code: Option<String>,
    /// Local script to run (.py, .js, .sh).
    #[arg(long, conflicts_with = "args")]
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub exec: ExecOpts,
    #[command(flatten)]
    pub session: SessionOpts,
    #[command(flatten)]
    pub c: LocalOpts,
    /// An argv to run instead of code (after `--`).
    #[arg(last = true, value_name = "ARGS")]
    pub args: Vec<String>,
}
