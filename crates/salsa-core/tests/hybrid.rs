//! The hybrid controller: data on the slow tier only, hot groups copied to the fast tier and
//! read from there, copies kept coherent with writes and trims, a failing fast device costing
//! speed and not data, the pool starting cold after a reopen, and the GC cleaning the slow
//! tier while the fast one has free segments.

mod common;
use common::*;
use salsa_core::device::{Declared, FaultDevice, FaultPlan, MemoryDevice};
use salsa_core::{Device, Error, HybridSpec, Pool, StorageType, VolumeSpec};
use std::sync::Arc;

const GROUP_PAGES: u64 = 16;
const GROUP_BYTES: u64 = GROUP_PAGES * PAGE as u64;

fn disk(mib: u64) -> Arc<dyn Device> {
    Declared::wrap(Arc::new(MemoryDevice::new("disk", mib * MIB)), StorageType::Hdd)
}

fn flash(mib: u64) -> Arc<dyn Device> {
    Arc::new(MemoryDevice::new("flash", mib * MIB))
}

fn hybrid_spec() -> VolumeSpec {
    VolumeSpec {
        hybrid: HybridSpec {
            group_pages: Some(GROUP_PAGES),
            promote_bytes_per_s: Some(1 << 30),
            half_life_ms: Some(3_600_000),
            ..HybridSpec::default()
        },
        ..VolumeSpec::hybrid(PAGE as u32)
    }
}

fn stats(pool: &Pool, name: &str) -> salsa_core::VolumeStats {
    pool.stats().volumes.into_iter().find(|v| v.name == name).unwrap()
}

fn read_all(pool: &Pool, name: &str, size: u64) -> Vec<u8> {
    let mut buf = vec![0u8; size as usize];
    pool.volume(name).unwrap().read(0, &mut buf).unwrap();
    buf
}

fn assert_same(got: &[u8], want: &[u8], what: &str) {
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: byte {i} (page {}) differs", i / PAGE);
    }
}

/// Reads groups `groups` `times` times each, then lets maintenance copy them.
fn make_hot(pool: &Pool, name: &str, groups: std::ops::Range<u64>, times: usize) {
    let vol = pool.volume(name).unwrap();
    let mut buf = vec![0u8; GROUP_BYTES as usize];
    for _ in 0..times {
        for g in groups.clone() {
            vol.read(g * GROUP_BYTES, &mut buf).unwrap();
        }
    }
    while pool.maintain().unwrap() {}
}

#[test]
fn a_hybrid_volume_needs_a_slow_and_a_fast_device() {
    let opts = inline_gc();
    let pool = Pool::create(vec![flash(32), flash(32)], &tiny_config(), &opts).unwrap();
    let e = pool.create_volume_spec("h", 4 * MIB, &hybrid_spec()).err().unwrap();
    assert!(
        matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("slow device"),
        "{e}"
    );
    let pool = Pool::create(vec![disk(32)], &tiny_config(), &opts).unwrap();
    assert!(pool.create_volume_spec("h", 4 * MIB, &hybrid_spec()).is_err(), "no fast device");
    let pool = Pool::create(vec![disk(32), flash(16)], &tiny_config(), &opts).unwrap();
    let bad = VolumeSpec {
        hybrid: HybridSpec {
            group_pages: Some(3),
            ..HybridSpec::default()
        },
        ..VolumeSpec::hybrid(PAGE as u32)
    };
    assert!(pool.create_volume_spec("h", 4 * MIB, &bad).is_err(), "a group of 3 pages");
    let lsa_with_tiering = VolumeSpec {
        hybrid: hybrid_spec().hybrid,
        ..VolumeSpec::lsa(PAGE as u32)
    };
    assert!(pool.create_volume_spec("h", 4 * MIB, &lsa_with_tiering).is_err());
    assert!(pool.volume("h").is_err(), "nothing was created");
    pool.create_volume_spec("h", 4 * MIB, &hybrid_spec()).unwrap();
    let v = stats(&pool, "h");
    assert_eq!(v.controller, "hybrid");
    assert!(v.settings.contains(&("group_pages".to_string(), GROUP_PAGES)), "{:?}", v.settings);
}

