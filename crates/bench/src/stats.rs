//! Latency samples and their percentiles (nearest rank, exact: every sample is kept).

use std::time::Duration;

use serde::Serialize;

/// Summary of a set of latency samples, in milliseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Summary {
    pub n: usize,
    pub min_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

impl Summary {
    /// `None` for an empty set.
    pub fn of(samples: &[Duration]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        let mean = ms.iter().sum::<f64>() / ms.len() as f64;
        Some(Summary {
            n: ms.len(),
            min_ms: ms[0],
            p50_ms: percentile(&ms, 50.0),
            p90_ms: percentile(&ms, 90.0),
            p95_ms: percentile(&ms, 95.0),
            p99_ms: percentile(&ms, 99.0),
            max_ms: ms[ms.len() - 1],
            mean_ms: mean,
        })
    }

    /// "p50 1.23 ms · p99 4.56 ms (n=100)".
    pub fn display(&self) -> String {
        format!(
            "p50 {} · p99 {} (n={})",
            fmt_ms(self.p50_ms),
            fmt_ms(self.p99_ms),
            self.n
        )
    }
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Milliseconds with a precision that suits their size.
pub fn fmt_ms(ms: f64) -> String {
    if ms < 1.0 {
        format!("{ms:.3} ms")
    } else if ms < 100.0 {
        format!("{ms:.2} ms")
    } else if ms < 10_000.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{:.1} s", ms / 1e3)
    }
}

pub fn mib(bytes: f64) -> f64 {
    bytes / (1024.0 * 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert_eq!(percentile(&[1.0, 2.0, 3.0], 50.0), 2.0);
    }

    #[test]
    fn summary() {
        let s: Vec<Duration> = [3, 1, 2]
            .iter()
            .map(|&m| Duration::from_millis(m))
            .collect();
        let sum = Summary::of(&s).expect("non-empty");
        assert_eq!(sum.n, 3);
        assert!((sum.p50_ms - 2.0).abs() < 1e-9);
        assert!((sum.max_ms - 3.0).abs() < 1e-9);
        assert!(Summary::of(&[]).is_none());
        assert_eq!(fmt_ms(0.5), "0.500 ms");
        assert_eq!(fmt_ms(12.345), "12.35 ms");
    }
}
