//! `[retention]`: how long what only grows is kept (stopped sessions' records and event logs,
//! the network audit, the webhook delivery log), and the task that prunes it.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use koder_store::{Cutoffs, Pruned, Store};
use serde::Deserialize;

/// How often the store is pruned (and once at start): rows are at least days old when they
/// go, so an hour late is nothing, and a pass over nothing to delete is three indexed reads.
const EVERY: Duration = Duration::from_secs(3600);
const MAX_DAYS: u64 = 36_500;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionSection {
    /// Days a stopped session's record (its answer to `GET`, its event log, E2B's logs of it)
    /// is kept after it ended.
    pub stopped_session_days: u64,
    /// Days an entry of the network audit is kept.
    pub network_audit_days: u64,
    /// Days a delivered or failed webhook delivery stays in its endpoint's log.
    pub webhook_delivery_days: u64,
}

impl Default for RetentionSection {
    fn default() -> Self {
        Self {
            stopped_session_days: 30,
            network_audit_days: 30,
            webhook_delivery_days: 30,
        }
    }
}

impl RetentionSection {
    /// Every age 1..=36500 days. At least a day: the daily session-minutes quota counts the
    /// sessions that ran since midnight (UTC), ended ones included.
    pub fn check(&self) -> anyhow::Result<()> {
        for (key, days) in [
            ("stopped_session_days", self.stopped_session_days),
            ("network_audit_days", self.network_audit_days),
            ("webhook_delivery_days", self.webhook_delivery_days),
        ] {
            if !(1..=MAX_DAYS).contains(&days) {
                anyhow::bail!("[retention] {key}: 1..={MAX_DAYS} (days)");
            }
        }
        Ok(())
    }

    /// What is older than its age at `now`.
    pub fn cutoffs(&self, now: DateTime<Utc>) -> Cutoffs {
        // Checked bounds: 36500 days is far inside chrono's range.
        let before = |days: u64| now - TimeDelta::days(i64::try_from(days).unwrap_or(0));
        Cutoffs {
            stopped_sessions: before(self.stopped_session_days),
            network_audit: before(self.network_audit_days),
            webhook_deliveries: before(self.webhook_delivery_days),
        }
    }
}

/// Prunes the store now and every [`EVERY`] on a task of its own, counting what went in
/// `pruned` (`koder_retention_pruned_total`). In a cluster every node prunes the shared
/// store; the deletes are idempotent, and the shortest ages configured on any node win (give
/// every node the same `[retention]`).
pub fn spawn(store: Store, retention: RetentionSection, pruned: prometheus::IntCounterVec) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(EVERY);
        // A pass longer than the period (a backlog) is followed by one period of rest, not
        // by the missed passes at once.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match store.prune(&retention.cutoffs(Utc::now())).await {
                Ok(done) => count(&pruned, done),
                Err(e) => tracing::error!(error = %e, "pruning by [retention]"),
            }
        }
    });
}

fn count(pruned: &prometheus::IntCounterVec, done: Pruned) {
    if done == Pruned::default() {
        return;
    }
    tracing::info!(
        sessions = done.sessions,
        audit = done.audit,
        deliveries = done.deliveries,
        "pruned what outlived its retention"
    );
    for (kind, n) in [
        ("sessions", done.sessions),
        ("audit", done.audit),
        ("deliveries", done.deliveries),
    ] {
        pruned.with_label_values(&[kind]).inc_by(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cutoffs_are_the_ages_back_from_now() {
        let now = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let section = RetentionSection {
            stopped_session_days: 1,
            network_audit_days: 7,
            webhook_delivery_days: MAX_DAYS,
        };
        section.check().unwrap();
        let c = section.cutoffs(now);
        assert_eq!(now - c.stopped_sessions, TimeDelta::hours(24));
        assert_eq!(now - c.network_audit, TimeDelta::days(7));
        assert_eq!(now - c.webhook_deliveries, TimeDelta::days(36_500));
    }
}
