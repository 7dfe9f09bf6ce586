//! Code-interpreter contexts (`.../contexts`): long-lived Python or Node interpreters whose
//! variables persist between runs, and runs whose rich results (figures, HTML, JSON) come back
//! alongside the output. The shapes are the daemon's own (`koder_api_types::contexts`).

use futures::Stream;
pub use koder_api_types::contexts::{
    Context, ContextList, CreateContext, RichOutput, RunCode, RunError, RunResult,
};
use reqwest::{header, Method};
use serde::Deserialize;

use crate::{decode, Client, Error, Result};

/// The context every session has without creating one: its Python interpreter.
pub const DEFAULT_CONTEXT: &str = "default";

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
