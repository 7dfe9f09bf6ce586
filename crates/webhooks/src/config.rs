use std::time::Duration;

use serde::Deserialize;

/// `[webhooks]` of the daemon config.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebhookConfig {
    /// Allow targets the SSRF guard refuses (loopback, private, link-local ranges); for
    /// receivers on the operator's own network, and tests.
    pub allow_private: bool,
    /// Attempts per delivery before it is marked failed.
    pub max_attempts: u32,
    /// Wait before the second attempt, ms; doubled after every failure.
    pub backoff_initial_ms: u64,
    /// Longest wait between two attempts, seconds.
    pub backoff_max_s: u64,
    /// Time a receiver has to answer, seconds.
    pub timeout_s: u64,
    /// Endpoints per tenant.
    pub max_per_tenant: usize,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            allow_private: false,
            max_attempts: 10,
            backoff_initial_ms: 5_000,
            backoff_max_s: 3_600,
            timeout_s: 10,
            max_per_tenant: 20,
        }
    }
}

impl WebhookConfig {
    /// The wait after the `attempts`-th failed attempt (1-based).
    pub fn backoff(&self, attempts: u32) -> Duration {
        let factor = 2u64.saturating_pow(attempts.saturating_sub(1));
        let ms = self.backoff_initial_ms.saturating_mul(factor);
        Duration::from_millis(ms).min(Duration::from_secs(self.backoff_max_s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let cfg = WebhookConfig {
            backoff_initial_ms: 1_000,
            backoff_max_s: 5,
            ..Default::default()
        };
        let waits: Vec<u64> = (1..=5).map(|n| cfg.backoff(n).as_millis() as u64).collect();
        assert_eq!(waits, [1_000, 2_000, 4_000, 5_000, 5_000]);
        assert_eq!(cfg.backoff(200), Duration::from_secs(5));
    }
}
