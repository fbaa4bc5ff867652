//! Pacing of user writes while the background GC is behind (`pacing.rs`,
//! `OpenOptions::pace_user_writes`): writers that keep the GC busy are paced, none waiting
//! longer than the bound for its turn, and lose nothing; a pool that did not ask for it, or without a background GC (its
//! writers clean for themselves), never paces.

mod common;

use common::*;
use salsa_core::device::MemoryDevice;
use salsa_core::{Device, OpenOptions, Pool, PoolConfig, Volume};
use std::sync::Arc;

const THREADS: u64 = 8;

/// A pool of 48 MiB in segments of 1 MiB, opened with `opts`.
fn pool_of_48_mib(opts: &OpenOptions) -> Pool {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new("m", 48 * MIB));
    let cfg = PoolConfig {
        segment_bytes: Some(MIB),
        ..PoolConfig::default()
    };
    Pool::create(vec![dev], &cfg, opts).unwrap()
}

/// [`overwrite_from_threads`] from `THREADS` threads on a pool of 48 MiB; its statistics.
fn overwrites(background_gc: bool, pace_user_writes: bool) -> salsa_core::Stats {
    let pool = pool_of_48_mib(&OpenOptions {
        background_gc,
        pace_user_writes,
        ..OpenOptions::default()
    });
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
    let pool = pool_of_48_mib(&OpenOptions {
        pace_user_writes: true,
        // Room for the whole volume, written down at once: the receiving thread's path never
        // runs out of room (as for a server whose buffer holds the working set), so only the
        // pacer sends writes to the waiting path.
        write_buffer_bytes: 64 * MIB,
        write_buffer_expire: std::time::Duration::from_millis(1),
        ..OpenOptions::default()
    });
    let through_the_buffer = |vol: &Volume, at: u64, data: &[u8]| {
        let mut payload = vol.paged_payload(at, PAGE).expect("a buffered volume");
        payload.pages_mut().for_each(|page| page.copy_from_slice(data));
        if let Some(payload) = vol.write_paged_now(payload).unwrap() {
            vol.write_paged(payload).unwrap();
        }
    };
    let two_seconds = Overwrite::For(std::time::Duration::from_secs(2));
    overwrite_from_threads_with(&pool, THREADS, two_seconds, &through_the_buffer);
    let st = pool.stats();
    assert!(st.gc_segments_cleaned > 0, "the GC ran");
    assert!(
        st.paced_writes > 0,
        "writers stalled {} times on the GC and none was paced",
        st.throttled_allocations
    );
    pool.close().unwrap();
}
