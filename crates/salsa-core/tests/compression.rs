//! Compressing volumes: pages stored compressed in fewer grains read back as written,
//! through partial writes, trims, the GC moving them, a crash-recovery scan and a checkpoint;
//! incompressible pages are stored as they are; share batches remap compressed pages; what
//! is refused is refused with nothing changed.

mod common;

use common::{inline_gc, memory_pool, MIB};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use salsa_core::{Compression, Device, Error, OpenOptions, OpenedFrom, Pool, VolumeSpec};
use std::sync::Arc;

const PAGE: usize = 16384;

fn spec(c: Compression) -> VolumeSpec {
    VolumeSpec {
        compression: c,
        ..VolumeSpec::lsa(PAGE as u32)
    }
}

/// A page of text-like bytes naming (page, version) in its first 16 bytes; how compressible
/// it is depends on the version (from about 1 in 16 distinct words to all of them), so a
/// page's stored size changes as it is rewritten.
fn page_bytes(page: u64, version: u64) -> Vec<u8> {
    let mut out = vec![0u8; PAGE];
    let distinct_words = 2 + ((version * 37 + page * 11) % 2048) as usize;
    let mut x = page.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ version.wrapping_mul(0xbf58_476d_1ce4_e5b9) | 1;
    let mut words = Vec::with_capacity(distinct_words);
    for _ in 0..distinct_words {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        words.push(x);
    }
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&words[i % distinct_words].to_le_bytes());
    }
    out[..8].copy_from_slice(&page.to_le_bytes());
    out[8..16].copy_from_slice(&version.to_le_bytes());
    out
}

fn check(pool: &Pool, name: &str, model: &[Vec<u8>]) {
    let vol = pool.volume(name).unwrap();
    let mut buf = vec![0u8; PAGE];
    for (p, want) in model.iter().enumerate() {
        vol.read(p as u64 * PAGE as u64, &mut buf).unwrap();
        assert!(buf == *want, "{name} page {p}: read back other bytes");
    }
    // A read of many pages at once (the clustered path for the whole pages among them).
    let mut all = vec![0u8; PAGE * model.len()];
    vol.read(0, &mut all).unwrap();
    for (p, want) in model.iter().enumerate() {
        assert!(all[p * PAGE..(p + 1) * PAGE] == want[..], "{name} page {p} in a long read");
    }
}

fn stored_and_mapped(pool: &Pool, name: &str) -> (u64, u64) {
    let st = pool.stats();
    let v = st.volumes.iter().find(|v| v.name == name).unwrap();
    (v.stored_bytes, v.mapped_bytes)
}

#[test]
fn compressible_pages_take_fewer_device_bytes_and_read_back() {
    for c in [Compression::Lz4, Compression::Zstd(3)] {
        let (pool, _) = memory_pool(48, &inline_gc());
        let pages = 256u64;
        let vol = pool.create_volume_spec("c", pages * PAGE as u64, &spec(c)).unwrap();
        let plain = pool
            .create_volume_spec("u", pages * PAGE as u64, &VolumeSpec::lsa(PAGE as u32))
            .unwrap();
        let mut model: Vec<Vec<u8>> = (0..pages).map(|p| page_bytes(p, 1)).collect();
        // Incompressible pages among them are stored as they are.
        let mut rng = SmallRng::seed_from_u64(7);
        for p in (0..pages).step_by(16) {
            rng.fill(&mut model[p as usize][16..]);
        }
        let before = pool.stats().device_bytes_written;
        vol.write(0, &model.concat()).unwrap();
        pool.flush().unwrap();
        let compressed_device = pool.stats().device_bytes_written - before;
        let before = pool.stats().device_bytes_written;
        plain.write(0, &model.concat()).unwrap();
        pool.flush().unwrap();
        let plain_device = pool.stats().device_bytes_written - before;
        check(&pool, "c", &model);
        check(&pool, "u", &model);
        let (stored, mapped) = stored_and_mapped(&pool, "c");
        assert_eq!(mapped, pages * PAGE as u64);
        assert!(stored * 10 < mapped * 7, "{c:?}: {stored} bytes stored for {mapped}");
        assert_eq!(
            stored_and_mapped(&pool, "u"),
            (mapped, mapped),
            "the plain volume stores whole pages"
        );
        assert!(
            compressed_device * 10 < plain_device * 7,
            "{c:?}: {compressed_device} device bytes against {plain_device}"
        );
        let st = pool.stats();
        assert_eq!(st.compressed_bytes_saved, mapped - stored);
        let v = st.volumes.iter().find(|v| v.name == "c").unwrap();
        assert_eq!(v.compression, c);

        // Partial writes into compressed pages (a read-modify-write of the page) and trims.
        for p in [3u64, 17, 100] {
            let at = p * PAGE as u64 + 4096;
            vol.write(at, &[0xAB; 4096]).unwrap();
            model[p as usize][4096..8192].fill(0xAB);
        }
        vol.trim(50 * PAGE as u64, 10 * PAGE as u64).unwrap();
        for page in &mut model[50..60] {
            page.fill(0);
        }
        check(&pool, "c", &model);
        let (stored_after, mapped_after) = stored_and_mapped(&pool, "c");
        assert_eq!(mapped_after, (pages - 10) * PAGE as u64);
        assert!(stored_after < stored, "trimmed pages gave their stored bytes back");
    }
}

