//! The Connect protocol with the JSON codec, as envd speaks it to the E2B SDKs.
//!
//! Unary calls are plain JSON both ways (`application/json`), errors a non-200 status with
//! `{"code": "<connect code>", "message"}`. Streaming calls (server and client streaming) carry
//! 5-byte envelopes `[flags u8][length u32 BE][json]` in an `application/connect+json` body,
//! always answered 200; the last response envelope has flag 0x02 and holds `{}` or
//! `{"error": {...}}`. Everything a client sends is bounded before it is buffered.

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{Buf, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

/// Exactly what the SDK accepts on a stream: a `; charset` suffix breaks it.
pub const STREAM_CONTENT_TYPE: &str = "application/connect+json";
pub const UNARY_CONTENT_TYPE: &str = "application/json";
/// Largest request message accepted, whole unary body or one envelope (stdin chunks and
/// paths are far smaller; base64 makes input 4/3 larger).
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;
pub const FLAG_COMPRESSED: u8 = 0x01;
pub const FLAG_END_STREAM: u8 = 0x02;
const HEADER_BYTES: usize = 5;

/// Connect error codes (the strings are the wire form).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Canceled,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Internal,
    Unavailable,
    Unauthenticated,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error with this code (Connect protocol table).
    pub fn http_status(self) -> StatusCode {
        match self {
            Code::Canceled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcError {
    pub code: Code,
    pub message: String,
}

impl RpcError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    pub fn to_json(&self) -> Value {
        json!({"code": self.code.as_str(), "message": self.message})
    }
}

/// Session-manager failures in Connect terms. File-level "not found" is `not_found`; the
/// sandbox itself being gone is answered before a handler runs (see `envd::Target`).
impl From<koder_sessions::Error> for RpcError {
    fn from(e: koder_sessions::Error) -> Self {
        use koder_sessions::Error as E;
        let code = match &e {
            E::InvalidArgument(_) | E::NetworkRule(_) => Code::InvalidArgument,
            E::UnknownAccount(_) => Code::Unauthenticated,
            E::SecretNotFound(_)
            | E::NotFound
            | E::ExecExited
            | E::FileNotFound(_)
            | E::TenantNotFound(_)
            | E::SnapshotNotFound
            | E::VolumeNotFound
            | E::ImageNotFound(_) => Code::NotFound,
            E::Conflict(_) | E::VolumeBusy(_) | E::ImageInUse(_) => Code::FailedPrecondition,
            E::PermissionDenied(_) | E::PlanRequired(_) => Code::PermissionDenied,
            E::PayloadTooLarge(_)
            | E::FsQuotaExceeded(_)
            | E::QuotaSessions(_)
            | E::QuotaMinutes(_)
            | E::QuotaSnapshotStorage(_)
            | E::QuotaVolumeStorage(_) => Code::ResourceExhausted,
            E::RuntimeUnavailable(_)
            | E::NodeUnreachable(_)
            | E::PreviewNotListening(_)
            | E::SessionStopped(_)
            | E::ImageNotReady(_) => Code::Unavailable,
            E::AgentTimeout(_) => Code::DeadlineExceeded,
            E::NotImplemented(_) => Code::Unimplemented,
            E::Internal(_) => Code::Internal,
        };
        if code == Code::Internal {
            tracing::error!(error = %e, "envd request failed");
        }
        RpcError::new(code, e.to_string())
    }
}

impl IntoResponse for RpcError {
    /// The unary error form.
    fn into_response(self) -> Response {
        (
            self.code.http_status(),
            [(header::CONTENT_TYPE, UNARY_CONTENT_TYPE)],
            self.to_json().to_string(),
        )
            .into_response()
    }
}

/// One envelope around `payload`.
pub fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(HEADER_BYTES + payload.len());
    out.extend_from_slice(&[flags]);
    // Our own messages are small; a payload beyond u32 would be a bug, not input.
    out.extend_from_slice(&(payload.len().min(u32::MAX as usize) as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out.freeze()
}

/// A message envelope.
pub fn message_frame<T: Serialize>(msg: &T) -> Bytes {
    envelope(
        0,
        &serde_json::to_vec(msg).unwrap_or_else(|_| b"{}".to_vec()),
    )
}

/// The end-of-stream envelope: `{}` or `{"error": {...}}`.
pub fn end_frame(err: Option<&RpcError>) -> Bytes {
    let body = match err {
        Some(e) => json!({"error": e.to_json()}),
        None => json!({}),
    };
    envelope(FLAG_END_STREAM, body.to_string().as_bytes())
}

/// Splits a request body into envelope payloads, refusing hostile framing before buffering it.
#[derive(Debug, Default)]
pub struct EnvelopeDecoder {
    buf: BytesMut,
}

impl EnvelopeDecoder {
    /// Appends received bytes; fails when an envelope declares more than the limit, so a
    /// declared 4 GiB is refused on its header, not after 4 GiB arrived.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), RpcError> {
        self.buf.extend_from_slice(chunk);
        self.check_header()
    }

    fn check_header(&self) -> Result<(), RpcError> {
        if self.buf.len() < HEADER_BYTES {
            return Ok(());
        }
        let flags = self.buf[0];
        if flags & FLAG_COMPRESSED != 0 {
            return Err(RpcError::new(
                Code::Unimplemented,
                "compressed envelopes are not supported (no compression was negotiated)",
            ));
        }
        if flags != 0 {
            return Err(RpcError::invalid(format!(
                "unexpected envelope flags {flags:#04x} in a request"
            )));
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
        if len as usize > MAX_MESSAGE_BYTES {
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!("message of {len} bytes exceeds the limit of {MAX_MESSAGE_BYTES}"),
            ));
        }
        Ok(())
    }

    /// The next complete payload, if one is buffered.
    pub fn next_payload(&mut self) -> Result<Option<Bytes>, RpcError> {
        self.check_header()?;
        if self.buf.len() < HEADER_BYTES {
            return Ok(None);
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if self.buf.len() < HEADER_BYTES + len {
            return Ok(None);
        }
        self.buf.advance(HEADER_BYTES);
        Ok(Some(self.buf.split_to(len).freeze()))
    }

    /// At the end of the body: leftover bytes are a truncated envelope.
    pub fn finish(&self) -> Result<(), RpcError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(RpcError::invalid(format!(
                "request body ends inside an envelope ({} bytes left over)",
                self.buf.len()
            )))
        }
    }
}

