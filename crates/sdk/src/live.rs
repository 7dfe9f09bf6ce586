//! Live APIs: streamed and background execs (SSE), the WebSocket terminal and file watch,
//! the dev-server upstream and the error ring.

use base64::Engine as _;
use eventsource_stream::{EventStreamError, Eventsource as _};
use futures::{Stream, StreamExt};
use reqwest::{header, Method};
use serde::Deserialize;
use serde_json::Value;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::{decode, types, Client, Error, Result};

/// One event of a streamed exec.
#[derive(Debug, Clone, PartialEq)]
pub enum ExecEvent {
    Start {
        exec_id: String,
    },
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// This follower fell behind and missed some output.
    Truncated {
        dropped_chunks: u64,
    },
    /// The final result (its stdout/stderr are empty: they came as events).
    Exit(types::ExecResult),
}

/// Where a session's dev server is (`GET .../upstream`, `POST .../preview`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct UpstreamInfo {
    /// Its address inside the sandbox.
    pub url: String,
    pub port: u16,
    /// Pinned with [`Client::pin_preview`] rather than detected.
    #[serde(default)]
    pub pinned: bool,
    /// The path of the daemon's reverse proxy to it.
    #[serde(default)]
    pub preview_path: String,
}

/// The WebSocket of a terminal or a file watch.
pub type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

impl Client {
    /// Runs an exec and streams its output as it is produced.
    pub async fn exec_stream(
        &self,
        id: &str,
        req: &types::ExecRequest,
    ) -> Result<impl Stream<Item = Result<ExecEvent>>> {
        let url = self.session_url(id, &["exec"])?;
        let resp = self
            .send(
                self.request(Method::POST, url)
                    .header(header::ACCEPT, "text/event-stream")
                    .json(req),
            )
            .await?;
        Ok(sse_events(resp))
    }

    /// Starts a background exec; returns its id.
    pub async fn exec_background(&self, id: &str, req: &types::ExecRequest) -> Result<String> {
        let mut req = req.clone();
        req.background = true;
        let url = self.session_url(id, &["exec"])?;
        let started: types::ExecStarted = decode(
            self.send(self.request(Method::POST, url).json(&req))
                .await?,
        )
        .await?;
        Ok(started.exec_id)
    }

    pub async fn exec_status(&self, id: &str, exec_id: &str) -> Result<types::ExecStatus> {
        let url = self.session_url(id, &["execs", exec_id])?;
        decode(self.send(self.request(Method::GET, url)).await?).await
    }

    pub async fn list_execs(&self, id: &str) -> Result<Vec<types::ExecStatus>> {
        let url = self.session_url(id, &["execs"])?;
        let list: types::ExecList =
            decode(self.send(self.request(Method::GET, url)).await?).await?;
        Ok(list.execs)
    }

    /// Replays an exec's retained output, then follows it until it exits.
    pub async fn follow_exec(
        &self,
        id: &str,
        exec_id: &str,
    ) -> Result<impl Stream<Item = Result<ExecEvent>>> {
        let url = self.session_url(id, &["execs", exec_id, "stream"])?;
        Ok(sse_events(self.send(self.request(Method::GET, url)).await?))
    }

    pub async fn exec_stdin(
        &self,
        id: &str,
        exec_id: &str,
        data: Vec<u8>,
        close: bool,
    ) -> Result<()> {
        let url = self.session_url(id, &["execs", exec_id, "stdin"])?;
        let close = if close { "true" } else { "false" };
        self.send(
            self.request(Method::POST, url)
                .query(&[("close", close)])
                .body(data),
        )
        .await?;
        Ok(())
    }

    pub async fn exec_signal(&self, id: &str, exec_id: &str, signal: &str) -> Result<()> {
        let url = self.session_url(id, &["execs", exec_id, "signal"])?;
        let body = types::SignalRequest {
            signal: signal.into(),
        };
        self.send(self.request(Method::POST, url).json(&body))
            .await?;
        Ok(())
    }

    /// Opens the session's terminal: `argv` empty for the login shell.
    pub async fn terminal(
        &self,
        id: &str,
        argv: &[String],
        cols: u16,
        rows: u16,
    ) -> Result<Socket> {
        let mut url = self.session_url(id, &["terminal"])?;
        {
            let mut q = url.query_pairs_mut();
            if let Some((cmd, args)) = argv.split_first() {
                q.append_pair("cmd", cmd);
                for a in args {
                    q.append_pair("arg", a);
                }
            }
            q.append_pair("cols", &cols.to_string());
            q.append_pair("rows", &rows.to_string());
        }
        self.websocket(url).await
    }

