//! Resource counters around one exec: its verdict (killed, timeout, OOM, pids) and peak memory.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use koder_agent_protocol as proto;
use koder_api_types::codes;
use koder_runtime::{ExecCounters, ResourceControl};

use super::SIGKILL;
use crate::metrics::Metrics;
use crate::session::Live;

/// The counters verdicts come from, where the runtime reports them; a failed reading counts as
/// none.
pub(crate) async fn counters_of(rc: Option<&dyn ResourceControl>) -> Option<ExecCounters> {
    match rc {
        Some(rc) => rc.exec_counters().await.ok(),
        None => None,
    }
}

/// Resource counters around one exec, for its verdict and peak memory: the OOM-kill and
/// pids-limit counters before it (they must be read then: another process of the session may
/// have moved them since any earlier reading), the same after it only when its ending could be
/// theirs, and the peak only where it describes this exec.
pub(crate) struct Meter {
    live: Arc<Live>,
    before: Option<ExecCounters>,
    peak_tracked: bool,
    started: Instant,
}

impl Meter {
    pub(crate) async fn start(live: Arc<Live>) -> Self {
        let alone = live.running_execs.fetch_add(1, Ordering::SeqCst) == 0;
        let rc = live.sandbox.resources();
        // The cgroup's peak is per session: it only describes this exec when no other runs.
        let peak_tracked = match rc {
            Some(rc) if alone => rc.reset_memory_peak().await.is_ok(),
            _ => false,
        };
        let before = counters_of(rc).await;
        Self {
            live,
            before,
            peak_tracked,
            started: Instant::now(),
        }
    }

    /// The exec never produced a result (its sandbox went away).
    pub(crate) fn abandon(self) {
        self.live.running_execs.fetch_sub(1, Ordering::SeqCst);
    }

    /// The verdict (None for a normal exit) and the peak memory in KiB, if attributable.
    pub(crate) async fn finish(
        self,
        exit: &proto::ExitInfo,
        killed: bool,
        metrics: &Metrics,
    ) -> (Option<&'static str>, Option<u64>) {
        let rc = self.live.sandbox.resources();
        let after = match needs_counters(exit, killed) {
            true => counters_of(rc).await,
            false => None,
        };
        let (started, before) = (self.started, self.before);
        let peak = self.peak().await;
        let verdict = verdict(before, after, exit, killed);
        metrics
            .execs
            .with_label_values(&[verdict.unwrap_or("ok")])
            .inc();
        metrics
            .exec_seconds
            .observe(started.elapsed().as_secs_f64());
        (verdict, peak)
    }

    /// The peak memory in KiB, if attributable; the end of a run whose verdict is found
    /// elsewhere (a context run's).
    pub(crate) async fn peak(self) -> Option<u64> {
        // Read before this exec stops counting as running, so no other one resets it first.
        let peak = match self.live.sandbox.resources() {
            Some(rc) if self.peak_tracked => rc.memory_peak().await.ok().map(|b| b / 1024),
            _ => None,
        };
        self.live.running_execs.fetch_sub(1, Ordering::SeqCst);
        peak
    }
}

/// Whether [`verdict`] looks at the counters after an exec that ended so: only a SIGKILL (an
/// OOM kill) or a failing status (a refused fork) can be theirs, and neither when the exec was
/// killed or timed out.
fn needs_counters(exit: &proto::ExitInfo, killed: bool) -> bool {
    !killed && !exit.timed_out && (exit.signal == Some(SIGKILL) || exit.exit_code != Some(0))
}

