//! The write buffer (`OpenOptions::write_buffer_bytes`): overwrites before a flush stay in
//! memory, the buffer keeps its bound, reads always see the newest write, trims and FUA
//! writes meet buffered pages in order, the destager writes pages down by age, and a flush or
//! a FUA write is as durable as without the buffer.

mod common;
use common::*;
use salsa_core::device::{CrashDevice, CrashPlan, FaultDevice, FaultPlan};
use salsa_core::{Device, OpenOptions, Pool, WrittenNow};
use std::sync::Arc;
use std::time::Duration;

fn buffered(capacity_bytes: u64) -> OpenOptions {
    OpenOptions {
        write_buffer_bytes: capacity_bytes,
        ..inline_gc()
    }
}

/// A pool on a 64 MiB memory device with a 64 MiB buffer whose destager writes pages down
/// once the oldest is `expire_ms` old, and a volume `v` of 8 MiB.
fn pool_with_destager(expire_ms: u64) -> (Pool, salsa_core::Volume) {
    let opts = OpenOptions {
        write_buffer_bytes: 64 * MIB,
        write_buffer_expire: Duration::from_millis(expire_ms),
        ..OpenOptions::default()
    };
    let (pool, _) = memory_pool(64, &opts);
    let vol = pool.create_volume("v", 8 * MIB, PAGE as u32).unwrap();
    (pool, vol)
}

