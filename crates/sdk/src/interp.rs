//! Code-interpreter contexts (`.../contexts`): long-lived Python or Node interpreters whose
//! variables persist between runs, and runs whose rich results (figures, HTML, JSON) come back
//! alongside the output. The shapes mirror the daemon's (`crates/http/src/contexts.rs`).

use std::collections::BTreeMap;

use futures::Stream;
use reqwest::{header, Method};
use serde::{Deserialize, Serialize};

use crate::{decode, Client, Error, Result};

/// The context every session has without creating one: its Python interpreter.
pub const DEFAULT_CONTEXT: &str = "default";

/// `POST .../contexts`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CreateContext {
    /// `python` (the daemon's default) or `node`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// An existing absolute directory (default: the session's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// One interpreter in a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Context {
    pub context_id: String,
    pub language: String,
    /// Runs so far (0 after a restart).
    pub execution_count: u64,
    pub cwd: String,
}

#[derive(Deserialize)]
struct ContextList {
    contexts: Vec<Context>,
}

/// `POST .../contexts/{cid}/run`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RunCode {
    pub code: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Set for this run only.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// One displayable value, in every representation the interpreter offered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RichOutput {
    /// The value of the run's last expression.
    pub is_main_result: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub markdown: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<serde_json::Value>,
    /// Base64 PNG.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub png: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub svg: Option<String>,
}

/// The exception a run raised (`TimeoutError` or `InterpreterDied` when it was killed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunError {
    pub name: String,
    pub value: String,
    pub traceback: String,
}

/// A run's outcome. Streamed runs deliver it without `stdout`/`stderr` (those came as events).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
    #[serde(default)]
    pub stdout_truncated: bool,
    #[serde(default)]
    pub stderr_truncated: bool,
    #[serde(default)]
    pub results: Vec<RichOutput>,
    pub error: Option<RunError>,
    pub execution_count: u64,
    pub duration_ms: u64,
    /// An exec verdict code (`SANDBOX-EXEC-TIMEOUT`, ...), or none for a run that ended by itself.
    pub verdict: Option<String>,
    /// The interpreter was killed and started afresh: its state is gone.
    pub restarted: bool,
}

/// One event of a streamed run.
#[derive(Debug, Clone, PartialEq)]
pub enum RunEvent {
    Stdout(String),
    Stderr(String),
    /// The last event.
    Result(RunResult),
}

impl Client {
    pub async fn create_context(&self, id: &str, req: &CreateContext) -> Result<Context> {
        let url = self.session_url(id, &["contexts"])?;
        decode(self.send(self.request(Method::POST, url).json(req)).await?).await
    }

    /// In creation order.
    pub async fn list_contexts(&self, id: &str) -> Result<Vec<Context>> {
        let url = self.session_url(id, &["contexts"])?;
        let list: ContextList = decode(self.send(self.request(Method::GET, url)).await?).await?;
        Ok(list.contexts)
    }

    pub async fn delete_context(&self, id: &str, context_id: &str) -> Result<()> {
        let url = self.session_url(id, &["contexts", context_id])?;
        self.send(self.request(Method::DELETE, url)).await?;
        Ok(())
    }

    /// Kills the interpreter and starts it afresh (its variables are gone).
    pub async fn restart_context(&self, id: &str, context_id: &str) -> Result<Context> {
        let url = self.session_url(id, &["contexts", context_id, "restart"])?;
        decode(self.send(self.request(Method::POST, url)).await?).await
    }

    /// Runs code in a context ([`DEFAULT_CONTEXT`] for the session's Python) and waits.
    pub async fn run_in_context(
        &self,
        id: &str,
        context_id: &str,
        req: &RunCode,
    ) -> Result<RunResult> {
        let url = self.session_url(id, &["contexts", context_id, "run"])?;
        decode(self.send(self.request(Method::POST, url).json(req)).await?).await
    }

    /// Runs code in a context, streaming its output as it is printed.
    pub async fn run_in_context_stream(
        &self,
        id: &str,
        context_id: &str,
        req: &RunCode,
    ) -> Result<impl Stream<Item = Result<RunEvent>>> {
        let url = self.session_url(id, &["contexts", context_id, "run"])?;
        let resp = self
            .send(
                self.request(Method::POST, url)
                    .header(header::ACCEPT, "text/event-stream")
                    .json(req),
            )
            .await?;
        Ok(run_events(resp.bytes_stream()))
    }
}

