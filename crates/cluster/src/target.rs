//! Which session a request is for, read from the request line and headers alone (before any
//! surface parses it): a host name `<port>-<id>.<domain>` under the E2B sandbox domain (the
//! sandbox's own port: its path is the sandbox server's, never read as an API path), envd's
//! `E2b-Sandbox-Id` header, the native API's `/v1/sandbox/sessions/{id}/...`, E2B's control
//! plane `/sandboxes/{id}/...` and `/v2/sandboxes/{id}/...`; whether it creates one
//! (placement); or whether it belongs to an image build (the cluster's builder serves it).

use axum::http::{HeaderMap, Method, Uri};

/// The E2B header naming the sandbox an envd or interpreter request is for.
const E2B_SANDBOX_ID: &str = "e2b-sandbox-id";
/// Longer ids are no session's (sessions' ids are 32-33 characters).
const MAX_ID_LEN: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// An operation on this session.
    Session(String),
    /// A native create (`POST /v1/sandbox/sessions`): its JSON body names the runtime.
    NativeCreate,
    /// An E2B create (`POST /sandboxes`, `/v2/sandboxes`): always a jail.
    E2bCreate,
    /// Part of an image build ([`is_build`]): the cluster's builder node serves it.
    Build,
    /// An operation on this volume (native `/v1/sandbox/volumes/{id or name}/...`, E2B's
    /// `/volumes/{id}` and `/volumecontent/{id}/...`): the node holding its data serves it.
    Volume(String),
    /// A native volume create (`POST /v1/sandbox/volumes`): a copy is made where its source is.
    VolumeCreate,
    /// Nothing a node in particular must serve.
    Any,
}

pub fn of(method: &Method, uri: &Uri, headers: &HeaderMap, e2b_domain: Option<&str>) -> Target {
    if let Some(id) = e2b_domain.and_then(|d| koder_e2b::sandbox_of_host(uri, headers, d)) {
        return Target::Session(id);
    }
    let path = uri.path();
    if let Some(id) = headers.get(E2B_SANDBOX_ID) {
        return match id.to_str() {
            Ok(id) if plausible(id) => Target::Session(id.to_string()),
            _ => Target::Any,
        };
    }
    if is_build(path) {
        return Target::Build;
    }
    if *method == Method::POST && path.trim_end_matches('/') == "/v1/sandbox/volumes" {
        return Target::VolumeCreate;
    }
    let volume = ["/v1/sandbox/volumes/", "/volumes/", "/volumecontent/"]
        .iter()
        .find_map(|prefix| path.strip_prefix(prefix))
        .and_then(|rest| rest.split('/').next())
        .filter(|key| plausible_volume(key));
    if let Some(key) = volume {
        return Target::Volume(key.to_string());
    }
    if *method == Method::POST {
        match path.trim_end_matches('/') {
            "/v1/sandbox/sessions" => return Target::NativeCreate,
            "/sandboxes" | "/v2/sandboxes" => return Target::E2bCreate,
            _ => {}
        }
    }
    ["/v1/sandbox/sessions/", "/sandboxes/", "/v2/sandboxes/"]
        .iter()
        .find_map(|prefix| path.strip_prefix(prefix))
        .and_then(|rest| rest.split('/').next())
        .filter(|id| plausible(id))
        .map_or(Target::Any, |id| Target::Session(id.to_string()))
}

/// Native builds (`/v1/sandbox/images/builds...`: start, status, log) and E2B's template
/// build flow: its request (`/v3/templates`), the file uploads (`/templates/{id}/files/{hash}`),
/// its start (`/v2/templates/{id}/builds/{build}`) and status
/// (`/templates/{id}/builds/{build}/status`). A build's queue, log and uploads live on the node
/// running it, so all of them go to one node.
fn is_build(path: &str) -> bool {
    let path = path.trim_end_matches('/');
    if path == "/v3/templates" || path == "/v1/sandbox/images/builds" {
        return true;
    }
    if path.starts_with("/v1/sandbox/images/builds/") {
        return true;
    }
    let parts: Vec<&str> = path.split('/').collect();
    matches!(
        parts.as_slice(),
        ["", "templates", _, "files", _]
            | ["", "v2", "templates", _, "builds", _]
            | ["", "templates", _, "builds", _, "status"]
    )
}

