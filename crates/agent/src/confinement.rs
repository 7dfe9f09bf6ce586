//! What the walls put in force: established at boot (`boot::confine`), reported while serving
//! (health). A leaf so neither phase depends on the other.

/// What the agent managed to put in force, reported by its health call.
#[derive(Debug, Clone, Copy, Default)]
pub struct Confinement {
    pub no_new_privs: bool,
    pub seccomp: bool,
    pub landlock_abi: u32,
}
