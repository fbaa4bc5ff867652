//! SHARE's remap: a batch remaps ranges without copying data, every owner of a shared page stays
//! independent of the others (overwrite, trim), the GC moves a shared page once and re-points
//! every owner, recovery from the checkpoint and from the log keeps them all, and every bad batch
//! is refused whole with nothing changed. (The model test mixes shares into random workloads;
//! the crash test checks their atomicity at crash points.)

mod common;
use common::*;
use salsa_core::{ErrorKind, Pool, ShareRange, VolumeSpec};

const P: u64 = PAGE as u64;

fn range(dst: u64, src: u64, pages: u64) -> ShareRange {
    ShareRange {
        dst_offset: dst * P,
        src_offset: src * P,
        len_bytes: pages * P,
    }
}

fn read_page(vol: &salsa_core::Volume, page: u64) -> Vec<u8> {
    let mut buf = vec![0u8; PAGE];
    vol.read(page * P, &mut buf).unwrap();
    buf
}

fn shared_pages(pool: &Pool, name: &str) -> u64 {
    pool.stats().volumes.into_iter().find(|v| v.name == name).unwrap().shared_pages
}

#[test]
fn a_batch_remaps_without_copying_and_owners_stay_independent() {
    let (pool, _dev) = memory_pool(64, &inline_gc());
    let vol = pool.create_volume("db", 16 * MIB, PAGE as u32).unwrap();
    for p in 0..64 {
        vol.write(p * P, &pattern(0, p, 1)).unwrap();
    }
    pool.flush().unwrap();
    let before = pool.stats().device_bytes_written;
    // Two ranges, one of them swapping into a region that holds data already.
    vol.share(&[range(1000, 0, 32), range(40, 8, 8)]).unwrap();
    pool.flush().unwrap();
    let written = pool.stats().device_bytes_written - before;
    assert!(written < 8 * P, "a share of 40 pages wrote {written} bytes: it copied data");
    for p in 0..32 {
        assert_eq!(read_page(&vol, 1000 + p), pattern(0, p, 1), "dst page {}", 1000 + p);
        assert_eq!(
            vol.page_location(1000 + p),
            vol.page_location(p),
            "page {p} and its copy share one place"
        );
    }
    for p in 0..8 {
        assert_eq!(read_page(&vol, 40 + p), pattern(0, 8 + p, 1));
    }
    assert_eq!(shared_pages(&pool, "db"), 32, "pages 8..16 have three owners, the others two");
    // Overwrite a source and trim a copy: the other owner keeps its data.
    vol.write(5 * P, &pattern(0, 5, 2)).unwrap();
    vol.trim(1010 * P, P).unwrap();
    assert_eq!(read_page(&vol, 1005), pattern(0, 5, 1));
    assert_eq!(read_page(&vol, 5), pattern(0, 5, 2));
    assert_eq!(read_page(&vol, 10), pattern(0, 10, 1));
    assert_eq!(read_page(&vol, 1010), vec![0u8; PAGE]);
    assert_eq!(read_page(&vol, 42), pattern(0, 10, 1), "the third owner of page 10's data");
    // A source that reads zeros makes its destination read zeros.
    vol.share(&[range(3, 2000, 1)]).unwrap();
    assert_eq!(read_page(&vol, 3), vec![0u8; PAGE]);
    assert_eq!(
        vol.mapped_bytes(),
        (64 + 32 - 1 - 1) * P,
        "logical pages mapped, every owner counted"
    );
    let st = pool.stats();
    assert_eq!((st.share_batches, st.pages_shared), (2, 40));
    pool.close().unwrap();
}