/// Request messages of a streaming call, read as they arrive.
pub struct MessageStream {
    body: futures::stream::BoxStream<'static, Result<Bytes, axum::Error>>,
    decoder: EnvelopeDecoder,
    ended: bool,
}

impl MessageStream {
    pub fn new(body: Body) -> Self {
        Self::from_stream(body.into_data_stream())
    }

    pub fn from_stream<S>(s: S) -> Self
    where
        S: Stream<Item = Result<Bytes, axum::Error>> + Send + 'static,
    {
        Self {
            body: s.boxed(),
            decoder: EnvelopeDecoder::default(),
            ended: false,
        }
    }

    /// The next message, `None` at a clean end of the body.
    pub async fn next<T: DeserializeOwned>(&mut self) -> Result<Option<T>, RpcError> {
        loop {
            if let Some(payload) = self.decoder.next_payload()? {
                return parse(&payload).map(Some);
            }
            if self.ended {
                self.decoder.finish()?;
                return Ok(None);
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.decoder.push(&chunk)?,
                Some(Err(e)) => {
                    return Err(RpcError::new(
                        Code::Canceled,
                        format!("reading the request: {e}"),
                    ))
                }
                None => self.ended = true,
            }
        }
    }

    /// Exactly one message (server-streaming requests).
    pub async fn single<T: DeserializeOwned>(mut self) -> Result<T, RpcError> {
        let first = self
            .next::<T>()
            .await?
            .ok_or_else(|| RpcError::invalid("the request stream holds no message"))?;
        if self.next::<Value>().await?.is_some() {
            return Err(RpcError::invalid(
                "a server-streaming request holds exactly one message",
            ));
        }
        Ok(first)
    }
}

