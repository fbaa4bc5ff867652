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

/// Writes a server takes on its receiving thread (`Volume::write_paged_now` into the write
/// buffer, handed to a thread that may wait, `Volume::write_paged`, when that says no) are
/// paced too: the rate is corrected on that path as well, and the writes it lets through are
/// measured. (Before, `salsa serve --pace-writes`, whose writes all came this way, never
/// paced one.) Every page reads back its last write.
#[test]
fn writes_a_server_buffers_on_its_receiving_thread_are_paced_too() {
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new("m", 48 * MIB));
    let cfg = PoolConfig {
        segment_bytes: Some(MIB),
        ..PoolConfig::default()
    };
    let opts = OpenOptions {
        pace_user_writes: true,
        // Room for the whole volume, written down at once: the receiving thread's path never
        // runs out of room (as for a server whose buffer holds the working set), so only the
        // pacer sends writes to the waiting path.
        write_buffer_bytes: 64 * MIB,
        write_buffer_expire: std::time::Duration::from_millis(1),
        ..OpenOptions::default()
    };
    let pool = Pool::create(vec![dev], &cfg, &opts).unwrap();
    let pages = (pool.logical_capacity_bytes() * 85 / 100) / PAGE as u64 / THREADS * THREADS;
    let vol = pool.create_volume("v", pages * PAGE as u64, PAGE as u32).unwrap();
    let last: Vec<Vec<u64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let vol = vol.clone();
                s.spawn(move || {
                    // Thread t owns the pages p with p % THREADS == t; one pass in order
                    // fills them, then random overwrites for two seconds.
                    let mut rng = SmallRng::seed_from_u64(t);
                    let mut mine = vec![0u64; (pages / THREADS) as usize];
                    let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
                    for i in 0.. {
                        if i >= mine.len() && std::time::Instant::now() >= until {
                            break;
                        }
                        let k = if i < mine.len() { i } else { rng.gen_range(0..mine.len()) };
                        let p = k as u64 * THREADS + t;
                        let mut payload = vol.paged_payload(p * PAGE as u64, PAGE).expect("a buffered volume");
                        let v = i as u64 + 1;
                        for page in payload.pages_mut() {
                            page.copy_from_slice(&pattern(1, p, v));
                        }
                        if let Some(payload) = vol.write_paged_now(payload).unwrap() {
                            vol.write_paged(payload).unwrap();
                        }
                        mine[k] = v;
                    }
                    mine
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let st = pool.stats();
    assert!(st.gc_segments_cleaned > 0, "the GC ran");
    assert!(
        st.paced_writes > 0,
        "writers stalled {} times on the GC and none was paced",
        st.throttled_allocations
    );
    let mut buf = vec![0u8; PAGE];
    for p in 0..pages {
        vol.read(p * PAGE as u64, &mut buf).unwrap();
        let v = last[(p % THREADS) as usize][(p / THREADS) as usize];
        assert!(buf == pattern(1, p, v), "page {p} lost its last write");
    }
    pool.close().unwrap();
}