/// Waits up to 20 s for the buffer's statistics to satisfy `done` (the destager works in the
/// background); fails with `what` and the statistics if they never do.
fn wait_for_buffer(pool: &Pool, what: &str, done: impl Fn(&salsa_core::pool::WriteBufferStats) -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let w = pool.stats().write_buffer.unwrap();
        if done(&w) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: {w:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn page(tag: u64) -> Vec<u8> {
    (0..PAGE as u64).map(|i| (i * 31 + tag * 7 + tag / 251) as u8).collect()
}

/// Writes pages `0..pages` of `vol` with version `v`, one page per write.
fn write_pages(vol: &salsa_core::Volume, pages: u64, v: u64) {
    write_range(vol, 0..pages, v);
}

/// Writes each page of `pages` of `vol` with version `v`, one page per write.
fn write_range(vol: &salsa_core::Volume, pages: std::ops::Range<u64>, v: u64) {
    for p in pages {
        vol.write(p * PAGE as u64, &page(p * 1000 + v)).unwrap();
    }
}

fn check_pages(vol: &salsa_core::Volume, pages: u64, v: u64) {
    check_range(vol, 0..pages, v);
}

fn check_range(vol: &salsa_core::Volume, pages: std::ops::Range<u64>, v: u64) {
    let mut buf = vec![0u8; PAGE];
    for p in pages {
        vol.read(p * PAGE as u64, &mut buf).unwrap();
        assert!(buf == page(p * 1000 + v), "page {p} does not hold version {v}");
    }
}

/// Pages waiting in the buffer count as mapped in the volume's statistics, and as room the
/// pool has promised (`reserved_bytes`), before any of them reaches the log; a flush moves them
/// to the log and the figures stay. (Before, a volume showed `mapped 0 B` while its writes
/// waited in the buffer.)
#[test]
fn buffered_pages_count_as_mapped_before_they_reach_the_log() {
    let (pool, _) = memory_pool(64, &buffered(16 * MIB));
    let vol = pool.create_volume("v", 8 * MIB, PAGE as u32).unwrap();
    write_pages(&vol, 100, 1);
    let mapped = |pool: &Pool| pool.stats().volumes.iter().find(|v| v.name == "v").unwrap().mapped_bytes;
    let st = pool.stats();
    assert_eq!(st.device_bytes_written, 0, "nothing reached the log yet");
    assert_eq!(mapped(&pool), 100 * PAGE as u64, "buffered pages are mapped");
    assert_eq!(st.write_buffer.unwrap().reserved_bytes, 100 * PAGE as u64, "and spoken for");
    // Overwriting a buffered page or a page already in the log adds nothing.
    write_pages(&vol, 100, 2);
    assert_eq!(mapped(&pool), 100 * PAGE as u64);
    pool.flush().unwrap();
    assert_eq!(mapped(&pool), 100 * PAGE as u64, "after the flush, the log maps them");
    write_range(&vol, 50..150, 3);
    assert_eq!(mapped(&pool), 150 * PAGE as u64, "50 new pages buffered over 100 in the log");
    check_range(&vol, 50..150, 3);
    pool.close().unwrap();
}

/// Ten rewrites of 1 MiB before a flush: with the buffer the members take about one copy,
/// without it ten (the same workload, so the comparison can fail either way).
#[test]
fn overwrites_before_a_flush_never_reach_the_log() {
    let mut written = Vec::new();
    for capacity in [0, 16 * MIB] {
        let (pool, _) = memory_pool(64, &buffered(capacity));
        let vol = pool.create_volume("v", 16 * MIB, PAGE as u32).unwrap();
        let before = pool.stats().device_bytes_written;
        for v in 1..=10 {
            write_pages(&vol, 256, v);
        }
        check_pages(&vol, 256, 10);
        pool.flush().unwrap();
        let st = pool.stats();
        written.push(st.device_bytes_written - before);
        if capacity > 0 {
            let w = st.write_buffer.expect("a buffered pool reports its buffer");
            assert_eq!(w.pages_written, 2560);
            assert_eq!(w.pages_absorbed, 2304, "nine of every ten writes replace a buffered copy");
            assert_eq!(w.pages_destaged, 256);
            assert_eq!((w.dirty_pages, w.dirty_bytes), (0, 0), "a flush leaves nothing buffered");
        } else {
            assert!(st.write_buffer.is_none());
        }
        pool.close().unwrap();
    }
    assert!(written[0] >= 10 * MIB, "unbuffered: {} bytes", written[0]);
    assert!(written[1] < 2 * MIB, "buffered: {} bytes for 1 MiB of pages", written[1]);
}

/// A destage hands a run of consecutive pages long enough for a payload buffer (64 KiB) to the
/// log in one, and the records hold it instead of copying the pages a second time; pages
/// buffered alone are copied. Everything reads back before and after a reopen, and the payload
/// buffers go back to their pool.
#[test]
fn a_destage_hands_long_runs_to_the_records_uncopied() {
    let (pool, dev) = memory_pool(64, &buffered(16 * MIB));
    let vol = pool.create_volume("v", 16 * MIB, PAGE as u32).unwrap();
    let run = (256 << 10) / PAGE as u64;
    write_pages(&vol, run, 1);
    let singles: Vec<u64> = (0..8).map(|i| 1000 + 3 * i).collect();
    for &p in &singles {
        write_range(&vol, p..p + 1, 1);
    }
    pool.flush().unwrap();
    let st = pool.stats();
    let (run_bytes, single_bytes) = (run * PAGE as u64, singles.len() as u64 * PAGE as u64);
    assert!(
        st.user_bytes_held >= run_bytes && st.user_bytes_held < run_bytes + single_bytes,
        "{} bytes held by records, the run is {run_bytes}",
        st.user_bytes_held
    );
    // (A write-back thread lets go of a record just after marking it written.)
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while pool.stats().payload_buffer_bytes > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(pool.stats().payload_buffer_bytes, 0, "written records give their payloads back");
    check_pages(&vol, run, 1);
    for &p in &singles {
        check_range(&vol, p..p + 1, 1);
    }
    pool.close().unwrap();
    let pool = Pool::open(vec![dev], &buffered(16 * MIB)).unwrap();
    let vol = pool.volume("v").unwrap();
    check_pages(&vol, run, 1);
    for &p in &singles {
        check_range(&vol, p..p + 1, 1);
    }
}

/// A buffer of 1 MiB under 32 MiB of distinct pages: it never holds more than its capacity,
/// writers destage it themselves when it is full, and every page reads back before and after
/// a reopen.
#[test]
fn the_buffer_keeps_its_bound_and_loses_nothing() {
    let (pool, dev) = memory_pool(96, &buffered(MIB));
    let vol = pool.create_volume("v", 32 * MIB, PAGE as u32).unwrap();
    let pages = 32 * MIB / PAGE as u64;
    for p in 0..pages {
        vol.write(p * PAGE as u64, &page(p * 1000 + 1)).unwrap();
        let w = pool.stats().write_buffer.unwrap();
        assert!(w.dirty_bytes <= MIB, "{} bytes buffered, capacity 1 MiB", w.dirty_bytes);
        assert!(
            w.dirty_bytes + w.spare_bytes <= MIB,
            "{} bytes buffered and {} spare, capacity 1 MiB",
            w.dirty_bytes,
            w.spare_bytes
        );
    }
    let w = pool.stats().write_buffer.unwrap();
    assert!(w.writer_waits > 0 && w.destages > 10, "{w:?}");
    check_pages(&vol, pages, 1);
    pool.close().unwrap();
    let pool = Pool::open(vec![dev], &buffered(MIB)).unwrap();
    check_pages(&pool.volume("v").unwrap(), pages, 1);
}

/// Partial pages merge into the buffered copy; a trim drops buffered pages (and stays
/// trimmed after the buffer is written down and the pool reopened); write-zeroes and reads
/// spanning buffered and unbuffered pages see the newest bytes.
#[test]
fn reads_trims_and_partial_writes_see_the_newest_bytes() {
    let (pool, dev) = memory_pool(64, &buffered(8 * MIB));
    let vol = pool.create_volume("v", 8 * MIB, PAGE as u32).unwrap();
    write_pages(&vol, 64, 1);
    pool.flush().unwrap();
    // Pages 8..16 buffered anew; a read across 4..20 mixes both.
    for p in 8..16 {
        vol.write(p * PAGE as u64, &page(p * 1000 + 2)).unwrap();
    }
    let mut model: Vec<u8> = (0..64)
        .flat_map(|p| page(p * 1000 + if (8..16).contains(&p) { 2 } else { 1 }))
        .collect();
    // A piece across the end of page 9 and the start of page 10, and one inside page 30
    // (not buffered: merged with what the log holds).
    vol.write(10 * PAGE as u64 - 100, &[0xAB; 300]).unwrap();
    model[10 * PAGE - 100..10 * PAGE + 200].fill(0xAB);
    vol.write(30 * PAGE as u64 + 5, &[0xCD; 10]).unwrap();
    model[30 * PAGE + 5..30 * PAGE + 15].fill(0xCD);
    // Trim pages 12..14 and zero a range inside page 20 and across 21.
    vol.trim(12 * PAGE as u64, 2 * PAGE as u64).unwrap();
    model[12 * PAGE..14 * PAGE].fill(0);
    // A trim inside one page (buffered or not) covers no whole page: nothing changes.
    vol.trim(9 * PAGE as u64 + 100, 200).unwrap();
    vol.trim(40 * PAGE as u64 + 100, 200).unwrap();
    vol.write_zeroes(20 * PAGE as u64 + 7, PAGE as u64 + 9).unwrap();
    model[20 * PAGE + 7..21 * PAGE + 16].fill(0);
    let mut buf = vec![0u8; 64 * PAGE];
    vol.read(0, &mut buf).unwrap();
    assert!(buf == model, "buffered view differs");
    let mut piece = vec![0u8; 777];
    vol.read(9 * PAGE as u64 + 4000, &mut piece).unwrap();
    assert!(piece[..] == model[9 * PAGE + 4000..9 * PAGE + 4777]);
    assert!(vol.is_mapped(8 * PAGE as u64));
    // An empty write, even at the end of the volume, changes nothing.
    vol.write(8 * MIB, &[]).unwrap();
    vol.write(3 * PAGE as u64 + 5, &[]).unwrap();
    // Without a flush: drop writes it down; the reopened pool holds the same bytes.
    drop(vol);
    drop(pool);
    let pool = Pool::open(vec![dev], &buffered(8 * MIB)).unwrap();
    let vol = pool.volume("v").unwrap();
    vol.read(0, &mut buf).unwrap();
    assert!(buf == model, "after reopen");
}

/// A FUA write is durable at once although the pages buffered before it are not flushed;
/// when it covers part of a buffered page, the durable page merges the buffered bytes.
#[test]
fn a_fua_write_is_durable_without_a_flush() {
    let dev = Arc::new(CrashDevice::new("crash0", 64 * MIB, CrashPlan::default()));
    let devs = || vec![dev.clone() as Arc<dyn Device>];
    let pool = Pool::create(devs(), &tiny_config(), &buffered(8 * MIB)).unwrap();
    let vol = pool.create_volume("v", 8 * MIB, PAGE as u32).unwrap();
    write_pages(&vol, 16, 1);
    pool.flush().unwrap();
    // Buffered, never flushed.
    write_pages(&vol, 8, 2);
    // FUA: the whole of page 12, and a piece of buffered page 3.
    vol.write_fua(12 * PAGE as u64, &page(12_000 + 3)).unwrap();
    vol.write_fua(3 * PAGE as u64 + 512, &[0xEE; 1024]).unwrap();
    dev.crash_now();
    drop(vol);
    drop(pool);
    dev.restart(CrashPlan::default());
    let pool = Pool::open(devs(), &buffered(8 * MIB)).unwrap();
    let vol = pool.volume("v").unwrap();
    let mut buf = vec![0u8; PAGE];
    vol.read(12 * PAGE as u64, &mut buf).unwrap();
    assert!(buf == page(12_000 + 3), "the FUA page was lost");
    vol.read(3 * PAGE as u64, &mut buf).unwrap();
    let mut want = page(3000 + 2);
    want[512..1536].fill(0xEE);
    assert!(buf == want, "the FUA piece did not merge into the buffered page");
    // Pages flushed before and not rewritten by FUA hold their flushed or newer version.
    for p in [0u64, 5, 14] {
        vol.read(p * PAGE as u64, &mut buf).unwrap();
        assert!(
            buf == page(p * 1000 + 1) || buf == page(p * 1000 + 2),
            "page {p} lost its flushed data"
        );
    }
}

/// With a background GC the destager writes pages down once the oldest has waited the
/// expiry, with no flush.
#[test]
fn the_destager_writes_old_pages_down_without_a_flush() {
    let (pool, vol) = pool_with_destager(200);
    write_pages(&vol, 100, 1);
    assert_eq!(pool.stats().write_buffer.unwrap().dirty_pages, 100);
    wait_for_buffer(&pool, "nothing destaged", |w| w.dirty_pages == 0);
    let w = pool.stats().write_buffer.unwrap();
    assert_eq!(w.pages_destaged, 100);
    assert!(pool.stats().user_bytes_written >= 100 * PAGE as u64);
    check_pages(&vol, 100, 1);
    pool.close().unwrap();
}

/// A pool on a crash device whose writes take 100 ms each, with a buffer of `capacity_bytes`
/// that destages by age only after an hour, and a volume `v` of 8 MiB holding version 1 of
/// its first 512 pages (two runs: a destage writes down at most 1 MiB at a time, in logical
/// order), buffered.
fn slow_pool_with_two_runs(capacity_bytes: u64) -> (Arc<Pool>, salsa_core::Volume, Arc<CrashDevice>, Arc<FaultDevice>) {
    let crash = Arc::new(CrashDevice::new("crash0", 64 * MIB, CrashPlan::default()));
    let slow = Arc::new(FaultDevice::new(
        crash.clone(),
        FaultPlan {
            write_delay: Some(Duration::from_millis(100)),
            ..FaultPlan::default()
        },
    ));
    let opts = OpenOptions {
        write_buffer_bytes: capacity_bytes,
        write_buffer_expire: Duration::from_secs(3600),
        ..OpenOptions::default()
    };
    let pool = Arc::new(Pool::create(vec![slow.clone() as Arc<dyn Device>], &tiny_config(), &opts).unwrap());
    let vol = pool.create_volume("v", 8 * MIB, PAGE as u32).unwrap();
    write_pages(&vol, 512, 1);
    (pool, vol, crash, slow)
}

/// Once a destage has frozen every page and is writing down the first run slowly, rewrites
/// the second run (version 2) before the destage gets there.
fn rewrite_second_run_during_a_destage(pool: &Pool, vol: &salsa_core::Volume, slow: &FaultDevice) {
    wait_for_buffer(pool, "no destage started", |w| w.destages >= 1);
    write_range(vol, 256..512, 2);
    slow.set_plan(FaultPlan::default());
}

/// Crashes the device, reopens the pool and checks the first run holds version 1 and the
/// second version 2.
fn crash_and_check_both_runs(pool: Arc<Pool>, vol: salsa_core::Volume, crash: Arc<CrashDevice>) {
    crash.crash_now();
    drop(vol);
    drop(pool);
    crash.restart(CrashPlan::default());
    let pool = Pool::open(vec![crash as Arc<dyn Device>], &buffered(MIB)).unwrap();
    let vol = pool.volume("v").unwrap();
    check_pages(&vol, 256, 1);
    check_range(&vol, 256..512, 2);
}

/// A flush's destage writes a page rewritten while it runs as the newer copy: the log takes
/// one copy, not two, and the flush keeps its promise (after a crash right after it, every
/// page written before the flush reads that write or the newer one).
#[test]
fn a_flush_writes_a_page_rewritten_during_its_destage_once() {
    let (pool, vol, crash, slow) = slow_pool_with_two_runs(16 * MIB);
    let flusher = {
        let pool = pool.clone();
        std::thread::spawn(move || pool.flush())
    };
    rewrite_second_run_during_a_destage(&pool, &vol, &slow);
    flusher.join().unwrap().unwrap();
    let w = pool.stats().write_buffer.unwrap();
    assert_eq!(w.pages_destaged, 512, "{w:?}");
    assert_eq!(w.pages_absorbed, 256, "the second run's frozen copies never went down: {w:?}");
    assert_eq!(w.dirty_pages, 0, "the rewritten run went down in their place: {w:?}");
    crash_and_check_both_runs(pool, vol, crash);
}

/// A destage nothing waits on (here: the buffer half full) skips a page rewritten while it
/// runs: the newer copy stays buffered for a later destage or flush, so a region rewritten
/// over and over reaches the log once per flush, not once per destage it meets.
#[test]
fn a_background_destage_skips_a_page_rewritten_while_it_runs() {
    // 512 buffered pages fill half of 4 MiB (each counts its 4 KiB and 64 bytes).
    let (pool, vol, crash, slow) = slow_pool_with_two_runs(4 * MIB);
    rewrite_second_run_during_a_destage(&pool, &vol, &slow);
    wait_for_buffer(&pool, "the destage never finished", |w| {
        w.pages_absorbed == 256 && w.dirty_pages == 256
    });
    let w = pool.stats().write_buffer.unwrap();
    assert_eq!((w.destages, w.pages_destaged), (1, 256), "only the first run went down: {w:?}");
    check_pages(&vol, 256, 1);
    pool.flush().unwrap();
    let w = pool.stats().write_buffer.unwrap();
    assert_eq!(
        (w.pages_destaged, w.dirty_pages),
        (512, 0),
        "the flush wrote the newer copies: {w:?}"
    );
    crash_and_check_both_runs(pool, vol, crash);
}

/// A write received straight into write-buffer pages (`Volume::paged_payload`, what the NBD
/// server does for whole-page writes) is buffered as those pages: it reads back, goes down at
/// the flush, takes its pages from the spare ones, and a payload dropped unwritten gives its
/// pages back. Writes that are not whole pages, and unbuffered volumes, get none.
#[test]
fn a_paged_payload_becomes_the_buffered_pages() {
    let (pool, vol) = pool_with_destager(3_600_000);
    write_pages(&vol, 8, 1);
    pool.flush().unwrap();
    let cost = PAGE as u64 + 64;
    assert_eq!(pool.stats().write_buffer.unwrap().spare_bytes, 8 * cost);
    assert!(vol.paged_payload(100, PAGE).is_none(), "not page-aligned");
    assert!(vol.paged_payload(0, PAGE + 1).is_none(), "not whole pages");
    assert!(vol.paged_payload(0, 0).is_none());
    let mut payload = vol.paged_payload(2 * PAGE as u64, 4 * PAGE).expect("whole pages");
    assert_eq!((payload.offset(), payload.len()), (2 * PAGE as u64, 4 * PAGE));
    assert_eq!(pool.stats().write_buffer.unwrap().spare_bytes, 4 * cost, "taken from the spares");
    for (i, p) in payload.pages_mut().enumerate() {
        p.copy_from_slice(&page((2 + i as u64) * 1000 + 2));
    }
    vol.write_paged(payload).unwrap();
    let w = pool.stats().write_buffer.unwrap();
    assert_eq!((w.dirty_pages, w.pages_written), (4, 12), "{w:?}");
    check_range(&vol, 0..2, 1);
    check_range(&vol, 2..6, 2);
    check_range(&vol, 6..8, 1);
    // Dropped unwritten: its pages go back, nothing changes.
    drop(vol.paged_payload(0, 2 * PAGE).unwrap());
    assert_eq!(pool.stats().write_buffer.unwrap().spare_bytes, 4 * cost);
    pool.flush().unwrap();
    assert_eq!(pool.stats().write_buffer.unwrap().pages_destaged, 12);
    check_range(&vol, 2..6, 2);
    pool.close().unwrap();
    let (pool, _) = memory_pool(64, &buffered(0));
    let plain = pool.create_volume("p", MIB, PAGE as u32).unwrap();
    assert!(plain.paged_payload(0, PAGE).is_none(), "an unbuffered volume copies");
}

/// A paged write that needs no wait is buffered at once; one that would have to wait for room
/// is handed back with nothing written or counted, and the waiting path then writes it.
#[test]
fn a_paged_write_now_is_buffered_at_once_or_handed_back_untouched() {
    let (pool, _) = memory_pool(64, &buffered(MIB));
    let vol = pool.create_volume("v", 8 * MIB, PAGE as u32).unwrap();
    let run = 64u64; // pages per write: 256 KiB, a quarter of the buffer
    let fill = |first: u64, v: u64| {
        let mut payload = vol.paged_payload(first * PAGE as u64, run as usize * PAGE).unwrap();
        for (i, p) in payload.pages_mut().enumerate() {
            p.copy_from_slice(&page((first + i as u64) * 1000 + v));
        }
        payload
    };
    write_pages(&vol, 4 * run, 1);
    pool.flush().unwrap();
    let user_before = pool.stats().user_bytes_written;
    for r in 0..3 {
        let done = vol.write_paged_now(fill(r * run, 2)).unwrap();
        assert!(matches!(done, WrittenNow::Written { ack_at: None }), "room for run {r}");
    }
    let w = pool.stats().write_buffer.unwrap();
    assert_eq!(w.dirty_pages, 3 * run, "{w:?}");
    assert_eq!(pool.stats().user_bytes_written, user_before + 3 * run * PAGE as u64);
    check_range(&vol, 0..3 * run, 2);
    // A fourth run would take the buffer past its megabyte (each page counts 64 bytes more).
    let WrittenNow::NotNow(back) = vol.write_paged_now(fill(3 * run, 2)).unwrap() else {
        panic!("no room without a wait")
    };
    let after = pool.stats().write_buffer.unwrap();
    assert_eq!(
        (after.dirty_pages, after.dirty_bytes, after.pages_written, after.writer_waits),
        (w.dirty_pages, w.dirty_bytes, w.pages_written, w.writer_waits),
        "nothing buffered, nobody waited"
    );
    assert_eq!(
        pool.stats().user_bytes_written,
        user_before + 3 * run * PAGE as u64,
        "nothing counted"
    );
    check_range(&vol, 3 * run..4 * run, 1);
    vol.write_paged(back).unwrap();
    check_range(&vol, 0..4 * run, 2);
    pool.flush().unwrap();
    check_range(&vol, 0..4 * run, 2);
    pool.close().unwrap();
}

/// A page replaced while buffered goes back to the spare pages at once, and the next write
/// takes it: rewriting a buffered region allocates nothing.
#[test]
fn pages_replaced_while_buffered_are_reused() {
    let (pool, vol) = pool_with_destager(3_600_000);
    let cost = PAGE as u64 + 64;
    let run = |v: u64| -> Vec<u8> { (0..8).flat_map(|p| page(p * 1000 + v)).collect() };
    vol.write(0, &run(1)).unwrap();
    assert_eq!(pool.stats().write_buffer.unwrap().spare_bytes, 0);
    for v in 2..5 {
        vol.write(0, &run(v)).unwrap();
        let w = pool.stats().write_buffer.unwrap();
        assert_eq!((w.dirty_pages, w.spare_bytes), (8, 8 * cost), "after version {v}: {w:?}");
        check_pages(&vol, 8, v);
    }
    pool.close().unwrap();
}

/// Pages written down are kept for the next writes (no allocation, no page faults), within
/// the capacity, and given back to the system once the buffer has stayed empty for its expiry.
#[test]
fn destaged_pages_are_reused_and_given_back_when_idle() {
    let (pool, vol) = pool_with_destager(300);
    write_pages(&vol, 200, 1);
    pool.flush().unwrap();
    let w = pool.stats().write_buffer.unwrap();
    assert_eq!(w.dirty_pages, 0);
    // Each page counted as a buffered one is: its bytes and 64 of overhead.
    let cost = PAGE as u64 + 64;
    assert_eq!(w.spare_bytes, 200 * cost, "every page written down is kept: {w:?}");
    write_pages(&vol, 150, 2);
    let w = pool.stats().write_buffer.unwrap();
    assert_eq!(w.dirty_pages, 150);
    assert_eq!(w.spare_bytes, 50 * cost, "new writes took spare pages: {w:?}");
    check_pages(&vol, 150, 2);
    // Destaged by age, then idle for an expiry: the spare pages go.
    wait_for_buffer(&pool, "spare pages kept while idle", |w| w.dirty_pages == 0 && w.spare_bytes == 0);
    check_pages(&vol, 150, 2);
    pool.close().unwrap();
}

/// Writers and readers on their own pages, a small buffer, the destager and the GC running:
/// every read returns the reader's own last write while destages come and go.
#[test]
fn concurrent_writers_read_their_own_writes_through_destages() {
    let opts = OpenOptions {
        write_buffer_bytes: MIB,
        write_buffer_expire: Duration::from_millis(20),
        ..OpenOptions::default()
    };
    let (pool, dev) = memory_pool(64, &opts);
    let vol = pool.create_volume("v", 16 * MIB, PAGE as u32).unwrap();
    let per_thread = 16 * MIB / PAGE as u64 / 4;
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let vol = vol.clone();
            s.spawn(move || {
                let mut last = vec![0u64; per_thread as usize];
                let mut buf = vec![0u8; PAGE];
                for i in 0..6000u64 {
                    let p = (i * 7919 + t) % per_thread;
                    let at = (t * per_thread + p) * PAGE as u64;
                    if i % 3 == 2 && last[p as usize] > 0 {
                        vol.read(at, &mut buf).unwrap();
                        assert!(buf == page(at + last[p as usize]), "thread {t} page {p}: stale read");
                    } else {
                        last[p as usize] = i + 1;
                        vol.write(at, &page(at + i + 1)).unwrap();
                    }
                    if i % 1000 == 999 && t == 0 {
                        vol.flush().unwrap();
                    }
                }
            });
        }
    });
    let w = pool.stats().write_buffer.unwrap();
    assert!(w.destages > 0, "{w:?}");
    pool.close().unwrap();
    let pool = Pool::open(vec![dev], &opts).unwrap();
    assert!(pool.volume("v").unwrap().mapped_bytes() > 0);
}

