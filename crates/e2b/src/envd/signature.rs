//! Signed file URLs (the SDK's `download_url` / `upload_url`): `/files?path&username&signature
//! [&signature_expiration]`, where the signature is `v1_` + unpadded base64 of
//! sha256(`path:operation:user:token[:expiration]`) over the sandbox's envd access token. A URL
//! like this is meant to be handed to a plain HTTP client, so it proves the right to one file
//! operation by itself; and when the SDK points at one sandbox URL (`E2B_SANDBOX_URL`) it also
//! carries no sandbox id, so the sandbox is the one whose token made the signature.

use std::collections::HashMap;

use axum::extract::Query;
use axum::http::{Method, Uri};
use base64::Engine as _;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::HttpError;

/// The claim a signed `/files` request makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SignedFileUrl {
    path: String,
    operation: &'static str,
    user: String,
    signature: String,
    expiration: Option<i64>,
}

impl SignedFileUrl {
    /// The signed claim of a request, `None` when it is not a signed `/files` request.
    pub(crate) fn of(method: &Method, uri: &Uri) -> Option<Result<Self, HttpError>> {
        if uri.path() != "/files" {
            return None;
        }
        let operation = match *method {
            Method::GET | Method::HEAD => "read",
            Method::POST => "write",
            _ => return None,
        };
        let query = match Query::<HashMap<String, String>>::try_from_uri(uri) {
            Ok(Query(q)) => q,
            Err(e) => return Some(Err(HttpError::bad_request(e.body_text()))),
        };
        let signature = query.get("signature")?.clone();
        let expiration = match query.get("signature_expiration") {
            None => None,
            Some(e) => match e.parse::<i64>() {
                Ok(e) => Some(e),
                Err(_) => {
                    return Some(Err(HttpError::bad_request(
                        "signature_expiration must be a Unix time in seconds",
                    )))
                }
            },
        };
        Some(Ok(Self {
            path: query.get("path").cloned().unwrap_or_default(),
            operation,
            user: query.get("username").cloned().unwrap_or_default(),
            signature,
            expiration,
        }))
    }

    /// Whether `token` made this signature (in constant time).
    pub(crate) fn signed_with(&self, token: &str) -> bool {
        let mut raw = format!("{}:{}:{}:{token}", self.path, self.operation, self.user);
        if let Some(e) = self.expiration {
            raw.push_str(&format!(":{e}"));
        }
        let digest = Sha256::digest(raw.as_bytes());
        let expected = format!(
            "v1_{}",
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
        );
        bool::from(expected.as_bytes().ct_eq(self.signature.as_bytes()))
    }

    /// A valid signature that has expired is refused with E2B's own words.
    pub(crate) fn check_unexpired(&self, now_unix: i64) -> Result<(), HttpError> {
        match self.expiration {
            Some(e) if e < now_unix => Err(HttpError::unauthorized("signature is already expired")),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(uri: &str, method: Method) -> SignedFileUrl {
        let uri: Uri = uri.parse().unwrap();
        SignedFileUrl::of(&method, &uri).unwrap().unwrap()
    }

    // The SDK's `get_signature` over `raw`, quoted for a query as the SDK quotes it.
    fn sdk_signature(raw: &str) -> String {
        let d = Sha256::digest(raw.as_bytes());
        let sig = base64::engine::general_purpose::STANDARD_NO_PAD.encode(d);
        format!("v1_{}", sig.replace('+', "%2B"))
    }

    #[test]
    fn a_download_signature_is_checked_against_the_token() {
        let sig = sdk_signature("a b.txt:read:user:tok");
        let c = claim(
            &format!("/files?path=a%20b.txt&username=user&signature={sig}"),
            Method::GET,
        );
        assert!(c.signed_with("tok"));
        assert!(!c.signed_with("other"));
        // The same signature does not allow an upload.
        let up = claim(
            &format!("/files?path=a%20b.txt&username=user&signature={sig}"),
            Method::POST,
        );
        assert!(!up.signed_with("tok"));
    }

    #[test]
    fn the_expiration_is_signed_and_enforced() {
        let sig = sdk_signature("f:write::tok:100");
        let c = claim(
            &format!("/files?path=f&signature={sig}&signature_expiration=100"),
            Method::POST,
        );
        assert!(c.signed_with("tok"));
        assert!(c.check_unexpired(99).is_ok());
        let e = c.check_unexpired(101).unwrap_err();
        assert_eq!(e.status, 401);
        assert_eq!(e.message, "signature is already expired");
        // Moving the expiration breaks the signature.
        let moved = claim(
            &format!("/files?path=f&signature={sig}&signature_expiration=999"),
            Method::POST,
        );
        assert!(!moved.signed_with("tok"));
    }

    #[test]
    fn unsigned_or_other_requests_are_not_claims() {
        let get = Method::GET;
        assert!(SignedFileUrl::of(&get, &"/files?path=x".parse().unwrap()).is_none());
        assert!(SignedFileUrl::of(&get, &"/health?signature=x".parse().unwrap()).is_none());
        assert!(
            SignedFileUrl::of(&Method::DELETE, &"/files?signature=x".parse().unwrap()).is_none()
        );
        let bad = SignedFileUrl::of(
            &get,
            &"/files?signature=x&signature_expiration=soon"
                .parse()
                .unwrap(),
        );
        assert_eq!(bad.unwrap().unwrap_err().status, 400);
    }
}