#[test]
fn data_stays_on_the_slow_tier_and_hot_groups_are_read_from_the_fast_one() {
    let opts = inline_gc();
    let pool = Pool::create(vec![disk(20), flash(16)], &tiny_config(), &opts).unwrap();
    let types: Vec<String> = pool.members().into_iter().map(|m| m.storage_type).collect();
    assert_eq!(types, ["hdd", "flash"], "each member reports the type it was formatted with");
    let size = 8 * MIB;
    let vol = pool.create_volume_spec("h", size, &hybrid_spec()).unwrap();
    let mut model: Vec<u8> = (0..size / PAGE as u64).flat_map(|p| pattern(1, p, 0)).collect();
    vol.write(0, &model).unwrap();
    vol.flush().unwrap();
    for page in 0..size / PAGE as u64 {
        let g = vol.page_location(page).expect("mapped");
        assert_eq!(pool.storage_type_at(g), Some(StorageType::Hdd), "page {page} is on the slow tier");
    }
    assert_eq!(stats(&pool, "h").promotions, 0, "writes do not heat");
    // Groups 2..6 read hot; group 9 read once.
    make_hot(&pool, "h", 2..6, 6);
    make_hot(&pool, "h", 9..10, 1);
    let v = stats(&pool, "h");
    assert_eq!(v.promotions, 4, "{v:?}");
    assert_eq!(v.fast_tier_bytes, 4 * GROUP_BYTES);
    let before = v.fast_read_bytes;
    let got = read_all(&pool, "h", size);
    assert_same(&got, &model, "after promotion");
    let v = stats(&pool, "h");
    assert_eq!(
        v.fast_read_bytes - before,
        4 * GROUP_BYTES,
        "the hot groups came from the fast tier"
    );
    // An overwrite of part of a copied group, and a trim of another part: the copy no longer
    // serves those pages; the others still come from it.
    let at = 3 * GROUP_BYTES + 5 * PAGE as u64;
    let new: Vec<u8> = (0..3u64).flat_map(|i| pattern(1, at / PAGE as u64 + i, 1)).collect();
    model[at as usize..at as usize + new.len()].copy_from_slice(&new);
    vol.write(at, &new).unwrap();
    let trim_at = 4 * GROUP_BYTES + 2 * PAGE as u64;
    vol.trim(trim_at, 4 * PAGE as u64).unwrap();
    model[trim_at as usize..trim_at as usize + 4 * PAGE].fill(0);
    // An unaligned read across the boundary of a copied group and a cold one.
    let mut part = vec![0u8; GROUP_BYTES as usize];
    vol.read(6 * GROUP_BYTES - 1000, &mut part).unwrap();
    assert_same(
        &part,
        &model[(6 * GROUP_BYTES - 1000) as usize..(7 * GROUP_BYTES - 1000) as usize],
        "unaligned",
    );
    let before = stats(&pool, "h").fast_read_bytes;
    assert_same(&read_all(&pool, "h", size), &model, "after overwrite and trim");
    let v = stats(&pool, "h");
    assert_eq!(
        v.fast_read_bytes - before,
        4 * GROUP_BYTES - 7 * PAGE as u64,
        "the changed pages came from the slow tier"
    );
    assert_eq!(v.fast_tier_bytes, 4 * GROUP_BYTES - 7 * PAGE as u64);
    // The GC moving slow pages under the copies does not make them stale.
    for round in 0..4u64 {
        for p in (0..size / PAGE as u64).filter(|p| p / GROUP_PAGES >= 8) {
            let data = pattern(1, p, 10 + round);
            model[p as usize * PAGE..(p as usize + 1) * PAGE].copy_from_slice(&data);
            vol.write(p * PAGE as u64, &data).unwrap();
        }
    }
    assert!(pool.stats().gc_segments_cleaned > 0, "the GC ran");
    assert_same(&read_all(&pool, "h", size), &model, "after GC");
}

