//! `ksandbox`: command-line client for koder-sandbox, and `ksandbox serve` to run the daemon.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context as _};
use clap::{Args, CommandFactory as _, Parser, Subcommand};
use futures::StreamExt as _;
mod terminal;

use koder_sdk::{types, Client, CreateSession, ExecRequest, ExecResult, Limits, Network};
use tokio::io::AsyncReadExt as _;

#[derive(Debug, Parser)]
#[command(
    name = "ksandbox",
    version,
    about = "Run code in koder-sandbox sessions (and run the daemon itself)",
    after_help = "Client options (--url, --api-key, --json) go before or after the subcommand."
)]
struct Cli {
    #[command(flatten)]
    global: GlobalOpts,
    #[command(subcommand)]
    command: Command,
}

/// Options in front of the subcommand (`ksandbox --json ls`).
#[derive(Debug, Clone, Args)]
struct GlobalOpts {
    /// Daemon base URL [default: http://127.0.0.1:7070].
    #[arg(long, env = "KSANDBOX_URL", value_name = "URL")]
    url: Option<String>,
    /// API key (bearer token).
    #[arg(
        long,
        env = "KSANDBOX_API_KEY",
        hide_env_values = true,
        value_name = "KEY"
    )]
    api_key: Option<String>,
    /// Machine-readable JSON output.
    #[arg(long)]
    json: bool,
}

/// The same options after the subcommand (`ksandbox ls --json`); these win over the global ones.
/// (Not clap-global: `serve` has its own `--api-key TENANT:KEY`.)
#[derive(Debug, Clone, Default, Args)]
struct LocalOpts {
    /// Daemon base URL [env: KSANDBOX_URL].
    #[arg(long = "url", value_name = "URL", help_heading = "Client options")]
    url: Option<String>,
    /// API key [env: KSANDBOX_API_KEY].
    #[arg(long = "api-key", value_name = "KEY", help_heading = "Client options")]
    api_key: Option<String>,
    /// Machine-readable JSON output.
    #[arg(long = "json", help_heading = "Client options")]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the koder-sandbox daemon in the foreground.
    Serve(koder_daemon::ServeArgs),
    /// Create a session and print its id.
    Create(CreateArgs),
    /// List this tenant's sessions.
    Ls(OnlyOpts),
    /// Show one session.
    Info(SessionArgs),
    /// Run a command in a session: `exec S -- CMD ARGS...` or `exec S --shell 'CMD'`.
    Exec(ExecArgs),
    /// Create a throw-away session, run code in it, destroy it.
    Run(RunArgs),
    /// Copy a file to or from a session (`SESSION:/path` names the sandbox side, `-` is stdio).
    Cp(CpArgs),
    /// Remove files in a session.
    Rm(RmArgs),
    /// Destroy sessions.
    #[command(alias = "destroy")]
    Kill(KillArgs),
    /// List files in a session.
    Files(FilesArgs),
    /// Create a directory (and its parents) in a session.
    Mkdir(MkdirArgs),
    /// Move or rename a file in a session.
    Mv(MvArgs),
    /// Set a session's remaining lifetime.
    Timeout(TimeoutArgs),
    /// Check that the daemon answers (GET /healthz).
    Health(OnlyOpts),
    /// Live resource use of a session (CPU, memory, pids, disk).
    Metrics(SessionArgs),
    /// Open an interactive shell in a session (raw terminal, resizes follow the window).
    Shell(SessionArgs),
    /// Attach a terminal to a program in a session: `attach S -- top`.
    Attach(AttachArgs),
    /// Follow a background exec's output (replayed from the start), or list them.
    Logs(LogsArgs),
    /// Print file events below a directory in a session as they happen.
    Watch(WatchArgs),
    /// The network audit log: every connection attempt and lookup of your sandboxes.
    Audit(AuditArgs),
    /// Operator commands; need an admin key (--api-key or KSANDBOX_ADMIN_KEY).
    Admin(AdminArgs),
    /// Build sandbox images on this host (runs locally, as root; no daemon needed).
    #[command(subcommand)]
    Image(ImageCommand),
}

#[derive(Debug, Subcommand)]
enum ImageCommand {
    /// Build the `host` image and the microVM guest (kernel, boot modules, root disk).
    /// Idempotent: an image of the current version is kept unless --force.
    Build(ImageBuildArgs),
}

#[derive(Debug, Args)]
struct ImageBuildArgs {
    /// Images directory the daemon reads (`[microvm] images_dir`, default <data_dir>/images).
    #[arg(long, default_value = "/var/lib/koder-sandbox/images")]
    images_dir: std::path::PathBuf,
    /// A linux-image-*.deb to use instead of downloading Debian's current cloud kernel.
    #[arg(long)]
    kernel_deb: Option<std::path::PathBuf>,
    /// Rebuild even when an image of this version exists.
    #[arg(long)]
    force: bool,
}

#[derive(Debug, Args)]
struct AttachArgs {
    session: String,
    #[command(flatten)]
    c: LocalOpts,
    /// The program and its arguments (exec'd directly, no shell).
    #[arg(last = true, required = true, value_name = "CMD")]
    cmd: Vec<String>,
}

#[derive(Debug, Args)]
struct LogsArgs {
    session: String,
    exec_id: Option<String>,
    /// List the session's followed execs instead.
    #[arg(long, conflicts_with = "exec_id")]
    list: bool,
    #[command(flatten)]
    c: LocalOpts,
}

