//! The service: endpoints per tenant, events into the store's queue, and the dispatcher that
//! delivers what is due.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use koder_netpolicy::NetConfig;
use koder_sessions::events::kinds;
use koder_sessions::{Event, EventSink};
use koder_store::{Attempt, DeliveryRecord, DeliveryState, NewEvent, Store, WebhookRecord};
use parking_lot::Mutex;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

use crate::api::{self, CreateWebhook, Delivery, Webhook};
use crate::{signature, target, WebhookConfig, WebhookError};

/// Deliveries attempted together.
const BATCH: u32 = 32;
/// Longest sleep of the dispatcher with nothing due (a safety net; queuing wakes it).
const IDLE: Duration = Duration::from_secs(30);
/// Entries a delivery log answer holds.
const LOG_LIMIT: u32 = 100;
const SECRET_LEN: std::ops::RangeInclusive<usize> = 16..=256;

/// What the intake and the dispatcher share.
struct Shared {
    store: Store,
    cfg: WebhookConfig,
    net: NetConfig,
    wake: Notify,
}

pub struct Webhooks {
    shared: Arc<Shared>,
    /// Events on their way into the store; `None` once shut down.
    intake: Mutex<Option<mpsc::UnboundedSender<Event>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    dispatcher: Mutex<Option<JoinHandle<()>>>,
}

