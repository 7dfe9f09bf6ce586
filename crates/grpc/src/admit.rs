//! The gRPC twin of the REST admission layer (`koder_http::gate`), over the same
//! [`koder_auth`] pieces: authenticate the `authorization` metadata, check the call's scope,
//! count the call against the tenant's rate, and take the exec and stream places it holds.

use koder_auth::limits::Slot;
use koder_auth::{AuthError, Credential, Identity, Scope};
use tonic::metadata::MetadataMap;
use tonic::Status;

use crate::status::{status, OrStatus as _};
use crate::GrpcState;

/// Which of the tenant's concurrent places a call holds while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Places {
    None,
    /// An exec or a code run, answered at once.
    Exec,
    /// A stream that runs code (ExecStream).
    ExecStream,
    /// A stream that runs none (WatchFiles).
    Stream,
}

/// An admitted call: who it acts for, and its places (given back when dropped).
pub(crate) struct Admitted {
    pub who: Identity,
    pub places: (Option<Slot>, Option<Slot>),
}

/// The `authorization` metadata's text.
fn bearer(metadata: &MetadataMap) -> Result<&str, Status> {
    match metadata.get("authorization") {
        None => Err(crate::status::ToStatus::to_status(&AuthError::Missing)),
        Some(v) => v.to_str().map_err(|_| {
            status(
                koder_api_types::ErrorCode::Auth,
                "malformed authorization metadata",
                None,
            )
        }),
    }
}

pub(crate) async fn admit(
    s: &GrpcState,
    metadata: &MetadataMap,
    needed: Scope,
    places: Places,
) -> Result<Admitted, Status> {
    let header = bearer(metadata)?;
    let principal = s.auth.authenticate_header(header).await.or_status()?;
    principal.require(needed).or_status()?;
    let tenant = principal.identity.tenant_id.as_str();
    s.limits.check_request(tenant).or_status()?;
    let exec = matches!(places, Places::Exec | Places::ExecStream)
        .then(|| s.limits.begin_exec(tenant))
        .transpose()
        .or_status()?;
    let stream = matches!(places, Places::ExecStream | Places::Stream)
        .then(|| s.limits.open_stream(tenant))
        .transpose()
        .or_status()?;
    Ok(Admitted {
        who: principal.identity,
        places: (exec, stream),
    })
}

/// An operator call, as REST's `AdminCaller`: an admin key, or a JWT with `sandbox:admin`; a
/// tenant's API key is PERMISSION_DENIED.
pub(crate) async fn admit_operator(s: &GrpcState, metadata: &MetadataMap) -> Result<(), Status> {
    let header = bearer(metadata)?;
    if s.admin_keys.authenticate(header).is_some() {
        return Ok(());
    }
    let principal = s.auth.authenticate_header(header).await.or_status()?;
    match principal.credential {
        Credential::Jwt => principal.require(Scope::Admin).or_status(),
        Credential::ApiKey => Err(status(
            koder_api_types::ErrorCode::PermissionDenied,
            "this call needs an admin key",
            None,
        )),
    }
}
