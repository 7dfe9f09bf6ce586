//! Per-tenant admission, independent of any transport: a request rate (GCRA token bucket,
//! `governor`), concurrent execs and open streams (WebSocket, SSE, streamed RPCs). REST, E2B
//! and gRPC share one [`Limiter`], so a tenant's budget is the same whichever wire it uses.
//!
//! A tenant's rates are its own (`[tenants.X.limits]`), else its plan's (`[limits.plans.P]`),
//! else the server's (`[limits]`), field by field; a field unset everywhere is unlimited.

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use koder_api_types::ErrorCode;
use parking_lot::Mutex;
use serde::Deserialize;

/// One tier's limits; `None` defers to the next tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Rates {
    /// Sustained requests per second.
    pub requests_per_second: Option<NonZeroU32>,
    /// Requests allowed at once above the sustained rate (default: one second's worth).
    pub burst: Option<NonZeroU32>,
    /// Exec requests in flight at once (a streamed exec counts until its stream ends).
    pub concurrent_execs: Option<u32>,
    /// WebSocket, SSE and streamed-RPC connections open at once.
    pub streams: Option<u32>,
}

impl Rates {
    /// Each field of `self`, or `fallback`'s where `self` has none.
    pub fn or(self, fallback: Rates) -> Rates {
        Rates {
            requests_per_second: self.requests_per_second.or(fallback.requests_per_second),
            burst: self.burst.or(fallback.burst),
            concurrent_execs: self.concurrent_execs.or(fallback.concurrent_execs),
            streams: self.streams.or(fallback.streams),
        }
    }
}

/// `[limits]`: the server's rates (the fields of [`Rates`]) and each plan's.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    pub requests_per_second: Option<NonZeroU32>,
    pub burst: Option<NonZeroU32>,
    pub concurrent_execs: Option<u32>,
    pub streams: Option<u32>,
    /// By plan name (`[tenants.X] plan`).
    pub plans: BTreeMap<String, Rates>,
}

impl LimitsConfig {
    fn server(&self) -> Rates {
        Rates {
            requests_per_second: self.requests_per_second,
            burst: self.burst,
            concurrent_execs: self.concurrent_execs,
            streams: self.streams,
        }
    }
}

/// Who gets which rates.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    server: Rates,
    plans: BTreeMap<String, Rates>,
    tenants: HashMap<String, Rates>,
}

impl Policy {
    pub fn new(cfg: &LimitsConfig) -> Self {
        Self {
            server: cfg.server(),
            plans: cfg.plans.clone(),
            tenants: HashMap::new(),
        }
    }

    /// A configured tenant: its own rates over its plan's.
    pub fn with_tenant(mut self, tenant: &str, plan: &str, own: Rates) -> Self {
        let plan = self.plans.get(plan).copied().unwrap_or_default();
        self.tenants.insert(tenant.to_string(), own.or(plan));
        self
    }

    pub fn rates(&self, tenant: &str) -> Rates {
        self.tenants
            .get(tenant)
            .copied()
            .unwrap_or_default()
            .or(self.server)
    }
}

/// What ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    Requests,
    Execs,
    Streams,
}

/// 429: over a limit; retrying after `retry_after` may succeed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", describe(*.kind, *.limit))]
pub struct Limited {
    pub kind: LimitKind,
    pub limit: u32,
    pub retry_after: Duration,
}

fn describe(kind: LimitKind, limit: u32) -> String {
    match kind {
        LimitKind::Requests => format!("over this tenant's request rate ({limit}/s)"),
        LimitKind::Execs => format!("this tenant already runs {limit} execs at once"),
        LimitKind::Streams => format!("this tenant already holds {limit} open streams"),
    }
}

impl Limited {
    pub const fn code(&self) -> ErrorCode {
        ErrorCode::RateLimited
    }

    /// `Retry-After` in whole seconds, at least 1.
    pub fn retry_after_secs(&self) -> u64 {
        let whole = self.retry_after.as_secs();
        let rounded_up = whole + u64::from(self.retry_after.subsec_nanos() > 0);
        rounded_up.max(1)
    }
}

