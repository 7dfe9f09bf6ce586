//! End-to-end: the real daemon (`koder-sandbox serve`) on a loopback port, driven through the
//! SDK and the `ksandbox` binary. Needs root (the daemon builds real sandboxes); skipped
//! otherwise.
//!
//! The daemon binary: `$KODER_SANDBOX_BIN`, else `koder-sandbox` next to this test's profile
//! directory (build it with `cargo build --workspace --bins`), else `ksandbox serve`.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use koder_sdk::{Client, CreateSession, ExecRequest};

// The daemon refuses API keys shorter than 8 characters.
const KEY1: &str = "key-one-e2e";
const KEY2: &str = "key-two-e2e";
const KSANDBOX: &str = env!("CARGO_BIN_EXE_ksandbox");

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn daemon_command() -> Command {
    if let Some(bin) = std::env::var_os("KODER_SANDBOX_BIN").filter(|b| !b.is_empty()) {
        return Command::new(bin);
    }
    let sibling = std::env::current_exe().ok().and_then(|exe| {
        let profile_dir = exe.parent()?.parent()?.to_path_buf();
        Some(profile_dir.join("koder-sandbox"))
    });
    match sibling {
        Some(bin) if bin.is_file() => Command::new(bin),
        _ => {
            eprintln!("e2e: koder-sandbox binary not built; using `ksandbox serve`");
            Command::new(KSANDBOX)
        }
    }
}

/// The spawned daemon; killed (SIGTERM, then SIGKILL) when dropped, before its data dir goes.
struct Daemon {
    child: Child,
    cgroup_parent: String,
    url: String,
    log: PathBuf,
    _data: tempfile::TempDir,
}

impl Daemon {
    fn start() -> Daemon {
        let data = tempfile::Builder::new()
            .prefix("ksandbox-e2e-")
            .tempdir_in("/tmp")
            .expect("temp data dir");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let listen = format!("127.0.0.1:{port}");
        let log = data.path().join("daemon.log");
        let log_file = std::fs::File::create(&log).expect("log file");
        let log_err = log_file.try_clone().expect("log file clone");
        // Its own cgroup parent, removed on drop; no warm pool, so the test pays only for what
        // it creates.
        // Unique per daemon too: tests of this binary run in parallel, and a daemon's start-up
        // reconciliation would take another's sandboxes under a shared parent for leftovers.
        static STARTED: AtomicU32 = AtomicU32::new(0);
        let cgroup_parent = format!(
            "koder-test-e2e-{}-{}",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        );
        let config = data.path().join("koder.toml");
        std::fs::write(
            &config,
            // Webhooks may target loopback: the test's own receiver.
            format!(
                "[sessions]\npool = {{}}\n[jail]\ncgroup_parent = \"{cgroup_parent}\"\n\
                 [webhooks]\nallow_private = true\nbackoff_initial_ms = 200\n"
            ),
        )
        .expect("write config");
        let mut cmd = daemon_command();
        cmd.arg("serve")
            .arg("--config")
            .arg(&config)
            .arg("--listen")
            .arg(&listen)
            .arg("--data-dir")
            .arg(data.path().join("state"))
            .args(["--api-key", &format!("t1:{KEY1}")])
            .args(["--api-key", &format!("t2:{KEY2}")])
            .args(["--admin-key", ADMIN_KEY])
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(log_err);
        eprintln!("e2e: starting {cmd:?}");
        let child = cmd.spawn().expect("spawn the daemon");
        let mut daemon = Daemon {
            child,
            cgroup_parent,
            url: format!("http://{listen}"),
            log,
            _data: data,
        };
        daemon.wait_healthy(Duration::from_secs(30));
        daemon
    }

    fn wait_healthy(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let url = format!("{}/healthz", self.url);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "the daemon exited ({status}) before answering /healthz:\n{}",
                    self.log_tail()
                );
            }
            if http_status(&url) == Some(200) {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "the daemon did not answer /healthz 200 within {timeout:?}:\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    fn cli(&self, key: &str) -> Cli {
        Cli {
            url: self.url.clone(),
            key: key.to_string(),
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- daemon log (tail) ----\n{}", self.log_tail());
        }
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: signalling the child we spawned (and have not reaped yet).
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut exited = false;
        while !exited && Instant::now() < deadline {
            exited = matches!(self.child.try_wait(), Ok(Some(_)));
            std::thread::sleep(Duration::from_millis(100));
        }
        if !exited {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") {
            for c in controllers.flatten() {
                let _ = std::fs::remove_dir(c.path().join(&self.cgroup_parent));
            }
        }
    }
}

/// A plain blocking GET over loopback, for the health probe (no async runtime needed).
fn http_status(url: &str) -> Option<u16> {
    let rest = url.strip_prefix("http://")?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut stream = std::net::TcpStream::connect(host).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        stream,
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = [0u8; 64];
    let n = stream.read(&mut buf).ok()?;
    let head = std::str::from_utf8(&buf[..n]).ok()?;
    head.split_whitespace().nth(1)?.parse().ok()
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

struct Cli {
    url: String,
    key: String,
}

impl Cli {
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(KSANDBOX);
        cmd.args(args)
            .env("KSANDBOX_URL", &self.url)
            .env("KSANDBOX_API_KEY", &self.key);
        cmd
    }

    fn run(&self, args: &[&str]) -> Out {
        self.run_with_stdin(args, None)
    }

    fn run_with_stdin(&self, args: &[&str], stdin: Option<&str>) -> Out {
        let mut cmd = self.command(args);
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn ksandbox");
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(input.as_bytes()).expect("write stdin");
        }
        let pid = child.id();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        let output = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(out) => out.expect("ksandbox output"),
            Err(_) => {
                if let Ok(pid) = i32::try_from(pid) {
                    // SAFETY: our own child, still unreaped (wait_with_output is blocked).
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                panic!("ksandbox {args:?} did not finish within 120 s");
            }
        };
        Out {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    fn ok(&self, args: &[&str]) -> Out {
        let out = self.run(args);
        assert_eq!(out.code, 0, "ksandbox {args:?}: {out:?}");
        out
    }

    fn session_ids(&self) -> Vec<String> {
        let out = self.ok(&["ls", "--json"]);
        let value: serde_json::Value = serde_json::from_str(&out.stdout).expect("ls --json");
        value
            .as_array()
            .expect("ls --json prints an array")
            .iter()
            .filter_map(|s| s["id"].as_str().map(String::from))
            .collect()
    }
}

fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

#[test]
fn e2e_sdk_and_cli_against_the_real_daemon() {
    if !is_root() {
        eprintln!("skipping e2e: the daemon needs root to create sandboxes");
        return;
    }
    let daemon = Daemon::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(sdk_flow(&daemon.url));
    drop(runtime);
    cli_flow(&daemon);
    admin_flow(&daemon);
    live_flow(&daemon);
    stdin_status_errors_flow(&daemon);
    egress_flow(&daemon);
    webhook_flow(&daemon);
    interpreter_flow(&daemon);
    preview_errors_images_flow(&daemon);
}

/// What needs no daemon: completions, and the errors that say how to reach one.
#[test]
fn e2e_cli_without_a_daemon() {
    // Port 9 (discard) on loopback: nothing listens.
    let down = Cli {
        url: "http://127.0.0.1:9".into(),
        key: KEY1.into(),
    };
    let out = down.run(&["ls"]);
    assert_eq!(out.code, 1, "{out:?}");
    for part in [
        "http://127.0.0.1:9/",
        "scripts/serve.sh",
        "koder-sandbox serve",
        "KSANDBOX_URL",
    ] {
        assert!(out.stderr.contains(part), "{part}: {out:?}");
    }
    let watch = down.run(&["watch", "s1"]);
    assert_eq!(watch.code, 1, "{watch:?}");
    assert!(
        watch.stderr.contains("ws://127.0.0.1:9/") && watch.stderr.contains("scripts/serve.sh"),
        "a WebSocket command too: {watch:?}"
    );
    let no_key = Cli {
        url: "http://127.0.0.1:9".into(),
        key: String::new(),
    };
    let out = no_key.run(&["admin", "tenant", "ls"]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stderr.contains("no admin key") && out.stderr.contains("admin_keys"),
        "{out:?}"
    );
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef ksandbox"),
        ("fish", "complete -c ksandbox"),
        ("powershell", "Register-ArgumentCompleter"),
        ("elvish", "edit:completion"),
    ] {
        let out = no_key.ok(&["completions", shell]);
        assert!(out.stdout.contains(marker), "{shell}: {out:?}");
        assert!(out.stdout.contains("run-code"), "{shell}: {out:?}");
    }
    assert_ne!(no_key.run(&["completions", "tcsh"]).code, 0);
}

