//! The E2B adapter's state: the native API's state, the session configuration, the key of the
//! envd access tokens and what E2B keeps per sandbox beyond the session manager.

use std::collections::HashMap;
use std::sync::Arc;

use hmac::{Hmac, Mac};
use koder_http::AppState;
use koder_sessions::{Manager, SessionConfig};
use parking_lot::Mutex;
use sha2::Sha256;

use crate::control::cpu::CpuSample;
use crate::control::templates::{TemplateBuild, TemplateLimits};
use crate::envd::sandbox::SandboxCtx;

/// The E2B adapter's state: the native API's state plus what only E2B needs.
#[derive(Clone)]
pub struct E2b {
    inner: Arc<Inner>,
}

struct Inner {
    app: AppState,
    sessions: SessionConfig,
    /// Keys the derivation of envd and volume tokens. It outlives a restart (the daemon keeps
    /// it in its data dir): paused sandboxes and volumes do, and their clients keep the tokens.
    token_secret: [u8; 32],
    /// Per-sandbox envd state: processes started through E2B, watchers, interpreter contexts.
    sandboxes: Mutex<HashMap<String, Arc<SandboxCtx>>>,
    /// The previous CPU reading per sandbox, so a metrics sample reports current use.
    cpu_samples: Mutex<HashMap<String, CpuSample>>,
    /// Template builds by E2B build id (in memory, as the builds they run: the images they
    /// make last).
    template_builds: Mutex<HashMap<String, Arc<TemplateBuild>>>,
    /// The sandbox domain (`[e2b] domain`): answered on create and connect, and the names
    /// `<port>-<id>.<domain>` are routed to that port of that sandbox ([`crate::host`]).
    domain: Option<String>,
    /// What tenants' templates and their uploads may hold, and how long uploads are kept.
    templates: TemplateLimits,
    /// Held while a template build is admitted or an upload kept: each checks a tenant's
    /// bound and then adds to what it counts, so two at once could pass it together.
    template_room: Mutex<()>,
}

impl E2b {
    /// `sessions` is the configuration the manager runs with (timeouts the E2B defaults map to);
    /// `token_secret` keys every token this adapter hands out; `domain` is the sandbox domain
    /// served by host name, if any; `templates` bounds the tenants' templates and uploads.
    pub fn new(
        app: AppState,
        sessions: SessionConfig,
        token_secret: [u8; 32],
        domain: Option<String>,
        templates: TemplateLimits,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                app,
                sessions,
                token_secret,
                sandboxes: Mutex::default(),
                cpu_samples: Mutex::default(),
                template_builds: Mutex::default(),
                domain,
                templates,
                template_room: Mutex::new(()),
            }),
        }
    }

    pub(crate) fn template_limits(&self) -> TemplateLimits {
        self.inner.templates
    }

    /// See `Inner::template_room`.
    pub(crate) fn template_room(&self) -> &Mutex<()> {
        &self.inner.template_room
    }

    /// Removes every tenant's expired template uploads now and every `every` after, for as
    /// long as the runtime runs.
    pub fn sweep_template_files_every(&self, every: std::time::Duration) {
        let e2b = self.clone();
        tokio::spawn(async move {
            loop {
                let round = e2b.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    crate::control::templates::sweep_files(&round)
                })
                .await;
                tokio::time::sleep(every).await;
            }
        });
    }

    pub(crate) fn domain(&self) -> Option<&str> {
        self.inner.domain.as_deref()
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
    /// can check it, and a sandbox resumed after a restart keeps its token.
    pub fn envd_token(&self, id: &str) -> String {
        hex::encode(hmac_sha256(&self.inner.token_secret, id.as_bytes()))
    }

    /// The content token of a volume: derived like envd tokens, in a domain of its own so a
    /// sandbox's token never opens a volume of the same id.
    pub fn volume_token(&self, id: &str) -> String {
        let msg = format!("volume:{id}");
        hex::encode(hmac_sha256(&self.inner.token_secret, msg.as_bytes()))
    }

    /// The prefix of a tenant's template images in the image store: keyed like tokens, so
    /// no tenant can name (or guess) another's.
    pub(crate) fn template_namespace(&self, tenant: &str) -> String {
        let msg = format!("template-namespace:{tenant}");
        hex::encode(&hmac_sha256(&self.inner.token_secret, msg.as_bytes())[..8])
    }

    /// The signature of a template file upload URL (`msg` names what it may upload, until when).
    pub(crate) fn upload_signature(&self, msg: &str) -> String {
        let msg = format!("template-upload:{msg}");
        hex::encode(hmac_sha256(&self.inner.token_secret, msg.as_bytes()))
    }

    pub(crate) fn template_builds(&self) -> &Mutex<HashMap<String, Arc<TemplateBuild>>> {
        &self.inner.template_builds
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

fn hmac_sha256(key: &[u8; 32], msg: &[u8]) -> [u8; 32] {
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(msg);
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231() {
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
