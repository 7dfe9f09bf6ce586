//! Images (issue 18): how long the python pack and a numpy template take to build, the first
//! time and again (a look-up, every step cached), and whether a create from a custom image is
//! as fast as one from `host`, warm and with the pool not holding it, the two images' samples
//! interleaved in one run.
//!
//! The first pack build runs `mmdebstrap` against the Debian mirror into a fresh store (minutes;
//! full runs only: `--smoke` uses the pack cache the tests build, `KODER_PACK_CACHE`). The
//! template is built through the daemon's API (its steps in jails, pip through the build's
//! network exemption); `--smoke` builds a one-step template without the network instead.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use koder_image::packs::{self, Pack};
use koder_image::ImageStore;
use koder_sdk::CreateSession;
use serde_json::{json, Value};

use crate::daemon::Daemon;
use crate::phases::{summary, POOL_WAIT};
use crate::report::Row;
use crate::stats::{fmt_ms, Summary};
use crate::Settings;

const ADMIN: &str = "bench-admin-key-0123456789";
/// The template's name; `python` sessions run on it (and the python warm pool).
const TEMPLATE_NAME: &str = "bench-numpy";
const NUMPY: &str = "base = \"python\"\npip = [\"numpy\"]\n";
const SMOKE: &str = "base = \"python\"\nrun = [\"echo smoke > /opt/smoke.txt\"]\n";
const BUILD_LIMIT: Duration = Duration::from_secs(1800);

/// Where the pack comes from and how the template is reached.
pub struct Options<'a> {
    pub pack_cache: &'a Path,
    /// `[images] build_internal` of the daemon: a package mirror on a private address.
    pub build_internal: &'a [String],
    pub smoke: bool,
}

pub async fn run(
    daemon_bin: &Path,
    work_root: &Path,
    s: &Settings,
    opts: &Options<'_>,
    keep: bool,
    rows: &mut Vec<Row>,
) {
    let store = match pack_rows(work_root, opts, rows).await {
        Ok(store) => store,
        Err(e) => {
            rows.push(Row::error("image_pack_build", "python pack build", &e));
            return;
        }
    };
    let internal: Vec<String> = opts
        .build_internal
        .iter()
        .map(|c| format!("{c:?}"))
        .collect();
    let extra = format!(
        "[images]\nlanguage_packs = {{ python = \"{TEMPLATE_NAME}\" }}\nbuild_internal = [{}]\n\
         [auth]\nadmin_keys = [\"{ADMIN}\"]\n",
        internal.join(", ")
    );
    let sessions = format!(
        "pool = {{ bash = {n}, python = {n} }}\nreap_interval = 1.0\n",
        n = s.warm_pool_bash
    );
    let mut d =
        match Daemon::start_with(daemon_bin, work_root, "images", &sessions, &extra, keep).await {
            Ok(d) => d,
            Err(e) => {
                rows.push(Row::error("image_daemon", "daemon with images", &e));
                return;
            }
        };
    if let Err(e) = measure(&d, &store, s, opts, rows).await {
        rows.push(Row::error("image_create_warm", "images", &e));
        eprintln!("koder-bench: daemon log tail:\n{}", d.log_tail(20));
    }
    d.stop(Duration::from_secs(120));
    if !opts.smoke && !keep {
        let _ = std::fs::remove_dir_all(store.root().parent().unwrap_or(store.root()));
    }
}

/// The pack rows; returns the store holding the pack.
async fn pack_rows(
    work_root: &Path,
    opts: &Options<'_>,
    rows: &mut Vec<Row>,
) -> Result<ImageStore> {
    let name = "python pack build (mmdebstrap from the Debian mirror), first";
    let dir: PathBuf = if opts.smoke {
        rows.push(Row::not_available(
            "image_pack_build",
            name,
            "not in --smoke (minutes of downloads); the pack cache is used",
        ));
        opts.pack_cache.to_path_buf()
    } else {
        work_root.join(format!("koder-bench-{}-packs", std::process::id()))
    };
    let store = ImageStore::open(&dir).with_context(|| format!("opening {}", dir.display()))?;
    let (first, built) = build_pack(&store).await?;
    if !opts.smoke {
        if !built {
            bail!("{} held the pack already", dir.display());
        }
        rows.push(
            Row::info("image_pack_build", name, fmt_ms(ms(first))).data(json!({"ms": ms(first)})),
        );
    }
    let (again, built) = build_pack(&store).await?;
    if built {
        bail!("the second pack build did not find the first");
    }
    rows.push(
        Row::info(
            "image_pack_cached",
            "python pack build again (same recipe: a look-up)",
            fmt_ms(ms(again)),
        )
        .data(json!({"ms": ms(again)})),
    );
    Ok(store)
}