#[test]
fn copies_cool_down_and_go_and_a_deleted_volume_gives_its_fast_segments_back() {
    let opts = inline_gc();
    let pool = Pool::create(vec![disk(48), flash(16)], &tiny_config(), &opts).unwrap();
    let spec = VolumeSpec {
        hybrid: HybridSpec {
            half_life_ms: Some(50),
            ..hybrid_spec().hybrid
        },
        ..hybrid_spec()
    };
    let free_before = pool.stats().free_segments;
    let vol = pool.create_volume_spec("h", 4 * MIB, &spec).unwrap();
    vol.write(0, &vec![7u8; 4 * MIB as usize]).unwrap();
    make_hot(&pool, "h", 0..4, 8);
    let v = stats(&pool, "h");
    assert!(v.promotions >= 1 && v.fast_tier_segments >= 1, "{v:?}");
    // Unread for many half-lives, the copies are demoted and the segments given back.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    while pool.maintain().unwrap() {}
    let v = stats(&pool, "h");
    assert_eq!((v.demotions, v.fast_tier_bytes), (v.promotions, 0), "{v:?}");
    make_hot(&pool, "h", 0..4, 8);
    assert!(stats(&pool, "h").fast_tier_segments >= 1);
    pool.delete_volume("h").unwrap();
    pool.flush().unwrap();
    assert_eq!(pool.stats().free_segments, free_before, "every segment came back");
}

#[test]
fn a_failing_fast_device_costs_speed_not_data() {
    let opts = inline_gc();
    let fast = Arc::new(FaultDevice::new(flash(16), FaultPlan::default()));
    let pool = Pool::create(vec![disk(48), fast.clone()], &tiny_config(), &opts).unwrap();
    let size = 4 * MIB;
    let vol = pool.create_volume_spec("h", size, &hybrid_spec()).unwrap();
    let model: Vec<u8> = (0..size / PAGE as u64).flat_map(|p| pattern(2, p, 0)).collect();
    vol.write(0, &model).unwrap();
    make_hot(&pool, "h", 0..8, 6);
    assert_eq!(stats(&pool, "h").promotions, 8);
    // The copies go bad on the media: checksums catch it, the slow tier answers.
    fast.set_plan(FaultPlan {
        flip_bits_at: (0..16 * MIB).step_by(4096).collect(),
        ..FaultPlan::default()
    });
    assert_same(&read_all(&pool, "h", size), &model, "copies with flipped bits");
    // Then it fails every read: the tier stops, the data is all there.
    fast.set_plan(FaultPlan {
        fail_reads: true,
        ..FaultPlan::default()
    });
    assert_same(&read_all(&pool, "h", size), &model, "a fast device failing reads");
    let v = stats(&pool, "h");
    assert!(v.fast_tier_failed, "{v:?}");
    assert_eq!(v.fast_tier_bytes, 0);
    make_hot(&pool, "h", 0..8, 6);
    assert_eq!(stats(&pool, "h").promotions, 8, "a failed tier copies nothing more");
    assert_same(&read_all(&pool, "h", size), &model, "after the failure");
    vol.write(0, &model[..PAGE]).unwrap();
    vol.flush().unwrap();
}

