//! The bottom layer of every sandbox's root: the agent's binary as `sudo`, at each of
//! [`SUDO_PATHS`], hard links to the agent this runtime starts. A lower layer rather than a bind
//! mount: nothing to mount per sandbox, and a bind would show the binary's host path in the
//! sandbox's mountinfo (the overlay names its layers by staging symlinks only). Bottom, so an
//! image's own file of that name wins.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use koder_agent_protocol::init::SUDO_PATHS;
use koder_runtime::RuntimeError;

/// Makes the layer afresh under `state_dir` for `agent` (installed there, so on the same
/// filesystem); links from an earlier start may name an agent since replaced.
pub(crate) fn install(agent: &Path, state_dir: &Path) -> Result<PathBuf, RuntimeError> {
    let layer = state_dir.join("sudo");
    let fail = |what: String| move |e: std::io::Error| RuntimeError::io(what)(e);
    match std::fs::remove_dir_all(&layer) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(fail(format!("remove {}", layer.display()))(e))
        }
        _ => {}
    }
    for path in SUDO_PATHS {
        let file = layer.join(path.trim_start_matches('/'));
        let Some(dir) = file.parent() else { continue };
        make_public_dirs(&layer, dir).map_err(fail(format!("create {}", dir.display())))?;
        std::fs::hard_link(agent, &file)
            .or_else(|_| std::fs::copy(agent, &file).map(drop))
            .map_err(fail(format!("link the agent at {}", file.display())))?;
    }
    Ok(layer)
}

/// `dir` and its parents up to and including `top`, each 0755 whatever the umask: sandbox
/// processes look up these directories where no image has them.
fn make_public_dirs(top: &Path, dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for d in dir.ancestors().take_while(|d| d.starts_with(top)) {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
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
