//! context create/ls/rm/restart and run-code: stateful interpreters in a session.

use std::io::IsTerminal as _;
use std::path::Path;

use base64::Engine as _;
use futures::StreamExt as _;
use koder_sdk::interp::{
    Context, CreateContext, RichOutput, RunCode, RunEvent, RunResult, DEFAULT_CONTEXT,
};
use tokio::io::AsyncReadExt as _;

use super::Ctx;
use crate::args::{ContextCommand, GlobalOpts, RunCodeArgs};
use crate::error::{CliError, IoContext as _, Result};
use crate::output::{self, print_line};

pub async fn context(g: &GlobalOpts, cmd: ContextCommand) -> Result<i32> {
    match cmd {
        ContextCommand::Create(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            let req = CreateContext {
                language: Some(a.language.as_str().to_string()),
                cwd: a.cwd,
                env: a.env.into_iter().collect(),
            };
            let created = ctx.client.create_context(&a.session, &req).await?;
            ctx.out.print(&created, |c| c.context_id.clone())?;
        }
        ContextCommand::Ls(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            let contexts = ctx.client.list_contexts(&a.session).await?;
            ctx.out.print(&contexts, |c| output::contexts_table(c))?;
        }
        ContextCommand::Rm(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            for id in &a.contexts {
                ctx.client.delete_context(&a.session, id).await?;
            }
        }
        ContextCommand::Restart(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            let context: Context = ctx.client.restart_context(&a.session, &a.context).await?;
            ctx.out.print(&context, |c| {
                output::contexts_table(std::slice::from_ref(c))
            })?;
        }
    }
    Ok(0)
}

async fn code_of(arg: &str) -> Result<String> {
    if arg != "-" {
        return Ok(arg.to_string());
    }
    let mut code = String::new();
    tokio::io::stdin()
        .read_to_string(&mut code)
        .await
        .doing(|| "reading the code from standard input".into())?;
    Ok(code)
}

pub async fn run_code(ctx: Ctx, a: RunCodeArgs) -> Result<i32> {
    let req = RunCode {
        code: code_of(&a.code).await?,
        timeout_ms: a.timeout_ms,
        env: a.env.iter().cloned().collect(),
    };
    let streaming = a.stream || (!a.no_stream && !ctx.out.json && std::io::stdout().is_terminal());
    let (context, throwaway) = match (&a.context, a.language) {
        (Some(id), _) => (id.clone(), false),
        (None, Some(language)) => {
            let create = CreateContext {
                language: Some(language.as_str().to_string()),
                ..CreateContext::default()
            };
            let made = ctx.client.create_context(&a.session, &create).await?;
            (made.context_id, true)
        }
        (None, None) => (DEFAULT_CONTEXT.to_string(), false),
    };
    let outcome = if streaming {
        run_streamed(&ctx, &a.session, &context, &req).await
    } else {
        ctx.client
            .run_in_context(&a.session, &context, &req)
            .await
            .map_err(CliError::from)
    };
    if throwaway {
        if let Err(e) = ctx.client.delete_context(&a.session, &context).await {
            eprintln!("ksandbox: warning: could not remove context {context}: {e}");
        }
    }
    let result = outcome?;
    if ctx.out.json && !streaming {
        print_line(&serde_json::to_string(&result)?);
    } else if !streaming {
        write_out(&result.stdout, &result.stderr);
    }
    report(&result, a.save_results.as_deref(), ctx.out.json)
}

fn write_out(stdout: &str, stderr: &str) {
    use std::io::Write as _;
    let _ = std::io::stdout().lock().write_all(stdout.as_bytes());
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().lock().write_all(stderr.as_bytes());
}

/// Prints output events as they come (as JSON lines with `--json`); returns the result.
async fn run_streamed(ctx: &Ctx, session: &str, context: &str, req: &RunCode) -> Result<RunResult> {
    let events = ctx
        .client
        .run_in_context_stream(session, context, req)
        .await?;
    futures::pin_mut!(events);
    while let Some(event) = events.next().await {
        let event = event?;
        if ctx.out.json {
            print_line(&event_json(&event)?.to_string());
        }
        match event {
            RunEvent::Stdout(text) if !ctx.out.json => write_out(&text, ""),
            RunEvent::Stderr(text) if !ctx.out.json => write_out("", &text),
            RunEvent::Result(result) => return Ok(result),
            _ => {}
        }
    }
    Err(koder_sdk::Error::StreamEnded.into())
}

