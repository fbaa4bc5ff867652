//! The DRAM read cache: hot pages are served from memory, and a page written, trimmed, moved
//! by the GC or in a reused segment is never served stale.

mod common;

use common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use salsa_core::device::MemoryDevice;
use salsa_core::{Device, OpenOptions, Pool};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

/// A device that counts its reads.
struct CountingDevice {
    inner: Arc<dyn Device>,
    reads: AtomicU64,
}

impl CountingDevice {
    fn new(inner: Arc<dyn Device>) -> CountingDevice {
        CountingDevice {
            inner,
            reads: AtomicU64::new(0),
        }
    }
    fn reads(&self) -> u64 {
        self.reads.load(SeqCst)
    }
}

impl Device for CountingDevice {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.reads.fetch_add(1, SeqCst);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.inner.sync()
    }
}

fn opts(cache: u64) -> OpenOptions {
    OpenOptions {
        read_cache_bytes: cache,
        ..inline_gc()
    }
}

/// Writes, trims and re-reads over a volume twice as large as its share of the pool's space
/// (so the GC moves pages and reuses segments), checking every read against a model.
#[test]
fn reads_follow_writes_trims_and_gc_moves() {
    // A cache larger than the volume: what it holds beyond the live pages would be copies of
    // dead places.
    let (pool, _) = memory_pool(24, &opts(64 << 20));
    let size = pool.logical_capacity_bytes() / PAGE as u64 * PAGE as u64;
    let vol = pool.create_volume("v", size, PAGE as u32).unwrap();
    let pages = size / PAGE as u64;
    let mut model = vec![0u64; pages as usize];
    let mut rng = SmallRng::seed_from_u64(7);
    let mut buf = vec![0u8; PAGE];
    for i in 1..=pages * 16 {
        // A small hot set read often, so it lives in the cache while its pages move.
        let p = if rng.gen_bool(0.5) {
            rng.gen_range(0..16)
        } else {
            rng.gen_range(0..pages)
        };
        match rng.gen_range(0..10) {
            0..=4 => {
                vol.write(p * PAGE as u64, &pattern(0, p, i)).unwrap();
                model[p as usize] = i;
            }
            5 => {
                vol.trim(p * PAGE as u64, PAGE as u64).unwrap();
                model[p as usize] = 0;
            }
            _ => {
                vol.read(p * PAGE as u64, &mut buf).unwrap();
                let want = if model[p as usize] == 0 {
                    vec![0; PAGE]
                } else {
                    pattern(0, p, model[p as usize])
                };
                assert!(buf == want, "page {p} after op {i}: stale or wrong data");
            }
        }
    }
    let st = pool.stats();
    assert!(st.gc_segments_cleaned > 20, "the GC hardly ran: {}", st.gc_segments_cleaned);
    let cache = st.read_cache.expect("the pool has a read cache");
    assert!(cache.hits > 100, "{cache:?}");
    assert!(cache.used_bytes <= cache.capacity_bytes, "{cache:?}");
    assert_eq!(cache.damaged_hits, 0);
    // Overwritten and trimmed places left the cache, moved pages took their copies along.
    assert!(cache.pages <= pages, "{} copies for a volume of {pages} pages", cache.pages);
}

/// A page read twice reaches the device once; with the cache off, twice. A page just written
/// is read back from memory.
#[test]
fn a_hot_page_is_read_from_memory() {
    for (cache, device_reads) in [(1 << 20, 1), (0, 2)] {
        let mem: Arc<dyn Device> = Arc::new(MemoryDevice::new("m", 16 * MIB));
        let counting = Arc::new(CountingDevice::new(mem));
        let pool = Pool::create(vec![counting.clone()], &tiny_config(), &opts(cache)).unwrap();
        let vol = pool.create_volume("v", MIB, PAGE as u32).unwrap();
        for p in 0..255 {
            vol.write(p * PAGE as u64, &pattern(0, p, 1)).unwrap();
        }
        pool.flush().unwrap();
        // Written, flushed, its record gone from memory: from the cache, or the device.
        let before = counting.reads();
        let mut buf = vec![0u8; PAGE];
        vol.read(254 * PAGE as u64, &mut buf).unwrap();
        assert_eq!(buf, pattern(0, 254, 1));
        assert_eq!(counting.reads() - before, if cache > 0 { 0 } else { 1 }, "cache of {cache} bytes");
        pool.close().unwrap();
        // Reopened (an empty cache): the first read goes to the device, the second not.
        let pool = Pool::open(vec![counting.clone()], &opts(cache)).unwrap();
        let vol = pool.volume("v").unwrap();
        let before = counting.reads();
        for _ in 0..2 {
            vol.read(0, &mut buf).unwrap();
            assert_eq!(buf, pattern(0, 0, 1));
        }
        assert_eq!(counting.reads() - before, device_reads, "cache of {cache} bytes");
        assert_eq!(pool.stats().read_cache.is_some(), cache > 0);
        pool.close().unwrap();
    }
}

