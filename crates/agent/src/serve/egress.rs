//! Egress of a sandbox with network access, while serving. The sandbox keeps its own,
//! otherwise empty network namespace whose nftables rules (loaded at boot,
//! `boot::egress_rules`) redirect every outgoing TCP connection to the agent's listener here
//! and DNS to its resolver here. The agent only asks: the daemon decides each connection
//! (allowlist, SSRF guard, audit) and dials it from the host, so the sandbox never has a route
//! of its own to anything.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{RData, Record, RecordType};
use hickory_proto::serialize::binary::BinEncodable;
use koder_agent_protocol::init::EGRESS_PORT;
use koder_agent_protocol::{FromAgent, ToAgent};
use parking_lot::Mutex;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{mpsc, oneshot};

use super::net;
use crate::outbox::Outbox;

/// How long the daemon has to decide a connection or answer a lookup.
const DECISION_TIMEOUT: Duration = Duration::from_secs(10);
/// How long to wait for a client's first bytes (TLS ClientHello, HTTP request line).
const PEEK_TIMEOUT: Duration = Duration::from_millis(500);
const PEEK_BYTES: usize = 8 * 1024;

/// Connections and lookups waiting for the daemon.
#[derive(Default)]
pub struct Egress {
    subscriber: Mutex<Option<Outbox>>,
    next: AtomicU64,
    conns: Mutex<HashMap<u64, (TcpStream, Vec<u8>)>>,
    lookups: Mutex<HashMap<u64, oneshot::Sender<Vec<IpAddr>>>>,
}

impl Egress {
    /// Starts the redirect listeners and the resolvers (only in sandboxes set up with egress):
    /// on IPv4 loopback, and on IPv6's where the kernel has it (the v6 rules redirect there).
    pub async fn start(self: &Arc<Self>) -> std::io::Result<()> {
        let v4 = IpAddr::V4(Ipv4Addr::LOCALHOST);
        self.listen(TcpListener::bind((v4, EGRESS_PORT)).await?);
        self.answer(UdpSocket::bind((v4, 53)).await?);
        let v6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
        match (
            TcpListener::bind((v6, EGRESS_PORT)).await,
            UdpSocket::bind((v6, 53)).await,
        ) {
            (Ok(tcp), Ok(udp)) => {
                self.listen(tcp);
                self.answer(udp);
            }
            // No IPv6 loopback: the kernel has no IPv6, so nothing can connect over it.
            (Err(e), _) | (_, Err(e)) if e.kind() == std::io::ErrorKind::AddrNotAvailable => {}
            (Err(e), _) | (_, Err(e)) => return Err(e),
        }
        Ok(())
    }

    fn listen(self: &Arc<Self>, tcp: TcpListener) {
        let me = self.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = tcp.accept().await {
                // Relayed bytes are often small writes: Nagle would hold each behind the
                // peer's delayed ACK (~40 ms).
                let _ = conn.set_nodelay(true);
                tokio::spawn(me.clone().intercept(conn));
            }
        });
    }

    fn answer(self: &Arc<Self>, udp: UdpSocket) {
        let udp = Arc::new(udp);
        let me = self.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 1500];
            while let Ok((n, from)) = udp.recv_from(&mut buf).await {
                let query = buf[..n].to_vec();
                tokio::spawn(me.clone().resolve(udp.clone(), query, from));
            }
        });
    }

    fn subscriber(&self) -> Option<Outbox> {
        self.subscriber.lock().clone()
    }

    async fn intercept(self: Arc<Self>, mut conn: TcpStream) {
        let Some(dest) = original_destination(&conn) else {
            return;
        };
        let Some(out) = self.subscriber() else { return };
        let peeked = peek(&mut conn).await;
        let (sni, host) = (parse_sni(&peeked), parse_host(&peeked));
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.conns.lock().insert(id, (conn, peeked));
        let ask = FromAgent::EgressConnect {
            conn: id,
            ip: dest.ip(),
            port: dest.port(),
            sni,
            host,
        };
        if out.send(ask).await.is_err() {
            self.conns.lock().remove(&id);
            return;
        }
        // Undecided connections do not linger.
        tokio::time::sleep(DECISION_TIMEOUT).await;
        self.conns.lock().remove(&id);
    }

    async fn resolve(self: Arc<Self>, udp: Arc<UdpSocket>, query: Vec<u8>, from: SocketAddr) {
        let Ok(msg) = Message::from_vec(&query) else {
            return;
        };
        let Some(q) = msg.queries().first().cloned() else {
            return;
        };
        let Some(out) = self.subscriber() else { return };
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.lookups.lock().insert(id, tx);
        let name = q.name().to_ascii().trim_end_matches('.').to_string();
        let ask = FromAgent::DnsQuery {
            id,
            name,
            qtype: u16::from(q.query_type()),
        };
        let addrs = if out.send(ask).await.is_ok() {
            tokio::time::timeout(DECISION_TIMEOUT, rx)
                .await
                .ok()
                .and_then(Result::ok)
        } else {
            None
        };
        self.lookups.lock().remove(&id);
        let mut reply = Message::new();
        reply
            .set_id(msg.id())
            .set_message_type(MessageType::Response)
            .set_op_code(msg.op_code())
            .set_recursion_desired(msg.recursion_desired())
            .set_recursion_available(true)
            .add_query(q.clone());
        let wanted: Vec<Record> = addrs
            .unwrap_or_default()
            .into_iter()
            .filter_map(|a| match (a, q.query_type()) {
                (IpAddr::V4(v4), RecordType::A) => Some(RData::A(A(v4))),
                (IpAddr::V6(v6), RecordType::AAAA) => Some(RData::AAAA(AAAA(v6))),
                _ => None,
            })
            .map(|rdata| Record::from_rdata(q.name().clone(), 30, rdata))
            .collect();
        if wanted.is_empty() && !matches!(q.query_type(), RecordType::AAAA) {
            reply.set_response_code(ResponseCode::NXDomain);
        }
        for r in wanted {
            reply.add_answer(r);
        }
        if let Ok(bytes) = reply.to_bytes() {
            let _ = udp.send_to(&bytes, from).await;
        }
    }
}