/// A JSON message; unknown fields are ignored, as protobuf JSON parsers do.
pub fn parse<T: DeserializeOwned>(payload: &[u8]) -> Result<T, RpcError> {
    serde_json::from_slice(payload).map_err(|e| RpcError::invalid(format!("invalid message: {e}")))
}

/// Reads a whole unary body within the message limit.
pub async fn read_unary<T: DeserializeOwned>(body: Body) -> Result<T, RpcError> {
    let bytes = axum::body::to_bytes(body, MAX_MESSAGE_BYTES)
        .await
        .map_err(|_| {
            RpcError::new(
                Code::ResourceExhausted,
                format!("request body larger than {MAX_MESSAGE_BYTES} bytes"),
            )
        })?;
    // An empty unary body is the empty message.
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return parse(b"{}");
    }
    parse(&bytes)
}

/// Unary calls take `application/json` (with an optional charset); streaming calls
/// `application/connect+json`. Anything else is 415 in the Connect protocol.
pub fn check_content_type(headers: &HeaderMap, streaming: bool) -> Result<(), RpcError> {
    let got = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let base = got
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let want = if streaming {
        STREAM_CONTENT_TYPE
    } else {
        UNARY_CONTENT_TYPE
    };
    if base == want {
        return Ok(());
    }
    Err(RpcError::new(
        Code::Unimplemented,
        format!("content type {got:?} is not supported here; use {want}"),
    ))
}

/// 415 with the accepted type, as Connect servers answer a wrong content type.
pub fn unsupported_media_type(streaming: bool, err: RpcError) -> Response {
    let want = if streaming {
        STREAM_CONTENT_TYPE
    } else {
        UNARY_CONTENT_TYPE
    };
    let mut resp = (
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        [(header::CONTENT_TYPE, UNARY_CONTENT_TYPE)],
        err.to_json().to_string(),
    )
        .into_response();
    resp.headers_mut()
        .insert("accept-post", HeaderValue::from_static(want));
    resp
}

/// Serves a unary call: content type, bounded body, the handler, then the JSON answer or the
/// unary error form.
pub async fn unary<Req, Resp, F, Fut>(headers: &HeaderMap, body: Body, handler: F) -> Response
where
    Req: DeserializeOwned,
    F: FnOnce(Req) -> Fut,
    Resp: Serialize,
    Fut: std::future::Future<Output = Result<Resp, RpcError>>,
{
    if let Err(e) = check_content_type(headers, false) {
        return unsupported_media_type(false, e);
    }
    let req = match read_unary::<Req>(body).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    match handler(req).await {
        Ok(v) => match serde_json::to_vec(&v) {
            Ok(json) => (
                StatusCode::OK,
                [(header::CONTENT_TYPE, UNARY_CONTENT_TYPE)],
                json,
            )
                .into_response(),
            Err(e) => {
                RpcError::new(Code::Internal, format!("encoding the answer: {e}")).into_response()
            }
        },
        Err(e) => e.into_response(),
    }
}

/// Serves a server-streaming call: the one request message goes to `handler`, whose error
/// before the first response message becomes a stream holding only the end envelope.
pub async fn server_stream<Req, F, Fut>(headers: &HeaderMap, body: Body, handler: F) -> Response
where
    Req: DeserializeOwned,
    F: FnOnce(Req) -> Fut,
    Fut: std::future::Future<Output = Result<Response, RpcError>>,
{
    if let Err(e) = check_content_type(headers, true) {
        return unsupported_media_type(true, e);
    }
    let req = match MessageStream::new(body).single::<Req>().await {
        Ok(r) => r,
        Err(e) => return stream_error(e),
    };
    handler(req).await.unwrap_or_else(stream_error)
}

/// `connect-timeout-ms`, when present and valid.
pub fn timeout_ms(headers: &HeaderMap) -> Option<u64> {
    headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&ms| ms > 0)
}

