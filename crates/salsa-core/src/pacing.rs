//! Pacing of user writes while the GC is behind (`OpenOptions::pace_user_writes`, `salsa
//! serve --pace-writes`; off by default, see below).
//!
//! Without pacing, writers run at full speed until free segments fall to the GC's reserve and
//! then all wait at once, for as long as the GC takes to free the next segment (a victim's
//! relocation and the sync that releases it): a few writes in a thousand wait tens of
//! milliseconds to a second while the rest take microseconds (measured on RAID-5 random
//! writes, docs/BENCHMARKS.md). The pacer admits user writes at a rate instead, the rate the
//! GC sustains, found by feedback: writes take turns on one clock, each its share of time
//! (`bytes / rate`), so every write waits about as long as the others and none waits for a
//! whole victim.
//!
//! The rate starts, when the GC falls behind (free segments below its low watermark), at the
//! rate users wrote just before, and is corrected every [`UPDATE_INTERVAL`] by where free
//! segments stand (averaged over a few intervals, victims waiting for their release sync
//! counted as free): up 2% at or above the GC's low watermark, up 0.5% below it, down 3% near
//! the reserve, and down a fifth when a writer stalled on the reserve all the same. Steps
//! this small keep the rate, and so the latency, steady from one interval to the next, where
//! a delay raised at each stall (the pacer's first version) swung by its step. Pacing stops
//! when the GC has kept free segments at its high watermark for [`DISENGAGE_AFTER`]: the
//! writers no longer outrun it. A paced pool's GC band is wider
//! ([`crate::log::capacity::Watermarks::widened_for_pacing`]), so that the GC's bursts do
//! not reach the reserve.
//!
//! Invariants: no write waits longer than [`DELAY_MAX`] for its turn; the rate is at least
//! [`RATE_MIN_BYTES_PER_SEC`] and falls to twice what writers wrote in the last interval when
//! it is above that (a rate far above the load would say nothing when the load rises);
//! trims and GC writes are never paced (trims make space; the GC is what writers wait for).
//!
//! Why it is off by default: writers held to what the GC sustains leave more segments free
//! than writers stalled on the reserve (and a large pool's band is wider), space the data
//! lacks, so a paced pool writes more per user byte: on RAID-5 random writes over a whole
//! volume of 1022 segments 3.79 against 3.72 bytes to the members, on a pool of 96 segments
//! a GC write amplification of 4.0 to 4.4 against 3.5 to 3.7 (docs/BENCHMARKS.md). A user who
//! cares for the latency tail more than for that turns it on.

use crate::log::capacity::Watermarks;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// The longest a write waits for its turn.
pub const DELAY_MAX: Duration = Duration::from_millis(20);
/// How often the rate is corrected.
const UPDATE_INTERVAL: Duration = Duration::from_millis(5);
/// Free segments at the GC's high watermark this long end pacing.
const DISENGAGE_AFTER: Duration = Duration::from_millis(50);
/// The least rate the pacer admits writes at (1 MiB/s): below it a stalled writer waits no
/// longer than a paced one would.
pub const RATE_MIN_BYTES_PER_SEC: u64 = 1 << 20;
/// An interval longer than this (no writes came) measures nothing.
const STALE_AFTER: Duration = Duration::from_millis(20);
/// Waits shorter than this are not slept (a sleep costs about that much by itself).
const SLEEP_MIN: Duration = Duration::from_micros(10);

/// The pacer's controller state, corrected once per [`UPDATE_INTERVAL`].
#[derive(Default)]
struct Control {
    /// When the rate was last corrected (nanoseconds since the epoch).
    updated_ns: u64,
    /// User bytes admitted by then.
    bytes_at_update: u64,
    /// Since when free segments stand at the high watermark (0: they do not).
    high_since_ns: u64,
    /// Free segments, averaged over the last few intervals.
    free_avg: f64,
}

/// The admission rate of user writes (see the module documentation).
pub struct WritePacer {
    epoch: Instant,
    /// Bytes per second user writes are admitted at; 0 while not pacing.
    rate_bytes_per_sec: AtomicU64,
    /// The clock writes take turns on: when the next turn starts (ns since the epoch).
    next_turn_ns: AtomicU64,
    /// User bytes that passed the pacer (paced or not).
    bytes_admitted: AtomicU64,
    /// A writer stalled on the GC's reserve since the last correction.
    stalled: AtomicBool,
    control: Mutex<Control>,
    /// Writes that waited for their turn, and the time they waited in all.
    pub paced_writes: AtomicU64,
    pub paced_micros: AtomicU64,
}

impl Default for WritePacer {
    fn default() -> Self {
        WritePacer {
            epoch: Instant::now(),
            rate_bytes_per_sec: AtomicU64::new(0),
            next_turn_ns: AtomicU64::new(0),
            bytes_admitted: AtomicU64::new(0),
            stalled: AtomicBool::new(false),
            control: Mutex::new(Control::default()),
            paced_writes: AtomicU64::new(0),
            paced_micros: AtomicU64::new(0),
        }
    }
}