/// A thin volume larger than its pool, written until the pool is full: with the buffer the
/// write that does not fit is refused as it is without one (within a few pages), never
/// acknowledged and then lost to a failing destage; every acknowledged page is destaged by a
/// flush and reads back after a reopen; overwrites of pages the pool holds go on; a trim
/// gives room back for new pages; and the buffer holds no room once everything is down.
#[test]
fn a_full_pool_refuses_the_write_that_does_not_fit_and_loses_nothing() {
    let mut refused_at = Vec::new();
    for capacity in [0, 16 * MIB] {
        let (pool, dev) = memory_pool(32, &buffered(capacity));
        let vol = pool.create_volume("v", 64 * MIB, PAGE as u32).unwrap();
        let pages = 64 * MIB / PAGE as u64;
        let mut fitted = pages;
        for p in 0..pages {
            if let Err(e) = vol.write(p * PAGE as u64, &page(p * 1000 + 1)) {
                assert_eq!(e.kind(), salsa_core::ErrorKind::NoSpace, "{e}");
                fitted = p;
                break;
            }
        }
        assert!(fitted < pages, "a 64 MiB volume filled a 32 MiB pool");
        refused_at.push(fitted);
        pool.flush().expect("every acknowledged write fits the pool");
        // Rewrites of pages the pool holds need no room, through the buffer or not.
        for p in 0..64 {
            vol.write(p * PAGE as u64, &page(p * 1000 + 2)).unwrap();
        }
        pool.flush().unwrap();
        // A trim gives room back: the refused page fits now.
        vol.trim(64 * PAGE as u64, 64 * PAGE as u64).unwrap();
        vol.write(fitted * PAGE as u64, &page(fitted * 1000 + 1)).unwrap();
        pool.flush().unwrap();
        if let Some(w) = pool.stats().write_buffer {
            assert_eq!(w.reserved_bytes, 0, "a flush leaves no room held");
        }
        pool.close().unwrap();
        let pool = Pool::open(vec![dev], &buffered(capacity)).unwrap();
        let vol = pool.volume("v").unwrap();
        check_pages(&vol, 64, 2);
        let mut buf = vec![0u8; PAGE];
        for p in (128..fitted).chain([fitted]) {
            vol.read(p * PAGE as u64, &mut buf).unwrap();
            assert!(buf == page(p * 1000 + 1), "page {p} lost");
        }
        pool.close().unwrap();
    }
    let (unbuffered, with_buffer) = (refused_at[0], refused_at[1]);
    assert!(
        with_buffer <= unbuffered + 16 && with_buffer + 16 >= unbuffered,
        "the buffer refused at page {with_buffer}, the pool alone at {unbuffered}"
    );
}