    /// Watches a directory; each item is one event object (`type`, `path`, `at`, `from`?).
    pub async fn watch(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<impl Stream<Item = Result<Value>>> {
        let mut url = self.session_url(id, &["fs", "watch"])?;
        url.query_pairs_mut()
            .append_pair("path", path)
            .append_pair("recursive", if recursive { "true" } else { "false" });
        let socket = self.websocket(url).await?;
        Ok(socket.filter_map(|msg| async move {
            use tokio_tungstenite::tungstenite::Message;
            match msg {
                Ok(Message::Text(t)) => {
                    Some(serde_json::from_str(&t).map_err(|e| Error::Decode(e.to_string())))
                }
                Ok(_) => None,
                Err(e) => Some(Err(Error::Decode(format!("watch socket: {e}")))),
            }
        }))
    }

    async fn websocket(&self, mut url: reqwest::Url) -> Result<Socket> {
        let scheme = if url.scheme() == "https" { "wss" } else { "ws" };
        url.set_scheme(scheme).map_err(|()| Error::InvalidUrl {
            url: url.to_string(),
            reason: "cannot make a WebSocket URL".into(),
        })?;
        let mut req = url
            .as_str()
            .into_client_request()
            .map_err(|e| Error::Decode(format!("websocket request: {e}")))?;
        if let Some(key) = &self.api_key {
            let value = format!("Bearer {key}")
                .parse()
                .map_err(|_| Error::Decode("API key is not a valid header value".into()))?;
            req.headers_mut().insert("authorization", value);
        }
        // Named in a connect error without the query (paths, commands).
        let target = {
            let mut u = url.clone();
            u.set_query(None);
            u.to_string()
        };
        let connector = tokio_tungstenite::Connector::Rustls(self.ws_tls.clone());
        match tokio_tungstenite::connect_async_tls_with_config(req, None, false, Some(connector))
            .await
        {
            Ok((socket, _)) => Ok(socket),
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                let status = resp.status().as_u16();
                let body = resp.body().clone().unwrap_or_default();
                Err(Error::from_response_parts(status, &body))
            }
            Err(tokio_tungstenite::tungstenite::Error::Io(source)) => Err(Error::Connect {
                url: target,
                source,
            }),
            Err(e) => Err(Error::Decode(format!("websocket: {e}"))),
        }
    }

    /// The tenant's network audit log, newest first (`GET /v1/sandbox/audit/network`).
    pub async fn network_audit(
        &self,
        session: Option<&str>,
        allowed: Option<bool>,
        before: Option<i64>,
        limit: u32,
    ) -> Result<types::AuditPage> {
        let mut url = self.url(&["v1", "sandbox", "audit", "network"])?;
        {
            let mut q = url.query_pairs_mut();
            if let Some(s) = session {
                q.append_pair("session_id", s);
            }
            if let Some(a) = allowed {
                q.append_pair("allowed", if a { "true" } else { "false" });
            }
            if let Some(b) = before {
                q.append_pair("before", &b.to_string());
            }
            q.append_pair("limit", &limit.to_string());
        }
        decode(self.send(self.request(Method::GET, url)).await?).await
    }

    /// The session's dev server (`GET .../upstream`): the pinned port, else the one detected
    /// from its listening sockets.
    pub async fn upstream(&self, id: &str) -> Result<UpstreamInfo> {
        let url = self.session_url(id, &["upstream"])?;
        decode(self.send(self.request(Method::GET, url)).await?).await
    }

    /// Pins the port the preview proxy forwards to (`POST .../preview`). A pinned port nothing
    /// listens on yet is a 503 `SANDBOX-PREVIEW-NOT-LISTENING`, and stays pinned.
    pub async fn pin_preview(&self, id: &str, port: u16) -> Result<UpstreamInfo> {
        let url = self.session_url(id, &["preview"])?;
        let body = serde_json::json!({ "port": port });
        decode(
            self.send(self.request(Method::POST, url).json(&body))
                .await?,
        )
        .await
    }

    /// The URL of the daemon's reverse proxy to a session's dev server (it needs the API key
    /// as a bearer token, like every other call).
    pub fn preview_url(&self, id: &str) -> Result<reqwest::Url> {
        let mut url = self.session_url(id, &["preview"])?;
        url.path_segments_mut()
            .map_err(|()| Error::InvalidUrl {
                url: self.base.to_string(),
                reason: "not a base URL".into(),
            })?
            .push("");
        Ok(url)
    }

    pub async fn report_error(
        &self,
        id: &str,
        report: &types::ReportError,
    ) -> Result<types::ErrorEntry> {
        let url = self.session_url(id, &["errors"])?;
        decode(
            self.send(self.request(Method::POST, url).json(report))
                .await?,
        )
        .await
    }

    pub async fn errors(&self, id: &str) -> Result<Vec<types::ErrorEntry>> {
        let url = self.session_url(id, &["errors"])?;
        let list: types::ErrorList =
            decode(self.send(self.request(Method::GET, url)).await?).await?;
        Ok(list.errors)
    }
}