#[derive(Debug, Args)]
struct AuditArgs {
    /// Only this session's attempts.
    #[arg(long)]
    session: Option<String>,
    /// Only refused attempts.
    #[arg(long, conflicts_with = "allowed")]
    denied: bool,
    /// Only allowed attempts.
    #[arg(long)]
    allowed: bool,
    #[arg(long, default_value_t = 100)]
    limit: u32,
    #[command(flatten)]
    c: LocalOpts,
}

#[derive(Debug, Args)]
struct WatchArgs {
    session: String,
    #[arg(default_value = "/workspace")]
    path: String,
    #[arg(short, long)]
    recursive: bool,
    #[command(flatten)]
    c: LocalOpts,
}

#[derive(Debug, Args)]
struct AdminArgs {
    #[command(subcommand)]
    what: AdminCommand,
}

#[derive(Debug, Subcommand)]
enum AdminCommand {
    /// Tenants: plans, quotas, keys.
    #[command(subcommand)]
    Tenant(TenantCommand),
}

#[derive(Debug, Subcommand)]
enum TenantCommand {
    /// List tenants with their quotas and today's use.
    Ls(OnlyOpts),
    /// Show one tenant.
    Get(TenantIdArgs),
    /// Create or update a tenant (plan `none` has no sandbox access).
    Set(TenantSetArgs),
    /// Issue a new API key for a tenant (printed once).
    Key(TenantIdArgs),
}

#[derive(Debug, Args)]
struct TenantIdArgs {
    tenant: String,
    #[command(flatten)]
    c: LocalOpts,
}

#[derive(Debug, Args)]
struct TenantSetArgs {
    tenant: String,
    #[arg(long)]
    plan: String,
    #[arg(long)]
    name: Option<String>,
    #[arg(long)]
    max_sessions: Option<u32>,
    #[arg(long = "daily-minutes")]
    daily_session_minutes: Option<u64>,
    #[command(flatten)]
    c: LocalOpts,
}

#[derive(Debug, Args)]
struct OnlyOpts {
    #[command(flatten)]
    c: LocalOpts,
}

#[derive(Debug, Args)]
struct SessionArgs {
    session: String,
    #[command(flatten)]
    c: LocalOpts,
}

/// Session settings shared by `create` and `run`.
#[derive(Debug, Clone, Default, Args)]
struct SessionOpts {
    /// Session lifetime in seconds.
    #[arg(long, value_name = "SECS")]
    timeout: Option<u64>,
    #[arg(long, value_name = "MIB")]
    memory_mib: Option<u64>,
    /// CPU quota in thousandths of a core.
    #[arg(long, value_name = "N")]
    cpu_millis: Option<u32>,
    #[arg(long, value_name = "MIB")]
    disk_mib: Option<u64>,
    #[arg(long, value_name = "N")]
    pids: Option<u64>,
    /// Image name instead of a language.
    #[arg(long)]
    image: Option<String>,
    /// `jail` or `microvm` (default: the server's).
    #[arg(long)]
    runtime: Option<String>,
    /// Network mode: none, open or allowlist.
    #[arg(long, value_parser = ["none", "open", "allowlist"])]
    network: Option<String>,
    /// Allowed destination for `--network allowlist` (host, CIDR, `:port` suffix); repeatable.
    #[arg(long = "allow", value_name = "DEST")]
    allow: Vec<String>,
    /// Session metadata; repeatable.
    #[arg(long = "meta", value_name = "K=V", value_parser = parse_kv)]
    meta: Vec<(String, String)>,
}

#[derive(Debug, Args)]
struct CreateArgs {
    /// python, node or bash.
    #[arg(long, short = 'l')]
    language: Option<String>,
    /// Session environment variable; repeatable.
    #[arg(long = "env", short = 'e', value_name = "K=V", value_parser = parse_kv)]
    env: Vec<(String, String)>,
    #[command(flatten)]
    session: SessionOpts,
    #[command(flatten)]
    c: LocalOpts,
}

/// Exec settings shared by `exec` and `run`.
#[derive(Debug, Clone, Default, Args)]
struct ExecOpts {
    /// Working directory inside the sandbox.
    #[arg(long, value_name = "DIR")]
    cwd: Option<String>,
    /// Environment variable for the process; repeatable.
    #[arg(long = "env", short = 'e', value_name = "K=V", value_parser = parse_kv)]
    env: Vec<(String, String)>,
    /// Kill the process after this many milliseconds.
    #[arg(long, value_name = "MS")]
    timeout_ms: Option<u64>,
    /// Feed this file (or `-` for standard input) to the process.
    #[arg(long, value_name = "FILE|-")]
    stdin_file: Option<String>,
}

#[derive(Debug, Args)]
struct ExecArgs {
    session: String,
    /// Run this command line with /bin/bash -c.
    #[arg(long, conflicts_with = "cmd")]
    shell: Option<String>,
    /// Print output as it is produced (the default when stdout is a terminal).
    #[arg(long, conflicts_with_all = ["no_stream", "background"])]
    stream: bool,
    /// Wait for the end and print everything at once.
    #[arg(long)]
    no_stream: bool,
    /// Start in the background and print the exec id (see `ksandbox logs`).
    #[arg(long)]
    background: bool,
    #[command(flatten)]
    exec: ExecOpts,
    #[command(flatten)]
    c: LocalOpts,
    /// The argv to run (no shell).
    #[arg(
        trailing_var_arg = true,
        required_unless_present = "shell",
        value_name = "CMD"
    )]
    cmd: Vec<String>,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// python, node or bash (inferred from --file's extension when omitted).
    language: Option<String>,
    /// Source code to run.
    #[arg(short = 'c', long = "code", conflicts_with_all = ["file", "args"])]
    code: Option<String>,
    /// Local script to run (.py, .js, .sh).
    #[arg(long, conflicts_with = "args")]
    file: Option<PathBuf>,
    #[command(flatten)]
    exec: ExecOpts,
    #[command(flatten)]
    session: SessionOpts,
    #[command(flatten)]
    c: LocalOpts,
    /// An argv to run instead of code (after `--`).
    #[arg(last = true, value_name = "ARGS")]
    args: Vec<String>,
}