async fn build_pack(store: &ImageStore) -> Result<(Duration, bool)> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || -> Result<(Duration, bool)> {
        let began = Instant::now();
        let built = packs::build(&store, Pack::Python, &packs::BuildOptions::default())?;
        Ok((began.elapsed(), built.built))
    })
    .await?
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn measure(
    d: &Daemon,
    store: &ImageStore,
    s: &Settings,
    opts: &Options<'_>,
    rows: &mut Vec<Row>,
) -> Result<()> {
    ImageStore::open(&d.dir.join("data/images"))?
        .link_from(store, "python")
        .context("linking the python pack into the daemon's store")?;
    let http = reqwest::Client::new();
    let spec = if opts.smoke { SMOKE } else { NUMPY };
    let what = if opts.smoke {
        "one-step template (--smoke)"
    } else {
        "numpy template (`pip = [\"numpy\"]` on the python pack)"
    };
    let first = build_template(d, &http, spec).await?;
    let again = build_template(d, &http, spec).await?;
    if again.1 != "cached" {
        bail!("the rebuild ran steps again: {}", again.1);
    }
    rows.push(
        Row::info(
            "image_template_build",
            format!("{what} build, first"),
            fmt_ms(ms(first.0)),
        )
        .data(json!({"ms": ms(first.0), "steps": first.1})),
    );
    rows.push(
        Row::info(
            "image_template_cached",
            format!("{what} build again (every step cached)"),
            fmt_ms(ms(again.0)),
        )
        .data(json!({"ms": ms(again.0)})),
    );
    // The python lane's image was missing until now: its refills failed and back off.
    d.wait_pool(&http, "python", s.warm_pool_bash, POOL_WAIT)
        .await?;
    let warm = interleaved(d, &http, s, true).await?;
    create_rows(rows, "image_create_warm", "warm pool", &warm);
    let cold = interleaved(d, &http, s, false).await?;
    create_rows(rows, "image_create_cold", "not in the pool", &cold);
    Ok(())
}

/// Builds the template spec and waits for it: (time from submit to success, the steps'
/// statuses joined).
async fn build_template(
    d: &Daemon,
    http: &reqwest::Client,
    spec: &str,
) -> Result<(Duration, String)> {
    let began = Instant::now();
    let resp = http
        .post(format!(
            "{}/v1/sandbox/images/builds?name={TEMPLATE_NAME}",
            d.base
        ))
        .bearer_auth(ADMIN)
        .header("content-type", "application/toml")
        .body(spec.to_string())
        .send()
        .await?;
    if resp.status() != reqwest::StatusCode::ACCEPTED {
        bail!("build refused: {} {}", resp.status(), resp.text().await?);
    }
    let submitted: Value = resp.json().await?;
    let id = submitted["build_id"]
        .as_str()
        .context("no build_id")?
        .to_string();
    loop {
        let b: Value = http
            .get(format!("{}/v1/sandbox/images/builds/{id}", d.base))
            .bearer_auth(ADMIN)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        match b["state"].as_str() {
            Some("succeeded") => {
                let steps: Vec<&str> = b["steps"]
                    .as_array()
                    .map(|s| s.iter().filter_map(|s| s["status"].as_str()).collect())
                    .unwrap_or_default();
                return Ok((began.elapsed(), steps.join(",")));
            }
            Some("failed") => bail!("template build failed: {}", b["error"]),
            _ => {}
        }
        if began.elapsed() > BUILD_LIMIT {
            bail!("template build did not end within {BUILD_LIMIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Creates (then destroys) alternately on `host` and on the template: from the warm pool
/// (`bash` sessions run on `host`, `python` ones on the template, each lane refilled before
/// its sample), or cold, by asking for the other lane's image (`host` for python, the template
/// for bash), which neither lane holds. Returns (host, template) samples.
async fn interleaved(
    d: &Daemon,
    http: &reqwest::Client,
    s: &Settings,
    warm: bool,
) -> Result<(Summary, Summary)> {
    let client = d.client()?;
    let req = |language: &str, image: Option<&str>| CreateSession {
        language: Some(language.into()),
        image: image.map(String::from),
        timeout_s: Some(600),
        ..Default::default()
    };
    let (host, custom) = if warm {
        (req("bash", None), req("python", None))
    } else {
        (
            req("python", Some("host")),
            req("bash", Some(TEMPLATE_NAME)),
        )
    };
    let n = s.create_samples;
    let (mut host_ms, mut custom_ms) = (Vec::with_capacity(n), Vec::with_capacity(n));
    // One untimed round of each warms the connection and the code paths.
    for i in 0..n + 1 {
        for (req, samples) in [(&host, &mut host_ms), (&custom, &mut custom_ms)] {
            if warm {
                let language = req.language.as_deref().unwrap_or("bash");
                d.wait_pool(http, language, s.warm_pool_bash, POOL_WAIT)
                    .await?;
            }
            let began = Instant::now();
            let session = client.create_session(req).await?;
            let took = began.elapsed();
            client.destroy_session(session.id()).await?;
            if i > 0 {
                samples.push(took);
            }
        }
    }
    Ok((summary(&host_ms)?, summary(&custom_ms)?))
}

fn create_rows(
    rows: &mut Vec<Row>,
    id: &'static str,
    how: &str,
    (host, custom): &(Summary, Summary),
) {
    let ratio = custom.p50_ms / host.p50_ms.max(f64::MIN_POSITIVE);
    rows.push(
        Row::info(
            id,
            format!("session create from a custom image ({how}) vs `host`, interleaved"),
            format!(
                "template {} · host {} · ratio of p50s {ratio:.2}",
                custom.display(),
                host.display()
            ),
        )
        .target(
            "template p50 ≤ 1.25 × host p50",
            crate::report::Status::verdict(ratio <= 1.25),
        )
        .data(json!({"host": host, "template": custom})),
    );
}