/// Parses a `text/event-stream` body into exec events.
fn sse_events(resp: reqwest::Response) -> impl Stream<Item = Result<ExecEvent>> {
    exec_events(resp.bytes_stream())
}

/// The exec events of an SSE body. The stream ends after `exit`; a body that ends before it
/// (closed connection, an event cut off) yields [`Error::StreamEnded`] instead of ending
/// quietly, since the exec's outcome is then unknown.
fn exec_events<S, B>(body: S) -> impl Stream<Item = Result<ExecEvent>>
where
    S: Stream<Item = std::result::Result<B, reqwest::Error>>,
    B: AsRef<[u8]>,
{
    decoded_events(body, exec_event, |ev| !matches!(ev, ExecEvent::Exit(_)))
}

/// The events of an SSE body as `decode` reads them (`None`: an event type this client does
/// not know, skipped), ending after the first error or the first event `more` refuses; a body
/// that ends before that is [`Error::StreamEnded`].
pub(crate) fn decoded_events<S, B, T>(
    body: S,
    decode: fn(&str, &str) -> Option<Result<T>>,
    more: fn(&T) -> bool,
) -> impl Stream<Item = Result<T>>
where
    S: Stream<Item = std::result::Result<B, reqwest::Error>>,
    B: AsRef<[u8]>,
{
    let events = Box::pin(body.eventsource());
    futures::stream::unfold(Some(events), move |state| async move {
        let mut events = state?;
        loop {
            let item = match events.next().await {
                None => Err(Error::StreamEnded),
                Some(Err(EventStreamError::Transport(e))) => Err(Error::Transport(e)),
                Some(Err(e)) => Err(Error::Decode(format!("event stream: {e}"))),
                Some(Ok(event)) => match decode(&event.event, &event.data) {
                    Some(item) => item,
                    None => continue,
                },
            };
            let go_on = matches!(item, Ok(ref ev) if more(ev));
            return Some((item, go_on.then_some(events)));
        }
    })
}

#[derive(Deserialize)]
struct StartData {
    exec_id: String,
}

#[derive(Deserialize)]
struct ChunkData {
    data: Option<String>,
    data_b64: Option<String>,
}

#[derive(Deserialize)]
struct TruncatedData {
    dropped_chunks: u64,
}

fn parse<T: serde::de::DeserializeOwned>(name: &str, data: &str) -> Result<T> {
    serde_json::from_str(data).map_err(|e| Error::Decode(format!("SSE {name} event: {e}")))
}

fn chunk_bytes(name: &str, data: &str) -> Result<Vec<u8>> {
    match parse::<ChunkData>(name, data)? {
        ChunkData {
            data: Some(text), ..
        } => Ok(text.into_bytes()),
        ChunkData {
            data_b64: Some(b64),
            ..
        } => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| Error::Decode(format!("SSE {name} event: data_b64: {e}"))),
        _ => Err(Error::Decode(format!(
            "SSE {name} event has neither data nor data_b64"
        ))),
    }
}

/// One SSE event as an exec event; `None` for event types outside the contract.
fn exec_event(name: &str, data: &str) -> Option<Result<ExecEvent>> {
    Some(match name {
        "start" => parse::<StartData>(name, data).map(|s| ExecEvent::Start { exec_id: s.exec_id }),
        "stdout" => chunk_bytes(name, data).map(ExecEvent::Stdout),
        "stderr" => chunk_bytes(name, data).map(ExecEvent::Stderr),
        "truncated" => parse::<TruncatedData>(name, data).map(|t| ExecEvent::Truncated {
            dropped_chunks: t.dropped_chunks,
        }),
        "exit" => exit_result(data).map(ExecEvent::Exit),
        _ => return None,
    })
}

