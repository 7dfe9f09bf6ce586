use std::path::PathBuf;

use clap::{Args, Subcommand};

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Build the `host` image and the microVM guest (kernel, boot modules, root disk).
    /// Idempotent: an image of the current version is kept unless --force.
    Build(ImageBuildArgs),
}

#[derive(Debug, Args)]
pub struct ImageBuildArgs {
    /// Images directory the daemon reads (`[microvm] images_dir`, default <data_dir>/images).
    #[arg(long, default_value = "/var/lib/koder-sandbox/images")]
    pub images_dir: PathBuf,
    /// A linux-image-*.deb to use instead of downloading Debian's current cloud kernel.
    #[arg(long)]
    pub kernel_deb: Option<PathBuf>,
    /// Rebuild even when an image of this version exists.
    #[arg(long)]
    pub force: bool,
}
