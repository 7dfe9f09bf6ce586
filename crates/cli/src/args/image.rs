use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::{LocalOpts, OnlyOpts};

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Build an image on this host (locally, as root; no daemon needed): `build python|node|bash`
    /// builds that language pack from Debian's packages into the image store (once per recipe:
    /// later builds find it); without a pack, the `host` image and the microVM guest (kernel,
    /// boot modules, root disk), kept unless --force. `build FILE.toml` builds a template spec
    /// through the daemon instead (admin key), following its log; `[[files]] src = "path"`
    /// (relative to the spec) is sent inline as `content`.
    Build(ImageBuildArgs),
    /// Show a template build the daemon runs or ran (`image build FILE.toml` prints its id):
    /// state, each step (`pending`, `cached`, `running`, `built`, `failed`), the failed step's
    /// error and the end of its log; `--follow` prints the log as it is written until the build
    /// ends (exit 1 if it failed). Needs an admin key.
    BuildStatus(BuildStatusArgs),
    /// Import an OCI image layout tar or a `docker save` tar into the image store on this host
    /// (locally, as root; the daemon sees it at once): its layers unpacked in order, its env,
    /// working directory and user kept. `POST /v1/sandbox/images/import` does the same remotely.
    Import(ImageImportArgs),
    /// List the daemon's images (any API key).
    #[command(alias = "ls")]
    List(OnlyOpts),
    /// Show one image: languages, recipe, size, the end of its build log.
    Get(ImageNameArgs),
    /// Delete an image and its names; needs an admin key (--api-key or KSANDBOX_ADMIN_KEY).
    #[command(alias = "rm")]
    Delete(ImageNameArgs),
}

#[derive(Debug, Args)]
pub struct ImageBuildArgs {
    /// Language pack to build: python (3.11, pip, venv), node (20, npm) or bash (+ coreutils);
    /// or a template spec file (`*.toml`) the daemon builds.
    pub pack: Option<String>,
    /// The template's image name (default: the spec file's name without `.toml`).
    #[arg(long)]
    pub name: Option<String>,
    #[command(flatten)]
    pub c: LocalOpts,
    /// Images directory the daemon reads (<data_dir>/images; packs go to its `store`, the
    /// microVM guest is `[microvm] images_dir`).
    #[arg(long, default_value = "/var/lib/koder-sandbox/images")]
    pub images_dir: PathBuf,
    /// A linux-image-*.deb to use instead of downloading Debian's current cloud kernel (microVM).
    #[arg(long, conflicts_with = "pack")]
    pub kernel_deb: Option<PathBuf>,
    /// Rebuild the microVM guest even when one of this version exists (packs are
    /// content-addressed: the same recipe is the same image).
    #[arg(long, conflicts_with = "pack")]
    pub force: bool,
    /// Debian mirror packs are fetched from.
    #[arg(
        long,
        default_value = "http://deb.debian.org/debian",
        requires = "pack"
    )]
    pub mirror: String,
}

#[derive(Debug, Args)]
pub struct BuildStatusArgs {
    /// The build's id (`build_id` in `image build`'s output).
    pub id: String,
    /// Print the whole log (replayed, then live) until the build ends, instead of its status.
    #[arg(long, short = 'f')]
    pub follow: bool,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct ImageImportArgs {
    /// The archive (`docker save -o app.tar app`, or an OCI image layout packed with tar).
    pub file: PathBuf,
    /// The image's name (default: the file's name without its extension).
    #[arg(long)]
    pub name: Option<String>,
    /// Images directory the daemon reads (<data_dir>/images).
    #[arg(long, default_value = "/var/lib/koder-sandbox/images")]
    pub images_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct ImageNameArgs {
    /// Image name (`python`, `python:3.11`; `get` also takes `host` or a digest).
    pub name: String,
    #[command(flatten)]
    pub c: LocalOpts,
}
