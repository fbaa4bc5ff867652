//! Reads that may not wait for a device: a front-end that can answer a read from memory (the
//! read cache, the write buffer, a record not yet written) answers it at once, on the thread
//! that received it, and hands only the rest to a thread that may block.
//!
//! Owns: a per-thread flag, set for the duration of [`memory_only`]. While it is set, every
//! place that would read a device ([`crate::log::Log::read_page`], [`crate::log::Log::read_run`],
//! the hybrid controller's fast-tier copies) returns [`Error::NotInMemory`] instead, before
//! it touches the device.
//!
//! Why a per-thread flag and not a parameter: a read passes through the write buffer, a
//! controller (page map, extent map, dual, hybrid, AMF) and the log; a parameter would run
//! through every controller's read for one front-end's fast path. The flag is set and cleared
//! by one guard on one thread, so it cannot leak into another request.
//!
//! Invariants: a read refused this way has changed nothing the caller can see (no data
//! counters, no cache hits or misses counted: the caller reads again and that read counts;
//! the hits of a read that succeeds are handed to the caller to count); the flag is cleared
//! when [`memory_only`] returns, also by unwinding.

use crate::error::{Error, Result};
use std::cell::Cell;

thread_local! {
    static MEMORY_ONLY: Cell<bool> = const { Cell::new(false) };
    /// Read-cache hits inside [`memory_only`], not yet counted.
    static DEFERRED_HITS: Cell<u64> = const { Cell::new(0) };
}

/// Restores the flag and the deferred hits when dropped (also when `f` panics).
struct Reset(bool, u64);

impl Drop for Reset {
    fn drop(&mut self) {
        MEMORY_ONLY.with(|m| m.set(self.0));
        DEFERRED_HITS.with(|h| h.set(self.1));
    }
}

/// Runs `f` with device reads refused on this thread: a read inside it that needs a device
/// fails with [`Error::NotInMemory`]. Returns `f`'s result and the read-cache hits of the
/// reads inside, which the cache did not count: the caller counts them
/// ([`crate::log::Log::count_cache_hits`]) when it keeps the result, and drops them when the
/// read is refused and done again (which counts its own).
pub fn memory_only<R>(f: impl FnOnce() -> R) -> (R, u64) {
    let before = MEMORY_ONLY.with(|m| m.replace(true));
    let _reset = Reset(before, DEFERRED_HITS.with(|h| h.replace(0)));
    let r = f();
    (r, DEFERRED_HITS.with(|h| h.get()))
}

/// Inside [`memory_only`], notes a read-cache hit for the caller to count, and says so.
pub(crate) fn defer_hit() -> bool {
    active() && {
        DEFERRED_HITS.with(|h| h.set(h.get() + 1));
        true
    }
}

/// Whether this thread is inside [`memory_only`].
pub fn active() -> bool {
    MEMORY_ONLY.with(|m| m.get())
}

/// `Err(NotInMemory)` inside [`memory_only`]: called just before a device read.
pub fn allow_device_read() -> Result<()> {
    if active() {
        Err(Error::NotInMemory)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_holds_inside_only_and_is_cleared_by_a_panic() {
        assert!(allow_device_read().is_ok());
        assert!(memory_only(|| matches!(allow_device_read(), Err(Error::NotInMemory))).0);
        assert!(!defer_hit(), "outside, hits are counted at once");
        assert_eq!(memory_only(|| (defer_hit(), defer_hit())), ((true, true), 2));
        assert!(!active());
        let caught = std::panic::catch_unwind(|| memory_only(|| panic!("inside")));
        assert!(caught.is_err());
        assert!(!active(), "a panic inside leaves the flag cleared");
        // Nested: the inner guard restores the outer state.
        memory_only(|| {
            memory_only(|| ());
            assert!(active());
        });
        assert!(!active());
    }
}