/// The `exit` event carries the result without its output (that came as events).
fn exit_result(data: &str) -> Result<types::ExecResult> {
    let mut v: Value = parse("exit", data)?;
    if let Some(o) = v.as_object_mut() {
        o.entry("stdout").or_insert(Value::String(String::new()));
        o.entry("stderr").or_insert(Value::String(String::new()));
    }
    serde_json::from_value(v).map_err(|e| Error::Decode(format!("SSE exit event: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    const EXIT: &str = "event: exit\ndata: {\"exec_id\":\"e\",\"exit_code\":3,\"signal\":null,\"stdout_truncated\":false,\"stderr_truncated\":false,\"duration_ms\":5,\"peak_memory_kib\":null,\"verdict\":null}\n\n";

    /// Runs the parser over a body delivered in exactly these chunks.
    async fn events(chunks: &[&[u8]]) -> Vec<Result<ExecEvent>> {
        let body = futures::stream::iter(
            chunks
                .iter()
                .map(|c| Ok::<_, reqwest::Error>(Bytes::copy_from_slice(c)))
                .collect::<Vec<_>>(),
        );
        exec_events(body).collect().await
    }

    fn ok(items: Vec<Result<ExecEvent>>) -> Vec<ExecEvent> {
        items
            .into_iter()
            .map(|i| i.expect("no error expected"))
            .collect()
    }

    #[tokio::test]
    async fn multibyte_character_split_across_chunks() {
        let full = "event: stdout\ndata: {\"data\":\"h\u{e9}\u{1F600}\"}\n\n";
        let bytes = full.as_bytes();
        // Cut inside the 4-byte emoji and inside the 2-byte é.
        let e = full.find('\u{e9}').expect("é") + 1;
        let smile = full.find('\u{1F600}').expect("emoji") + 2;
        let got = events(&[
            &bytes[..e],
            &bytes[e..smile],
            &bytes[smile..],
            EXIT.as_bytes(),
        ])
        .await;
        let got = ok(got);
        assert_eq!(
            got[0],
            ExecEvent::Stdout("h\u{e9}\u{1F600}".as_bytes().to_vec())
        );
        assert!(matches!(got[1], ExecEvent::Exit(ref r) if r.exit_code == Some(3)));
    }

    #[tokio::test]
    async fn multi_line_data_is_joined_with_newlines() {
        // JSON allows a line break between tokens; the SSE spec joins data lines with "\n".
        let body = "event: stdout\ndata: {\"data\":\ndata: \"x\"}\n\n";
        let got = ok(events(&[body.as_bytes(), EXIT.as_bytes()]).await);
        assert_eq!(got[0], ExecEvent::Stdout(b"x".to_vec()));
        // Joined without the "\n" these two lines would read as the number 12.
        let body = "event: truncated\ndata: {\"dropped_chunks\":1\ndata: 2}\n\n";
        let got = events(&[body.as_bytes(), EXIT.as_bytes()]).await;
        assert!(matches!(got[..], [Err(Error::Decode(_))]), "{got:?}");
    }

    #[tokio::test]
    async fn crlf_line_endings_and_comments() {
        let body = ": keep-alive\r\n\r\nevent: start\r\ndata: {\"exec_id\":\"e1\"}\r\n\r\n:ping\n\nevent: stderr\r\ndata: {\"data_b64\":\"//4=\"}\r";
        let exit = EXIT.replace('\n', "\r\n");
        // The CR of a CRLF at the end of one chunk, its LF at the start of the next.
        let got = ok(events(&[body.as_bytes(), b"\n\r\n", exit.as_bytes()]).await);
        assert_eq!(
            got[..2],
            [
                ExecEvent::Start {
                    exec_id: "e1".into()
                },
                ExecEvent::Stderr(vec![0xff, 0xfe]),
            ]
        );
        assert!(matches!(got[2], ExecEvent::Exit(_)), "{got:?}");
        assert_eq!(got.len(), 3);
    }

    #[tokio::test]
    async fn unknown_events_are_skipped_and_exit_ends_the_stream() {
        let body = format!("event: novelty\ndata: {{}}\n\nevent: truncated\ndata: {{\"dropped_chunks\":4}}\n\n{EXIT}event: stdout\ndata: {{\"data\":\"after\"}}\n\n");
        let got = ok(events(&[body.as_bytes()]).await);
        assert_eq!(got[0], ExecEvent::Truncated { dropped_chunks: 4 });
        assert!(matches!(got[1], ExecEvent::Exit(_)));
        assert_eq!(got.len(), 2, "nothing after exit: {got:?}");
    }

    #[tokio::test]
    async fn an_event_cut_off_by_the_end_of_the_body_is_an_error() {
        let cut = &EXIT[..EXIT.len() - 1]; // the blank line that dispatches it is missing
        let body = format!("event: stdout\ndata: {{\"data\":\"a\"}}\n\n{cut}");
        let got = events(&[body.as_bytes()]).await;
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(
            got[0].as_ref().ok(),
            Some(&ExecEvent::Stdout(b"a".to_vec()))
        );
        assert!(matches!(got[1], Err(Error::StreamEnded)), "{got:?}");
        let got = events(&[]).await;
        assert!(matches!(got[..], [Err(Error::StreamEnded)]), "{got:?}");
    }

    #[tokio::test]
    async fn malformed_events_are_decode_errors() {
        for body in [
            "event: stdout\ndata: {\"data_b64\":\"***\"}\n\n",
            "event: stdout\ndata: {}\n\n",
            "event: start\ndata: {\"id\":1}\n\n",
            "event: exit\ndata: [1]\n\n",
        ] {
            let got = events(&[body.as_bytes(), EXIT.as_bytes()]).await;
            assert!(
                matches!(got[..], [Err(Error::Decode(_))]),
                "{body}: {got:?}"
            );
        }
    }
}
