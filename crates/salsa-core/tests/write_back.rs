//! Write-back of sealed user records: a write returns before its record reaches the device,
//! reads see it meanwhile, and a flush returns only once it is written and synced.

mod common;
use common::*;
use parking_lot::{Condvar, Mutex};
use salsa_core::device::MemoryDevice;
use salsa_core::{Device, OpenOptions, Pool, WRITE_BACK_DEPTH, WRITE_BACK_DEPTH_MAX};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A memory device whose writes wait while the gate is closed.
struct GatedDevice {
    inner: MemoryDevice,
    closed: Mutex<bool>,
    opened: Condvar,
    /// A write is waiting at the gate.
    waiting: AtomicBool,
}

impl GatedDevice {
    fn set_closed(&self, closed: bool) {
        *self.closed.lock() = closed;
        self.opened.notify_all();
    }
}

impl Device for GatedDevice {
    fn name(&self) -> &str {
        self.inner.name()
    }
    salsa_core::forward_device_properties!(inner);
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut closed = self.closed.lock();
        while *closed {
            self.waiting.store(true, SeqCst);
            self.opened.wait(&mut closed);
        }
        drop(closed);
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
}

fn gated_pool(write_back_threads: usize) -> (Pool, Arc<GatedDevice>) {
    let dev = Arc::new(GatedDevice {
        inner: MemoryDevice::new("gated", 32 * MIB),
        closed: Mutex::new(false),
        opened: Condvar::new(),
        waiting: AtomicBool::new(false),
    });
    let opts = OpenOptions {
        write_back_threads,
        ..inline_gc()
    };
    let pool = Pool::create(vec![dev.clone() as Arc<dyn Device>], &tiny_config(), &opts).unwrap();
    let vol = pool.create_volume("v", 8 * MIB, 4096).unwrap();
    // The first segment the pool takes on a member records it as holding log data (a
    // metadata write, once per member): done here, before the tests close the gate.
    vol.write(7 * MIB, &pattern(9, 0, 0)).unwrap();
    vol.flush().unwrap();
    (pool, dev)
}

/// Waits up to `timeout` for `flag` to be set; whether it was.
fn wait_until(flag: &AtomicBool, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while !flag.load(SeqCst) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    flag.load(SeqCst)
}

/// 16 pages fill one record (`tiny_config`), so this write seals one and hands it on.
fn one_record() -> Vec<u8> {
    (0..16u64).flat_map(|p| pattern(1, p, 7)).collect()
}

#[test]
fn a_write_returns_before_its_record_is_written_and_a_flush_waits_for_it() {
    let (pool, dev) = gated_pool(2);
    let vol = pool.volume("v").unwrap();
    dev.set_closed(true);
    let data = one_record();
    // Returns although the device takes no write: the sealed record waits for write-back.
    let returned = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            vol.write(0, &data).unwrap();
            returned.store(true, SeqCst);
        });
        if !wait_until(&returned, Duration::from_secs(10)) {
            dev.set_closed(false); // let the writer finish so that the test can fail
        }
    });
    assert!(*dev.closed.lock(), "the write waited for the device instead of returning");
    assert!(
        wait_until(&dev.waiting, Duration::from_secs(10)),
        "no write-back thread reached the device"
    );
    // Reads are served from the queued record.
    let mut back = vec![0u8; data.len()];
    vol.read(0, &mut back).unwrap();
    assert_eq!(back, data);
    // A flush cannot return while the record is not on the device.
    let flushed = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            vol.flush().unwrap();
            flushed.store(true, SeqCst);
        });
        std::thread::sleep(Duration::from_millis(200));
        assert!(!flushed.load(SeqCst), "flush returned before the record was written");
        dev.set_closed(false);
    });
    assert!(flushed.load(SeqCst));
    drop(vol);
    drop(pool);
    // What was flushed is on the device.
    let pool = Pool::open(vec![dev as Arc<dyn Device>], &inline_gc()).unwrap();
    let vol = pool.volume("v").unwrap();
    vol.read(0, &mut back).unwrap();
    assert_eq!(back, data);
}

