//! The walls every process of the sandbox lives behind, the agent included.
//!
//! Applied once by the agent after the root is built and before it serves anything, so untrusted
//! code only ever starts inside them: lowered rlimits, a reduced capability bounding set,
//! no_new_privs, Landlock (writes only below the writable directories) and a seccomp filter that
//! refuses the syscalls a sandbox never needs.

#[cfg(test)]
use std::collections::BTreeMap;

use koder_agent_protocol::init::Rlimits;
use std::os::fd::BorrowedFd;

use landlock::{
    path_beneath_rules, Access, AccessFs, PathBeneath, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus, ABI,
};
#[cfg(test)]
use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch,
};

use super::seccomp_bpf;

use crate::confinement::Confinement;
use crate::setup_error::{SetupError, Step};

/// Capabilities (inside the sandbox's own user namespace) that processes the agent starts may
/// still hold: enough to act as root over the sandbox's own files, nothing that reaches kernel
/// or namespace administration (no SYS_ADMIN, SYS_PTRACE, NET_ADMIN, SYS_MODULE, ...). The agent
/// keeps its own set, so its children's permitted set is never a superset of it and they cannot
/// ptrace it.
const KEPT_CAPS: &[u32] = &[
    0,  // CHOWN
    1,  // DAC_OVERRIDE
    2,  // DAC_READ_SEARCH
    3,  // FOWNER
    4,  // FSETID
    5,  // KILL
    6,  // SETGID
    7,  // SETUID
    8,  // SETPCAP
    10, // NET_BIND_SERVICE
    29, // AUDIT_WRITE
    31, // SETFCAP
];

/// `readable`: directories outside the sandbox root the agent itself must still read (the
/// overlay's upper layer, for snapshots), by descriptor since no path inside reaches them.
pub fn confine(
    rlimits: &Rlimits,
    writable_dirs: &[String],
    readable: Option<BorrowedFd<'_>>,
) -> Result<Confinement, SetupError> {
    lower_rlimits(rlimits)?;
    drop_bounding_caps()?;
    rustix::thread::set_no_new_privs(true)
        .map_err(std::io::Error::from)
        .step("set no_new_privs")?;
    let landlock_abi = apply_landlock(writable_dirs, readable)?;
    apply_seccomp()?;
    Ok(Confinement {
        no_new_privs: true,
        seccomp: true,
        landlock_abi,
    })
}

fn lower_rlimits(rlimits: &Rlimits) -> Result<(), SetupError> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    for (res, want) in [
        (Resource::Core, rlimits.core),
        (Resource::Nofile, rlimits.nofile),
        (Resource::Nproc, rlimits.nproc),
    ] {
        // Only ever lower: raising a hard limit needs CAP_SYS_RESOURCE on the host.
        let cur = getrlimit(res);
        let hard = cur.maximum.map_or(want, |m| m.min(want));
        let soft = cur.current.map_or(hard, |c| c.min(hard));
        setrlimit(
            res,
            Rlimit {
                current: Some(soft),
                maximum: Some(hard),
            },
        )
        .map_err(std::io::Error::from)
        .step(format!("lower rlimit {res:?}"))?;
    }
    Ok(())
}

fn drop_bounding_caps() -> Result<(), SetupError> {
    let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(40);
    for cap in (0..=last).filter(|c| !KEPT_CAPS.contains(c)) {
        // SAFETY: PR_CAPBSET_DROP takes an integer capability number and touches no memory.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if rc < 0 {
            let err = std::io::Error::last_os_error();
            // EINVAL: the kernel does not know this capability; nothing to drop.
            if err.raw_os_error() != Some(libc::EINVAL) {
                return Err(err).step(format!("drop capability {cap}"));
            }
        }
    }
    Ok(())
}

fn apply_landlock(
    writable: &[String],
    readable: Option<BorrowedFd<'_>>,
) -> Result<u32, SetupError> {
    let abi = ABI::V6;
    let to_io = |e: landlock::RulesetError| std::io::Error::other(e.to_string());
    let status = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .and_then(|r| r.create())
        .and_then(|r| r.add_rules(path_beneath_rules(["/"], AccessFs::from_read(abi))))
        .and_then(|r| {
            let existing = writable.iter().filter(|d| std::path::Path::new(d).is_dir());
            r.add_rules(path_beneath_rules(existing, AccessFs::from_all(abi)))
        })
        .and_then(|r| match readable {
            Some(fd) => r.add_rule(PathBeneath::new(fd, AccessFs::from_read(abi))),
            None => Ok(r),
        })
        .and_then(|r| r.restrict_self())
        .map_err(to_io)
        .step("apply landlock")?;
    Ok(match status.ruleset {
        RulesetStatus::NotEnforced => 0,
        _ => kernel_landlock_abi(),
    })
}

fn kernel_landlock_abi() -> u32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_ulong = 1;
    // SAFETY: the version query passes a null attribute pointer and size 0, as documented.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(v).unwrap_or(0)
}

/// Syscalls refused with EPERM. Kernel keyring, BPF, perf, module and kexec, handle-based opens
/// that bypass path checks, userfaultfd (exploit staple), io_uring (bypasses seccomp for its
/// own ops), every mount API, namespace creation/entry, clock and swap administration.
const DENIED: &[libc::c_long] = &[
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_keyctl,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_userfaultfd,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_syslog,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_lookup_dcookie,
    libc::SYS_uselib,
    libc::SYS_vhangup,
];

