//! The code interpreter of `e2b-code-interpreter` (sandbox port 49999) over the manager's
//! contexts: `POST /execute` answers NDJSON as the run prints, `/contexts` manages contexts.
//!
//! As in E2B, a sandbox has a default context per language (Python, JavaScript) from the
//! start, and contexts start in the default user's home. A client that goes away mid-run
//! interrupts the run (the manager cancels a run nobody follows), keeping the context's state.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Router;
use koder_api_types::codes;
use koder_sessions::{ContextInfo, RichResult, DEFAULT_CONTEXT};
use koder_sessions::{ContextOptions, RunEvent, RunOutput, RunRequest};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::auth::Target;
use super::user::User;
use crate::error::HttpError;
use crate::state::E2b;

/// E2B's default limit of one run (the SDK's `DEFAULT_TIMEOUT`), within the server maximum.
const RUN_TIMEOUT_MS: u64 = 300_000;
const MAX_BODY: usize = 1 << 20;

pub fn router() -> Router<E2b> {
    Router::new()
        .route("/health", get(|_: Target| async { StatusCode::NO_CONTENT }))
        .route("/execute", post(execute))
        .route("/contexts", post(create_context).get(list_contexts))
        .route("/contexts/{cid}", delete(delete_context))
        .route("/contexts/{cid}/restart", post(restart_context))
        .fallback(|| async { HttpError::not_found("no such code-interpreter endpoint") })
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ExecuteRequest {
    code: String,
    context_id: Option<String>,
    language: Option<String>,
    env_vars: Option<std::collections::BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct CreateContextRequest {
    language: Option<String>,
    cwd: Option<String>,
}

async fn json_body<T: for<'de> Deserialize<'de> + Default>(body: Body) -> Result<T, HttpError> {
    let bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|_| HttpError::new(413, format!("request body larger than {MAX_BODY} bytes")))?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&bytes).map_err(|e| HttpError::bad_request(format!("invalid JSON: {e}")))
}

/// The manager's language for an E2B one: Python, JavaScript, TypeScript, bash, Java and R
/// have interpreters.
fn language(name: Option<&str>) -> Result<&'static str, HttpError> {
    match name.unwrap_or("python") {
        "python" | "python3" | "py" => Ok("python"),
        "js" | "javascript" | "node" | "nodejs" => Ok("node"),
        "ts" | "typescript" => Ok("typescript"),
        "bash" | "sh" | "shell" => Ok("bash"),
        "java" => Ok("java"),
        "r" => Ok("r"),
        other => Err(HttpError::bad_request(format!(
            "language {other:?} is not available; python, javascript, typescript, bash, java or r"
        ))),
    }
}

/// The id of the sandbox's default context in `lang` (the manager's own default for Python).
/// Python's and JavaScript's exist from the start, as E2B's; the others' are made by their
/// first run.
fn default_context_id(lang: &str) -> &'static str {
    match lang {
        "python" => DEFAULT_CONTEXT,
        "node" => "default-javascript",
        "typescript" => "default-typescript",
        "java" => "default-java",
        "r" => "default-r",
        _ => "default-bash",
    }
}

/// The default context of `lang`, made (idempotently, by its id) unless this daemon has
/// made sure of it already.
async fn default_context(t: &Target, lang: &'static str) -> Result<String, HttpError> {
    let id = default_context_id(lang);
    let mut made = t.ctx.default_contexts.lock().await;
    if !made.contains(lang) {
        let opts = ContextOptions {
            cwd: Some(User::unprivileged().home().into()),
            context_id: Some(id.into()),
            ..ContextOptions::default()
        };
        t.e2b
            .manager()
            .create_context(&t.who, &t.id, lang, opts)
            .await?;
        made.insert(lang);
    }
    Ok(id.to_string())
}

fn e2b_language(lang: &str) -> &str {
    match lang {
        "node" => "javascript",
        other => other,
    }
}

fn context_json(c: &ContextInfo) -> Value {
    json!({"id": c.context_id, "language": e2b_language(&c.language), "cwd": c.cwd})
}

