//! Live APIs: streamed and background execs (SSE), the WebSocket terminal and file watch,
//! the dev-server upstream and the error ring.

use base64::Engine as _;
use futures::{Stream, StreamExt};
use reqwest::{header, Method};
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
        match tokio_tungstenite::connect_async(req).await {
            Ok((socket, _)) => Ok(socket),
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                let status = resp.status().as_u16();
                let body = resp.body().clone().unwrap_or_default();
                Err(Error::from_response_parts(status, &body))
            }
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

    /// The session's dev server (`GET .../upstream`).
    pub async fn upstream(&self, id: &str) -> Result<Value> {
        let url = self.session_url(id, &["upstream"])?;
        decode(self.send(self.request(Method::GET, url)).await?).await
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
    let body = resp.bytes_stream();
    futures::stream::unfold(
        (body, String::new(), false),
        |(mut body, mut buf, mut done)| async move {
            loop {
                if done {
                    return None;
                }
                if let Some(end) = buf.find("\n\n") {
                    let block: String = buf.drain(..end + 2).collect();
                    match parse_block(&block) {
                        Some(Ok(ev)) => {
                            done = matches!(ev, ExecEvent::Exit(_));
                            return Some((Ok(ev), (body, buf, done)));
                        }
                        Some(Err(e)) => return Some((Err(e), (body, buf, true))),
                        None => continue,
                    }
                }
                match body.next().await {
                    Some(Ok(chunk)) => buf.push_str(&String::from_utf8_lossy(&chunk)),
                    Some(Err(e)) => return Some((Err(Error::Transport(e)), (body, buf, true))),
                    None => return None,
                }
            }
        },
    )
}

fn parse_block(block: &str) -> Option<Result<ExecEvent>> {
    let mut name = "message";
    let mut data = String::new();
    for line in block.lines() {
        if let Some(n) = line.strip_prefix("event:") {
            name = n.trim();
        } else if let Some(d) = line.strip_prefix("data:") {
            data.push_str(d.strip_prefix(' ').unwrap_or(d));
        }
    }
    if data.is_empty() {
        return None; // a keep-alive comment
    }
    let v: Value = match serde_json::from_str(&data) {
        Ok(v) => v,
        Err(e) => return Some(Err(Error::Decode(format!("SSE data: {e}")))),
    };
    let bytes = |v: &Value| -> Vec<u8> {
        match (v["data"].as_str(), v["data_b64"].as_str()) {
            (Some(text), _) => text.as_bytes().to_vec(),
            (None, Some(b64)) => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    };
    Some(Ok(match name {
        "start" => ExecEvent::Start {
            exec_id: v["exec_id"].as_str().unwrap_or_default().to_string(),
        },
        "stdout" => ExecEvent::Stdout(bytes(&v)),
        "stderr" => ExecEvent::Stderr(bytes(&v)),
        "truncated" => ExecEvent::Truncated {
            dropped_chunks: v["dropped_chunks"].as_u64().unwrap_or(0),
        },
        "exit" => {
            let mut v = v;
            if let Some(o) = v.as_object_mut() {
                o.entry("stdout").or_insert(Value::String(String::new()));
                o.entry("stderr").or_insert(Value::String(String::new()));
            }
            match serde_json::from_value(v) {
                Ok(r) => ExecEvent::Exit(r),
                Err(e) => return Some(Err(Error::Decode(format!("exit event: {e}")))),
            }
        }
        _ => return None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_blocks() {
        assert!(parse_block(": keep-alive\n\n").is_none());
        let ev = parse_block("event: stdout\ndata: {\"data\":\"hé\"}\n\n")
            .unwrap()
            .unwrap();
        assert_eq!(ev, ExecEvent::Stdout("hé".as_bytes().to_vec()));
        let ev = parse_block("event: stderr\ndata: {\"data_b64\":\"//4=\"}\n\n")
            .unwrap()
            .unwrap();
        assert_eq!(ev, ExecEvent::Stderr(vec![0xff, 0xfe]));
        let exit = "event: exit\ndata: {\"exec_id\":\"e\",\"exit_code\":3,\"signal\":null,\"stdout_truncated\":false,\"stderr_truncated\":false,\"duration_ms\":5,\"peak_memory_kib\":null,\"verdict\":null}\n\n";
        let ExecEvent::Exit(r) = parse_block(exit).unwrap().unwrap() else {
            panic!("not an exit")
        };
        assert_eq!(r.exit_code, Some(3));
    }
}
