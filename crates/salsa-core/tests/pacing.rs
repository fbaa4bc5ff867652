//! Pacing of user writes while the background GC is behind (`pacing.rs`,
//! `OpenOptions::pace_user_writes`): writers that keep the GC busy are paced, none waiting
//! longer than the bound for its turn, and lose nothing; a pool that did not ask for it, or without a background GC (its
//! writers clean for themselves), never paces.

mod common;

use common::*;
use salsa_core::device::MemoryDevice;
use salsa_core::{Device, OpenOptions, Pool, PoolConfig, Volume, WrittenNow};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest a paced write waits for its turn (`pacing::DELAY_MAX`).
const DELAY_MAX: Duration = Duration::from_millis(20);

const THREADS: u64 = 8;

/// A pool of `size_mib` MiB in segments of 1 MiB with `spare_percent` spare (`None`: the
/// default), opened with `opts`.
fn pool_of(size_mib: u64, spare_percent: Option<f64>, opts: &OpenOptions) -> Pool {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new("m", size_mib * MIB));
    let mut cfg = PoolConfig {
        segment_bytes: Some(MIB),
        ..PoolConfig::default()
    };
    cfg.spare_percent = spare_percent.unwrap_or(cfg.spare_percent);
    Pool::create(vec![dev], &cfg, opts).unwrap()
}

/// A pool of 256 MiB (large enough that pacing widens its GC band), its user writes paced
/// or not.
fn pool_of_256_mib(pace_user_writes: bool, spare_percent: Option<f64>) -> Pool {
    let opts = OpenOptions {
        pace_user_writes,
        ..OpenOptions::default()
    };
    pool_of(256, spare_percent, &opts)
}

/// Writes every byte of `vol`'s first `size` bytes once, a MiB at a time.
fn write_all_of(vol: &Volume, size: u64) {
    let chunk = vec![7u8; MIB as usize];
    for at in (0..size).step_by(MIB as usize) {
        let n = (size - at).min(MIB) as usize;
        vol.write(at, &chunk[..n]).unwrap();
    }
}

