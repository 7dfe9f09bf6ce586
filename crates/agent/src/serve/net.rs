//! The sandbox's own network namespace as seen from inside: listening ports, and TCP
//! connections relayed for the daemon's preview proxy (which cannot reach a sandbox whose
//! network mode is `none` any other way — and the sandbox still cannot reach out).

use std::collections::BTreeSet;

use koder_agent_protocol::{AgentError, ErrorCode, FromAgent, ToAgent, CHUNK_BYTES};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::outbox::Outbox;

/// Ports in LISTEN state in this network namespace (IPv4 and IPv6).
pub fn listening_ports() -> Result<FromAgent, AgentError> {
    let mut ports = BTreeSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        ports.extend(parse_listening(&text));
    }
    Ok(FromAgent::Ports(ports.into_iter().collect()))
}

/// `local_address` of rows whose state is 0A (LISTEN), e.g. `0100007F:1F90` → 8080.
fn parse_listening(table: &str) -> impl Iterator<Item = u16> + '_ {
    table.lines().skip(1).filter_map(|line| {
        let mut cols = line.split_whitespace();
        let local = cols.nth(1)?;
        let state = cols.nth(1)?;
        if state != "0A" {
            return None;
        }
        u16::from_str_radix(local.rsplit(':').next()?, 16).ok()
    })
}

pub async fn relay(port: u16, rx: mpsc::Receiver<ToAgent>, out: Outbox) {
    let conn = match connect(port).await {
        Ok(c) => c,
        Err(e) => {
            let _ = out.send(FromAgent::Error(e)).await;
            return;
        }
    };
    if out.send(FromAgent::Connected).await.is_err() {
        return;
    }
    splice(conn, rx, out).await;
}

/// Relays a TCP connection over an agent stream: what the peer sends goes out as `Stdout`,
/// `Stdin` is written to it, `CloseStdin` half-closes it, and `Closed` tells its end.
pub(crate) async fn splice(conn: TcpStream, mut rx: mpsc::Receiver<ToAgent>, out: Outbox) {
    let (mut r, mut w) = conn.into_split();
    let mut buf = vec![0u8; CHUNK_BYTES];
    let mut writing = true;
    loop {
        tokio::select! {
            n = r.read(&mut buf) => match n {
                Ok(n) if n > 0 => {
                    if out.send(FromAgent::Stdout(buf[..n].to_vec())).await.is_err() {
                        return;
                    }
                }
                _ => break,
            },
            msg = rx.recv(), if writing => match msg {
                Some(ToAgent::Stdin(data)) => {
                    if w.write_all(&data).await.is_err() {
                        break;
                    }
                }
                Some(ToAgent::CloseStdin) => {
                    writing = false;
                    let _ = w.shutdown().await;
                }
                Some(ToAgent::Cancel) | None => return,
                Some(_) => {}
            }
        }
    }
    let _ = out.send(FromAgent::Closed).await;
}

async fn connect(port: u16) -> Result<TcpStream, AgentError> {
    if port == 0 {
        return Err(AgentError::new(ErrorCode::InvalidRequest, "port 0"));
    }
    let conn = match TcpStream::connect(("127.0.0.1", port)).await {
        Ok(c) => c,
        Err(_) => TcpStream::connect(("::1", port)).await.map_err(|e| {
            AgentError::new(
                ErrorCode::NotFound,
                format!("nothing accepts on port {port}: {e}"),
            )
        })?,
    };
    // A relay passes on whatever arrives, often in small writes: Nagle would hold each behind
    // the server's delayed ACK (~40 ms).
    let _ = conn.set_nodelay(true);
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_rows_only() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0\n   1: 0100007F:D3A2 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0 20 4 30 10 -1\n";
        assert_eq!(parse_listening(table).collect::<Vec<_>>(), [8080]);
    }
}
