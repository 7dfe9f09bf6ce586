//! The agent's seccomp rules as one compact classic-BPF program.
//!
//! Written by hand because the kernel's cost of attaching a filter grows with its length
//! (~0.7 µs per instruction on the CI hosts, paid by every sandbox start) and seccompiler
//! spends five instructions on each syscall it names and nine on each 64-bit argument test:
//! its three filters for these rules were 349 instructions, this program is about 70. The rules
//! themselves stay declared in `confine.rs`; a test compares this program's verdict with
//! seccompiler's filters for every syscall number and argument case that matters.

use seccompiler::{sock_filter, BpfProgram};

/// What seccomp reports as the architecture of an x86-64 syscall (linux/audit.h:
/// `EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE`; the libc crate does not export it).
pub(crate) const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;

/// Set in every syscall number of the x32 ABI, which reaches the same kernel entry points as
/// x86-64's own numbers and reports the same architecture: a host kernel with x32 enabled
/// would let refused syscalls through under their x32 numbers unless they are refused too.
pub(crate) const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Offsets into `struct seccomp_data`: the syscall number, the architecture, and the low half
/// of argument `n` at `ARGS + 8 * n` (little-endian).
const NR: u32 = 0;
const ARCH: u32 = 4;
const ARGS: u32 = 16;

/// What the program is made from (the lists `confine.rs` declares).
pub(crate) struct Rules<'a> {
    /// Refused with EPERM.
    pub denied: &'a [libc::c_long],
    /// `clone` with any of these flags is refused with EPERM.
    pub clone_flags: u32,
    /// `socket`/`socketpair` outside these families, or netlink outside these protocols,
    /// are refused with EAFNOSUPPORT.
    pub families: &'a [libc::c_int],
    pub netlink: &'a [libc::c_int],
}

/// Where a jump goes.
#[derive(Clone, Copy, PartialEq)]
enum To {
    Next,
    Kill,
    Allow,
    Eperm,
    Enosys,
    Clone,
    Socket,
    Netlink,
}

enum Ins {
    Load(u32),
    Ret(u32),
    Jump { code: u32, k: u32, yes: To, no: To },
}

fn jeq(k: u32, yes: To) -> Ins {
    Ins::Jump {
        code: libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
        k,
        yes,
        no: To::Next,
    }
}

/// The program: architecture check, x32 numbers, then a dispatch on the syscall number to
/// shared returns and the argument checks of `clone` and the socket calls.
pub(crate) fn program(rules: &Rules<'_>) -> BpfProgram {
    use libc::{BPF_JGE, BPF_JMP, BPF_JSET, BPF_K};
    let errno = |e: libc::c_int| libc::SECCOMP_RET_ERRNO | (e as u32 & libc::SECCOMP_RET_DATA);
    let nr = |n: libc::c_long| n as u32;
    let mut code: Vec<(Option<To>, Ins)> = vec![
        (None, Ins::Load(ARCH)),
        (
            None,
            Ins::Jump {
                code: BPF_JMP | libc::BPF_JEQ | BPF_K,
                k: AUDIT_ARCH_X86_64,
                yes: To::Next,
                no: To::Kill,
            },
        ),
        (None, Ins::Load(NR)),
    ];
    code.push((
        None,
        Ins::Jump {
            code: BPF_JMP | BPF_JGE | BPF_K,
            k: X32_SYSCALL_BIT,
            yes: To::Enosys,
            no: To::Next,
        },
    ));
    code.push((None, jeq(nr(libc::SYS_clone3), To::Enosys)));
    code.push((None, jeq(nr(libc::SYS_clone), To::Clone)));
    code.push((None, jeq(nr(libc::SYS_socket), To::Socket)));
    code.push((None, jeq(nr(libc::SYS_socketpair), To::Socket)));
    for &n in rules.denied {
        code.push((None, jeq(nr(n), To::Eperm)));
    }
    code.push((None, Ins::Ret(libc::SECCOMP_RET_ALLOW)));
    // The argument checks, then the returns they share: classic BPF only jumps forward.
    code.push((Some(To::Clone), Ins::Load(ARGS)));
    code.push((
        None,
        Ins::Jump {
            code: BPF_JMP | BPF_JSET | BPF_K,
            k: rules.clone_flags,
            yes: To::Eperm,
            no: To::Allow,
        },
    ));
    code.push((Some(To::Socket), Ins::Load(ARGS)));
    for &f in rules.families {
        let yes = match f {
            libc::AF_NETLINK => To::Netlink,
            _ => To::Allow,
        };
        code.push((None, jeq(f as u32, yes)));
    }
    code.push((None, Ins::Ret(errno(libc::EAFNOSUPPORT))));
    code.push((Some(To::Netlink), Ins::Load(ARGS + 2 * 8)));
    for &p in rules.netlink {
        code.push((None, jeq(p as u32, To::Allow)));
    }
    code.push((None, Ins::Ret(errno(libc::EAFNOSUPPORT))));
    code.push((Some(To::Allow), Ins::Ret(libc::SECCOMP_RET_ALLOW)));
    code.push((Some(To::Eperm), Ins::Ret(errno(libc::EPERM))));
    code.push((Some(To::Enosys), Ins::Ret(errno(libc::ENOSYS))));
    code.push((Some(To::Kill), Ins::Ret(libc::SECCOMP_RET_KILL_PROCESS)));
    assemble(&code)
}