impl Webhooks {
    /// Starts queuing events and delivering what the queue holds (what a previous run left
    /// pending included).
    pub fn start(store: Store, cfg: WebhookConfig, net: NetConfig) -> Arc<Self> {
        let shared = Arc::new(Shared {
            store,
            cfg,
            net,
            wake: Notify::new(),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let writer = tokio::spawn(queue_events(shared.clone(), rx));
        let dispatcher = tokio::spawn(dispatch_forever(shared.clone()));
        Arc::new(Self {
            shared,
            intake: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(writer)),
            dispatcher: Mutex::new(Some(dispatcher)),
        })
    }

    /// Queues every event emitted so far, then stops delivering (pending deliveries stay
    /// queued for the next run).
    pub async fn shutdown(&self) {
        self.intake.lock().take();
        let writer = self.writer.lock().take();
        if let Some(w) = writer {
            let _ = w.await;
        }
        let dispatcher = self.dispatcher.lock().take();
        if let Some(d) = dispatcher {
            d.abort();
            let _ = d.await;
        }
    }

    /// Registers an endpoint; the answer carries the signing secret (never shown again).
    pub async fn create(&self, tenant: &str, req: CreateWebhook) -> Result<Webhook, WebhookError> {
        let events = req.events.unwrap_or_default();
        if let Some(bad) = events.iter().find(|e| !kinds::ALL.contains(&e.as_str())) {
            return Err(WebhookError::Invalid(format!(
                "unknown event type {bad:?}; one of {}",
                kinds::ALL.join(", ")
            )));
        }
        let secret = match req.secret {
            Some(s) if SECRET_LEN.contains(&s.len()) => s,
            Some(_) => {
                return Err(WebhookError::Invalid(format!(
                    "secret must be {}-{} characters",
                    SECRET_LEN.start(),
                    SECRET_LEN.end()
                )))
            }
            None => format!("whsec_{}", hex::encode(rand::random::<[u8; 32]>())),
        };
        let cfg = &self.shared.cfg;
        target::check(&req.url, &self.shared.net, cfg.allow_private).await?;
        if self.shared.store.list_webhooks(tenant).await?.len() >= cfg.max_per_tenant {
            return Err(WebhookError::Limit(format!(
                "a tenant has at most {} webhooks",
                cfg.max_per_tenant
            )));
        }
        let now = Utc::now();
        let record = WebhookRecord {
            id: format!("wh_{}", uuid::Uuid::new_v4().simple()),
            tenant_id: tenant.to_string(),
            url: req.url,
            events,
            secret,
            created_at: chrono::DateTime::from_timestamp_millis(now.timestamp_millis())
                .unwrap_or(now),
        };
        self.shared.store.insert_webhook(&record).await?;
        tracing::info!(tenant, webhook = %record.id, url = %record.url, "webhook registered");
        Ok(Webhook {
            secret: Some(record.secret.clone()),
            ..api::webhook(&record)
        })
    }

    pub async fn list(&self, tenant: &str) -> Result<Vec<Webhook>, WebhookError> {
        let hooks = self.shared.store.list_webhooks(tenant).await?;
        Ok(hooks.iter().map(api::webhook).collect())
    }

    /// The endpoint's delivery log, newest first.
    pub async fn deliveries(&self, tenant: &str, id: &str) -> Result<Vec<Delivery>, WebhookError> {
        let log = self
            .shared
            .store
            .list_deliveries(tenant, id, LOG_LIMIT)
            .await?;
        Ok(log
            .ok_or(WebhookError::NotFound)?
            .iter()
            .map(api::delivery)
            .collect())
    }

    /// Removes the endpoint and its queued deliveries.
    pub async fn delete(&self, tenant: &str, id: &str) -> Result<(), WebhookError> {
        match self.shared.store.delete_webhook(tenant, id).await? {
            true => Ok(()),
            false => Err(WebhookError::NotFound),
        }
    }
}

impl EventSink for Webhooks {
    fn emit(&self, event: Event) {
        if let Some(tx) = self.intake.lock().as_ref() {
            let _ = tx.send(event);
        }
    }
}

/// The delivery body: `{id, type, created_at, tenant, data}`.
fn body_of(event: &Event) -> String {
    serde_json::json!({
        "id": event.id,
        "type": event.kind,
        "created_at": event.created_at,
        "tenant": event.tenant,
        "data": event.data,
    })
    .to_string()
}

/// Moves emitted events into the store's queue until the intake closes.
async fn queue_events(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<Event>) {
    while let Some(event) = rx.recv().await {
        let body = body_of(&event);
        let new = NewEvent {
            tenant_id: &event.tenant,
            event_id: &event.id,
            event_type: event.kind,
            body: &body,
            at: event.created_at,
        };
        match shared.store.enqueue_event(&new).await {
            Ok(0) => {}
            Ok(_) => shared.wake.notify_one(),
            Err(e) => {
                tracing::error!(event = %event.id, kind = event.kind, error = %e, "queuing a webhook event")
            }
        }
    }
}

async fn dispatch_forever(shared: Arc<Shared>) {
    loop {
        let due = match shared.store.due_deliveries(Utc::now(), BATCH).await {
            Ok(due) => due,
            Err(e) => {
                tracing::error!(error = %e, "reading the webhook queue");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let full = due.len() == BATCH as usize;
        let attempts = due.iter().map(|(d, hook)| async {
            let outcome = attempt(&shared, d, hook).await;
            if let Err(e) = shared.store.record_attempt(&d.id, &outcome).await {
                tracing::error!(delivery = %d.id, error = %e, "recording a webhook attempt");
            }
        });
        futures::future::join_all(attempts).await;
        if full {
            continue;
        }
        let wait = match shared.store.next_delivery_due().await {
            Ok(Some(at)) => (at - Utc::now()).to_std().unwrap_or_default().min(IDLE),
            _ => IDLE,
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = shared.wake.notified() => {}
        }
    }
}

/// One attempt at `d`, and what it leaves the delivery as.
async fn attempt(shared: &Shared, d: &DeliveryRecord, hook: &WebhookRecord) -> Attempt {
    let result = post(shared, d, hook).await;
    let now = Utc::now();
    let (status, error) = match result {
        Ok(status) => {
            tracing::debug!(delivery = %d.id, "webhook delivered");
            return Attempt {
                state: DeliveryState::Delivered,
                next_attempt_at: now,
                status: Some(status),
                error: None,
                at: now,
            };
        }
        Err(failure) => failure,
    };
    let attempts = d.attempts + 1;
    let out_of_attempts = attempts >= shared.cfg.max_attempts;
    tracing::warn!(delivery = %d.id, attempts, error = %error, "webhook attempt failed");
    let wait = chrono::Duration::from_std(shared.cfg.backoff(attempts)).unwrap_or_default();
    Attempt {
        state: if out_of_attempts {
            DeliveryState::Failed
        } else {
            DeliveryState::Pending
        },
        next_attempt_at: now + wait,
        status,
        error: Some(error),
        at: now,
    }
}

/// Sends the delivery once; a failure carries the receiver's status (if it answered) and why.
async fn post(
    shared: &Shared,
    d: &DeliveryRecord,
    hook: &WebhookRecord,
) -> Result<u16, (Option<u16>, String)> {
    let target = target::check(&hook.url, &shared.net, shared.cfg.allow_private)
        .await
        .map_err(|e| (None, e.to_string()))?;
    // Redirects are not followed: each would be a target the guard never saw.
    let mut client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(shared.cfg.timeout_s));
    if let Some(name) = &target.name {
        client = client.resolve_to_addrs(name, &target.addrs);
    }
    let client = client.build().map_err(|e| (None, e.to_string()))?;
    let signed = signature::sign(&hook.secret, Utc::now().timestamp(), d.body.as_bytes());
    let response = client
        .post(target.url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(signature::HEADER, signed)
        .header("Koder-Event-Id", &d.event_id)
        .header("Koder-Event-Type", &d.event_type)
        .body(d.body.clone())
        .send()
        .await
        .map_err(|e| (None, error_chain(&e)))?;
    let status = response.status();
    if status.is_success() {
        Ok(status.as_u16())
    } else {
        Err((Some(status.as_u16()), format!("HTTP {status}")))
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