/// The writing half of a streaming response.
#[derive(Clone)]
pub struct Sink {
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
}

impl Sink {
    /// False once the client is gone.
    pub async fn send<T: Serialize>(&self, msg: &T) -> bool {
        self.tx.send(Ok(message_frame(msg))).await.is_ok()
    }

    pub async fn end(self, err: Option<RpcError>) {
        let _ = self.tx.send(Ok(end_frame(err.as_ref()))).await;
    }

    /// Cuts the response short, with no end envelope, as E2B's proxy does when a sandbox goes
    /// away under a request: both SDKs take a stream that breaks off (not one that ends with
    /// an error) as the sign to ask the sandbox's health, and then report it gone.
    pub async fn sever(self) {
        let _ = self.tx.send(Err(sandbox_went_away())).await;
    }

    /// Resolves when the client went away.
    pub async fn closed(&self) {
        self.tx.closed().await
    }
}

/// What breaks off a streamed answer whose sandbox went away under it (see [`Sink::sever`]).
pub(crate) fn sandbox_went_away() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "the sandbox went away",
    )
}

/// A 200 `application/connect+json` response fed by the returned sink; every envelope is
/// flushed as its own chunk.
pub fn stream_response() -> (Sink, Response) {
    let (tx, rx) = mpsc::channel(32);
    let body =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
    let resp = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, STREAM_CONTENT_TYPE)
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
    (Sink { tx }, resp)
}

