//! volume create/list/get/delete and the session-less file commands on a volume.

use koder_sdk::VolumeWrite;

use super::files::print_listing;
use super::Ctx;
use crate::args::{GlobalOpts, VolumeCommand, VolumeMkdirArgs, VolumePutArgs, VolumeRmArgs};
use crate::error::{IoContext as _, Result};
use crate::output;

pub async fn run(g: &GlobalOpts, command: VolumeCommand) -> Result<i32> {
    match command {
        VolumeCommand::Create(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            let volume = match &a.from {
                Some(source) => ctx.client.copy_volume(source, &a.name).await?,
                None => ctx.client.create_volume(&a.name, a.size_mib).await?,
            };
            // Just the id for people, like `snapshot create`.
            ctx.out.print(&volume, |v| v.volume_id.clone())?;
        }
        VolumeCommand::List(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            let volumes = ctx.client.list_volumes().await?;
            ctx.out.print(&volumes, |v| output::volumes_table(v))?;
        }
        VolumeCommand::Get(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            let volume = ctx.client.get_volume(&a.volume).await?;
            ctx.out.print(&volume, output::volume_table)?;
        }
        VolumeCommand::Delete(a) => {
            Ctx::new(g, &a.c)?.client.delete_volume(&a.volume).await?;
        }
        VolumeCommand::Ls(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            let list = ctx.client.volume_list(&a.volume, &a.path, a.depth).await?;
            print_listing(&ctx.out, &list)?;
        }
        VolumeCommand::Cat(a) => {
            Ctx::new(g, &a.c)?
                .client
                .volume_download_to(&a.volume, &a.path, tokio::io::stdout())
                .await?;
        }
        VolumeCommand::Stat(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            let entry = ctx.client.volume_stat(&a.volume, &a.path).await?;
            ctx.out.print(&entry, output::file_table)?;
        }
        VolumeCommand::Put(a) => put(Ctx::new(g, &a.c)?, a).await?,
        VolumeCommand::Rm(a) => rm(Ctx::new(g, &a.c)?, a).await?,
        VolumeCommand::Mkdir(a) => mkdir(Ctx::new(g, &a.c)?, a).await?,
    }
    Ok(0)
}

async fn put(ctx: Ctx, a: VolumePutArgs) -> Result<()> {
    let opts = VolumeWrite {
        overwrite: a.overwrite,
        uid: a.uid,
        gid: a.gid,
        mode: a.mode,
    };
    let client = &ctx.client;
    let entry = if a.file == "-" {
        let body = koder_sdk::body_from_reader(tokio::io::stdin());
        client
            .volume_upload(&a.volume, &a.path, body, &opts)
            .await?
    } else {
        // Checked here so a missing file is named as the local side, not an SDK I/O error.
        tokio::fs::metadata(&a.file)
            .await
            .doing(|| a.file.clone())?;
        client
            .volume_upload_file(&a.volume, &a.path, &a.file, &opts)
            .await?
    };
    ctx.out.print_json_only(&entry)
}

async fn rm(ctx: Ctx, a: VolumeRmArgs) -> Result<()> {
    for path in &a.paths {
        ctx.client.volume_remove(&a.volume, path).await?;
    }
    Ok(())
}

async fn mkdir(ctx: Ctx, a: VolumeMkdirArgs) -> Result<()> {
    let entry = ctx
        .client
        .volume_mkdir(&a.volume, &a.path, a.parents)
        .await?;
    ctx.out.print_json_only(&entry)
}