/// `EgressSubscribe`: this stream carries the sandbox's egress questions until it closes.
pub async fn subscribe(egress: &Egress, mut rx: mpsc::Receiver<ToAgent>, out: Outbox) {
    *egress.subscriber.lock() = Some(out);
    while let Some(msg) = rx.recv().await {
        match msg {
            ToAgent::EgressDeny { conn } => {
                if let Some((c, _)) = egress.conns.lock().remove(&conn) {
                    reset(c);
                }
            }
            ToAgent::DnsAnswer { id, addrs } => {
                if let Some(tx) = egress.lookups.lock().remove(&id) {
                    let _ = tx.send(addrs);
                }
            }
            ToAgent::Cancel => break,
            _ => {}
        }
    }
    *egress.subscriber.lock() = None;
}

/// `EgressAttach`: relays an allowed connection over this stream.
pub async fn attach(egress: &Egress, conn: u64, rx: mpsc::Receiver<ToAgent>, out: Outbox) {
    let Some((stream, peeked)) = egress.conns.lock().remove(&conn) else {
        let _ = out.send(FromAgent::Closed).await;
        return;
    };
    if !peeked.is_empty() && out.send(FromAgent::Stdout(peeked)).await.is_err() {
        return;
    }
    net::splice(stream, rx, out).await;
}

/// Closes with RST so the client sees "connection refused/reset" at once.
fn reset(conn: TcpStream) {
    let _ = conn.set_zero_linger();
    drop(conn);
}

/// Where the connection was going before the redirect: `SO_ORIGINAL_DST`, or for an IPv6
/// connection its v6 twin (`IP6T_SO_ORIGINAL_DST`, same number, `SOL_IPV6`).
fn original_destination(conn: &TcpStream) -> Option<SocketAddr> {
    const SO_ORIGINAL_DST: libc::c_int = 80;
    let fd = conn.as_raw_fd();
    if conn.local_addr().ok()?.is_ipv6() {
        let addr: libc::sockaddr_in6 = original_dst(fd, libc::SOL_IPV6, SO_ORIGINAL_DST)?;
        return Some(SocketAddr::V6(SocketAddrV6::new(
            Ipv6Addr::from(addr.sin6_addr.s6_addr),
            u16::from_be(addr.sin6_port),
            0,
            addr.sin6_scope_id,
        )));
    }
    let addr: libc::sockaddr_in = original_dst(fd, libc::SOL_IP, SO_ORIGINAL_DST)?;
    Some(SocketAddr::V4(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr)),
        u16::from_be(addr.sin_port),
    )))
}

/// One socket address read with `getsockopt`; `T` is `sockaddr_in` or `sockaddr_in6`.
fn original_dst<T>(fd: libc::c_int, level: libc::c_int, name: libc::c_int) -> Option<T> {
    // SAFETY: T is a sockaddr struct, plain old data for which all-zero is a valid value.
    let mut addr: T = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `addr`, which we own.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            &mut addr as *mut T as *mut libc::c_void,
            &mut len,
        )
    };
    (rc == 0).then_some(addr)
}

/// The client's first bytes, enough to read a ClientHello or request head; a server-speaks-
/// first protocol sends nothing, which the timeout covers.
async fn peek(conn: &mut TcpStream) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 2048];
    let deadline = tokio::time::Instant::now() + PEEK_TIMEOUT;
    while buf.len() < PEEK_BYTES && !complete(&buf) {
        match tokio::time::timeout_at(deadline, conn.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => break,
        }
    }
    buf
}

