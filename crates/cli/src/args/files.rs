use clap::Args;

use super::LocalOpts;

#[derive(Debug, Args)]
pub struct CpArgs {
    pub src: String,
    pub dst: String,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct RmArgs {
    pub session: String,
    /// Remove directories and their contents.
    #[arg(short = 'r', long, visible_short_alias = 'R')]
    pub recursive: bool,
    #[arg(required = true)]
    pub paths: Vec<String>,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct FilesArgs {
    pub session: String,
    #[arg(default_value = "/workspace")]
    pub path: String,
    #[arg(long)]
    pub depth: Option<u32>,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct MkdirArgs {
    pub session: String,
    pub path: String,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct MvArgs {
    pub session: String,
    pub from: String,
    pub to: String,
    #[command(flatten)]
    pub c: LocalOpts,
}
