//! The control plane's authentication and admission: E2B API keys (`X-API-KEY`, or a bearer
//! token) are the daemon's credentials, static keys or JWTs alike; every request is checked
//! against the token's scopes and counted against the tenant's rate, as on the native API.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method};
use koder_auth::{Identity, Principal, Scope};
use koder_http::credentials;

use crate::error::HttpError;
use crate::state::E2b;

/// The caller's tenant, admitted: reading needs `sandbox:read`, anything else `sandbox:write`.
pub struct ApiCaller(pub Identity);

impl FromRequestParts<E2b> for ApiCaller {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, e2b: &E2b) -> Result<Self, HttpError> {
        let principal = authenticate(e2b, &parts.headers).await?;
        let needed = if matches!(parts.method, Method::GET | Method::HEAD) {
            Scope::Read
        } else {
            Scope::Write
        };
        principal.require(needed)?;
        e2b.app()
            .limits
            .check_request(&principal.identity.tenant_id)?;
        Ok(ApiCaller(principal.identity))
    }
}

/// The caller of `X-API-KEY` (a bare token) or, without one, `Authorization: Bearer`; a
/// token that fails is 401 whichever header carried it.
pub(crate) async fn authenticate(e2b: &E2b, headers: &HeaderMap) -> Result<Principal, HttpError> {
    let auth = &e2b.app().auth;
    if let Some(key) = headers.get(credentials::API_KEY) {
        let key = key
            .to_str()
            .map_err(|_| HttpError::unauthorized("malformed X-API-KEY"))?;
        return Ok(auth.authenticate(key.trim()).await?);
    }
    let bearer = headers
        .get(credentials::AUTHORIZATION)
        .ok_or_else(|| HttpError::unauthorized("missing X-API-KEY"))?
        .to_str()
        .map_err(|_| HttpError::unauthorized("malformed Authorization header"))?;
    Ok(auth.authenticate_header(bearer).await?)
}
