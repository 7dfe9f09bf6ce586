//! The crate graph's rules (ARCHITECTURE.md), checked on every crate's Cargo.toml and on the
//! transports' sources, so a shortcut past the session manager fails the build's tests.
//!
//! - Transports (REST, E2B, CLI, SDK, and gRPC/MCP/console when they come) speak to sandboxes
//!   only through `koder-sessions`: they neither depend on nor name `koder-agent-protocol`, and
//!   do not reach the state store (`koder-store`) past the manager's tenancy rule.
//! - Only the session manager and the runtimes (and the agent itself) speak the agent
//!   protocol: no other crate (the image builder, the store, ...) depends on it or names it.
//! - Runtimes know nothing of sessions or transports.
//! - Nothing depends on the daemon crate `koder-sandbox`, except the CLI, which launches it.

use std::path::{Path, PathBuf};

const TRANSPORTS: &[&str] = &[
    "koder-http",
    "koder-e2b",
    "ksandbox",
    "koder-sdk",
    "koder-grpc",
    "koder-mcp",
    "koder-console",
    "koder-cluster",
];
const RUNTIMES: &[&str] = &["koder-runtime", "koder-jail", "koder-microvm"];
/// The crates that speak the agent protocol: the protocol and the agent, the session manager,
/// the runtimes and the in-memory runtime that fakes them for tests.
const PROTOCOL_SPEAKERS: &[&str] = &[
    "koder-agent-protocol",
    "koder-agent",
    "koder-sessions",
    "koder-runtime",
    "koder-jail",
    "koder-microvm",
    "koder-runtime-memory",
];
/// Crates allowed the protocol's data types but not its conversation: `koder-image` resolves
/// an image into the read-only binds (`init::Bind`) a runtime hands its agent at start.
const PROTOCOL_TYPES_ONLY: &[&str] = &["koder-image"];
const ABOVE_RUNTIMES: &[&str] = &[
    "koder-sessions",
    "koder-http",
    "koder-e2b",
    "koder-store",
    "koder-cluster",
];
const PROTOCOL_CRATE: &str = "koder_agent_protocol";
const DAEMON: &str = "koder-sandbox";
/// `ksandbox serve` runs the daemon in-process.
const DAEMON_LAUNCHERS: &[&str] = &["ksandbox"];

struct Crate {
    name: String,
    dir: PathBuf,
    /// Normal and build dependencies (dev-dependencies may reach further, to test).
    deps: Vec<String>,
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn crates() -> Vec<Crate> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(workspace().join("crates")).unwrap() {
        let dir = entry.unwrap().path();
        let Ok(text) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        out.push(parse_manifest(&text, dir));
    }
    assert!(out.len() > 5, "no crates found under crates/");
    out
}

fn parse_manifest(text: &str, dir: PathBuf) -> Crate {
    let doc: toml::Table = text.parse().unwrap_or_else(|e| panic!("{dir:?}: {e}"));
    let name = doc["package"]["name"].as_str().unwrap().to_string();
    let deps = ["dependencies", "build-dependencies"]
        .iter()
        .filter_map(|k| doc.get(*k).and_then(|t| t.as_table()))
        .flat_map(|t| t.keys().cloned())
        .collect();
    Crate { name, dir, deps }
}