#[test]
fn every_bad_batch_is_refused_whole_and_changes_nothing() {
    let (pool, _dev) = memory_pool(64, &inline_gc());
    let vol = pool.create_volume("db", 16 * MIB, PAGE as u32).unwrap();
    let pages = 16 * MIB / P;
    for p in 0..64 {
        vol.write(p * P, &pattern(0, p, 1)).unwrap();
    }
    let refused = |ranges: &[ShareRange], why: &str| {
        let e = vol.share(ranges).expect_err(why);
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{why}: {e}");
        e.to_string()
    };
    let half = ShareRange {
        dst_offset: 100 * P + 512,
        src_offset: 0,
        len_bytes: P,
    };
    assert!(refused(&[range(100, 0, 1), half], "a partial page").contains("whole pages"));
    assert!(refused(&[range(100, 0, 4), range(102, 10, 4)], "overlapping destinations").contains("overlapping"));
    assert!(refused(&[range(100, 0, 1), range(pages - 1, 0, 2)], "past the end").contains("past the end"));
    refused(&[range(100, 0, 0)], "an empty range");
    refused(&[], "an empty batch");
    let many: Vec<ShareRange> = (0..300).map(|i| range(200 + i, i % 64, 1)).collect();
    assert!(refused(&many, "too many ranges").contains("at most 256"));
    // Scattered sources: one entry each, more than a record holds.
    for p in 0..400u64 {
        vol.write((300 + 2 * p) * P, &pattern(0, 300 + 2 * p, 1)).unwrap();
    }
    let scattered: Vec<ShareRange> = (0..200).map(|i| range(2000 + i, 300 + 4 * i, 1)).collect();
    assert!(refused(&scattered, "scattered sources").contains("metadata slots"));
    // A page with too many owners.
    let fan: Vec<ShareRange> = (0..salsa_core::pool::MAX_SHARE_OWNERS as u64)
        .map(|i| range(1500 + i, 7, 1))
        .collect();
    assert!(refused(&fan, "too many owners").contains("owners"));
    // Nothing of any of them happened.
    for p in [100, 101, 102, 103, 104, 200, 201, 1500, 2000, pages - 1] {
        assert_eq!(read_page(&vol, p), vec![0u8; PAGE], "page {p} changed");
    }
    assert_eq!(pool.stats().share_batches, 0);
    // Controllers that do not map pages one by one refuse.
    let amf = pool
        .create_volume_spec("log", 4 * MIB, &VolumeSpec::amf(PAGE as u32, Some(256 << 10)))
        .unwrap();
    let e = amf.share(&[range(64, 0, 1)]).unwrap_err();
    assert!(e.to_string().contains("page-mapped"), "{e}");
}

/// Fills the pool with overwrites of another volume until the GC has cleaned `rounds` times the
/// pool's segments, so every segment of the shared volume's data has been a victim.
fn churn(pool: &Pool, rounds: u64) {
    use rand::{Rng, SeedableRng};
    let other = pool.volume("churn").unwrap();
    let pages = other.size_bytes() / P;
    let start = pool.stats().gc_segments_cleaned;
    let target = rounds * pool.stats().total_segments as u64;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(rounds);
    let mut i = 0u64;
    while pool.stats().gc_segments_cleaned - start < target {
        for _ in 0..64 {
            let p = rng.gen_range(0..pages);
            other.write(p * P, &pattern(9, p, i)).unwrap();
            i += 1;
        }
        assert!(i < 2_000_000, "the GC does not clean");
    }
}