/// The factor one correction applies to the rate, from free segments against the GC's
/// watermarks and whether a writer stalled on the reserve.
fn correction(free: f64, wm: &Watermarks, stalled: bool) -> f64 {
    if stalled {
        0.8
    } else if free <= wm.gc_reserve as f64 + 1.5 {
        0.97
    } else if free < wm.low as f64 {
        1.005
    } else {
        1.02
    }
}

impl WritePacer {
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// A writer found no free segment above the GC's reserve and waits for the GC: the rate
    /// was too high.
    pub fn stalled(&self) {
        self.stalled.store(true, Relaxed);
    }

    /// Whether writes are paced now.
    pub fn pacing(&self) -> bool {
        self.rate_bytes_per_sec.load(Relaxed) != 0
    }

    /// The rate writes are admitted at (0: not pacing).
    pub fn rate_bytes_per_sec(&self) -> u64 {
        self.rate_bytes_per_sec.load(Relaxed)
    }

    /// Corrects the rate when an interval has passed since the last correction, from `free`
    /// segments against the GC's watermarks.
    fn update(&self, now: u64, free: impl Fn() -> u32, wm: &Watermarks) {
        let Some(mut c) = self.control.try_lock() else {
            return; // another writer corrects it
        };
        let dt = now.saturating_sub(c.updated_ns);
        if dt < UPDATE_INTERVAL.as_nanos() as u64 {
            return;
        }
        let bytes = self.bytes_admitted.load(Relaxed);
        let measured = (bytes - c.bytes_at_update) as f64 * 1e9 / dt as f64;
        c.updated_ns = now;
        c.bytes_at_update = bytes;
        // After a pause (or writes paced to fewer than one an interval) what writers wrote
        // says nothing of what the GC sustains: the rate is corrected by the free segments
        // alone.
        let fresh = dt <= STALE_AFTER.as_nanos() as u64;
        let stalled = self.stalled.swap(false, Relaxed);
        let free_now = free();
        c.free_avg = if c.free_avg == 0.0 {
            free_now as f64
        } else {
            0.7 * c.free_avg + 0.3 * free_now as f64
        };
        let free = c.free_avg;
        if free_now >= wm.high {
            if c.high_since_ns == 0 {
                c.high_since_ns = now;
            }
        } else {
            c.high_since_ns = 0;
        }
        let rate = self.rate_bytes_per_sec.load(Relaxed);
        let next = if rate == 0 {
            // Not pacing: start when the GC falls behind, at what users wrote meanwhile.
            if fresh && (free_now < wm.low || stalled) {
                measured
            } else {
                0.0
            }
        } else if c.high_since_ns != 0 && now - c.high_since_ns >= DISENGAGE_AFTER.as_nanos() as u64 {
            0.0
        } else if fresh {
            (rate as f64 * correction(free, wm, stalled)).min((2.0 * measured).max(rate as f64 * 0.5))
        } else {
            rate as f64 * correction(free, wm, stalled)
        };
        let next = if next == 0.0 {
            0
        } else {
            (next as u64).max(RATE_MIN_BYTES_PER_SEC)
        };
        self.rate_bytes_per_sec.store(next, Relaxed);
    }

    /// Corrects the rate if an interval has passed (`free`: free segments now; `wm`: the GC's
    /// watermarks), without admitting a write.
    pub fn refresh(&self, free: impl Fn() -> u32, wm: &Watermarks) {
        self.update(self.now_ns(), free, wm);
    }

    /// Counts a user write of `bytes` that was let through without [`WritePacer::pace`]
    /// (pacing was off when it came), for the rate writers are measured at.
    pub fn count_unpaced(&self, bytes: u64) {
        self.bytes_admitted.fetch_add(bytes, Relaxed);
    }

