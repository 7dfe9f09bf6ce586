//! Request bodies nobody read to the end are read and dropped in the background.
//!
//! An upload refused mid-way (a full disk, a bad path, a foreign session) is answered at once.
//! Most HTTP clients send their whole body before they read an answer, and a server that stops
//! reading and closes leaves unread bytes in its socket, so the kernel resets the connection and
//! the client never sees the answer it was sent. So once a handler lets go of a body, the rest
//! is drained by a task of its own — bounded in bytes and time, so a client cannot hold one
//! forever — and the connection lives on. (Neither hyper nor tower-http offers this; hyper
//! only closes the connection.)

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::Router;
use futures::StreamExt;
use http_body::{Frame, SizeHint};

/// At most this much of an unread body is drained...
const DRAIN_BYTES: u64 = 1 << 30;
/// ...for at most this long; then the connection is dropped as before.
const DRAIN_FOR: Duration = Duration::from_secs(60);

/// `app` with every request body drained once its handler dropped it unread.
pub fn drain_unread_bodies(app: Router) -> Router {
    app.layer(axum::middleware::map_request(wrap))
}

async fn wrap(req: Request) -> Request {
    req.map(|inner| Body::new(DrainOnDrop { inner }))
}

struct DrainOnDrop {
    inner: Body,
}

impl HttpBody for DrainOnDrop {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for DrainOnDrop {
    fn drop(&mut self) {
        if self.inner.is_end_stream() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(drain(std::mem::take(&mut self.inner)));
        }
    }
}

async fn drain(body: Body) {
    let mut chunks = body.into_data_stream();
    let mut left = DRAIN_BYTES;
    let _ = tokio::time::timeout(DRAIN_FOR, async {
        while let Some(Ok(chunk)) = chunks.next().await {
            match left.checked_sub(chunk.len() as u64) {
                Some(rest) => left = rest,
                None => return,
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::put;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A raw HTTP/1.1 client that sends a whole large body before it reads anything, as most
    /// clients do, to a handler that answers without reading the body.
    #[tokio::test]
    async fn an_early_answer_reaches_a_client_that_sends_its_whole_body_first() {
        let app = drain_unread_bodies(Router::new().route(
            "/up",
            put(|| async { (axum::http::StatusCode::INSUFFICIENT_STORAGE, "full") }),
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let body = vec![7u8; 32 << 20];
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        for _ in 0..2 {
            let head = format!(
                "PUT /up HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            conn.write_all(head.as_bytes()).await.unwrap();
            conn.write_all(&body).await.unwrap();
            let mut answer = Vec::new();
            while !answer.ends_with(b"full") {
                let mut buf = [0u8; 1024];
                let n = conn.read(&mut buf).await.unwrap();
                assert!(
                    n > 0,
                    "connection closed: {:?}",
                    String::from_utf8_lossy(&answer)
                );
                answer.extend_from_slice(&buf[..n]);
            }
            assert!(answer.starts_with(b"HTTP/1.1 507"));
            // The same connection serves the next request.
        }
    }
}
