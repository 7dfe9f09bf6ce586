//! Code-interpreter routes under `/v1/sandbox/sessions/{id}/contexts` (API.md "Code
//! interpreter"): stateful Python and Node contexts; the JSON shapes are koder-api-types'.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, post};
use axum::Router;
use koder_api_types::contexts::{
    Context, ContextList, CreateContext, RichOutput, RunCode, RunError, RunResult,
};
use koder_api_types::ErrorBody;
use koder_sessions::{ContextInfo, ContextOptions, RichResult, RunEvent, RunOutput, RunRequest};
use serde_json::json;
use std::convert::Infallible;

use crate::error::ApiError;
use crate::extract::{Caller, Json, Path};
use crate::AppState;

type ApiResult<T> = Result<T, ApiError>;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/{id}/contexts", post(create_context).get(list_contexts))
        .route("/{id}/contexts/{cid}", delete(delete_context))
        .route("/{id}/contexts/{cid}/restart", post(restart_context))
        .route("/{id}/contexts/{cid}/run", post(run_code))
}

fn context(c: ContextInfo) -> Context {
    Context {
        context_id: c.context_id,
        language: c.language,
        execution_count: c.execution_count,
        cwd: c.cwd,
    }
}

fn rich(r: RichResult) -> RichOutput {
    RichOutput {
        is_main_result: r.is_main_result,
        text: r.text,
        html: r.html,
        markdown: r.markdown,
        // The interpreter serialised it; text that does not parse is dropped, not passed on.
        json: r.json.and_then(|j| serde_json::from_str(&j).ok()),
        png: r.png,
        svg: r.svg,
        jpeg: r.jpeg,
        latex: r.latex,
        data: r.data.and_then(|j| serde_json::from_str(&j).ok()),
        chart: r.chart.and_then(|j| serde_json::from_str(&j).ok()),
        pdf: r.pdf,
        javascript: r.javascript,
        extra: r.extra.and_then(|j| serde_json::from_str(&j).ok()),
    }
}