/// Streams the run as E2B's NDJSON: output lines as printed, then results, error, count and
/// the end marker. An error before anything ran (unknown context, bad input) is the HTTP answer
/// itself, as E2B gives it.
async fn execute(t: Target, body: Body) -> Result<Response, HttpError> {
    let req: ExecuteRequest = json_body(body).await?;
    let m = t.e2b.manager().clone();
    let lang = language(req.language.as_deref())?;
    let cid = match req.context_id {
        Some(cid) => cid,
        None => default_context(&t, lang).await?,
    };
    let run = RunRequest {
        code: req.code,
        timeout_ms: Some(RUN_TIMEOUT_MS.min(t.e2b.sessions_cfg().max_exec_timeout_ms)),
        env: req.env_vars.unwrap_or_default(),
    };
    let mut rx = m.run_in_context_streamed(t.who.clone(), t.id.clone(), cid, run);
    let first = koder_sessions::refusal_or_first(&mut rx).await?;
    let id = t.id.clone();
    let lines = futures::stream::unfold(Some((first, rx, m, id)), |state| async move {
        let (pending, mut rx, m, id) = state?;
        // A run whose events stop before its end, or that was killed with its sandbox, is cut
        // short, as E2B's proxy cuts it, so the SDK asks the sandbox's health and reports it
        // killed (a clean end would read as an empty success).
        let cut = || Some((Err(crate::connect::sandbox_went_away()), None));
        let Some((event, pending)) = next_batch(pending, &mut rx).await else {
            return cut();
        };
        if let RunEvent::Done(Ok(run)) = &event {
            let killed = run.verdict == Some(codes::EXEC_KILLED) && !run.restarted;
            // The session leaves the running set before its sandbox is torn down.
            if killed && m.owner_of_running(&id).is_none() {
                return cut();
            }
        }
        let next = (!matches!(event, RunEvent::Done(_))).then_some((pending, rx, m, id));
        Some((Ok(event_lines(event)), next))
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response())
}

/// How long output of one stream is gathered into one line: Jupyter kernels (E2B's) batch what
/// a cell prints the same way, so `print()` — text, then newline — arrives as one message.
const OUTPUT_BATCH: Duration = Duration::from_millis(50);
/// A batch goes out at this size whatever the time.
const OUTPUT_BATCH_BYTES: usize = 64 * 1024;

/// The next event to send, with consecutive output of one stream merged; also the event that
/// ended the batch, if one did.
async fn next_batch(
    pending: Option<RunEvent>,
    rx: &mut mpsc::Receiver<RunEvent>,
) -> Option<(RunEvent, Option<RunEvent>)> {
    let first = match pending {
        Some(e) => e,
        None => rx.recv().await?,
    };
    let RunEvent::Output(first) = first else {
        return Some((first, None));
    };
    let (stdout, mut text) = match first {
        RunOutput::Stdout(t) => (true, t),
        RunOutput::Stderr(t) => (false, t),
    };
    let batch = |stdout: bool, text: String| {
        RunEvent::Output(if stdout {
            RunOutput::Stdout(text)
        } else {
            RunOutput::Stderr(text)
        })
    };
    let deadline = tokio::time::Instant::now() + OUTPUT_BATCH;
    while text.len() < OUTPUT_BATCH_BYTES {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(RunEvent::Output(RunOutput::Stdout(t)))) if stdout => text.push_str(&t),
            Ok(Some(RunEvent::Output(RunOutput::Stderr(t)))) if !stdout => text.push_str(&t),
            Ok(Some(other)) => return Some((batch(stdout, text), Some(other))),
            Ok(None) | Err(_) => break,
        }
    }
    Some((batch(stdout, text), None))
}

fn event_lines(event: RunEvent) -> String {
    let now = || chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default();
    let mut lines: Vec<Value> = Vec::new();
    match event {
        RunEvent::Output(RunOutput::Stdout(text)) if !text.is_empty() => {
            lines.push(json!({"type": "stdout", "text": text, "timestamp": now()}));
        }
        RunEvent::Output(RunOutput::Stderr(text)) if !text.is_empty() => {
            lines.push(json!({"type": "stderr", "text": text, "timestamp": now()}));
        }
        RunEvent::Output(_) => {}
        RunEvent::Done(Ok(run)) => {
            lines.extend(run.results.iter().map(result_line));
            if let Some(e) = &run.error {
                lines.push(json!({"type": "error", "name": e.name, "value": e.value, "traceback": e.traceback}));
            }
            lines.push(
                json!({"type": "number_of_executions", "execution_count": run.execution_count}),
            );
            lines.push(json!({"type": "end_of_execution"}));
        }
        // Failed after output went out: said in the stream, since the status is sent.
        RunEvent::Done(Err(e)) => {
            lines.push(json!({"type": "error", "name": "SandboxError", "value": e.to_string(), "traceback": ""}));
            lines.push(json!({"type": "end_of_execution"}));
        }
    }
    let mut out = String::new();
    for l in lines {
        out.push_str(&l.to_string());
        out.push('\n');
    }
    out
}

fn result_line(r: &RichResult) -> Value {
    let mut v = json!({"type": "result", "is_main_result": r.is_main_result});
    let text = r.text.as_deref().map(unquoted).map(str::to_owned);
    let fields = [
        ("text", &text),
        ("html", &r.html),
        ("markdown", &r.markdown),
        ("png", &r.png),
        ("svg", &r.svg),
        ("jpeg", &r.jpeg),
        ("latex", &r.latex),
        ("pdf", &r.pdf),
        ("javascript", &r.javascript),
    ];
    for (k, val) in fields {
        if let Some(s) = val {
            v[k] = s.clone().into();
        }
    }
    // The interpreter serialised them; text that does not parse is left out, not passed on.
    let parsed = [
        ("json", &r.json),
        ("data", &r.data),
        ("chart", &r.chart),
        ("extra", &r.extra),
    ];
    for (k, val) in parsed {
        if let Some(j) = val
            .as_deref()
            .and_then(|j| serde_json::from_str::<Value>(j).ok())
        {
            v[k] = j;
        }
    }
    v
}

