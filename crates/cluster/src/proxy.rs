//! One request to another node, streamed both ways: the request body goes out as the client
//! sends it and the answer (JSON, a download, Server-Sent Events) comes back as the owner
//! writes it; a WebSocket (terminal, watch, a preview's) is bridged byte for byte once both
//! sides switched protocols. Connections to other nodes are kept open between requests
//! ([`Pools`]): a forward costs one more local round trip, not a TCP handshake too. An HTTP/1
//! connection carries one request at a time (an upgraded one leaves the pool for good), and
//! hyper frames each request whole, so nothing of one caller's request is read as part of
//! another's.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::response::Response;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use koder_api_types::ErrorCode;
use koder_http::ApiError;
use koder_sessions::Peer;

use crate::proof::{ClusterKey, HEADER};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an unused connection to another node stays open. Shorter than a node's own idle
/// limit for clients, so it is this side that closes it, not the owner under a new request.
const IDLE: Duration = Duration::from_secs(20);
/// Idle connections kept per node: enough for a burst of forwarded requests to find one.
const MAX_IDLE_PER_NODE: usize = 64;
/// TCP keepalive of kept connections: probes after this much idleness...
const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
/// ...every this long, and the connection is closed after this many go unanswered.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
const KEEPALIVE_PROBES: u32 = 3;
/// How long what this node sent to another may go unacknowledged (a request, or a keepalive
/// probe) before the connection is given up: a node whose host vanished mid-request is a
/// typed 502 within this, not after TCP's retransmissions (~15 minutes).
const USER_TIMEOUT: Duration = Duration::from_secs(15);
/// An HTTP/2 connection another node stops answering pings on is closed after this.
const PING_EVERY: Duration = Duration::from_secs(10);

/// Connections to other nodes, kept between requests: hyper's pooling client (one pool for
/// REST and its upgrades over HTTP/1, one HTTP/2 connection per node for gRPC's unary calls).
#[derive(Clone)]
pub struct Pools {
    http1: Client<HttpConnector, Body>,
    grpc: Client<HttpConnector, Body>,
}

impl Pools {
    pub fn new() -> Pools {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        // Streamed answers are many small writes (see the daemon's listener).
        connector.set_nodelay(true);
        // A kept connection to a node whose host vanished without closing it is found dead
        // by TCP keepalive within ~11 s of idleness, so a later forward dials afresh instead
        // of waiting on it for TCP's retransmission timeout.
        connector.set_keepalive(Some(KEEPALIVE_IDLE));
        connector.set_keepalive_interval(Some(KEEPALIVE_INTERVAL));
        connector.set_keepalive_retries(Some(KEEPALIVE_PROBES));
        connector.set_tcp_user_timeout(Some(USER_TIMEOUT));
        let builder = || {
            let mut b = Client::builder(TokioExecutor::new());
            b.pool_timer(TokioTimer::new())
                .timer(TokioTimer::new())
                .pool_idle_timeout(IDLE);
            b
        };
        let http1 = builder()
            .pool_max_idle_per_host(MAX_IDLE_PER_NODE)
            .build(connector.clone());
        let grpc = builder()
            .http2_only(true)
            .http2_keep_alive_interval(PING_EVERY)
            .http2_keep_alive_timeout(CONNECT_TIMEOUT)
            .build(connector);
        Pools { http1, grpc }
    }

    /// Sends `req` (an absolute `http://` URI) over a kept connection to its node: the HTTP/2
    /// one for a gRPC call, else an HTTP/1 one.
    pub(crate) async fn send(
        &self,
        req: Request,
        grpc: bool,
    ) -> Result<Response<hyper::body::Incoming>, String> {
        let client = if grpc { &self.grpc } else { &self.http1 };
        client.request(req).await.map_err(|e| reason(&e))
    }
}

/// An error and its causes, as one line (the client's own says only which step failed).
fn reason(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        line.push_str(": ");
        line.push_str(&c.to_string());
        cause = c.source();
    }
    line
}

/// Who forwards: this node's id, the cluster's key and the connections it keeps.
pub struct Sender<'a> {
    pub node: &'a str,
    pub key: &'a ClusterKey,
    pub pools: &'a Pools,
}

fn unreachable(peer: &Peer, why: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        502,
        ErrorCode::NodeUnreachable.as_str(),
        format!(
            "node {} holding this could not be reached: {why}",
            peer.node_id
        ),
    )
}

/// `host:port` of a node's advertised `http://host:port` address.
fn authority(peer: &Peer) -> Result<String, ApiError> {
    authority_of(&peer.address).map_err(|why| unreachable(peer, why))
}

/// `host:port` of an advertised `http://host:port` address, or why it is none.
pub(crate) fn authority_of(address: &str) -> Result<String, &'static str> {
    let uri: Uri = address
        .parse()
        .map_err(|_| "its advertised address is not a URL")?;
    if uri.scheme_str() != Some("http") {
        return Err("its advertised address is not http://host:port");
    }
    let host = uri.host().ok_or("its advertised address has no host")?;
    Ok(format!("{host}:{}", uri.port_u16().unwrap_or(80)))
}

