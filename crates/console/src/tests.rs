use super::*;
use axum::body::Body;
use axum::http::Request;
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use tower::ServiceExt;

async fn get_path(path: &str) -> Response {
    router::<()>()
        .oneshot(Request::get(path).body(Body::empty()).unwrap())
        .await
        .unwrap()
}

fn header_of(res: &Response, name: header::HeaderName) -> &str {
    res.headers()
        .get(&name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
}

fn assert_hardened(res: &Response) {
    assert_eq!(
        header_of(res, header::CONTENT_SECURITY_POLICY),
        CONTENT_SECURITY_POLICY
    );
    assert_eq!(header_of(res, header::X_CONTENT_TYPE_OPTIONS), "nosniff");
    assert_eq!(header_of(res, header::X_FRAME_OPTIONS), "DENY");
    assert_eq!(header_of(res, header::REFERRER_POLICY), "no-referrer");
}

#[tokio::test]
async fn every_answer_is_hardened() {
    for (path, status, kind) in [
        (
            "/console/",
            StatusCode::OK,
            Some("text/html; charset=utf-8"),
        ),
        (
            "/console/console.js",
            StatusCode::OK,
            Some("text/javascript; charset=utf-8"),
        ),
        (
            "/console/console.css",
            StatusCode::OK,
            Some("text/css; charset=utf-8"),
        ),
        ("/console", StatusCode::PERMANENT_REDIRECT, None),
        ("/console/SOURCES.sha256", StatusCode::NOT_FOUND, None),
        ("/console/..%2Fsecret", StatusCode::NOT_FOUND, None),
    ] {
        let res = get_path(path).await;
        assert_eq!(res.status(), status, "{path}");
        assert_hardened(&res);
        if let Some(kind) = kind {
            assert_eq!(header_of(&res, header::CONTENT_TYPE), kind, "{path}");
        }
    }
    let res = get_path("/console").await;
    assert_eq!(header_of(&res, header::LOCATION), "/console/");
}

#[test]
fn the_policy_allows_only_the_own_origin() {
    for directive in CONTENT_SECURITY_POLICY.split(';') {
        let sources: Vec<&str> = directive.split_whitespace().skip(1).collect();
        for s in sources {
            assert!(
                ["'self'", "'none'", "data:", "blob:"].contains(&s),
                "{directive} allows {s}"
            );
        }
    }
    assert!(CONTENT_SECURITY_POLICY.contains("frame-ancestors 'none'"));
}

#[test]
fn the_page_loads_only_embedded_files() {
    let html = std::str::from_utf8(ASSETS[0].body).unwrap();
    let mut refs = 0;
    for attr in ["src=\"", "href=\""] {
        for part in html.split(attr).skip(1) {
            let target = part.split('"').next().unwrap();
            refs += 1;
            assert!(
                target.starts_with('#') || ASSETS.iter().any(|a| a.name == target),
                "index.html loads {target}, which is not embedded"
            );
        }
    }
    assert!(refs >= 2, "index.html should load the script and styles");
}

/// Absolute URLs in the bundle: only XML namespace names (identifiers, never fetched).
#[test]
fn the_bundle_names_no_external_url() {
    const NAMESPACES: &[&str] = &["http://www.w3.org/1999/xhtml", "http://www.w3.org/2000/svg"];
    for asset in ASSETS {
        let text = std::str::from_utf8(asset.body).unwrap();
        for scheme in ["http://", "https://", "//cdn", "ws://", "wss://"] {
            for (at, _) in text.match_indices(scheme) {
                let url: String = text[at..]
                    .chars()
                    .take_while(|c| !matches!(c, '"' | '\'' | '`' | ')' | ' '))
                    .collect();
                assert!(
                    NAMESPACES.contains(&url.as_str()),
                    "{} names {url}",
                    asset.name
                );
            }
        }
        assert!(
            !text.contains("@import") && !text.contains("url(http"),
            "{} imports a stylesheet or font from elsewhere",
            asset.name
        );
    }
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn files_under(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files_under(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// `console/dist` is checked in: it must be built from the sources as they are now (run
/// `scripts/console-build.sh` after editing `console/`).
#[test]
fn the_built_files_are_up_to_date_with_their_sources() {
    let root = repo();
    let listing = std::fs::read_to_string(root.join("console/dist/SOURCES.sha256")).unwrap();
    let mut listed = Vec::new();
    for line in listing.lines() {
        let (digest, path) = line.split_once("  ").unwrap();
        let now = hex::encode(Sha256::digest(std::fs::read(root.join(path)).unwrap()));
        assert_eq!(
            now, digest,
            "{path} changed since console/dist was built: run scripts/console-build.sh"
        );
        listed.push(root.join(path));
    }
    let mut sources = Vec::new();
    files_under(&root.join("console/src"), &mut sources);
    for s in sources {
        assert!(
            listed.contains(&s),
            "{} is newer than console/dist: run scripts/console-build.sh",
            s.display()
        );
    }
}