/// Interpreter contexts through the CLI: state kept between runs, errors, rich results saved.
fn interpreter_flow(daemon: &Daemon) {
    let cli = daemon.cli(KEY1);
    let id = cli
        .ok(&["create", "--language", "python"])
        .stdout
        .trim()
        .to_string();
    let ctx = cli
        .ok(&["context", "create", &id])
        .stdout
        .trim()
        .to_string();
    assert!(!ctx.is_empty());
    let listed: serde_json::Value =
        serde_json::from_str(&cli.ok(&["context", "ls", &id, "--json"]).stdout)
            .expect("context ls --json");
    assert!(
        listed.as_array().is_some_and(|l| l
            .iter()
            .any(|c| c["context_id"] == ctx.as_str() && c["language"] == "python")),
        "{listed}"
    );
    cli.ok(&["run-code", &id, "--context", &ctx, "x = 20"]);
    let out = cli.ok(&[
        "run-code",
        &id,
        "--context",
        &ctx,
        "print('x is', x); x * 2 + 2",
    ]);
    assert_eq!(out.stdout, "x is 20\n42\n", "{out:?}");
    let streamed = cli.ok(&[
        "run-code",
        &id,
        "--context",
        &ctx,
        "--stream",
        "import time\nprint('a', flush=True); time.sleep(0.3); print('b')",
    ]);
    assert_eq!(streamed.stdout, "a\nb\n", "{streamed:?}");
    let failed = cli.run(&["run-code", &id, "--context", &ctx, "1 / 0"]);
    assert_eq!(failed.code, 1, "{failed:?}");
    assert!(failed.stderr.contains("ZeroDivisionError"), "{failed:?}");

    let dir = tempfile::tempdir().expect("results dir");
    let dir_arg = dir.path().to_str().expect("utf-8 temp path");
    let html = "class H:\n    def _repr_html_(self): return '<b>hi</b>'\nH()";
    let rich = cli.ok(&[
        "run-code",
        &id,
        "--context",
        &ctx,
        "--save-results",
        dir_arg,
        html,
    ]);
    assert!(rich.stderr.contains("saved"), "{rich:?}");
    let saved = std::fs::read_to_string(dir.path().join("result-1.html")).expect("saved html");
    assert_eq!(saved, "<b>hi</b>");
    let json: serde_json::Value = serde_json::from_str(
        &cli.ok(&["run-code", &id, "--context", &ctx, "--json", html])
            .stdout,
    )
    .expect("run-code --json");
    assert_eq!(json["results"][0]["html"], "<b>hi</b>", "{json}");

    let restarted: serde_json::Value =
        serde_json::from_str(&cli.ok(&["context", "restart", &id, &ctx, "--json"]).stdout)
            .expect("context restart --json");
    assert_eq!(restarted["execution_count"], 0, "{restarted}");
    let gone = cli.run(&["run-code", &id, "--context", &ctx, "x"]);
    assert!(gone.stderr.contains("NameError"), "{gone:?}");
    cli.ok(&["context", "rm", &id, &ctx]);
    let after: serde_json::Value =
        serde_json::from_str(&cli.ok(&["context", "ls", &id, "--json"]).stdout)
            .expect("context ls --json");
    assert!(
        after
            .as_array()
            .is_some_and(|l| l.iter().all(|c| c["context_id"] != ctx.as_str())),
        "{after}"
    );

    // Stdin, the default context and a throw-away Node context.
    let piped = cli.run_with_stdin(&["run-code", &id, "-"], Some("print(6 * 7)\n"));
    assert_eq!(
        (piped.code, piped.stdout.as_str()),
        (0, "42\n"),
        "{piped:?}"
    );
    let node = cli.ok(&["run-code", &id, "--language", "node", "console.log(1 + 1)"]);
    assert!(node.stdout.starts_with("2\n"), "{node:?}");
    let left: serde_json::Value =
        serde_json::from_str(&cli.ok(&["context", "ls", &id, "--json"]).stdout)
            .expect("context ls --json");
    assert!(
        left.as_array()
            .is_some_and(|l| l.iter().all(|c| c["language"] != "node")),
        "the throw-away context is removed: {left}"
    );
    cli.ok(&["kill", &id]);
}

/// A GET through the daemon's preview proxy with the bearer key; the status and the body.
fn preview_get(url: &str, key: &str) -> (u16, String) {
    let rest = url.strip_prefix("http://").expect("http URL");
    let (host, path) = rest.split_once('/').expect("a path");
    let mut stream = std::net::TcpStream::connect(host).expect("connect to the daemon");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    write!(
        stream,
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, answer)
}

