//! Egress and notifications: a running session's network policy (`PUT .../network`), the
//! tenant's secrets injected at egress (`/v1/sandbox/secrets`) and its webhook endpoints
//! (`/v1/sandbox/webhooks`).

use reqwest::Method;

use crate::{decode, types, Client, Result, Session};

impl Client {
    /// `PUT /v1/sandbox/sessions/{id}/network`: the policy for the session's new connections
    /// (open ones keep going); answers the session with its new policy.
    pub async fn set_network(&self, id: &str, policy: &types::Network) -> Result<types::Session> {
        let url = self.session_url(id, &["network"])?;
        decode(
            self.send(self.request(Method::PUT, url).json(policy))
                .await?,
        )
        .await
    }

    /// `POST /v1/sandbox/secrets`: creates or replaces the tenant's secret of that name. The
    /// answer never carries the value.
    pub async fn put_secret(&self, req: &types::CreateSecret) -> Result<types::Secret> {
        let url = self.url(&["v1", "sandbox", "secrets"])?;
        decode(self.send(self.request(Method::POST, url).json(req)).await?).await
    }

    /// `GET /v1/sandbox/secrets`: names and hosts, never values.
    pub async fn list_secrets(&self) -> Result<Vec<types::Secret>> {
        let url = self.url(&["v1", "sandbox", "secrets"])?;
        let list: types::SecretList =
            decode(self.send(self.request(Method::GET, url)).await?).await?;
        Ok(list.secrets)
    }

    /// `DELETE /v1/sandbox/secrets/{name}`.
    pub async fn delete_secret(&self, name: &str) -> Result<()> {
        let url = self.url(&["v1", "sandbox", "secrets", name])?;
        self.send(self.request(Method::DELETE, url)).await?;
        Ok(())
    }

    /// `POST /v1/sandbox/webhooks`: the answer is the only one that shows the signing secret.
    pub async fn create_webhook(
        &self,
        req: &types::webhooks::CreateWebhook,
    ) -> Result<types::webhooks::Webhook> {
        let url = self.url(&["v1", "sandbox", "webhooks"])?;
        decode(self.send(self.request(Method::POST, url).json(req)).await?).await
    }

    /// `GET /v1/sandbox/webhooks`.
    pub async fn list_webhooks(&self) -> Result<Vec<types::webhooks::Webhook>> {
        let url = self.url(&["v1", "sandbox", "webhooks"])?;
        let list: types::webhooks::WebhookList =
            decode(self.send(self.request(Method::GET, url)).await?).await?;
        Ok(list.webhooks)
    }

    /// `DELETE /v1/sandbox/webhooks/{id}`.
    pub async fn delete_webhook(&self, id: &str) -> Result<()> {
        let url = self.url(&["v1", "sandbox", "webhooks", id])?;
        self.send(self.request(Method::DELETE, url)).await?;
        Ok(())
    }

    /// `GET /v1/sandbox/webhooks/{id}/deliveries`: newest first.
    pub async fn webhook_deliveries(&self, id: &str) -> Result<Vec<types::webhooks::Delivery>> {
        let url = self.url(&["v1", "sandbox", "webhooks", id, "deliveries"])?;
        let list: types::webhooks::DeliveryList =
            decode(self.send(self.request(Method::GET, url)).await?).await?;
        Ok(list.deliveries)
    }
}

impl Session {
    /// Changes the session's network policy (see [`Client::set_network`]).
    pub async fn set_network(&mut self, policy: &types::Network) -> Result<&types::Session> {
        self.info = self.client.set_network(&self.info.id, policy).await?;
        Ok(&self.info)
    }
}