/// Overwrites with pages whose compressed size changes keep the GC moving compressed pages
/// (as they are stored); every page reads back after the GC, after a crash (a recovery scan
/// of the records, which carry each page's size) and after a clean close (the checkpoint,
/// which keeps the sizes), and the stored bytes come back the same each time.
#[test]
fn gc_recovery_and_checkpoint_keep_compressed_pages() {
    let opts = inline_gc();
    let (pool, dev) = memory_pool(24, &opts);
    let pages = (pool.logical_capacity_bytes() * 6 / 10) / PAGE as u64;
    let vol = pool.create_volume_spec("c", pages * PAGE as u64, &spec(Compression::Lz4)).unwrap();
    let mut model: Vec<Vec<u8>> = (0..pages).map(|p| page_bytes(p, 0)).collect();
    vol.write(0, &model.concat()).unwrap();
    let mut rng = SmallRng::seed_from_u64(42);
    // Enough overwrites to cycle the pool's segments several times.
    let writes = 8 * pool.logical_capacity_bytes() / PAGE as u64;
    for i in 1..=writes {
        let p = if rng.gen_bool(0.7) {
            rng.gen_range(0..pages / 5)
        } else {
            rng.gen_range(0..pages)
        };
        let n = rng.gen_range(1..=4u64).min(pages - p);
        let mut buf = Vec::with_capacity(n as usize * PAGE);
        for q in p..p + n {
            model[q as usize] = page_bytes(q, i);
            buf.extend_from_slice(&model[q as usize]);
        }
        vol.write(p * PAGE as u64, &buf).unwrap();
    }
    let st = pool.stats();
    assert!(st.gc_segments_cleaned > 20, "the GC ran ({} victims)", st.gc_segments_cleaned);
    assert!(st.gc_bytes_relocated > 0);
    let stored = stored_and_mapped(&pool, "c");
    assert!(stored.0 < stored.1);
    drop(vol);
    let pool = reopen_after_crash(pool, &dev, &opts, &model);
    // Rewrites after the scan account for the sizes it found.
    let vol = pool.volume("c").unwrap();
    for p in 0..pages / 4 {
        model[p as usize] = page_bytes(p, writes + 1);
        vol.write(p * PAGE as u64, &model[p as usize]).unwrap();
    }
    drop(vol);
    reopen_after_close(pool, &dev, &opts, &model);
}

/// Checks volume "c" against `model`, then drops the pool without closing it (a crash after
/// a flush) and reopens it by a recovery scan, which must find every page and the same
/// stored bytes (each page's stored size rebuilt from the records and share entries).
fn reopen_after_crash(pool: Pool, dev: &Arc<dyn Device>, opts: &OpenOptions, model: &[Vec<u8>]) -> Pool {
    check(&pool, "c", model);
    let stored = stored_and_mapped(&pool, "c");
    pool.flush().unwrap();
    drop(pool);
    let pool = Pool::open(vec![dev.clone()], opts).unwrap();
    assert_eq!(pool.opened_from(), OpenedFrom::RecoveryScan);
    check(&pool, "c", model);
    assert_eq!(stored_and_mapped(&pool, "c"), stored, "the scan rebuilt each page's stored size");
    pool
}

