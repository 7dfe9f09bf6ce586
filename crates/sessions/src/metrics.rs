//! Prometheus metrics of the session layer (served at `/metrics`).

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    pub sessions_active: IntGauge,
    pub sessions_created: IntCounterVec,
    pub sessions_ended: IntCounterVec,
    pub execs: IntCounterVec,
    pub exec_seconds: Histogram,
    pub create_seconds: HistogramVec,
    pub pool_ready: IntGaugeVec,
    pub pool_target: IntGaugeVec,
    /// Creates the pool could serve (its lane runs their image), by whether it had one ready.
    pub pool_takes: IntCounterVec,
    pub pool_egress_ready: IntGaugeVec,
    pub pool_egress_target: IntGaugeVec,
    pub pool_egress_takes: IntCounterVec,
    pub pool_failures: IntCounter,
    /// Egress decisions on sandbox connections and name lookups.
    pub egress_decisions: IntCounterVec,
    /// Requests refused by a tenant quota, by quota.
    pub quota_rejections: IntCounterVec,
    pub snapshots_taken: IntCounter,
    pub forks: IntCounter,
    /// Rows the daemon's `[retention]` deleted, by kind (sessions, audit, deliveries).
    pub retention_pruned: IntCounterVec,
    /// REST requests by route template and status, and their latency by route template.
    pub http_requests: IntCounterVec,
    pub http_seconds: HistogramVec,
}

const FAST_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

