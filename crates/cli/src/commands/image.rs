//! image build (local, no daemon; or a template spec built by the daemon) and
//! list/get/delete (the daemon's images).

use futures::StreamExt as _;
use koder_sdk::{types, BuildEvent};

use super::admin::admin_ctx;
use super::Ctx;
use crate::args::{BuildStatusArgs, GlobalOpts, ImageBuildArgs, ImageCommand, ImageImportArgs};
use crate::error::{CliError, IoContext as _, Result};
use crate::output::{build_table, format_size, format_time, image_languages, images_table};

pub async fn run(g: &GlobalOpts, cmd: ImageCommand) -> Result<i32> {
    match cmd {
        ImageCommand::Build(a) => match a.pack.clone() {
            Some(spec) if spec.ends_with(".toml") => build_template(g, &spec, a).await,
            Some(pack) => build_pack(&pack, a).await,
            None => build(a).await,
        },
        ImageCommand::BuildStatus(a) => build_status(g, a).await,
        ImageCommand::Import(a) => import(a).await,
        ImageCommand::List(o) => {
            let ctx = Ctx::new(g, &o.c)?;
            let list = ctx.client.list_images().await?;
            ctx.out.print(&list, |l| images_table(&l.images))?;
            Ok(0)
        }
        ImageCommand::Get(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            let image = ctx.client.image(&a.name).await?;
            ctx.out.print(&image, image_details)?;
            Ok(0)
        }
        ImageCommand::Delete(a) => {
            let ctx = admin_ctx(g, &a.c)?;
            let image = ctx
                .client
                .delete_image(&a.name)
                .await
                .map_err(CliError::admin)?;
            ctx.out
                .print(&image, |i| format!("deleted {}", i.names.join(", ")))?;
            Ok(0)
        }
    }
}

async fn build_pack(pack: &str, a: ImageBuildArgs) -> Result<i32> {
    let pack = koder_image::packs::Pack::parse(pack)
        .ok_or_else(|| CliError::msg(format!("unknown pack {pack:?}")))?;
    let store = koder_image::ImageStore::open(&a.images_dir)
        .map_err(|e| CliError::msg(format!("image store: {e}")))?;
    let opts = koder_image::packs::BuildOptions {
        mirror: a.mirror,
        ..Default::default()
    };
    let started = std::time::Instant::now();
    // Minutes of blocking work the first time (downloads, dpkg).
    let built = tokio::task::spawn_blocking(move || koder_image::packs::build(&store, pack, &opts))
        .await
        .map_err(|e| CliError::msg(format!("pack build task: {e}")))?
        .map_err(|e| CliError::msg(format!("pack build: {e}")))?;
    let m = &built.image.manifest;
    println!(
        "{} {} in {:.1}s: {} ({}), digest {}",
        if built.built { "built" } else { "found" },
        built.image.names.join(", "),
        started.elapsed().as_secs_f64(),
        built.image.root.display(),
        format_size(m.size_bytes),
        m.digest
    );
    Ok(0)
}

async fn import(a: ImageImportArgs) -> Result<i32> {
    let name = match a.name {
        Some(name) => name,
        None => default_name(&a.file)?,
    };
    let store = koder_image::ImageStore::open(&a.images_dir)
        .map_err(|e| CliError::msg(format!("image store: {e}")))?;
    let started = std::time::Instant::now();
    let file = a.file.clone();
    let imported = tokio::task::spawn_blocking(move || {
        koder_image::oci::import(&store, &file, &name, koder_image::oci::Limits::default())
    })
    .await
    .map_err(|e| CliError::msg(format!("import task: {e}")))?
    .map_err(|e| CliError::msg(format!("import {}: {e}", a.file.display())))?;
    let m = &imported.image.manifest;
    println!(
        "{} {} in {:.1}s: {}, digest {}",
        if imported.unpacked {
            "imported"
        } else {
            "found"
        },
        imported.image.names.join(", "),
        started.elapsed().as_secs_f64(),
        format_size(m.size_bytes),
        m.digest
    );
    Ok(0)
}

