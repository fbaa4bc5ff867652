//! Durability bookkeeping: record ids, which records are on the device, which are durable, and
//! group commit of syncs.
//!
//! Record ids increase with creation order (`epoch << 40 | counter`, so ids of a later session
//! are always larger). A record is *in flight* from creation until its device write returns.
//! `synced_through` is the largest id such that every record with an id up to it was written and
//! then covered by a successful sync.
//!
//! Syncs may overlap ([`SyncGate`]): each covers the records complete when it began (its
//! `upto`), and `synced_through` only ever rises to the `upto` of a sync that returned, so it
//! keeps its meaning whichever of two overlapping syncs returns first. A flush whose records a
//! running sync covers waits for that sync (group commit); one that arrives while a sync that
//! does not cover it runs starts its own instead of waiting for that sync and then syncing
//! again (two device syncs of latency), up to [`MAX_OVERLAPPING_SYNCS`].

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
    /// The syncs under way (group commit).
    pub syncs: SyncGate,
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
            syncs: SyncGate::default(),
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
}

/// Device syncs under way at once, at most (each flush beyond waits for one to end).
pub const MAX_OVERLAPPING_SYNCS: usize = 4;

/// The syncs under way, each with the id it covers through (see the module doc).
#[derive(Default)]
pub struct SyncGate {
    running: Mutex<Vec<u64>>,
    ended: Condvar,
    /// Held from a sync's return until it has published `synced_through`, so that what a sync
    /// must record first (a member that failed) is recorded before any later sync publishes.
    pub publish: Mutex<()>,
}

/// What a flush is to do about its sync ([`SyncGate::enter`]).
pub enum SyncTurn<'a> {
    /// Another sync made the records durable.
    Covered,
    /// `stop()` said to give up (the log was poisoned).
    Stopped,
    /// Sync now: the slot holds the id this sync covers through, and ends the sync's turn when
    /// dropped (after `synced_through` is published).
    Run(SyncSlot<'a>),
}

pub struct SyncSlot<'a> {
    gate: &'a SyncGate,
    pub upto: u64,
}

impl Drop for SyncSlot<'_> {
    fn drop(&mut self) {
        let mut running = self.gate.running.lock();
        if let Some(i) = running.iter().position(|&u| u == self.upto) {
            running.swap_remove(i);
        }
        drop(running);
        self.gate.ended.notify_all();
    }
}

impl SyncGate {
    /// For a flush whose records are complete through `target`: waits for a running sync
    /// that covers them, or takes a turn to sync.
    pub fn enter<'a>(&'a self, tracker: &Tracker, target: u64, stop: impl Fn() -> bool) -> SyncTurn<'a> {
        let mut running = self.running.lock();
        loop {
            if tracker.synced_through() >= target {
                return SyncTurn::Covered;
            }
            if stop() {
                return SyncTurn::Stopped;
            }
            let covered = running.iter().any(|&u| u >= target);
            if !covered && running.len() < MAX_OVERLAPPING_SYNCS {
                return SyncTurn::Run(self.take(&mut running, tracker));
            }
            self.ended.wait_for(&mut running, std::time::Duration::from_millis(50));
        }
    }

    /// A turn to sync whatever runs already (a GC release needs a sync that began after its
    /// records were written, whether or not `synced_through` can reach them); `None` once
    /// `stop()` says to give up.
    pub fn enter_always<'a>(&'a self, tracker: &Tracker, stop: impl Fn() -> bool) -> Option<SyncSlot<'a>> {
        let mut running = self.running.lock();
        loop {
            if stop() {
                return None;
            }
            if running.len() < MAX_OVERLAPPING_SYNCS {
                return Some(self.take(&mut running, tracker));
            }
            self.ended.wait_for(&mut running, std::time::Duration::from_millis(50));
        }
    }

    fn take<'a>(&'a self, running: &mut Vec<u64>, tracker: &Tracker) -> SyncSlot<'a> {
        assert!(running.len() < MAX_OVERLAPPING_SYNCS, "sync gate over its limit");
        let upto = tracker.complete_through();
        running.push(upto);
        SyncSlot { gate: self, upto }
    }

    /// Syncs under way now.
    #[cfg(test)]
    fn running(&self) -> usize {
        self.running.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    fn run(turn: SyncTurn<'_>) -> SyncSlot<'_> {
        match turn {
            SyncTurn::Run(slot) => slot,
            SyncTurn::Covered => panic!("covered"),
            SyncTurn::Stopped => panic!("stopped"),
        }
    }

    fn written(t: &Tracker) -> u64 {
        let id = t.begin();
        t.complete(id);
        id
    }

    #[test]
    fn syncs_overlap_when_the_running_one_does_not_cover_the_flush() {
        let t = Tracker::new(1);
        let a = written(&t);
        let first = run(t.syncs.enter(&t, a, || false));
        assert_eq!(first.upto, a);
        // Written after the first sync began: a flush of it syncs at once, without waiting.
        let b = written(&t);
        let second = run(t.syncs.enter(&t, b, || false));
        assert_eq!((second.upto, t.syncs.running()), (b, 2));
        // The later sync returns first; the earlier one's end does not take it back.
        t.set_synced_through(second.upto);
        drop(second);
        t.set_synced_through(first.upto);
        drop(first);
        assert_eq!((t.synced_through(), t.syncs.running()), (b, 0));
        assert!(matches!(t.syncs.enter(&t, a, || false), SyncTurn::Covered));
    }

    #[test]
    fn a_flush_that_a_running_sync_covers_waits_for_it() {
        let t = Tracker::new(1);
        let c = written(&t);
        let sync = run(t.syncs.enter(&t, c, || false));
        std::thread::scope(|s| {
            let waiter = s.spawn(|| matches!(t.syncs.enter(&t, c, || false), SyncTurn::Covered));
            std::thread::sleep(Duration::from_millis(150));
            assert!(!waiter.is_finished(), "a second sync for records a running one covers");
            assert_eq!(t.syncs.running(), 1);
            t.set_synced_through(sync.upto);
            drop(sync);
            assert!(waiter.join().unwrap(), "not covered by the sync it waited for");
        });
        // A covering sync that fails (the log is poisoned) sends its waiters away.
        let d = written(&t);
        let failing = run(t.syncs.enter(&t, d, || false));
        let poisoned = AtomicBool::new(false);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| matches!(t.syncs.enter(&t, d, || poisoned.load(SeqCst)), SyncTurn::Stopped));
            std::thread::sleep(Duration::from_millis(100));
            poisoned.store(true, SeqCst);
            drop(failing);
            assert!(waiter.join().unwrap());
        });
    }

    #[test]
    fn no_more_than_the_limit_of_syncs_run_at_once() {
        let t = Tracker::new(1);
        let slots: Vec<_> = (0..MAX_OVERLAPPING_SYNCS)
            .map(|_| {
                written(&t);
                t.syncs.enter_always(&t, || false).expect("a turn")
            })
            .collect();
        assert_eq!(t.syncs.running(), MAX_OVERLAPPING_SYNCS);
        let e = written(&t);
        std::thread::scope(|s| {
            let over = s.spawn(|| run(t.syncs.enter(&t, e, || false)).upto);
            std::thread::sleep(Duration::from_millis(150));
            assert!(!over.is_finished(), "a sync past the limit");
            drop(slots);
            assert_eq!(over.join().unwrap(), e);
        });
        assert!(t.syncs.enter_always(&t, || true).is_none(), "a turn after stop");
    }
}
