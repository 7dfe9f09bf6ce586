//! Whether hardware KVM can boot a stock guest kernel on this host.
//!
//! `/dev/kvm` existing is not enough: under PVM (`kvm_pvm`, paravirtualized KVM nested in a
//! cloud VM without VMX/SVM) the device opens and answers ioctls, yet only PVM-aware guest
//! kernels boot. Only the hardware vendor modules, `kvm_intel` and `kvm_amd`, run the
//! distribution kernel our guests use.

use std::os::fd::AsRawFd;
use std::path::Path;

use crate::vmm::Accel;

const DEV_KVM: &str = "/dev/kvm";
const SYS_MODULE: &str = "/sys/module";
/// The API version every KVM since Linux 2.6.22 reports; anything else is not the KVM we know.
const KVM_API_VERSION: i32 = 12;
/// `_IO(KVMIO, 0x00)`.
const KVM_GET_API_VERSION: u64 = 0xAE00;

const HARDWARE_MODULES: [&str; 2] = ["kvm_intel", "kvm_amd"];
const PVM_MODULE: &str = "kvm_pvm";

/// What the host offers, gathered by [`probe`]; [`decide`] judges it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvmHost {
    pub dev_kvm: DevKvm,
    /// Loaded KVM vendor modules among `kvm_intel`, `kvm_amd` and `kvm_pvm`.
    pub modules: Vec<String>,
    /// Whether the CPU advertises VMX or SVM; `None` when /proc/cpuinfo could not be read.
    pub cpu_virt: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DevKvm {
    Missing,
    /// Present, but opening it read-write or asking its API version failed.
    Unusable(String),
    Open {
        api_version: i32,
    },
}

/// `Ok` when hardware KVM can boot a stock kernel here, else a reason fit for an operator.
pub fn kvm_usable() -> Result<(), String> {
    decide(&probe())
}

/// The accelerator to run guests with, and why it is not KVM when it is not.
pub fn accel() -> (Accel, Option<String>) {
    match kvm_usable() {
        Ok(()) => (Accel::Kvm, None),
        Err(reason) => (Accel::Tcg, Some(reason)),
    }
}

pub fn probe() -> KvmHost {
    KvmHost {
        dev_kvm: probe_dev_kvm(Path::new(DEV_KVM)),
        modules: HARDWARE_MODULES
            .iter()
            .chain([&PVM_MODULE])
            .filter(|m| module_live(&Path::new(SYS_MODULE).join(m)))
            .map(|m| m.to_string())
            .collect(),
        cpu_virt: std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .map(|info| cpuinfo_has_virt(&info)),
    }
}

pub fn decide(host: &KvmHost) -> Result<(), String> {
    let has = |m: &str| host.modules.iter().any(|l| l == m);
    let hardware: Vec<&str> = HARDWARE_MODULES.into_iter().filter(|m| has(m)).collect();
    let pvm = has(PVM_MODULE);
    let pvm_reason = "KVM here is kvm_pvm (PVM: paravirtualized KVM nested in a VM without \
                      VMX/SVM), under which a stock guest kernel does not boot";
    let device = match &host.dev_kvm {
        DevKvm::Missing => {
            return Err(if pvm {
                format!("{DEV_KVM} does not exist, and {pvm_reason}")
            } else {
                format!(
                    "{DEV_KVM} does not exist (no KVM in this kernel, or its module is not loaded)"
                )
            })
        }
        DevKvm::Unusable(why) => Err(format!("{DEV_KVM} is unusable: {why}")),
        DevKvm::Open { api_version } if *api_version != KVM_API_VERSION => Err(format!(
            "{DEV_KVM} reports KVM API version {api_version}, expected {KVM_API_VERSION}"
        )),
        DevKvm::Open { .. } => Ok(()),
    };
    // Which KVM it is matters more than whether this process may open it.
    if hardware.is_empty() {
        return Err(if pvm {
            pvm_reason.to_string()
        } else {
            "neither kvm_intel nor kvm_amd is loaded".to_string()
        });
    }
    // A built-in vendor module shows up in /sys/module even when its init failed for want
    // of VMX/SVM; the CPU flags tell whether it can be the one behind /dev/kvm.
    if host.cpu_virt == Some(false) {
        let mut reason = format!(
            "{} is present but the CPU advertises neither VMX nor SVM",
            hardware.join(" and ")
        );
        if pvm {
            reason.push_str("; ");
            reason.push_str(pvm_reason);
        }
        return Err(reason);
    }
    device
}

fn probe_dev_kvm(path: &Path) -> DevKvm {
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return DevKvm::Missing,
        Err(e) => return DevKvm::Unusable(format!("cannot open it read-write: {e}")),
    };
    // SAFETY: KVM_GET_API_VERSION takes no argument and writes no memory; the fd is open for
    // the duration of the call.
    let version = unsafe { libc::ioctl(file.as_raw_fd(), KVM_GET_API_VERSION as _, 0) };
    if version < 0 {
        DevKvm::Unusable(format!(
            "KVM_GET_API_VERSION failed: {}",
            std::io::Error::last_os_error()
        ))
    } else {
        DevKvm::Open {
            api_version: version,
        }
    }
}