/// preview (pinned and detected), the error ring, the daemon's images, a signal.
fn preview_errors_images_flow(daemon: &Daemon) {
    let cli = daemon.cli(KEY1);
    let id = cli.ok(&["create"]).stdout.trim().to_string();
    let nothing = cli.run(&["preview", &id]);
    assert_eq!(nothing.code, 1, "{nothing:?}");
    assert!(
        nothing.stderr.contains("SANDBOX-PREVIEW-NOT-LISTENING"),
        "{nothing:?}"
    );
    let serve = "mkdir -p /tmp/site && echo preview-ok > /tmp/site/index.html && \
                 exec python3 -m http.server 8765 --bind 127.0.0.1 --directory /tmp/site";
    let server = cli
        .ok(&["exec", &id, "--background", "--shell", serve])
        .stdout
        .trim()
        .to_string();
    let expected = format!("{}/v1/sandbox/sessions/{id}/preview/", daemon.url);
    let deadline = Instant::now() + Duration::from_secs(20);
    let detected = loop {
        let out = cli.run(&["preview", &id, "--json"]);
        if out.code == 0 {
            break out;
        }
        assert!(
            Instant::now() < deadline,
            "the server never listened: {out:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    let info: serde_json::Value = serde_json::from_str(&detected.stdout).expect("preview --json");
    assert_eq!(
        (
            info["preview_url"].as_str(),
            info["port"].as_u64(),
            info["pinned"].as_bool()
        ),
        (Some(expected.as_str()), Some(8765), Some(false)),
        "{info}"
    );
    let pinned = cli.ok(&["preview", &id, "--port", "8765"]);
    assert_eq!(pinned.stdout.trim(), expected, "{pinned:?}");
    let (status, body) = preview_get(&expected, KEY1);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("preview-ok"), "{body}");
    let elsewhere = cli.ok(&["preview", &id, "--port", "8766"]);
    assert!(
        elsewhere.stderr.contains("nothing listens"),
        "{elsewhere:?}"
    );

    cli.ok(&["signal", &id, &server, "sigterm"]);
    let ended = cli.run(&["logs", &id, &server]);
    assert_ne!(ended.code, 0, "a terminated server: {ended:?}");

    let empty = cli.ok(&["errors", &id, "--json"]);
    assert_eq!(empty.stdout.trim(), "[]", "{empty:?}");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let client = Client::new(&daemon.url, KEY1).expect("client");
    runtime
        .block_on(client.report_error(
            &id,
            &koder_sdk::types::ReportError {
                source: "browser".into(),
                message: "TypeError: x is undefined\n at line 3".into(),
                stack: None,
            },
        ))
        .expect("report an error");
    let table = cli.ok(&["errors", &id]).stdout;
    let row = table.lines().nth(1).unwrap_or_default();
    assert!(
        row.contains("browser")
            && row.contains("TypeError: x is undefined")
            && !row.contains("line 3"),
        "{table}"
    );

    let images: serde_json::Value =
        serde_json::from_str(&cli.ok(&["image", "list", "--json"]).stdout).expect("image list");
    assert!(
        images["images"]
            .as_array()
            .is_some_and(|l| l.iter().any(|i| i["name"] == "host")),
        "{images}"
    );
    let stat: serde_json::Value = serde_json::from_str(
        &cli.ok(&["stat", &id, "/tmp/site/index.html", "--json"])
            .stdout,
    )
    .expect("stat --json");
    assert_eq!(
        (stat["type"].as_str(), stat["size"].as_u64()),
        (Some("file"), Some(11)),
        "{stat}"
    );
    let missing = cli.run(&["stat", &id, "/tmp/site/none"]);
    assert_eq!(missing.code, 1, "{missing:?}");
    assert!(missing.stderr.contains("SANDBOX-NOT-FOUND"), "{missing:?}");
    let host = cli.ok(&["image", "get", "host"]).stdout;
    assert!(host.contains("kind:       host"), "{host}");
    let refused = cli.run(&["image", "delete", "host"]);
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(refused.stderr.contains("KSANDBOX_ADMIN_KEY"), "{refused:?}");
    cli.ok(&["kill", &id]);
}

/// State that outlives a sandbox, through the CLI alone: snapshot, create from it, restore,
/// fork, pause (memory and disk), resume, snapshot delete.
#[test]
fn e2e_cli_snapshots_forks_and_pauses() {
    if !is_root() {
        eprintln!("skipping e2e: the daemon needs root to create sandboxes");
        return;
    }
    let daemon = Daemon::start();
    let cli = daemon.cli(KEY1);
    let cat = |id: &str| {
        cli.ok(&["exec", id, "--", "cat", "/home/user/state.txt"])
            .stdout
    };

    let id = cli.ok(&["create"]).stdout.trim().to_string();
    cli.ok(&["exec", &id, "--shell", "echo saved > /home/user/state.txt"]);
    let snap = cli
        .ok(&["snapshot", "create", &id, "--name", "e2e-base"])
        .stdout
        .trim()
        .to_string();
    assert!(
        !snap.is_empty() && !snap.contains(char::is_whitespace),
        "{snap:?}"
    );

    let listed: serde_json::Value =
        serde_json::from_str(&cli.ok(&["snapshot", "list", "--json"]).stdout)
            .expect("snapshot list --json");
    let entry = listed
        .as_array()
        .and_then(|l| l.iter().find(|s| s["snapshot_id"] == snap.as_str()))
        .unwrap_or_else(|| panic!("{snap} not listed: {listed}"));
    assert_eq!(
        (entry["name"].as_str(), entry["session_id"].as_str()),
        (Some("e2e-base"), Some(id.as_str())),
        "{entry}"
    );
    assert!(
        entry["size_bytes"].as_u64().is_some_and(|n| n > 0),
        "{entry}"
    );
    let table = cli.ok(&["snapshot", "list"]).stdout;
    assert!(table.starts_with("ID"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(&snap) && l.contains("e2e-base")),
        "{table}"
    );
    let got: serde_json::Value =
        serde_json::from_str(&cli.ok(&["snapshot", "get", &snap, "--json"]).stdout)
            .expect("snapshot get --json");
    assert_eq!(&got, entry);

    let from = cli
        .ok(&[
            "create",
            "--from-snapshot",
            &snap,
            "--on-timeout",
            "pause",
            "--auto-resume",
        ])
        .stdout
        .trim()
        .to_string();
    assert_eq!(cat(&from), "saved\n");
    cli.ok(&[
        "exec",
        &from,
        "--shell",
        "echo changed > /home/user/state.txt",
    ]);
    let restored: serde_json::Value =
        serde_json::from_str(&cli.ok(&["restore", &from, &snap, "--json"]).stdout)
            .expect("restore --json");
    assert_eq!(restored["state"], "running", "{restored}");
    assert_eq!(cat(&from), "saved\n");

    let forks: Vec<String> = cli
        .ok(&["fork", &from, "--count", "2"])
        .stdout
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(forks.len(), 2, "{forks:?}");
    assert!(forks[0] != forks[1] && !forks.contains(&from), "{forks:?}");
    for fork in &forks {
        assert_eq!(cat(fork), "saved\n");
    }

    // A memory pause (the default) and its resume, in the human form.
    let paused = cli.ok(&["pause", &forks[0]]).stdout;
    assert!(
        paused
            .lines()
            .any(|l| l.split_whitespace().eq(["state", "paused"])),
        "{paused}"
    );
    let resumed = cli.ok(&["resume", &forks[0]]).stdout;
    assert!(
        resumed
            .lines()
            .any(|l| l.split_whitespace().eq(["state", "running"])),
        "{resumed}"
    );

    let paused: serde_json::Value =
        serde_json::from_str(&cli.ok(&["pause", &from, "--disk", "--json"]).stdout)
            .expect("pause --json");
    assert_eq!(paused["state"], "paused", "{paused}");
    let resumed: serde_json::Value =
        serde_json::from_str(&cli.ok(&["resume", &from, "--json"]).stdout).expect("resume --json");
    assert_eq!(resumed["state"], "running", "{resumed}");
    assert_eq!(cat(&from), "saved\n");

    cli.ok(&["snapshot", "delete", &snap]);
    let gone = cli.run(&["snapshot", "get", &snap]);
    assert_eq!(gone.code, 1, "{gone:?}");
    assert!(gone.stderr.contains("SANDBOX-NOT-FOUND"), "{gone:?}");
    let listed = cli.ok(&["snapshot", "list", "--json"]).stdout;
    assert!(!listed.contains(&snap), "{listed}");

    let mut all = vec![id.as_str(), from.as_str()];
    all.extend(forks.iter().map(String::as_str));
    let mut kill = vec!["kill"];
    kill.extend(all);
    cli.ok(&kill);
}

/// Streaming exec, background exec + logs, attach, watch.
fn live_flow(daemon: &Daemon) {
    let cli = daemon.cli(KEY1);
    let id = cli.ok(&["create"]).stdout.trim().to_string();
    let streamed = cli.ok(&[
        "exec",
        &id,
        "--stream",
        "--",
        "sh",
        "-c",
        "echo a; sleep 0.5; echo b",
    ]);
    assert_eq!(streamed.stdout, "a\nb\n");

    let exec_id = cli
        .ok(&[
            "exec",
            &id,
            "--background",
            "--",
            "sh",
            "-c",
            "echo bg; sleep 0.3; exit 4",
        ])
        .stdout
        .trim()
        .to_string();
    let logs = cli.run(&["logs", &id, &exec_id]);
    assert_eq!((logs.code, logs.stdout.as_str()), (4, "bg\n"), "{logs:?}");
    let listed: serde_json::Value =
        serde_json::from_str(&cli.ok(&["logs", &id, "--list", "--json"]).stdout)
            .expect("logs --list --json");
    let bg = listed
        .as_array()
        .and_then(|l| l.iter().find(|e| e["exec_id"] == exec_id.as_str()))
        .expect("background exec listed");
    assert_eq!(
        (bg["background"].as_bool(), bg["state"].as_str()),
        (Some(true), Some("exited")),
        "{bg}"
    );

    let attached = cli.run(&["attach", &id, "--", "/bin/echo", "from a pty"]);
    assert_eq!(attached.code, 0, "{attached:?}");
    assert!(attached.stdout.contains("from a pty"), "{attached:?}");

    let mut watch = cli
        .command(&["watch", &id, "/workspace"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("ksandbox watch");
    std::thread::sleep(Duration::from_millis(700));
    cli.ok(&["exec", &id, "--", "mkdir", "/workspace/w"]);
    let mut line = String::new();
    let stdout = watch.stdout.take().expect("watch stdout");
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)
        .expect("a watch line");
    let _ = watch.kill();
    let _ = watch.wait();
    assert_eq!(line, "created\t/workspace/w\n");
    let audit: serde_json::Value =
        serde_json::from_str(&cli.ok(&["audit", "--json", "--denied"]).stdout)
            .expect("audit --json");
    assert!(
        audit["entries"].as_array().is_some_and(|e| e.is_empty()),
        "sessions without network leave no audit: {audit}"
    );
    cli.ok(&["kill", &id]);
}

/// `stdin` (with --data and from its own stdin), `logs --status`, `errors --report`.
fn stdin_status_errors_flow(daemon: &Daemon) {
    let cli = daemon.cli(KEY1);
    let id = cli.ok(&["create"]).stdout.trim().to_string();
    let exec_id = cli
        .ok(&["exec", &id, "--background", "--", "sh", "-c", "cat; exit 3"])
        .stdout
        .trim()
        .to_string();
    let running: serde_json::Value = serde_json::from_str(
        &cli.ok(&["logs", &id, &exec_id, "--status", "--json"])
            .stdout,
    )
    .expect("logs --status --json");
    assert_eq!(running["state"], "running", "{running}");
    cli.ok(&["stdin", &id, &exec_id, "--data", "one\n"]);
    let piped = cli.run_with_stdin(&["stdin", &id, &exec_id, "--eof"], Some("two\nthree\n"));
    assert_eq!(piped.code, 0, "{piped:?}");
    let logs = cli.run(&["logs", &id, &exec_id]);
    assert_eq!(
        (logs.code, logs.stdout.as_str()),
        (3, "one\ntwo\nthree\n"),
        "{logs:?}"
    );
    let status = cli.ok(&["logs", &id, &exec_id, "--status"]).stdout;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name).map(str::trim))
            .map(String::from)
    };
    assert_eq!(field("state").as_deref(), Some("exited"), "{status}");
    assert_eq!(field("exit_code").as_deref(), Some("3"), "{status}");
    let gone = cli.run(&["stdin", &id, "no-such-exec", "--data", "x"]);
    assert_ne!(gone.code, 0, "{gone:?}");
    assert!(gone.stderr.contains("SANDBOX-"), "{gone:?}");
    assert_ne!(
        cli.run(&["logs", &id, "--status"]).code,
        0,
        "--status needs an exec id"
    );

    cli.ok(&[
        "errors",
        &id,
        "--report",
        "agent gave up",
        "--source",
        "e2e",
        "--stack",
        "at x",
    ]);
    let errors: serde_json::Value =
        serde_json::from_str(&cli.ok(&["errors", &id, "--json"]).stdout).expect("errors --json");
    let reported = errors
        .as_array()
        .and_then(|l| l.iter().find(|e| e["message"] == "agent gave up"))
        .unwrap_or_else(|| panic!("the reported error is listed: {errors}"));
    assert_eq!(reported["source"], "e2e");
    assert_ne!(
        cli.run(&["errors", &id, "--source", "x"]).code,
        0,
        "--source needs --report"
    );
    cli.ok(&["kill", &id]);
}

