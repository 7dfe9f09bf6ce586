//! Request extractors whose every failure is a typed JSON error (axum's own rejections answer
//! in plain text).

use axum::extract::rejection::{BytesRejection, JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use koder_api_types::codes;
use koder_auth::{Credential, Identity, Scope};
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::gate::Admitted;
use crate::AppState;

/// The caller's tenant, as [`crate::gate`] admitted it (authenticated, in scope, within its
/// rates).
pub struct Caller(pub Identity);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &AppState) -> Result<Self, ApiError> {
        match parts.extensions.get::<Admitted>() {
            Some(Admitted(principal)) => Ok(Caller(principal.identity.clone())),
            // Every tenant route is behind the gate; a route that is not has a bug.
            None => Err(ApiError::new(
                500,
                codes::INTERNAL,
                "tenant route served without admission",
            )),
        }
    }
}

/// An operator: an admin key, or a JWT with `sandbox:admin`. A tenant's credentials here are
/// 403, anything else 401.
pub struct AdminCaller;

impl FromRequestParts<AppState> for AdminCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        if crate::gate::holds_admin_key(state, &parts.headers) {
            return Ok(AdminCaller);
        }
        let principal = crate::gate::authenticate(state, &parts.headers).await?;
        match principal.credential {
            Credential::Jwt => principal.require(Scope::Admin)?,
            Credential::ApiKey => {
                return Err(ApiError::new(
                    403,
                    codes::PERMISSION_DENIED,
                    "this endpoint needs an admin key",
                ))
            }
        }
        Ok(AdminCaller)
    }
}

/// JSON body with typed errors: malformed JSON, wrong field types and unknown fields are 400,
/// a missing JSON content type 415, an oversized body 413. Every request body of the API is an
/// object: anything else is 400, although serde would read a struct from an array.
pub struct Json<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let (parts, body) = req.into_parts();
        let bytes =
            axum::body::Bytes::from_request(Request::from_parts(parts.clone(), body), state)
                .await
                .map_err(body_rejection)?;
        let req = Request::from_parts(parts, axum::body::Body::from(bytes.clone()));
        match axum::Json::<T>::from_request(req, state).await {
            Ok(_) if bytes.trim_ascii_start().first() != Some(&b'{') => {
                Err(ApiError::invalid("the request body must be a JSON object"))
            }
            Ok(axum::Json(v)) => Ok(Json(v)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

/// A JSON body that may be left out: no body, or a JSON `null`, is `T::default()`. A body
/// that is there is held to [`Json`]'s rules.
pub struct OptionalJson<T>(pub T);

impl<T: DeserializeOwned + Default> FromRequest<AppState> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let (parts, body) = req.into_parts();
        let bytes = axum::body::to_bytes(body, crate::MAX_JSON_BODY)
            .await
            .map_err(|_| ApiError::new(413, codes::PAYLOAD_TOO_LARGE, "request body too large"))?;
        if bytes.is_empty() || bytes.trim_ascii() == b"null" {
            return Ok(OptionalJson(T::default()));
        }
        let req = Request::from_parts(parts, axum::body::Body::from(bytes));
        Json::<T>::from_request(req, state)
            .await
            .map(|Json(v)| OptionalJson(v))
    }
}

fn body_rejection(r: BytesRejection) -> ApiError {
    if r.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(413, codes::PAYLOAD_TOO_LARGE, "request body too large")
    } else {
        ApiError::invalid(r.body_text())
    }
}

fn json_rejection(r: JsonRejection) -> ApiError {
    match r {
        JsonRejection::MissingJsonContentType(_) => ApiError::new(
            415,
            codes::UNSUPPORTED_MEDIA_TYPE,
            "expected Content-Type: application/json",
        ),
        JsonRejection::BytesRejection(b)
            if b.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE =>
        {
            ApiError::new(413, codes::PAYLOAD_TOO_LARGE, "request body too large")
        }
        JsonRejection::JsonSyntaxError(e) => {
            ApiError::invalid(format!("malformed JSON: {}", source_text(&e)))
        }
        JsonRejection::JsonDataError(e) => {
            ApiError::invalid(format!("invalid request: {}", source_text(&e)))
        }
        other => ApiError::invalid(other.body_text()),
    }
}

/// serde's message (with the field and position) rather than axum's generic wrapper text.
fn source_text(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        msg = inner.to_string();
        cur = inner.source();
    }
    msg
}

/// Query string with typed errors.
pub struct Query<T>(pub T);

impl<T: DeserializeOwned + Send> FromRequestParts<AppState> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(Query(v)),
            Err(QueryRejection::FailedToDeserializeQueryString(e)) => Err(ApiError::invalid(
                format!("invalid query: {}", source_text(&e)),
            )),
            Err(other) => Err(ApiError::invalid(other.body_text())),
        }
    }
}

/// Path parameters with typed errors (a segment that is not valid percent-encoded UTF-8 is a
/// 400 like any other bad input, not axum's plain-text answer).
pub struct Path<T>(pub T);

impl<T, S> FromRequestParts<S> for Path<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(Path(v)),
            Err(PathRejection::FailedToDeserializePathParams(e)) => Err(ApiError::invalid(
                format!("invalid path parameter: {}", e.body_text()),
            )),
            Err(other) => Err(ApiError::invalid(other.body_text())),
        }
    }
}

/// A WebSocket upgrade, or a typed 400 for a plain request to a WebSocket endpoint.
pub fn websocket(
    ws: Result<
        axum::extract::WebSocketUpgrade,
        axum::extract::ws::rejection::WebSocketUpgradeRejection,
    >,
) -> Result<axum::extract::WebSocketUpgrade, ApiError> {
    ws.map_err(|e| {
        ApiError::invalid(format!(
            "this endpoint needs a WebSocket upgrade: {}",
            e.body_text()
        ))
    })
}

/// The body length a request declares (`Content-Length`), when it is a number: uploads refuse
/// an oversized body before reading it.
pub fn declared_length(headers: &axum::http::HeaderMap) -> Option<u64> {
    headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
}
