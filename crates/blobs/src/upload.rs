//! Streaming a body into a multipart upload with bounded memory, hashing as it goes.

use bytes::Bytes;
use futures::{Stream, StreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, WriteMultipart};
use sha2::{Digest, Sha256};

use crate::{BlobError, BlobInfo};

/// S3 wants parts of at least 5 MiB (all but the last); larger parts mean fewer requests.
const PART_SIZE: usize = 8 << 20;
/// Parts uploading at once. With the part being filled, at most
/// `(PARTS_IN_FLIGHT + 1) * PART_SIZE` bytes of one upload are in memory.
const PARTS_IN_FLIGHT: usize = 2;

/// Owns the upload until it is finished. Dropped before that (the caller's future was
/// cancelled), it aborts the upload in the background, so neither a half object nor, on S3,
/// orphaned parts stay behind.
struct Upload(Option<WriteMultipart>);

impl Upload {
    fn live(&mut self) -> Result<&mut WriteMultipart, BlobError> {
        self.0.as_mut().ok_or_else(closed)
    }

    async fn put(&mut self, chunk: Bytes) -> Result<(), BlobError> {
        let w = self.live()?;
        w.wait_for_capacity(PARTS_IN_FLIGHT).await?;
        w.put(chunk);
        Ok(())
    }

    async fn finish(mut self) -> Result<(), BlobError> {
        let w = self.0.take().ok_or_else(closed)?;
        w.finish().await?;
        Ok(())
    }

    async fn abort(mut self) {
        if let Some(w) = self.0.take() {
            if let Err(e) = w.abort().await {
                tracing::warn!(error = %e, "aborting a failed blob upload");
            }
        }
    }
}

fn closed() -> BlobError {
    BlobError::Store(object_store::Error::Generic {
        store: "koder-blobs",
        source: "upload already closed".into(),
    })
}

impl Drop for Upload {
    fn drop(&mut self) {
        let Some(w) = self.0.take() else { return };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn(async move {
                if let Err(e) = w.abort().await {
                    tracing::warn!(error = %e, "aborting a cancelled blob upload");
                }
            })),
            // No runtime to abort on: a local staging file still goes with the upload's own
            // drop; S3 parts are left to `sweep_incomplete`'s documented lifecycle rule.
            Err(_) => drop(w),
        }
    }
}

/// Uploads `body` to `path`; the object appears only when complete.
pub(crate) async fn upload(
    store: &dyn ObjectStore,
    path: &Path,
    body: impl Stream<Item = Result<Bytes, std::io::Error>> + Send,
) -> Result<BlobInfo, BlobError> {
    let mut up = Upload(Some(WriteMultipart::new_with_chunk_size(
        store.put_multipart(path).await?,
        PART_SIZE,
    )));
    match feed(&mut up, body).await {
        Ok(info) => {
            up.finish().await?;
            Ok(info)
        }
        Err(e) => {
            up.abort().await;
            Err(e)
        }
    }
}

async fn feed(
    up: &mut Upload,
    body: impl Stream<Item = Result<Bytes, std::io::Error>> + Send,
) -> Result<BlobInfo, BlobError> {
    let mut body = std::pin::pin!(body);
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| BlobError::io("reading the blob body", e))?;
        hasher.update(&chunk);
        size += chunk.len() as u64;
        up.put(chunk).await?;
    }
    Ok(BlobInfo {
        size,
        sha256: hex::encode(hasher.finalize()),
    })
}