/// Closes the pool and reopens it from its checkpoint, which must keep every page and each
/// page's stored size; the scrub then reads every record's pages by the sizes the records
/// carry and finds none damaged.
fn reopen_after_close(pool: Pool, dev: &Arc<dyn Device>, opts: &OpenOptions, model: &[Vec<u8>]) {
    let stored = stored_and_mapped(&pool, "c");
    pool.close().unwrap();
    let pool = Pool::open(vec![dev.clone()], opts).unwrap();
    assert_eq!(pool.opened_from(), OpenedFrom::Checkpoint);
    check(&pool, "c", model);
    assert_eq!(stored_and_mapped(&pool, "c"), stored, "the checkpoint kept each page's stored size");
    let report = pool.scrub(false).unwrap();
    assert!(report.segments > 0 && report.pages_damaged == 0, "{report:?}");
}

#[test]
fn what_cannot_compress_is_refused_and_changes_nothing() {
    let (pool, _) = memory_pool(48, &inline_gc());
    let refused = |base: VolumeSpec| {
        pool.create_volume_spec(
            "a",
            16 * MIB,
            &VolumeSpec {
                compression: Compression::Lz4,
                ..base
            },
        )
        .err()
        .unwrap()
    };
    let err = refused(VolumeSpec::lsa(4096));
    assert!(
        matches!(err, Error::InvalidArgument(_)) && err.to_string().contains("larger than the grain"),
        "{err}"
    );
    let err = refused(VolumeSpec::dual(65536));
    assert!(err.to_string().contains("LSA volumes"), "{err}");
    assert!(pool.volume_names().is_empty());
}

fn share(vol: &salsa_core::Volume, dst: u64, src: u64, pages: u64) {
    vol.share(&[salsa_core::ShareRange {
        dst_offset: dst * PAGE as u64,
        src_offset: src * PAGE as u64,
        len_bytes: pages * PAGE as u64,
    }])
    .unwrap();
}

/// Share batches on a compressing volume: destinations take their sources' compressed pages
/// (and stored sizes) without a copy, keep them when the sources are overwritten, and keep
/// reading them after the GC moved the shared pages and carried the share entries, after a
/// crash (a recovery scan, which takes each shared page's size from its share entry) and after
/// a checkpoint; shared data counts once in the stored bytes.
#[test]
fn share_batches_remap_compressed_pages_through_gc_crash_and_checkpoint() {
    let opts = inline_gc();
    let dev: Arc<dyn Device> = Arc::new(salsa_core::device::MemoryDevice::new("mem0", 24 * MIB));
    // FIFO cleaning: every segment, the shared pages' too, becomes a victim in turn.
    let config = salsa_core::PoolConfig {
        victim_policy: "fifo".into(),
        ..common::tiny_config()
    };
    let pool = Pool::create(vec![dev.clone()], &config, &opts).unwrap();
    let pages = (pool.logical_capacity_bytes() * 9 / 10) / PAGE as u64;
    let vol = pool.create_volume_spec("c", pages * PAGE as u64, &spec(Compression::Lz4)).unwrap();
    let mut model: Vec<Vec<u8>> = (0..pages).map(|p| page_bytes(p, 0)).collect();
    // Incompressible pages among the sources: a share run splits where the stored size
    // changes.
    let mut rng = SmallRng::seed_from_u64(3);
    for p in (0..64).step_by(5) {
        rng.fill(&mut model[p][16..]);
    }
    vol.write(0, &model[..64].concat()).unwrap();
    vol.trim(10 * PAGE as u64, 2 * PAGE as u64).unwrap();
    for page in &mut model[10..12] {
        page.fill(0);
    }
    let (stored_before, _) = stored_and_mapped(&pool, "c");
    // (Durable first: a batch syncs sources that are not.)
    pool.flush().unwrap();
    let device_before = pool.stats().device_bytes_written;
    // Pages 64..128 take what 0..64 hold (trimmed ones included) in two batches.
    share(&vol, 64, 0, 40);
    share(&vol, 104, 40, 24);
    for p in 64..128 {
        model[p] = model[p - 64].clone();
    }
    check(&pool, "c", &model[..128]);
    let (stored_shared, mapped_shared) = stored_and_mapped(&pool, "c");
    assert_eq!(stored_shared, 2 * stored_before, "each owner counts its page's stored size");
    assert_eq!(mapped_shared, 2 * 62 * PAGE as u64);
    assert!(
        pool.stats().device_bytes_written - device_before < 8 * PAGE as u64,
        "a share batch writes metadata, not data"
    );
    // Overwritten sources: their destinations keep the old pages.
    for p in (0..64).step_by(3) {
        model[p] = page_bytes(p as u64, 1);
        vol.write(p as u64 * PAGE as u64, &model[p]).unwrap();
    }
    check(&pool, "c", &model[..128]);
    vol.write(128 * PAGE as u64, &model[128..].concat()).unwrap();
    // Churn on the rest of the volume until the GC has cleaned every segment several times
    // over: shared pages move (once for all their owners) and share entries are carried.
    let victims = 3 * pool.stats().total_segments as u64;
    let mut writes = 0;
    while pool.stats().gc_segments_cleaned < victims {
        writes += 1;
        let p = rng.gen_range(128..pages);
        model[p as usize] = page_bytes(p, writes);
        vol.write(p * PAGE as u64, &model[p as usize]).unwrap();
        assert!(writes < 1_000_000, "the GC does not clean");
    }
    drop(vol);
    let pool = reopen_after_crash(pool, &dev, &opts, &model);
    // A destination overwritten after the scan, and a share of a share.
    let vol = pool.volume("c").unwrap();
    model[70] = page_bytes(70, writes + 1);
    vol.write(70 * PAGE as u64, &model[70]).unwrap();
    share(&vol, 0, 100, 8);
    for p in 0..8 {
        model[p] = model[100 + p].clone();
    }
    check(&pool, "c", &model);
    drop(vol);
    reopen_after_close(pool, &dev, &opts, &model);
}

