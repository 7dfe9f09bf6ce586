//! The agent server in-process over an in-memory pipe, shared by the agent's test binaries.
//! No namespaces: the file root is a temp dir and processes run on the host.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::Path;
use std::sync::{Arc, OnceLock};

use koder_agent::confinement::Confinement;
use koder_agent::serve::exec::{ExecDefaults, Reaper};
use koder_agent::serve::fs::Fs;
use koder_agent::serve::server::{serve_connection, Agent};
use koder_agent_protocol::AgentClient;

/// One runtime and one reaper for the whole binary: the reaper waits on any child, so two
/// reapers in one process would steal each other's exit statuses.
pub fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    })
}

fn reaper() -> Arc<Reaper> {
    static REAPER: OnceLock<Arc<Reaper>> = OnceLock::new();
    REAPER
        .get_or_init(|| rt().block_on(async { Reaper::start().unwrap() }))
        .clone()
}

/// An agent whose root is `root` (with a `workspace` dir), PATH=/usr/bin:/bin plus `env`.
pub fn agent(root: &Path, env: &[(&str, &str)]) -> Arc<Agent> {
    std::fs::create_dir_all(root.join("workspace")).unwrap();
    let fs = Fs::new(root, "/workspace").unwrap();
    let mut vars = vec![("PATH".to_string(), "/usr/bin:/bin".to_string())];
    vars.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let defaults = ExecDefaults {
        env: vars,
        workdir: root.to_string_lossy().into_owned(),
    };
    Arc::new(Agent::new(reaper(), fs, defaults, Confinement::default()))
}

/// A client connected to `agent` through an in-memory pipe.
pub fn connect(agent: Arc<Agent>) -> AgentClient {
    rt().block_on(async move {
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        tokio::spawn(serve_connection(agent, theirs));
        let (r, w) = tokio::io::split(ours);
        AgentClient::new(r, w)
    })
}