/// The fast device dies while the pool runs, copies on it: reads fall back to the disk, writes,
/// flushes, the GC and the checkpoint go on without it (its free segments go offline and the
/// pool metadata records it as failed), and the pool reopens without it or with it repaired.
#[test]
fn a_fast_device_dying_at_run_time_costs_speed_not_data() {
    let opts = inline_gc();
    let slow = disk(48);
    let fast = Arc::new(FaultDevice::new(flash(16), FaultPlan::default()));
    let pool = Pool::create(vec![slow.clone(), fast.clone()], &tiny_config(), &opts).unwrap();
    let size = 4 * MIB;
    let vol = pool.create_volume_spec("h", size, &hybrid_spec()).unwrap();
    let mut model: Vec<u8> = (0..size / PAGE as u64).flat_map(|p| pattern(8, p, 0)).collect();
    vol.write(0, &model).unwrap();
    make_hot(&pool, "h", 0..8, 6);
    assert!(stats(&pool, "h").fast_tier_segments > 0);
    let free_before = pool.stats().free_segments;
    fast.set_plan(FaultPlan {
        dead: true,
        ..FaultPlan::default()
    });
    // Overwrites (the GC cleans behind them) and flushes go on; every read is right.
    for round in 1..4u64 {
        let page = pattern(9, round, round);
        for p in (0..size / PAGE as u64).step_by(2) {
            vol.write(p * PAGE as u64, &page).unwrap();
            model[(p * PAGE as u64) as usize..((p + 1) * PAGE as u64) as usize].copy_from_slice(&page);
        }
        vol.flush().unwrap();
        assert_same(&read_all(&pool, "h", size), &model, "with the fast device dead");
    }
    make_hot(&pool, "h", 0..8, 6);
    let st = pool.stats();
    assert!(st.members[1].failed, "the dead member is shown failed: {:?}", st.members);
    assert!(
        st.segments_by_state[7] > 0,
        "its free segments are offline: {:?}",
        st.segments_by_state
    );
    assert!(st.free_segments < free_before, "offline segments are not free");
    assert!(stats(&pool, "h").fast_tier_failed);
    // A new volume's writers never get a segment of the dead member.
    let other = pool.create_volume("l", MIB, PAGE as u32).unwrap();
    other.write(0, &vec![3u8; MIB as usize]).unwrap();
    other.flush().unwrap();
    drop((vol, other));
    pool.close().unwrap();

    let pool = Pool::open(vec![slow.clone()], &opts).unwrap();
    assert_same(&read_all(&pool, "h", size), &model, "reopened without the fast device");
    pool.close().unwrap();
    fast.set_plan(FaultPlan::default());
    let pool = Pool::open(vec![slow, fast.clone()], &opts).unwrap();
    assert!(!pool.stats().members[1].failed, "repaired, it is a member again");
    make_hot(&pool, "h", 0..8, 6);
    assert!(stats(&pool, "h").promotions > 0, "the fast tier is back");
    assert_same(&read_all(&pool, "h", size), &model, "with the fast device repaired");
}

