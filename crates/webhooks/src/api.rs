//! The webhook API's JSON shapes live in `koder_api_types::webhooks` (the one vocabulary every
//! client shares); this module turns the store's records into them.

use koder_store::{DeliveryRecord, DeliveryState, WebhookRecord};

pub use koder_api_types::webhooks::{CreateWebhook, Delivery, DeliveryList, Webhook, WebhookList};

/// An endpoint as listed: never with its signing secret.
pub(crate) fn webhook(r: &WebhookRecord) -> Webhook {
    Webhook {
        id: r.id.clone(),
        url: r.url.clone(),
        events: r.events.clone(),
        created_at: r.created_at,
        secret: None,
    }
}

pub(crate) fn delivery(r: &DeliveryRecord) -> Delivery {
    Delivery {
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