/// `network` on a running session, `create --deny/--secret`, `secret set/ls/rm`.
fn egress_flow(daemon: &Daemon) {
    let cli = daemon.cli(KEY1);
    assert_ne!(
        cli.run(&["create", "--deny", "10.0.0.0/8"]).code,
        0,
        "--deny without a mode that lets anything out"
    );
    let id = cli
        .ok(&["create", "--network", "open", "--deny", "192.0.2.0/24"])
        .stdout
        .trim()
        .to_string();
    let info: serde_json::Value =
        serde_json::from_str(&cli.ok(&["info", &id, "--json"]).stdout).expect("info --json");
    assert_eq!(
        info["network"]["deny"],
        serde_json::json!(["192.0.2.0/24"]),
        "{info}"
    );
    let policy: serde_json::Value = serde_json::from_str(
        &cli.ok(&[
            "network",
            &id,
            "--mode",
            "allowlist",
            "--allow",
            "*.example.com:443",
            "--deny",
            "198.51.100.7",
            "--json",
        ])
        .stdout,
    )
    .expect("network --json");
    assert_eq!(
        (&policy["mode"], &policy["allow"], &policy["deny"]),
        (
            &serde_json::json!("allowlist"),
            &serde_json::json!(["*.example.com:443"]),
            &serde_json::json!(["198.51.100.7/32"])
        ),
        "{policy}"
    );
    let shown = cli.ok(&["network", &id, "--mode", "open"]).stdout;
    assert_eq!(shown.trim(), "open");
    let refused = cli.run(&[
        "network",
        &id,
        "--mode",
        "allowlist",
        "--allow",
        "127.0.0.1",
    ]);
    assert!(
        refused.code != 0 && refused.stderr.contains("SANDBOX-NETWORK-RULE"),
        "a loopback allow entry: {refused:?}"
    );
    assert_ne!(
        cli.run(&["network", &id, "--mode", "open", "--allow", "example.com"])
            .code,
        0,
        "--allow needs --mode allowlist"
    );
    cli.ok(&["kill", &id]);

    let set = cli.run_with_stdin(
        &["secret", "set", "E2E_TOKEN", "--host", "api.example.com"],
        Some("v3ry-s3cret\n"),
    );
    assert_eq!((set.code, set.stdout.trim()), (0, "E2E_TOKEN"), "{set:?}");
    let listed = cli.ok(&["secret", "ls", "--json"]).stdout;
    assert!(
        listed.contains("api.example.com") && !listed.contains("v3ry-s3cret"),
        "{listed}"
    );
    let empty = cli.run_with_stdin(
        &["secret", "set", "E2E_EMPTY", "--host", "a.example"],
        Some(""),
    );
    assert!(
        empty.code != 0 && empty.stderr.contains("no secret value"),
        "{empty:?}"
    );
    let id = cli
        .ok(&["create", "--network", "open", "--secret", "E2E_TOKEN"])
        .stdout
        .trim()
        .to_string();
    let seen = cli.ok(&["exec", &id, "--", "printenv", "E2E_TOKEN"]).stdout;
    assert!(
        !seen.trim().is_empty() && !seen.contains("v3ry-s3cret"),
        "the session sees a placeholder: {seen:?}"
    );
    cli.ok(&["kill", &id]);
    cli.ok(&["secret", "rm", "E2E_TOKEN"]);
    assert!(!cli.ok(&["secret", "ls"]).stdout.contains("E2E_TOKEN"));
    let missing = cli.run(&["secret", "rm", "E2E_TOKEN"]);
    assert!(
        missing.code != 0 && missing.stderr.contains("SANDBOX-"),
        "{missing:?}"
    );
}

