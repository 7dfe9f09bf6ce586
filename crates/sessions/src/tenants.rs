//! Tenant administration (operator endpoints): plans, quotas, keys, usage. Not tenancy of
//! sessions; callers are expected to have checked for an admin credential.

use chrono::Utc;
use koder_api_types::{IssuedKey, PutTenant, TenantInfo};
use koder_auth::Authenticator;
use koder_store::Tenant;

use crate::{Error, Manager};

const MAX_PLAN_NAME: usize = 64;

impl Manager {
    /// The daemons sharing the store, by id.
    pub async fn list_nodes(&self) -> Result<Vec<koder_api_types::NodeInfo>, Error> {
        Ok(self
            .store
            .list_nodes()
            .await?
            .into_iter()
            .map(|n| koder_api_types::NodeInfo {
                id: n.info.id,
                address: n.info.address,
                grpc_address: n.info.grpc_address,
                runtimes: n.info.runtimes,
                capacity_sandboxes: n.info.capacity_sandboxes,
                load_sandboxes: n.load_sandboxes,
                state: n.state.as_str().into(),
                started_at: n.started_at,
                heartbeat_at: n.heartbeat_at,
                down_at: n.down_at,
            })
            .collect())
    }

    pub async fn list_tenants(&self) -> Result<Vec<TenantInfo>, Error> {
        let all = self.store.list_tenants().await?;
        let mut out = Vec::with_capacity(all.len());
        for t in all {
            out.push(self.tenant_info(t).await?);
        }
        Ok(out)
    }

    pub async fn get_tenant(&self, id: &str) -> Result<TenantInfo, Error> {
        let t = self.tenant(id).await?;
        self.tenant_info(t).await
    }

    /// Creates or updates a tenant; an update keeps the name (unless given) and creation time.
    pub async fn put_tenant(&self, id: &str, req: PutTenant) -> Result<TenantInfo, Error> {
        if !koder_auth::valid_tenant(id) {
            return Err(Error::InvalidArgument(
                "tenant id: 1-64 characters of [A-Za-z0-9_-]".into(),
            ));
        }
        if req.plan.is_empty() || req.plan.len() > MAX_PLAN_NAME {
            return Err(Error::InvalidArgument(format!(
                "plan must be 1-{MAX_PLAN_NAME} characters"
            )));
        }
        let existing = self.store.get_tenant(id).await?;
        let t = Tenant {
            name: req
                .name
                .or_else(|| existing.as_ref().map(|t| t.name.clone()))
                .unwrap_or_else(|| id.to_string()),
            created_at: existing.map_or_else(Utc::now, |t| t.created_at),
            id: id.to_string(),
            plan: req.plan,
            max_sessions: req.max_sessions,
            daily_session_minutes: req.daily_session_minutes,
        };
        self.store.upsert_tenant(&t).await?;
        self.tenant_info(t).await
    }

    /// A new API key of the tenant, stored hashed and usable at once (`auth` checks its own
    /// table on every request, not the store); the key itself is only in the answer. Refused
    /// (conflict) where `auth` takes no static keys (`env = "prod"`): tenants use JWTs there.
    pub async fn issue_key(&self, auth: &Authenticator, id: &str) -> Result<IssuedKey, Error> {
        if !auth.static_keys_enabled() {
            return Err(Error::Conflict(
                "static API keys are disabled on this server (env = \"prod\"): tenants use JWTs"
                    .into(),
            ));
        }
        let t = self.tenant(id).await?;
        let key = koder_auth::generate_key();
        let hash = koder_auth::hash_key(&key);
        self.store.put_api_key(&hash, &t.id, "issued").await?;
        auth.insert_key(hash, t.id.clone());
        Ok(IssuedKey {
            tenant_id: t.id,
            api_key: key,
        })
    }

    async fn tenant(&self, id: &str) -> Result<Tenant, Error> {
        self.store
            .get_tenant(id)
            .await?
            .ok_or_else(|| Error::TenantNotFound(format!("no tenant {id:?}")))
    }

    async fn tenant_info(&self, t: Tenant) -> Result<TenantInfo, Error> {
        let (live, minutes) = self.tenant_usage(&t.id).await?;
        Ok(TenantInfo {
            id: t.id,
            name: t.name,
            plan: t.plan,
            max_sessions: t.max_sessions,
            daily_session_minutes: t.daily_session_minutes,
            created_at: t.created_at,
            live_sessions: live,
            session_minutes_today: minutes,
        })
    }
}
