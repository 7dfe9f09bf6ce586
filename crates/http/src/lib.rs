//! The REST transport (API.md): a thin axum adapter over the session manager.

mod admin;
mod audit;
mod contexts;
pub mod credentials;
mod drain;
mod error;
mod extract;
mod gate;
mod images;
mod live;
mod network;
mod preview;
mod routes;
mod state;
mod terminal;
mod volumes;
mod watch;
mod webhooks;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{any, get, post, put};
use axum::Router;
use koder_api_types::codes;
use koder_auth::limits::Limiter;
use koder_auth::{Authenticator, KeyRing};
use koder_sessions::Manager;
use utoipa::OpenApi;

pub use error::{status_of, ApiError};
pub use extract::declared_length;
pub use gate::{hold_during_body, hold_stream_place};
pub use images::{image_api_error, receive as receive_upload};
pub use preview::{forward as forward_to_sandbox, strip_hop_by_hop};
pub use volumes::file_response as volume_file_response;

/// Marks a request that reached the daemon over its own HTTPS listener (`[server]
/// tls_listen`), so a URL the daemon hands back for the client to call says `https`.
#[derive(Debug, Clone, Copy)]
pub struct ArrivedOverTls;

/// Largest JSON request body (uploads stream and are bounded separately).
pub const MAX_JSON_BODY: usize = 1024 * 1024;

#[derive(Clone)]
pub struct AppState {
    pub manager: Arc<Manager>,
    /// Tenant credentials (API keys, which admins add to at run time, and JWTs).
    pub auth: Arc<Authenticator>,
    /// Operator keys for `/v1/sandbox/admin/...`.
    pub admin_keys: Arc<KeyRing>,
    /// Per-tenant rates, shared with every other transport.
    pub limits: Arc<Limiter>,
    /// Tenants' webhook endpoints and their delivery logs.
    pub webhooks: Arc<koder_webhooks::Webhooks>,
    /// Image builds from template specs.
    pub builds: Arc<koder_build::Builds>,
}

#[derive(OpenApi)]
#[openapi(
    info(title = "koder-sandbox", description = "Run untrusted code in isolated sandboxes."),
    paths(
        routes::create_session, routes::list_sessions, routes::get_session, routes::delete_session,
        routes::set_timeout, routes::exec, routes::upload, routes::download, routes::list_files, routes::stat_file,
        routes::remove_file, routes::make_dir, routes::move_file, routes::session_metrics,
        routes::session_events,
        live::list_execs, live::exec_status, live::exec_stream, live::exec_stdin, live::exec_signal,
        live::report_error, live::list_errors, terminal::terminal, watch::watch,
        preview::upstream, preview::pin, state::pause, routes::resume, routes::kill_processes, audit::network,
        contexts::create_context, contexts::list_contexts, contexts::delete_context,
        contexts::restart_context, contexts::run_code,
        state::snapshot, state::restore, state::fork, state::list_snapshots,
        state::get_snapshot, state::delete_snapshot,
        volumes::create_volume, volumes::list_volumes, volumes::get_volume, volumes::delete_volume,
        volumes::upload, volumes::download, volumes::remove, volumes::set_metadata,
        volumes::list_files, volumes::stat, volumes::make_dir,
        admin::list_tenants, admin::get_tenant, admin::put_tenant, admin::issue_key, admin::list_nodes,
        images::list_images, images::get_image, images::delete_image, images::import_image,
        images::create_build, images::get_build, images::build_logs,
        webhooks::create_webhook, webhooks::list_webhooks, webhooks::list_deliveries,
        webhooks::delete_webhook,
        network::set_network, network::put_secret, network::list_secrets, network::delete_secret,
    ),
    modifiers(&BearerAuth)
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        for (path, item) in openapi.paths.paths.iter_mut() {
            let operations = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
            ];
            for op in operations.into_iter().flatten() {
                if op.security.is_some() {
                    admission_responses(&mut op.responses);
                    input_responses(path, op);
                }
            }
        }
    }
}

fn error_content() -> utoipa::openapi::Content {
    use utoipa::openapi::{ContentBuilder, Ref};
    ContentBuilder::new()
        .schema(Some(Ref::from_schema_name("ErrorBody")))
        .build()
}