/// `app` of `/path/app.tar` (or `app.tar.gz`).
fn default_name(file: &std::path::Path) -> Result<String> {
    file.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.split('.').next())
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .ok_or_else(|| CliError::msg("give the image a name with --name"))
}

/// Sends the spec to the daemon and prints its build log as it runs; 1 if the build failed.
async fn build_template(g: &GlobalOpts, spec: &str, a: ImageBuildArgs) -> Result<i32> {
    let path = std::path::Path::new(spec);
    let name = match a.name {
        Some(name) => name,
        None => default_name(path)?,
    };
    let text = inline_files(path)?;
    let ctx = admin_ctx(g, &a.c)?;
    let build = ctx
        .client
        .submit_build(text, &name)
        .await
        .map_err(CliError::admin)?;
    eprintln!("build {} of {name} queued", build.build_id);
    follow_build(&ctx, &build.build_id).await
}

/// `image build-status ID`: the build's status, or with `--follow` its log to the end.
async fn build_status(g: &GlobalOpts, a: BuildStatusArgs) -> Result<i32> {
    let ctx = admin_ctx(g, &a.c)?;
    if a.follow {
        return follow_build(&ctx, &a.id).await.map_err(|e| match e {
            CliError::Sdk(e) => CliError::admin(e),
            other => other,
        });
    }
    let build = ctx
        .client
        .build_status(&a.id)
        .await
        .map_err(CliError::admin)?;
    ctx.out.print(&build, build_table)?;
    Ok(match build.state {
        types::BuildState::Failed => 1,
        _ => 0,
    })
}

/// Prints a build's log as it is written; ends with its result (1 if it failed).
async fn follow_build(ctx: &Ctx, id: &str) -> Result<i32> {
    let mut events = Box::pin(ctx.client.follow_build(id).await?);
    while let Some(event) = events.next().await {
        match event? {
            BuildEvent::Line(line) => println!("{line}"),
            BuildEvent::Done(b) => {
                ctx.out.print_json_only(&*b)?;
                return Ok(match b.error {
                    Some(e) => {
                        eprintln!("{}: {}", e.code, e.message);
                        1
                    }
                    None => 0,
                });
            }
        }
    }
    Err(CliError::msg("the build's log ended before its result"))
}