/// A read that may not wait for a device (what the NBD server answers on the thread that
/// received it) is served from the cache or the write buffer, and is refused, without a
/// device read and without counting anything, when some of its data is only on the device.
#[test]
fn a_read_from_memory_is_served_from_memory_or_refused_without_a_device_read() {
    for write_buffer in [0, 4 << 20] {
        let mem: Arc<dyn Device> = Arc::new(MemoryDevice::new("m", 16 * MIB));
        let counting = Arc::new(CountingDevice::new(mem));
        let with = OpenOptions {
            write_buffer_bytes: write_buffer,
            ..opts(1 << 20)
        };
        let pool = Pool::create(vec![counting.clone()], &tiny_config(), &with).unwrap();
        let vol = pool.create_volume("v", MIB, PAGE as u32).unwrap();
        for p in 0..4 {
            vol.write(p * PAGE as u64, &pattern(0, p, 1)).unwrap();
        }
        pool.close().unwrap();
        let pool = Pool::open(vec![counting.clone()], &with).unwrap();
        let vol = pool.volume("v").unwrap();
        let mut buf = vec![0u8; 2 * PAGE];
        let (reads, stats) = (counting.reads(), pool.stats());
        // Pages 0 and 1: on the device only.
        assert!(!vol.read_from_memory(0, &mut buf).unwrap(), "write buffer {write_buffer}");
        let after = pool.stats();
        assert_eq!(counting.reads(), reads, "a refused read touched the device");
        assert_eq!(after.user_bytes_read, stats.user_bytes_read);
        assert_eq!(after.read_cache.unwrap().misses, stats.read_cache.unwrap().misses);
        // Read once the usual way, they are in memory.
        vol.read(0, &mut buf).unwrap();
        let reads = counting.reads();
        buf.fill(0);
        assert!(vol.read_from_memory(0, &mut buf).unwrap());
        assert_eq!(buf[..PAGE], pattern(0, 0, 1)[..]);
        assert_eq!(buf[PAGE..], pattern(0, 1, 1)[..]);
        assert_eq!(counting.reads(), reads);
        // Page 2 rewritten (in the write buffer, or cached as written) and page 3 only on the
        // device: the pair is refused, page 2 alone is served.
        vol.write(2 * PAGE as u64, &pattern(0, 2, 2)).unwrap();
        let hits = |pool: &Pool| pool.stats().read_cache.unwrap().hits;
        let before = hits(&pool);
        assert!(!vol.read_from_memory(2 * PAGE as u64, &mut buf).unwrap());
        // Pages 0 and 1 are cached and come first: their hits are not counted either.
        assert!(!vol.read_from_memory(0, &mut vec![0u8; 4 * PAGE]).unwrap());
        assert_eq!(hits(&pool), before, "a refused read counts no hits");
        assert!(vol.read_from_memory(2 * PAGE as u64, &mut buf[..PAGE]).unwrap());
        assert_eq!(hits(&pool), before + u64::from(write_buffer == 0), "a kept one counts its own");
        assert_eq!(buf[..PAGE], pattern(0, 2, 2)[..]);
        assert_eq!(counting.reads(), reads);
        // Never-written pages read as zeros without a device read.
        assert!(vol.read_from_memory(100 * PAGE as u64, &mut buf).unwrap());
        assert!(buf.iter().all(|b| *b == 0));
        // A read past the end is an error, as for `read`.
        assert!(vol.read_from_memory(MIB, &mut buf).is_err());
        pool.close().unwrap();
    }
}