fn add_error_response(responses: &mut utoipa::openapi::Responses, status: &str, why: &str) {
    let response = utoipa::openapi::ResponseBuilder::new()
        .description(why)
        .content("application/json", error_content());
    responses
        .responses
        .entry(status.to_string())
        .or_insert_with(|| response.build().into());
}

/// What the shared extractors (`extract.rs`) and the live-session lookup answer, documented
/// once for every operation they serve rather than repeated (and forgotten) per handler: a
/// parameter or body that does not parse is 400, a JSON body 413/415, and an operation on a
/// session 404 (no such session of the tenant), 409 (it is paused) or 410 (it stopped); a
/// volume's file operations answer 409 from the path walk they share.
fn input_responses(path: &str, op: &mut utoipa::openapi::path::Operation) {
    let has_input =
        op.parameters.as_ref().is_some_and(|p| !p.is_empty()) || op.request_body.is_some();
    let json_body = op
        .request_body
        .as_ref()
        .is_some_and(|b| b.content.contains_key("application/json"));
    let responses = &mut op.responses;
    if has_input {
        add_error_response(responses, "400", "SANDBOX-INVALID-ARGUMENT: a path parameter, query or body that does not parse or is out of range");
    }
    if json_body {
        add_error_response(
            responses,
            "413",
            "SANDBOX-PAYLOAD-TOO-LARGE: the body is over 1 MiB",
        );
        add_error_response(
            responses,
            "415",
            "SANDBOX-UNSUPPORTED-MEDIA-TYPE: the body is not `application/json`",
        );
    }
    if path.starts_with("/v1/sandbox/sessions/{id}") {
        add_error_response(
            responses,
            "502",
            "SANDBOX-NODE-UNREACHABLE: the node holding the session (in a cluster) could not be reached to forward the request to it",
        );
    }
    if path.starts_with("/v1/sandbox/volumes") || (path == "/v1/sandbox/sessions" && json_body) {
        add_error_response(
            responses,
            "502",
            "SANDBOX-NODE-UNREACHABLE: the node holding the volume's data (in a cluster) is not up or could not be reached",
        );
    }
    if path.starts_with("/v1/sandbox/volumes/{volume}/files") {
        add_error_response(
            responses,
            "409",
            "SANDBOX-CONFLICT: a component of the path is not a directory, or the entry is not of the kind the operation takes (a directory to download, a file to list)",
        );
    }
    if path.starts_with("/v1/sandbox/sessions/{id}/") {
        add_error_response(
            responses,
            "404",
            "SANDBOX-NOT-FOUND: no such session of this tenant",
        );
        add_error_response(
            responses,
            "409",
            "SANDBOX-CONFLICT: the session is paused; resume it first",
        );
        add_error_response(
            responses,
            "410",
            "SANDBOX-SESSION-STOPPED: the session has stopped",
        );
    }
}

/// What the admission layer can answer on any authenticated route (API.md "Auth and tenancy").
fn admission_responses(responses: &mut utoipa::openapi::Responses) {
    use utoipa::openapi::{
        header::Header, KnownFormat, ObjectBuilder, ResponseBuilder, SchemaFormat, Type,
    };
    let answers = [
        (
            "401",
            "SANDBOX-AUTH-001: missing, invalid or expired credentials; SANDBOX-NODE-AUTH: an `X-Koder-Forwarded` header (node to node, in a cluster) whose proof does not verify",
        ),
        (
            "403",
            "SANDBOX-AUTH-SCOPE: the token's scopes do not cover this operation",
        ),
        (
            "429",
            "SANDBOX-RATE-LIMITED: over the tenant's request rate, concurrent execs or open streams (Retry-After)",
        ),
    ];
    for (status, description) in answers {
        let mut response = ResponseBuilder::new()
            .description(description)
            .content("application/json", error_content());
        if status == "429" {
            let seconds = ObjectBuilder::new()
                .schema_type(Type::Integer)
                .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)));
            response = response.header("Retry-After", Header::new(seconds));
        }
        responses
            .responses
            .entry(status.to_string())
            .or_insert_with(|| response.build().into());
    }
}

/// The OpenAPI document, generated from the handlers' annotations.
pub use drain::drain_unread_bodies;

pub fn openapi() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