/// Resolves the labels into classic BPF's forward offsets (at most 255, which a program this
/// size never nears; checked).
fn assemble(code: &[(Option<To>, Ins)]) -> BpfProgram {
    let at = |label: To| {
        code.iter()
            .position(|(l, _)| *l == Some(label))
            .expect("every label is placed")
    };
    let offset = |from: usize, to: To| -> u8 {
        let target = match to {
            To::Next => from + 1,
            label => at(label),
        };
        u8::try_from(target - from - 1).expect("a jump within 255 instructions")
    };
    code.iter()
        .enumerate()
        .map(|(i, (_, ins))| match *ins {
            Ins::Load(k) => sock_filter {
                code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
                jt: 0,
                jf: 0,
                k,
            },
            Ins::Ret(k) => sock_filter {
                code: (libc::BPF_RET | libc::BPF_K) as u16,
                jt: 0,
                jf: 0,
                k,
            },
            Ins::Jump { code, k, yes, no } => sock_filter {
                code: code as u16,
                jt: offset(i, yes),
                jf: offset(i, no),
                k,
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::boot::confine::{seccompiler_filters, RULES};

    /// A classic-BPF interpreter for the instructions seccomp filters here use.
    fn run(prog: &[sock_filter], data: &[u8; 64]) -> u32 {
        use libc::{
            BPF_ABS, BPF_ALU, BPF_AND, BPF_JA, BPF_JEQ, BPF_JGE, BPF_JGT, BPF_JMP, BPF_JSET, BPF_K,
            BPF_LD, BPF_RET, BPF_W,
        };
        let (mut acc, mut pc) = (0u32, 0usize);
        loop {
            let i = &prog[pc];
            pc += 1;
            let branch = |taken: bool| usize::from(if taken { i.jt } else { i.jf });
            match u32::from(i.code) {
                c if c == BPF_LD | BPF_W | BPF_ABS => {
                    let k = i.k as usize;
                    acc = u32::from_le_bytes(data[k..k + 4].try_into().unwrap());
                }
                c if c == BPF_ALU | BPF_AND | BPF_K => acc &= i.k,
                c if c == BPF_JMP | BPF_JA => pc += i.k as usize,
                c if c == BPF_JMP | BPF_JEQ | BPF_K => pc += branch(acc == i.k),
                c if c == BPF_JMP | BPF_JGT | BPF_K => pc += branch(acc > i.k),
                c if c == BPF_JMP | BPF_JGE | BPF_K => pc += branch(acc >= i.k),
                c if c == BPF_JMP | BPF_JSET | BPF_K => pc += branch(acc & i.k != 0),
                c if c == BPF_RET | BPF_K => return i.k,
                other => panic!("opcode {other:#x} at {}", pc - 1),
            }
        }
    }

    fn data(nr: u32, arch: u32, args: [u64; 6]) -> [u8; 64] {
        let mut d = [0u8; 64];
        d[0..4].copy_from_slice(&nr.to_le_bytes());
        d[4..8].copy_from_slice(&arch.to_le_bytes());
        for (n, a) in args.iter().enumerate() {
            d[16 + 8 * n..24 + 8 * n].copy_from_slice(&a.to_le_bytes());
        }
        d
    }

    /// The kernel's verdict over a stack of filters: the most restrictive action (the
    /// lowest, as a signed number).
    fn verdict(filters: &[BpfProgram], d: &[u8; 64]) -> u32 {
        filters
            .iter()
            .map(|f| run(f, d))
            .min_by_key(|r| *r as i32 & libc::SECCOMP_RET_ACTION_FULL as i32)
            .unwrap()
    }

    /// Every syscall number (and the x32 ones, and nonsense ones), every namespace flag of
    /// `clone`, every address family and netlink protocol: the compact program answers as
    /// seccompiler's filters for the same rules do, and refuses x32 numbers with ENOSYS.
    #[test]
    fn answers_as_seccompilers_filters_for_the_same_rules() {
        let compact = program(&RULES);
        let reference = seccompiler_filters().unwrap();
        assert!(compact.len() < 80, "{} instructions", compact.len());
        let enosys = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
        let check = |nr: u32, arch: u32, args: [u64; 6]| {
            let d = data(nr, arch, args);
            let want = match arch == AUDIT_ARCH_X86_64 && nr >= X32_SYSCALL_BIT {
                true => enosys,
                false => verdict(&reference, &d),
            };
            assert_eq!(
                run(&compact, &d),
                want,
                "nr {nr:#x} arch {arch:#x} args {args:x?}"
            );
        };
        let numbers = (0..1024u32)
            .chain((0..1024).map(|n| n | X32_SYSCALL_BIT))
            .chain([0x7fff_ffff, 0x8000_0000, u32::MAX]);
        for nr in numbers {
            check(nr, AUDIT_ARCH_X86_64, [0; 6]);
            check(nr, 0x4000_0003 /* i386 */, [0; 6]);
        }
        let mut flags: Vec<u64> = vec![0, libc::SIGCHLD as u64, 1 << 40, u64::MAX];
        for bit in 0..64 {
            flags.push(1 << bit);
            flags.push((1 << bit) | libc::SIGCHLD as u64 | (1 << 40));
        }
        for f in flags {
            check(
                libc::SYS_clone as u32,
                AUDIT_ARCH_X86_64,
                [f, 0, 0, 0, 0, 0],
            );
        }
        for call in [libc::SYS_socket, libc::SYS_socketpair] {
            for family in 0..64u64 {
                for protocol in 0..32u64 {
                    for high in [0, 1 << 32] {
                        let args = [family | high, 0, protocol | high, 0, 0, 0];
                        check(call as u32, AUDIT_ARCH_X86_64, args);
                    }
                }
            }
        }
    }

    /// The kernel takes the program, and it acts: in a forked child, clone3 is refused with
    /// ENOSYS (the kernel alone says EINVAL to a zero size), a new user namespace with EPERM,
    /// a packet socket with EAFNOSUPPORT, and getpid still answers.
    #[test]
    fn the_kernel_applies_it() {
        let prog = program(&RULES);
        // SAFETY: the child only makes raw syscalls before _exit; the parent waits for it.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            let errno_of = |rc: libc::c_long| match rc {
                -1 => std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
                _ => 0,
            };
            // SAFETY: as above, in the child.
            unsafe {
                let verdict = if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                    || seccompiler::apply_filter(&prog).is_err()
                {
                    10
                } else if errno_of(libc::syscall(libc::SYS_clone3, 0, 0)) != libc::ENOSYS {
                    11
                } else if errno_of(libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUSER))
                    != libc::EPERM
                {
                    12
                } else if errno_of(libc::syscall(libc::SYS_socket, libc::AF_PACKET, 2, 0))
                    != libc::EAFNOSUPPORT
                {
                    13
                } else if libc::syscall(libc::SYS_getpid) <= 0 {
                    14
                } else {
                    0
                };
                libc::_exit(verdict);
            }
        }
        let mut status = 0;
        // SAFETY: waitpid writes only into `status`.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "{status:#x}");
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "10 not applied, 11 clone3, 12 unshare, 13 socket, 14 getpid"
        );
    }
}
