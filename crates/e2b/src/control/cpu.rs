//! CPU use between two metrics requests.

use std::time::Instant;

/// The last CPU reading of a sandbox.
#[derive(Debug, Clone, Copy)]
pub struct CpuSample {
    at: Instant,
    cpu_ms: u64,
}

impl CpuSample {
    pub fn now(cpu_ms: u64) -> Self {
        Self {
            at: Instant::now(),
            cpu_ms,
        }
    }

    /// Percent of `cpus` used since `previous`, or over `since_start_ms` without one.
    pub fn used_pct(self, previous: Option<CpuSample>, since_start_ms: f64, cpus: f64) -> f64 {
        let (cpu_ms, wall_ms) = match previous {
            Some(p) if self.at > p.at => (
                self.cpu_ms.saturating_sub(p.cpu_ms) as f64,
                self.at.duration_since(p.at).as_secs_f64() * 1000.0,
            ),
            _ => (self.cpu_ms as f64, since_start_ms),
        };
        (cpu_ms / (wall_ms * cpus) * 100.0).clamp(0.0, 100.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn use_since_the_previous_sample_or_the_start() {
        let first = CpuSample::now(500);
        assert_eq!(first.used_pct(None, 1000.0, 1.0), 50.0);
        assert_eq!(first.used_pct(None, 100.0, 1.0), 100.0);
        let later = CpuSample {
            at: first.at + Duration::from_secs(1),
            cpu_ms: 1500,
        };
        assert_eq!(later.used_pct(Some(first), 1.0, 2.0), 50.0);
    }
}