#[test]
fn the_gc_moves_a_shared_page_once_and_every_owner_follows_it_through_recovery() {
    let dev: std::sync::Arc<dyn salsa_core::Device> = std::sync::Arc::new(salsa_core::device::MemoryDevice::new("mem0", 48 * MIB));
    // FIFO cleaning: every segment, the shared pages' too, becomes a victim in turn.
    let cfg = salsa_core::PoolConfig {
        victim_policy: "fifo".into(),
        ..tiny_config()
    };
    let pool = Pool::create(vec![dev.clone()], &cfg, &inline_gc()).unwrap();
    let vol = pool.create_volume("db", 8 * MIB, PAGE as u32).unwrap();
    pool.create_volume("churn", 20 * MIB, PAGE as u32).unwrap();
    for p in 0..256 {
        vol.write(p * P, &pattern(0, p, 1)).unwrap();
    }
    // Three owners for pages 0..64, two for 64..128; then the original owner of 0..32
    // overwritten, so those grains are owned only by pages that did not write them.
    vol.share(&[range(1000, 0, 128)]).unwrap();
    vol.share(&[range(1500, 0, 64)]).unwrap();
    for p in 0..32 {
        vol.write(p * P, &pattern(0, p, 2)).unwrap();
    }
    // Garbage in the shared pages' segments (a segment all live is never worth cleaning).
    for p in 128..256 {
        vol.write(p * P, &pattern(0, p, 1)).unwrap();
    }
    let expect = |p: u64| -> Vec<u8> {
        match p {
            0..=31 => pattern(0, p, 2),
            32..=255 => pattern(0, p, 1),
            1000..=1127 => pattern(0, p - 1000, 1),
            1500..=1563 => pattern(0, p - 1500, 1),
            _ => vec![0u8; PAGE],
        }
    };
    let check = |pool: &Pool, when: &str| {
        let vol = pool.volume("db").unwrap();
        for p in (0..256).chain(1000..1128).chain(1500..1564) {
            assert!(read_page(&vol, p) == expect(p), "{when}: page {p}");
        }
        for p in 0..64 {
            assert_eq!(
                vol.page_location(1000 + p),
                vol.page_location(1500 + p),
                "{when}: owners of page {p} apart"
            );
        }
        for p in 32..128 {
            assert_eq!(
                vol.page_location(p),
                vol.page_location(1000 + p),
                "{when}: owners of page {p} apart"
            );
        }
    };
    let before: Vec<Option<u64>> = (1000..1128).map(|p| vol.page_location(p)).collect();
    let relocated_before = pool.stats().gc_bytes_relocated;
    churn(&pool, 3);
    let moved = (1000..1128).zip(&before).filter(|(p, b)| vol.page_location(*p) != **b).count();
    assert!(moved > 100, "the GC moved only {moved} of 128 shared pages");
    check(&pool, "after GC");
    assert_eq!(shared_pages(&pool, "db"), 128);
    // The GC copied each shared page once, not once per owner.
    let st = pool.stats();
    let db_moved = st.volumes.iter().find(|v| v.name == "db").unwrap().gc_bytes_relocated;
    assert!(
        db_moved <= 3 * 320 * P,
        "the GC relocated {db_moved} bytes of db, more than its 320 physical pages three times over"
    );
    assert!(st.gc_bytes_relocated > relocated_before);
    pool.close().unwrap();
    let pool = Pool::open(vec![dev.clone()], &inline_gc()).unwrap();
    assert_eq!(pool.opened_from(), salsa_core::OpenedFrom::Checkpoint);
    check(&pool, "after a clean reopen");
    assert_eq!(shared_pages(&pool, "db"), 128);
    churn(&pool, 2);
    check(&pool, "after GC after the checkpoint");
    drop(pool);
    let pool = Pool::open(vec![dev.clone()], &inline_gc()).unwrap();
    assert_eq!(pool.opened_from(), salsa_core::OpenedFrom::RecoveryScan);
    check(&pool, "after a recovery scan");
    assert_eq!(shared_pages(&pool, "db"), 128);
    // Trim every owner but one of each page: the last owner still reads it, and freeing it
    // frees the space.
    let vol = pool.volume("db").unwrap();
    vol.trim(1000 * P, 128 * P).unwrap();
    vol.trim(1500 * P, 64 * P).unwrap();
    for p in 32..128 {
        assert_eq!(read_page(&vol, p), pattern(0, p, 1));
    }
    assert_eq!(shared_pages(&pool, "db"), 96, "pages 0..32 lost their last owner; 32..128 keep one");
    churn(&pool, 2);
    for p in 32..128 {
        assert_eq!(
            read_page(&vol, p),
            pattern(0, p, 1),
            "page {p} after its copies were trimmed and the GC ran"
        );
    }
    pool.close().unwrap();
    let pool = Pool::open(vec![dev], &inline_gc()).unwrap();
    let vol = pool.volume("db").unwrap();
    for p in 0..256 {
        assert_eq!(read_page(&vol, p), expect(p));
    }
    for p in 1000..1564 {
        assert_eq!(read_page(&vol, p), vec![0u8; PAGE]);
    }
}

