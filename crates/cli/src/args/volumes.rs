use clap::{Args, Subcommand};
use koder_sdk::VolumeMountRequest;

use super::{LocalOpts, OnlyOpts};

#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// Create a volume and print its id.
    Create(VolumeCreateArgs),
    /// List this tenant's volumes.
    List(OnlyOpts),
    /// Show one volume (by name or id).
    Get(VolumeArgs),
    /// Delete a volume and its files (refused while a session has it mounted).
    Delete(VolumeArgs),
    /// List files in a volume (paths are volume-absolute: `/` is its root).
    Ls(VolumeLsArgs),
    /// Write a file of a volume to stdout.
    Cat(VolumePathArgs),
    /// Write a local file (or stdin) into a volume.
    Put(VolumePutArgs),
    /// Remove files or directories (with their contents) from a volume.
    Rm(VolumeRmArgs),
    /// Create a directory in a volume.
    Mkdir(VolumeMkdirArgs),
    /// Show one file's type, size, mode and owner.
    Stat(VolumePathArgs),
}

#[derive(Debug, Args)]
pub struct VolumeCreateArgs {
    /// 1–128 characters of [A-Za-z0-9._-], unique among your volumes.
    pub name: String,
    /// Size quota (default: the server's).
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "from")]
    pub size_mib: Option<u64>,
    /// Make it a copy of this volume (name or id), with its size.
    #[arg(long, value_name = "VOLUME")]
    pub from: Option<String>,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct VolumeArgs {
    /// Volume name or id.
    pub volume: String,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct VolumePathArgs {
    /// Volume name or id.
    pub volume: String,
    /// Path in the volume (`/` is its root).
    pub path: String,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct VolumeLsArgs {
    /// Volume name or id.
    pub volume: String,
    /// Directory in the volume.
    #[arg(default_value = "/")]
    pub path: String,
    /// How many levels to descend (1 = the directory's own entries).
    #[arg(long)]
    pub depth: Option<u32>,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct VolumePutArgs {
    /// Volume name or id.
    pub volume: String,
    /// Where in the volume, e.g. `/data/in.csv`.
    pub path: String,
    /// Local file to send; `-` reads stdin.
    #[arg(default_value = "-")]
    pub file: String,
    /// Replace an existing file.
    #[arg(long)]
    pub overwrite: bool,
    /// Owner inside the sandbox [server default: 1000].
    #[arg(long)]
    pub uid: Option<u32>,
    /// Group inside the sandbox [server default: 1000].
    #[arg(long)]
    pub gid: Option<u32>,
    /// Permission bits in octal, e.g. 644.
    #[arg(long, value_name = "OCTAL", value_parser = parse_mode)]
    pub mode: Option<u32>,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct VolumeRmArgs {
    /// Volume name or id.
    pub volume: String,
    /// Paths in the volume.
    #[arg(required = true)]
    pub paths: Vec<String>,
    #[command(flatten)]
    pub c: LocalOpts,
}

#[derive(Debug, Args)]
pub struct VolumeMkdirArgs {
    /// Volume name or id.
    pub volume: String,
    /// Directory to create in the volume.
    pub path: String,
    /// Make missing parents too; an existing directory is no error.
    #[arg(short = 'p', long)]
    pub parents: bool,
    #[command(flatten)]
    pub c: LocalOpts,
}

/// Permission bits written like chmod's: `644`, `0755`, `1777` (or `0o644`).
pub(crate) fn parse_mode(s: &str) -> Result<u32, String> {
    let digits = s.strip_prefix("0o").unwrap_or(s);
    let valid =
        (1..=4).contains(&digits.len()) && digits.bytes().all(|b| (b'0'..=b'7').contains(&b));
    if !valid {
        return Err("expected octal permission bits like 644 or 0755".into());
    }
    u32::from_str_radix(digits, 8).map_err(|e| e.to_string())
}

/// `NAME:/path`, `NAME:/path:ro` (or `:rw`), for `create --volume`.
pub(crate) fn parse_volume_mount(s: &str) -> Result<VolumeMountRequest, String> {
    let usage = "expected NAME:/PATH or NAME:/PATH:ro";
    let Some((name, rest)) = s.split_once(':') else {
        return Err(format!("no mount path ({usage})"));
    };
    if name.is_empty() {
        return Err(format!("no volume name ({usage})"));
    }
    let (path, read_only) = match rest.rsplit_once(':') {
        Some((path, "ro")) => (path, true),
        Some((path, "rw")) => (path, false),
        Some((_, suffix)) => return Err(format!("unknown suffix {suffix:?} (only :ro or :rw)")),
        None => (rest, false),
    };
    if path.is_empty() {
        return Err(format!("no mount path ({usage})"));
    }
    if !path.starts_with('/') {
        return Err(format!(
            "the mount path {path:?} must be absolute, like /data"
        ));
    }
    if path.contains(':') {
        return Err(format!("a mount path cannot contain ':' ({usage})"));
    }
    Ok(VolumeMountRequest {
        name: name.to_string(),
        path: path.to_string(),
        read_only,
    })
}
