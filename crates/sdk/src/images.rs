//! Images: `GET /v1/sandbox/images[/{name}]`, `DELETE /v1/sandbox/images/{name}` (admin key),
//! builds from template specs (`/v1/sandbox/images/builds`, admin key).

use futures::Stream;
use reqwest::Method;

use crate::live::decoded_events;
use crate::{decode, types, Client, Error, Result};

/// One event of a build's log stream.
#[derive(Debug, Clone, PartialEq)]
pub enum BuildEvent {
    Line(String),
    /// The build ended; the stream ends after it.
    Done(Box<types::Build>),
}

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

    /// `POST /v1/sandbox/images/builds?name=`: queues a build of `spec` (TOML, files inline);
    /// needs an admin key.
    pub async fn submit_build(&self, spec: String, name: &str) -> Result<types::Build> {
        let mut url = self.url(&["v1", "sandbox", "images", "builds"])?;
        url.query_pairs_mut().append_pair("name", name);
        let req = self
            .request(Method::POST, url)
            .header(reqwest::header::CONTENT_TYPE, "application/toml")
            .body(spec);
        decode(self.send(req).await?).await
    }

    /// `GET /v1/sandbox/images/builds/{id}`.
    pub async fn build_status(&self, id: &str) -> Result<types::Build> {
        let url = self.url(&["v1", "sandbox", "images", "builds", id])?;
        decode(self.send(self.request(Method::GET, url)).await?).await
    }

    /// `GET /v1/sandbox/images/builds/{id}/logs`: the log so far, then as it is written,
    /// ending with the final status.
    pub async fn follow_build(&self, id: &str) -> Result<impl Stream<Item = Result<BuildEvent>>> {
        let url = self.url(&["v1", "sandbox", "images", "builds", id, "logs"])?;
        let resp = self.send(self.request(Method::GET, url)).await?;
        Ok(decoded_events(resp.bytes_stream(), build_event, |ev| {
            matches!(ev, BuildEvent::Line(_))
        }))
    }
}

fn build_event(event: &str, data: &str) -> Option<Result<BuildEvent>> {
    let bad = |e: serde_json::Error| Error::Decode(format!("build {event} event: {e}"));
    match event {
        "log" => Some(
            serde_json::from_str::<serde_json::Value>(data)
                .map_err(bad)
                .map(|v| BuildEvent::Line(v["line"].as_str().unwrap_or_default().into())),
        ),
        "done" => Some(
            serde_json::from_str(data)
                .map_err(bad)
                .map(|b| BuildEvent::Done(Box::new(b))),
        ),
        _ => None,
    }
}
