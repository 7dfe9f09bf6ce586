//! The control plane's authentication: E2B API keys (`X-API-KEY`) are the daemon's keys.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::HeaderValue;
use koder_auth::Identity;
use koder_http::credentials;

use crate::error::HttpError;
use crate::state::E2b;

/// The caller's tenant, from `X-API-KEY` (or a bearer key).
pub struct ApiCaller(pub Identity);

impl FromRequestParts<E2b> for ApiCaller {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, e2b: &E2b) -> Result<Self, HttpError> {
        if let Some(key) = parts.headers.get(credentials::API_KEY) {
            return verify_api_key(e2b, key).map(ApiCaller);
        }
        let bearer = parts
            .headers
            .get(credentials::AUTHORIZATION)
            .ok_or_else(|| HttpError::unauthorized("missing X-API-KEY"))?;
        let keys = e2b.app().keys.read();
        bearer
            .to_str()
            .ok()
            .and_then(|h| keys.authenticate(h))
            .map(ApiCaller)
            .ok_or_else(|| HttpError::unauthorized("invalid API key"))
    }
}

/// The tenant of an `X-API-KEY` value; an unknown key is 401.
pub(crate) fn verify_api_key(e2b: &E2b, key: &HeaderValue) -> Result<Identity, HttpError> {
    let keys = e2b.app().keys.read();
    key.to_str()
        .ok()
        .and_then(|k| keys.verify_key(k.trim()))
        .ok_or_else(|| HttpError::unauthorized("invalid API key"))
}