/// `webhook add/ls/deliveries/rm` against a receiver on loopback that answers 200.
fn webhook_flow(daemon: &Daemon) {
    let receiver = std::net::TcpListener::bind("127.0.0.1:0").expect("receiver");
    let hook_url = format!(
        "http://{}/hook",
        receiver.local_addr().expect("receiver address")
    );
    receiver
        .set_nonblocking(true)
        .expect("non-blocking receiver");
    let received = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut conn = loop {
            match receiver.accept() {
                Ok((conn, _)) => break conn,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("no delivery within 30 s: {e}"),
            }
        };
        conn.set_nonblocking(false).ok();
        conn.set_read_timeout(Some(Duration::from_secs(10))).ok();
        let mut request = Vec::new();
        let mut buf = [0u8; 4096];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            match conn.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => request.extend_from_slice(&buf[..n]),
            }
        }
        let _ =
            conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        String::from_utf8_lossy(&request).into_owned()
    });
    let cli = daemon.cli(KEY2);
    let refused = cli.run(&["webhook", "add", "ftp://127.0.0.1/x"]);
    assert!(
        refused.code != 0 && refused.stderr.contains("SANDBOX-"),
        "{refused:?}"
    );
    assert_ne!(
        cli.run(&["webhook", "add", &hook_url, "--event", "session.exploded"])
            .code,
        0,
        "an unknown event type"
    );
    let added: serde_json::Value = serde_json::from_str(
        &cli.ok(&[
            "webhook",
            "add",
            &hook_url,
            "--event",
            "session.created",
            "--json",
        ])
        .stdout,
    )
    .expect("webhook add --json");
    let hook_id = added["id"].as_str().expect("webhook id").to_string();
    assert!(
        added["secret"].as_str().is_some_and(|s| s.len() >= 16),
        "{added}"
    );
    let listed = cli.ok(&["webhook", "ls"]).stdout;
    assert!(
        listed.contains(&hook_id) && listed.contains("session.created"),
        "{listed}"
    );
    assert!(
        !listed.contains(added["secret"].as_str().unwrap_or("-")),
        "{listed}"
    );

    let id = cli.ok(&["create"]).stdout.trim().to_string();
    let request = received.join().expect("receiver thread");
    assert!(request.contains("POST /hook"), "{request}");
    assert!(
        request.to_ascii_lowercase().contains("koder-signature: t="),
        "{request}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let deliveries: serde_json::Value = serde_json::from_str(
            &cli.ok(&["webhook", "deliveries", &hook_id, "--json"])
                .stdout,
        )
        .expect("deliveries --json");
        let delivered = deliveries.as_array().is_some_and(|d| {
            d.iter()
                .any(|d| d["event_type"] == "session.created" && d["state"] == "delivered")
        });
        if delivered {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never marked delivered: {deliveries}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_ne!(
        daemon
            .cli(KEY1)
            .run(&["webhook", "deliveries", &hook_id])
            .code,
        0,
        "another tenant's webhook"
    );
    cli.ok(&["webhook", "rm", &hook_id]);
    assert!(!cli.ok(&["webhook", "ls"]).stdout.contains(&hook_id));
    cli.ok(&["kill", &id]);
}

const ADMIN_KEY: &str = "e2e-admin-key-0123456789";

/// `ksandbox admin tenant ...` and `ksandbox metrics`, with the admin key from the environment.
fn admin_flow(daemon: &Daemon) {
    let tenant_cli = daemon.cli(KEY1);
    let refused = tenant_cli.run(&["admin", "tenant", "ls"]);
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(
        refused.stderr.contains("SANDBOX-PERMISSION-DENIED"),
        "{refused:?}"
    );
    assert!(
        refused.stderr.contains("admin_keys") && refused.stderr.contains("--admin-key"),
        "{refused:?}"
    );

    let admin = daemon.cli(ADMIN_KEY);
    let set = admin.ok(&[
        "admin",
        "tenant",
        "set",
        "e2e-co",
        "--plan",
        "standard",
        "--max-sessions",
        "1",
    ]);
    let row: Vec<&str> = set
        .stdout
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert!(set.stdout.starts_with("ID"), "{set:?}");
    assert_eq!(row[..3], ["e2e-co", "standard", "0/1"], "{set:?}");
    let got: serde_json::Value = serde_json::from_str(
        &admin
            .ok(&["admin", "tenant", "get", "e2e-co", "--json"])
            .stdout,
    )
    .expect("tenant get --json");
    assert_eq!(
        (got["plan"].as_str(), got["max_sessions"].as_u64()),
        (Some("standard"), Some(1))
    );
    let key = admin
        .ok(&["admin", "tenant", "key", "e2e-co"])
        .stdout
        .trim()
        .to_string();
    assert!(key.starts_with("ksk_"), "{key}");
    let co = daemon.cli(&key);
    let id = co.ok(&["create"]).stdout.trim().to_string();
    let over = co.run(&["create"]);
    assert!(over.stderr.contains("SANDBOX-QUOTA-SESSIONS"), "{over:?}");
    let metrics: serde_json::Value =
        serde_json::from_str(&co.ok(&["metrics", &id, "--json"]).stdout).expect("metrics JSON");
    let table = co.ok(&["metrics", &id]).stdout;
    assert!(
        table.lines().any(|l| l.starts_with("pids_current")),
        "{table}"
    );
    assert!(
        metrics["pids_current"].as_u64().unwrap_or(0) >= 1,
        "{metrics}"
    );
    let listed = admin.ok(&["admin", "tenant", "ls", "--json"]);
    let tenants: serde_json::Value =
        serde_json::from_str(&listed.stdout).expect("tenant ls --json");
    let co_row = tenants
        .as_array()
        .and_then(|t| t.iter().find(|t| t["id"] == "e2e-co"))
        .expect("e2e-co listed");
    assert_eq!(co_row["live_sessions"], 1);
    // This daemon is the one node of its store: listed up, with its capacity.
    let nodes = admin.ok(&["admin", "nodes"]);
    assert!(
        nodes.stdout.starts_with("NODE") && nodes.stdout.contains(" up "),
        "{nodes:?}"
    );
    let nodes: serde_json::Value =
        serde_json::from_str(&admin.ok(&["admin", "nodes", "--json"]).stdout)
            .expect("nodes --json");
    assert_eq!(nodes.as_array().map(Vec::len), Some(1), "{nodes}");
    assert_eq!(nodes[0]["state"], "up");
    assert!(nodes[0]["capacity_sandboxes"].as_u64() > Some(0), "{nodes}");
    assert!(
        tenant_cli
            .run(&["admin", "nodes"])
            .stderr
            .contains("admin_keys"),
        "a tenant key is told where admin keys come from"
    );
    // A build id the daemon never made: its typed error, exit status 1, both forms.
    for args in [
        &["image", "build-status", "nosuch"][..],
        &["image", "build-status", "nosuch", "--follow"],
    ] {
        let out = admin.run(args);
        assert_eq!(out.code, 1, "{out:?}");
        assert!(
            out.stderr.contains("SANDBOX-IMAGE-BUILD-NOT-FOUND"),
            "{out:?}"
        );
    }
    admin.ok(&["admin", "tenant", "set", "e2e-co", "--plan", "none"]);
    co.ok(&["kill", &id]);
    let no_plan = co.run(&["create"]);
    assert!(
        no_plan.stderr.contains("SANDBOX-PLAN-REQUIRED"),
        "{no_plan:?}"
    );
}

