//! What a command can fail with; `main` prints it (an SDK error with its SANDBOX code).

pub type Result<T, E = CliError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Sdk(#[from] koder_sdk::Error),
    /// Local I/O, with what was being done.
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Message(String),
}

impl CliError {
    pub fn msg(text: impl Into<String>) -> Self {
        CliError::Message(text.into())
    }
}

impl From<std::io::Error> for CliError {
    fn from(source: std::io::Error) -> Self {
        CliError::Io {
            what: "I/O".into(),
            source,
        }
    }
}

impl From<serde_json::Error> for CliError {
    fn from(e: serde_json::Error) -> Self {
        CliError::Message(format!("encoding JSON: {e}"))
    }
}

/// Adds what was being done to a local I/O error.
pub trait IoContext<T> {
    fn doing(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for std::result::Result<T, std::io::Error> {
    fn doing(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| CliError::Io {
            what: what(),
            source,
        })
    }
}
