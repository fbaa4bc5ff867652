//! Write-back of sealed user records: a bounded queue and the threads that drain it.
//!
//! A writer that fills a record hands it here instead of writing it itself, and returns: a write
//! that is not flushed (no FUA, no FLUSH yet) need not be durable, so it need not wait for the
//! device. What it keeps:
//! - a queued record is in flight for the [`crate::log::durability::Tracker`], so a flush waits for
//!   it like for any other, and reads find its pages in the record's buffer until it is written;
//! - records of one stream are queued in the order they were sealed (the caller holds the
//!   stream's lock) and taken in that order, so a sequential zone sees them in order;
//! - the queue holds at most [`WRITE_BACK_DEPTH_MAX`] records, and a writer that queued one
//!   returns only once it holds at most [`WRITE_BACK_DEPTH`], so memory and unwritten data stay
//!   bounded. The writer waits for that after letting go of its stream's lock, and wakes a
//!   thread only then: waiting (or waking a thread, which may take the writer's CPU) under the
//!   lock held every other writer of the stream (on RAID-5 random writes, a tenth of the
//!   records' queueing took over 25 us and some up to a millisecond, docs/BENCHMARKS.md);
//! - a failed write poisons the pool (as a failed synchronous write does); the next flush, and
//!   every later write, reports it;
//! - how many records wait and how many bytes the threads have written are published
//!   ([`WriteBack::backlog`]) for the pacer, which admits writes at what the threads write
//!   once the queue holds half its bound (see [`crate::pacing`]).
//!
//! With no threads running (read-only pools, `OpenOptions::write_back_threads == 0`, or after
//! [`WriteBack::stop`]) the caller writes the record itself.

use super::Log;
use crate::error::Result;
use crate::log::record::SealedRecord;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Most sealed records waiting for a write-back thread once their writers have returned.
pub const WRITE_BACK_DEPTH: usize = 8;
/// Most sealed records ever waiting: writers queue under their stream's lock only below this.
pub const WRITE_BACK_DEPTH_MAX: usize = 2 * WRITE_BACK_DEPTH;
/// Most write-back threads a pool runs (each has one record write in flight).
pub const MAX_WRITE_BACK_THREADS: usize = 16;

#[derive(Default)]
struct Queue {
    records: VecDeque<SealedRecord>,
    /// Threads are running and take records.
    running: bool,
}

/// The queue of sealed records and its threads.
#[derive(Default)]
pub struct WriteBack {
    queue: Mutex<Queue>,
    /// Signalled when a record is queued or the threads are told to stop.
    queued: Condvar,
    /// Signalled when a record leaves the queue.
    room: Condvar,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// The queue's length, published for [`WriteBack::backlog`] (updated under its lock).
    queued_records: AtomicUsize,
    /// Bytes of the records the threads have written (grains written, padding included).
    written_bytes: AtomicU64,
}

/// The write-back's queue as the pacer sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Sealed records waiting for a thread.
    pub queued_records: usize,
    /// Bytes the threads have written since the pool opened.
    pub written_bytes: u64,
}

impl WriteBack {
    /// Starts `threads` write-back threads for `log` (none for 0).
    pub fn start(log: &Arc<Log>, threads: usize) -> Result<()> {
        let threads = threads.min(MAX_WRITE_BACK_THREADS);
        if threads == 0 {
            return Ok(());
        }
        log.write_back.queue.lock().running = true;
        for i in 0..threads {
            let e = log.clone();
            let h = std::thread::Builder::new()
                .name(format!("salsa-wb-{i}"))
                .spawn(move || worker(e))
                .map_err(|e| crate::error::Error::InvalidConfig(format!("cannot start a write-back thread: {e}")));
            match h {
                Ok(h) => log.write_back.threads.lock().push(h),
                Err(e) => {
                    log.write_back.stop();
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Queues `r` for a write-back thread, waiting only while the queue holds
    /// [`WRITE_BACK_DEPTH_MAX`] records. Without threads it gives `r` back for the caller to
    /// write. Call it while holding the lock of the stream that sealed `r`, so that a stream's
    /// records are queued in order, and [`WriteBack::wake_and_wait_for_room`] once that lock is
    /// let go.
    #[must_use = "a record given back must be written by the caller"]
    pub fn submit(&self, r: SealedRecord) -> Option<SealedRecord> {
        let mut q = self.queue.lock();
        while q.running && q.records.len() >= WRITE_BACK_DEPTH_MAX {
            self.room.wait(&mut q);
        }
        if !q.running {
            return Some(r);
        }
        q.records.push_back(r);
        self.queued_records.store(q.records.len(), Relaxed);
        None
    }

    /// After [`WriteBack::submit`] queued a record and the stream's lock is let go: wakes a
    /// thread for it, and waits while the queue holds more than [`WRITE_BACK_DEPTH`].
    pub fn wake_and_wait_for_room(&self) {
        self.queued.notify_one();
        let mut q = self.queue.lock();
        while q.running && q.records.len() > WRITE_BACK_DEPTH {
            self.room.wait(&mut q);
        }
    }

    /// The queue's length and the bytes written so far, without taking the queue's lock.
    pub fn backlog(&self) -> Backlog {
        Backlog {
            queued_records: self.queued_records.load(Relaxed),
            written_bytes: self.written_bytes.load(Relaxed),
        }
    }

    /// Lets the threads write what is queued, then stops them. Later submissions are written
    /// by their callers.
    pub fn stop(&self) {
        self.queue.lock().running = false;
        self.queued.notify_all();
        self.room.notify_all();
        for h in self.threads.lock().drain(..) {
            let _ = h.join();
        }
    }
}

fn worker(log: Arc<Log>) {
    let wb = &log.write_back;
    loop {
        let r = {
            let mut q = wb.queue.lock();
            loop {
                if let Some(r) = q.records.pop_front() {
                    wb.queued_records.store(q.records.len(), Relaxed);
                    // Every writer waiting for room may now be under its bound.
                    wb.room.notify_all();
                    break r;
                }
                if !q.running {
                    return;
                }
                wb.queued.wait(&mut q);
            }
        };
        let bytes = u64::from(r.used_grains + r.pad_grains) * u64::from(log.geo.grain_bytes);
        // A failure poisons the pool and completes the record (see `Log::write_record`);
        // the next flush reports it.
        let written = log.write_record(r);
        wb.written_bytes.fetch_add(bytes, Relaxed);
        if let Err(e) = written {
            tracing::debug!("write-back of a record failed: {e}");
        }
    }
}
