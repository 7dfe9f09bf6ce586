use clap::Args;

use super::LocalOpts;

#[derive(Debug, Args)]
pub struct CpArgs {
    /// Source: a local path, `SESSION:/path`, or `-` for standard input.
    pub src: String,
    /// Destination: a local path, `SESSION:/path`, or `-` for standard output.
    pub dst: String,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct RmArgs {
    /// Session id.
    pub session: String,
    /// Remove directories and their contents.
    #[arg(short = 'r', long, visible_short_alias = 'R')]
    pub recursive: bool,
    /// Paths inside the sandbox.
    #[arg(required = true)]
    pub paths: Vec<String>,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct FilesArgs {
    /// Session id.
    pub session: String,
    /// Directory inside the sandbox.
    #[arg(default_value = "/workspace")]
    pub path: String,
    /// How many levels to descend (1 = the directory's own entries).
    #[arg(long)]
    pub depth: Option<u32>,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct StatArgs {
    /// Session id.
    pub session: String,
    /// Path inside the sandbox (a symlink is described, not followed).
    pub path: String,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct MkdirArgs {
    /// Session id.
    pub session: String,
    /// Directory to create inside the sandbox.
    pub path: String,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct MvArgs {
    /// Session id.
    pub session: String,
    /// Current path inside the sandbox.
    pub from: String,
    /// New path inside the sandbox.
    pub to: String,
    #[command(flatten)]
    pub c: LocalOpts,
}
