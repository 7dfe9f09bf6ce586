//! `ksandbox shell` / `attach`: the local terminal in raw mode, bridged to the session's PTY.

use std::io::IsTerminal;

use futures::{SinkExt, StreamExt};
use koder_sdk::Client;
use rustix::termios::{self, Termios};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

use crate::error::{CliError, IoContext as _, Result};

/// Puts stdin in raw mode for as long as it lives (keys go to the remote side as typed).
struct RawMode {
    saved: Termios,
}

impl RawMode {
    fn enable() -> Result<Option<RawMode>> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Ok(None);
        }
        let saved = termios::tcgetattr(&stdin)
            .map_err(std::io::Error::from)
            .doing(|| "reading terminal settings".into())?;
        let mut raw = saved.clone();
        raw.make_raw();
        termios::tcsetattr(&stdin, termios::OptionalActions::Flush, &raw)
            .map_err(std::io::Error::from)
            .doing(|| "raw mode".into())?;
        Ok(Some(RawMode { saved }))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(
            std::io::stdin(),
            termios::OptionalActions::Flush,
            &self.saved,
        );
    }
}

fn window_size() -> Option<(u16, u16)> {
    let ws = termios::tcgetwinsize(std::io::stdout()).ok()?;
    (ws.ws_col > 0 && ws.ws_row > 0).then_some((ws.ws_col, ws.ws_row))
}

fn resize_message((cols, rows): (u16, u16)) -> Message {
    Message::Text(
        serde_json::json!({"type": "resize", "cols": cols, "rows": rows})
            .to_string()
            .into(),
    )
}

fn connection_lost(e: tokio_tungstenite::tungstenite::Error) -> CliError {
    CliError::msg(format!("terminal connection: {e}"))
}

/// Runs until the remote program exits; returns its exit code (128+signal when killed).
pub async fn run(client: &Client, session: &str, argv: &[String]) -> Result<i32> {
    let (cols, rows) = window_size().unwrap_or((80, 24));
    let socket = client.terminal(session, argv, cols, rows).await?;
    let _raw = RawMode::enable()?;
    let (mut to_remote, mut from_remote) = socket.split();
    let mut stdin = tokio::io::stdin();
    let mut stdout = tokio::io::stdout();
    let mut winch = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())?;
    let mut buf = vec![0u8; 4096];
    let mut stdin_open = true;
    loop {
        tokio::select! {
            n = stdin.read(&mut buf), if stdin_open => match n {
                Ok(n) if n > 0 => to_remote.send(Message::Binary(buf[..n].to_vec().into())).await.map_err(connection_lost)?,
                _ => stdin_open = false,
            },
            _ = winch.recv() => {
                if let Some(size) = window_size() {
                    to_remote.send(resize_message(size)).await.map_err(connection_lost)?;
                }
            }
            msg = from_remote.next() => match msg {
                Some(Ok(Message::Binary(b))) => {
                    stdout.write_all(&b).await?;
                    stdout.flush().await?;
                }
                Some(Ok(Message::Text(t))) => {
                    let v: serde_json::Value = serde_json::from_str(&t).unwrap_or_default();
                    match v["type"].as_str() {
                        Some("exit") => {
                            let code = v["exit_code"].as_i64().map(|c| c as i32);
                            let signal = v["signal"].as_i64().map(|s| 128 + s as i32);
                            return Ok(code.or(signal).unwrap_or(1));
                        }
                        Some("error") => return Err(CliError::msg(format!("terminal: {}", v["message"].as_str().unwrap_or("error")))),
                        _ => {}
                    }
                }
                Some(Ok(Message::Close(_))) | None => return Ok(0),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(connection_lost(e)),
            }
        }
    }
}