/// A streaming call that failed before its first message: 200 with only the end envelope.
/// The request body may be left unread, so the connection is not reused.
pub fn stream_error(err: RpcError) -> Response {
    let mut resp = (
        StatusCode::OK,
        [(header::CONTENT_TYPE, STREAM_CONTENT_TYPE)],
        end_frame(Some(&err)),
    )
        .into_response();
    crate::error::close_connection(&mut resp);
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(flags: u8, len: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![flags];
        v.extend_from_slice(&len.to_be_bytes());
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn envelopes_round_trip_across_arbitrary_chunking() {
        let mut wire = envelope(0, br#"{"a":1}"#).to_vec();
        wire.extend_from_slice(&envelope(0, b"{}"));
        for split in 0..=wire.len() {
            let mut d = EnvelopeDecoder::default();
            let mut got = Vec::new();
            for part in [&wire[..split], &wire[split..]] {
                d.push(part).unwrap();
                while let Some(p) = d.next_payload().unwrap() {
                    got.push(p);
                }
            }
            d.finish().unwrap();
            assert_eq!(
                got,
                vec![Bytes::from_static(br#"{"a":1}"#), Bytes::from_static(b"{}")]
            );
        }
    }

    #[test]
    fn end_frame_shapes() {
        let ok = end_frame(None);
        assert_eq!(ok[0], FLAG_END_STREAM);
        assert_eq!(u32::from_be_bytes([ok[1], ok[2], ok[3], ok[4]]), 2);
        assert_eq!(&ok[5..], b"{}");
        let err = end_frame(Some(&RpcError::new(Code::NotFound, "no process 7")));
        let body: Value = serde_json::from_slice(&err[5..]).unwrap();
        assert_eq!(
            body,
            json!({"error": {"code": "not_found", "message": "no process 7"}})
        );
        assert_eq!(
            u32::from_be_bytes([err[1], err[2], err[3], err[4]]) as usize,
            err.len() - 5
        );
    }

    #[test]
    fn truncated_envelopes_are_errors_at_the_end_of_the_body() {
        for wire in [frame(0, 10, b"{}"), vec![0, 0, 0], frame(0, 2, b"{")] {
            let mut d = EnvelopeDecoder::default();
            d.push(&wire).unwrap();
            assert_eq!(d.next_payload().unwrap(), None);
            let e = d.finish().unwrap_err();
            assert_eq!(e.code, Code::InvalidArgument, "{wire:?}");
        }
    }

    #[test]
    fn huge_declared_lengths_are_refused_on_the_header() {
        let mut d = EnvelopeDecoder::default();
        let e = d.push(&[0, 0xff, 0xff, 0xff, 0xff]).unwrap_err();
        assert_eq!(e.code, Code::ResourceExhausted);
        let mut d = EnvelopeDecoder::default();
        let just_over = (MAX_MESSAGE_BYTES as u32 + 1).to_be_bytes();
        assert!(d.push(&[0]).is_ok());
        assert_eq!(
            d.push(&just_over).unwrap_err().code,
            Code::ResourceExhausted
        );
        let mut d = EnvelopeDecoder::default();
        assert!(d.push(&(MAX_MESSAGE_BYTES as u32).to_be_bytes()).is_ok());
    }

    #[test]
    fn compressed_and_unknown_flags_are_refused() {
        let mut d = EnvelopeDecoder::default();
        assert_eq!(
            d.push(&frame(FLAG_COMPRESSED, 2, b"{}")).unwrap_err().code,
            Code::Unimplemented
        );
        for flags in [FLAG_END_STREAM, 0x80, 0x04] {
            let mut d = EnvelopeDecoder::default();
            assert_eq!(
                d.push(&frame(flags, 2, b"{}")).unwrap_err().code,
                Code::InvalidArgument
            );
        }
    }

    #[test]
    fn content_types() {
        let mut h = HeaderMap::new();
        let set = |h: &mut HeaderMap, v: &'static str| {
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(v));
        };
        set(&mut h, "application/json");
        assert!(check_content_type(&h, false).is_ok());
        set(&mut h, "application/json; charset=utf-8");
        assert!(check_content_type(&h, false).is_ok());
        assert!(check_content_type(&h, true).is_err());
        set(&mut h, "application/connect+json");
        assert!(check_content_type(&h, true).is_ok());
        assert!(check_content_type(&h, false).is_err());
        for wrong in [
            "application/proto",
            "application/connect+proto",
            "text/plain",
        ] {
            set(&mut h, wrong);
            assert!(check_content_type(&h, true).is_err(), "{wrong}");
            assert!(check_content_type(&h, false).is_err(), "{wrong}");
        }
        h.remove(header::CONTENT_TYPE);
        assert!(check_content_type(&h, false).is_err());
    }

    #[test]
    fn error_codes_map_to_connect_statuses() {
        assert_eq!(Code::NotFound.http_status(), StatusCode::NOT_FOUND);
        assert_eq!(Code::AlreadyExists.http_status(), StatusCode::CONFLICT);
        assert_eq!(
            Code::Unauthenticated.http_status(),
            StatusCode::UNAUTHORIZED
        );
        let e: RpcError = koder_sessions::Error::FileNotFound("x".into()).into();
        assert_eq!(e.code, Code::NotFound);
        let e: RpcError = koder_sessions::Error::FsQuotaExceeded("full".into()).into();
        assert_eq!(e.code, Code::ResourceExhausted);
        assert_eq!(
            RpcError::new(Code::NotFound, "gone").to_json(),
            json!({"code": "not_found", "message": "gone"})
        );
    }

    #[tokio::test]
    async fn message_stream_reads_messages_and_rejects_bad_json() {
        let chunks: Vec<Result<Bytes, axum::Error>> =
            vec![Ok(envelope(0, br#"{"x":1}"#)), Ok(envelope(0, b"not json"))];
        let mut s = MessageStream::from_stream(futures::stream::iter(chunks));
        let first: Value = s.next().await.unwrap().unwrap();
        assert_eq!(first, json!({"x": 1}));
        assert_eq!(
            s.next::<Value>().await.unwrap_err().code,
            Code::InvalidArgument
        );
        let two = vec![Ok(envelope(0, b"{}")), Ok(envelope(0, b"{}"))];
        let s = MessageStream::from_stream(futures::stream::iter(two));
        assert!(s.single::<Value>().await.is_err());
        let none: Vec<Result<Bytes, axum::Error>> = vec![];
        let s = MessageStream::from_stream(futures::stream::iter(none));
        assert!(s.single::<Value>().await.is_err());
    }
}
