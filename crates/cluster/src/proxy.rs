//! One request to another node, streamed both ways: the request body goes out as the client
//! sends it and the answer (JSON, a download, Server-Sent Events) comes back as the owner
//! writes it; a WebSocket (terminal, watch, a preview's) is bridged byte for byte once both
//! sides switched protocols. A fresh connection per request: upgrades and long streams own
//! theirs, and nothing of one caller's request can be read as part of another's.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use koder_api_types::ErrorCode;
use koder_http::ApiError;
use koder_sessions::Peer;

use crate::proof::{ClusterKey, HEADER};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Who forwards: this node's id and the cluster's key.
pub struct Sender<'a> {
    pub node: &'a str,
    pub key: &'a ClusterKey,
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

/// A fresh connection to another node, bounded by the connect timeout; Nagle off, since
/// streamed answers are many small writes (see the daemon's listener).
pub(crate) async fn dial(authority: &str) -> Result<tokio::net::TcpStream, String> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(authority))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
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

    let stream = dial(&authority).await.map_err(|e| unreachable(peer, e))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(stream))
        .await
        .map_err(|e| unreachable(peer, e))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let mut resp = sender
        .send_request(Request::from_parts(parts, body))
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
}
