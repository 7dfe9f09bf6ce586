use koder_api_types::ErrorCode;
use koder_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// A malformed request (bad URL syntax, unknown event type, short secret).
    #[error("{0}")]
    Invalid(String),
    /// The URL's addresses are ones the SSRF guard refuses ([`ErrorCode::WebhookUrlRefused`]).
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

impl WebhookError {
    /// The API error code every transport answers with.
    pub fn code(&self) -> ErrorCode {
        match self {
            WebhookError::Invalid(_) => ErrorCode::InvalidArgument,
            WebhookError::UrlRefused(_) => ErrorCode::WebhookUrlRefused,
            WebhookError::NotFound => ErrorCode::NotFound,
            WebhookError::Limit(_) => ErrorCode::Conflict,
            WebhookError::Store(_) => ErrorCode::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_carries_its_api_code() {
        let cases = [
            (
                WebhookError::Invalid("x".into()),
                "SANDBOX-INVALID-ARGUMENT",
            ),
            (
                WebhookError::UrlRefused("x".into()),
                "SANDBOX-WEBHOOK-URL-REFUSED",
            ),
            (WebhookError::NotFound, "SANDBOX-NOT-FOUND"),
            (WebhookError::Limit("x".into()), "SANDBOX-CONFLICT"),
        ];
        for (e, code) in cases {
            assert_eq!(e.code().as_str(), code, "{e}");
        }
    }
}
