//! envd's `/files`: downloads (optionally gzip-encoded) and uploads as multipart (one file per
//! part, the part's filename its path) or as a raw octet stream (optionally gzip-encoded),
//! streamed through the manager without holding a whole file.

use std::collections::HashMap;
use std::io::Write as _;

use axum::body::Body;
use axum::extract::Query;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use flate2::write::{GzDecoder, GzEncoder};
use futures::{Stream, StreamExt};
use serde_json::{json, Value};

use super::auth::Target;
use super::user::split_parent;
use crate::connect::{Code, RpcError};
use crate::error::HttpError;

type Params = Query<HashMap<String, String>>;

/// envd's file errors: a missing file 404, a directory or bad path 400, a full disk 507.
fn http_error(e: koder_sessions::Error) -> HttpError {
    match e {
        koder_sessions::Error::Conflict(m) => HttpError::bad_request(m),
        other => other.into(),
    }
}

impl From<RpcError> for HttpError {
    fn from(e: RpcError) -> Self {
        let status = match e.code {
            Code::NotFound => 404,
            Code::InvalidArgument | Code::FailedPrecondition => 400,
            Code::Unauthenticated => 401,
            Code::PermissionDenied => 403,
            Code::AlreadyExists => 409,
            Code::ResourceExhausted => 507,
            Code::Unavailable => 503,
            _ => 500,
        };
        HttpError::new(status, e.message)
    }
}

fn path_param(t: &Target, q: &Params) -> Result<String, HttpError> {
    match q.get("path").map(String::as_str) {
        None | Some("") => Err(HttpError::bad_request(
            "the path query parameter is required",
        )),
        Some(p) => Ok(t.user.resolve(p)),
    }
}

pub async fn download(t: Target, q: Params, headers: HeaderMap) -> Result<Response, HttpError> {
    let path = path_param(&t, &q)?;
    let reader = t
        .e2b
        .manager()
        .download(&t.who, &t.id, &path)
        .await
        .map_err(http_error)?;
    let gzip = headers
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|e| e.trim().starts_with("gzip")));
    let chunks = futures::stream::unfold(reader, |mut r| async move {
        match r.next_chunk().await {
            Ok(Some(chunk)) => Some((Ok(Bytes::from(chunk)), r)),
            Ok(None) => None,
            // The status line is gone already: a broken body tells the client the transfer
            // failed, rather than a silently short file.
            Err(e) => Some((Err(std::io::Error::other(e.to_string())), r)),
        }
    });
    let name = split_parent(&path).map_or("", |(_, n)| n);
    let disposition = format!("attachment; filename={}", urlencode(name));
    let mut resp = if gzip {
        Body::from_stream(gzip_stream(chunks)).into_response()
    } else {
        Body::from_stream(chunks).into_response()
    };
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/octet-stream"),
    );
    if let Ok(v) = header::HeaderValue::from_str(&disposition) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    if gzip {
        h.insert(
            header::CONTENT_ENCODING,
            header::HeaderValue::from_static("gzip"),
        );
    }
    Ok(resp)
}

/// Everything but RFC 3986's unreserved characters (`~` aside, as the SDK's own encoder).
const FILENAME_ESCAPED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.');

fn urlencode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, FILENAME_ESCAPED).to_string()
}

/// Compresses a body stream chunk by chunk, each chunk flushed so the client sees progress.
fn gzip_stream<S>(inner: S) -> impl Stream<Item = Result<Bytes, std::io::Error>>
where
    S: Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
{
    let enc = Some(GzEncoder::new(Vec::new(), flate2::Compression::fast()));
    futures::stream::unfold((inner.boxed(), enc), |(mut inner, enc)| async move {
        let mut enc = enc?;
        match inner.next().await {
            Some(Ok(chunk)) => {
                let out = enc
                    .write_all(&chunk)
                    .and_then(|()| enc.flush())
                    .map(|()| Bytes::from(std::mem::take(enc.get_mut())));
                Some((out, (inner, Some(enc))))
            }
            Some(Err(e)) => Some((Err(e), (inner, None))),
            None => Some((enc.finish().map(Bytes::from), (inner, None))),
        }
    })
}

/// Compressed input fed to the decoder at a time: deflate expands at most ~1032:1, so one
/// step's output stays near 1 MiB however hostile the body (a whole received chunk could
/// otherwise inflate to hundreds of MiB at once).
const GUNZIP_STEP: usize = 1024;

