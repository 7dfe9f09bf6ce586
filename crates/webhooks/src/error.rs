use koder_store::StoreError;

/// The typed code of a webhook URL the SSRF guard refuses (400).
pub const URL_REFUSED: &str = "SANDBOX-WEBHOOK-URL-REFUSED";

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// A malformed request (bad URL syntax, unknown event type, short secret).
    #[error("{0}")]
    Invalid(String),
    /// The URL's addresses are ones the SSRF guard refuses ([`URL_REFUSED`]).
    #[error("{0}")]
    UrlRefused(String),
    /// No such endpoint of this tenant (another tenant's looks the same).
    #[error("webhook not found")]
    NotFound,
    /// The tenant has as many endpoints as allowed.
    #[error("{0}")]
    Limit(String),
    #[error("state store: {0}")]
    Store(#[from] StoreError),
}