/// A writer that finds the write-back queue full waits for room after letting go of its
/// stream's lock: the stream's other writers go on meanwhile.
#[test]
fn a_writer_waiting_for_write_back_room_does_not_hold_up_the_streams_other_writers() {
    let (pool, dev) = gated_pool(1);
    let vol = pool.volume("v").unwrap();
    dev.set_closed(true);
    let data = one_record();
    let records_returned = AtomicU64::new(0);
    let other_returned = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            // Record after record, until the queue holds its depth and this writer waits.
            for r in 0..2 * WRITE_BACK_DEPTH_MAX as u64 {
                vol.write(r * data.len() as u64, &data).unwrap();
                records_returned.fetch_add(1, SeqCst);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        let (mut seen, mut still_since) = (u64::MAX, Instant::now());
        while still_since.elapsed() < Duration::from_millis(300) && Instant::now() < deadline {
            let n = records_returned.load(SeqCst);
            if n != seen {
                (seen, still_since) = (n, Instant::now());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // One record at the gate (once the thread took it) and the queue's depth behind it.
        let waiting = (WRITE_BACK_DEPTH as u64..=WRITE_BACK_DEPTH as u64 + 1).contains(&seen);
        if waiting {
            s.spawn(|| {
                vol.write(6 * MIB, &pattern(1, 6 * MIB / PAGE as u64, 3)).unwrap();
                other_returned.store(true, SeqCst);
            });
            wait_until(&other_returned, Duration::from_secs(10));
        }
        let other = other_returned.load(SeqCst);
        dev.set_closed(false); // let every writer finish, so that the test can fail
        assert!(waiting, "{seen} records returned with the device taking none");
        assert!(other, "a one-page write waited while another writer waited for write-back room");
    });
    vol.flush().unwrap();
    let mut back = vec![0u8; data.len()];
    vol.read(0, &mut back).unwrap();
    assert_eq!(back, data);
}

#[test]
fn without_write_back_threads_the_writer_writes_its_record_itself() {
    let (pool, dev) = gated_pool(0);
    let vol = pool.volume("v").unwrap();
    dev.set_closed(true);
    let returned = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            vol.write(0, &one_record()).unwrap();
            returned.store(true, SeqCst);
        });
        std::thread::sleep(Duration::from_millis(200));
        assert!(!returned.load(SeqCst), "the write returned before its record was written");
        dev.set_closed(false);
    });
    assert!(returned.load(SeqCst));
}

