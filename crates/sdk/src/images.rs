//! Images: `GET /v1/sandbox/images[/{name}]`, `DELETE /v1/sandbox/images/{name}` (admin key).

use reqwest::Method;

use crate::{decode, types, Client, Result};

impl Client {
    /// `GET /v1/sandbox/images`: `host` first, then the store's images.
    pub async fn list_images(&self) -> Result<types::ImageList> {
        let url = self.url(&["v1", "sandbox", "images"])?;
        decode(self.send(self.request(Method::GET, url)).await?).await
    }

    /// `GET /v1/sandbox/images/{name}` (a name, `host` or a digest).
    pub async fn image(&self, name: &str) -> Result<types::Image> {
        let url = self.url(&["v1", "sandbox", "images", name])?;
        decode(self.send(self.request(Method::GET, url)).await?).await
    }

    /// `DELETE /v1/sandbox/images/{name}`; needs an admin key. Returns what was deleted.
    pub async fn delete_image(&self, name: &str) -> Result<types::Image> {
        let url = self.url(&["v1", "sandbox", "images", name])?;
        decode(self.send(self.request(Method::DELETE, url)).await?).await
    }
}