#[derive(Debug, Args)]
struct CpArgs {
    src: String,
    dst: String,
    #[command(flatten)]
    c: LocalOpts,
}

#[derive(Debug, Args)]
struct RmArgs {
    session: String,
    /// Remove directories and their contents.
    #[arg(short = 'r', long, visible_short_alias = 'R')]
    recursive: bool,
    #[arg(required = true)]
    paths: Vec<String>,
    #[command(flatten)]
    c: LocalOpts,
}

#[derive(Debug, Args)]
struct KillArgs {
    #[arg(required = true)]
    sessions: Vec<String>,
    #[command(flatten)]
    c: LocalOpts,
}

#[derive(Debug, Args)]
struct FilesArgs {
    session: String,
    #[arg(default_value = "/workspace")]
    path: String,
    #[arg(long)]
    depth: Option<u32>,
    #[command(flatten)]
    c: LocalOpts,
}

#[derive(Debug, Args)]
struct MkdirArgs {
    session: String,
    path: String,
    #[command(flatten)]
    c: LocalOpts,
}

#[derive(Debug, Args)]
struct MvArgs {
    session: String,
    from: String,
    to: String,
    #[command(flatten)]
    c: LocalOpts,
}

#[derive(Debug, Args)]
struct TimeoutArgs {
    session: String,
    /// Seconds from now.
    secs: u64,
    #[command(flatten)]
    c: LocalOpts,
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected K=V, got {s:?}")),
    }
}

/// A usage error of subcommand `sub`: printed like clap's own, exit status 2.
fn usage_error(sub: &str, kind: clap::error::ErrorKind, message: impl std::fmt::Display) -> ! {
    let mut cli = Cli::command();
    cli.build();
    match cli.find_subcommand_mut(sub) {
        Some(cmd) => cmd.error(kind, message).exit(),
        None => cli.error(kind, message).exit(),
    }
}

struct Ctx {
    client: Client,
    json: bool,
}