/// Lines (1-based) of `source` that name the agent protocol crate in code, not in a comment.
fn protocol_mentions(source: &str) -> Vec<usize> {
    source
        .lines()
        .enumerate()
        .filter(|(_, line)| {
            let code = line.split("//").next().unwrap_or("");
            code.contains(PROTOCOL_CRATE)
        })
        .map(|(i, _)| i + 1)
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() && path.file_name().is_some_and(|n| n != "target") {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Broken dependency rules, one line each.
fn manifest_violations(crates: &[Crate]) -> Vec<String> {
    let mut bad = Vec::new();
    for c in crates {
        let depends = |dep: &str| c.deps.iter().any(|d| d == dep);
        if TRANSPORTS.contains(&c.name.as_str()) {
            for dep in ["koder-agent-protocol", "koder-store"] {
                if depends(dep) {
                    bad.push(format!("transport {} depends on {dep}", c.name));
                }
            }
        } else if !speaks_protocol(&c.name) && depends("koder-agent-protocol") {
            bad.push(format!("{} depends on koder-agent-protocol", c.name));
        }
        if RUNTIMES.contains(&c.name.as_str()) {
            for dep in ABOVE_RUNTIMES.iter().filter(|d| depends(d)) {
                bad.push(format!("runtime {} depends on {dep}", c.name));
            }
        }
        if depends(DAEMON) && !DAEMON_LAUNCHERS.contains(&c.name.as_str()) {
            bad.push(format!("{} depends on the daemon crate {DAEMON}", c.name));
        }
    }
    bad
}

fn speaks_protocol(name: &str) -> bool {
    PROTOCOL_SPEAKERS.contains(&name) || PROTOCOL_TYPES_ONLY.contains(&name)
}

/// Sources naming the agent protocol outside the crates that speak it, as `file:line`: all of
/// a transport's files, the code (not the tests) of every other crate.
fn source_violations(crates: &[Crate]) -> Vec<String> {
    let mut bad = Vec::new();
    for c in crates.iter().filter(|c| !speaks_protocol(&c.name)) {
        let mut files = Vec::new();
        if TRANSPORTS.contains(&c.name.as_str()) {
            rust_files(&c.dir, &mut files);
        } else {
            let src = c.dir.join("src");
            if src.is_dir() {
                rust_files(&src, &mut files);
            }
            files.extend(Some(c.dir.join("build.rs")).filter(|f| f.is_file()));
        }
        for f in files {
            let source = std::fs::read_to_string(&f).unwrap();
            for line in protocol_mentions(&source) {
                bad.push(format!("{}:{line} names {PROTOCOL_CRATE}", f.display()));
            }
        }
    }
    bad
}

#[test]
fn the_crate_graph_keeps_its_rules() {
    let all = crates();
    let mut bad = manifest_violations(&all);
    bad.extend(source_violations(&all));
    assert!(
        bad.is_empty(),
        "architecture rules broken:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_checker_finds_an_import_but_not_a_comment() {
    let source = "use std::io;\n// koder_agent_protocol is not for transports\nuse koder_agent_protocol::ToAgent;\nfn f() { koder_agent_protocol::relay(); } // x\n";
    assert_eq!(protocol_mentions(source), vec![3, 4]);
    assert!(protocol_mentions("use koder_sessions::Terminal;").is_empty());
}

#[test]
fn the_checker_finds_forbidden_dependencies() {
    let manifest = |name: &str, deps: &str| {
        parse_manifest(
            &format!("[package]\nname = \"{name}\"\n[dependencies]\n{deps}"),
            PathBuf::from("unused"),
        )
    };
    let found = manifest_violations(&[
        manifest(
            "koder-e2b",
            "koder-agent-protocol.workspace = true\nkoder-sessions.workspace = true\n",
        ),
        manifest("koder-mcp", "koder-store = { path = \"x\" }\n"),
        manifest("koder-jail", "koder-sessions = { path = \"x\" }\n"),
        manifest("koder-bench", "koder-sandbox = { path = \"x\" }\n"),
        manifest("ksandbox", "koder-sandbox = { path = \"x\" }\n"),
        manifest("koder-sessions", "koder-agent-protocol.workspace = true\n"),
        manifest("koder-build", "koder-agent-protocol.workspace = true\n"),
        manifest("koder-store", "koder-agent-protocol = { path = \"x\" }\n"),
        manifest("koder-jail", "koder-agent-protocol.workspace = true\n"),
    ]);
    assert_eq!(
        found,
        [
            "transport koder-e2b depends on koder-agent-protocol",
            "transport koder-mcp depends on koder-store",
            "runtime koder-jail depends on koder-sessions",
            "koder-bench depends on the daemon crate koder-sandbox",
            "koder-build depends on koder-agent-protocol",
            "koder-store depends on koder-agent-protocol",
        ]
    );
}