#[derive(Deserialize)]
struct TextData {
    data: String,
}

/// The run events of an SSE body, ending after `result`; an `error` event (a failure after
/// output went out) is that error, and a body that ends before either is
/// [`Error::StreamEnded`].
fn run_events<S, B>(body: S) -> impl Stream<Item = Result<RunEvent>>
where
    S: Stream<Item = std::result::Result<B, reqwest::Error>>,
    B: AsRef<[u8]>,
{
    crate::live::decoded_events(body, run_event, |ev| {
        matches!(ev, RunEvent::Stdout(_) | RunEvent::Stderr(_))
    })
}

fn parse<T: serde::de::DeserializeOwned>(name: &str, data: &str) -> Result<T> {
    serde_json::from_str(data).map_err(|e| Error::Decode(format!("SSE {name} event: {e}")))
}

fn run_event(name: &str, data: &str) -> Option<Result<RunEvent>> {
    Some(match name {
        "stdout" => parse::<TextData>(name, data).map(|t| RunEvent::Stdout(t.data)),
        "stderr" => parse::<TextData>(name, data).map(|t| RunEvent::Stderr(t.data)),
        "result" => parse(name, data).map(RunEvent::Result),
        // The answer was already a 200; the error body is the usual `{"error": {...}}`.
        "error" => Err(Error::from_response_parts(200, data.as_bytes())),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use futures::StreamExt;

    async fn events_of(body: &'static str) -> Vec<Result<RunEvent>> {
        let chunks = futures::stream::iter([Ok::<_, reqwest::Error>(Bytes::from(body))]);
        run_events(chunks).collect().await
    }

    #[tokio::test]
    async fn a_streamed_run_is_its_output_then_its_result() {
        let events = events_of(concat!(
            "event: stdout\ndata: {\"data\":\"hi\\n\"}\n\n",
            "event: progress\ndata: {}\n\n",
            "event: stderr\ndata: {\"data\":\"warn\"}\n\n",
            "event: result\ndata: {\"results\":[{\"is_main_result\":true,\"text\":\"2\"}],",
            "\"error\":null,\"execution_count\":3,\"duration_ms\":5,\"verdict\":null,",
            "\"restarted\":false,\"stdout_truncated\":false,\"stderr_truncated\":false}\n\n",
            "event: stdout\ndata: {\"data\":\"after the end\"}\n\n",
        ))
        .await;
        assert_eq!(events.len(), 3, "{events:?}");
        assert_eq!(
            events[0].as_ref().unwrap(),
            &RunEvent::Stdout("hi\n".into())
        );
        assert_eq!(
            events[1].as_ref().unwrap(),
            &RunEvent::Stderr("warn".into())
        );
        let Ok(RunEvent::Result(r)) = &events[2] else {
            panic!("{events:?}")
        };
        assert_eq!((r.execution_count, r.stdout.as_str()), (3, ""));
        assert_eq!(r.results[0].text.as_deref(), Some("2"));
    }

    #[tokio::test]
    async fn an_error_event_or_a_cut_stream_is_an_error() {
        let events = events_of(concat!(
            "event: stdout\ndata: {\"data\":\"x\"}\n\n",
            "event: error\ndata: {\"error\":{\"code\":\"SANDBOX-GONE\",\"message\":\"ended\"}}\n\n",
        ))
        .await;
        assert_eq!(events.len(), 2);
        assert_eq!(events[1].as_ref().unwrap_err().code(), Some("SANDBOX-GONE"));
        let cut = events_of("event: stdout\ndata: {\"data\":\"x\"}\n\n").await;
        assert!(
            matches!(cut.last(), Some(Err(Error::StreamEnded))),
            "{cut:?}"
        );
    }

    #[test]
    fn requests_leave_out_what_is_unset() {
        let body = serde_json::to_value(RunCode {
            code: "1".into(),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(body, serde_json::json!({"code": "1"}));
        let body = serde_json::to_value(CreateContext::default()).unwrap();
        assert_eq!(body, serde_json::json!({}));
    }
}
