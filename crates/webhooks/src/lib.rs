//! Webhooks: a tenant registers endpoints; every lifecycle event of its sessions (created,
//! paused, resumed, stopped with the cause, exec verdicts other than a normal exit) is queued
//! in the state store for each endpoint that wants it and delivered, signed, with exponential
//! backoff until a 2xx (at-least-once across restarts; receivers deduplicate on the event id).
//! Targets pass the egress SSRF guard at registration and again, pinned, at every attempt.

pub mod api;
mod config;
mod deliver;
mod error;
pub mod signature;
mod target;

pub use config::WebhookConfig;
pub use deliver::Webhooks;
pub use error::WebhookError;