fn event_json(event: &RunEvent) -> Result<serde_json::Value> {
    use serde_json::json;
    Ok(match event {
        RunEvent::Stdout(text) => json!({"event": "stdout", "data": text}),
        RunEvent::Stderr(text) => json!({"event": "stderr", "data": text}),
        RunEvent::Result(r) => {
            let mut v = serde_json::to_value(r)?;
            if let Some(o) = v.as_object_mut() {
                o.remove("stdout");
                o.remove("stderr");
                o.insert("event".into(), "result".into());
            }
            v
        }
    })
}

/// The results' text on stdout, what else they hold (or where it was saved) and the error on
/// stderr; the exit status: 1 when the code raised or was killed.
fn report(result: &RunResult, save: Option<&Path>, json: bool) -> Result<i32> {
    if let Some(dir) = save {
        std::fs::create_dir_all(dir).doing(|| format!("creating {}", dir.display()))?;
    }
    for (n, rich) in result.results.iter().enumerate() {
        if let (Some(text), false) = (&rich.text, json) {
            print_line(text);
        }
        let files = result_files(rich, n + 1)?;
        match save {
            Some(dir) => {
                for (name, bytes) in &files {
                    let path = dir.join(name);
                    std::fs::write(&path, bytes).doing(|| format!("writing {}", path.display()))?;
                    eprintln!("ksandbox: saved {}", path.display());
                }
            }
            None if !json => {
                // A value's JSON form says nothing its text (printed above) did not.
                let unshown: Vec<_> = files
                    .into_iter()
                    .filter(|(name, _)| rich.text.is_none() || !name.ends_with(".json"))
                    .collect();
                if !unshown.is_empty() {
                    eprintln!(
                        "ksandbox: {} (save with --save-results DIR)",
                        summary(n + 1, &unshown)
                    );
                }
            }
            None => {}
        }
    }
    if !json {
        if let Some(e) = &result.error {
            let trace = e.traceback.trim_end();
            if trace.is_empty() {
                eprintln!("{}: {}", e.name, e.value);
            } else {
                eprintln!("{trace}");
            }
        }
    }
    if let Some(verdict) = &result.verdict {
        eprintln!("ksandbox: {verdict}");
    }
    if result.restarted {
        eprintln!("ksandbox: the interpreter was restarted: its variables are gone");
    }
    Ok(i32::from(
        result.error.is_some() || result.verdict.is_some(),
    ))
}

/// `result-N.EXT` files for a result's representations other than plain text.
pub(crate) fn result_files(r: &RichOutput, n: usize) -> Result<Vec<(String, Vec<u8>)>> {
    let mut files = Vec::new();
    for (ext, image) in [("png", &r.png), ("jpg", &r.jpeg), ("pdf", &r.pdf)] {
        if let Some(b64) = image {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map_err(|e| CliError::msg(format!("result {n}: {ext} is not base64: {e}")))?;
            files.push((format!("result-{n}.{ext}"), bytes));
        }
    }
    let texts = [
        ("svg", r.svg.as_ref()),
        ("html", r.html.as_ref()),
        ("md", r.markdown.as_ref()),
        ("tex", r.latex.as_ref()),
        ("js", r.javascript.as_ref()),
    ];
    for (ext, text) in texts {
        if let Some(text) = text {
            files.push((format!("result-{n}.{ext}"), text.clone().into_bytes()));
        }
    }
    for (name, json) in [("", &r.json), ("-chart", &r.chart), ("-extra", &r.extra)] {
        if let Some(json) = json {
            let pretty = serde_json::to_vec_pretty(json)?;
            files.push((format!("result-{n}{name}.json"), pretty));
        }
    }
    Ok(files)
}

/// `result 2: png (3.1 KiB), html (120 B), chart.json (2 KiB)`.
pub(crate) fn summary(n: usize, files: &[(String, Vec<u8>)]) -> String {
    let prefix = format!("result-{n}");
    let kinds: Vec<String> = files
        .iter()
        .map(|(name, bytes)| {
            let kind = name.strip_prefix(&prefix).unwrap_or(name);
            let kind = kind.trim_start_matches(['.', '-']);
            format!("{kind} ({})", output::format_size(bytes.len() as u64))
        })
        .collect();
    format!("result {n}: {}", kinds.join(", "))
}