/// A dual-mapping volume shares whole large pages: small pages in a source or a destination
/// are merged first (the destination reads the source's small pages too), a 4 KiB write into a
/// shared page merges instead of going to the sparse map and leaves the other owner alone, and
/// the GC, a checkpoint and a recovery scan keep every owner.
#[test]
fn a_dual_mapping_volume_shares_large_pages_with_their_small_pages() {
    const LARGE: u64 = 4 * P;
    let dev: std::sync::Arc<dyn salsa_core::Device> = std::sync::Arc::new(salsa_core::device::MemoryDevice::new("mem0", 48 * MIB));
    let cfg = salsa_core::PoolConfig {
        victim_policy: "fifo".into(),
        ..tiny_config()
    };
    let pool = Pool::create(vec![dev.clone()], &cfg, &inline_gc()).unwrap();
    let vol = pool.create_volume_spec("db", 8 * MIB, &VolumeSpec::dual(LARGE as u32)).unwrap();
    pool.create_volume("churn", 20 * MIB, PAGE as u32).unwrap();
    let merged = |pool: &Pool| pool.stats().volumes.into_iter().find(|v| v.name == "db").unwrap().merged_pages;
    // Large pages 0..64 written whole, then small pages into a source and a destination.
    let all: Vec<u8> = (0..256).flat_map(|p| pattern(0, p, 1)).collect();
    vol.write(0, &all).unwrap();
    vol.write(5 * P, &pattern(0, 5, 2)).unwrap();
    vol.write(161 * P, &pattern(0, 161, 2)).unwrap();
    let merged_before = merged(&pool);
    // Large pages 40..48 <- 0..8, in bytes.
    let share = ShareRange {
        dst_offset: 40 * LARGE,
        src_offset: 0,
        len_bytes: 8 * LARGE,
    };
    vol.share(&[share]).unwrap();
    assert_eq!(
        merged(&pool) - merged_before,
        2,
        "the source and the destination with small pages merged"
    );
    let expect = |p: u64| -> Vec<u8> {
        match p {
            5 | 165 => pattern(0, 5, 2),
            169 => pattern(0, 169, 3),
            160..=191 => pattern(0, p - 160, 1),
            _ => pattern(0, p, 1),
        }
    };
    // A 4 KiB write into a shared page merges it away from the other owner.
    let merged_before = merged(&pool);
    vol.write(169 * P, &pattern(0, 169, 3)).unwrap();
    assert_eq!(merged(&pool) - merged_before, 1, "a small write into a shared page merges it");
    // (Large page 2's grain stays in the index while page 2 owns it.)
    assert_eq!(shared_pages(&pool, "db"), 8);
    assert_ne!(vol.page_location(42), vol.page_location(2), "large page 42 left its grain");
    let check = |pool: &Pool, when: &str| {
        let vol = pool.volume("db").unwrap();
        for p in 0..256 {
            assert!(read_page(&vol, p) == expect(p), "{when}: page {p}");
        }
        for large in (0..8).filter(|&l| l != 2) {
            assert_eq!(
                vol.page_location(40 + large),
                vol.page_location(large),
                "{when}: owners of large page {large} apart"
            );
        }
    };
    check(&pool, "after the share");
    // Partial large pages are refused whole.
    let partial = ShareRange {
        dst_offset: 50 * LARGE,
        src_offset: 0,
        len_bytes: P,
    };
    let e = vol.share(&[partial]).unwrap_err();
    assert!(e.to_string().contains("whole pages of 16384"), "{e}");
    churn(&pool, 3);
    check(&pool, "after GC");
    pool.close().unwrap();
    let pool = Pool::open(vec![dev.clone()], &inline_gc()).unwrap();
    check(&pool, "after a clean reopen");
    churn(&pool, 2);
    drop(pool);
    let pool = Pool::open(vec![dev], &inline_gc()).unwrap();
    assert_eq!(pool.opened_from(), salsa_core::OpenedFrom::RecoveryScan);
    check(&pool, "after a recovery scan");
    assert_eq!(shared_pages(&pool, "db"), 8);
}
