//! The gRPC transport: service `koder.ai.sandbox.v1.Sandbox` (`proto/koder/ai/sandbox/v1/
//! sandbox.proto`) over the same [`koder_sessions::Manager`] as REST and E2B, with server
//! reflection. Every call passes [`admit`]: the bearer token in the `authorization` metadata,
//! the call's scope, the tenant's rate, and an exec or stream place held while it runs; every
//! failure becomes a status whose code follows the REST status ([`status`]).
//!
//! No domain logic lives here: a call is admission, message conversion ([`convert`]) and one
//! manager call.

mod admit;
mod convert;
mod service;
pub mod status;

use std::future::Future;
use std::sync::Arc;

use koder_auth::limits::Limiter;
use koder_auth::{Authenticator, KeyRing};
use koder_sessions::Manager;

/// Messages, server and client generated from the `.proto`.
#[allow(clippy::large_enum_variant, clippy::doc_lazy_continuation)]
pub mod proto {
    tonic::include_proto!("koder.ai.sandbox.v1");

    /// The encoded descriptors of the service's `.proto` (and its imports), for reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/sandbox_descriptor.bin"));
}

pub use proto::sandbox_client::SandboxClient;
pub use service::SandboxService;

/// The fully qualified service name, as reflection lists it.
pub const SERVICE_NAME: &str = "koder.ai.sandbox.v1.Sandbox";

/// What every call needs: the domain, and the credentials and rates REST shares.
#[derive(Clone)]
pub struct GrpcState {
    pub manager: Arc<Manager>,
    pub auth: Arc<Authenticator>,
    pub limits: Arc<Limiter>,
    /// Operator keys, for the tenant administration calls.
    pub admin_keys: Arc<KeyRing>,
}

/// Failure to set the gRPC server up or to serve.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("reflection descriptors: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// The Sandbox service and reflection as one router: what [`serve`] serves, with room for
/// a layer in front (a cluster forwards calls for other nodes' sessions there).
pub fn router(state: GrpcState) -> Result<axum::Router, ServeError> {
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    Ok(
        tonic::service::Routes::new(proto::sandbox_server::SandboxServer::new(
            SandboxService::new(state),
        ))
        .add_service(reflection)
        .into_axum_router(),
    )
}

/// Serves `router` ([`router`]) over HTTP/2 on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    // Streamed answers are many small writes; Nagle would hold each behind a delayed ACK.
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_routes(tonic::service::Routes::from(router))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    Ok(())
}
