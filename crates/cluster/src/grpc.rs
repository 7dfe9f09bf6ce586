//! The gRPC face in a cluster: a call for a session another node holds is forwarded to that
//! node's gRPC face (its registered `grpc_address`), and a `CreateSession` is placed as a REST
//! create is. Unlike a REST request, a call names its session in its body: every
//! session-scoped request message has `session_id` as field 1, and the two client streams
//! (`Terminal`, `WriteFile`) open with a message whose field 1 holds one that does. So the
//! first message is read here (bounded), looked into, and sent on ahead of the rest of the
//! stream, to the owner or to this node's own service. The hop is authenticated by the same
//! proof as REST's (the caller by the owner, from the `authorization` metadata that travels
//! unchanged).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt as _, TryStreamExt as _};
use hyper_util::rt::{TokioExecutor, TokioIo};
use koder_api_types::ErrorCode;
use koder_grpc::proto as pb;
use koder_sessions::Peer;
use prost::Message as _;

use crate::proof::HEADER;
use crate::Cluster;

/// The path prefix of the Sandbox service's methods.
const SERVICE: &str = "/koder.ai.sandbox.v1.Sandbox/";
/// Methods whose request message names the session in field 1.
const SESSION_SCOPED: &[&str] = &[
    "GetSession",
    "DeleteSession",
    "PauseSession",
    "ResumeSession",
    "ForkSession",
    "RestoreSession",
    "SetNetwork",
    "PinPreview",
    "ListSessionEvents",
    "Exec",
    "ExecStream",
    "StartExec",
    "ListExecs",
    "GetExec",
    "FollowExec",
    "WriteStdin",
    "SignalExec",
    "ReadFile",
    "ListFiles",
    "DeleteFile",
    "MoveFile",
    "WatchFiles",
    "CreateContext",
    "RunInContext",
    "CreateSnapshot",
];
/// Client streams whose first message holds, in field 1, a message naming the session.
const SESSION_SCOPED_STREAMS: &[&str] = &["Terminal", "WriteFile"];
/// Methods that stream either way.
const STREAMING: &[&str] = &[
    "ExecStream",
    "FollowExec",
    "Terminal",
    "ReadFile",
    "WriteFile",
    "WatchFiles",
    "ReadVolumeFile",
    "WriteVolumeFile",
];
/// gRPC's length prefix: a compression flag byte and a big-endian u32 length.
const PREFIX: usize = 5;
/// A first message longer than this is not looked into (tonic's default decoding limit, so
/// the service refuses it anyway).
const MAX_FIRST_MESSAGE: usize = 4 << 20;

/// What a call is, for the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    /// On a session named in the first message's field 1 (`nested`: in field 1 of a
    /// message there).
    Session {
        nested: bool,
    },
    Create,
    /// Anything any node serves (lists, snapshots, volumes, tenants, reflection).
    Any,
}

fn call_of(path: &str) -> Call {
    let Some(method) = path.strip_prefix(SERVICE) else {
        return Call::Any;
    };
    if method == "CreateSession" {
        Call::Create
    } else if SESSION_SCOPED.contains(&method) {
        Call::Session { nested: false }
    } else if SESSION_SCOPED_STREAMS.contains(&method) {
        Call::Session { nested: true }
    } else {
        Call::Any
    }
}

/// Field 1 of any session-scoped request (other fields skipped as unknown).
#[derive(Clone, PartialEq, prost::Message)]
struct Scoped {
    #[prost(string, tag = "1")]
    session_id: String,
}

/// The first message of a session-scoped client stream.
#[derive(Clone, PartialEq, prost::Message)]
struct Opening {
    #[prost(message, optional, tag = "1")]
    start: Option<Scoped>,
}

/// The session a first message names; `None` when it names none (the service answers that).
fn session_of(message: &[u8], nested: bool) -> Option<String> {
    let id = if nested {
        Opening::decode(message).ok()?.start?.session_id
    } else {
        Scoped::decode(message).ok()?.session_id
    };
    (!id.is_empty()).then_some(id)
}

/// Puts the cluster in front of the gRPC `router` (`koder_grpc::router`).
pub fn mount(router: axum::Router, cluster: Cluster) -> axum::Router {
    router.layer(axum::middleware::from_fn_with_state(
        Arc::new(cluster),
        forward,
    ))
}