impl Metrics {
    pub fn new() -> Self {
        let registry =
            Registry::new_custom(Some("koder".into()), None).unwrap_or_else(|_| Registry::new());
        let m = Self {
            sessions_active: IntGauge::new("sessions_active", "Sessions currently running")
                .unwrap_or_else(unreachable_metric),
            sessions_created: IntCounterVec::new(
                Opts::new(
                    "sessions_created_total",
                    "Sessions created, by sandbox source",
                ),
                &["source"],
            )
            .unwrap_or_else(unreachable_metric),
            sessions_ended: IntCounterVec::new(
                Opts::new("sessions_ended_total", "Sessions ended, by reason"),
                &["reason"],
            )
            .unwrap_or_else(unreachable_metric),
            execs: IntCounterVec::new(
                Opts::new(
                    "execs_total",
                    "Execs finished, by verdict (ok for a normal exit)",
                ),
                &["verdict"],
            )
            .unwrap_or_else(unreachable_metric),
            exec_seconds: Histogram::with_opts(
                HistogramOpts::new("exec_duration_seconds", "Exec wall time")
                    .buckets(FAST_BUCKETS.to_vec()),
            )
            .unwrap_or_else(unreachable_metric),
            create_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "session_create_seconds",
                    "Session create latency, by sandbox source",
                )
                .buckets(FAST_BUCKETS.to_vec()),
                &["source"],
            )
            .unwrap_or_else(unreachable_metric),
            pool_ready: IntGaugeVec::new(
                Opts::new(
                    "pool_ready",
                    "Warm sandboxes ready, by language and the image they run on",
                ),
                &["language", "image"],
            )
            .unwrap_or_else(unreachable_metric),
            pool_target: IntGaugeVec::new(
                Opts::new(
                    "pool_target",
                    "Warm sandboxes the pool is filling towards (follows recent creates), by language and image",
                ),
                &["language", "image"],
            )
            .unwrap_or_else(unreachable_metric),
            pool_takes: IntCounterVec::new(
                Opts::new(
                    "pool_takes_total",
                    "Creates on a pooled image, by language, image and result (hit: a warm sandbox was handed out, miss: none was ready)",
                ),
                &["language", "image", "result"],
            )
            .unwrap_or_else(unreachable_metric),
            pool_egress_ready: IntGaugeVec::new(
                Opts::new(
                    "pool_egress_ready",
                    "Warm sandboxes with egress ready (for network open/allowlist), by language and image",
                ),
                &["language", "image"],
            )
            .unwrap_or_else(unreachable_metric),
            pool_egress_target: IntGaugeVec::new(
                Opts::new(
                    "pool_egress_target",
                    "Warm sandboxes with egress the pool is filling towards (follows recent such creates), by language and image",
                ),
                &["language", "image"],
            )
            .unwrap_or_else(unreachable_metric),
            pool_egress_takes: IntCounterVec::new(
                Opts::new(
                    "pool_egress_takes_total",
                    "Creates with egress on a pooled image, by language, image and result (hit, miss)",
                ),
                &["language", "image", "result"],
            )
            .unwrap_or_else(unreachable_metric),
            egress_decisions: IntCounterVec::new(
                Opts::new(
                    "egress_decisions_total",
                    "Egress policy decisions, by protocol (tcp connection, dns lookup) and decision (allow, deny)",
                ),
                &["proto", "decision"],
            )
            .unwrap_or_else(unreachable_metric),
            quota_rejections: IntCounterVec::new(
                Opts::new(
                    "quota_rejections_total",
                    "Requests refused by a tenant quota, by quota (sessions, minutes, snapshot_storage, volume_storage)",
                ),
                &["quota"],
            )
            .unwrap_or_else(unreachable_metric),
            pool_failures: IntCounter::new(
                "pool_fill_failures_total",
                "Warm sandboxes that failed to start",
            )
            .unwrap_or_else(unreachable_metric),
            snapshots_taken: IntCounter::new("snapshots_taken_total", "Snapshots taken")
                .unwrap_or_else(unreachable_metric),
            forks: IntCounter::new("forked_sessions_total", "Sessions made by forks")
                .unwrap_or_else(unreachable_metric),
            retention_pruned: IntCounterVec::new(
                Opts::new(
                    "retention_pruned_total",
                    "Rows deleted past their [retention] age, by kind (sessions, audit, deliveries)",
                ),
                &["kind"],
            )
            .unwrap_or_else(unreachable_metric),
            http_requests: IntCounterVec::new(
                Opts::new(
                    "http_requests_total",
                    "REST requests, by route template and status",
                ),
                &["route", "status"],
            )
            .unwrap_or_else(unreachable_metric),
            http_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "http_request_duration_seconds",
                    "REST request latency (to the answer's head), by route template",
                )
                .buckets(FAST_BUCKETS.to_vec()),
                &["route"],
            )
            .unwrap_or_else(unreachable_metric),
            registry,
        };
        let collectors: Vec<Box<dyn prometheus::core::Collector>> = vec![
            Box::new(m.sessions_active.clone()),
            Box::new(m.sessions_created.clone()),
            Box::new(m.sessions_ended.clone()),
            Box::new(m.execs.clone()),
            Box::new(m.exec_seconds.clone()),
            Box::new(m.create_seconds.clone()),
            Box::new(m.http_requests.clone()),
            Box::new(m.http_seconds.clone()),
            Box::new(m.pool_ready.clone()),
            Box::new(m.pool_target.clone()),
            Box::new(m.pool_takes.clone()),
            Box::new(m.pool_egress_ready.clone()),
            Box::new(m.pool_egress_target.clone()),
            Box::new(m.pool_egress_takes.clone()),
            Box::new(m.pool_failures.clone()),
            Box::new(m.egress_decisions.clone()),
            Box::new(m.quota_rejections.clone()),
            Box::new(m.snapshots_taken.clone()),
            Box::new(m.forks.clone()),
            Box::new(m.retention_pruned.clone()),
        ];
        for c in collectors {
            // Names are fixed and distinct, so registration cannot collide.
            let _ = m.registry.register(c);
        }
        m
    }

    /// Counts `e` when a tenant quota refused the request.
    pub(crate) fn count_quota(&self, e: &crate::Error) {
        use crate::Error;
        let quota = match e {
            Error::QuotaSessions(_) => "sessions",
            Error::QuotaMinutes(_) => "minutes",
            Error::QuotaSnapshotStorage(_) => "snapshot_storage",
            Error::QuotaVolumeStorage(_) => "volume_storage",
            _ => return,
        };
        self.quota_rejections.with_label_values(&[quota]).inc();
    }

    /// Counts one egress decision (`proto`: `tcp` or `dns`).
    pub(crate) fn count_egress(&self, proto: &str, allowed: bool) {
        let decision = if allowed { "allow" } else { "deny" };
        self.egress_decisions
            .with_label_values(&[proto, decision])
            .inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Metric constructors only fail on malformed names or label sets, which are constants here.
fn unreachable_metric<T>(e: prometheus::Error) -> T {
    panic!("metric definition rejected: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_quota_errors_count_as_quota_rejections() {
        let m = Metrics::new();
        m.count_quota(&crate::Error::QuotaSessions("x".into()));
        m.count_quota(&crate::Error::QuotaVolumeStorage("x".into()));
        m.count_quota(&crate::Error::InvalidArgument("x".into()));
        let text = m.render();
        assert!(
            text.contains("koder_quota_rejections_total{quota=\"sessions\"} 1"),
            "{text}"
        );
        assert!(text.contains("koder_quota_rejections_total{quota=\"volume_storage\"} 1"));
        assert_eq!(text.matches("koder_quota_rejections_total{").count(), 2);
    }
}