/// `clone` with any of these is refused: a nested user namespace would hand back every
/// capability inside it.
const NAMESPACE_FLAGS: &[libc::c_int] = &[
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWNS,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWCGROUP,
];

/// The only address families a socket may have: local, IP, and netlink for what `ip`, `ss` and
/// glibc's interface queries need. Everything else (vsock to the VM host, packet, key, alg,
/// bluetooth, can, tipc, xdp, rds, ...) is kernel attack surface or a channel past the
/// sandbox's network policy. An allowlist, so families a newer kernel adds stay refused.
const ALLOWED_FAMILIES: &[libc::c_int] = &[
    libc::AF_UNIX,
    libc::AF_INET,
    libc::AF_INET6,
    libc::AF_NETLINK,
];

/// Netlink protocols allowed: routing (addresses, links, routes) and socket diagnostics.
/// Generic netlink, netfilter, audit, uevents and the rest stay refused.
const ALLOWED_NETLINK: &[libc::c_int] = &[libc::NETLINK_ROUTE, libc::NETLINK_SOCK_DIAG];

/// The rules the agent's seccomp program enforces (`seccomp_bpf::program`): the syscalls in
/// [`DENIED`] and `clone` with any of [`NAMESPACE_FLAGS`] fail with EPERM; `clone3`, whose
/// flags sit in memory where seccomp cannot look, with ENOSYS (libc falls back to `clone`);
/// `socket(2)`/`socketpair(2)` outside [`ALLOWED_FAMILIES`] (or netlink outside
/// [`ALLOWED_NETLINK`]) with EAFNOSUPPORT, as on a kernel without that family, so programs take
/// their usual fallback; x32-ABI numbers with ENOSYS. The agent is under them too: the guest
/// binds its vsock listener before confining itself, and nothing after needs another family.
pub(crate) const RULES: seccomp_bpf::Rules<'static> = seccomp_bpf::Rules {
    denied: DENIED,
    clone_flags: any_of(NAMESPACE_FLAGS),
    families: ALLOWED_FAMILIES,
    netlink: ALLOWED_NETLINK,
};

const fn any_of(flags: &[libc::c_int]) -> u32 {
    let (mut mask, mut i) = (0u32, 0);
    while i < flags.len() {
        mask |= flags[i] as u32;
        i += 1;
    }
    mask
}

/// The same rules as seccompiler builds them, the reference `seccomp_bpf`'s tests compare the
/// program with.
#[cfg(test)]
fn family_filter() -> Result<SeccompFilter, seccompiler::BackendError> {
    let arg_ne = |arg: u8, v: libc::c_int| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, v as u64)
    };
    // Conditions of one rule AND together, rules OR: "family is none of these", or "netlink
    // with none of these protocols".
    let other_family = SeccompRule::new(
        ALLOWED_FAMILIES
            .iter()
            .map(|&f| arg_ne(0, f))
            .collect::<Result<Vec<_>, _>>()?,
    )?;
    let mut netlink = vec![SeccompCondition::new(
        0,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::Eq,
        libc::AF_NETLINK as u64,
    )?];
    for &p in ALLOWED_NETLINK {
        netlink.push(arg_ne(2, p)?);
    }
    let other_netlink = SeccompRule::new(netlink)?;
    let rules = vec![other_family, other_netlink];
    SeccompFilter::new(
        BTreeMap::from([
            (libc::SYS_socket, rules.clone()),
            (libc::SYS_socketpair, rules),
        ]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EAFNOSUPPORT as u32),
        TargetArch::x86_64,
    )
}

#[cfg(test)]
pub(crate) fn seccompiler_filters(
) -> Result<Vec<seccompiler::BpfProgram>, seccompiler::BackendError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|&nr| (nr, Vec::new())).collect();
    // clone(2) with any namespace flag: a nested user namespace would hand back every
    // capability inside it. One rule per flag, since rules OR together.
    let clone_rules = NAMESPACE_FLAGS
        .iter()
        .map(|&flag| {
            SeccompRule::new(vec![SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(flag as u64),
                flag as u64,
            )?])
        })
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_clone, clone_rules);
    let deny = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        TargetArch::x86_64,
    )?;
    // clone3 passes its flags in memory where seccomp cannot look; ENOSYS makes libc fall back
    // to clone(2), which the rules above inspect.
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        TargetArch::x86_64,
    )?;
    Ok(vec![
        deny.try_into()?,
        clone3.try_into()?,
        family_filter()?.try_into()?,
    ])
}

fn apply_seccomp() -> Result<(), SetupError> {
    seccompiler::apply_filter(&seccomp_bpf::program(&RULES))
        .map_err(|e| std::io::Error::other(e.to_string()))
        .step("apply seccomp filter")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_caps_exclude_admin_and_ptrace() {
        for forbidden in [
            12u32, /* NET_ADMIN */
            16,    /* SYS_MODULE */
            19,    /* SYS_PTRACE */
            21,    /* SYS_ADMIN */
        ] {
            assert!(!KEPT_CAPS.contains(&forbidden));
        }
    }
}