/// The spec's text with every `[[files]] src` (a path relative to the spec) read into
/// `content`, since the daemon takes files inline.
fn inline_files(path: &std::path::Path) -> Result<String> {
    let text = std::fs::read_to_string(path).doing(|| format!("reading {}", path.display()))?;
    let mut spec: toml::Table = text
        .parse()
        .map_err(|e| CliError::msg(format!("{}: {e}", path.display())))?;
    let dir = path.parent().unwrap_or(std::path::Path::new("."));
    if let Some(files) = spec.get_mut("files").and_then(|f| f.as_array_mut()) {
        for file in files.iter_mut().filter_map(|f| f.as_table_mut()) {
            if let Some(src) = file.remove("src") {
                let src = dir.join(src.as_str().unwrap_or_default());
                let content = std::fs::read_to_string(&src)
                    .doing(|| format!("reading {} (a text file)", src.display()))?;
                file.insert("content".into(), toml::Value::String(content));
            }
        }
    }
    toml::to_string(&spec).map_err(|e| CliError::msg(format!("{}: {e}", path.display())))
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

fn image_details(i: &types::Image) -> String {
    let mut lines = vec![
        format!("name:       {}", i.names.join(", ")),
        format!("kind:       {}", i.kind),
        format!("digest:     {}", i.digest.as_deref().unwrap_or("-")),
        format!("languages:  {}", image_languages(i)),
        format!(
            "size:       {}",
            i.size_bytes.map_or("-".into(), format_size)
        ),
        format!(
            "created:    {}",
            i.created_at.as_ref().map_or("-".into(), format_time)
        ),
        format!("in use:     {}", i.in_use),
    ];
    for l in &i.languages {
        lines.push(format!("  {}: {}", l.name, l.interpreter));
    }
    if let Some(log) = &i.build_log {
        lines.push("build log (end):".into());
        lines.extend(
            log.lines()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .map(|l| format!("  {l}")),
        );
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{Cli, ClientCommand, Command};

    #[test]
    fn the_table_aligns_and_dashes_what_host_lacks() {
        let host = types::Image {
            name: "host".into(),
            names: vec!["host".into()],
            digest: None,
            kind: "host".into(),
            languages: vec![types::ImageLanguage {
                name: "bash".into(),
                interpreter: "/bin/bash".into(),
                version: None,
            }],
            env: Default::default(),
            workdir: "/workspace".into(),
            user: "root".into(),
            created_at: None,
            size_bytes: None,
            recipe: None,
            build_log: None,
            in_use: true,
        };
        let mut py = host.clone();
        py.names = vec!["python".into(), "python:3.11".into()];
        py.kind = "pack".into();
        py.digest = Some("ab".repeat(32));
        py.size_bytes = Some(3 << 20);
        let table = images_table(&[host, py]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[1].starts_with("host  "), "{table}");
        assert!(lines[2].contains("3.0 MiB") && lines[2].ends_with(&"ab".repeat(6)));
        assert_eq!(lines[0].find("KIND"), lines[2].find("pack"));
    }

    #[test]
    fn build_status_shows_each_step_and_names_the_failed_one() {
        let cli = <Cli as clap::Parser>::try_parse_from([
            "ksandbox",
            "image",
            "build-status",
            "b-1",
            "--follow",
        ])
        .unwrap();
        let Command::Client(ClientCommand::Image(ImageCommand::BuildStatus(a))) = cli.command
        else {
            panic!("not image build-status")
        };
        assert_eq!((a.id.as_str(), a.follow), ("b-1", true));

        let step = |step: &str, status: &str| types::BuildStep {
            step: step.into(),
            key: "k".repeat(64),
            status: status.into(),
        };
        let build = types::Build {
            build_id: "b-1".into(),
            name: "app".into(),
            state: types::BuildState::Failed,
            steps: vec![step("pip six", "cached"), step("run make", "failed")],
            failed_step: Some(1),
            error: Some(types::ErrorDetail {
                code: "SANDBOX-IMAGE-BUILD-STEP-FAILED".into(),
                message: "step 1 exited with 2".into(),
                details: None,
            }),
            digest: None,
            log_tail: "make: *** no rule\n".into(),
            created_at: chrono::Utc::now(),
            finished_at: Some(chrono::Utc::now()),
        };
        let text = build_table(&build);
        assert!(text.contains("failed"), "{text}");
        let failed_row = text.lines().find(|l| l.contains("run make")).unwrap();
        assert!(failed_row.ends_with("<- failed"), "{text}");
        assert!(!text
            .lines()
            .any(|l| l.contains("pip six") && l.contains("<-")));
        assert!(text.contains("error: SANDBOX-IMAGE-BUILD-STEP-FAILED: step 1 exited with 2"));
        assert!(text.trim_end().ends_with("make: *** no rule"), "{text}");
    }

    #[test]
    fn import_takes_a_file_and_an_optional_name() {
        let cli =
            <Cli as clap::Parser>::try_parse_from(["ksandbox", "image", "import", "/x/app.tar.gz"])
                .unwrap();
        let Command::Client(ClientCommand::Image(ImageCommand::Import(a))) = cli.command else {
            panic!("not image import")
        };
        assert_eq!((a.name, a.file.to_str()), (None, Some("/x/app.tar.gz")));
        assert_eq!(default_name(&a.file).unwrap(), "app");
        assert!(default_name(std::path::Path::new("/x/.tar")).is_err());
        let cli = <Cli as clap::Parser>::try_parse_from([
            "ksandbox", "image", "import", "a.tar", "--name", "web:1",
        ])
        .unwrap();
        let Command::Client(ClientCommand::Image(ImageCommand::Import(a))) = cli.command else {
            panic!("not image import")
        };
        assert_eq!(a.name.as_deref(), Some("web:1"));
    }
}