impl Ctx {
    fn new(global: &GlobalOpts, local: &LocalOpts) -> anyhow::Result<Ctx> {
        let url = [&local.url, &global.url]
            .into_iter()
            .flatten()
            .find(|u| !u.trim().is_empty())
            .map_or(koder_sdk::DEFAULT_URL, String::as_str);
        let key = [&local.api_key, &global.api_key]
            .into_iter()
            .flatten()
            .find(|k| !k.is_empty())
            .map_or("", String::as_str);
        Ok(Ctx {
            client: Client::new(url, key)?,
            json: global.json || local.json,
        })
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(dispatch(cli));
    // Don't wait for stray blocking reads (e.g. stdin) to finish.
    runtime.shutdown_background();
    let code = match result {
        Ok(code) => code,
        Err(err) => {
            print_error(&err);
            1
        }
    };
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn print_error(err: &anyhow::Error) {
    match err.downcast_ref::<koder_sdk::Error>() {
        Some(koder_sdk::Error::Api {
            code,
            message,
            details,
            ..
        }) => {
            eprintln!("error: {code}: {message}");
            if let Some(details) = details {
                eprintln!("  details: {details}");
            }
        }
        _ => eprintln!("error: {err:#}"),
    }
}

async fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    let g = &cli.global;
    match cli.command {
        Command::Serve(args) => {
            koder_daemon::serve(args).await?;
            Ok(0)
        }
        Command::Create(a) => cmd_create(Ctx::new(g, &a.c)?, a).await,
        Command::Ls(a) => cmd_ls(Ctx::new(g, &a.c)?).await,
        Command::Info(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            let info = ctx.client.get_session(&a.session).await?;
            println!("{}", serde_json::to_string_pretty(&info)?);
            Ok(0)
        }
        Command::Exec(a) => cmd_exec(Ctx::new(g, &a.c)?, a).await,
        Command::Run(a) => cmd_run(Ctx::new(g, &a.c)?, a).await,
        Command::Cp(a) => cmd_cp(Ctx::new(g, &a.c)?, a).await,
        Command::Rm(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            for path in &a.paths {
                ctx.client.remove(&a.session, path, a.recursive).await?;
            }
            Ok(0)
        }
        Command::Kill(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            for id in &a.sessions {
                ctx.client.destroy_session(id).await?;
            }
            Ok(0)
        }
        Command::Files(a) => cmd_files(Ctx::new(g, &a.c)?, a).await,
        Command::Mkdir(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            ctx.client.mkdir(&a.session, &a.path).await?;
            Ok(0)
        }
        Command::Mv(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            ctx.client.rename(&a.session, &a.from, &a.to).await?;
            Ok(0)
        }
        Command::Timeout(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            let info = ctx.client.set_timeout(&a.session, a.secs).await?;
            if ctx.json {
                println!("{}", serde_json::to_string(&info)?);
            } else {
                println!(
                    "{}",
                    info.expires_at
                        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                );
            }
            Ok(0)
        }
        Command::Metrics(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            let m = ctx.client.session_metrics(&a.session).await?;
            println!("{}", serde_json::to_string_pretty(&m)?);
            Ok(0)
        }
        Command::Admin(a) => cmd_admin(g, a).await,
        Command::Image(ImageCommand::Build(a)) => cmd_image_build(a).await,
        Command::Shell(a) => cmd_shell(Ctx::new(g, &a.c)?, &a.session, &[]).await,
        Command::Attach(a) => cmd_shell(Ctx::new(g, &a.c)?, &a.session, &a.cmd).await,
        Command::Logs(a) => cmd_logs(Ctx::new(g, &a.c)?, a).await,
        Command::Watch(a) => cmd_watch(Ctx::new(g, &a.c)?, a).await,
        Command::Audit(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            let verdict = (a.allowed || a.denied).then_some(a.allowed);
            let page = ctx
                .client
                .network_audit(a.session.as_deref(), verdict, None, a.limit)
                .await?;
            if ctx.json {
                println!("{}", serde_json::to_string(&page)?);
            } else {
                for e in page.entries {
                    let verdict = if e.allowed { "allow" } else { "deny " };
                    let name = e.name.map(|n| format!(" ({n})")).unwrap_or_default();
                    println!(
                        "{}\t{verdict}\t{}\t{}:{}{name}\t{}\t{}",
                        e.at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                        e.proto,
                        e.dest,
                        e.port,
                        e.session_id,
                        e.reason
                    );
                }
            }
            Ok(0)
        }
        Command::Health(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            let ok = ctx.client.health().await;
            if ctx.json {
                println!("{}", serde_json::json!({ "ok": ok }));
            } else {
                println!("{}", if ok { "ok" } else { "unreachable" });
            }
            Ok(if ok { 0 } else { 1 })
        }
    }
}

/// The admin key: explicit `--api-key`, else KSANDBOX_ADMIN_KEY, else KSANDBOX_API_KEY.
fn admin_ctx(g: &GlobalOpts, local: &LocalOpts) -> anyhow::Result<Ctx> {
    let mut local = LocalOpts {
        url: local.url.clone(),
        api_key: local.api_key.clone(),
        json: local.json,
    };
    if local.api_key.is_none() {
        local.api_key = std::env::var("KSANDBOX_ADMIN_KEY")
            .ok()
            .filter(|k| !k.is_empty());
    }
    Ctx::new(g, &local)
}

async fn cmd_admin(g: &GlobalOpts, a: AdminArgs) -> anyhow::Result<i32> {
    let AdminCommand::Tenant(cmd) = a.what;
    let print_tenant = |ctx: &Ctx, t: &types::TenantInfo| -> anyhow::Result<()> {
        if ctx.json {
            println!("{}", serde_json::to_string(t)?);
        } else {
            let quota = |v: Option<String>| v.unwrap_or_else(|| "-".into());
            println!(
                "{}\t{}\tsessions {}/{}\tminutes today {}/{}",
                t.id,
                t.plan,
                t.live_sessions,
                quota(t.max_sessions.map(|m| m.to_string())),
                t.session_minutes_today,
                quota(t.daily_session_minutes.map(|m| m.to_string()))
            );
        }
        Ok(())
    };
    match cmd {
        TenantCommand::Ls(o) => {
            let ctx = admin_ctx(g, &o.c)?;
            let tenants = ctx.client.admin_tenants().await?;
            if ctx.json {
                println!("{}", serde_json::to_string(&tenants)?);
            } else {
                for t in &tenants {
                    print_tenant(&ctx, t)?;
                }
            }
        }
        TenantCommand::Get(t) => {
            let ctx = admin_ctx(g, &t.c)?;
            print_tenant(&ctx, &ctx.client.admin_tenant(&t.tenant).await?)?;
        }
        TenantCommand::Set(t) => {
            let ctx = admin_ctx(g, &t.c)?;
            let req = types::PutTenant {
                name: t.name,
                plan: t.plan,
                max_sessions: t.max_sessions,
                daily_session_minutes: t.daily_session_minutes,
            };
            print_tenant(&ctx, &ctx.client.admin_put_tenant(&t.tenant, &req).await?)?;
        }
        TenantCommand::Key(t) => {
            let ctx = admin_ctx(g, &t.c)?;
            let issued = ctx.client.admin_issue_key(&t.tenant).await?;
            if ctx.json {
                println!("{}", serde_json::to_string(&issued)?);
            } else {
                println!("{}", issued.api_key);
            }
        }
    }
    Ok(0)
}

fn create_request(
    language: Option<String>,
    env: &[(String, String)],
    opts: &SessionOpts,
) -> CreateSession {
    let limits = Limits {
        cpu_millis: opts.cpu_millis,
        memory_mib: opts.memory_mib,
        disk_mib: opts.disk_mib,
        pids: opts.pids,
    };
    let network = opts.network.as_deref().map(|mode| Network {
        mode: match mode {
            "open" => types::NetworkMode::Open,
            "allowlist" => types::NetworkMode::Allowlist,
            _ => types::NetworkMode::None,
        },
        allow: opts.allow.clone(),
    });
    CreateSession {
        language,
        image: opts.image.clone(),
        runtime: opts.runtime.clone(),
        limits: (limits != Limits::default()).then_some(limits),
        network,
        env: env.iter().cloned().collect(),
        timeout_s: opts.timeout,
        metadata: opts.meta.iter().cloned().collect(),
    }
}

async fn cmd_create(ctx: Ctx, a: CreateArgs) -> anyhow::Result<i32> {
    if !a.session.allow.is_empty() && a.session.network.as_deref() != Some("allowlist") {
        usage_error(
            "create",
            clap::error::ErrorKind::ArgumentConflict,
            "--allow needs --network allowlist",
        );
    }
    let req = create_request(a.language, &a.env, &a.session);
    let session = ctx.client.create_session(&req).await?;
    if ctx.json {
        println!("{}", serde_json::to_string(session.info())?);
    } else {
        println!("{}", session.id());
    }
    Ok(0)
}

fn format_time(t: &chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S").to_string()
}

fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        out
    };
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{}", line(header.to_vec()));
    for row in rows {
        let _ = writeln!(stdout, "{}", line(row.iter().map(String::as_str).collect()));
    }
}

