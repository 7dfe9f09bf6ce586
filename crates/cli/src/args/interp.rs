use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

use super::{parse_kv, LocalOpts};

/// The languages an interpreter context runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ContextLanguage {
    #[value(alias = "py")]
    Python,
    #[value(aliases = ["js", "javascript"])]
    Node,
    /// Node with each cell's types stripped, unchecked (needs the typescript package in the
    /// image).
    #[value(name = "typescript", alias = "ts")]
    TypeScript,
    /// A long-lived shell: variables, functions and the directory persist between runs.
    #[value(aliases = ["sh", "shell"])]
    Bash,
    /// JShell: classes, methods and variables persist between runs (needs a JDK in the image).
    Java,
    /// One R session: objects, functions and loaded packages persist (needs R in the image).
    R,
}

impl ContextLanguage {
    pub fn as_str(self) -> &'static str {
        match self {
            ContextLanguage::Python => "python",
            ContextLanguage::Node => "node",
            ContextLanguage::TypeScript => "typescript",
            ContextLanguage::Bash => "bash",
            ContextLanguage::Java => "java",
            ContextLanguage::R => "r",
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum ContextCommand {
    /// Start an interpreter in a session and print its context id.
    Create(ContextCreateArgs),
    /// List a session's interpreter contexts.
    #[command(alias = "list")]
    Ls(ContextSessionArgs),
    /// Stop interpreter contexts (their variables are gone).
    #[command(alias = "delete")]
    Rm(ContextIdsArgs),
    /// Kill a context's interpreter and start it afresh (variables are lost, the id stays).
    Restart(ContextIdArgs),
}

#[derive(Debug, Args)]
pub struct ContextCreateArgs {
    /// Session id.
    pub session: String,
    /// Interpreter language.
    #[arg(long, short = 'l', value_enum, default_value_t = ContextLanguage::Python)]
    pub language: ContextLanguage,
    /// Working directory of the interpreter (an existing absolute path; default the session's).
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// Environment variable of the interpreter, kept across restarts; repeatable.
    #[arg(long = "env", short = 'e', value_name = "K=V", value_parser = parse_kv)]
    pub env: Vec<(String, String)>,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct ContextSessionArgs {
    /// Session id.
    pub session: String,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct ContextIdArgs {
    /// Session id.
    pub session: String,
    /// Context id (from `context create` or `context ls`; `default` is the session's Python).
    pub context: String,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct ContextIdsArgs {
    /// Session id.
    pub session: String,
    /// Context ids.
    #[arg(required = true)]
    pub contexts: Vec<String>,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
#[command(after_help = "\
Without --context or --language the code runs in the session's default Python context, whose \
variables persist between runs. --language runs it in a fresh context of that language, removed \
afterwards. Exit status: 0, or 1 when the code raised (the traceback goes to stderr) or was \
killed (the verdict goes to stderr).")]
pub struct RunCodeArgs {
    /// Session id.
    pub session: String,
    /// Code to run, or `-` to read it from standard input.
    #[arg(value_name = "CODE|-")]
    pub code: String,
    /// Run in this context (from `context create`); `default` is the session's Python.
    #[arg(long, value_name = "ID", conflicts_with = "language")]
    pub context: Option<String>,
    /// Run in a throw-away context of this language instead.
    #[arg(long, short = 'l', value_enum)]
    pub language: Option<ContextLanguage>,
    /// Kill (and restart) the interpreter after this many milliseconds.
    #[arg(long, value_name = "MS")]
    pub timeout_ms: Option<u64>,
    /// Environment variable for this run only; repeatable.
    #[arg(long = "env", short = 'e', value_name = "K=V", value_parser = parse_kv)]
    pub env: Vec<(String, String)>,
    /// Print output as it is produced (the default when stdout is a terminal).
    #[arg(long, conflicts_with = "no_stream")]
    pub stream: bool,
    /// Wait for the end and print everything at once.
    #[arg(long)]
    pub no_stream: bool,
    /// Write the rich results (PNG, SVG, HTML, JSON...) into this directory as
    /// `result-N.EXT`; without it they are only summarised on stderr.
    #[arg(long, value_name = "DIR")]
    pub save_results: Option<PathBuf>,
    #[command(flatten)]
    pub c: LocalOpts,
}
