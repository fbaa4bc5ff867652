//! Pacing of user writes while the GC is behind (`OpenOptions::pace_user_writes`, `salsa
//! serve --pace-writes`; off by default, see below).
//!
//! Without pacing, writers run at full speed until free segments fall to the GC's reserve and
//! then all wait at once, for as long as the GC takes to free the next segment (a victim's
//! relocation and the sync that releases it): a few writes in a thousand wait tens of
//! milliseconds to a second while the rest take microseconds (measured on RAID-5 random
//! writes, docs/BENCHMARKS.md). The pacer spreads that wait over every write instead: while
//! the GC runs short of free segments, each user write first sleeps a delay that adapts, as a
//! TCP sender's window does (additive-multiplicative), to how often writers still hit the
//! reserve: each stall raises it by a quarter (once per [`RAISE_INTERVAL`]) and each quiet
//! [`DECAY_INTERVAL`] lowers it by an eighth. While the GC is not behind, writes are not
//! paced, but the delay is kept: under a steady load the GC is behind again moments later,
//! and starting over from nothing would cost a run of stalls each time.
//! The writers' mean rate stays what the GC sustains; what changes is that no single write
//! waits for a whole victim.
//!
//! Invariants: the delay is at most [`DELAY_MAX`]; a write is paced only while free segments
//! are within one of the GC's reserve, where writers would stall (pacing from higher up held
//! segments free that the data then lacked); trims and GC writes are never paced (trims make
//! space; the GC is what writers wait for).
//!
//! Why it is off by default: on RAID-5 random writes at queue depth 32 (1022 segments) it
//! took the p99.9 of write latency from about 150 ms to 5 to 7 ms and the maximum from 1 s
//! to about 25 ms, but write amplification rose 2% there, and about 7% on a pool of 96
//! segments, for a cause only partly found (docs/BENCHMARKS.md).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// The longest delay one write is paced by.
pub const DELAY_MAX: Duration = Duration::from_millis(20);
/// What the first stall sets the delay to, and the least a raise adds.
const DELAY_STEP: Duration = Duration::from_micros(20);
/// Stalls closer together than this raise the delay once: a stall stops every writer at once,
/// and each of them reporting it must not multiply the delay by the number of writers.
const RAISE_INTERVAL: Duration = Duration::from_millis(5);
/// Each interval this long without a stall lowers the delay by an eighth.
const DECAY_INTERVAL: Duration = Duration::from_millis(10);
/// Delays shorter than this are not slept (a sleep costs about that much by itself).
const DELAY_MIN: Duration = Duration::from_micros(10);

/// The adaptive delay of user writes (see the module documentation).
pub struct WritePacer {
    epoch: Instant,
    delay_ns: AtomicU64,
    /// When the delay was last raised, and last lowered (nanoseconds since `epoch`).
    raised_ns: AtomicU64,
    lowered_ns: AtomicU64,
    /// Writes paced, and the time they slept in all.
    pub paced_writes: AtomicU64,
    pub paced_micros: AtomicU64,
}

impl Default for WritePacer {
    fn default() -> Self {
        WritePacer {
            epoch: Instant::now(),
            delay_ns: AtomicU64::new(0),
            raised_ns: AtomicU64::new(0),
            lowered_ns: AtomicU64::new(0),
            paced_writes: AtomicU64::new(0),
            paced_micros: AtomicU64::new(0),
        }
    }
}

impl WritePacer {
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// A writer found no free segment above the GC's reserve and must wait for the GC: the
    /// delay was too short.
    pub fn stalled(&self) {
        let now = self.now_ns();
        let last = self.raised_ns.load(Relaxed);
        if last != 0 && now.saturating_sub(last) < RAISE_INTERVAL.as_nanos() as u64 {
            return;
        }
        if self.raised_ns.compare_exchange(last, now.max(1), Relaxed, Relaxed).is_err() {
            return; // another writer raised it just now
        }
        let d = self.delay_ns.load(Relaxed);
        let raised = (d + d / 4).max(d + DELAY_STEP.as_nanos() as u64).min(DELAY_MAX.as_nanos() as u64);
        self.delay_ns.store(raised, Relaxed);
        self.lowered_ns.store(now, Relaxed);
    }