/// The fast device taken out (or dead) between two sessions: it never held a record, only
/// copies, so the pool opens without it, after a clean close and after a crash, with every byte
/// in place and the hot groups read from the disk; given back, it serves copies again. A pool
/// whose fast device holds log data (an LSA volume wrote there) is refused without it.
#[test]
fn a_missing_fast_device_costs_speed_not_data() {
    let opts = inline_gc();
    let (slow, fast) = (disk(48), flash(16));
    let pool = Pool::create(vec![slow.clone(), fast.clone()], &tiny_config(), &opts).unwrap();
    let size = 4 * MIB;
    let vol = pool.create_volume_spec("h", size, &hybrid_spec()).unwrap();
    let mut model: Vec<u8> = (0..size / PAGE as u64).flat_map(|p| pattern(5, p, 0)).collect();
    vol.write(0, &model).unwrap();
    make_hot(&pool, "h", 0..8, 6);
    assert!(stats(&pool, "h").fast_tier_segments > 0);
    drop(vol);
    pool.close().unwrap();

    let pool = Pool::open(vec![slow.clone()], &opts).unwrap();
    let st = pool.stats();
    assert!(st.members[1].failed, "the missing member is shown as such: {:?}", st.members);
    assert_eq!(st.members[1].storage_type, "unknown", "nothing says a missing member's type");
    assert_eq!(st.members[0].storage_type, "hdd");
    assert!(st.segments_by_state[7] > 0, "its segments are offline: {:?}", st.segments_by_state);
    assert_same(&read_all(&pool, "h", size), &model, "after a clean close, without the fast device");
    make_hot(&pool, "h", 0..8, 6);
    let v = stats(&pool, "h");
    assert_eq!((v.promotions, v.fast_read_bytes), (0, 0), "no fast tier to copy to: {v:?}");
    // It keeps taking writes (and cleaning) on the disk alone.
    let vol = pool.volume("h").unwrap();
    for round in 1..4u64 {
        let page = pattern(6, round, round);
        for p in (0..size / PAGE as u64).step_by(3) {
            vol.write(p * PAGE as u64, &page).unwrap();
            model[(p * PAGE as u64) as usize..((p + 1) * PAGE as u64) as usize].copy_from_slice(&page);
        }
    }
    vol.flush().unwrap();
    drop(vol);
    // A crash without it: the recovery scan skips its segments.
    drop(pool);
    let pool = Pool::open(vec![slow.clone()], &opts).unwrap();
    assert_same(&read_all(&pool, "h", size), &model, "after a crash, without the fast device");
    pool.close().unwrap();

    // Given back, it serves copies again.
    let pool = Pool::open(vec![slow.clone(), fast.clone()], &opts).unwrap();
    assert!(!pool.stats().members[1].failed);
    make_hot(&pool, "h", 0..8, 6);
    assert!(stats(&pool, "h").promotions > 0, "the fast tier is back");
    assert_same(&read_all(&pool, "h", size), &model, "with the fast device back");
    // An LSA volume may write to the fast device: from then on the pool needs it.
    let lsa = pool.create_volume("l", MIB, PAGE as u32).unwrap();
    lsa.write(0, &vec![7u8; MIB as usize]).unwrap();
    drop(lsa);
    pool.close().unwrap();
    let e = Pool::open(vec![slow], &opts)
        .err()
        .expect("refused: the fast device holds log data now");
    assert!(matches!(e, Error::MissingMember { .. }), "{e}");
}

#[test]
fn a_reopened_pool_starts_cold_with_every_byte_in_place() {
    let opts = inline_gc();
    let devs = vec![disk(48), flash(16)];
    let pool = Pool::create(devs.clone(), &tiny_config(), &opts).unwrap();
    let size = 4 * MIB;
    let vol = pool.create_volume_spec("h", size, &hybrid_spec()).unwrap();
    let model: Vec<u8> = (0..size / PAGE as u64).flat_map(|p| pattern(3, p, 0)).collect();
    vol.write(0, &model).unwrap();
    make_hot(&pool, "h", 0..16, 6);
    assert!(stats(&pool, "h").fast_tier_segments > 0);
    let free_cold = pool.stats().free_segments + stats(&pool, "h").fast_tier_segments as u32;
    pool.close().unwrap();
    let pool = Pool::open(devs.clone(), &opts).unwrap();
    let v = stats(&pool, "h");
    assert_eq!((v.fast_tier_bytes, v.fast_tier_segments), (0, 0));
    assert_eq!(pool.stats().free_segments, free_cold, "the fast tier's segments are free again");
    assert_same(&read_all(&pool, "h", size), &model, "after a clean reopen");
    // The same after a crash (no clean shutdown: the recovery scan must not take a copy for
    // records).
    make_hot(&pool, "h", 0..16, 6);
    drop(pool);
    let pool = Pool::open(devs, &opts).unwrap();
    assert_same(&read_all(&pool, "h", size), &model, "after a reopen without close");
    assert_eq!(stats(&pool, "h").fast_tier_segments, 0);
}