pub fn router(state: AppState) -> Router {
    let sessions = Router::new()
        .route("/", post(routes::create_session).get(routes::list_sessions))
        .route(
            "/{id}",
            get(routes::get_session).delete(routes::delete_session),
        )
        .route("/{id}/timeout", post(routes::set_timeout))
        .route("/{id}/exec", post(routes::exec))
        .route(
            "/{id}/files",
            get(routes::download)
                .put(routes::upload)
                .delete(routes::remove_file),
        )
        .route("/{id}/files/list", get(routes::list_files))
        .route("/{id}/files/stat", get(routes::stat_file))
        .route("/{id}/files/mkdir", post(routes::make_dir))
        .route("/{id}/files/move", post(routes::move_file))
        .route("/{id}/metrics", get(routes::session_metrics))
        .route("/{id}/events", get(routes::session_events))
        .route("/{id}/execs", get(live::list_execs))
        .route("/{id}/execs/{exec_id}", get(live::exec_status))
        .route("/{id}/execs/{exec_id}/stream", get(live::exec_stream))
        .route("/{id}/execs/{exec_id}/stdin", post(live::exec_stdin))
        .route("/{id}/execs/{exec_id}/signal", post(live::exec_signal))
        .route(
            "/{id}/errors",
            get(live::list_errors).post(live::report_error),
        )
        .route("/{id}/terminal", get(terminal::terminal))
        .route("/{id}/fs/watch", get(watch::watch))
        .route("/{id}/upstream", get(preview::upstream))
        .route("/{id}/resume", post(routes::resume))
        .route("/{id}/kill-processes", post(routes::kill_processes))
        .route("/{id}/network", put(network::set_network))
        .route("/{id}/preview", post(preview::pin))
        .route("/{id}/preview/", any(preview::proxy))
        .route("/{id}/preview/{*path}", any(preview::proxy))
        .merge(contexts::router())
        .merge(state::session_routes());
    let admin = Router::new()
        .route("/tenants", get(admin::list_tenants))
        .route(
            "/tenants/{id}",
            get(admin::get_tenant).put(admin::put_tenant),
        )
        .route("/tenants/{id}/keys", post(admin::issue_key))
        .route("/nodes", get(admin::list_nodes));
    Router::new()
        .nest("/v1/sandbox/sessions", sessions)
        .nest("/v1/sandbox/snapshots", state::snapshot_routes())
        .nest("/v1/sandbox/volumes", volumes::routes())
        .nest("/v1/sandbox/images", images::routes())
        .nest("/v1/sandbox/webhooks", webhooks::routes())
        .nest("/v1/sandbox/secrets", network::secret_routes())
        .nest("/v1/sandbox/admin", admin)
        .route("/v1/sandbox/audit/network", get(audit::network))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi_json))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            gate::admit,
        ))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_JSON_BODY))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            count_request,
        ))
        .layer(
            tower_http::trace::TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_response(
                    |res: &axum::http::Response<_>,
                     _: std::time::Duration,
                     span: &tracing::Span| {
                        koder_telemetry::record_status(span, res.status().as_u16())
                    },
                )
                .on_failure(()),
        )
        .with_state(state)
}

/// Counts the request and its latency by route template (never by path: ids would make
/// every session a series of its own).
async fn count_request(
    State(s): State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |m| m.as_str().to_string());
    let started = std::time::Instant::now();
    let res = next.run(req).await;
    let m = s.manager.metrics();
    m.http_requests
        .with_label_values(&[route.as_str(), res.status().as_str()])
        .inc();
    m.http_seconds
        .with_label_values(&[route.as_str()])
        .observe(started.elapsed().as_secs_f64());
    res
}

/// A request's span, named by its route template (routing ran already: this layer wraps the
/// matched route).
fn request_span(req: &axum::http::Request<axum::body::Body>) -> tracing::Span {
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or("unmatched", |m| m.as_str());
    koder_telemetry::request_span(req.method().as_str(), route, req.headers())
}

async fn healthz() -> impl IntoResponse {
    axum::Json(serde_json::json!({"status": "ok"}))
}

/// Ready when the state store answers; a daemon that cannot record sessions should not get
/// traffic.
async fn readyz(State(s): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    s.manager
        .ready()
        .await
        .map_err(|e| ApiError::new(503, codes::RUNTIME_UNAVAILABLE, format!("state store: {e}")))?;
    Ok(axum::Json(serde_json::json!({"status": "ready"})))
}

async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.manager.metrics().render(),
    )
}

