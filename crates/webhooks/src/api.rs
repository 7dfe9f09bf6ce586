//! The webhook API's JSON shapes (docs/API-ADDITIONS.md "Webhooks").

use chrono::{DateTime, Utc};
use koder_store::{DeliveryRecord, DeliveryState, WebhookRecord};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
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

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, ToSchema)]
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

impl From<&WebhookRecord> for Webhook {
    fn from(r: &WebhookRecord) -> Self {
        Self {
            id: r.id.clone(),
            url: r.url.clone(),
            events: r.events.clone(),
            created_at: r.created_at,
            secret: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct WebhookList {
    pub webhooks: Vec<Webhook>,
}

/// One event's delivery to one endpoint.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, ToSchema)]
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

impl From<&DeliveryRecord> for Delivery {
    fn from(r: &DeliveryRecord) -> Self {
        Self {
            id: r.id.clone(),
            event_id: r.event_id.clone(),
            event_type: r.event_type.clone(),
            state: r.state.as_str().into(),
            attempts: r.attempts,
            next_attempt_at: (r.state == DeliveryState::Pending).then_some(r.next_attempt_at),
            last_status: r.last_status,
            last_error: r.last_error.clone(),
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct DeliveryList {
    /// Newest first (at most 100).
    pub deliveries: Vec<Delivery>,
}