async fn cmd_ls(ctx: Ctx) -> anyhow::Result<i32> {
    let sessions = ctx.client.list_sessions().await?;
    if ctx.json {
        println!("{}", serde_json::to_string(&sessions)?);
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = sessions
        .iter()
        .map(|s| {
            vec![
                s.id.clone(),
                s.language.clone(),
                s.state.as_str().to_string(),
                format_time(&s.created_at),
                format_time(&s.expires_at),
            ]
        })
        .collect();
    print_table(&["ID", "LANGUAGE", "STATE", "CREATED", "EXPIRES"], &rows);
    Ok(0)
}

async fn cmd_files(ctx: Ctx, a: FilesArgs) -> anyhow::Result<i32> {
    let list = ctx.client.list_files(&a.session, &a.path, a.depth).await?;
    if ctx.json {
        println!("{}", serde_json::to_string(&list)?);
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = list
        .entries
        .iter()
        .map(|e| {
            let kind = match e.kind {
                types::EntryType::File => "file",
                types::EntryType::Dir => "dir",
                types::EntryType::Symlink => "symlink",
                types::EntryType::Other => "other",
            };
            let path = match &e.symlink_target {
                Some(t) => format!("{} -> {t}", e.path),
                None => e.path.clone(),
            };
            vec![
                kind.to_string(),
                e.size.to_string(),
                format!("{:04o}", e.mode & 0o7777),
                format_time(&e.modified_at),
                path,
            ]
        })
        .collect();
    print_table(&["TYPE", "SIZE", "MODE", "MODIFIED", "PATH"], &rows);
    if list.truncated {
        eprintln!("ksandbox: listing truncated by the daemon");
    }
    Ok(0)
}

async fn read_stdin_file(spec: &str) -> anyhow::Result<String> {
    let bytes = if spec == "-" {
        let mut buf = Vec::new();
        tokio::io::stdin()
            .read_to_end(&mut buf)
            .await
            .context("reading standard input")?;
        buf
    } else {
        tokio::fs::read(spec)
            .await
            .with_context(|| format!("reading {spec}"))?
    };
    String::from_utf8(bytes).map_err(|_| anyhow!("stdin input {spec} is not UTF-8 text"))
}

async fn apply_exec_opts(req: &mut ExecRequest, opts: &ExecOpts) -> anyhow::Result<()> {
    req.cwd = opts.cwd.clone();
    req.env = opts.env.iter().cloned().collect::<BTreeMap<_, _>>();
    req.timeout_ms = opts.timeout_ms;
    if let Some(spec) = &opts.stdin_file {
        req.stdin = Some(read_stdin_file(spec).await?);
    }
    Ok(())
}

/// The shell-style exit status for an exec result.
fn exit_status(r: &ExecResult) -> i32 {
    let code = match (r.exit_code, r.signal) {
        (Some(code), _) if (0..=255).contains(&code) => code,
        (None, Some(sig)) if (1..=127).contains(&sig) => 128 + sig,
        _ => 1,
    };
    if code == 0 && r.verdict.is_some() {
        1
    } else {
        code
    }
}

fn describe_verdict(code: &str) -> &'static str {
    match code {
        koder_sdk::codes::EXEC_KILLED_OOM => "killed: out of memory",
        koder_sdk::codes::EXEC_TIMEOUT => "killed: time limit exceeded",
        koder_sdk::codes::EXEC_KILLED_CPU => "killed: CPU limit exceeded",
        koder_sdk::codes::EXEC_KILLED_PIDS => "killed: process limit exceeded",
        koder_sdk::codes::EXEC_KILLED => "killed",
        _ => "ended abnormally",
    }
}

/// Prints an exec result and returns the process-style exit status.
fn report_exec(result: &ExecResult, json: bool) -> anyhow::Result<i32> {
    if json {
        println!("{}", serde_json::to_string(result)?);
    } else {
        // Write errors (a closed pipe) must not hide the exit status.
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(result.stdout.as_bytes());
        let _ = out.flush();
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(result.stderr.as_bytes());
        let _ = err.flush();
    }
    if result.stdout_truncated {
        eprintln!("ksandbox: stdout was truncated by the daemon");
    }
    if result.stderr_truncated {
        eprintln!("ksandbox: stderr was truncated by the daemon");
    }
    if let Some(verdict) = &result.verdict {
        let signal = result
            .signal
            .map(|s| format!(" (signal {s})"))
            .unwrap_or_default();
        eprintln!("ksandbox: {verdict}: {}{signal}", describe_verdict(verdict));
    }
    Ok(exit_status(result))
}

async fn cmd_exec(ctx: Ctx, a: ExecArgs) -> anyhow::Result<i32> {
    let mut req = ExecRequest::default();
    match a.shell {
        Some(shell) => req.shell = Some(shell),
        None => req.cmd = Some(a.cmd),
    }
    apply_exec_opts(&mut req, &a.exec).await?;
    if a.background {
        let exec_id = ctx.client.exec_background(&a.session, &req).await?;
        println!("{exec_id}");
        return Ok(0);
    }
    let streaming = a.stream
        || (!a.no_stream && !ctx.json && std::io::IsTerminal::is_terminal(&std::io::stdout()));
    if !streaming {
        let result = ctx.client.exec(&a.session, &req).await?;
        return report_exec(&result, ctx.json);
    }
    let events = ctx.client.exec_stream(&a.session, &req).await?;
    print_stream(events).await
}

/// Copies streamed output to stdout/stderr as it arrives; the exit code is the exec's.
async fn print_stream(
    events: impl futures::Stream<Item = koder_sdk::Result<koder_sdk::live::ExecEvent>>,
) -> anyhow::Result<i32> {
    use koder_sdk::live::ExecEvent;
    futures::pin_mut!(events);
    while let Some(event) = events.next().await {
        match event? {
            ExecEvent::Stdout(b) => {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(&b);
                let _ = out.flush();
            }
            ExecEvent::Stderr(b) => {
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(&b);
                let _ = err.flush();
            }
            ExecEvent::Truncated { dropped_chunks } => {
                eprintln!(
                    "ksandbox: output skipped ({dropped_chunks} chunks) while this client lagged"
                );
            }
            ExecEvent::Exit(result) => return report_exec(&result, false),
            ExecEvent::Start { .. } => {}
        }
    }
    bail!("the stream ended before the exec did")
}

async fn cmd_logs(ctx: Ctx, a: LogsArgs) -> anyhow::Result<i32> {
    if a.list {
        let execs = ctx.client.list_execs(&a.session).await?;
        if ctx.json {
            println!("{}", serde_json::to_string(&execs)?);
        } else {
            for e in execs {
                let state = match e.state {
                    types::ExecState::Running => "running".to_string(),
                    types::ExecState::Exited => format!(
                        "exited {}",
                        e.result
                            .as_ref()
                            .and_then(|r| r.exit_code)
                            .map_or("-".into(), |c| c.to_string())
                    ),
                };
                println!("{}\t{state}\t{}", e.exec_id, e.command.join(" "));
            }
        }
        return Ok(0);
    }
    let exec_id = a
        .exec_id
        .ok_or_else(|| anyhow!("name an exec id, or use --list"))?;
    let events = ctx.client.follow_exec(&a.session, &exec_id).await?;
    print_stream(events).await
}

async fn cmd_watch(ctx: Ctx, a: WatchArgs) -> anyhow::Result<i32> {
    let events = ctx.client.watch(&a.session, &a.path, a.recursive).await?;
    futures::pin_mut!(events);
    while let Some(ev) = events.next().await {
        let ev = ev?;
        if ctx.json {
            println!("{ev}");
        } else {
            let from = ev["from"]
                .as_str()
                .map(|f| format!(" (from {f})"))
                .unwrap_or_default();
            println!(
                "{}\t{}{from}",
                ev["type"].as_str().unwrap_or("?"),
                ev["path"].as_str().unwrap_or("?")
            );
        }
    }
    Ok(0)
}

async fn cmd_shell(ctx: Ctx, session: &str, argv: &[String]) -> anyhow::Result<i32> {
    terminal::run(&ctx.client, session, argv).await
}

/// `python` for `x.py`, and so on.
fn infer_language(path: &Path) -> Option<&'static str> {
    match path.extension()?.to_str()? {
        "py" => Some("python"),
        "js" | "mjs" | "cjs" => Some("node"),
        "sh" | "bash" => Some("bash"),
        _ => None,
    }
}

