//! The E2B adapter's state: the native API's state, the session configuration, the key of the
//! envd access tokens and what E2B keeps per sandbox beyond the session manager.

use std::collections::HashMap;
use std::sync::Arc;

use koder_http::AppState;
use koder_sessions::{Manager, SessionConfig};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use crate::control::cpu::CpuSample;
use crate::envd::sandbox::SandboxCtx;

/// The E2B adapter's state: the native API's state plus what only E2B needs.
#[derive(Clone)]
pub struct E2b {
    inner: Arc<Inner>,
}

struct Inner {
    app: AppState,
    sessions: SessionConfig,
    /// Keys the derivation of per-sandbox envd access tokens; new at every start, so tokens of
    /// a previous run (whose sandboxes are gone anyway) never verify.
    token_secret: [u8; 32],
    /// Per-sandbox envd state: processes started through E2B, watchers, interpreter contexts.
    sandboxes: Mutex<HashMap<String, Arc<SandboxCtx>>>,
    /// The previous CPU reading per sandbox, so a metrics sample reports current use.
    cpu_samples: Mutex<HashMap<String, CpuSample>>,
}

impl E2b {
    /// `sessions` is the configuration the manager runs with (timeouts the E2B defaults map to).
    pub fn new(app: AppState, sessions: SessionConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                app,
                sessions,
                token_secret: rand::random(),
                sandboxes: Mutex::default(),
                cpu_samples: Mutex::default(),
            }),
        }
    }

    pub(crate) fn manager(&self) -> &Arc<Manager> {
        &self.inner.app.manager
    }

    pub(crate) fn app(&self) -> &AppState {
        &self.inner.app
    }

    pub(crate) fn sessions_cfg(&self) -> &SessionConfig {
        &self.inner.sessions
    }

    /// The envd access token of a sandbox, derived rather than stored: any daemon component
    /// can check it and a restart (which ends every sandbox) invalidates all of them.
    pub fn envd_token(&self, id: &str) -> String {
        hex::encode(hmac_sha256(&self.inner.token_secret, id.as_bytes()))
    }

    /// The content token of a volume: derived like envd tokens, in a domain of its own so a
    /// sandbox's token never opens a volume of the same id.
    pub fn volume_token(&self, id: &str) -> String {
        let msg = format!("volume:{id}");
        hex::encode(hmac_sha256(&self.inner.token_secret, msg.as_bytes()))
    }

    pub(crate) fn ctx(&self, id: &str) -> Arc<SandboxCtx> {
        self.inner
            .sandboxes
            .lock()
            .entry(id.to_string())
            .or_default()
            .clone()
    }

    /// Records this CPU reading of a sandbox and returns the previous one.
    pub(crate) fn swap_cpu_sample(&self, id: &str, now: CpuSample) -> Option<CpuSample> {
        self.inner.cpu_samples.lock().insert(id.to_string(), now)
    }

    /// Drops what E2B kept for a sandbox that ended; its watchers stop with it.
    pub(crate) fn forget(&self, id: &str) {
        let gone = self.inner.sandboxes.lock().remove(id);
        if let Some(ctx) = gone {
            for (_, w) in ctx.watchers.lock().drain() {
                w.stop();
            }
        }
        self.inner.cpu_samples.lock().remove(id);
    }
}

/// HMAC-SHA256 (RFC 2104) with a key of at most one block.
fn hmac_sha256(key: &[u8; 32], msg: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    block[..32].copy_from_slice(key);
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(msg)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231_shape() {
        // RFC 4231 test case 2 uses a short key; with the key zero-padded to 32 bytes the
        // HMAC is unchanged (keys are zero-padded to the block size either way).
        let mut key = [0u8; 32];
        key[..4].copy_from_slice(b"Jefe");
        assert_eq!(
            hex::encode(hmac_sha256(&key, b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