/// Decompresses an upload stream in bounded steps; a corrupt or truncated gzip body fails the
/// upload (which then leaves nothing behind).
fn gunzip_stream<S, E>(inner: S) -> impl Stream<Item = Result<Bytes, String>> + Unpin + Send
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: std::fmt::Display,
{
    struct State<I> {
        inner: I,
        dec: GzDecoder<Vec<u8>>,
        pending: Bytes,
    }
    let start = State {
        inner: inner.boxed(),
        dec: GzDecoder::new(Vec::new()),
        pending: Bytes::new(),
    };
    Box::pin(futures::stream::unfold(Some(start), |st| async move {
        let mut st = st?;
        if st.pending.is_empty() {
            match st.inner.next().await {
                Some(Ok(chunk)) => st.pending = chunk,
                Some(Err(e)) => return Some((Err(e.to_string()), None)),
                None => {
                    let out = st
                        .dec
                        .try_finish()
                        .map(|()| Bytes::from(std::mem::take(st.dec.get_mut())))
                        .map_err(|e| format!("gzip body: {e}"));
                    return Some((out, None));
                }
            }
        }
        let step = st.pending.split_to(st.pending.len().min(GUNZIP_STEP));
        match st.dec.write_all(&step) {
            Ok(()) => {
                let out = Bytes::from(std::mem::take(st.dec.get_mut()));
                Some((Ok(out), Some(st)))
            }
            Err(e) => Some((Err(format!("gzip body: {e}")), None)),
        }
    }))
}

pub async fn upload(
    t: Target,
    q: Params,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::Json<Vec<Value>>, HttpError> {
    let metadata = metadata_headers(&headers)?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let gzip = match headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
    {
        None | Some("identity") => false,
        Some(e) if e.eq_ignore_ascii_case("gzip") => true,
        Some(other) => {
            return Err(HttpError::bad_request(format!(
                "Content-Encoding {other:?} is not supported; use gzip or none"
            )))
        }
    };
    if content_type.starts_with("multipart/form-data") {
        if gzip {
            return Err(HttpError::bad_request(
                "gzip applies to octet-stream uploads, not multipart",
            ));
        }
        let boundary = multer::parse_boundary(content_type)
            .map_err(|e| HttpError::bad_request(format!("multipart: {e}")))?;
        return upload_multipart(t, q, boundary, body, &metadata)
            .await
            .map(axum::Json);
    }
    let path = path_param(&t, &q)?;
    let declared = if gzip {
        None
    } else {
        koder_http::declared_length(&headers)
    };
    let stream = body.into_data_stream();
    let entry = if gzip {
        store(&t, &path, declared, gunzip_stream(stream), &metadata).await?
    } else {
        store(&t, &path, declared, stream, &metadata).await?
    };
    Ok(axum::Json(vec![entry]))
}

/// Each `file` part is one file: the `path` parameter names the first, the part's filename
/// (relative to the user's home when not absolute) every other.
async fn upload_multipart(
    t: Target,
    q: Params,
    boundary: String,
    body: Body,
    metadata: &[(String, String)],
) -> Result<Vec<Value>, HttpError> {
    let mut parts = multer::Multipart::new(body.into_data_stream(), boundary);
    let mut path_param = q.get("path").filter(|p| !p.is_empty()).cloned();
    let mut written = Vec::new();
    while let Some(field) = parts
        .next_field()
        .await
        .map_err(|e| HttpError::bad_request(format!("multipart: {e}")))?
    {
        if field.name() != Some("file") {
            continue;
        }
        let target = match (path_param.take(), field.file_name()) {
            (Some(p), _) => p,
            (None, Some(name)) if !name.is_empty() => name.to_string(),
            _ => {
                return Err(HttpError::bad_request(
                    "a multipart file part needs a filename (its path in the sandbox)",
                ))
            }
        };
        let path = t.user.resolve(&target);
        written.push(store(&t, &path, None, Box::pin(field), metadata).await?);
    }
    if written.is_empty() {
        return Err(HttpError::bad_request(
            "the multipart body holds no file part",
        ));
    }
    Ok(written)
}

async fn store<S, E>(
    t: &Target,
    path: &str,
    declared: Option<u64>,
    body: S,
    metadata: &[(String, String)],
) -> Result<Value, HttpError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let entry = t
        .e2b
        .manager()
        .upload_with_metadata(
            &t.who,
            &t.id,
            path,
            declared,
            body,
            Some(t.user.name()),
            metadata.to_vec(),
        )
        .await
        .map_err(http_error)?;
    let mut info = json!({"name": entry.name, "type": "file", "path": entry.path});
    if !entry.metadata.is_empty() {
        info["metadata"] = json!(entry.metadata);
    }
    Ok(info)
}