/// SIGINT / SIGTERM / SIGHUP, installed before anything is created so they can't kill us
/// between creating and destroying a session.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// The number of the next signal received.
    async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = self.int.recv() => 2,
            _ = self.term.recv() => 15,
            _ = self.hup.recv() => 1,
        }
    }
}

async fn cmd_run(ctx: Ctx, a: RunArgs) -> anyhow::Result<i32> {
    use clap::error::ErrorKind;
    // Build everything local first so a bad argument never leaves a session behind.
    let language = match (&a.language, &a.file) {
        (Some(l), _) => l.clone(),
        (None, Some(file)) => match infer_language(file) {
            Some(l) => l.to_string(),
            None => usage_error(
                "run",
                ErrorKind::MissingRequiredArgument,
                format!(
                    "cannot infer the language of {} (use .py, .js or .sh, or name the LANGUAGE)",
                    file.display()
                ),
            ),
        },
        (None, None) => usage_error(
            "run",
            ErrorKind::MissingRequiredArgument,
            "run needs a LANGUAGE (or --file with a .py, .js or .sh extension)",
        ),
    };
    let mut req = ExecRequest::default();
    if !a.args.is_empty() {
        req.cmd = Some(a.args.clone());
    } else {
        let code = match (&a.code, &a.file) {
            (Some(code), _) => code.clone(),
            (None, Some(file)) => {
                let bytes = tokio::fs::read(file)
                    .await
                    .with_context(|| format!("reading {}", file.display()))?;
                String::from_utf8(bytes)
                    .map_err(|_| anyhow!("{} is not UTF-8 text", file.display()))?
            }
            (None, None) => {
                if a.exec.stdin_file.as_deref() == Some("-") {
                    usage_error(
                        "run",
                        ErrorKind::ArgumentConflict,
                        "give the code with -c or --file when --stdin-file is -",
                    );
                }
                read_stdin_file("-").await?
            }
        };
        req.code = Some(code);
        req.language = Some(language.clone());
    }
    apply_exec_opts(&mut req, &a.exec).await?;
    let create = create_request(Some(language), &[], &a.session);

    let mut signals = Signals::install()?;
    let mut interrupted = None;
    let session = {
        let creating = ctx.client.create_session(&create);
        tokio::pin!(creating);
        tokio::select! {
            r = &mut creating => r?,
            sig = signals.recv() => {
                // Let the creation finish so the session can be destroyed.
                interrupted = Some(sig);
                creating.await?
            }
        }
    };
    let outcome = match interrupted {
        Some(sig) => Err(sig),
        None => tokio::select! {
            r = session.exec(&req) => Ok(r),
            sig = signals.recv() => Err(sig),
        },
    };
    let id = session.id().to_string();
    let destroyed = session.destroy().await;
    if let Err(e) = &destroyed {
        eprintln!("ksandbox: warning: could not destroy session {id}: {e}");
    }
    match outcome {
        Err(sig) => {
            eprintln!("ksandbox: interrupted");
            Ok(128 + sig)
        }
        Ok(result) => report_exec(&result?, ctx.json),
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Loc {
    Stdio,
    Local(PathBuf),
    Remote { session: String, path: String },
}

/// `SESSION:/path` (a relative path is under /workspace), `-`, or a local path. A local path
/// with a `:` can be written `./a:b`.
fn parse_loc(s: &str) -> Loc {
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

fn remote_basename(path: &str) -> Option<&str> {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty())
}

async fn cmd_cp(ctx: Ctx, a: CpArgs) -> anyhow::Result<i32> {
    use clap::error::ErrorKind;
    let (src, dst) = (parse_loc(&a.src), parse_loc(&a.dst));
    let client = &ctx.client;
    let entry = match (src, dst) {
        (Loc::Local(local), Loc::Remote { session, path }) => {
            let path = if path.ends_with('/') {
                let name = local
                    .file_name()
                    .and_then(|n| n.to_str())
                    .ok_or_else(|| anyhow!("{} has no file name", local.display()))?;
                format!("{path}{name}")
            } else {
                path
            };
            let meta = tokio::fs::metadata(&local)
                .await
                .with_context(|| format!("{}", local.display()))?;
            if meta.is_dir() {
                bail!(
                    "{} is a directory (cp copies single files)",
                    local.display()
                );
            }
            Some(client.upload_file(&session, &path, &local).await?)
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
            let is_dir = a.dst.ends_with('/')
                || tokio::fs::metadata(&local)
                    .await
                    .map(|m| m.is_dir())
                    .unwrap_or(false);
            let target = if is_dir {
                let name =
                    remote_basename(&path).ok_or_else(|| anyhow!("{path} has no file name"))?;
                local.join(name)
            } else {
                local
            };
            download_to_file(client, &session, &path, &target).await?;
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
            ErrorKind::InvalidValue,
            "cp needs SESSION:/path on at least one side",
        ),
    };
    if ctx.json {
        if let Some(entry) = entry {
            println!("{}", serde_json::to_string(&entry)?);
        }
    }
    Ok(0)
}

/// Streams a sandbox file into `target`; a failed copy leaves no partial file behind.
async fn download_to_file(
    client: &Client,
    session: &str,
    path: &str,
    target: &Path,
) -> anyhow::Result<()> {
    // Ask first, so a missing remote file doesn't create or truncate the local one.
    let stream = client.download_stream(session, path).await?;
    let file = tokio::fs::File::create(target)
        .await
        .with_context(|| format!("creating {}", target.display()))?;
    let mut writer = tokio::io::BufWriter::with_capacity(64 * 1024, file);
    let copied: anyhow::Result<()> = async {
        use tokio::io::AsyncWriteExt as _;
        let mut stream = std::pin::pin!(stream);
        while let Some(chunk) = stream.next().await {
            writer.write_all(&chunk?).await?;
        }
        writer.flush().await?;
        Ok(())
    }
    .await;
    if copied.is_err() {
        let _ = tokio::fs::remove_file(target).await;
    }
    copied
}

async fn cmd_image_build(a: ImageBuildArgs) -> anyhow::Result<i32> {
    std::fs::create_dir_all(&a.images_dir)?;
    let opts = koder_microvm::image::BuildOptions {
        images_dir: a.images_dir.clone(),
        kernel_deb: a.kernel_deb,
        force: a.force,
    };
    let started = std::time::Instant::now();
    // Minutes of blocking work (package download, mkfs of a few GiB).
    let image = tokio::task::spawn_blocking(move || koder_microvm::image::build(&opts)).await??;
    println!(
        "microvm image ready in {:.1}s: kernel {} ({}), root disk {}",
        started.elapsed().as_secs_f64(),
        image.kernel_version,
        image.vmlinux.display(),
        image.rootfs.display()
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("ksandbox").chain(args.iter().copied()))
    }

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn exec_forms() {
        let cli = parse(&["exec", "s1", "--cwd", "/tmp", "--", "sh", "-c", "exit 3"]).unwrap();
        let Command::Exec(a) = cli.command else {
            panic!("not exec")
        };
        assert_eq!(a.cmd, ["sh", "-c", "exit 3"]);
        assert_eq!(a.exec.cwd.as_deref(), Some("/tmp"));

        let cli = parse(&["exec", "s1", "ls", "-la", "--json"]).unwrap();
        let Command::Exec(a) = cli.command else {
            panic!("not exec")
        };
        assert_eq!(a.cmd, ["ls", "-la", "--json"]);
        assert!(!a.c.json);

        let cli = parse(&["--json", "exec", "s1", "--shell", "echo hi", "-e", "A=b=c"]).unwrap();
        assert!(cli.global.json);
        let Command::Exec(a) = cli.command else {
            panic!("not exec")
        };
        assert_eq!(a.shell.as_deref(), Some("echo hi"));
        assert_eq!(a.exec.env, [("A".to_string(), "b=c".to_string())]);

        assert!(parse(&["exec", "s1"]).is_err());
        assert!(parse(&["exec", "s1", "--shell", "x", "--", "ls"]).is_err());
        assert!(parse(&["exec", "s1", "--env", "novalue", "--", "ls"]).is_err());
    }

    #[test]
    fn local_options_override_global_ones() {
        let cli = parse(&[
            "--url",
            "http://a:1",
            "ls",
            "--url",
            "http://b:2",
            "--api-key",
            "k",
        ])
        .unwrap();
        let Command::Ls(a) = &cli.command else {
            panic!("not ls")
        };
        let ctx = Ctx::new(&cli.global, &a.c).unwrap();
        assert_eq!(ctx.client.base_url().as_str(), "http://b:2/");
        assert!(!ctx.json);
        let cli = parse(&["ls", "--json"]).unwrap();
        let Command::Ls(a) = &cli.command else {
            panic!("not ls")
        };
        assert!(Ctx::new(&cli.global, &a.c).unwrap().json);
    }

    #[test]
    fn serve_takes_the_daemon_flags() {
        let cli = parse(&[
            "serve",
            "--listen",
            "127.0.0.1:9999",
            "--api-key",
            "t1:k1",
            "--api-key",
            "t2:k2",
        ])
        .unwrap();
        let Command::Serve(args) = cli.command else {
            panic!("not serve")
        };
        assert_eq!(args.api_keys, ["t1:k1", "t2:k2"]);
    }

    #[test]
    fn run_and_create_forms() {
        let cli = parse(&["run", "python", "-c", "print(1)"]).unwrap();
        let Command::Run(a) = cli.command else {
            panic!("not run")
        };
        assert_eq!(a.language.as_deref(), Some("python"));
        assert_eq!(a.code.as_deref(), Some("print(1)"));

        let cli = parse(&["run", "--file", "x.py"]).unwrap();
        let Command::Run(a) = cli.command else {
            panic!("not run")
        };
        assert_eq!(a.language, None);
        assert_eq!(a.file, Some(PathBuf::from("x.py")));

        let cli = parse(&["run", "bash", "--", "ls", "-la"]).unwrap();
        let Command::Run(a) = cli.command else {
            panic!("not run")
        };
        assert_eq!(a.args, ["ls", "-la"]);
        assert!(parse(&["run", "python", "-c", "1", "--", "ls"]).is_err());

        let cli = parse(&[
            "create",
            "--language",
            "python",
            "--timeout",
            "60",
            "--memory-mib",
            "256",
            "--env",
            "A=1",
            "--meta",
            "owner=me",
        ])
        .unwrap();
        let Command::Create(a) = cli.command else {
            panic!("not create")
        };
        let req = create_request(a.language, &a.env, &a.session);
        assert_eq!(
            serde_json::to_value(&req).unwrap(),
            serde_json::json!({"language": "python", "limits": {"memory_mib": 256},
                "env": {"A": "1"}, "timeout_s": 60, "metadata": {"owner": "me"}})
        );
        assert!(parse(&["kill", "a", "b"]).is_ok());
        assert!(parse(&["destroy", "a"]).is_ok());
        assert!(parse(&["rm", "s1", "-r", "/workspace/d"]).is_ok());
        assert!(parse(&["rm", "s1"]).is_err());
    }

    #[test]
    fn cp_locations() {
        assert_eq!(
            parse_loc("s123:/workspace/a.py"),
            Loc::Remote {
                session: "s123".into(),
                path: "/workspace/a.py".into()
            }
        );
        assert_eq!(
            parse_loc("s1:out.txt"),
            Loc::Remote {
                session: "s1".into(),
                path: "/workspace/out.txt".into()
            }
        );
        assert_eq!(parse_loc("./a:b"), Loc::Local("./a:b".into()));
        assert_eq!(parse_loc("a.py"), Loc::Local("a.py".into()));
        assert_eq!(parse_loc(":x"), Loc::Local(":x".into()));
        assert_eq!(parse_loc("-"), Loc::Stdio);
        assert_eq!(remote_basename("/workspace/out.txt"), Some("out.txt"));
        assert_eq!(remote_basename("/"), None);
    }

    #[test]
    fn languages_and_exit_statuses() {
        assert_eq!(infer_language(Path::new("a/b.py")), Some("python"));
        assert_eq!(infer_language(Path::new("b.js")), Some("node"));
        assert_eq!(infer_language(Path::new("b.sh")), Some("bash"));
        assert_eq!(infer_language(Path::new("b.rb")), None);
        assert_eq!(infer_language(Path::new("Makefile")), None);

        let mut r = ExecResult {
            exec_id: "e".into(),
            exit_code: Some(3),
            signal: None,
            stdout: String::new(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            duration_ms: 1,
            peak_memory_kib: None,
            verdict: None,
        };
        assert_eq!(exit_status(&r), 3);
        r.exit_code = None;
        r.signal = Some(9);
        r.verdict = Some("SANDBOX-EXEC-TIMEOUT".into());
        assert_eq!(exit_status(&r), 137);
        r.exit_code = Some(0);
        assert_eq!(exit_status(&r), 1);
        r.signal = None;
        r.exit_code = None;
        r.verdict = None;
        assert_eq!(exit_status(&r), 1);
    }
}
