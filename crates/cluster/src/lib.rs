//! Many daemons as one service. A layer in front of every HTTP surface (native REST with its
//! SSE and WebSockets, the preview proxy, E2B's control plane and envd): a request for a session
//! another node holds is forwarded to that node, and a create this node has no room for is
//! forwarded to the node with the most (`Manager::owner_of`, `Manager::place`: the session
//! manager reads the store, this crate never does).
//!
//! Forwarding is authenticated twice: the hop by a proof under the cluster's shared secret
//! ([`proof`]), which makes the owner serve the request itself (never forward it again), and
//! the caller by the owner's own admission, from the caller's credentials that travel with
//! the request unchanged. A node header therefore grants no identity, and one a client sends
//! without a valid proof is refused.

mod grpc;
mod proof;
mod proxy;
mod target;

use std::sync::Arc;

use axum::body::Body;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use koder_api_types::ErrorCode;
use koder_auth::Authenticator;
use koder_http::ApiError;
use koder_sessions::{Manager, Peer};

pub use grpc::mount as mount_grpc;
pub use proof::{ClusterKey, ProofError, MIN_SECRET_LEN};
use target::Target;

/// This node as a member of a cluster.
#[derive(Clone)]
pub struct Cluster {
    manager: Arc<Manager>,
    key: ClusterKey,
    node: String,
    /// Who creates (placement spreads a tenant's sessions); the owner authenticates anyway.
    auth: Arc<Authenticator>,
    /// `[e2b] domain`: requests for `<port>-<id>.<domain>` are that session's.
    e2b_domain: Option<String>,
    /// Connections kept to other nodes.
    pools: proxy::Pools,
}

impl Cluster {
    /// `None` when the manager is no node (it shares no store with others).
    pub fn new(
        manager: Arc<Manager>,
        key: ClusterKey,
        auth: Arc<Authenticator>,
    ) -> Option<Cluster> {
        let node = manager.node_id()?.to_string();
        Some(Cluster {
            manager,
            key,
            node,
            auth,
            e2b_domain: None,
            pools: proxy::Pools::new(),
        })
    }

    /// Requests for the host names `<port>-<id>.<domain>` go to session `<id>`'s node.
    pub fn with_e2b_domain(mut self, domain: Option<String>) -> Cluster {
        self.e2b_domain = domain;
        self
    }

    /// Where a create of the caller of `headers` goes ([`Manager::place`]).
    async fn place(
        &self,
        headers: &HeaderMap,
        runtime: &str,
        lane: Option<&str>,
    ) -> Result<Option<Peer>, koder_sessions::Error> {
        let tenant = tenant_of(&self.auth, headers).await;
        self.manager.place(runtime, lane, tenant.as_deref()).await
    }

    /// The node holding the volumes `keys` ([`Manager::volumes_owner`]), names being the
    /// caller's.
    async fn volumes_owner(
        &self,
        headers: &HeaderMap,
        keys: &[&str],
    ) -> Result<Option<Peer>, koder_sessions::Error> {
        let tenant = tenant_of(&self.auth, headers).await;
        self.manager.volumes_owner(tenant.as_deref(), keys).await
    }
}

/// E2B's API key header.
const E2B_API_KEY: &str = "x-api-key";

/// The tenant a request's credentials name (`Authorization: Bearer`, or E2B's `X-API-KEY`),
/// for placement only: `None` when they name none, and the node serving the request refuses
/// it then.
async fn tenant_of(auth: &Authenticator, headers: &HeaderMap) -> Option<String> {
    let principal = if let Some(h) = headers.get(header::AUTHORIZATION) {
        auth.authenticate_header(h.to_str().ok()?).await
    } else {
        let key = headers.get(E2B_API_KEY)?.to_str().ok()?;
        auth.authenticate(key).await
    };
    principal.ok().map(|p| p.identity.tenant_id)
}

/// Puts forwarding in front of `app`.
pub fn mount(app: Router, cluster: Cluster) -> Router {
    app.layer(axum::middleware::from_fn_with_state(
        Arc::new(cluster),
        forward,
    ))
}