    /// The delay a user write should sleep now; `gc_behind`: free segments are within one of
    /// the GC's reserve (`Engine::gc_behind`). Lowers the delay for every quiet interval since
    /// it last changed.
    pub fn delay(&self, gc_behind: bool) -> Option<Duration> {
        let d = self.delay_ns.load(Relaxed);
        if d == 0 {
            return None;
        }
        let now = self.now_ns();
        let lowered = self.lowered_ns.load(Relaxed);
        let quiet = now.saturating_sub(lowered) / DECAY_INTERVAL.as_nanos() as u64;
        let d = if quiet > 0 && self.lowered_ns.compare_exchange(lowered, now, Relaxed, Relaxed).is_ok() {
            let mut d = d;
            for _ in 0..quiet.min(64) {
                d -= d / 8;
            }
            self.delay_ns.store(d, Relaxed);
            d
        } else {
            d
        };
        // While the GC is not behind, writes go at full speed; the delay is kept (decaying)
        // for when it is again, as it will be at once under a steady load.
        (gc_behind && d >= DELAY_MIN.as_nanos() as u64).then(|| Duration::from_nanos(d))
    }

    /// Sleeps the delay [`WritePacer::delay`] gives, counting it.
    pub fn pace(&self, gc_behind: bool) {
        if let Some(d) = self.delay(gc_behind) {
            std::thread::sleep(d);
            self.paced_writes.fetch_add(1, Relaxed);
            self.paced_micros.fetch_add(d.as_micros() as u64, Relaxed);
        }
    }

    /// The current delay (for statistics).
    pub fn current(&self) -> Duration {
        Duration::from_nanos(self.delay_ns.load(Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_delay_until_a_stall_and_none_while_the_gc_is_not_behind() {
        let p = WritePacer::default();
        assert_eq!(p.delay(true), None);
        p.stalled();
        assert_eq!(p.delay(true), Some(DELAY_STEP));
        assert_eq!(p.delay(false), None, "the GC is not behind: writes go at full speed");
        assert_eq!(p.delay(true), Some(DELAY_STEP), "the delay is kept for when it is behind again");
    }

    #[test]
    fn stalls_together_raise_the_delay_once() {
        let p = WritePacer::default();
        for _ in 0..32 {
            p.stalled();
        }
        assert_eq!(p.current(), DELAY_STEP);
        std::thread::sleep(RAISE_INTERVAL + Duration::from_millis(1));
        p.stalled();
        assert_eq!(p.current(), DELAY_STEP * 2, "a later stall raises it again");
    }

    #[test]
    fn the_delay_grows_by_a_quarter_up_to_its_bound_and_decays_when_quiet() {
        let mut p = WritePacer::default();
        p.epoch -= Duration::from_secs(10);
        // Raise it many times (forging the time of the last raise to let each count).
        for _ in 0..200 {
            p.raised_ns.store(1, Relaxed);
            p.stalled();
        }
        assert_eq!(p.current(), DELAY_MAX);
        p.raised_ns.store(1, Relaxed);
        p.stalled();
        assert_eq!(p.current(), DELAY_MAX, "bounded");
        // Three quiet intervals: an eighth off each.
        let now = p.now_ns();
        p.lowered_ns.store(now - 3 * DECAY_INTERVAL.as_nanos() as u64, Relaxed);
        let mut want = DELAY_MAX.as_nanos() as u64;
        for _ in 0..3 {
            want -= want / 8;
        }
        assert_eq!(p.delay(true), Some(Duration::from_nanos(want)));
    }
}