/// A held exec or stream place, given back when dropped.
#[derive(Debug)]
pub struct Slot(Option<Arc<AtomicU32>>);

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(open) = &self.0 {
            open.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A bounded count of places.
#[derive(Default)]
struct Places {
    max: Option<u32>,
    open: Arc<AtomicU32>,
}

impl Places {
    fn take(&self, kind: LimitKind) -> Result<Slot, Limited> {
        let Some(max) = self.max else {
            return Ok(Slot(None));
        };
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map(|_| Slot(Some(self.open.clone())))
            .map_err(|_| Limited {
                kind,
                limit: max,
                // Nothing says when a place frees up: a second is a polite first retry.
                retry_after: Duration::from_secs(1),
            })
    }
}

struct TenantState {
    rate: Option<(DefaultDirectRateLimiter, u32)>,
    execs: Places,
    streams: Places,
}

impl TenantState {
    fn new(rates: Rates) -> Self {
        Self {
            rate: rates.requests_per_second.map(|rps| {
                let quota = Quota::per_second(rps).allow_burst(rates.burst.unwrap_or(rps));
                (RateLimiter::direct(quota), rps.get())
            }),
            execs: Places {
                max: rates.concurrent_execs,
                ..Default::default()
            },
            streams: Places {
                max: rates.streams,
                ..Default::default()
            },
        }
    }
}

/// The server's per-tenant limits. Only authenticated tenants reach it, so its per-tenant
/// state is bounded by the tenants that exist.
pub struct Limiter {
    policy: Policy,
    clock: DefaultClock,
    tenants: Mutex<HashMap<String, Arc<TenantState>>>,
}

impl Limiter {
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            clock: DefaultClock::default(),
            tenants: Mutex::new(HashMap::new()),
        }
    }

    /// No limits at all.
    pub fn unlimited() -> Self {
        Self::new(Policy::default())
    }

    fn tenant(&self, tenant: &str) -> Arc<TenantState> {
        self.tenants
            .lock()
            .entry(tenant.to_string())
            .or_insert_with(|| Arc::new(TenantState::new(self.policy.rates(tenant))))
            .clone()
    }

    /// Counts one request against the tenant's rate.
    pub fn check_request(&self, tenant: &str) -> Result<(), Limited> {
        let state = self.tenant(tenant);
        let Some((limiter, rps)) = &state.rate else {
            return Ok(());
        };
        limiter.check().map_err(|not_until| Limited {
            kind: LimitKind::Requests,
            limit: *rps,
            retry_after: not_until.wait_time_from(self.clock.now()),
        })
    }

    /// A place for one exec, held until the exec's answer (or stream) is done.
    pub fn begin_exec(&self, tenant: &str) -> Result<Slot, Limited> {
        self.tenant(tenant).execs.take(LimitKind::Execs)
    }

    /// A place for one long-lived connection, held while it is open.
    pub fn open_stream(&self, tenant: &str) -> Result<Slot, Limited> {
        self.tenant(tenant).streams.take(LimitKind::Streams)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nz(n: u32) -> Option<NonZeroU32> {
        NonZeroU32::new(n)
    }

    #[test]
    fn tenant_over_plan_over_server() {
        let cfg = LimitsConfig {
            requests_per_second: nz(100),
            concurrent_execs: Some(8),
            plans: [(
                "free".to_string(),
                Rates {
                    requests_per_second: nz(2),
                    streams: Some(1),
                    ..Default::default()
                },
            )]
            .into(),
            ..Default::default()
        };
        let policy = Policy::new(&cfg)
            .with_tenant("a", "free", Rates::default())
            .with_tenant(
                "b",
                "free",
                Rates {
                    requests_per_second: nz(5),
                    ..Default::default()
                },
            );
        let a = policy.rates("a");
        assert_eq!(
            (a.requests_per_second, a.streams, a.concurrent_execs),
            (nz(2), Some(1), Some(8))
        );
        assert_eq!(policy.rates("b").requests_per_second, nz(5));
        assert_eq!(policy.rates("b").streams, Some(1));
        let other = policy.rates("unconfigured");
        assert_eq!((other.requests_per_second, other.streams), (nz(100), None));
    }

    #[test]
    fn request_rate_is_per_tenant_with_a_retry_hint() {
        let cfg = LimitsConfig {
            requests_per_second: nz(1),
            burst: nz(3),
            ..Default::default()
        };
        let limits = Limiter::new(Policy::new(&cfg));
        for _ in 0..3 {
            limits.check_request("a").unwrap();
        }
        let over = limits.check_request("a").unwrap_err();
        assert_eq!(over.kind, LimitKind::Requests);
        assert_eq!(over.code(), ErrorCode::RateLimited);
        assert!(over.retry_after <= Duration::from_secs(1));
        assert_eq!(over.retry_after_secs(), 1);
        // Another tenant has a bucket of its own.
        limits.check_request("b").unwrap();
    }

    #[test]
    fn places_come_back_when_dropped() {
        let cfg = LimitsConfig {
            concurrent_execs: Some(1),
            streams: Some(2),
            ..Default::default()
        };
        let limits = Limiter::new(Policy::new(&cfg));
        let exec = limits.begin_exec("a").unwrap();
        let busy = limits.begin_exec("a").unwrap_err();
        assert_eq!((busy.kind, busy.limit), (LimitKind::Execs, 1));
        limits.begin_exec("b").unwrap();
        drop(exec);
        let _again = limits.begin_exec("a").unwrap();
        let s1 = limits.open_stream("a").unwrap();
        let _s2 = limits.open_stream("a").unwrap();
        assert!(limits.open_stream("a").is_err());
        drop(s1);
        assert!(limits.open_stream("a").is_ok());
    }

    #[test]
    fn unlimited_never_refuses() {
        let limits = Limiter::unlimited();
        let held: Vec<_> = (0..1000).map(|_| limits.begin_exec("a").unwrap()).collect();
        assert!((0..1000).all(|_| limits.check_request("a").is_ok()));
        assert_eq!(held.len(), 1000);
    }

    #[test]
    fn zero_rates_are_config_errors() {
        assert!(serde_json::from_str::<Rates>(r#"{"requests_per_second": 0}"#).is_err());
        assert!(serde_json::from_str::<Rates>(r#"{"burst": 5, "streams": 0}"#).is_ok());
        assert!(serde_json::from_str::<Rates>(r#"{"rps": 5}"#).is_err());
    }
}
