//! Pacing of user writes while the background GC is behind (`pacing.rs`,
//! `OpenOptions::pace_user_writes`): writers that keep the GC busy are paced, none waiting
//! longer than the bound for its turn, and lose nothing; a pool that did not ask for it, or without a background GC (its
//! writers clean for themselves), never paces.

mod common;

use common::*;
use salsa_core::device::MemoryDevice;
use salsa_core::{Device, OpenOptions, Pool, PoolConfig};
use std::sync::Arc;

const THREADS: u64 = 8;

/// [`overwrite_from_threads`] from `THREADS` threads on a pool of 48 MiB; its statistics.
fn overwrites(background_gc: bool, pace_user_writes: bool) -> salsa_core::Stats {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new("m", 48 * MIB));
    let cfg = PoolConfig {
        segment_bytes: Some(MIB),
        ..PoolConfig::default()
    };
    let opts = OpenOptions {
        background_gc,
        pace_user_writes,
        ..OpenOptions::default()
    };
    let pool = Pool::create(vec![dev], &cfg, &opts).unwrap();
    overwrite_from_threads(&pool, THREADS, 1);
    let st = pool.stats();
    pool.close().unwrap();
    st
}

#[test]
fn writers_the_gc_cannot_keep_up_with_are_paced_by_a_bounded_delay() {
    let st = overwrites(true, true);
    assert!(st.gc_segments_cleaned > 0, "the GC ran");
    assert!(
        st.paced_writes > 0,
        "writers stalled {} times on the GC and none was paced",
        st.throttled_allocations
    );
    let mean_micros = st.paced_micros / st.paced_writes;
    assert!(
        mean_micros <= 20_000,
        "a paced write slept {mean_micros} us on average: over the bound"
    );
}

#[test]
fn writers_are_not_paced_unless_asked_or_when_they_clean_for_themselves() {
    let st = overwrites(true, false);
    assert!(st.throttled_allocations > 0, "writers stalled on the GC");
    assert_eq!((st.paced_writes, st.pacing_rate_bytes_per_sec), (0, 0), "pacing is off by default");
    let st = overwrites(false, true);
    assert!(st.gc_segments_cleaned > 0, "the writers cleaned");
    assert_eq!((st.paced_writes, st.pacing_rate_bytes_per_sec), (0, 0));
}
