//! Durability bookkeeping: record ids, which records are on the device, which are durable, and
//! group commit of syncs.
//!
//! Record ids increase with creation order (`epoch << 40 | counter`, so ids of a later session
//! are always larger). A record is *in flight* from creation until its device write returns.
//! `synced_through` is the largest id such that every record with an id up to it was written and
//! then covered by a successful sync.

use parking_lot::{Condvar, Mutex};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

/// Bits of a record id that count within one epoch.
pub const EPOCH_SHIFT: u32 = 40;
/// Bits of a data sequence number that count within one epoch (`epoch << 32 | counter`): with
/// epochs below [`MAX_EPOCHS`] a sequence number fits the format's `SEQ_BITS`. An epoch covers
/// 2^32 page writes (16 TiB of 4 KiB pages) before the engine moves to the next.
pub const SEQ_EPOCH_SHIFT: u32 = 32;
/// Epochs (pool metadata generations) a pool can number ids and sequence numbers with.
pub const MAX_EPOCHS: u64 = 1 << (crate::format::SEQ_BITS - SEQ_EPOCH_SHIFT);
const _: () = assert!(MAX_EPOCHS <= 1 << (64 - EPOCH_SHIFT), "record ids fit 64 bits");

struct Inner {
    next_id: u64,
    in_flight: BTreeSet<u64>,
    /// In flight and sealed: closed for writing, on their way to the device.
    sealed: BTreeSet<u64>,
}

/// Tracks records from creation to durability.
pub struct Tracker {
    inner: Mutex<Inner>,
    completed: Condvar,
    synced_through: AtomicU64,
    /// Serialises syncs so that concurrent flushes share one (group commit).
    pub sync_lock: Mutex<()>,
    /// Syncs begun (counted under `sync_lock`, before the devices are synced): a sync begun
    /// after a writer saw its records on the device covers them.
    syncs_begun: AtomicU64,
}

impl Tracker {
    pub fn new(first_id: u64) -> Tracker {
        Tracker {
            inner: Mutex::new(Inner {
                next_id: first_id,
                in_flight: BTreeSet::new(),
                sealed: BTreeSet::new(),
            }),
            completed: Condvar::new(),
            synced_through: AtomicU64::new(first_id.saturating_sub(1)),
            sync_lock: Mutex::new(()),
            syncs_begun: AtomicU64::new(0),
        }
    }

    /// Creates a record id and marks it in flight.
    pub fn begin(&self) -> u64 {
        let mut g = self.inner.lock();
        let id = g.next_id;
        g.next_id += 1;
        g.in_flight.insert(id);
        id
    }

    /// The record is on the device (or was abandoned after a failure that poisoned the pool).
    pub fn complete(&self, id: u64) {
        let mut g = self.inner.lock();
        let was = g.in_flight.remove(&id);
        assert!(was, "record {id} completed twice");
        g.sealed.remove(&id);
        self.completed.notify_all();
    }

    /// The record was sealed and will be written.
    pub fn mark_sealed(&self, id: u64) {
        self.inner.lock().sealed.insert(id);
    }

    /// Whether every record of `ids` is marked sealed (none is open or held back).
    pub fn all_sealed(&self, ids: &[u64]) -> bool {
        let g = self.inner.lock();
        ids.iter().all(|id| g.sealed.contains(id))
    }

    /// Records sealed but not yet on the device.
    pub fn sealed_in_flight(&self) -> Vec<u64> {
        self.inner.lock().sealed.iter().copied().collect()
    }

    /// Waits until none of `ids` is in flight, or `stop()` says to give up.
    pub fn wait_all_complete(&self, ids: &[u64], stop: impl Fn() -> bool) -> bool {
        let mut g = self.inner.lock();
        loop {
            if ids.iter().all(|id| !g.in_flight.contains(id)) {
                return true;
            }
            if stop() {
                return false;
            }
            self.completed.wait_for(&mut g, std::time::Duration::from_millis(50));
        }
    }

    /// Largest id created so far.
    pub fn last_id(&self) -> u64 {
        self.inner.lock().next_id - 1
    }

    /// Largest id such that every record up to it is complete.
    pub fn complete_through(&self) -> u64 {
        let g = self.inner.lock();
        match g.in_flight.first() {
            Some(&first) => first - 1,
            None => g.next_id - 1,
        }
    }

    /// Waits until every record up to `target` is complete, or `stop()` says to give up.
    pub fn wait_complete_through(&self, target: u64, stop: impl Fn() -> bool) -> bool {
        let mut g = self.inner.lock();
        loop {
            let done = match g.in_flight.first() {
                Some(&first) => first > target,
                None => true,
            };
            if done {
                return true;
            }
            if stop() {
                return false;
            }
            self.completed.wait_for(&mut g, std::time::Duration::from_millis(50));
        }
    }

    pub fn synced_through(&self) -> u64 {
        self.synced_through.load(SeqCst)
    }

    pub fn set_synced_through(&self, id: u64) {
        self.synced_through.fetch_max(id, SeqCst);
    }

    /// Syncs begun so far (see [`Tracker::sync_begins`]).
    pub fn syncs_begun(&self) -> u64 {
        self.syncs_begun.load(SeqCst)
    }

    /// A sync begins; the caller holds `sync_lock`.
    pub fn sync_begins(&self) {
        self.syncs_begun.fetch_add(1, SeqCst);
    }
}