/// A module directory exists for loaded modules and for built-in ones with parameters; a
/// loadable module still initializing or going away has `initstate` other than `live`.
fn module_live(dir: &Path) -> bool {
    if !dir.is_dir() {
        return false;
    }
    match std::fs::read_to_string(dir.join("initstate")) {
        Ok(state) => state.trim() == "live",
        Err(_) => true,
    }
}

fn cpuinfo_has_virt(cpuinfo: &str) -> bool {
    cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .filter_map(|l| l.split_once(':'))
        .any(|(_, flags)| flags.split_whitespace().any(|f| f == "vmx" || f == "svm"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(dev_kvm: DevKvm, modules: &[&str], cpu_virt: Option<bool>) -> KvmHost {
        KvmHost {
            dev_kvm,
            modules: modules.iter().map(|m| m.to_string()).collect(),
            cpu_virt,
        }
    }

    const OPEN: DevKvm = DevKvm::Open { api_version: 12 };

    #[test]
    fn hardware_vendor_modules_are_usable() {
        assert_eq!(decide(&host(OPEN, &["kvm_intel"], Some(true))), Ok(()));
        assert_eq!(decide(&host(OPEN, &["kvm_amd"], Some(true))), Ok(()));
        // Unknown CPU flags do not veto a loaded hardware module.
        assert_eq!(decide(&host(OPEN, &["kvm_amd"], None)), Ok(()));
    }

    #[test]
    fn missing_dev_kvm() {
        let err = decide(&host(DevKvm::Missing, &[], Some(true))).unwrap_err();
        assert!(err.contains("/dev/kvm does not exist"), "{err}");
        let err = decide(&host(DevKvm::Missing, &["kvm_intel"], Some(true))).unwrap_err();
        assert!(err.contains("does not exist"), "{err}");
    }

    #[test]
    fn pvm_only_is_named() {
        let err = decide(&host(OPEN, &["kvm_pvm"], Some(false))).unwrap_err();
        assert!(err.contains("kvm_pvm") && err.contains("PVM"), "{err}");
        assert!(err.contains("stock guest kernel does not boot"), "{err}");
        let err = decide(&host(DevKvm::Missing, &["kvm_pvm"], None)).unwrap_err();
        assert!(err.contains("kvm_pvm"), "{err}");
    }

    #[test]
    fn built_in_intel_module_without_vmx_behind_pvm() {
        let err = decide(&host(OPEN, &["kvm_intel", "kvm_pvm"], Some(false))).unwrap_err();
        assert!(err.contains("neither VMX nor SVM"), "{err}");
        assert!(err.contains("kvm_pvm"), "{err}");
    }

    #[test]
    fn no_vendor_module() {
        let err = decide(&host(OPEN, &[], Some(true))).unwrap_err();
        assert!(
            err.contains("kvm_intel") && err.contains("kvm_amd"),
            "{err}"
        );
    }

    #[test]
    fn not_openable() {
        let dev = DevKvm::Unusable("cannot open it read-write: Permission denied".into());
        let err = decide(&host(dev.clone(), &["kvm_intel"], Some(true))).unwrap_err();
        assert!(err.contains("Permission denied"), "{err}");
        // Under PVM, being allowed to open the device would not help; say so instead.
        let err = decide(&host(dev, &["kvm_pvm"], Some(false))).unwrap_err();
        assert!(err.contains("kvm_pvm"), "{err}");
    }

    #[test]
    fn wrong_api_version() {
        let dev = DevKvm::Open { api_version: 11 };
        let err = decide(&host(dev, &["kvm_intel"], Some(true))).unwrap_err();
        assert!(err.contains("API version 11"), "{err}");
    }

    #[test]
    fn cpu_flags_are_read() {
        let info = "processor\t: 0\nflags\t\t: fpu vme sse2 vmx ept\nbugs\t\t: spectre\n";
        assert!(cpuinfo_has_virt(info));
        let info = "flags\t\t: fpu svm\n";
        assert!(cpuinfo_has_virt(info));
        let info = "flags\t\t: fpu hypervisor vmxnot\nbugs\t\t: vmx\n";
        assert!(!cpuinfo_has_virt(info));
    }

    #[test]
    fn module_state() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!module_live(&dir.path().join("absent")));
        let builtin = dir.path().join("builtin");
        std::fs::create_dir(&builtin).unwrap();
        assert!(module_live(&builtin));
        let coming = dir.path().join("coming");
        std::fs::create_dir(&coming).unwrap();
        std::fs::write(coming.join("initstate"), "coming\n").unwrap();
        assert!(!module_live(&coming));
        std::fs::write(coming.join("initstate"), "live\n").unwrap();
        assert!(module_live(&coming));
    }

    #[test]
    fn dev_kvm_probe_of_a_missing_path() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(probe_dev_kvm(&dir.path().join("kvm")), DevKvm::Missing);
    }

    #[test]
    fn this_host() {
        let result = kvm_usable();
        let (accel, reason) = accel();
        assert_eq!(accel == Accel::Kvm, result.is_ok());
        assert_eq!(reason, result.clone().err());
        let pvm_only = Path::new("/sys/module/kvm_pvm").exists()
            && !HARDWARE_MODULES
                .iter()
                .any(|m| Path::new(SYS_MODULE).join(m).exists());
        if pvm_only {
            let err = result.unwrap_err();
            eprintln!("this host: {err}");
            assert!(err.contains("pvm"), "{err}");
        }
    }
}