async fn sdk_flow(url: &str) {
    let c1 = Client::new(url, KEY1).expect("client 1");
    let c2 = Client::new(url, KEY2).expect("client 2");
    assert!(c1.health().await, "health");

    // Auth: a present but invalid token is 401.
    let err = Client::new(url, "wrong-key")
        .expect("client")
        .list_sessions()
        .await
        .expect_err("bad key must be refused");
    assert_eq!(err.status(), Some(401), "{err}");
    assert_eq!(err.code(), Some(koder_sdk::codes::AUTH), "{err}");

    // Create / get / list.
    let mut session = c1
        .create_session(&CreateSession {
            language: Some("python".into()),
            timeout_s: Some(600),
            env: BTreeMap::from([("SESSION_VAR".into(), "from-session".into())]),
            metadata: BTreeMap::from([("suite".into(), "e2e".into())]),
            ..Default::default()
        })
        .await
        .expect("create session");
    let id = session.id().to_string();
    let info = session.info().clone();
    assert_eq!(info.language, "python");
    assert_eq!(info.state, koder_sdk::SessionState::Running);
    assert_eq!(info.metadata.get("suite").map(String::as_str), Some("e2e"));
    assert!(info.expires_at > info.created_at);
    let fetched = c1.get_session(&id).await.expect("get session");
    assert_eq!(fetched.id, id);
    assert_eq!(fetched.tenant_id, info.tenant_id);
    let listed = c1.list_sessions().await.expect("list");
    assert!(listed.iter().any(|s| s.id == id), "own session listed");

    // Tenant isolation: another tenant sees 404, exactly like an unknown id.
    let other = c2.list_sessions().await.expect("list as t2");
    assert!(
        other.iter().all(|s| s.id != id),
        "t2 must not list t1's session"
    );
    for err in [
        c2.get_session(&id).await.expect_err("t2 get").to_string(),
        c2.exec(
            &id,
            &ExecRequest {
                cmd: Some(vec!["true".into()]),
                ..Default::default()
            },
        )
        .await
        .expect_err("t2 exec")
        .to_string(),
        c2.download(&id, "/etc/hostname")
            .await
            .expect_err("t2 download")
            .to_string(),
        c2.destroy_session(&id)
            .await
            .expect_err("t2 destroy")
            .to_string(),
    ] {
        assert!(err.starts_with("SANDBOX-NOT-FOUND"), "{err}");
    }
    let err = c1
        .get_session("no-such-session")
        .await
        .expect_err("unknown");
    assert_eq!(err.code(), Some(koder_sdk::codes::NOT_FOUND));
    assert_eq!(err.status(), Some(404));

    // Exec: argv, exit codes, shell, code, env/cwd/stdin.
    let r = session.run_cmd(["echo", "hello"]).await.expect("exec cmd");
    assert_eq!(
        (r.exit_code, r.stdout.as_str(), r.verdict.as_deref()),
        (Some(0), "hello\n", None)
    );
    let r = session
        .run_cmd(["sh", "-c", "echo oops >&2; exit 7"])
        .await
        .expect("exec exit 7");
    assert_eq!((r.exit_code, r.stderr.as_str()), (Some(7), "oops\n"));
    let r = session.run_shell("echo hi | wc -c").await.expect("shell");
    assert_eq!(r.stdout.trim(), "3", "{r:?}");
    let r = session
        .run_code(
            "python",
            "import sys\nprint(sum(range(10)), file=sys.stdout)",
        )
        .await
        .expect("code");
    assert_eq!((r.exit_code, r.stdout.as_str()), (Some(0), "45\n"), "{r:?}");
    let r = session
        .exec(&ExecRequest {
            shell: Some("cat; echo $FOO $SESSION_VAR; pwd".into()),
            env: BTreeMap::from([("FOO".into(), "bar".into())]),
            cwd: Some("/tmp".into()),
            stdin: Some("from-stdin\n".into()),
            ..Default::default()
        })
        .await
        .expect("exec env/cwd/stdin");
    assert_eq!(r.stdout, "from-stdin\nbar from-session\n/tmp\n", "{r:?}");

    // A timed-out exec keeps its partial output and names the verdict.
    let started = Instant::now();
    let r = session
        .exec(&ExecRequest {
            shell: Some("echo before; sleep 30; echo after".into()),
            timeout_ms: Some(1000),
            ..Default::default()
        })
        .await
        .expect("exec timeout");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "timeout honoured"
    );
    assert_eq!(
        r.verdict.as_deref(),
        Some(koder_sdk::codes::EXEC_TIMEOUT),
        "{r:?}"
    );
    assert_eq!(r.stdout, "before\n", "{r:?}");

    // Typed error for a bad request: exactly one of cmd/shell/code.
    for bad in [
        ExecRequest::default(),
        ExecRequest {
            cmd: Some(vec!["true".into()]),
            shell: Some("true".into()),
            ..Default::default()
        },
    ] {
        let err = session.exec(&bad).await.expect_err("bad exec request");
        assert_eq!(err.status(), Some(400), "{err}");
        assert_eq!(
            err.code(),
            Some(koder_sdk::codes::INVALID_ARGUMENT),
            "{err}"
        );
    }

    // Files: mkdir, a 5 MiB streamed round trip, move, list, remove.
    let local = tempfile::tempdir().expect("local tempdir");
    let big = pseudo_random(5 * 1024 * 1024, 42);
    let big_path = local.path().join("big.bin");
    std::fs::write(&big_path, &big).expect("write big file");

    session.mkdir("/workspace/e2e/sub").await.expect("mkdir");
    let entry = session
        .upload_file("/workspace/e2e/big.bin", &big_path)
        .await
        .expect("upload 5 MiB (sized stream)");
    assert_eq!(entry.size, big.len() as u64, "{entry:?}");
    assert_eq!(entry.kind, koder_sdk::EntryType::File);
    let file = tokio::fs::File::open(&big_path).await.expect("open");
    session
        .upload("/workspace/e2e/chunked.bin", file)
        .await
        .expect("upload 5 MiB (chunked stream)");
    let r = session
        .run_cmd([
            "wc",
            "-c",
            "/workspace/e2e/big.bin",
            "/workspace/e2e/chunked.bin",
        ])
        .await
        .expect("wc");
    assert!(r.stdout.contains("5242880 /workspace/e2e/big.bin"), "{r:?}");
    assert!(
        r.stdout.contains("5242880 /workspace/e2e/chunked.bin"),
        "{r:?}"
    );

    let back = local.path().join("back.bin");
    let n = session
        .download_to(
            "/workspace/e2e/chunked.bin",
            tokio::fs::File::create(&back).await.expect("create"),
        )
        .await
        .expect("download_to");
    assert_eq!(n, big.len() as u64);
    assert!(
        std::fs::read(&back).expect("read back") == big,
        "5 MiB round trip differs"
    );

    let odd = "/workspace/e2e/a b&c=d#e?.txt";
    session
        .upload(odd, "odd name".to_string())
        .await
        .expect("upload odd name");
    assert_eq!(
        &session.download(odd).await.expect("download odd")[..],
        b"odd name"
    );

    session
        .rename("/workspace/e2e/big.bin", "/workspace/e2e/sub/moved.bin")
        .await
        .expect("move");
    let err = session
        .download("/workspace/e2e/big.bin")
        .await
        .expect_err("moved away");
    assert_eq!(err.code(), Some(koder_sdk::codes::NOT_FOUND), "{err}");
    let list = session.list("/workspace/e2e", Some(2)).await.expect("list");
    let paths: Vec<&str> = list.entries.iter().map(|e| e.path.as_str()).collect();
    assert!(paths.contains(&"/workspace/e2e/sub/moved.bin"), "{paths:?}");
    assert!(paths.contains(&odd), "{paths:?}");
    assert!(!paths.contains(&"/workspace/e2e/big.bin"), "{paths:?}");
    let moved = list
        .entries
        .iter()
        .find(|e| e.path == "/workspace/e2e/sub/moved.bin")
        .expect("moved entry");
    assert_eq!(moved.size, big.len() as u64);
    let sub = list
        .entries
        .iter()
        .find(|e| e.path == "/workspace/e2e/sub")
        .expect("sub entry");
    assert_eq!(sub.kind, koder_sdk::EntryType::Dir);
    let shallow = session
        .list("/workspace/e2e", Some(1))
        .await
        .expect("list 1");
    assert!(
        shallow
            .entries
            .iter()
            .all(|e| e.path != "/workspace/e2e/sub/moved.bin"),
        "depth 1 must not descend"
    );

    session.remove(odd, false).await.expect("remove a file");
    assert!(
        session.remove("/workspace/e2e", false).await.is_err(),
        "non-recursive removal of a non-empty dir must fail"
    );
    session
        .remove("/workspace/e2e", true)
        .await
        .expect("remove recursively");
    let err = session
        .list("/workspace/e2e", None)
        .await
        .expect_err("gone");
    assert_eq!(err.code(), Some(koder_sdk::codes::NOT_FOUND), "{err}");

    // Timeout, refresh, destroy.
    let before = unix_now();
    let updated = session.set_timeout(120).await.expect("set timeout").clone();
    let remaining = updated.expires_at.timestamp() - before;
    assert!((60..=180).contains(&remaining), "expires in {remaining}s");
    let refreshed = session.refresh().await.expect("refresh").clone();
    // (The timeout answer may carry finer precision than the stored value.)
    let drift = (refreshed.expires_at - updated.expires_at)
        .num_milliseconds()
        .abs();
    assert!(drift < 1000, "{refreshed:?} vs {updated:?}");

    session.destroy().await.expect("destroy");
    // A destroyed session is either gone or kept as a `stopped` record; it runs nothing.
    match c1.get_session(&id).await {
        Ok(info) => assert_eq!(info.state, koder_sdk::SessionState::Stopped),
        Err(err) => assert_eq!(err.code(), Some(koder_sdk::codes::NOT_FOUND), "{err}"),
    }
    let err = c1
        .exec(
            &id,
            &ExecRequest {
                cmd: Some(vec!["true".into()]),
                ..Default::default()
            },
        )
        .await
        .expect_err("exec in a destroyed session");
    assert_eq!(err.code(), Some(koder_sdk::codes::NOT_FOUND), "{err}");
    let listed = c1.list_sessions().await.expect("list after destroy");
    assert!(listed.iter().all(|s| s.id != id));
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}

