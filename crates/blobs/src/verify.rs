//! The read side: a stream that passes the object through and fails at the end unless it
//! was exactly what was put.

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use sha2::{Digest, Sha256};

use crate::{BlobError, BlobInfo};

struct Check {
    inner: BoxStream<'static, object_store::Result<Bytes>>,
    hasher: Sha256,
    size: u64,
    expected: BlobInfo,
}

impl Check {
    fn mismatch(&self, actual_sha256: Option<String>) -> BlobError {
        BlobError::Checksum {
            expected: self.expected.clone(),
            actual_size: self.size,
            actual_sha256,
        }
    }

    /// The next item, and whether the stream goes on after it.
    async fn step(&mut self) -> Option<(Result<Bytes, BlobError>, bool)> {
        match self.inner.next().await {
            Some(Ok(chunk)) => {
                self.size += chunk.len() as u64;
                if self.size > self.expected.size {
                    // Longer than it should be: no need to read the rest to know.
                    return Some((Err(self.mismatch(None)), false));
                }
                self.hasher.update(&chunk);
                Some((Ok(chunk), true))
            }
            Some(Err(e)) => Some((Err(e.into()), false)),
            None => {
                let sha = hex::encode(std::mem::take(&mut self.hasher).finalize());
                if self.size == self.expected.size
                    && sha.eq_ignore_ascii_case(&self.expected.sha256)
                {
                    None
                } else {
                    Some((Err(self.mismatch(Some(sha))), false))
                }
            }
        }
    }
}

pub(crate) fn verified(
    inner: BoxStream<'static, object_store::Result<Bytes>>,
    expected: BlobInfo,
) -> impl Stream<Item = Result<Bytes, BlobError>> + Send + 'static {
    let check = Check {
        inner,
        hasher: Sha256::new(),
        size: 0,
        expected,
    };
    futures::stream::unfold(Some(check), |check| async move {
        let mut check = check?;
        let (item, more) = check.step().await?;
        Some((item, more.then_some(check)))
    })
}
