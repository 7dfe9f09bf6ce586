//! The tenant's secrets (`/v1/sandbox/secrets`) and their binding to a new session, with
//! E2B's header rules (`network.rules`) and the E2B secrets they name.

use koder_api_types::{CreateSecret, Network, Secret, Session};
use koder_auth::Identity;
use koder_store::SecretRecord;
use std::sync::Arc;

use super::Manager;
use crate::header_rules::{self, HeaderRule, HeaderRules};
use crate::secrets::{aad, validate, Binding, Bindings, SealKey, SecretsConfig, Source, Vault};
use crate::tls::SessionCa;
use crate::Error;

impl Manager {
    fn secrets_config(&self) -> Result<&SecretsConfig, Error> {
        self.cfg.secrets.as_ref().ok_or_else(|| {
            Error::NotImplemented("this server has no secrets key ([secrets] key_file)".into())
        })
    }

    pub(super) fn seal_key(&self) -> Result<&SealKey, Error> {
        Ok(&self.secrets_config()?.key)
    }

    /// The tenants' secrets, opened with the server's key.
    pub(super) fn vault(&self) -> Result<Vault, Error> {
        Ok(Vault::new(self.store.clone(), self.seal_key()?.clone()))
    }

    /// Creates or replaces the tenant's secret; the value is sealed before it is stored. A
    /// replaced one reaches the sessions bound to it at their next connection.
    pub async fn put_secret(&self, who: &Identity, req: CreateSecret) -> Result<Secret, Error> {
        validate(&req)?;
        let sealed = self
            .seal_key()?
            .seal(&aad(&who.tenant_id, &req.name), req.value.as_bytes())?;
        let record = SecretRecord {
            tenant_id: who.tenant_id.clone(),
            name: req.name,
            sealed,
            hosts: req.hosts,
            created_at: self.now(),
        };
        self.store.put_secret(&record).await?;
        Ok(shown(record))
    }

    pub async fn list_secrets(&self, who: &Identity) -> Result<Vec<Secret>, Error> {
        let records = self.store.list_secrets(&who.tenant_id).await?;
        Ok(records.into_iter().map(shown).collect())
    }

    /// Sessions bound to it inject it no more from their next connection on.
    pub async fn delete_secret(&self, who: &Identity, name: &str) -> Result<(), Error> {
        if self.store.delete_secret(&who.tenant_id, name).await? {
            Ok(())
        } else {
            Err(Error::SecretNotFound(name.into()))
        }
    }

    /// The tenant's secrets of these names opened for a new session, each with a fresh
    /// placeholder.
    pub(super) async fn bind_secrets(
        &self,
        who: &Identity,
        names: &[String],
    ) -> Result<Vec<Arc<Binding>>, Error> {
        let mut bound: Vec<Arc<Binding>> = Vec::new();
        for name in names {
            if bound.iter().any(|b| &b.name == name) {
                return Err(Error::InvalidArgument(format!(
                    "secret {name:?} is named twice"
                )));
            }
            let binding = self
                .open_binding(&who.tenant_id, name, None)
                .await?
                .ok_or_else(|| Error::SecretNotFound(name.clone()))?;
            bound.push(Arc::new(binding));
        }
        Ok(bound)
    }

    /// E2B's header rules checked, each with the tenant's E2B secrets its values name opened.
    /// A secret that does not exist is a 400 when `strict` (a create, an update); otherwise
    /// (a session running again) its placeholder stays as it is, which leaks nothing.
    pub(super) async fn resolve_rules(
        &self,
        tenant_id: &str,
        rules: &HeaderRules,
        strict: bool,
    ) -> Result<Vec<Arc<HeaderRule>>, Error> {
        let mut resolved = Vec::new();
        for checked in header_rules::check(rules)? {
            let mut secrets = Vec::new();
            for (placeholder, name) in &checked.placeholders {
                match self.vault()?.e2b(tenant_id, name).await? {
                    Some(value) => secrets.push(Arc::new(
                        Binding::new(
                            format!("e2b.secrets.{name}"),
                            value,
                            Vec::new(),
                            Some(placeholder.clone()),
                        )
                        .stored_as(Source::E2b(name.clone())),
                    )),
                    None if strict => {
                        return Err(Error::InvalidArgument(format!(
                            "network.rules: {placeholder} names no secret of this team (Secret.create it first)"
                        )))
                    }
                    None => {}
                }
            }
            resolved.push(Arc::new(HeaderRule::new(checked, secrets)));
        }
        Ok(resolved)
    }

    /// The tenant's secret `name` opened for a session; `None` when it is gone.
    async fn open_binding(
        &self,
        tenant_id: &str,
        name: &str,
        placeholder: Option<String>,
    ) -> Result<Option<Binding>, Error> {
        let Some((value, hosts)) = self.vault()?.native(tenant_id, name).await? else {
            return Ok(None);
        };
        let binding = Binding::new(name.into(), value, hosts, placeholder);
        Ok(Some(binding.stored_as(Source::Native)))
    }

    /// The bindings of a session, with a new CA when it has anything to inject.
    pub(super) fn with_ca(
        &self,
        bound: Vec<Arc<Binding>>,
        rules: Vec<Arc<HeaderRule>>,
    ) -> Result<Bindings, Error> {
        let ca = match bound.is_empty() && rules.is_empty() {
            true => None,
            false => Some(Arc::new(SessionCa::new(
                self.secrets_config()?.upstreams.clone(),
            )?)),
        };
        Ok(Bindings { bound, rules, ca })
    }