/// [`overwrite_from_threads`] from `THREADS` threads on a pool of 48 MiB; its statistics.
fn overwrites(background_gc: bool, pace_user_writes: bool) -> salsa_core::Stats {
    let pool = pool_of(
        48,
        None,
        &OpenOptions {
            background_gc,
            pace_user_writes,
            ..OpenOptions::default()
        },
    );
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
/// buffer; `Volume::write_paged` on a thread that may wait when that says not now) are paced
/// too: the rate is corrected on that path as well, the writes it lets through are measured,
/// and a paced one is written at once with the time it may be acknowledged, which the thread
/// here waits for as a server holds its reply. (Before, `salsa serve --pace-writes`, whose
/// writes all came this way, never paced one.) No acknowledgement is due later than the
/// pacer's bound, and every page reads back its last write.
#[test]
fn writes_a_server_buffers_on_its_receiving_thread_are_paced_too() {
    let pool = pool_of(
        48,
        None,
        &OpenOptions {
            pace_user_writes: true,
            // Room for the whole volume, written down at once: the receiving thread's path never
            // runs out of room (as for a server whose buffer holds the working set).
            write_buffer_bytes: 64 * MIB,
            write_buffer_expire: std::time::Duration::from_millis(1),
            ..OpenOptions::default()
        },
    );
    let held = std::sync::atomic::AtomicU64::new(0);
    let through_the_buffer = |vol: &Volume, at: u64, data: &[u8]| {
        let mut payload = vol.paged_payload(at, PAGE).expect("a buffered volume");
        payload.pages_mut().for_each(|page| page.copy_from_slice(data));
        let written = vol.write_paged_now(payload).unwrap();
        // The turn is set inside the call, so it is at most the bound after the call returned,
        // however long this thread waited for a core in between (a bound that holds under load).
        let returned = Instant::now();
        match written {
            WrittenNow::Written { ack_at: None } => {}
            WrittenNow::Written { ack_at: Some(ack_at) } => {
                let mut buf = vec![0u8; PAGE];
                vol.read(at, &mut buf).unwrap();
                assert!(buf == data, "a write waiting for its acknowledgement is not read back");
                let wait = ack_at.saturating_duration_since(returned);
                assert!(wait <= DELAY_MAX, "acknowledgement due {wait:?} after the write returned");
                held.fetch_add(1, Relaxed);
                salsa_core::sleep_until_ack_time(ack_at);
            }
            WrittenNow::NotNow(payload) => vol.write_paged(payload).unwrap(),
        }
    };
    let two_seconds = Overwrite::For(Duration::from_secs(2));
    overwrite_from_threads_with(&pool, THREADS, two_seconds, &through_the_buffer);
    let st = pool.stats();
    assert!(st.gc_segments_cleaned > 0, "the GC ran");
    assert!(
        st.paced_writes > 0 && held.load(Relaxed) > 0,
        "writers stalled {} times on the GC and none was paced",
        st.throttled_allocations
    );
    pool.close().unwrap();
}

/// One thread keeps 16 writes in flight (`Volume::write_with_ack_time`) and acknowledges each
/// at its time, as a front-end holding its clients' replies does: the writes are paced (their
/// acknowledgements come later than the writes, never past the bound), the GC keeps up
/// without the writers stalling on its reserve more than the writers of the other tests do,
/// and every page reads back its last write.
#[test]
fn one_thread_holding_acknowledgements_is_paced_like_many_writers_sleeping() {
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    let pool = pool_of(
        48,
        None,
        &OpenOptions {
            pace_user_writes: true,
            ..OpenOptions::default()
        },
    );
    let pages = (pool.logical_capacity_bytes() * 85 / 100) / PAGE as u64;
    let vol = pool.create_volume("v", pages * PAGE as u64, PAGE as u32).unwrap();
    let mut last = vec![1u64; pages as usize];
    for p in 0..pages {
        vol.write(p * PAGE as u64, &pattern(1, p, 1)).unwrap();
    }
    let mut rng = SmallRng::seed_from_u64(5);
    let started = Instant::now();
    let mut slots: Vec<Option<Instant>> = vec![None; 16];
    let (mut held, mut i) = (0u64, 1u64);
    while started.elapsed() < Duration::from_secs(2) {
        let now = Instant::now();
        for slot in slots.iter_mut() {
            if slot.is_none_or(|at| at <= now) {
                i += 1;
                let p = rng.gen_range(0..pages);
                let called = Instant::now();
                *slot = vol.write_with_ack_time(p * PAGE as u64, &pattern(1, p, i)).unwrap();
                // Bounds that hold however long the thread waited for a core during the call.
                let returned = Instant::now();
                last[p as usize] = i;
                if let Some(at) = *slot {
                    assert!(
                        at > called && at.saturating_duration_since(returned) <= DELAY_MAX,
                        "acknowledgement due {:?} after the write returned",
                        at.saturating_duration_since(returned)
                    );
                    held += 1;
                }
            }
        }
        if let Some(at) = slots.iter().flatten().min() {
            salsa_core::sleep_until_ack_time(*at);
        }
    }
    let st = pool.stats();
    assert!(st.gc_segments_cleaned > 0, "the GC ran");
    assert!(
        held > 0 && st.paced_writes >= held,
        "{held} writes held, stats: {} paced",
        st.paced_writes
    );
    let mut buf = vec![0u8; PAGE];
    for p in 0..pages {
        vol.read(p * PAGE as u64, &mut buf).unwrap();
        assert!(buf == pattern(1, p, last[p as usize]), "page {p} lost its last write");
    }
    pool.close().unwrap();
}

/// A paced pool's GC band is wider by an eighth of the segments needed neither by the data
/// nor as its configured spare, and narrows to the plain widening (1 in 64 of the pool) as a
/// volume's data grows into that surplus; `Stats` reports where it stands.
#[test]
fn a_paced_pools_gc_band_narrows_as_its_data_grows_into_the_surplus() {
    let plain = pool_of_256_mib(false, None).stats();
    let pool = pool_of_256_mib(true, None);
    let st = pool.stats();
    let total = st.total_segments;
    assert!(total >= 128, "the test needs a pool that widens its band: {total} segments");
    let widened_by = |st: &salsa_core::Stats| st.gc_low_watermark_segments - plain.gc_low_watermark_segments;
    let base = (total / 64).min(16);
    assert!(
        widened_by(&st) > 2 * base,
        "an empty paced pool's band is widened by {} segments, no more than a full one's {base}",
        widened_by(&st)
    );
    assert_eq!(
        st.gc_high_watermark_segments - plain.gc_high_watermark_segments,
        2 * widened_by(&st)
    );
    // A volume of the pool's whole capacity, written once: the surplus is gone.
    let size = pool.logical_capacity_bytes();
    let vol = pool.create_volume("v", size, 4096).unwrap();
    write_all_of(&vol, size);
    pool.flush().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while widened_by(&pool.stats()) > base && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        widened_by(&pool.stats()),
        base,
        "the band of a full pool: {:?}",
        pool.stats().gc_low_watermark_segments
    );
    // Trimmed, the data gives the surplus back.
    vol.trim(0, size / 2).unwrap();
    pool.flush().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while widened_by(&pool.stats()) <= 2 * base && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(widened_by(&pool.stats()) > 2 * base, "trimming half gave nothing back");
    pool.close().unwrap();
}

/// A paced pool's wider GC band is made of surplus space and moves with it: the pool's
/// capacity (what volumes may hold, and what a write is refused beyond) is the unpaced
/// pool's, also where the GC's reserve rather than the configured spare bounds it.
#[test]
fn pacing_leaves_a_pools_capacity_as_it_is() {
    let capacity = |pace_user_writes: bool| {
        let pool = pool_of_256_mib(pace_user_writes, Some(1.0));
        let st = pool.stats();
        let bytes = pool.logical_capacity_bytes();
        // A volume of all of it takes writes of all of it.
        let vol = pool.create_volume("v", bytes, 4096).unwrap();
        write_all_of(&vol, bytes);
        pool.close().unwrap();
        (bytes, st.gc_high_watermark_segments)
    };
    let (plain, plain_high) = capacity(false);
    let (paced, paced_high) = capacity(true);
    assert!(
        paced_high > plain_high,
        "the paced band is wider: {paced_high} against {plain_high}"
    );
    assert_eq!(paced, plain, "a paced pool's capacity");
}