const METADATA_HEADER: &str = "x-metadata-";

/// The metadata an upload's `X-Metadata-<key>: <value>` headers carry, keys lowercased (header
/// names are), the first of a repeated header winning, as envd does. Every file the request
/// writes gets it; an upload without any leaves the file without metadata.
fn metadata_headers(headers: &HeaderMap) -> Result<Vec<(String, String)>, HttpError> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix(METADATA_HEADER) else {
            continue;
        };
        if pairs.iter().any(|(k, _)| k == key) {
            continue;
        }
        let value = value.to_str().map_err(|_| {
            HttpError::bad_request(format!(
                "the metadata value of {key:?} must be printable US-ASCII"
            ))
        })?;
        pairs.push((key.to_owned(), value.to_owned()));
    }
    // The manager checks the rest (keys, sizes) before anything is written.
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::read::GzDecoder as ReadDecoder;
    use std::io::Read;

    #[tokio::test]
    async fn gzip_round_trip_through_the_streams() {
        let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
            Ok(Bytes::from_static(b"hello ")),
            Ok(Bytes::from_static(b"world")),
        ];
        let zipped: Vec<u8> = gzip_stream(futures::stream::iter(chunks))
            .map(|c| c.unwrap())
            .collect::<Vec<_>>()
            .await
            .concat();
        let mut plain = String::new();
        ReadDecoder::new(&zipped[..])
            .read_to_string(&mut plain)
            .unwrap();
        assert_eq!(plain, "hello world");
        let split: Vec<Result<Bytes, String>> = zipped
            .chunks(3)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let back: Vec<u8> = gunzip_stream(futures::stream::iter(split))
            .map(|c| c.unwrap())
            .collect::<Vec<_>>()
            .await
            .concat();
        assert_eq!(back, b"hello world");
    }

    #[tokio::test]
    async fn a_gzip_bomb_inflates_in_bounded_steps() {
        let mut e = GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(&vec![0u8; 64 << 20]).unwrap();
        let bomb = e.finish().unwrap();
        assert!(bomb.len() < 128 << 10);
        let items: Vec<Result<Bytes, String>> = vec![Ok(Bytes::from(bomb))];
        let mut total = 0;
        let mut s = gunzip_stream(futures::stream::iter(items));
        while let Some(piece) = s.next().await {
            let piece = piece.unwrap();
            assert!(
                piece.len() <= 2 << 20,
                "one step gave {} bytes",
                piece.len()
            );
            total += piece.len();
        }
        assert_eq!(total, 64 << 20);
    }

    #[tokio::test]
    async fn corrupt_or_truncated_gzip_fails() {
        for body in [b"not gzip at all".to_vec(), {
            let mut e = GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(b"some data here").unwrap();
            let full = e.finish().unwrap();
            full[..full.len() - 6].to_vec()
        }] {
            let items: Vec<Result<Bytes, String>> = vec![Ok(Bytes::from(body))];
            let results: Vec<_> = gunzip_stream(futures::stream::iter(items)).collect().await;
            assert!(results.iter().any(|r| r.is_err()), "{results:?}");
        }
    }

    #[test]
    fn metadata_comes_from_x_metadata_headers() {
        let mut h = HeaderMap::new();
        h.insert("x-metadata-Author", "mish".parse().unwrap());
        h.append("x-metadata-author", "second".parse().unwrap());
        h.insert("x-metadata-purpose", "up load".parse().unwrap());
        h.insert("x-other", "ignored".parse().unwrap());
        let mut got = metadata_headers(&h).unwrap();
        got.sort();
        assert_eq!(
            got,
            [
                ("author".to_string(), "mish".to_string()),
                ("purpose".to_string(), "up load".to_string())
            ]
        );
        assert!(metadata_headers(&HeaderMap::new()).unwrap().is_empty());
        let mut h = HeaderMap::new();
        h.insert(
            "x-metadata-k",
            axum::http::HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
        );
        assert_eq!(metadata_headers(&h).unwrap_err().status.as_u16(), 400);
    }

    #[test]
    fn rpc_errors_become_file_errors() {
        let e: HttpError = RpcError::new(Code::NotFound, "x").into();
        assert_eq!(e.status.as_u16(), 404);
        let e: HttpError = RpcError::new(Code::ResourceExhausted, "full").into();
        assert_eq!(e.status.as_u16(), 507);
        assert_eq!(urlencode("a b/ü.txt"), "a%20b%2F%C3%BC.txt");
    }
}