/// Compression turned on for a volume written without it, and off again: new writes follow,
/// pages written before read back as they were stored, and the choice survives a reopen.
#[test]
fn compression_changes_for_new_writes_and_is_durable() {
    let opts = inline_gc();
    let (pool, dev) = memory_pool(48, &opts);
    let pages = 128u64;
    let vol = pool
        .create_volume_spec("v", pages * PAGE as u64, &VolumeSpec::lsa(PAGE as u32))
        .unwrap();
    let mut model: Vec<Vec<u8>> = (0..pages).map(|p| page_bytes(p, 1)).collect();
    vol.write(0, &model.concat()).unwrap();
    assert_eq!(stored_and_mapped(&pool, "v").0, pages * PAGE as u64);
    pool.set_volume_compression("v", Compression::Zstd(1)).unwrap();
    for p in 0..pages / 2 {
        model[p as usize] = page_bytes(p, 2);
    }
    vol.write(0, &model[..pages as usize / 2].concat()).unwrap();
    check(&pool, "v", &model);
    let (stored, mapped) = stored_and_mapped(&pool, "v");
    assert!(
        stored < mapped * 8 / 10,
        "half the pages rewritten compressed: {stored} of {mapped}"
    );
    assert!(pool.set_volume_compression("nope", Compression::Lz4).is_err());
    assert!(pool.set_volume_compression("v", Compression::parse("zstd:3").unwrap()).is_ok());
    pool.flush().unwrap();
    drop(vol);
    drop(pool);
    // A crash: the scan reads the old volume's whole-page records and its sized ones.
    let pool = Pool::open(vec![dev.clone()], &opts).unwrap();
    check(&pool, "v", &model);
    assert_eq!(stored_and_mapped(&pool, "v"), (stored, mapped));
    let v = pool.stats().volumes.into_iter().find(|v| v.name == "v").unwrap();
    assert_eq!(v.compression, Compression::Zstd(3));
    pool.set_volume_compression("v", Compression::Off).unwrap();
    let vol = pool.volume("v").unwrap();
    model[0] = page_bytes(0, 3);
    vol.write(0, &model[0]).unwrap();
    let (stored_off, _) = stored_and_mapped(&pool, "v");
    assert!(stored_off > stored, "a page rewritten uncompressed takes its whole size");
    drop(vol);
    pool.close().unwrap();
    let pool = Pool::open(vec![dev], &opts).unwrap();
    check(&pool, "v", &model);
    let v = pool.stats().volumes.into_iter().find(|v| v.name == "v").unwrap();
    assert_eq!((v.compression, v.stored_bytes), (Compression::Off, stored_off));
}