#[utoipa::path(post, path = "/v1/sandbox/sessions/{id}/contexts", tag = "interpreter",
    params(("id" = String, Path)), request_body = CreateContext,
    responses((status = 201, body = Context), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 410, body = ErrorBody), (status = 504, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create_context(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
    Json(req): Json<CreateContext>,
) -> ApiResult<(StatusCode, axum::Json<Context>)> {
    let language = req.language.as_deref().unwrap_or("python");
    let opts = ContextOptions {
        cwd: req.cwd,
        env: req.env,
        ..ContextOptions::default()
    };
    let info = s.manager.create_context(&who, &id, language, opts).await?;
    Ok((StatusCode::CREATED, axum::Json(context(info))))
}

#[utoipa::path(get, path = "/v1/sandbox/sessions/{id}/contexts", tag = "interpreter",
    params(("id" = String, Path)),
    responses((status = 200, body = ContextList), (status = 404, body = ErrorBody), (status = 410, body = ErrorBody), (status = 504, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_contexts(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<ContextList>> {
    let all = s.manager.list_contexts(&who, &id).await?;
    Ok(axum::Json(ContextList {
        contexts: all.into_iter().map(context).collect(),
    }))
}

#[utoipa::path(delete, path = "/v1/sandbox/sessions/{id}/contexts/{cid}", tag = "interpreter",
    params(("id" = String, Path), ("cid" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 410, body = ErrorBody), (status = 504, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn delete_context(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path((id, cid)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    s.manager.delete_context(&who, &id, &cid).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/sandbox/sessions/{id}/contexts/{cid}/restart", tag = "interpreter",
    params(("id" = String, Path), ("cid" = String, Path)),
    responses((status = 200, body = Context), (status = 404, body = ErrorBody), (status = 410, body = ErrorBody), (status = 504, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn restart_context(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path((id, cid)): Path<(String, String)>,
) -> ApiResult<axum::Json<Context>> {
    let info = s.manager.restart_context(&who, &id, &cid).await?;
    Ok(axum::Json(context(info)))
}

#[utoipa::path(post, path = "/v1/sandbox/sessions/{id}/contexts/{cid}/run", tag = "interpreter",
    params(("id" = String, Path), ("cid" = String, Path, description = "a context id, or \"default\" for the session's Python context")),
    request_body = RunCode,
    responses((status = 200, body = RunResult),
              (status = 200, content_type = "text/event-stream", description = "with Accept: text/event-stream: stdout and stderr events as printed, then a result event (the RunResult without its output)"),
              (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 410, body = ErrorBody), (status = 504, body = ErrorBody),
              (status = 413, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn run_code(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path((id, cid)): Path<(String, String)>,
    headers: HeaderMap,
    Json(req): Json<RunCode>,
) -> ApiResult<Response> {
    let req = RunRequest {
        code: req.code,
        timeout_ms: req.timeout_ms,
        env: req.env,
    };
    if crate::live::wants_sse(&headers) {
        let mut rx = s.manager.run_in_context_streamed(who, id, cid, req);
        // A refusal is the HTTP answer itself; a later failure the stream's `error` event.
        let first = koder_sessions::refusal_or_first(&mut rx).await?;
        let events = futures::stream::unfold((first, rx), |(pending, mut rx)| async move {
            let event = match pending {
                Some(e) => e,
                None => rx.recv().await?,
            };
            Some((Ok::<_, Infallible>(sse_event(event)), (None, rx)))
        });
        return Ok(Sse::new(events)
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    let run = s.manager.run_in_context(&who, &id, &cid, req, None).await?;
    Ok(axum::Json(run_result(run)).into_response())
}

fn sse_event(event: RunEvent) -> Event {
    use crate::live::json_event;
    match event {
        RunEvent::Output(RunOutput::Stdout(text)) => json_event("stdout", json!({ "data": text })),
        RunEvent::Output(RunOutput::Stderr(text)) => json_event("stderr", json!({ "data": text })),
        RunEvent::Done(Ok(run)) => {
            json_event("result", crate::live::without_output(&run_result(run)))
        }
        // Output already went out with a 200: the failure is said in the stream.
        RunEvent::Done(Err(e)) => {
            let e = ApiError::from(e);
            json_event(
                "error",
                json!({"error": {"code": e.code, "message": e.message}}),
            )
        }
    }
}

fn run_result(run: koder_sessions::ContextRun) -> RunResult {
    RunResult {
        stdout: run.stdout,
        stderr: run.stderr,
        stdout_truncated: run.stdout_truncated,
        stderr_truncated: run.stderr_truncated,
        results: run.results.into_iter().map(rich).collect(),
        error: run.error.map(|e| RunError {
            name: e.name,
            value: e.value,
            traceback: e.traceback,
        }),
        execution_count: run.execution_count,
        duration_ms: run.duration_ms,
        verdict: run.verdict.map(String::from),
        restarted: run.restarted,
    }
}

#[cfg(test)]
mod tests {
    use utoipa::OpenApi;

    use super::*;

    #[derive(OpenApi)]
    #[openapi(paths(
        create_context,
        list_contexts,
        delete_context,
        restart_context,
        run_code
    ))]
    struct Doc;

    #[test]
    fn openapi_describes_every_route_and_shape() {
        let doc = serde_json::to_value(Doc::openapi()).unwrap();
        let paths = doc["paths"].as_object().unwrap();
        for p in [
            "/v1/sandbox/sessions/{id}/contexts",
            "/v1/sandbox/sessions/{id}/contexts/{cid}",
            "/v1/sandbox/sessions/{id}/contexts/{cid}/restart",
            "/v1/sandbox/sessions/{id}/contexts/{cid}/run",
        ] {
            assert!(paths.contains_key(p), "{p} missing");
        }
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for s in [
            "Context",
            "ContextList",
            "CreateContext",
            "RunCode",
            "RunResult",
            "RichOutput",
            "RunError",
        ] {
            assert!(schemas.contains_key(s), "{s} missing");
        }
    }

    #[test]
    fn json_results_are_values() {
        let r = rich(RichResult {
            is_main_result: true,
            text: Some("{'a': 1}".into()),
            json: Some(r#"{"a": 1}"#.into()),
            ..Default::default()
        });
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"is_main_result": true, "text": "{'a': 1}", "json": {"a": 1}})
        );
        let broken = rich(RichResult {
            json: Some("{not json".into()),
            ..Default::default()
        });
        assert!(broken.json.is_none());
    }
}
