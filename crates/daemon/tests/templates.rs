//! Images brought in by operators, end to end: OCI archives imported through the API (on
//! the Debian bash pack of the test cache as their base layer) and sessions on them.

mod common;

use common::*;
use koder_image::oci::testing::{layer, layer_of_dir, oci_archive, E};
use koder_image::packs::{self, Pack};
use koder_image::ImageStore;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const ADMIN: &str = "admin-key-0123456789";

/// The bash pack's tree from the test cache (`KODER_PACK_CACHE`; built the first time).
fn bash_pack_root() -> std::path::PathBuf {
    let dir = std::env::var_os("KODER_PACK_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/var/cache/koder-sandbox-test/packs".into());
    let store = ImageStore::open(&dir).expect("pack cache");
    packs::build(&store, Pack::Bash, &packs::BuildOptions::default())
        .expect("building the bash pack")
        .image
        .root
}

async fn daemon() -> Daemon {
    Daemon::start(&format!(
        "{BASE_CONFIG}\n[auth]\nadmin_keys = [\"{ADMIN}\"]\n"
    ))
    .await
}

async fn import(d: &Daemon, name: &str, key: &str, archive: Vec<u8>) -> (StatusCode, Value) {
    let resp = d
        .req(
            Method::POST,
            &format!("/v1/sandbox/images/import?name={name}"),
            key,
        )
        .header("content-type", "application/x-tar")
        .body(archive)
        .send()
        .await
        .expect("import request");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread")]
async fn an_imported_oci_image_runs_sessions_and_hostile_archives_leave_nothing() {
    let Some(()) = root_or_skip() else { return };
    let base = layer_of_dir(&bash_pack_root());
    let top = layer(&[
        E::Dir("opt"),
        E::Dir("opt/app"),
        E::File("opt/app/hello.txt", b"hello from the layer\n", 0o644),
        E::File("usr/bin/.wh.yes", b"", 0o644),
    ]);
    let archive = oci_archive(&[base.clone(), top], false);
    let d = daemon().await;

    let (status, e) = import(&d, "app", KEY1, archive.clone()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a tenant key imports: {e}");
    let (status, image) = import(&d, "app", ADMIN, archive).await;
    assert_eq!(status, StatusCode::CREATED, "{image}");
    assert_eq!(image["names"], json!(["app"]));
    assert_eq!(image["recipe"]["kind"], "oci");
    assert_eq!(image["languages"][0]["name"], "bash", "{image}");

    let id = d.create(json!({"image": "app"})).await;
    let v = d
        .exec(
            &id,
            json!({"shell": "cat /opt/app/hello.txt; echo \"$GREETING $PWD\"; \
                             test -e /usr/bin/yes && echo kept || echo whited-out; \
                             ls /usr/bin/ls && echo ok > /workspace/w && cat /workspace/w"}),
        )
        .await;
    assert_eq!(
        v["stdout"].as_str().unwrap_or(""),
        "hello from the layer\nhello /workspace\nwhited-out\n/usr/bin/ls\nok\n",
        "{v}"
    );

    // Hostile archives: refused with a typed error, nothing left behind.
    let outside = tempfile::tempdir().unwrap();
    let escape = outside.path().to_str().unwrap();
    let hostile = [
        (
            layer(&[E::RawFile(b"../../escaped")]),
            "SANDBOX-IMAGE-FORBIDDEN-ENTRY",
        ),
        (
            layer(&[E::Symlink("esc", escape), E::File("esc/pwned", b"x", 0o644)]),
            "SANDBOX-IMAGE-FORBIDDEN-ENTRY",
        ),
    ];
    for (bad, code) in hostile {
        let (status, e) = import(&d, "bad", ADMIN, oci_archive(&[bad], false)).await;
        assert_eq!(
            (status, error_code(&e)),
            (StatusCode::BAD_REQUEST, code),
            "{e}"
        );
    }
    let (status, e) = import(&d, "bad", ADMIN, b"no tar at all".to_vec()).await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::BAD_REQUEST, "SANDBOX-IMAGE-INVALID-ARCHIVE"),
        "{e}"
    );
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    let (_, list) = d.json(Method::GET, "/v1/sandbox/images", Value::Null).await;
    let names: Vec<&str> = list["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["host", "app"], "{list}");
    let tmp = d.data_dir().join("images/store/.tmp");
    assert_eq!(
        std::fs::read_dir(tmp).unwrap().count(),
        0,
        "upload or half image left"
    );
}