    /// Records which secrets (by name) the new session `id` got, and as which placeholders.
    pub(super) async fn record_bindings(&self, id: &str, secrets: &Bindings) -> Result<(), Error> {
        let pairs: Vec<(String, String)> = secrets
            .bound
            .iter()
            .map(|b| (b.name.clone(), b.placeholder.clone()))
            .collect();
        if !pairs.is_empty() {
            self.store.put_secret_bindings(id, &pairs).await?;
        }
        Ok(())
    }

    /// Gives the session `id` the secrets `from` was bound to, as the same placeholders (a
    /// fork's environment is its source's), and its header rules.
    pub(super) async fn copy_bindings(&self, from: &str, id: &str) -> Result<(), Error> {
        let pairs = self.store.secret_bindings(from).await?;
        if !pairs.is_empty() {
            self.store.put_secret_bindings(id, &pairs).await?;
        }
        let rules = self.store.header_rules(from).await?;
        if !rules.is_empty() {
            self.store.set_header_rules(id, &rules).await?;
        }
        Ok(())
    }

    /// E2B's network update: the session's policy replaced (as `set_network`) and its header
    /// rules with it (rules left out are cleared), applied to its next connection. A session
    /// created with nothing to inject has no CA its programs trust (the environment pointing
    /// at it is set at create), so rules cannot start there. The rules are checked before
    /// anything changes.
    pub async fn set_network_and_rules(
        &self,
        who: &Identity,
        id: &str,
        network: Network,
        rules: HeaderRules,
    ) -> Result<Session, Error> {
        // The tenant's session, or 404 before anything is said of it.
        self.record(who, id).await?;
        let resolved = self.resolve_rules(&who.tenant_id, &rules, true).await?;
        let live = self.live.lock().get(id).cloned();
        let current = live.as_ref().and_then(|l| l.secrets.read().clone());
        if !resolved.is_empty() && !self.trusts_its_ca(id, current.as_deref()).await? {
            return Err(Error::Conflict(
                "network.rules can be set only on a sandbox created with rules (or secrets): \
                 its programs trust the CA that serves them from its start"
                    .into(),
            ));
        }
        let session = self.set_network(who, id, network).await?;
        // Not running: applied when it runs again.
        self.store.set_header_rules(id, &rules).await?;
        if let (Some(live), Some(current)) = (live, current) {
            *live.secrets.write() = Some(Arc::new(Bindings {
                bound: current.bound.clone(),
                rules: resolved,
                ca: current.ca.clone(),
            }));
        }
        Ok(session)
    }

    /// Whether the session's programs trust a session CA: it was made with something to
    /// inject (the environment pointing at the CA is set at create).
    async fn trusts_its_ca(&self, id: &str, current: Option<&Bindings>) -> Result<bool, Error> {
        Ok(current.is_some_and(|b| b.ca.is_some())
            || !self.store.secret_bindings(id).await?.is_empty()
            || !self.store.header_rules(id).await?.is_empty())
    }

    /// Injects a session's recorded secrets again once it runs on a new sandbox (resumed from
    /// disk or from a saved VM, restored, forked, after a restart): the same placeholders, the
    /// current values (a secret deleted meanwhile is not injected any more), a new CA whose
    /// trust files replace the old ones. Failing, the session runs on with its placeholders
    /// and nothing injected, which leaks nothing.
    pub(super) async fn rebind_secrets(&self, tenant_id: &str, id: &str) {
        // Boxed: the trust files go in through `upload`, which may resume a session itself.
        if let Err(e) = Box::pin(self.try_rebind(tenant_id, id)).await {
            tracing::warn!(session = %id, error = %e, "the session's secrets are not injected again");
        }
    }

    async fn try_rebind(&self, tenant_id: &str, id: &str) -> Result<(), Error> {
        let pairs = self.store.secret_bindings(id).await?;
        let rules = self.store.header_rules(id).await?;
        if pairs.is_empty() && rules.is_empty() {
            return Ok(());
        }
        let mut bound = Vec::new();
        for (name, placeholder) in pairs {
            match self
                .open_binding(tenant_id, &name, Some(placeholder))
                .await?
            {
                Some(b) => bound.push(Arc::new(b)),
                None => {
                    tracing::info!(session = %id, secret = %name, "a bound secret was deleted: not injected")
                }
            }
        }
        let rules = self.resolve_rules(tenant_id, &rules, false).await?;
        let secrets = self.with_ca(bound, rules)?;
        let who = Identity {
            tenant_id: tenant_id.into(),
        };
        if let Some(ca) = &secrets.ca {
            self.install_trust(&who, id, ca).await?;
        }
        let live = self.live.lock().get(id).cloned();
        if let Some(live) = live {
            *live.secrets.write() = Some(Arc::new(secrets));
        }
        Ok(())
    }

    /// Makes the new session trust its CA: the files its environment points at.
    pub(super) async fn install_trust(
        &self,
        who: &Identity,
        id: &str,
        ca: &SessionCa,
    ) -> Result<(), Error> {
        for (path, bytes) in ca.trust_files() {
            let len = bytes.len() as u64;
            let body = futures::stream::iter([Ok::<_, std::convert::Infallible>(
                bytes::Bytes::from(bytes),
            )]);
            self.upload(who, id, path, Some(len), body, None).await?;
        }
        Ok(())
    }
}

fn shown(r: SecretRecord) -> Secret {
    Secret {
        name: r.name,
        hosts: r.hosts,
        created_at: r.created_at,
    }
}
