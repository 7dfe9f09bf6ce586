//! image build (local, no daemon).

use crate::args::{ImageBuildArgs, ImageCommand};
use crate::error::{CliError, IoContext as _, Result};

pub async fn run(cmd: ImageCommand) -> Result<i32> {
    let ImageCommand::Build(a) = cmd;
    build(a).await
}

async fn build(a: ImageBuildArgs) -> Result<i32> {
    std::fs::create_dir_all(&a.images_dir)
        .doing(|| format!("creating {}", a.images_dir.display()))?;
    let opts = koder_microvm::image::BuildOptions {
        images_dir: a.images_dir.clone(),
        kernel_deb: a.kernel_deb,
        force: a.force,
    };
    let started = std::time::Instant::now();
    // Minutes of blocking work (package download, mkfs of a few GiB).
    let image = tokio::task::spawn_blocking(move || koder_microvm::image::build(&opts))
        .await
        .map_err(|e| CliError::msg(format!("image build task: {e}")))?
        .map_err(|e| CliError::msg(format!("image build: {e}")))?;
    println!(
        "microvm image ready in {:.1}s: kernel {} ({}), root disk {}",
        started.elapsed().as_secs_f64(),
        image.kernel_version,
        image.vmlinux.display(),
        image.rootfs.display()
    );
    Ok(0)
}