/// A connection of its own to another node, bounded by the connect timeout, for a gRPC
/// stream (see `grpc::send`), with the pools' socket options: Nagle off, and keepalive and
/// the user timeout, without which a stream quiet for a while (an exec waiting on its
/// program) to a host that vanished would wait forever.
pub(crate) async fn dial(authority: &str) -> Result<tokio::net::TcpStream, String> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(authority))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let socket = socket2::SockRef::from(&stream);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    socket
        .set_tcp_nodelay(true)
        .and_then(|()| socket.set_tcp_keepalive(&keepalive))
        .and_then(|()| socket.set_tcp_user_timeout(Some(USER_TIMEOUT)))
        .map_err(|e| format!("socket options: {e}"))?;
    Ok(stream)
}

/// `http://authority/target`.
pub(crate) fn absolute(authority: &str, target: &str) -> Result<Uri, axum::http::Error> {
    Uri::builder()
        .scheme("http")
        .authority(authority)
        .path_and_query(target)
        .build()
}

fn is_upgrade(req: &Request) -> bool {
    req.headers().contains_key(header::UPGRADE)
}

/// Sends `req` to `peer` and returns its answer, streaming.
pub async fn forward(
    from: &Sender<'_>,
    peer: &Peer,
    mut req: Request,
) -> Result<Response, ApiError> {
    let authority = authority(peer)?;
    let upgrade = is_upgrade(&req);
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    let client_authority = parts.uri.authority().map(|a| a.to_string());
    let target = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    parts.uri = target.parse().map_err(|_| {
        ApiError::new(
            400,
            ErrorCode::InvalidArgument.as_str(),
            "bad request target",
        )
    })?;
    koder_http::strip_hop_by_hop(&mut parts.headers, upgrade);
    parts.headers.remove(HEADER);
    let proof = from
        .key
        .sign(from.node, crate::now_ms(), &parts.method, &target);
    // The name the client asked for stays (the owner routes `<port>-<id>.<domain>` by it, and
    // answers with URLs under it); HTTP/2's authority becomes HTTP/1's Host.
    if !parts.headers.contains_key(header::HOST) {
        let asked = client_authority.unwrap_or(authority.clone());
        let host = HeaderValue::from_str(&asked).map_err(|_| unreachable(peer, "bad address"))?;
        parts.headers.insert(header::HOST, host);
    }
    let proof = HeaderValue::from_str(&proof).map_err(|_| unreachable(peer, "bad node id"))?;
    parts.headers.insert(HEADER, proof);
    // The pool keys connections by the absolute URI; hyper writes the origin form.
    parts.uri = absolute(&authority, &target).map_err(|e| unreachable(peer, e))?;

    let mut resp = from
        .pools
        .send(Request::from_parts(parts, body), false)
        .await
        .map_err(|e| unreachable(peer, e))?;

    let switched = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
    if let (true, Some(client_upgrade)) = (switched, client_upgrade) {
        let owner_upgrade = hyper::upgrade::on(&mut resp);
        tokio::spawn(async move {
            if let (Ok(client), Ok(owner)) = (client_upgrade.await, owner_upgrade.await) {
                let _ = tokio::io::copy_bidirectional(
                    &mut TokioIo::new(client),
                    &mut TokioIo::new(owner),
                )
                .await;
            }
        });
    }
    let (mut parts, body) = resp.into_parts();
    koder_http::strip_hop_by_hop(&mut parts.headers, switched);
    Ok(Response::from_parts(parts, Body::new(body)))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use axum::routing::post;
    use axum::serve::ListenerExt as _;

    use super::*;

    fn peer(address: &str) -> Peer {
        Peer {
            node_id: "n".into(),
            address: address.into(),
            grpc_address: None,
        }
    }

    #[test]
    fn only_plain_http_addresses_are_dialled() {
        assert_eq!(
            authority(&peer("http://10.0.0.2:7070")).unwrap(),
            "10.0.0.2:7070"
        );
        assert_eq!(authority(&peer("http://node-b")).unwrap(), "node-b:80");
        assert_eq!(
            authority(&peer("http://[fd00::2]:7070/")).unwrap(),
            "[fd00::2]:7070"
        );
        for bad in ["https://node-b:7070", "node-b:7070", "", "http://"] {
            assert!(authority(&peer(bad)).is_err(), "{bad}");
        }
    }

    /// A node on loopback echoing bodies; its address and the client ports of the connections
    /// it accepted.
    async fn echo_node() -> (String, Arc<Mutex<Vec<u16>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let ports = accepted.clone();
        let listener = listener.tap_io(move |tcp| {
            let port = tcp.peer_addr().map_or(0, |a| a.port());
            ports.lock().unwrap().push(port);
        });
        let app = axum::Router::new().route("/echo", post(|body: String| async move { body }));
        tokio::spawn(async move { axum::serve(listener, app).await });
        (address, accepted)
    }

    /// `req` forwarded by node `node-a` over `pools` to the node at `address`.
    async fn forwarded(pools: &Pools, address: &str, req: Request) -> Result<Response, ApiError> {
        let key = ClusterKey::new(&[7; 32]).unwrap();
        let from = Sender {
            node: "node-a",
            key: &key,
            pools,
        };
        forward(&from, &peer(address), req).await
    }

    #[tokio::test]
    async fn forwards_to_a_node_reuse_one_kept_connection() {
        let (address, accepted) = echo_node().await;
        let pools = Pools::new();
        for i in 0..5 {
            let req = Request::post("/echo")
                .body(Body::from(format!("call {i}")))
                .unwrap();
            let resp = forwarded(&pools, &address, req).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
            let body = axum::body::to_bytes(resp.into_body(), 1024).await.unwrap();
            assert_eq!(body, format!("call {i}"));
        }
        assert_eq!(accepted.lock().unwrap().len(), 1);
    }

    /// The timer a loopback socket of local `port` has armed, from /proc/net/tcp (2 is
    /// keepalive's).
    fn timer_of(port: u16) -> Option<u8> {
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
        let local = format!(":{port:04X}");
        table.lines().skip(1).find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (timer, _) = fields.get(5)?.split_once(':')?;
            fields[1].ends_with(&local).then(|| timer.parse().ok())?
        })
    }

    #[tokio::test]
    async fn kept_connections_are_probed_by_tcp_keepalive() {
        let (address, accepted) = echo_node().await;
        let pools = Pools::new();
        let req = Request::post("/echo").body(Body::from("x")).unwrap();
        let resp = forwarded(&pools, &address, req).await.unwrap();
        axum::body::to_bytes(resp.into_body(), 64).await.unwrap();
        let port = accepted.lock().unwrap()[0];
        // Idle in the pool, the connection waits on its keepalive timer.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert_eq!(timer_of(port), Some(2));
    }

    /// (keepalive idle time, user timeout) of this process's connections to `port`.
    fn options_of_connections_to(port: u16) -> Vec<(Duration, Option<Duration>)> {
        use std::os::fd::BorrowedFd;
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc/self/fd").unwrap() {
            let Ok(fd) = entry.unwrap().file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            // SAFETY: only borrowed while this test's own descriptors stay open; one closed
            // meanwhile fails the calls below, which skip it.
            let fd = unsafe { BorrowedFd::borrow_raw(fd) };
            let socket = socket2::SockRef::from(&fd);
            let to_port = socket
                .peer_addr()
                .ok()
                .and_then(|a| a.as_socket())
                .map(|a| a.port());
            if to_port == Some(port) {
                found.push((
                    socket.tcp_keepalive_time().unwrap(),
                    socket.tcp_user_timeout().unwrap(),
                ));
            }
        }
        found
    }

    #[tokio::test]
    async fn connections_to_nodes_give_up_on_a_silent_host() {
        let (address, _) = echo_node().await;
        let port: u16 = address.rsplit(':').next().unwrap().parse().unwrap();
        let pools = Pools::new();
        let req = Request::post("/echo").body(Body::from("x")).unwrap();
        let resp = forwarded(&pools, &address, req).await.unwrap();
        axum::body::to_bytes(resp.into_body(), 64).await.unwrap();
        let stream = dial(authority_of(&address).unwrap().as_str())
            .await
            .unwrap();
        assert!(stream.nodelay().unwrap());
        // The kept connection and the gRPC stream's own.
        assert_eq!(
            options_of_connections_to(port),
            [(KEEPALIVE_IDLE, Some(USER_TIMEOUT)); 2]
        );
    }

    #[tokio::test]
    async fn concurrent_grpc_calls_share_one_http2_connection() {
        let (address, accepted) = echo_node().await;
        let pools = Pools::new();
        let calls = (0..4).map(|i| {
            let pools = pools.clone();
            let uri = format!("{address}/echo");
            async move {
                let req = Request::post(uri).body(Body::from(format!("{i}"))).unwrap();
                let resp = pools.send(req, true).await.unwrap();
                assert_eq!(resp.version(), axum::http::Version::HTTP_2);
                let body = axum::body::to_bytes(Body::new(resp.into_body()), 64).await;
                assert_eq!(body.unwrap(), format!("{i}"));
            }
        });
        futures::future::join_all(calls).await;
        assert_eq!(accepted.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_node_not_listening_is_a_typed_502() {
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let req = Request::get("/v1/sandbox/sessions")
            .body(Body::empty())
            .unwrap();
        let e = forwarded(&Pools::new(), &address, req).await.unwrap_err();
        assert_eq!(
            (e.status, e.code),
            (StatusCode::BAD_GATEWAY, ErrorCode::NodeUnreachable.as_str())
        );
        assert!(e.message.contains("refused"), "{}", e.message);
    }
}