#[test]
fn the_gc_cleans_the_slow_tier_while_the_fast_one_has_free_segments() {
    // 24 MiB of disk under a 12 MiB volume overwritten many times, 32 MiB of mostly idle
    // flash (an LSA volume keeps a little data there): the hybrid volume's writers need slow
    // segments while the pool as a whole has plenty free, and the background GC must see it.
    let pool = Arc::new(Pool::create(vec![disk(24), flash(32)], &tiny_config(), &salsa_core::OpenOptions::default()).unwrap());
    let size = 12 * MIB;
    let vol = pool.create_volume_spec("h", size, &hybrid_spec()).unwrap();
    let other = pool.create_volume_spec("l", MIB, &VolumeSpec::lsa(PAGE as u32)).unwrap();
    other.write(0, &vec![1u8; MIB as usize]).unwrap();
    let pages = size / PAGE as u64;
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let writer = std::thread::spawn(move || {
        let mut model = vec![0u8; size as usize];
        let mut x = 12345u64;
        for i in 0..pages * 5 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let p = if i < pages { i } else { x % pages };
            let data = pattern(4, p, i);
            model[p as usize * PAGE..(p as usize + 1) * PAGE].copy_from_slice(&data);
            vol.write(p * PAGE as u64, &data).unwrap();
        }
        vol.flush().unwrap();
        let _ = done_tx.send(());
        (vol, model)
    });
    done_rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the writers stalled: the GC did not clean the slow tier");
    let (vol, model) = writer.join().unwrap();
    assert!(pool.stats().gc_segments_cleaned > 10);
    for page in 0..pages {
        let g = vol.page_location(page).unwrap();
        assert_eq!(pool.storage_type_at(g), Some(StorageType::Hdd));
    }
    assert_same(&read_all(&pool, "h", size), &model, "after GC on the slow tier");
}

#[test]
fn each_volume_writes_to_the_storage_class_it_names() {
    use salsa_core::StorageClass;
    let opts = inline_gc();
    let pool = Pool::create(vec![flash(32), flash(16)], &tiny_config(), &opts).unwrap();
    let on_disk = VolumeSpec {
        storage: StorageClass::Slow,
        ..VolumeSpec::lsa(PAGE as u32)
    };
    let e = pool.create_volume_spec("a", 4 * MIB, &on_disk).err().unwrap();
    assert!(e.to_string().contains("needs a disk"), "{e}");
    let hybrid_with_class = VolumeSpec {
        storage: StorageClass::Fast,
        ..hybrid_spec()
    };
    let devs = vec![disk(32), flash(24)];
    let pool = Pool::create(devs.clone(), &tiny_config(), &opts).unwrap();
    assert!(pool.create_volume_spec("h", 4 * MIB, &hybrid_with_class).is_err());
    let fast = VolumeSpec {
        storage: StorageClass::Fast,
        ..VolumeSpec::lsa(PAGE as u32)
    };
    let slow_dual = VolumeSpec {
        storage: StorageClass::Slow,
        ..VolumeSpec::dual(64 << 10)
    };
    let size = 8 * MIB;
    let pages = size / PAGE as u64;
    let mut models = Vec::new();
    for (name, spec) in [("db", &fast), ("archive", &slow_dual)] {
        let vol = pool.create_volume_spec(name, size, spec).unwrap();
        let model: Vec<u8> = (0..pages).flat_map(|p| pattern(5, p, 0)).collect();
        vol.write(0, &model).unwrap();
        models.push(model);
    }
    // The flash volume overwritten three times over: its GC cleans flash segments while the
    // disk has free ones.
    let db = pool.volume("db").unwrap();
    let mut x = 99u64;
    for i in 0..pages * 3 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let p = x % pages;
        let data = pattern(5, p, i + 1);
        models[0][p as usize * PAGE..(p as usize + 1) * PAGE].copy_from_slice(&data);
        db.write(p * PAGE as u64, &data).unwrap();
    }
    pool.flush().unwrap();
    assert!(pool.stats().gc_segments_cleaned > 0);
    let check = |pool: &Pool| {
        for (name, want) in [("db", StorageType::Flash), ("archive", StorageType::Hdd)] {
            let vol = pool.volume(name).unwrap();
            let page_bytes = stats(pool, name).page_bytes as u64;
            for page in 0..size / page_bytes {
                let g = vol.page_location(page).unwrap();
                assert_eq!(pool.storage_type_at(g), Some(want), "{name} page {page}");
            }
        }
        assert_eq!(stats(pool, "db").storage, "fast");
        assert_eq!(stats(pool, "archive").storage, "slow");
        assert_same(&read_all(pool, "db", size), &models[0], "db");
        assert_same(&read_all(pool, "archive", size), &models[1], "archive");
    };
    check(&pool);
    pool.close().unwrap();
    let pool = Pool::open(devs, &opts).unwrap();
    check(&pool);
}