/// A string result's text as E2B's interpreter gives it: Jupyter's repr (`'bar'`) without its
/// enclosing quotes (`bar`), which E2B's SDKs and users expect.
fn unquoted(text: &str) -> &str {
    let quoted = |q: char| text.len() >= 2 && text.starts_with(q) && text.ends_with(q);
    match quoted('\'') || quoted('"') {
        true => &text[1..text.len() - 1],
        false => text,
    }
}

async fn create_context(t: Target, body: Body) -> Result<axum::Json<Value>, HttpError> {
    let req: CreateContextRequest = json_body(body).await?;
    let lang = language(req.language.as_deref())?;
    let opts = ContextOptions {
        cwd: Some(
            req.cwd
                .unwrap_or_else(|| User::unprivileged().home().into()),
        ),
        ..ContextOptions::default()
    };
    let info = t
        .e2b
        .manager()
        .create_context(&t.who, &t.id, lang, opts)
        .await?;
    Ok(axum::Json(context_json(&info)))
}

async fn list_contexts(t: Target) -> Result<axum::Json<Vec<Value>>, HttpError> {
    for lang in ["python", "node"] {
        default_context(&t, lang).await?;
    }
    let mut all = t.e2b.manager().list_contexts(&t.who, &t.id).await?;
    // The defaults first, as E2B's exist from the sandbox's start (they may be made later here).
    all.sort_by_key(|c| {
        !["python", "node"]
            .map(default_context_id)
            .contains(&c.context_id.as_str())
    });
    Ok(axum::Json(all.iter().map(context_json).collect()))
}

async fn delete_context(t: Target, Path(cid): Path<String>) -> Result<StatusCode, HttpError> {
    t.e2b.manager().delete_context(&t.who, &t.id, &cid).await?;
    t.ctx
        .default_contexts
        .lock()
        .await
        .retain(|lang| default_context_id(lang) != cid);
    Ok(StatusCode::NO_CONTENT)
}

async fn restart_context(t: Target, Path(cid): Path<String>) -> Result<StatusCode, HttpError> {
    t.e2b.manager().restart_context(&t.who, &t.id, &cid).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_results_lose_their_quotes_as_in_e2b() {
        for (repr, text) in [
            ("'bar'", "bar"),
            ("\"it's\"", "it's"),
            ("''", ""),
            ("42", "42"),
            ("'", "'"),
            ("'a\"", "'a\""),
            ("['a', 'b']", "['a', 'b']"),
            ("'é'", "é"),
        ] {
            assert_eq!(unquoted(repr), text, "{repr}");
        }
    }

    #[tokio::test]
    async fn output_of_one_stream_is_batched() {
        let (tx, mut rx) = mpsc::channel(16);
        for ev in [
            RunEvent::Output(RunOutput::Stderr("before".into())),
            RunEvent::Output(RunOutput::Stderr("\n".into())),
            RunEvent::Output(RunOutput::Stdout("out".into())),
        ] {
            tx.send(ev).await.unwrap();
        }
        let (first, pending) = next_batch(None, &mut rx).await.unwrap();
        assert!(matches!(first, RunEvent::Output(RunOutput::Stderr(ref t)) if t == "before\n"));
        assert!(matches!(pending, Some(RunEvent::Output(RunOutput::Stdout(ref t))) if t == "out"));
        // Nothing more within the batch window: the batch goes out as it is.
        let (second, pending) = next_batch(pending, &mut rx).await.unwrap();
        assert!(matches!(second, RunEvent::Output(RunOutput::Stdout(ref t)) if t == "out"));
        assert!(pending.is_none());
        drop(tx);
        assert!(next_batch(None, &mut rx).await.is_none());
    }

    #[test]
    fn languages_and_results() {
        assert_eq!(language(None).unwrap(), "python");
        assert_eq!(language(Some("js")).unwrap(), "node");
        assert_eq!(language(Some("bash")).unwrap(), "bash");
        assert_eq!(language(Some("java")).unwrap(), "java");
        assert_eq!(default_context_id("java"), "default-java");
        assert_eq!(language(Some("r")).unwrap(), "r");
        assert_eq!(language(Some("ts")).unwrap(), "typescript");
        assert_eq!(default_context_id("typescript"), "default-typescript");
        assert_eq!(language(Some("cobol")).unwrap_err().status.as_u16(), 400);
        let r = RichResult {
            is_main_result: true,
            text: Some("2".into()),
            json: Some("{\"a\": 1}".into()),
            ..Default::default()
        };
        assert_eq!(
            result_line(&r),
            json!({"type": "result", "is_main_result": true, "text": "2", "json": {"a": 1}})
        );
    }
}
