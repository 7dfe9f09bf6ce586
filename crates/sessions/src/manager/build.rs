//! Sandboxes for image builds (`koder-build`): jails like every session's, on a build's base
//! image with the earlier steps' layers stacked on it (id-mapped, as a restored snapshot's, so
//! a step may change what an earlier one made), with network `open` and the build-only exemptions of `[images]
//! build_internal`. They are no sessions: no tenant, no record; their egress is audited under
//! the build's label, and a daemon restart reconciles them away with every other sandbox.

use std::sync::Arc;

use koder_netpolicy::{Mode, Policy};
use koder_runtime::{Sandbox, SandboxSpec};

use super::Manager;
use crate::{limits, Error};

impl Manager {
    /// A fresh sandbox on `image` (a digest of the image store) with `layers` (layer files,
    /// bottom first: the earlier steps') stacked on it, with open egress, audited as `label`.
    /// The caller destroys it.
    pub async fn build_sandbox(
        &self,
        image: &str,
        layers: Vec<std::path::PathBuf>,
        label: &str,
    ) -> Result<Arc<dyn Sandbox>, Error> {
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
            layers,
            volumes: Vec::new(),
        };
        let sandbox = self.runtime.create(spec).await?;
        crate::egress::start_unrecorded(
            (&self.store, &self.metrics),
            &net,
            sandbox.agent(),
            label,
            policy,
        )
        .await;
        Ok(sandbox)
    }
}
