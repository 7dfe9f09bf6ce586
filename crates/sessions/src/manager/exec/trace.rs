//! An exec's spans: the daemon's `exec` span, open from the request to the exec's end (for a
//! followed exec that is long after the HTTP answer started), and its child `sandbox.exec`,
//! what the agent timed inside the sandbox, exported by the daemon on the agent's behalf (the
//! agent has no way to a collector). The agent's durations are placed on the daemon's clock by
//! the moment its answer arrived and kept within the exec, so neither a guest's clock nor a
//! subverted agent can move the span out of its parent.

use std::time::{Duration, SystemTime};

use koder_agent_protocol as proto;
use koder_telemetry::RemoteChild;
use tracing::field::Empty;

use crate::session::Live;

/// How an exec was asked for, on its span.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Mode {
    /// Answered with its whole result.
    Awaited,
    /// Streamed to its caller as it runs.
    Streamed,
    /// Runs on its own, followed later.
    Background,
    /// Code run in an interpreter context.
    Context,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Awaited => "awaited",
            Mode::Streamed => "streamed",
            Mode::Background => "background",
            Mode::Context => "context",
        }
    }
}

/// One exec's tracing, from its request to its end.
pub(crate) struct ExecTrace {
    span: tracing::Span,
    sandbox: Option<(RemoteChild, SystemTime)>,
}

impl ExecTrace {
    /// The `exec` span, a child of the current one (the request's); the session's sandbox is
    /// named on it once found ([`ExecTrace::on`]).
    pub(crate) fn start(mode: Mode, tenant: &str, session: &str) -> Self {
        let span = tracing::info_span!(
            "exec",
            mode = mode.as_str(),
            tenant = %tenant,
            session = %session,
            runtime = Empty,
            image = Empty,
            verdict = Empty,
            exit_code = Empty,
            signal = Empty,
            duration_ms = Empty,
            peak_memory_kib = Empty,
        );
        Self {
            span,
            sandbox: None,
        }
    }

    pub(crate) fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// The sandbox the exec runs in.
    pub(crate) fn on(&self, live: &Live) {
        self.span.record("runtime", live.runtime.as_str());
        self.span.record("image", live.image.as_str());
    }

    /// The trace context handed to the agent with the exec (none when this exec is not
    /// exported); from now on the in-sandbox span's clock runs.
    pub(crate) fn agent_context(&mut self) -> Option<proto::TraceContext> {
        let child = RemoteChild::of(&self.span)?;
        let (trace_id, span_id) = child.ids();
        self.sandbox = Some((child, SystemTime::now()));
        Some(proto::TraceContext {
            trace_id,
            span_id,
            sampled: true,
        })
    }

    /// The agent reported the exec's end just now: exports the in-sandbox span.
    pub(crate) fn agent_exited(&mut self, exit: &proto::ExitInfo) {
        let mut attrs = Vec::new();
        if let Some(pid) = exit.pid {
            attrs.push(("process.pid", i64::from(pid)));
        }
        if let Some(code) = exit.exit_code {
            attrs.push(("exit_code", i64::from(code)));
        }
        self.export_inside("sandbox.exec", &exit.timing, attrs);
    }

    /// The agent reported a context run's end just now: exports the in-sandbox span (the
    /// interpreter's work on the run; the interpreter itself outlives it).
    pub(crate) fn agent_ran(&mut self, outcome: &proto::RunOutcome) {
        let attrs = vec![
            ("execution_count", saturating(outcome.execution_count)),
            ("restarted", i64::from(outcome.restarted)),
        ];
        self.export_inside("sandbox.run", &outcome.timing, attrs);
    }

    fn export_inside(
        &mut self,
        name: &'static str,
        t: &proto::ExecTiming,
        mut attrs: Vec<(&'static str, i64)>,
    ) {
        let Some((child, sent)) = self.sandbox.take() else {
            return;
        };
        attrs.extend([
            ("spawn_us", saturating(t.spawn_us)),
            ("wall_us", saturating(t.run_us)),
        ]);
        child.export(name, placed(sent, SystemTime::now(), t), &attrs);
    }

    /// Records how the exec ended (its span closes when this is dropped).
    pub(crate) fn finish(&self, end: End) {
        let span = &self.span;
        span.record("verdict", end.verdict.unwrap_or("ok"));
        if let Some(code) = end.exit_code {
            span.record("exit_code", code);
        }
        if let Some(signal) = end.signal {
            span.record("signal", signal);
        }
        span.record("duration_ms", end.duration_ms);
        if let Some(kib) = end.peak_memory_kib {
            span.record("peak_memory_kib", kib);
        }
        // The exporter ends a span at its last exit: this one is the exec's end, whenever and
        // wherever (a followed exec's own task) the span was last entered.
        drop(span.enter());
    }
}

/// How an exec ended, for its span.
pub(crate) struct End {
    pub verdict: Option<&'static str>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub duration_ms: u64,
    pub peak_memory_kib: Option<u64>,
}

impl End {
    pub(crate) fn of_exit(
        exit: &proto::ExitInfo,
        verdict: Option<&'static str>,
        peak_memory_kib: Option<u64>,
    ) -> Self {
        Self {
            verdict,
            exit_code: exit.exit_code,
            signal: exit.signal,
            duration_ms: exit.duration_ms,
            peak_memory_kib,
        }
    }
}

fn saturating(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Where the agent's work lies on the daemon's clock: it ended `since_exit_us` before its
/// answer arrived (`received`) and began `spawn_us + run_us` before that, never before the
/// request was sent (`sent`).
fn placed(
    sent: SystemTime,
    received: SystemTime,
    t: &proto::ExecTiming,
) -> (SystemTime, SystemTime) {
    let back = |from: SystemTime, us: u64| {
        from.checked_sub(Duration::from_micros(us))
            .map_or(sent, |at| at.max(sent))
    };
    let end = back(received, t.since_exit_us);
    let start = back(end, t.spawn_us.saturating_add(t.run_us));
    (start, end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(spawn_us: u64, run_us: u64, since_exit_us: u64) -> proto::ExecTiming {
        proto::ExecTiming {
            spawn_us,
            run_us,
            since_exit_us,
        }
    }

    #[test]
    fn the_agents_work_ends_before_its_answer_and_spans_spawn_and_run() {
        let sent = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let received = sent + Duration::from_millis(500);
        let (start, end) = placed(sent, received, &timing(1_000, 400_000, 20_000));
        assert_eq!(end, received - Duration::from_millis(20));
        assert_eq!(start, end - Duration::from_millis(401));
    }

    #[test]
    fn durations_beyond_the_exec_are_cut_to_it() {
        let sent = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let received = sent + Duration::from_millis(10);
        // A guest claiming more time than the exec took (or a subverted agent's nonsense).
        let (start, end) = placed(sent, received, &timing(u64::MAX, u64::MAX, 5_000));
        assert_eq!((start, end), (sent, received - Duration::from_millis(5)));
        let (start, end) = placed(sent, received, &timing(0, 0, u64::MAX));
        assert_eq!((start, end), (sent, sent));
    }
}