async fn forward(State(c): State<Arc<Cluster>>, mut req: Request, next: Next) -> Response {
    if req.headers().contains_key(HEADER) {
        return match crate::checked(&c, &req) {
            Ok(from) => {
                tracing::debug!(%from, path = req.uri().path(), "serving a forwarded call");
                req.headers_mut().remove(HEADER);
                next.run(req).await
            }
            Err(e) => failure(ErrorCode::NodeAuth, &e.to_string()),
        };
    }
    let call = call_of(req.uri().path());
    let nested = match call {
        Call::Any => return next.run(req).await,
        Call::Session { nested } => Some(nested),
        Call::Create => None,
    };
    let (parts, body) = req.into_parts();
    let (read, message, rest) = match first_message(body).await {
        Ok(first) => first,
        Err(e) => return failure(ErrorCode::InvalidArgument, &e),
    };
    let Some(message) = message else {
        return next
            .run(Request::from_parts(parts, rejoin(read, rest)))
            .await;
    };
    let Some(nested) = nested else {
        return create(&c, parts, read, &message, rest, next).await;
    };
    let owner = match session_of(&message, nested) {
        Some(id) => c.manager.owner_of(&id).await,
        None => Ok(None),
    };
    match owner {
        Ok(Some(peer)) => send(&c, &peer, parts, rejoin(read, rest))
            .await
            .unwrap_or_else(|e| e),
        Ok(None) => {
            next.run(Request::from_parts(parts, rejoin(read, rest)))
                .await
        }
        Err(e) => failure(e.code(), &e.to_string()),
    }
}

/// A body of the bytes already read and the rest still to come.
fn rejoin(
    read: Bytes,
    rest: impl Stream<Item = Result<Bytes, axum::Error>> + Send + 'static,
) -> Body {
    Body::from_stream(futures::stream::once(async { Ok(read) }).chain(rest))
}

/// A create goes where there is room for its runtime (a warm sandbox for it first), as a
/// REST create does; made here when that node cannot be reached. A unary call: its whole
/// body is the one message, kept so the create can still be made here.
async fn create(
    c: &Cluster,
    parts: Parts,
    read: Bytes,
    message: &[u8],
    rest: impl Stream<Item = Result<Bytes, axum::Error>> + Send + 'static,
    next: Next,
) -> Response {
    let mut whole = BytesMut::from(&read[..]);
    let mut rest = std::pin::pin!(rest);
    while let Some(chunk) = rest.next().await {
        match chunk {
            Ok(chunk) if whole.len() + chunk.len() <= MAX_FIRST_MESSAGE + 2 * PREFIX => {
                whole.extend_from_slice(&chunk)
            }
            Ok(_) => {
                return failure(
                    ErrorCode::InvalidArgument,
                    "CreateSession takes one message",
                )
            }
            Err(e) => return failure(ErrorCode::InvalidArgument, &e.to_string()),
        }
    }
    let whole = whole.freeze();
    let placed = match pb::CreateSessionRequest::decode(message)
        .ok()
        .and_then(|m| koder_api_types::CreateSession::try_from(m).ok())
    {
        // The service answers a request it cannot read.
        None => Ok(None),
        Some(create) => {
            let runtime = create.runtime.as_deref().unwrap_or("jail");
            let lane = c.manager.lane_of(&create);
            c.place(&parts.headers, runtime, lane.as_deref()).await
        }
    };
    match placed {
        Ok(Some(peer)) => match send(c, &peer, parts.clone(), Body::from(whole.clone())).await {
            Ok(resp) => resp,
            Err(_) => {
                tracing::warn!(
                    node = peer.node_id,
                    "placing a create there failed; creating here"
                );
                next.run(Request::from_parts(parts, Body::from(whole)))
                    .await
            }
        },
        Ok(None) => {
            next.run(Request::from_parts(parts, Body::from(whole)))
                .await
        }
        Err(e) => failure(e.code(), &e.to_string()),
    }
}

/// Reads a call's body up to the end of its first message: the bytes read, the message
/// (`None` when the body ends first, is compressed or the message is over the limit: the
/// service answers those), and the rest of the body.
async fn first_message(
    body: Body,
) -> Result<
    (
        Bytes,
        Option<Bytes>,
        impl Stream<Item = Result<Bytes, axum::Error>> + Send + 'static,
    ),
    String,
> {
    let mut stream = body.into_data_stream();
    let mut read = BytesMut::new();
    let mut wanted = PREFIX;
    loop {
        if read.len() >= PREFIX && wanted == PREFIX {
            let len = u32::from_be_bytes([read[1], read[2], read[3], read[4]]) as usize;
            if read[0] != 0 || len > MAX_FIRST_MESSAGE {
                return Ok((read.freeze(), None, stream));
            }
            wanted = PREFIX + len;
        }
        if read.len() >= wanted && wanted > PREFIX {
            let message = Bytes::copy_from_slice(&read[PREFIX..wanted]);
            return Ok((read.freeze(), Some(message), stream));
        }
        match stream.try_next().await {
            Ok(Some(chunk)) => read.extend_from_slice(&chunk),
            Ok(None) => return Ok((read.freeze(), None, stream)),
            Err(e) => return Err(format!("reading the call: {e}")),
        }
    }
}