/// What ended an exec, from its exit and the session's counters before and after it
/// (`None`: it ended on its own).
fn verdict(
    before: Option<ExecCounters>,
    after: Option<ExecCounters>,
    exit: &proto::ExitInfo,
    killed: bool,
) -> Option<&'static str> {
    let grew = |f: fn(&ExecCounters) -> u64| matches!((before, after), (Some(b), Some(a)) if f(&a) > f(&b));
    if killed {
        Some(codes::EXEC_KILLED)
    } else if exit.timed_out {
        Some(codes::EXEC_TIMEOUT)
    } else if grew(|u| u.oom_kills) && exit.signal == Some(SIGKILL) {
        Some(codes::EXEC_KILLED_OOM)
    } else if grew(|u| u.pids_max_hits) && exit.exit_code != Some(0) {
        // A fork refused at the pids limit is what brought the exec down.
        Some(codes::EXEC_KILLED_PIDS)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(oom_kills: u64, pids_max_hits: u64) -> Option<ExecCounters> {
        Some(ExecCounters {
            oom_kills,
            pids_max_hits,
        })
    }

    fn exit(exit_code: Option<i32>, signal: Option<i32>, timed_out: bool) -> proto::ExitInfo {
        proto::ExitInfo {
            exit_code,
            signal,
            timed_out,
            ..Default::default()
        }
    }

    #[test]
    fn a_normal_exit_has_no_verdict_even_with_a_failing_code() {
        assert_eq!(
            verdict(usage(0, 0), usage(0, 0), &exit(Some(1), None, false), false),
            None
        );
    }

    #[test]
    fn killed_and_timeout_win_over_counters() {
        let sigkill = exit(None, Some(SIGKILL), true);
        assert_eq!(
            verdict(usage(0, 0), usage(1, 1), &sigkill, true),
            Some(codes::EXEC_KILLED)
        );
        assert_eq!(
            verdict(usage(0, 0), usage(1, 1), &sigkill, false),
            Some(codes::EXEC_TIMEOUT)
        );
    }

    #[test]
    fn oom_needs_a_new_oom_kill_and_sigkill() {
        let sigkill = exit(None, Some(SIGKILL), false);
        assert_eq!(
            verdict(usage(2, 0), usage(3, 0), &sigkill, false),
            Some(codes::EXEC_KILLED_OOM)
        );
        // An OOM kill before this exec is not this exec's.
        assert_eq!(verdict(usage(3, 0), usage(3, 0), &sigkill, false), None);
        // Another signal is not an OOM kill.
        assert_eq!(
            verdict(
                usage(2, 0),
                usage(3, 0),
                &exit(None, Some(15), false),
                false
            ),
            None
        );
        // Without both readings nothing is attributed.
        assert_eq!(verdict(None, usage(3, 0), &sigkill, false), None);
    }

    #[test]
    fn pids_needs_a_new_limit_hit_and_a_failure() {
        let failed = exit(Some(1), None, false);
        assert_eq!(
            verdict(usage(0, 4), usage(0, 5), &failed, false),
            Some(codes::EXEC_KILLED_PIDS)
        );
        assert_eq!(
            verdict(usage(0, 4), usage(0, 5), &exit(Some(0), None, false), false),
            None
        );
        assert_eq!(verdict(usage(0, 5), None, &failed, false), None);
    }

    /// Where the counters after an exec are not read, no reading could have changed its verdict.
    #[test]
    fn skipping_the_reading_after_never_changes_a_verdict() {
        let exits = [
            exit(Some(0), None, false),
            exit(Some(1), None, false),
            exit(Some(3), None, true),
            exit(None, Some(SIGKILL), false),
            exit(None, Some(SIGKILL), true),
            exit(None, Some(15), false),
            exit(Some(0), None, true),
        ];
        let readings = [None, usage(0, 0), usage(1, 0), usage(0, 1), usage(1, 1)];
        let mut skipped = 0;
        for e in &exits {
            for killed in [false, true] {
                if needs_counters(e, killed) {
                    continue;
                }
                skipped += 1;
                for before in readings {
                    for after in readings {
                        assert_eq!(
                            verdict(before, after, e, killed),
                            verdict(before, None, e, killed),
                            "{e:?} killed={killed} {before:?} -> {after:?}"
                        );
                    }
                }
            }
        }
        // The common case, a clean exit, is among them.
        assert!(!needs_counters(&exit(Some(0), None, false), false));
        assert!(skipped >= 8, "{skipped}");
    }
}