/// A volume's id or name: 1-128 of `[A-Za-z0-9._-]`.
fn plausible_volume(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_ID_LEN
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

fn plausible(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(method: Method, path: &str) -> Target {
        of(&method, &path.parse().unwrap(), &HeaderMap::new(), None)
    }

    #[test]
    fn requests_name_their_session() {
        let s = |id: &str| Target::Session(id.into());
        assert_eq!(target(Method::GET, "/v1/sandbox/sessions/abc"), s("abc"));
        assert_eq!(
            target(Method::POST, "/v1/sandbox/sessions/abc/exec"),
            s("abc")
        );
        assert_eq!(
            target(Method::GET, "/v1/sandbox/sessions/abc/preview/x/y"),
            s("abc")
        );
        assert_eq!(target(Method::DELETE, "/sandboxes/s1"), s("s1"));
        assert_eq!(target(Method::POST, "/v2/sandboxes/s1/connect"), s("s1"));
        assert_eq!(
            target(Method::POST, "/v1/sandbox/sessions"),
            Target::NativeCreate
        );
        assert_eq!(target(Method::POST, "/sandboxes"), Target::E2bCreate);
        assert_eq!(target(Method::POST, "/v2/sandboxes/"), Target::E2bCreate);
        for any in [
            (Method::GET, "/v1/sandbox/sessions"),
            (Method::GET, "/sandboxes"),
            (Method::GET, "/v1/sandbox/sessions/"),
            (Method::GET, "/v1/sandbox/sessions/a%2Fb/exec"),
            (Method::GET, "/healthz"),
        ] {
            assert_eq!(target(any.0.clone(), any.1), Target::Any, "{any:?}");
        }
        let long = format!("/v1/sandbox/sessions/{}", "a".repeat(129));
        assert_eq!(target(Method::GET, &long), Target::Any);
    }

    #[test]
    fn a_build_s_requests_go_to_the_builder() {
        for (method, path) in [
            (Method::POST, "/v1/sandbox/images/builds"),
            (Method::GET, "/v1/sandbox/images/builds/b1"),
            (Method::GET, "/v1/sandbox/images/builds/b1/logs"),
            (Method::POST, "/v3/templates"),
            (Method::GET, "/templates/app/files/abc123"),
            (Method::PUT, "/templates/app/files/abc123"),
            (Method::POST, "/v2/templates/app/builds/b1"),
            (Method::GET, "/templates/app/builds/b1/status"),
        ] {
            assert_eq!(target(method.clone(), path), Target::Build, "{path}");
        }
        // Templates themselves (listed, tagged, deleted, used) are served by any node.
        for (method, path) in [
            (Method::GET, "/templates"),
            (Method::GET, "/templates/app"),
            (Method::DELETE, "/templates/app"),
            (Method::GET, "/templates/aliases/app"),
            (Method::POST, "/templates/tags"),
            (Method::GET, "/templates/app/tags"),
            (Method::GET, "/v1/sandbox/images"),
            (Method::POST, "/v1/sandbox/images/import"),
            (Method::GET, "/templates/app/files"),
            (Method::GET, "/templates/app/builds/b1"),
        ] {
            assert_eq!(target(method.clone(), path), Target::Any, "{path}");
        }
    }

    #[test]
    fn volume_operations_name_their_volume() {
        let v = |key: &str| Target::Volume(key.into());
        assert_eq!(target(Method::GET, "/v1/sandbox/volumes/data"), v("data"));
        assert_eq!(
            target(Method::PUT, "/v1/sandbox/volumes/my.vol-1/files"),
            v("my.vol-1")
        );
        assert_eq!(target(Method::DELETE, "/volumes/abc"), v("abc"));
        assert_eq!(target(Method::GET, "/volumecontent/abc/file"), v("abc"));
        assert_eq!(
            target(Method::POST, "/v1/sandbox/volumes"),
            Target::VolumeCreate
        );
        for any in [
            (Method::GET, "/v1/sandbox/volumes"),
            (Method::POST, "/volumes"),
            (Method::GET, "/volumes"),
            (Method::GET, "/v1/sandbox/volumes/a%2Fb/files"),
            (Method::GET, "/v1/sandbox/volumes/"),
        ] {
            assert_eq!(target(any.0.clone(), any.1), Target::Any, "{any:?}");
        }
    }

    #[test]
    fn envd_names_its_sandbox_in_a_header() {
        let mut h = HeaderMap::new();
        h.insert(E2B_SANDBOX_ID, "s1".parse().unwrap());
        let start = "/process.Process/Start".parse().unwrap();
        assert_eq!(
            of(&Method::POST, &start, &h, None),
            Target::Session("s1".into())
        );
        h.insert(E2B_SANDBOX_ID, "a b".parse().unwrap());
        assert_eq!(
            of(&Method::POST, &"/files".parse().unwrap(), &h, None),
            Target::Any
        );
    }

    #[test]
    fn a_sandbox_host_name_beats_the_path() {
        let mut h = HeaderMap::new();
        h.insert("host", "8000-s1.sbx.test:80".parse().unwrap());
        // The sandbox server's own path, whatever it looks like.
        let path: Uri = "/v1/sandbox/sessions/other/exec".parse().unwrap();
        let domain = Some("sbx.test");
        assert_eq!(
            of(&Method::POST, &path, &h, domain),
            Target::Session("s1".into())
        );
        // HTTP/2's authority too.
        let absolute: Uri = "http://49983-s2.sbx.test/files".parse().unwrap();
        assert_eq!(
            of(&Method::GET, &absolute, &HeaderMap::new(), domain),
            Target::Session("s2".into())
        );
        // Without a domain, or another domain's name: as before.
        assert_eq!(
            of(&Method::POST, &path, &h, None),
            Target::Session("other".into())
        );
        assert_eq!(
            of(&Method::POST, &path, &h, Some("other.test")),
            Target::Session("other".into())
        );
        h.insert("host", "api.sbx.test".parse().unwrap());
        assert_eq!(
            of(&Method::GET, &"/sandboxes".parse().unwrap(), &h, domain),
            Target::Any
        );
    }
}