fn complete(buf: &[u8]) -> bool {
    if buf.first() == Some(&0x16) && buf.len() >= 5 {
        let len = usize::from(u16::from_be_bytes([buf[3], buf[4]]));
        return buf.len() >= 5 + len;
    }
    buf.windows(4).any(|w| w == b"\r\n\r\n")
}

/// The server name of a TLS ClientHello. Hand-parsed with bounds checks at every step: only
/// this one field is needed, from untrusted bytes, without pulling in a TLS stack.
pub fn parse_sni(buf: &[u8]) -> Option<String> {
    let rec = buf.get(5..)?;
    if buf.first()? != &0x16 || rec.first()? != &0x01 {
        return None; // not a handshake record carrying a ClientHello
    }
    let mut p = 4 + 2 + 32; // handshake header, version, random
    let sid = usize::from(*rec.get(p)?);
    p += 1 + sid;
    let suites = usize::from(u16::from_be_bytes([*rec.get(p)?, *rec.get(p + 1)?]));
    p += 2 + suites;
    let comp = usize::from(*rec.get(p)?);
    p += 1 + comp;
    let ext_end = p + 2 + usize::from(u16::from_be_bytes([*rec.get(p)?, *rec.get(p + 1)?]));
    p += 2;
    while p + 4 <= ext_end {
        let kind = u16::from_be_bytes([*rec.get(p)?, *rec.get(p + 1)?]);
        let len = usize::from(u16::from_be_bytes([*rec.get(p + 2)?, *rec.get(p + 3)?]));
        let body = rec.get(p + 4..p + 4 + len)?;
        if kind == 0 {
            // server_name list: u16 list len, then (u8 type, u16 len, name)
            let name_len = usize::from(u16::from_be_bytes([*body.get(3)?, *body.get(4)?]));
            let name = body.get(5..5 + name_len)?;
            return std::str::from_utf8(name)
                .ok()
                .map(|s| s.to_ascii_lowercase());
        }
        p += 4 + len;
    }
    None
}

/// The `Host` of an HTTP/1 request head (without a port).
pub fn parse_host(buf: &[u8]) -> Option<String> {
    let head =
        std::str::from_utf8(buf.get(..buf.windows(4).position(|w| w == b"\r\n\r\n")?)?).ok()?;
    let value = head.lines().skip(1).find_map(|l| {
        l.split_once(':')
            .filter(|(k, _)| k.trim().eq_ignore_ascii_case("host"))
            .map(|(_, v)| v.trim())
    })?;
    let host = match value.strip_prefix('[') {
        Some(v6) => v6.split(']').next()?,
        None => value.split(':').next()?,
    };
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ClientHello for `name`.
    fn client_hello(name: &str) -> Vec<u8> {
        let n = name.as_bytes();
        let mut sni = vec![0, 0]; // extension type server_name
        let list_len = (n.len() + 3) as u16;
        sni.extend_from_slice(&(list_len + 2).to_be_bytes());
        sni.extend_from_slice(&list_len.to_be_bytes());
        sni.push(0);
        sni.extend_from_slice(&(n.len() as u16).to_be_bytes());
        sni.extend_from_slice(n);
        let mut hello = vec![3, 3];
        hello.extend_from_slice(&[0; 32]);
        hello.push(0); // session id
        hello.extend_from_slice(&[0, 2, 0x13, 0x01]); // one suite
        hello.extend_from_slice(&[1, 0]); // no compression
        hello.extend_from_slice(&(sni.len() as u16).to_be_bytes());
        hello.extend_from_slice(&sni);
        let mut hs = vec![1, 0];
        hs.extend_from_slice(&(hello.len() as u16).to_be_bytes());
        hs.extend_from_slice(&hello);
        let mut rec = vec![0x16, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn sni_is_read_and_garbage_is_not() {
        let hello = client_hello("PyPI.org");
        assert!(complete(&hello));
        assert_eq!(parse_sni(&hello).as_deref(), Some("pypi.org"));
        for cut in 0..hello.len() {
            let _ = parse_sni(&hello[..cut]); // truncated input never panics
        }
        assert_eq!(parse_sni(b"GET / HTTP/1.1\r\n\r\n"), None);
        let mut lying = hello.clone();
        let at = lying.len() - 10;
        lying[at] = 0xff; // a length pointing past the end
        let _ = parse_sni(&lying);
    }

    #[test]
    fn http_host_is_read() {
        assert_eq!(
            parse_host(b"GET / HTTP/1.1\r\nHost: Example.test:8080\r\n\r\n").as_deref(),
            Some("example.test")
        );
        assert_eq!(
            parse_host(b"GET / HTTP/1.1\r\nhost: [::1]:80\r\n\r\n").as_deref(),
            Some("::1")
        );
        assert_eq!(parse_host(b"GET / HTTP/1.1\r\nX: y\r\n\r\n"), None);
        assert_eq!(parse_host(b"GET / HTTP/1.1\r\nHost: a"), None);
    }
}
