//! Allocation of per-sandbox host uid ranges: slot `n` owns `uid_base + n * 65536 ..`. Distinct
//! ranges mean two sandboxes never share a host uid, so neither file ownership nor per-uid
//! limits (RLIMIT_NPROC) connect them.

use std::collections::BTreeSet;
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

    pub fn release(&self, slot: u32) {
        self.inner.lock().used.remove(&slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_unique_and_reused() {
        let s = Slots::new(2);
        let a = s.acquire().unwrap();
        let b = s.acquire().unwrap();
        assert_ne!(a, b);
        assert!(matches!(s.acquire(), Err(RuntimeError::Exhausted(_))));
        s.release(a);
        assert_eq!(s.acquire().unwrap(), a);
    }
}