/// Deleting a volume while another volume's pages are buffered and the pool has no segment
/// to spare: the deletion flushed through the write buffer while it held the GC's lock, so
/// the destage of the other volume's pages waited for the GC, and the GC for the deletion (a
/// hang, found by the model test through a write buffer). The deletion now flushes the log
/// only; the other volume's pages stay buffered and are destaged later.
#[test]
fn deleting_a_volume_never_waits_for_another_volumes_buffered_pages() {
    let (pool, _) = memory_pool(32, &buffered(16 * MIB));
    let pool = Arc::new(pool);
    let a = pool.create_volume("a", 2 * MIB, PAGE as u32).unwrap();
    let b = pool.create_volume("b", 12 * MIB, PAGE as u32).unwrap();
    let b_pages = 12 * MIB / PAGE as u64;
    write_pages(&a, 2 * MIB / PAGE as u64, 1);
    write_pages(&b, b_pages, 1);
    // Scattered rewrites with flushes until the GC has run: free segments sit at its
    // watermark.
    let mut x = 7u64;
    for _ in 0..4 * b_pages {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let p = (x >> 33) % b_pages;
        b.write(p * PAGE as u64, &page(p * 1000 + 1)).unwrap();
        if x.is_multiple_of(64) {
            pool.flush().unwrap();
        }
    }
    pool.flush().unwrap();
    assert!(pool.stats().gc_segments_cleaned > 0, "the GC never ran");
    // Buffered rewrites of b: destaging them takes segments only the GC can free.
    write_pages(&b, b_pages, 5);
    let (done, deleted) = std::sync::mpsc::channel();
    let p = pool.clone();
    std::thread::spawn(move || {
        let _ = done.send(p.delete_volume("a"));
    });
    let r = deleted.recv_timeout(Duration::from_secs(30)).expect("deleting volume a hung");
    r.unwrap();
    pool.flush().unwrap();
    check_pages(&b, b_pages, 5);
    assert!(pool.volume("a").is_err());
}

/// Writers that flush after every write pass the buffer (each page would be destaged by the
/// next flush anyway); once they write 64 times without a flush, the buffer takes their
/// writes again. Every page reads back.
#[test]
fn writers_that_flush_after_every_write_pass_the_buffer_until_they_stop_flushing() {
    let (pool, _) = memory_pool(64, &buffered(8 * MIB));
    let vol = pool.create_volume("v", 8 * MIB, PAGE as u32).unwrap();
    let buffered_pages = |pool: &Pool| pool.stats().write_buffer.unwrap().pages_written;
    for p in 0..6 {
        write_range(&vol, p..p + 1, 1);
        pool.flush().unwrap();
    }
    assert_eq!(buffered_pages(&pool), 4, "buffered until four flushes followed writes");
    write_range(&vol, 6..70, 1);
    assert_eq!(buffered_pages(&pool), 4, "64 writes without a flush pass the buffer");
    write_range(&vol, 70..80, 1);
    assert_eq!(
        buffered_pages(&pool),
        4 + 10,
        "then a writer that stopped flushing is buffered again"
    );
    check_pages(&vol, 80, 1);
    pool.flush().unwrap();
    check_pages(&vol, 80, 1);
}
