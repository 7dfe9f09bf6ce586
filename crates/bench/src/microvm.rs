//! The microVM runtime: boot-to-agent (cold create), warm-pool hand-out, exec latency inside a
//! guest and the host memory one idle VM costs. Under TCG (no usable hardware KVM) the numbers
//! are for reference only and no target is judged.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use koder_sdk::{Client, CreateSession, Limits};
use serde_json::json;

use crate::daemon::Daemon;
use crate::host;
use crate::report::{Row, Status};
use crate::stats::Summary;
use crate::Settings;

/// Sessions of these measurements live long enough for the slowest TCG boot.
const SESSION_TIMEOUT_S: u64 = 600;

/// Which targets apply: hardware KVM is judged, TCG is reference only.
fn target(kvm: bool, text: &str, pass: bool) -> (String, Status) {
    if kvm {
        (text.to_string(), Status::verdict(pass))
    } else {
        (
            "reference (TCG; targets need hardware KVM)".to_string(),
            Status::Info,
        )
    }
}

fn vm_req(disk_mib: Option<u64>) -> CreateSession {
    CreateSession {
        language: Some("bash".into()),
        runtime: Some("microvm".into()),
        timeout_s: Some(SESSION_TIMEOUT_S),
        limits: disk_mib.map(|d| Limits {
            disk_mib: Some(d),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub async fn run(
    daemon_bin: &Path,
    work_root: &Path,
    images: &Path,
    s: &Settings,
    keep: bool,
    rows: &mut Vec<Row>,
) {
    let kvm = koder_microvm::kvm::kvm_usable().is_ok();
    let extra = format!(
        "[microvm]\nimages_dir = \"{}\"\nvm_memory_mib = 512\nboot_timeout_s = 180\n",
        images.display()
    );
    let sessions = "pool = {}\nmicrovm_pool = { bash = 1 }\nreap_interval = 1.0\n";
    let mut d =
        match Daemon::start_with(daemon_bin, work_root, "microvm", sessions, &extra, keep).await {
            Ok(d) => d,
            Err(e) => {
                rows.push(Row::error(
                    "microvm_daemon",
                    "daemon with the microvm runtime",
                    &e,
                ));
                return;
            }
        };
    let accel = if kvm { "KVM" } else { "TCG" };
    match measure(&d, s, kvm, accel, rows).await {
        Ok(()) => {}
        Err(e) => {
            rows.push(Row::error("microvm", format!("microVM ({accel})"), &e));
            eprintln!("koder-bench: daemon log tail:\n{}", d.log_tail(20));
        }
    }
    d.stop(Duration::from_secs(120));
}

async fn measure(
    d: &Daemon,
    s: &Settings,
    kvm: bool,
    accel: &str,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let client = d.client()?;
    let http = reqwest::Client::new();
    d.wait_pool(&http, "bash", 1, Duration::from_secs(300))
        .await?;

    // Cold: a disk size the warm VM does not have forces a boot.
    let mut boots = Vec::new();
    for _ in 0..s.microvm_samples {
        let began = Instant::now();
        let session = client.create_session(&vm_req(Some(256))).await?;
        boots.push(began.elapsed());
        client.destroy_session(session.id()).await?;
    }
    let boot = Summary::of(&boots).context("no boot samples")?;
    let (t, st) = target(kvm, "p50 ≤ 500 ms", boot.p50_ms <= 500.0);
    rows.push(
        Row::info(
            "microvm_create_cold",
            format!("microVM session create, cold boot to a healthy agent ({accel})"),
            boot.display(),
        )
        .target(t, st)
        .data(json!(boot)),
    );

    // Warm: one VM from the pool per sample, each after the pool refilled.
    let mut warm = Vec::new();
    for _ in 0..s.microvm_samples {
        d.wait_pool(&http, "bash", 1, Duration::from_secs(300))
            .await?;
        let began = Instant::now();
        let session = client.create_session(&vm_req(None)).await?;
        warm.push(began.elapsed());
        client.destroy_session(session.id()).await?;
    }
    let warm = Summary::of(&warm).context("no warm samples")?;
    let (t, st) = target(kvm, "p50 ≤ 20 ms", warm.p50_ms <= 20.0);
    rows.push(
        Row::info(
            "microvm_create_warm",
            format!("microVM session create, warm pool ({accel})"),
            warm.display(),
        )
        .target(t, st)
        .data(json!(warm)),
    );

    d.wait_pool(&http, "bash", 1, Duration::from_secs(300))
        .await?;
    let session = client.create_session(&vm_req(None)).await?;
    let exec = exec_samples(&client, session.id(), &["/bin/true"], s.exec_samples / 10).await?;
    let (t, st) = target(kvm, "p50 ≤ 5 ms", exec.p50_ms <= 5.0);
    rows.push(
        Row::info(
            "microvm_exec",
            format!("exec `/bin/true` in a microVM session ({accel})"),
            exec.display(),
        )
        .target(t, st)
        .data(json!(exec)),
    );
    let py = exec_samples(
        &client,
        session.id(),
        &["/usr/bin/python3", "-c", "pass"],
        (s.python_samples / 10).max(3),
    )
    .await?;
    rows.push(
        Row::info(
            "microvm_python",
            format!("`python3 -c pass` in a microVM session ({accel})"),
            py.display(),
        )
        .data(json!(py)),
    );
    client.destroy_session(session.id()).await?;
    // Now the only VM is the warm one the pool refilled: booted and idle.
    d.wait_pool(&http, "bash", 1, Duration::from_secs(300))
        .await?;
    let mem = idle_vm_memory(d)?;
    rows.push(
        Row::info(
            "microvm_memory",
            format!("host memory of one idle microVM: QEMU ({accel})"),
            format!(
                "RSS {:.1} MiB · PSS {:.1} MiB (guest sized 512 MiB + overhead)",
                mem.0 as f64 / 1024.0,
                mem.1 as f64 / 1024.0,
            ),
        )
        .data(json!({"rss_kib": mem.0, "pss_kib": mem.1})),
    );
    Ok(())
}

async fn exec_samples(client: &Client, id: &str, cmd: &[&str], n: usize) -> Result<Summary> {
    let req = koder_sdk::ExecRequest {
        cmd: Some(cmd.iter().map(|c| c.to_string()).collect()),
        ..Default::default()
    };
    let mut samples = Vec::new();
    for i in 0..n.max(1) + 1 {
        let began = Instant::now();
        let r = client.exec(id, &req).await?;
        if r.exit_code != Some(0) {
            bail!("{cmd:?} in the VM failed: {r:?}");
        }
        if i > 0 {
            samples.push(began.elapsed());
        }
    }
    Summary::of(&samples).context("no exec samples")
}

/// (RSS, PSS) KiB of the VMM processes of the daemon's only VM, found by its directory on
/// their command lines.
fn idle_vm_memory(d: &Daemon) -> Result<(u64, u64)> {
    let vms = d.dir.join("data/microvm/vms");
    let dirs: Vec<_> = std::fs::read_dir(&vms)?
        .flatten()
        .map(|e| e.path())
        .collect();
    let [dir] = dirs.as_slice() else {
        bail!(
            "expected one VM below {}, found {}",
            vms.display(),
            dirs.len()
        );
    };
    let needle = dir.to_string_lossy().into_owned();
    let (mut rss, mut pss, mut found) = (0, 0, 0);
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(&needle) {
            if let Some(m) = host::proc_mem(pid) {
                rss += m.rss_kib;
                pss += m.pss_kib;
                found += 1;
            }
        }
    }
    if found == 0 {
        bail!("no VMM process found for {}", dir.display());
    }
    Ok((rss, pss))
}