/// A failed call as gRPC answers it (a status in the headers, the SANDBOX code in details).
fn failure(code: ErrorCode, message: &str) -> Response {
    koder_grpc::status::status(code, message, None).into_http::<Body>()
}

fn unreachable_status(peer: &Peer, why: impl std::fmt::Display) -> Response {
    failure(
        ErrorCode::NodeUnreachable,
        &format!(
            "node {} holding this could not be reached over gRPC: {why}",
            peer.node_id
        ),
    )
}

/// Sends the call to `peer`'s gRPC face and returns its answer, streamed (trailers
/// included); `Err` with the answer to give when it could not be sent. A unary call goes over
/// the HTTP/2 connection kept to that node; a streaming one over a connection of its own, so
/// long streams (terminals, follows, watches) never fill the kept connection's stream limit
/// and hold unary calls back.
async fn send(
    c: &Cluster,
    peer: &Peer,
    mut parts: Parts,
    body: Body,
) -> Result<Response, Response> {
    let address = peer
        .grpc_address
        .as_deref()
        .ok_or_else(|| unreachable_status(peer, "it serves no gRPC"))?;
    let authority =
        crate::proxy::authority_of(address).map_err(|why| unreachable_status(peer, why))?;
    let target = parts.uri.path().to_string();
    parts.uri =
        crate::proxy::absolute(&authority, &target).map_err(|e| unreachable_status(peer, e))?;
    koder_http::strip_hop_by_hop(&mut parts.headers, false);
    parts.headers.remove(header::HOST);
    let proof = c.key.sign(&c.node, crate::now_ms(), &parts.method, &target);
    let proof =
        HeaderValue::from_str(&proof).map_err(|_| unreachable_status(peer, "bad node id"))?;
    parts.headers.insert(HEADER, proof);
    tracing::debug!(to = peer.node_id, path = target, "forwarding a gRPC call");
    let req = Request::from_parts(parts, body);
    let resp = if is_streaming(&target) {
        own_connection(&authority, req).await
    } else {
        c.pools.send(req, true).await
    };
    resp.map(|r| r.map(Body::new))
        .map_err(|e| unreachable_status(peer, e))
}

/// Whether a method streams either way (its connection is then its own).
fn is_streaming(path: &str) -> bool {
    path.strip_prefix(SERVICE)
        .is_some_and(|m| STREAMING.contains(&m))
}