#[test]
fn concurrent_writers_and_hot_readers_never_see_a_stale_copy() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
    // The pool's own threads: background GC and the maintenance pass that copies hot groups.
    let pool = Arc::new(Pool::create(vec![disk(24), flash(16)], &tiny_config(), &salsa_core::OpenOptions::default()).unwrap());
    let spec = VolumeSpec {
        hybrid: HybridSpec {
            group_pages: Some(4),
            ..hybrid_spec().hybrid
        },
        ..hybrid_spec()
    };
    let pages = 512u64;
    let vol = pool.create_volume_spec("h", pages * PAGE as u64, &spec).unwrap();
    for p in 0..pages {
        vol.write(p * PAGE as u64, &pattern(6, p, 0)).unwrap();
    }
    // The newest version each page has been written with (a write in flight may be one more).
    let latest: Arc<Vec<AtomicU64>> = Arc::new((0..pages).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let version_of = |p: u64, buf: &[u8]| -> u64 {
        let w0 = u64::from_le_bytes(buf[..8].try_into().unwrap());
        w0 ^ 6u64 << 56 ^ p << 24
    };
    let mut threads = Vec::new();
    for w in 0..2u64 {
        let (vol, latest, stop) = (pool.volume("h").unwrap(), latest.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut x = 7 + w;
            while !stop.load(SeqCst) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Writer w owns the pages p with p % 2 == w; the first 64 pages get most writes.
                let p = ((x % 32) * 2 + w) % pages;
                let v = latest[p as usize].load(SeqCst) + 1;
                vol.write(p * PAGE as u64, &pattern(6, p, v)).unwrap();
                latest[p as usize].store(v, SeqCst);
            }
        }));
    }
    let mut readers = Vec::new();
    for r in 0..2u64 {
        let (vol, latest, stop) = (pool.volume("h").unwrap(), latest.clone(), stop.clone());
        readers.push(std::thread::spawn(move || {
            let mut buf = vec![0u8; 8 * PAGE];
            let mut reads = 0u64;
            let mut x = 99 + r;
            while !stop.load(SeqCst) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let first = (x % 24) * 4; // hot groups, read over and over
                let before: Vec<u64> = (first..first + 8).map(|p| latest[p as usize].load(SeqCst)).collect();
                vol.read(first * PAGE as u64, &mut buf).unwrap();
                for (i, p) in (first..first + 8).enumerate() {
                    let got = version_of(p, &buf[i * PAGE..(i + 1) * PAGE]);
                    let after = latest[p as usize].load(SeqCst);
                    assert!(
                        got >= before[i] && got <= after + 1,
                        "page {p}: read version {got}, but it was at {} before the read and {after} after",
                        before[i]
                    );
                    assert!(buf[i * PAGE..(i + 1) * PAGE] == pattern(6, p, got)[..], "page {p}: torn");
                }
                reads += 1;
            }
            reads
        }));
    }
    // Four seconds at least, and on until the readers were served copies (a loaded machine
    // may give the readers little of those four seconds), up to a minute.
    let started = std::time::Instant::now();
    loop {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let served = stats(&pool, "h").fast_read_bytes > 0;
        let elapsed = started.elapsed();
        if (served && elapsed >= std::time::Duration::from_secs(4)) || elapsed >= std::time::Duration::from_secs(60) {
            break;
        }
    }
    stop.store(true, SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    let reads: u64 = readers.into_iter().map(|t| t.join().unwrap()).sum();
    let v = stats(&pool, "h");
    assert!(reads > 100, "{reads} reads");
    assert!(v.promotions > 0 && v.fast_read_bytes > 0, "the readers were served copies: {v:?}");
}