async fn forward(State(c): State<Arc<Cluster>>, mut req: Request, next: Next) -> Response {
    if req.headers().contains_key(proof::HEADER) {
        return match checked(&c, &req) {
            Ok(from) => {
                tracing::debug!(%from, path = req.uri().path(), "serving a forwarded request");
                req.headers_mut().remove(proof::HEADER);
                next.run(req).await
            }
            Err(e) => {
                ApiError::new(401, ErrorCode::NodeAuth.as_str(), e.to_string()).into_response()
            }
        };
    }
    let target = target::of(
        req.method(),
        req.uri(),
        req.headers(),
        c.e2b_domain.as_deref(),
    );
    let routed = match target {
        Target::Any => return next.run(req).await,
        Target::Session(id) => c.manager.owner_of(&id).await.map(|p| (p, req)),
        Target::E2bCreate => return e2b_create(&c, req, next).await,
        Target::NativeCreate => return create(&c, req, next).await,
        Target::Build => c.manager.builder().await.map(|p| (p, req)),
        Target::Volume(key) => c
            .volumes_owner(req.headers(), &[&key])
            .await
            .map(|p| (p, req)),
        Target::VolumeCreate => return volume_create(&c, req, next).await,
    };
    match routed {
        Ok((Some(peer), req)) => send(&c, &peer, req).await,
        Ok((None, req)) => next.run(req).await,
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// The node that forwarded `req`, when its proof verifies.
fn checked(c: &Cluster, req: &Request) -> Result<String, ProofError> {
    let value = req
        .headers()
        .get(proof::HEADER)
        .and_then(|v| v.to_str().ok())
        .ok_or(ProofError::Malformed)?;
    let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
    c.key.verify(value, req.method(), target, now_ms())
}

/// Unix time in milliseconds, as proofs carry it.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

async fn send(c: &Cluster, peer: &Peer, req: Request) -> Response {
    let from = proxy::Sender {
        node: &c.node,
        key: &c.key,
        pools: &c.pools,
    };
    tracing::debug!(to = peer.node_id, path = req.uri().path(), "forwarding");
    proxy::forward(&from, peer, req)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// A request's JSON body, read here to decide where the request goes.
enum Read {
    Body(Parts, Bytes),
    /// Its length undeclared or over the API's body limit: served here, where the handler
    /// answers it.
    Unread(Request),
}

/// Reads the body of `req` within the API's body limit.
async fn read_body(req: Request) -> Result<Read, Response> {
    let fits = koder_http::declared_length(req.headers())
        .is_some_and(|n| n <= koder_http::MAX_JSON_BODY as u64);
    if !fits {
        return Ok(Read::Unread(req));
    }
    let (parts, body) = req.into_parts();
    match axum::body::to_bytes(body, koder_http::MAX_JSON_BODY).await {
        Ok(bytes) => Ok(Read::Body(parts, bytes)),
        Err(e) => Err(ApiError::new(
            400,
            ErrorCode::InvalidArgument.as_str(),
            format!("reading the request body: {e}"),
        )
        .into_response()),
    }
}

/// Where a create goes: where its volumes are (nowhere else can mount them), else where
/// placement puts it.
enum CreateAt {
    Volumes(Result<Option<Peer>, koder_sessions::Error>),
    Placed(Result<Option<Peer>, koder_sessions::Error>),
}

/// A native create goes where the volumes it mounts are, else where there is room for its
/// runtime, to a node with a warm sandbox for it first (its JSON body read here within the
/// API's body limit; a body without a declared length, over the limit or not a create
/// request, is created here, where the handler answers it). When the node placement chose
/// cannot be reached, the create is made here after all.
async fn create(c: &Cluster, req: Request, next: Next) -> Response {
    let (parts, bytes) = match read_body(req).await {
        Ok(Read::Body(parts, bytes)) => (parts, bytes),
        Ok(Read::Unread(req)) => return next.run(req).await,
        Err(answer) => return answer,
    };
    // A body that is not a create request is answered here, by the handler.
    let Ok(create) = serde_json::from_slice::<koder_api_types::CreateSession>(&bytes) else {
        return next
            .run(Request::from_parts(parts, Body::from(bytes)))
            .await;
    };
    let at = if create.volumes.is_empty() {
        let runtime = create.runtime.as_deref().unwrap_or("jail");
        let lane = c.manager.lane_of(&create);
        CreateAt::Placed(c.place(&parts.headers, runtime, lane.as_deref()).await)
    } else {
        let keys: Vec<&str> = create.volumes.iter().map(|v| v.name.as_str()).collect();
        CreateAt::Volumes(c.volumes_owner(&parts.headers, &keys).await)
    };
    dispatch(c, at, parts, bytes, next).await
}

/// An E2B create goes where the volumes it mounts (`volumeMounts`) are, else where there is
/// room (always a jail).
async fn e2b_create(c: &Cluster, req: Request, next: Next) -> Response {
    let (parts, bytes) = match read_body(req).await {
        Ok(Read::Body(parts, bytes)) => (parts, bytes),
        Ok(Read::Unread(req)) => {
            return match c.place(req.headers(), "jail", None).await {
                Ok(Some(peer)) => send(c, &peer, req).await,
                Ok(None) => next.run(req).await,
                Err(e) => ApiError::from(e).into_response(),
            }
        }
        Err(answer) => return answer,
    };
    let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let keys: Vec<&str> = body
        .get("volumeMounts")
        .and_then(|m| m.as_array())
        .map(|mounts| {
            mounts
                .iter()
                .filter_map(|m| m.get("name")?.as_str())
                .collect()
        })
        .unwrap_or_default();
    let at = if keys.is_empty() {
        CreateAt::Placed(c.place(&parts.headers, "jail", None).await)
    } else {
        CreateAt::Volumes(c.volumes_owner(&parts.headers, &keys).await)
    };
    dispatch(c, at, parts, bytes, next).await
}

/// A volume copy is made on the node holding its source (`from_volume`); a new empty volume
/// on the node asked, which holds its data from then on.
async fn volume_create(c: &Cluster, req: Request, next: Next) -> Response {
    let (parts, bytes) = match read_body(req).await {
        Ok(Read::Body(parts, bytes)) => (parts, bytes),
        Ok(Read::Unread(req)) => return next.run(req).await,
        Err(answer) => return answer,
    };
    let from = serde_json::from_slice::<koder_api_types::CreateVolume>(&bytes)
        .ok()
        .and_then(|v| v.from_volume);
    let at = match &from {
        Some(source) => CreateAt::Volumes(c.volumes_owner(&parts.headers, &[source]).await),
        None => CreateAt::Volumes(Ok(None)),
    };
    dispatch(c, at, parts, bytes, next).await
}

/// Sends a request whose body was read to the node `at` names, or serves it here. A placed
/// create whose node cannot be reached is made here after all; one bound to its volumes'
/// node answers why it could not reach it.
async fn dispatch(c: &Cluster, at: CreateAt, parts: Parts, bytes: Bytes, next: Next) -> Response {
    let (routed, fallback_here) = match at {
        CreateAt::Placed(routed) => (routed, true),
        CreateAt::Volumes(routed) => (routed, false),
    };
    let peer = match routed {
        Ok(Some(peer)) => peer,
        Ok(None) => {
            return next
                .run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Err(e) => return ApiError::from(e).into_response(),
    };
    let mut copy = Request::new(Body::from(bytes.clone()));
    *copy.method_mut() = parts.method.clone();
    *copy.uri_mut() = parts.uri.clone();
    *copy.headers_mut() = parts.headers.clone();
    let from = proxy::Sender {
        node: &c.node,
        key: &c.key,
        pools: &c.pools,
    };
    match proxy::forward(&from, &peer, copy).await {
        Ok(resp) => resp,
        Err(e) if fallback_here => {
            tracing::warn!(
                node = peer.node_id,
                error = e.message,
                "placing a create there failed; creating here"
            );
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use koder_auth::{hash_key, KeyRing};

    #[tokio::test]
    async fn placement_knows_the_creating_tenant_from_either_header() {
        let mut keys = KeyRing::default();
        keys.insert_hash(hash_key("ksk_one"), "t1");
        let auth = Authenticator::new(keys, None);
        let tenant = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, v.parse().unwrap());
            }
            let auth = &auth;
            async move { tenant_of(auth, &h).await }
        };
        assert_eq!(
            tenant(&[("authorization", "Bearer ksk_one")])
                .await
                .as_deref(),
            Some("t1")
        );
        assert_eq!(
            tenant(&[("x-api-key", "ksk_one")]).await.as_deref(),
            Some("t1")
        );
        for unknown in [
            &[("authorization", "Bearer ksk_two")][..],
            &[("authorization", "ksk_one")],
            &[("x-api-key", "")],
            &[],
        ] {
            assert_eq!(tenant(unknown).await, None, "{unknown:?}");
        }
    }
}
