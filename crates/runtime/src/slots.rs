//! Allocation of per-sandbox host uid ranges: slot `n` owns `uid_base + n * 65536 ..`. Distinct
//! ranges mean two sandboxes never share a host uid, so neither file ownership nor per-uid
//! limits (RLIMIT_NPROC) connect them.

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::RuntimeError;

#[derive(Clone)]
pub struct Slots {
    inner: Arc<Mutex<SlotsInner>>,
}

struct SlotsInner {
    max: u32,
    used: BTreeSet<u32>,
}

impl Slots {
    pub fn new(max: u32) -> Self {
        Self {
            inner: Arc::new(Mutex::new(SlotsInner {
                max,
                used: BTreeSet::new(),
            })),
        }
    }

    /// The lowest free slot.
    pub fn acquire(&self) -> Result<u32, RuntimeError> {
        let mut s = self.inner.lock();
        let slot = (0..s.max).find(|n| !s.used.contains(n)).ok_or_else(|| {
            RuntimeError::Exhausted(format!("all {} sandbox slots are in use", s.max))
        })?;
        s.used.insert(slot);
        Ok(slot)
    }

    /// Whether every slot is in use.
    pub fn all_used(&self) -> bool {
        let s = self.inner.lock();
        s.used.len() >= s.max as usize
    }

    pub fn release(&self, slot: u32) {
        self.inner.lock().used.remove(&slot);
    }
}

/// Host ids below this are the host's own accounts (system users and people); no sandbox range
/// may start among them.
pub const MIN_ID_BASE: u32 = 65_536;

/// The host ids `slots` ranges of `per_slot` ids from `base` cover, or why they cannot be used:
/// a range running past the last valid id would wrap around to low host ids, root's among them.
pub fn host_ids(base: u32, slots: u32, per_slot: u32) -> Result<Range<u64>, RuntimeError> {
    let end = u64::from(base) + u64::from(slots) * u64::from(per_slot);
    // u32::MAX is "no id" ((uid_t)-1) to the kernel.
    if base < MIN_ID_BASE || end > u64::from(u32::MAX) {
        return Err(RuntimeError::InvalidSpec(format!(
            "{slots} sandboxes of {per_slot} host ids from {base} do not fit between {MIN_ID_BASE} \
             and {}: lower the sandbox count or move the uid base",
            u32::MAX
        )));
    }
    Ok(u64::from(base)..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_ranges_never_wrap_or_reach_host_accounts() {
        assert_eq!(
            host_ids(200_000, 4096, 65_536).unwrap(),
            200_000..268_635_456
        );
        assert_eq!(host_ids(150_000, 64, 1).unwrap(), 150_000..150_064);
        for (base, slots, per) in [
            (200_000, 65_534, 65_536),
            (u32::MAX - 10, 11, 1),
            (0, 1, 65_536),
            (1000, 1, 1),
            (u32::MAX, 1, 1),
        ] {
            assert!(host_ids(base, slots, per).is_err(), "{base} {slots} {per}");
        }
        assert_eq!(
            host_ids(u32::MAX - 10, 10, 1).unwrap().end,
            u64::from(u32::MAX)
        );
    }

    #[test]
    fn slots_are_unique_and_reused() {
        let s = Slots::new(2);
        let a = s.acquire().unwrap();
        assert!(!s.all_used());
        let b = s.acquire().unwrap();
        assert_ne!(a, b);
        assert!(s.all_used());
        assert!(matches!(s.acquire(), Err(RuntimeError::Exhausted(_))));
        s.release(a);
        assert!(!s.all_used());
        assert_eq!(s.acquire().unwrap(), a);
    }
}