/// `req` over a new HTTP/2 connection to `authority`, closed when the call ends.
async fn own_connection(
    authority: &str,
    req: Request,
) -> Result<axum::http::Response<hyper::body::Incoming>, String> {
    let stream = crate::proxy::dial(authority).await?;
    let (mut sender, conn) = hyper::client::conn::http2::handshake::<_, _, Body>(
        TokioExecutor::new(),
        TokioIo::new(stream),
    )
    .await
    .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender.send_request(req).await.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost_types::field_descriptor_proto::Type;
    use prost_types::{DescriptorProto, FileDescriptorSet};

    fn messages() -> Vec<DescriptorProto> {
        FileDescriptorSet::decode(koder_grpc::proto::FILE_DESCRIPTOR_SET)
            .unwrap()
            .file
            .into_iter()
            .filter(|f| f.package() == "koder.ai.sandbox.v1")
            .flat_map(|f| f.message_type)
            .collect()
    }

    /// Whether `message`'s field 1 is `string session_id` (or, `nested`, a message whose is).
    fn names_session(all: &[DescriptorProto], message: &str, nested: bool) -> bool {
        let name = message.rsplit('.').next().unwrap();
        let Some(m) = all.iter().find(|m| m.name() == name) else {
            return false;
        };
        let Some(first) = m.field.iter().find(|f| f.number() == 1) else {
            return false;
        };
        if nested {
            first.r#type() == Type::Message && names_session(all, first.type_name(), false)
        } else {
            first.r#type() == Type::String && first.name() == "session_id"
        }
    }

    /// The table above against the `.proto`: every method whose request names a session is
    /// forwarded by it, and none other.
    #[test]
    fn every_session_scoped_method_is_forwarded() {
        let set = FileDescriptorSet::decode(koder_grpc::proto::FILE_DESCRIPTOR_SET).unwrap();
        let all = messages();
        let service = set
            .file
            .iter()
            .flat_map(|f| &f.service)
            .find(|s| s.name() == "Sandbox")
            .unwrap();
        assert!(service.method.len() > 40);
        for m in &service.method {
            let path = format!("{SERVICE}{}", m.name());
            let expected = if m.name() == "CreateSession" {
                Call::Create
            } else if names_session(&all, m.input_type(), false) {
                Call::Session { nested: false }
            } else if m.client_streaming() && names_session(&all, m.input_type(), true) {
                Call::Session { nested: true }
            } else {
                Call::Any
            };
            assert_eq!(call_of(&path), expected, "{}", m.name());
        }
        assert_eq!(call_of("/grpc.reflection.v1.ServerReflection/x"), Call::Any);
    }

    /// The streaming table against the `.proto`: a stream never takes the kept connection.
    #[test]
    fn every_streaming_method_has_a_connection_of_its_own() {
        let set = FileDescriptorSet::decode(koder_grpc::proto::FILE_DESCRIPTOR_SET).unwrap();
        let service = set.file.iter().flat_map(|f| &f.service);
        for m in service
            .filter(|s| s.name() == "Sandbox")
            .flat_map(|s| &s.method)
        {
            let path = format!("{SERVICE}{}", m.name());
            let streams = m.client_streaming() || m.server_streaming();
            assert_eq!(is_streaming(&path), streams, "{}", m.name());
        }
        assert!(!is_streaming(
            "/grpc.reflection.v1.ServerReflection/ExecStream"
        ));
    }

    #[test]
    fn the_session_is_read_from_real_requests() {
        let exec = pb::ExecRequest {
            session_id: "s-1".into(),
            shell: Some("echo hi".into()),
            ..Default::default()
        };
        assert_eq!(
            session_of(&exec.encode_to_vec(), false).as_deref(),
            Some("s-1")
        );
        let open = pb::WriteFileRequest {
            part: Some(pb::write_file_request::Part::Header(pb::WriteFileHeader {
                session_id: "s-2".into(),
                path: "/tmp/x".into(),
                ..Default::default()
            })),
        };
        assert_eq!(
            session_of(&open.encode_to_vec(), true).as_deref(),
            Some("s-2")
        );
        // A stream opening with data, an empty id, garbage: no session (served here).
        let data = pb::WriteFileRequest {
            part: Some(pb::write_file_request::Part::Data(b"x".to_vec())),
        };
        assert_eq!(session_of(&data.encode_to_vec(), true), None);
        assert_eq!(
            session_of(&pb::GetSessionRequest::default().encode_to_vec(), false),
            None
        );
        assert_eq!(session_of(&[0xff, 0xff, 0xff], false), None);
    }

    fn frame(message: &[u8]) -> Vec<u8> {
        let mut f = vec![0];
        f.extend_from_slice(&(message.len() as u32).to_be_bytes());
        f.extend_from_slice(message);
        f
    }

    async fn split(chunks: Vec<Vec<u8>>) -> (Bytes, Option<Bytes>, Vec<u8>) {
        let body = Body::from_stream(futures::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, std::io::Error>(Bytes::from(c))),
        ));
        let (read, message, rest) = first_message(body).await.unwrap();
        let rest: Vec<Bytes> = rest.try_collect().await.unwrap();
        (read, message, rest.concat())
    }

    #[tokio::test]
    async fn the_first_message_is_read_across_chunks_and_nothing_is_lost() {
        let mut wire = frame(b"first");
        wire.extend(frame(b"second"));
        // Split inside the prefix and inside the message.
        let chunks = vec![wire[..2].to_vec(), wire[2..7].to_vec(), wire[7..].to_vec()];
        let (read, message, rest) = split(chunks).await;
        assert_eq!(message.as_deref(), Some(&b"first"[..]));
        let mut all = read.to_vec();
        all.extend(rest);
        assert_eq!(all, wire);
    }

    #[tokio::test]
    async fn unreadable_first_messages_are_left_to_the_service() {
        // Compressed, over the limit, cut short, empty.
        let mut compressed = frame(b"x");
        compressed[0] = 1;
        let mut huge = vec![0];
        huge.extend_from_slice(&(MAX_FIRST_MESSAGE as u32 + 1).to_be_bytes());
        let short = frame(b"hello")[..7].to_vec();
        for wire in [compressed, huge, short, Vec::new()] {
            let (read, message, rest) = split(vec![wire.clone()]).await;
            assert_eq!(message, None);
            let mut all = read.to_vec();
            all.extend(rest);
            assert_eq!(all, wire);
        }
    }
}
