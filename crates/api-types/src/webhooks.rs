//! Shapes of the webhook API (docs/API-ADDITIONS.md "Webhooks").

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateWebhook {
    /// `http` or `https`; must not reach loopback, private or reserved addresses.
    pub url: String,
    /// Event types to deliver (`session.created`, `session.paused`, `session.resumed`,
    /// `session.stopped`, `exec.verdict`); omitted or empty: all.
    #[serde(default)]
    pub events: Option<Vec<String>>,
    /// The signing secret (16-256 characters); omitted: one is made.
    #[serde(default)]
    pub secret: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Webhook {
    pub id: String,
    pub url: String,
    /// Empty: every event type.
    pub events: Vec<String>,
    pub created_at: DateTime<Utc>,
    /// The signing secret, in the creation answer only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct WebhookList {
    pub webhooks: Vec<Webhook>,
}

/// One event's delivery to one endpoint.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Delivery {
    pub id: String,
    /// The event's id (the body's `id`), the same on every attempt.
    pub event_id: String,
    pub event_type: String,
    /// `pending` (queued or retrying), `delivered` or `failed` (attempts used up).
    pub state: String,
    pub attempts: u32,
    /// When a pending delivery is tried next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// The receiver's last HTTP status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct DeliveryList {
    /// Newest first (at most 100).
    pub deliveries: Vec<Delivery>,
}