/// Zero-copy writes: records hold the pages where the writer's payload has them. Reads find
/// them there while the records wait for the device, the device gets the same bytes, and each
/// payload buffer goes back to the pool once the records holding it are written. Pages that are
/// not aligned in their payload are copied instead.
#[test]
fn payload_writes_are_held_by_their_records_until_written() {
    let (pool, dev) = gated_pool(2);
    let vol = pool.volume("v").unwrap();
    let mut image = vec![0u8; 8 * MIB as usize];
    let mut write = |offset: usize, data: &[u8]| {
        let mut buf = vol.payload_buffer(data.len()).expect("a payload buffer");
        buf.copy_from_slice(data);
        vol.write_payload(offset as u64, buf).unwrap();
        image[offset..offset + data.len()].copy_from_slice(data);
    };
    dev.set_closed(true);
    // Three records and a half in one payload (16 pages a record); then one at an offset that
    // is not page aligned: partial pages at both ends, whole pages misaligned in the payload.
    write(0, &(0..56u64).flat_map(|p| pattern(2, p, 1)).collect::<Vec<u8>>());
    let odd: Vec<u8> = (0..20 * 4096).map(|i| (i % 253) as u8).collect();
    write(100 * 4096 + 512, &odd);
    let held = pool.stats().user_bytes_held;
    assert_eq!(held, 56 * 4096, "the aligned pages were held, the misaligned ones copied");
    assert!(pool.stats().payload_buffer_bytes > 0, "records hold the payloads");
    let check = |what: &str| {
        let mut back = vec![0u8; 128 * 4096];
        vol.read(0, &mut back).unwrap();
        assert!(back == image[..back.len()], "{what}: read back other data");
    };
    check("before the records reach the device");
    dev.set_closed(false);
    vol.flush().unwrap();
    check("after a flush");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while pool.stats().payload_buffer_bytes != 0 {
        assert!(std::time::Instant::now() < deadline, "written records still hold their payloads");
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(vol);
    drop(pool);
    let pool = Pool::open(vec![dev as Arc<dyn Device>], &inline_gc()).unwrap();
    let vol = pool.volume("v").unwrap();
    let mut back = vec![0u8; 128 * 4096];
    vol.read(0, &mut back).unwrap();
    assert!(back == image[..back.len()], "after reopening: other data");
}

/// Write-behind: once the writers have flushed after their writes a few times, a
/// `write_behind` after a write writes its open record (without a sync), and the flush that
/// follows has only the sync left; a writer that stops flushing gets at most two records
/// written early before write-behind stops. Data written ahead is durable after the flush.
#[test]
fn write_behind_writes_ahead_only_for_writers_that_flush_after_every_write() {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new("mem0", 64 * MIB));
    let opts = inline_gc();
    let pool = Pool::create(vec![dev.clone()], &tiny_config(), &opts).unwrap();
    let vol = pool.create_volume("v", 8 * MIB, PAGE as u32).unwrap();
    let written = |pool: &Pool| pool.stats().device_bytes_written;
    // No flushes yet: nothing is written ahead.
    vol.write(0, &pattern(1, 0, 1)).unwrap();
    let before = written(&pool);
    vol.write_behind().unwrap();
    assert_eq!(written(&pool), before, "written ahead for a writer never seen flushing");
    assert_eq!(pool.stats().records_written_ahead, 0);
    pool.flush().unwrap();
    // A writer that flushes after every write.
    for p in 1..8u64 {
        vol.write(p * PAGE as u64, &pattern(1, p, 1)).unwrap();
        vol.write_behind().unwrap();
        pool.flush().unwrap();
    }
    vol.write(8 * PAGE as u64, &pattern(1, 8, 1)).unwrap();
    let before = written(&pool);
    let records_before = pool.stats().records_written_ahead;
    vol.write_behind().unwrap();
    let ahead = written(&pool);
    assert!(ahead > before, "a flushing writer's record is written ahead of its flush");
    assert_eq!(pool.stats().records_written_ahead, records_before + 1, "one record, counted");
    let syncs = pool.stats().syncs;
    pool.flush().unwrap();
    assert_eq!(written(&pool), ahead, "the flush after a write-ahead has nothing left to write");
    assert_eq!(pool.stats().syncs, syncs + 1, "but it syncs");
    // The writer stops flushing: the first two writes are written ahead, then none.
    let mut wrote_ahead = Vec::new();
    for p in 9..14u64 {
        vol.write(p * PAGE as u64, &pattern(1, p, 1)).unwrap();
        let before = written(&pool);
        let records_before = pool.stats().records_written_ahead;
        vol.write_behind().unwrap();
        wrote_ahead.push(written(&pool) > before);
        let counted = pool.stats().records_written_ahead - records_before;
        assert_eq!(counted, u64::from(written(&pool) > before), "write {p}: counted as written ahead");
    }
    assert_eq!(wrote_ahead, [true, true, false, false, false]);
    pool.flush().unwrap();
    pool.close().unwrap();
    let pool = Pool::open(vec![dev], &opts).unwrap();
    let vol = pool.volume("v").unwrap();
    let mut buf = vec![0u8; PAGE];
    for p in 0..14u64 {
        vol.read(p * PAGE as u64, &mut buf).unwrap();
        assert!(buf == pattern(1, p, 1), "page {p} lost");
    }
}
