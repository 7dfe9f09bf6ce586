//! cp, rm, files, mkdir, mv.

use std::path::{Path, PathBuf};

use futures::StreamExt as _;
use koder_sdk::{Client, FileEntry};

use super::Ctx;
use crate::args::{usage_error, CpArgs, FilesArgs, MkdirArgs, MvArgs, RmArgs, StatArgs};
use crate::error::{CliError, IoContext as _, Result};
use crate::output;

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Loc {
    Stdio,
    Local(PathBuf),
    Remote { session: String, path: String },
}

/// `SESSION:/path` (a relative path is under /workspace), `-`, or a local path. A local path
/// with a `:` can be written `./a:b`.
pub(crate) fn parse_loc(s: &str) -> Loc {
    if s == "-" {
        return Loc::Stdio;
    }
    if let Some((session, path)) = s.split_once(':') {
        if !session.is_empty() && !session.contains('/') && !path.is_empty() {
            let path = if path.starts_with('/') {
                path.to_string()
            } else {
                format!("/workspace/{path}")
            };
            return Loc::Remote {
                session: session.to_string(),
                path,
            };
        }
    }
    Loc::Local(PathBuf::from(s))
}

pub(crate) fn remote_basename(path: &str) -> Option<&str> {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty())
}

async fn upload_local(
    client: &Client,
    local: &Path,
    session: &str,
    path: &str,
) -> Result<FileEntry> {
    let path = if path.ends_with('/') {
        let name = local
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| CliError::msg(format!("{} has no file name", local.display())))?;
        format!("{path}{name}")
    } else {
        path.to_string()
    };
    let meta = tokio::fs::metadata(local)
        .await
        .doing(|| local.display().to_string())?;
    if meta.is_dir() {
        return Err(CliError::msg(format!(
            "{} is a directory (cp copies single files)",
            local.display()
        )));
    }
    Ok(client.upload_file(session, &path, local).await?)
}

async fn download_local(
    client: &Client,
    session: &str,
    path: &str,
    local: PathBuf,
    into_dir: bool,
) -> Result<()> {
    let is_dir = into_dir
        || tokio::fs::metadata(&local)
            .await
            .map(|m| m.is_dir())
            .unwrap_or(false);
    let target = if is_dir {
        let name = remote_basename(path)
            .ok_or_else(|| CliError::msg(format!("{path} has no file name")))?;
        local.join(name)
    } else {
        local
    };
    download_to_file(client, session, path, &target).await
}

pub async fn cp(ctx: Ctx, a: CpArgs) -> Result<i32> {
    let client = &ctx.client;
    let entry = match (parse_loc(&a.src), parse_loc(&a.dst)) {
        (Loc::Local(local), Loc::Remote { session, path }) => {
            Some(upload_local(client, &local, &session, &path).await?)
        }
        (Loc::Stdio, Loc::Remote { session, path }) => Some(
            client
                .upload_reader(&session, &path, tokio::io::stdin())
                .await?,
        ),
        (Loc::Remote { session, path }, Loc::Stdio) => {
            client
                .download_to(&session, &path, tokio::io::stdout())
                .await?;
            None
        }
        (Loc::Remote { session, path }, Loc::Local(local)) => {
            download_local(client, &session, &path, local, a.dst.ends_with('/')).await?;
            None
        }
        (
            Loc::Remote {
                session: s1,
                path: p1,
            },
            Loc::Remote {
                session: s2,
                path: p2,
            },
        ) => {
            let stream = client.download_stream(&s1, &p1).await?;
            let body = koder_sdk::Body::wrap_stream(stream.boxed());
            Some(client.upload(&s2, &p2, body).await?)
        }
        _ => usage_error(
            "cp",
            clap::error::ErrorKind::InvalidValue,
            "cp needs SESSION:/path on at least one side",
        ),
    };
    // An upload prints the entry it made; a download's data is the file itself.
    if let Some(entry) = entry {
        ctx.out.print_json_only(&entry)?;
    }
    Ok(0)
}

/// Streams a sandbox file into `target`; a failed copy leaves no partial file behind.
async fn download_to_file(client: &Client, session: &str, path: &str, target: &Path) -> Result<()> {
    use tokio::io::AsyncWriteExt as _;
    // Ask first, so a missing remote file doesn't create or truncate the local one.
    let stream = client.download_stream(session, path).await?;
    let file = tokio::fs::File::create(target)
        .await
        .doing(|| format!("creating {}", target.display()))?;
    let mut writer = tokio::io::BufWriter::with_capacity(64 * 1024, file);
    let copied: Result<()> = async {
        let mut stream = std::pin::pin!(stream);
        while let Some(chunk) = stream.next().await {
            writer
                .write_all(&chunk?)
                .await
                .doing(|| format!("writing {}", target.display()))?;
        }
        writer
            .flush()
            .await
            .doing(|| format!("writing {}", target.display()))
    }
    .await;
    if copied.is_err() {
        let _ = tokio::fs::remove_file(target).await;
    }
    copied
}

pub async fn rm(ctx: Ctx, a: RmArgs) -> Result<i32> {
    for path in &a.paths {
        ctx.client.remove(&a.session, path, a.recursive).await?;
    }
    Ok(0)
}

pub async fn list(ctx: Ctx, a: FilesArgs) -> Result<i32> {
    let list = ctx.client.list_files(&a.session, &a.path, a.depth).await?;
    print_listing(&ctx.out, &list)?;
    Ok(0)
}

/// A listing's table (or JSON), and a note on stderr when the daemon cut it short.
pub(super) fn print_listing(out: &output::Output, list: &koder_sdk::FileList) -> Result<()> {
    out.print(list, output::files_table)?;
    if list.truncated && !out.json {
        eprintln!("ksandbox: listing truncated by the daemon");
    }
    Ok(())
}

pub async fn mkdir(ctx: Ctx, a: MkdirArgs) -> Result<i32> {
    ctx.client.mkdir(&a.session, &a.path).await?;
    Ok(0)
}

pub async fn stat(ctx: Ctx, a: StatArgs) -> Result<i32> {
    let entry = ctx.client.stat(&a.session, &a.path).await?;
    ctx.out.print(&entry, output::file_table)?;
    Ok(0)
}

pub async fn mv(ctx: Ctx, a: MvArgs) -> Result<i32> {
    ctx.client.rename(&a.session, &a.from, &a.to).await?;
    Ok(0)
}
