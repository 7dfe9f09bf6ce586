//! The tenant's secrets (`/v1/sandbox/secrets`) and their binding to a new session.

use koder_api_types::{CreateSecret, Secret};
use koder_auth::Identity;
use koder_store::SecretRecord;

use super::Manager;
use crate::secrets::{aad, validate, Binding, Bindings, SealKey, SecretsConfig};
use crate::tls::SessionCa;
use crate::Error;

impl Manager {
    fn secrets_config(&self) -> Result<&SecretsConfig, Error> {
        self.cfg.secrets.as_ref().ok_or_else(|| {
            Error::NotImplemented("this server has no secrets key ([secrets] key_file)".into())
        })
    }

    fn seal_key(&self) -> Result<&SealKey, Error> {
        Ok(&self.secrets_config()?.key)
    }

    /// Creates or replaces the tenant's secret; the value is sealed before it is stored.
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

    /// Sessions already bound to it keep what they were given.
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
    ) -> Result<Bindings, Error> {
        let mut bound = Vec::new();
        for name in names {
            if bound
                .iter()
                .any(|b: &std::sync::Arc<Binding>| &b.name == name)
            {
                return Err(Error::InvalidArgument(format!(
                    "secret {name:?} is named twice"
                )));
            }
            let record = self
                .store
                .get_secret(&who.tenant_id, name)
                .await?
                .ok_or_else(|| Error::SecretNotFound(name.clone()))?;
            let value = self
                .seal_key()?
                .open(&aad(&who.tenant_id, name), &record.sealed)?;
            let value = String::from_utf8(value)
                .map_err(|_| Error::Internal("a stored secret is not UTF-8".into()))?;
            let hosts = record
                .hosts
                .iter()
                .map(|h| h.parse().map_err(Error::from))
                .collect::<Result<_, _>>()?;
            bound.push(std::sync::Arc::new(Binding::new(
                name.clone(),
                value,
                hosts,
            )));
        }
        let ca = match bound.is_empty() {
            true => None,
            false => Some(std::sync::Arc::new(SessionCa::new(
                self.secrets_config()?.upstreams.clone(),
            )?)),
        };
        Ok(Bindings(bound, ca))
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
