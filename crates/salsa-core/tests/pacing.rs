//! Pacing of user writes while the background GC is behind (`pacing.rs`,
//! `OpenOptions::pace_user_writes`): writers that keep the GC busy are paced, by a bounded
//! delay, and lose nothing; a pool that did not ask for it, or without a background GC (its
//! writers clean for themselves), never paces.

mod common;

use common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use salsa_core::device::MemoryDevice;
use salsa_core::{Device, OpenOptions, Pool, PoolConfig};
use std::sync::Arc;

const THREADS: u64 = 8;

/// Fills a volume of 85% of the pool, then overwrites random pages from `THREADS` threads
/// (each its own pages, so that the last value of each page is known); checks every page.
fn overwrite_from_threads(background_gc: bool, pace_user_writes: bool) -> salsa_core::Stats {
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
    let pages = (pool.logical_capacity_bytes() * 85 / 100) / PAGE as u64 / THREADS * THREADS;
    let vol = pool.create_volume("v", pages * PAGE as u64, PAGE as u32).unwrap();
    for p in 0..pages {
        vol.write(p * PAGE as u64, &pattern(1, p, 1)).unwrap();
    }
    let last: Vec<Vec<u64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let vol = vol.clone();
                s.spawn(move || {
                    // Thread t owns the pages p with p % THREADS == t.
                    let mut rng = SmallRng::seed_from_u64(t);
                    let mut mine = vec![1u64; (pages / THREADS) as usize];
                    for i in 0..pages {
                        let k = rng.gen_range(0..mine.len());
                        let v = i + 2;
                        let p = k as u64 * THREADS + t;
                        vol.write(p * PAGE as u64, &pattern(1, p, v)).unwrap();
                        mine[k] = v;
                    }
                    mine
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut buf = vec![0u8; PAGE];
    for p in 0..pages {
        vol.read(p * PAGE as u64, &mut buf).unwrap();
        let v = last[(p % THREADS) as usize][(p / THREADS) as usize];
        assert!(buf == pattern(1, p, v), "page {p} lost its last write");
    }
    let st = pool.stats();
    pool.close().unwrap();
    st
}

#[test]
fn writers_the_gc_cannot_keep_up_with_are_paced_by_a_bounded_delay() {
    let st = overwrite_from_threads(true, true);
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
    let st = overwrite_from_threads(true, false);
    assert!(st.throttled_allocations > 0, "writers stalled on the GC");
    assert_eq!((st.paced_writes, st.pacing_delay_micros), (0, 0), "pacing is off by default");
    let st = overwrite_from_threads(false, true);
    assert!(st.gc_segments_cleaned > 0, "the writers cleaned");
    assert_eq!((st.paced_writes, st.pacing_delay_micros), (0, 0));
}