    /// Admits a user write of `bytes`: corrects the rate if due, then waits for the write's
    /// turn while pacing. `free`: free segments now; `wm`: the GC's watermarks.
    pub fn pace(&self, bytes: u64, free: impl Fn() -> u32, wm: &Watermarks) {
        self.bytes_admitted.fetch_add(bytes, Relaxed);
        let now = self.now_ns();
        self.update(now, free, wm);
        let rate = self.rate_bytes_per_sec.load(Relaxed);
        if rate == 0 {
            return;
        }
        let share = (bytes as u128 * 1_000_000_000 / rate as u128) as u64;
        let latest = now + DELAY_MAX.as_nanos() as u64;
        let mut turn = 0;
        let _ = self.next_turn_ns.fetch_update(Relaxed, Relaxed, |next| {
            // A turn not taken is not kept: no burst after a pause.
            turn = next.max(now).min(latest);
            Some(turn + share)
        });
        let wait = Duration::from_nanos(turn - now);
        if wait >= SLEEP_MIN {
            std::thread::sleep(wait);
            self.paced_writes.fetch_add(1, Relaxed);
            self.paced_micros.fetch_add(wait.as_micros() as u64, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WM: Watermarks = Watermarks {
        gc_reserve: 3,
        low: 10,
        high: 20,
        release: 31,
    };
    const MS: u64 = 1_000_000;

    /// Corrections of `p` over `intervals` intervals of 5 ms from time `at` (ms), writers
    /// having written `bytes_per_ms` each millisecond, with `free` segments; returns the time
    /// after them.
    fn run(p: &WritePacer, at: u64, intervals: u64, bytes_per_ms: u64, free: u32) -> u64 {
        let mut t = at;
        for _ in 0..intervals {
            p.bytes_admitted.fetch_add(5 * bytes_per_ms, Relaxed);
            t += 5;
            p.update(t * MS, || free, &WM);
        }
        t
    }

    #[test]
    fn not_paced_until_the_gc_falls_behind_then_at_the_rate_users_wrote() {
        let p = WritePacer::default();
        let t = run(&p, 0, 4, 1 << 20, WM.high);
        assert!(!p.pacing(), "the GC keeps up: no pacing");
        run(&p, t, 1, 1 << 20, WM.gc_reserve + 1);
        let rate = p.rate_bytes_per_sec() as f64;
        let wrote = (1u64 << 20) as f64 * 1000.0;
        assert!(p.pacing());
        assert!((rate - wrote).abs() < 1.0, "starts at what users wrote ({wrote}): {rate}");
    }

    #[test]
    fn a_stall_lowers_the_rate_by_a_fifth_and_room_raises_it_by_steps() {
        let p = WritePacer::default();
        p.rate_bytes_per_sec.store(100 << 20, Relaxed);
        p.stalled();
        // Writers keep up with the rate: the measured bound does not cut in.
        let t = run(&p, 0, 1, 100 << 10, WM.low + 1);
        assert_eq!(p.rate_bytes_per_sec(), (100u64 << 20) * 4 / 5);
        let before = p.rate_bytes_per_sec() as f64;
        run(&p, t, 1, 100 << 10, WM.low + 1);
        let after = p.rate_bytes_per_sec() as f64;
        assert!((after / before - 1.02).abs() < 1e-6, "2% up with room: {before} -> {after}");
    }

    #[test]
    fn pacing_stops_once_the_gc_held_its_high_watermark_a_while() {
        let p = WritePacer::default();
        p.rate_bytes_per_sec.store(100 << 20, Relaxed);
        let intervals = DISENGAGE_AFTER.as_millis() as u64 / 5;
        let t = run(&p, 0, intervals, 100 << 10, WM.high);
        assert!(p.pacing(), "not yet: {intervals} intervals are not past the time");
        run(&p, t, 2, 100 << 10, WM.high);
        assert!(!p.pacing());
    }

    #[test]
    fn the_rate_falls_to_twice_what_writers_wrote_and_a_pause_measures_nothing() {
        let p = WritePacer::default();
        p.rate_bytes_per_sec.store(1 << 30, Relaxed);
        let t = run(&p, 0, 2, 1 << 10, WM.low + 1);
        // Halved each interval at most, never below what the writers did twice over.
        assert_eq!(p.rate_bytes_per_sec(), 1 << 28);
        let t = run(&p, t, 10, 1 << 10, WM.low + 1);
        let twice = 2.0 * (1u64 << 10) as f64 * 1000.0;
        assert!((p.rate_bytes_per_sec() as f64 - twice).abs() / twice < 1e-6);
        // No write for a second: corrected by the free segments alone, not cut to what the
        // writers wrote (nothing).
        let kept = p.rate_bytes_per_sec() as f64;
        p.update((t + 1000) * MS, || WM.low + 1, &WM);
        assert!((p.rate_bytes_per_sec() as f64 / kept - 1.02).abs() < 1e-6);
    }

    #[test]
    fn writes_take_turns_at_the_rate_and_none_waits_longer_than_the_bound() {
        let p = WritePacer::default();
        // 4 KiB at 4.096 MB/s: a millisecond each (the rate may rise 2% an interval).
        p.rate_bytes_per_sec.store(4096 * 1000, Relaxed);
        let t = Instant::now();
        for _ in 0..20 {
            p.pace(4096, || WM.low, &WM);
        }
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(17), "20 turns of 1 ms took {took:?}");
        assert!(p.paced_writes.load(Relaxed) >= 19);
        // At the least rate, a 1 MiB write's turn would be a second away: bounded.
        let p = WritePacer::default();
        p.rate_bytes_per_sec.store(RATE_MIN_BYTES_PER_SEC, Relaxed);
        p.pace(1 << 20, || WM.low, &WM);
        let t = Instant::now();
        p.pace(4096, || WM.low, &WM);
        let waited = t.elapsed();
        assert!(waited >= DELAY_MAX && waited < DELAY_MAX * 10, "waited {waited:?}");
    }
    #[test]
    fn writes_rarer_than_the_interval_still_end_pacing() {
        // One write a second (large writes at a low rate): every interval is stale, and
        // pacing still stops once the GC holds its high watermark.
        let p = WritePacer::default();
        p.rate_bytes_per_sec.store(RATE_MIN_BYTES_PER_SEC, Relaxed);
        for s in 1..=3 {
            p.bytes_admitted.fetch_add(1 << 20, Relaxed);
            p.update(s * 1000 * MS, || WM.high, &WM);
        }
        assert!(!p.pacing());
    }
}
