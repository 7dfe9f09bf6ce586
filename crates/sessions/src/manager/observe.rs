//! What a tenant can read about its sessions besides their state: the error ring, resource
//! metrics, the event log, quota usage and the network audit log.

use koder_api_types::{ErrorEntry, ReportError, SessionEvent, SessionEventList, SessionMetrics};
use koder_auth::Identity;
use koder_store::AuditRecord;

use super::Manager;
use crate::quota;
use crate::session::MAX_ERRORS;
use crate::Error;

/// Most events one page of a session's log holds (and what `limit` defaults to).
pub const EVENTS_PAGE_MAX: usize = 500;

impl Manager {
    /// The tenant's session's events numbered above `after`, at most `limit` (1 to
    /// [`EVENTS_PAGE_MAX`]), oldest first. A stopped session's log is there as long as its
    /// record; what another tenant's session logged is a `NotFound` like an unknown id.
    pub async fn session_events(
        &self,
        who: &Identity,
        id: &str,
        after: u64,
        limit: usize,
    ) -> Result<SessionEventList, Error> {
        // Numbers are kept signed: one beyond is refused rather than never reached.
        let Ok(after) = i64::try_from(after) else {
            return Err(Error::InvalidArgument(format!(
                "after must be at most {}",
                i64::MAX
            )));
        };
        if !(1..=EVENTS_PAGE_MAX).contains(&limit) {
            return Err(Error::InvalidArgument(format!(
                "limit must be 1 to {EVENTS_PAGE_MAX}, not {limit}"
            )));
        }
        self.record(who, id).await?;
        // One more than the page: whether it came says if more follow.
        let asked = i64::try_from(limit + 1).unwrap_or(i64::MAX);
        let mut events = self
            .store
            .session_events(id, after, asked)
            .await?
            .into_iter()
            .filter_map(|(seq, e)| {
                Some(SessionEvent {
                    seq: u64::try_from(seq).ok()?,
                    id: e.event_id,
                    kind: e.kind,
                    created_at: e.at,
                    data: e.data,
                })
            });
        let page: Vec<_> = events.by_ref().take(limit).collect();
        Ok(SessionEventList {
            more: events.next().is_some(),
            events: page,
        })
    }

    /// Live sessions of `tenant` and session-minutes it used today.
    pub async fn tenant_usage(&self, tenant: &str) -> Result<(u64, u64), Error> {
        let live = self
            .live
            .lock()
            .values()
            .filter(|l| l.tenant_id == tenant)
            .count() as u64;
        Ok((
            live,
            quota::minutes_used(&self.store, tenant, self.now()).await?,
        ))
    }

    /// Adds to the session's error ring (the oldest of more than 50 goes).
    pub fn report_error(
        &self,
        who: &Identity,
        id: &str,
        report: ReportError,
    ) -> Result<ErrorEntry, Error> {
        let live = self.live(who, id)?;
        let bounded = |what: &str, v: &str, max: usize| {
            if v.len() > max {
                Err(Error::InvalidArgument(format!(
                    "{what} longer than {max} bytes"
                )))
            } else {
                Ok(())
            }
        };
        bounded("source", &report.source, 256)?;
        bounded("message", &report.message, 16 * 1024)?;
        bounded("stack", report.stack.as_deref().unwrap_or(""), 64 * 1024)?;
        if report.source.is_empty() || report.message.is_empty() {
            return Err(Error::InvalidArgument(
                "source and message are required".into(),
            ));
        }
        let entry = ErrorEntry {
            at: self.now(),
            source: report.source,
            message: report.message,
            stack: report.stack,
        };
        let mut ring = live.errors.lock();
        if ring.len() >= MAX_ERRORS {
            ring.pop_front();
        }
        ring.push_back(entry.clone());
        Ok(entry)
    }

    pub fn errors(&self, who: &Identity, id: &str) -> Result<Vec<ErrorEntry>, Error> {
        Ok(self.live(who, id)?.errors.lock().iter().cloned().collect())
    }

    pub async fn metrics_of(&self, who: &Identity, id: &str) -> Result<SessionMetrics, Error> {
        let live = self.live(who, id)?;
        let record = self.record(who, id).await?;
        let usage = live
            .sandbox
            .resources()
            .ok_or_else(|| {
                Error::NotImplemented("this runtime does not report resource use".into())
            })?
            .usage()
            .await?;
        let (disk_total, disk_used) = match live.sandbox.agent().disk_usage().await {
            Ok(d) => d,
            Err(e) => return Err(self.agent_failed(id, e).await),
        };
        Ok(SessionMetrics {
            cpu_used_ms: usage.cpu_usage_us / 1000,
            memory_current_kib: usage.memory_current_bytes / 1024,
            memory_peak_kib: usage.memory_peak_bytes / 1024,
            memory_limit_kib: record.limits.memory_mib.map(|m| m * 1024),
            oom_kills: usage.oom_kills,
            pids_current: usage.pids_current,
            pids_limit: record.limits.pids,
            disk_used_kib: disk_used / 1024,
            disk_total_kib: disk_total / 1024,
        })
    }

    /// The tenant's network audit log, newest first.
    pub async fn network_audit(
        &self,
        who: &Identity,
        session_id: Option<&str>,
        allowed: Option<bool>,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<AuditRecord>, Error> {
        if limit == 0 || limit > 1000 {
            return Err(Error::InvalidArgument("limit must be 1..=1000".into()));
        }
        Ok(self
            .store
            .audit(&who.tenant_id, session_id, allowed, before, limit)
            .await?)
    }
}
