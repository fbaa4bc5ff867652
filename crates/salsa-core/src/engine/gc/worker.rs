//! The background GC workers: each sleeps until woken or for 50 ms, then runs a round while
//! the triggers say so.

use super::super::*;

impl Engine {
    pub fn wake_gc(&self) {
        let (m, cv) = &self.gc_wake;
        *m.lock() = true;
        cv.notify_all();
    }

    /// Sleeps the GC worker until woken or the timeout passes.
    pub fn gc_wait(&self, timeout: Duration) {
        let (m, cv) = &self.gc_wake;
        let mut woken = m.lock();
        if !*woken {
            cv.wait_for(&mut woken, timeout);
        }
        *woken = false;
    }

    /// One round of the background worker: release what a sync releases, then clean until the
    /// high watermark (and, with a garbage trigger, until garbage is back under it).
    pub fn gc_round(&self) -> Result<()> {
        let wm = self.log.capacity().watermarks();
        if self.release_due() {
            self.log.flush()?;
        }
        while (self.log.capacity().free_segments() < wm.high || self.garbage_due() || self.short_types(wm.high).is_some())
            && !self.shutting_down.load(SeqCst)
        {
            if !self.gc_step()? {
                self.gc_stuck.store(true, SeqCst);
                self.log.capacity().changed.notify_all();
                return Ok(());
            }
            self.gc_stuck.store(false, SeqCst);
        }
        Ok(())
    }
}

/// GC workers run at the writers' CPU priority. They ran at nice 10 while a victim was read
/// whole (so that a paced writer woken for its turn did not wait behind the GC's copies: p99
/// 889 against 699 us then). Once the GC read only victims' live pages, it was CPU that
/// bounded its pace, and nice 10 cost paced RAID-5 random writes to half the array 776
/// against 954 MB/s, with a p99 of 540 against 498 us (docs/BENCHMARKS.md, "GC reads of live
/// pages only").
pub(crate) fn gc_worker(eng: Arc<Engine>) {
    while !eng.shutting_down.load(SeqCst) {
        if eng.needs_gc_round() && !eng.log.is_poisoned() {
            if let Err(e) = eng.gc_round() {
                if !eng.log.is_poisoned() {
                    tracing::error!("garbage collection failed: {e}");
                    eng.gc_stuck.store(true, SeqCst);
                    eng.log.capacity().changed.notify_all();
                }
            }
        }
        eng.gc_wait(Duration::from_millis(50));
    }
}
