use koder_api_types::ErrorCode;

use crate::BlobInfo;

#[derive(thiserror::Error, Debug)]
pub enum BlobError {
    /// A tenant or key outside the allowed alphabet, length or segment rules.
    #[error("invalid blob name: {0}")]
    InvalidKey(String),
    #[error("blob not found")]
    NotFound,
    /// The stored object is not what was put: corruption, truncation or a foreign write.
    #[error(
        "blob content does not match: expected {} bytes with sha256 {}, read {actual_size} bytes{}",
        expected.size,
        expected.sha256,
        actual_sha256.as_ref().map(|s| format!(" with sha256 {s}")).unwrap_or_default()
    )]
    Checksum {
        expected: BlobInfo,
        actual_size: u64,
        /// `None` when the size alone already disagreed.
        actual_sha256: Option<String>,
    },
    #[error("blob store configuration: {0}")]
    Config(String),
    #[error("blob store: {0}")]
    Store(#[source] object_store::Error),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl BlobError {
    pub fn code(&self) -> ErrorCode {
        match self {
            BlobError::InvalidKey(_) => ErrorCode::InvalidArgument,
            BlobError::NotFound => ErrorCode::NotFound,
            // A stored snapshot that fails its checksum is a server-side integrity fault, not
            // something the caller can fix; api-types has no dedicated code for it.
            BlobError::Checksum { .. }
            | BlobError::Config(_)
            | BlobError::Store(_)
            | BlobError::Io { .. } => ErrorCode::Internal,
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        BlobError::Io {
            context: context.into(),
            source,
        }
    }
}

impl From<object_store::Error> for BlobError {
    fn from(e: object_store::Error) -> Self {
        match e {
            object_store::Error::NotFound { .. } => BlobError::NotFound,
            e => BlobError::Store(e),
        }
    }
}
