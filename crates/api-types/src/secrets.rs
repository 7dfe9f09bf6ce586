//! Shapes of secrets: values a session never sees, injected by the egress proxy into requests
//! to the hosts they are bound to (docs/API-ADDITIONS.md "Egress").

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

/// `POST /v1/sandbox/secrets`: creates or replaces the tenant's secret of that name.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateSecret {
    /// Also the environment variable a session binding it sees: 1–64 of `[A-Za-z0-9_]`, not
    /// starting with a digit.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z_][A-Za-z0-9_]{0,63}$"))]
    pub name: String,
    /// Write-only: never returned, stored encrypted. At most 16 KiB, no control characters
    /// (it is sent in HTTP headers).
    #[cfg_attr(
        feature = "openapi",
        schema(min_length = 1, max_length = 16384, pattern = "^[^\\x00-\\x1f\\x7f]*$")
    )]
    pub value: String,
    /// Where it may be sent (1–16 entries): domains (`api.example.com`, `*.example.com`) or
    /// addresses, with an optional port.
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 16))]
    pub hosts: Vec<String>,
}

/// Never shows the value.
impl std::fmt::Debug for CreateSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreateSecret")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// A secret as listed: everything but its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Secret {
    pub name: String,
    pub hosts: Vec<String>,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SecretList {
    pub secrets: Vec<Secret>,
}