fn cli_flow(daemon: &Daemon) {
    let cli = daemon.cli(KEY1);
    let work = tempfile::tempdir().expect("tempdir");

    let out = cli.ok(&[
        "create",
        "--language",
        "python",
        "--timeout",
        "600",
        "--meta",
        "suite=cli",
    ]);
    let id = out.stdout.trim().to_string();
    assert!(
        !id.is_empty() && !id.contains(char::is_whitespace),
        "{out:?}"
    );
    assert!(cli.session_ids().contains(&id));
    let table = cli.ok(&["ls"]);
    assert!(table.stdout.starts_with("ID"), "{table:?}");
    assert!(table.stdout.contains(&id), "{table:?}");

    let out = cli.ok(&["--json", "create", "--language", "bash"]);
    let created: serde_json::Value = serde_json::from_str(&out.stdout).expect("create --json");
    let id2 = created["id"].as_str().expect("id").to_string();
    assert_eq!(created["language"], "bash");

    // exec: exit code propagation, streams, shell form, stdin.
    let out = cli.run(&["exec", &id, "--", "sh", "-c", "exit 3"]);
    assert_eq!(out.code, 3, "{out:?}");
    let out = cli.ok(&["exec", &id, "--", "echo", "hello", "world"]);
    assert_eq!(out.stdout, "hello world\n");
    let out = cli.run(&["exec", &id, "--shell", "echo out; echo err >&2; exit 5"]);
    assert_eq!(
        (out.code, out.stdout.as_str(), out.stderr.as_str()),
        (5, "out\n", "err\n"),
        "{out:?}"
    );
    let out = cli.run_with_stdin(
        &["exec", &id, "--stdin-file", "-", "--", "cat"],
        Some("piped in"),
    );
    assert_eq!((out.code, out.stdout.as_str()), (0, "piped in"), "{out:?}");
    let out = cli.ok(&[
        "exec",
        &id,
        "--cwd",
        "/tmp",
        "-e",
        "X=y",
        "--shell",
        "echo $X; pwd",
    ]);
    assert_eq!(out.stdout, "y\n/tmp\n");
    let out = cli.run(&["exec", &id, "--timeout-ms", "1000", "--", "sleep", "30"]);
    assert_ne!(out.code, 0, "{out:?}");
    assert!(out.stderr.contains("SANDBOX-EXEC-TIMEOUT"), "{out:?}");
    let out = cli.run(&["exec", &id, "--json", "--", "sh", "-c", "echo j; exit 2"]);
    assert_eq!(out.code, 2, "{out:?}");
    let result: serde_json::Value = serde_json::from_str(&out.stdout).expect("exec --json");
    assert_eq!(
        (result["exit_code"].as_i64(), result["stdout"].as_str()),
        (Some(2), Some("j\n"))
    );

    // cp both ways (and into a directory), rm.
    let up = work.path().join("up.bin");
    let data = pseudo_random(1024 * 1024 + 17, 7);
    std::fs::write(&up, &data).expect("write up.bin");
    let up_s = up.to_str().expect("utf-8 path");
    cli.ok(&["cp", up_s, &format!("{id}:/workspace/up.bin")]);
    cli.ok(&["cp", up_s, &format!("{id}:/workspace/")]); // same name, into the dir
    let down = work.path().join("down.bin");
    let down_s = down.to_str().expect("utf-8 path");
    cli.ok(&["cp", &format!("{id}:/workspace/up.bin"), down_s]);
    assert!(
        std::fs::read(&down).expect("down.bin") == data,
        "cp round trip differs"
    );
    let dir = work.path().join("into");
    std::fs::create_dir(&dir).expect("mkdir");
    cli.ok(&["cp", &format!("{id}:up.bin"), dir.to_str().expect("utf-8")]);
    assert!(std::fs::read(dir.join("up.bin")).expect("into/up.bin") == data);
    // session-to-session
    cli.ok(&[
        "cp",
        &format!("{id}:/workspace/up.bin"),
        &format!("{id2}:/tmp/copy.bin"),
    ]);
    let out = cli.ok(&["exec", &id2, "--", "wc", "-c", "/tmp/copy.bin"]);
    assert!(
        out.stdout.starts_with(&format!("{} ", data.len())),
        "{out:?}"
    );

    cli.ok(&["rm", &id, "/workspace/up.bin"]);
    let missing = work.path().join("missing.bin");
    let out = cli.run(&[
        "cp",
        &format!("{id}:/workspace/up.bin"),
        missing.to_str().expect("utf-8"),
    ]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stderr.starts_with("error: SANDBOX-NOT-FOUND: "),
        "{out:?}"
    );
    assert!(!missing.exists(), "a failed cp must not leave a file");
    cli.ok(&["mkdir", &id, "/workspace/d/e"]);
    let out = cli.ok(&["--json", "cp", up_s, &format!("{id}:/workspace/d/e/f.bin")]);
    let entry: serde_json::Value = serde_json::from_str(&out.stdout).expect("cp --json");
    assert_eq!(entry["size"].as_u64(), Some(data.len() as u64), "{entry}");
    let listed: serde_json::Value = serde_json::from_str(
        &cli.ok(&["files", &id, "/workspace/d", "--depth", "2", "--json"])
            .stdout,
    )
    .expect("files --json");
    let paths: Vec<&str> = listed["entries"]
        .as_array()
        .map(|e| e.iter().filter_map(|e| e["path"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(paths.len(), 2, "{listed}");
    assert!(paths.contains(&"/workspace/d/e/f.bin"), "{listed}");
    let table = cli
        .ok(&["files", &id, "/workspace/d", "--depth", "2"])
        .stdout;
    assert!(table.starts_with("TYPE"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("file") && l.ends_with("/workspace/d/e/f.bin")),
        "{table}"
    );
    let info: serde_json::Value =
        serde_json::from_str(&cli.ok(&["info", &id, "--json"]).stdout).expect("info --json");
    assert_eq!(info["id"].as_str(), Some(id.as_str()));
    let table = cli.ok(&["info", &id]).stdout;
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().eq(["language", "python"])),
        "{table}"
    );
    assert_ne!(cli.run(&["rm", &id, "/workspace/d"]).code, 0);
    cli.ok(&["rm", &id, "-r", "/workspace/d"]);

    // run: a throw-away session each time, always destroyed.
    let before = cli.session_ids();
    let out = cli.ok(&["run", "python", "-c", "print(1 + 1)"]);
    assert_eq!(out.stdout, "2\n");
    let script = work.path().join("script.py");
    std::fs::write(&script, "import sys\nprint('from file')\nsys.exit(4)\n").expect("script");
    let out = cli.run(&["run", "--file", script.to_str().expect("utf-8")]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (4, "from file\n"),
        "{out:?}"
    );
    let out = cli.run(&["run", "bash", "--", "sh", "-c", "exit 6"]);
    assert_eq!(out.code, 6, "{out:?}");
    let out = cli.run(&[
        "run",
        "python",
        "-c",
        "raise SystemExit(",
        "--timeout-ms",
        "5000",
    ]);
    assert_ne!(out.code, 0, "a syntax error fails: {out:?}");
    assert_eq!(cli.session_ids(), before, "run must destroy its sessions");

    // run interrupted by SIGINT still destroys its session.
    let mut child = cli
        .command(&["run", "bash", "--", "sleep", "60"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn run");
    let deadline = Instant::now() + Duration::from_secs(30);
    while cli.session_ids().len() <= before.len() {
        assert!(Instant::now() < deadline, "run never created its session");
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_millis(500)); // let the exec start
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: our own child, not yet reaped.
        unsafe { libc::kill(pid, libc::SIGINT) };
    }
    let status = wait_timeout(&mut child, Duration::from_secs(30));
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    assert_eq!(status, Some(130), "interrupted run: {stderr}");
    assert_eq!(
        cli.session_ids(),
        before,
        "interrupted run must destroy its session"
    );

    // Errors: bad key, other tenant, usage.
    let out = daemon.cli("nope").run(&["ls"]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stderr.starts_with("error: SANDBOX-AUTH-001: "),
        "{out:?}"
    );
    let out = daemon.cli(KEY2).run(&["exec", &id, "--", "true"]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stderr.starts_with("error: SANDBOX-NOT-FOUND: "),
        "{out:?}"
    );
    assert_eq!(cli.run(&["exec", &id]).code, 2);

    // kill-processes: a background sleeper dies, the session stays and still runs commands.
    cli.ok(&["exec", &id, "--background", "--", "sleep", "300"]);
    let out = cli.ok(&["--json", "kill-processes", &id]);
    let killed: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("json");
    assert!(killed["killed"].as_u64() >= Some(1), "{out:?}");
    let out = cli.ok(&["exec", &id, "--shell", "pgrep -c sleep; true"]);
    assert_eq!(out.stdout.trim(), "0", "{out:?}");
    let out = cli.run(&["kill-processes", &id]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("processes killed"), "{out:?}");
    let out = daemon.cli(KEY2).run(&["kill-processes", &id]);
    assert!(
        out.stderr.starts_with("error: SANDBOX-NOT-FOUND: "),
        "{out:?}"
    );

    // kill / destroy.
    cli.ok(&["kill", &id]);
    cli.ok(&["destroy", &id2]);
    let out = cli.run(&["exec", &id, "--", "true"]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stderr.starts_with("error: SANDBOX-NOT-FOUND: "),
        "{out:?}"
    );
    let ids = cli.session_ids();
    assert!(!ids.contains(&id) && !ids.contains(&id2), "{ids:?}");

    // The killed session's event log: followed, it ends with the stop (logged behind the
    // kill's answer); the timeout above is in it.
    let out = cli.ok(&["events", &id, "--follow"]);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(
        lines[0].starts_with("1\t") && lines[0].contains("\tsession.created\t"),
        "{out:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("\texec.verdict\t")
                && l.contains("verdict=\"SANDBOX-EXEC-TIMEOUT\"")),
        "{out:?}"
    );
    let last = lines.last().copied().unwrap_or_default();
    assert!(
        last.contains("\tsession.stopped\t") && last.contains("cause=\"deleted\""),
        "{out:?}"
    );
    let out = cli.ok(&["--json", "events", &id, "--after", "1"]);
    let events: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("an event a line"))
        .collect();
    assert_eq!(events.len(), lines.len() - 1, "{out:?}");
    assert_eq!(events[0]["seq"], 2);
    assert!(events
        .iter()
        .all(|e| e["data"]["session_id"] == id.as_str()));
    let out = daemon.cli(KEY2).run(&["events", &id]);
    assert!(
        out.stderr.starts_with("error: SANDBOX-NOT-FOUND: "),
        "{out:?}"
    );
}

fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<i32> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        match child.try_wait() {
            Ok(Some(status)) => return status.code(),
            Ok(None) => std::thread::sleep(Duration::from_millis(100)),
            Err(_) => return None,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}
