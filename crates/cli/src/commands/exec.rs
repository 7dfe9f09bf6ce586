//! exec and run.

use std::collections::BTreeMap;
use std::path::Path;

use clap::error::ErrorKind;
use koder_sdk::ExecRequest;
use tokio::io::AsyncReadExt as _;

use super::sessions::{check_allowlist, create_request};
use super::Ctx;
use crate::args::{usage_error, ExecArgs, ExecOpts, RunArgs};
use crate::error::{CliError, IoContext as _, Result};
use crate::output::{print_result, print_stream};

async fn read_stdin_file(spec: &str) -> Result<String> {
    let bytes = if spec == "-" {
        let mut buf = Vec::new();
        tokio::io::stdin()
            .read_to_end(&mut buf)
            .await
            .doing(|| "reading standard input".into())?;
        buf
    } else {
        tokio::fs::read(spec)
            .await
            .doing(|| format!("reading {spec}"))?
    };
    String::from_utf8(bytes)
        .map_err(|_| CliError::msg(format!("stdin input {spec} is not UTF-8 text")))
}

async fn apply_exec_opts(req: &mut ExecRequest, opts: &ExecOpts) -> Result<()> {
    req.cwd = opts.cwd.clone();
    req.env = opts.env.iter().cloned().collect::<BTreeMap<_, _>>();
    req.timeout_ms = opts.timeout_ms;
    if let Some(spec) = &opts.stdin_file {
        req.stdin = Some(read_stdin_file(spec).await?);
    }
    Ok(())
}

pub async fn exec(ctx: Ctx, a: ExecArgs) -> Result<i32> {
    let mut req = ExecRequest::default();
    match a.shell {
        Some(shell) => req.shell = Some(shell),
        None => req.cmd = Some(a.cmd),
    }
    apply_exec_opts(&mut req, &a.exec).await?;
    if a.background {
        let exec_id = ctx.client.exec_background(&a.session, &req).await?;
        let started = serde_json::json!({ "exec_id": exec_id });
        ctx.out.print(&started, |_| exec_id.clone())?;
        return Ok(0);
    }
    let streaming = a.stream
        || (!a.no_stream && !ctx.out.json && std::io::IsTerminal::is_terminal(&std::io::stdout()));
    if !streaming {
        let result = ctx.client.exec(&a.session, &req).await?;
        return print_result(&result, ctx.out.json);
    }
    let events = ctx.client.exec_stream(&a.session, &req).await?;
    print_stream(events, ctx.out.json).await
}

/// `python` for `x.py`, and so on.
pub(crate) fn infer_language(path: &Path) -> Option<&'static str> {
    match path.extension()?.to_str()? {
        "py" => Some("python"),
        "js" | "mjs" | "cjs" => Some("node"),
        "sh" | "bash" => Some("bash"),
        _ => None,
    }
}

fn run_language(a: &RunArgs) -> String {
    match (&a.language, &a.file) {
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
    }
}

async fn run_code(a: &RunArgs) -> Result<String> {
    match (&a.code, &a.file) {
        (Some(code), _) => Ok(code.clone()),
        (None, Some(file)) => {
            let bytes = tokio::fs::read(file)
                .await
                .doing(|| format!("reading {}", file.display()))?;
            String::from_utf8(bytes)
                .map_err(|_| CliError::msg(format!("{} is not UTF-8 text", file.display())))
        }
        (None, None) => {
            if a.exec.stdin_file.as_deref() == Some("-") {
                usage_error(
                    "run",
                    ErrorKind::ArgumentConflict,
                    "give the code with -c or --file when --stdin-file is -",
                );
            }
            read_stdin_file("-").await
        }
    }
}

pub async fn run(ctx: Ctx, a: RunArgs) -> Result<i32> {
    // Build everything local first so a bad argument never leaves a session behind.
    check_allowlist("run", &a.session);
    let language = run_language(&a);
    let mut req = ExecRequest::default();
    if a.args.is_empty() {
        req.code = Some(run_code(&a).await?);
        req.language = Some(language.clone());
    } else {
        req.cmd = Some(a.args.clone());
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
    if let Err(e) = session.destroy().await {
        eprintln!("ksandbox: warning: could not destroy session {id}: {e}");
    }
    match outcome {
        Err(sig) => {
            eprintln!("ksandbox: interrupted");
            Ok(128 + sig)
        }
        Ok(result) => print_result(&result?, ctx.out.json),
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
    fn install() -> Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        let install = |kind| signal(kind).doing(|| "installing signal handlers".into());
        Ok(Signals {
            int: install(SignalKind::interrupt())?,
            term: install(SignalKind::terminate())?,
            hup: install(SignalKind::hangup())?,
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