async fn openapi_json(State(s): State<AppState>) -> impl IntoResponse {
    axum::Json(openapi_for(s.manager.config()))
}

/// The document a daemon serves: the generated one with the maxima its configuration sets,
/// which the annotations cannot know (they state the fixed bounds).
pub fn openapi_for(cfg: &koder_sessions::SessionConfig) -> utoipa::openapi::OpenApi {
    let mut doc = openapi();
    let maxima = [
        ("CreateSession", "timeout_s", cfg.max_timeout_s),
        ("SetTimeout", "timeout_s", cfg.max_timeout_s),
        ("ExecRequest", "timeout_ms", cfg.max_exec_timeout_ms),
        ("RunCode", "timeout_ms", cfg.max_exec_timeout_ms),
        ("CreateVolume", "size_mib", cfg.volume_max_size_mib),
    ];
    for (schema, field, max) in maxima {
        if let Some(object) = property(&mut doc, schema, field) {
            object.maximum = Some(utoipa::Number::UInt(max as usize));
        }
    }
    doc
}

/// The schema of `field` of the component `schema`, when it is an inline object schema.
fn property<'a>(
    doc: &'a mut utoipa::openapi::OpenApi,
    schema: &str,
    field: &str,
) -> Option<&'a mut utoipa::openapi::schema::Object> {
    use utoipa::openapi::{schema::Schema, RefOr};
    let components = doc.components.as_mut()?;
    let RefOr::T(Schema::Object(object)) = components.schemas.get_mut(schema)? else {
        return None;
    };
    match object.properties.get_mut(field)? {
        RefOr::T(Schema::Object(field)) => Some(field),
        _ => None,
    }
}

async fn not_found() -> ApiError {
    ApiError::new(404, codes::NOT_FOUND, "no such endpoint")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED.as_u16(),
        codes::INVALID_ARGUMENT,
        "method not allowed on this endpoint",
    )
}

#[cfg(test)]
mod tests {
    /// Every configured maximum lands on a field of the document: a renamed schema or field
    /// would otherwise drop its bound silently.
    #[test]
    fn the_served_document_carries_the_configured_maxima() {
        let cfg = koder_sessions::SessionConfig {
            max_timeout_s: 77,
            max_exec_timeout_ms: 88,
            volume_max_size_mib: 99,
            ..Default::default()
        };
        let doc = serde_json::to_value(crate::openapi_for(&cfg)).unwrap();
        let schemas = &doc["components"]["schemas"];
        for (schema, field, max) in [
            ("CreateSession", "timeout_s", 77),
            ("SetTimeout", "timeout_s", 77),
            ("ExecRequest", "timeout_ms", 88),
            ("RunCode", "timeout_ms", 88),
            ("CreateVolume", "size_mib", 99),
        ] {
            let field = &schemas[schema]["properties"][field];
            assert_eq!(field["maximum"], max, "{schema}: {field}");
            assert!(field["minimum"].as_u64().is_some(), "{schema}: {field}");
        }
        let plain = serde_json::to_value(crate::openapi()).unwrap();
        assert!(
            plain["components"]["schemas"]["SetTimeout"]["properties"]["timeout_s"]["maximum"]
                .is_null()
        );
    }

    #[test]
    fn openapi_lists_the_input_answers() {
        let doc = crate::openapi();
        for (path, item) in &doc.paths.paths {
            let operations = [&item.get, &item.put, &item.post, &item.delete, &item.patch];
            for op in operations.into_iter().flatten() {
                let has = |s: &str| op.responses.responses.contains_key(s);
                if op.parameters.as_ref().is_some_and(|p| !p.is_empty()) {
                    assert!(has("400"), "{path} lacks 400");
                }
                if op
                    .request_body
                    .as_ref()
                    .is_some_and(|b| b.content.contains_key("application/json"))
                {
                    assert!(has("413") && has("415"), "{path} lacks 413/415");
                }
                if path.starts_with("/v1/sandbox/sessions/{id}/") {
                    assert!(has("404") && has("409") && has("410"), "{path}");
                }
                if path.starts_with("/v1/sandbox/sessions/{id}") {
                    assert!(has("502"), "{path} lacks the cluster's 502");
                }
                if path.starts_with("/v1/sandbox/volumes/{volume}/files") {
                    assert!(has("409"), "{path} lacks 409");
                }
            }
        }
    }
}
