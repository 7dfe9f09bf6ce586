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
    /// An admin call refused for its key (or one not sent for want of a key).
    #[error("{}\n{ADMIN_KEY_HELP}", .0.as_ref().map_or_else(|| "no admin key given".to_string(), ToString::to_string))]
    AdminKey(Option<koder_sdk::Error>),
}

/// Where admin keys come from; said whenever an admin command lacks one.
pub const ADMIN_KEY_HELP: &str = concat!(
    "  admin commands need an operator key, not a tenant's API key: one of the daemon's admin\n",
    "  keys (`admin_keys` in the `[auth]` section of its config file, or\n",
    "  `koder-sandbox serve --admin-key KEY`, at least 16 characters), given here as\n",
    "  --api-key KEY or in KSANDBOX_ADMIN_KEY."
);

/// Says which daemon could not be reached and how to start one.
pub fn daemon_down_message(url: &str, cause: &str) -> String {
    format!(
        "cannot reach the daemon at {url}: {cause}\n  \
         Is it running? Start it with `scripts/serve.sh` in the koder-sandbox repository, or \
         `koder-sandbox serve` (also `ksandbox serve`);\n  \
         or point at a running daemon with --url URL or KSANDBOX_URL."
    )
}

impl CliError {
    /// An admin call's error, with where admin keys come from when the key was the problem.
    pub fn admin(err: koder_sdk::Error) -> Self {
        match err.status() {
            Some(401 | 403) => CliError::AdminKey(Some(err)),
            _ => CliError::Sdk(err),
        }
    }

    /// The daemon-down message when the error is a refused or failed connection.
    pub fn unreachable_daemon(&self) -> Option<String> {
        let e = match self {
            CliError::Sdk(koder_sdk::Error::Transport(e)) => e,
            CliError::Sdk(koder_sdk::Error::Connect { url, source }) => {
                return Some(daemon_down_message(url, &source.to_string()));
            }
            _ => return None,
        };
        if !e.is_connect() {
            return None;
        }
        let url = e.url().map_or_else(String::new, |u| {
            let mut u = u.clone();
            u.set_query(None);
            u.to_string()
        });
        // The innermost cause says what happened ("Connection refused (os error 111)").
        let mut cause: &dyn std::error::Error = e;
        while let Some(inner) = cause.source() {
            cause = inner;
        }
        Some(daemon_down_message(&url, &cause.to_string()))
    }
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
