//! The bottom layer of every sandbox's root: the agent's binary as `sudo`
//! ([`link_sudo_layer`]), hard links to the agent this runtime starts. A lower layer rather than
//! a bind mount: nothing to mount per sandbox, and a bind would show the binary's host path in
//! the sandbox's mountinfo (the overlay names its layers by staging symlinks only).

use std::path::{Path, PathBuf};

use koder_agent_protocol::init::link_sudo_layer;
use koder_runtime::RuntimeError;

/// Makes the layer afresh under `state_dir` for `agent` (installed there, so on the same
/// filesystem); links from an earlier start may name an agent since replaced.
pub(crate) fn install(agent: &Path, state_dir: &Path) -> Result<PathBuf, RuntimeError> {
    let layer = state_dir.join("sudo");
    match std::fs::remove_dir_all(&layer) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(RuntimeError::io(format!("remove {}", layer.display()))(e))
        }
        _ => {}
    }
    link_sudo_layer(agent, &layer).map_err(RuntimeError::io(format!(
        "link the agent as sudo in {}",
        layer.display()
    )))?;
    Ok(layer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use koder_agent_protocol::init::SUDO_PATHS;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn the_layer_links_the_agent_at_every_sudo_path_and_is_remade() {
        let state = tempfile::tempdir().unwrap();
        let agent = state.path().join("agent");
        std::fs::write(&agent, "one").unwrap();
        let layer = install(&agent, state.path()).unwrap();
        for path in SUDO_PATHS {
            let file = layer.join(path.trim_start_matches('/'));
            assert_eq!(
                std::fs::metadata(&file).unwrap().ino(),
                std::fs::metadata(&agent).unwrap().ino()
            );
            let parent = std::fs::metadata(file.parent().unwrap()).unwrap();
            assert_eq!(parent.mode() & 0o777, 0o755);
        }
        // An agent replaced by rename (as install_executable does) is linked anew.
        let next = state.path().join("agent.new");
        std::fs::write(&next, "two").unwrap();
        std::fs::rename(&next, &agent).unwrap();
        let layer = install(&agent, state.path()).unwrap();
        let file = layer.join(SUDO_PATHS[0].trim_start_matches('/'));
        assert_eq!(std::fs::read_to_string(file).unwrap(), "two");
    }
}
