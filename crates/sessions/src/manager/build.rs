//! Sandboxes for image builds (`koder-build`): jails like every session's, on a build step's
//! parent image, with network `open` and the build-only exemptions of `[images]
//! build_internal`. They are no sessions: no tenant, no record; their egress is audited under
//! the build's label, and a daemon restart reconciles them away with every other sandbox.

use std::sync::Arc;

use koder_netpolicy::{Mode, Policy};
use koder_runtime::{Sandbox, SandboxSpec};

use super::Manager;
use crate::{limits, Error};

impl Manager {
    /// A fresh sandbox on `image` (a digest of the image store) with open egress, audited as
    /// `label`. The caller destroys it.
    pub async fn build_sandbox(&self, image: &str, label: &str) -> Result<Arc<dyn Sandbox>, Error> {
        let mut net = self.cfg.network.clone();
        net.internal
            .extend(self.cfg.images.build_internal.iter().copied());
        let policy = Policy::build(Mode::Open, &[], &[], &net).await?;
        let spec = SandboxSpec {
            id: format!("b{}", uuid::Uuid::new_v4().simple()),
            image: image.into(),
            limits: limits::to_runtime_limits(&self.cfg.default_limits),
            env: Vec::new(),
            egress: true,
            layers: Vec::new(),
            volumes: Vec::new(),
        };
        let sandbox = self.runtime.create(spec).await?;
        crate::egress::start_unrecorded(&self.store, &net, sandbox.agent(), label, policy).await;
        Ok(sandbox)
    }
}
