//! Per-volume controllers and policies: the dual-mapping controller's sparse map, merges and
//! map memory, and each volume's own placement and victim policy, recorded and changed.

mod common;
use common::*;
use salsa_core::{ControllerKind, Error, OpenedFrom, Pool, VolumeSpec};

const LARGE: u64 = 64 << 10;

fn dual_spec(sparse_pages: u64) -> VolumeSpec {
    VolumeSpec {
        sparse_pages: Some(sparse_pages),
        ..VolumeSpec::dual(LARGE as u32)
    }
}

/// Reads the whole volume and compares it with `model`.
fn check(pool: &Pool, name: &str, model: &[u8]) {
    let mut buf = vec![0u8; model.len()];
    pool.volume(name).unwrap().read(0, &mut buf).unwrap();
    if let Some(i) = buf.iter().zip(model).position(|(a, b)| a != b) {
        panic!("{name}: byte {i} (large page {}) differs from the model", i as u64 / LARGE);
    }
}

fn sparse(pool: &Pool, name: &str) -> (u64, u64) {
    let st = pool.stats();
    let v = st.volumes.iter().find(|v| v.name == name).unwrap();
    (v.sparse_pages, v.merged_pages)
}

#[test]
fn small_writes_use_the_sparse_map_and_merge_when_it_is_full() {
    let opts = inline_gc();
    let (pool, dev) = memory_pool(48, &opts);
    let size = 64 * LARGE;
    let vol = pool.create_volume_spec("d", size, &dual_spec(32)).unwrap();
    let mut model: Vec<u8> = (0..size).map(|i| (i / 4096) as u8 ^ 0x5A).collect();
    vol.write(0, &model).unwrap();
    assert_eq!(sparse(&pool, "d"), (0, 0), "whole large pages go to the dense map");
    // One 4 KiB write into each of 32 large pages fills the sparse map without a merge.
    for p in 0..32u64 {
        let at = p * LARGE + 4096 * (p % 16);
        model[at as usize..at as usize + 4096].fill(p as u8);
        vol.write(at, &model[at as usize..at as usize + 4096]).unwrap();
    }
    assert_eq!(sparse(&pool, "d"), (32, 0));
    check(&pool, "d", &model);
    // A partial small page is read-modify-write of that small page only, in the sparse map.
    model[100..200].fill(0xEE);
    vol.write(100, &model[100..200]).unwrap();
    assert_eq!(sparse(&pool, "d"), (32, 0), "large page 0 had its small page 0 already");
    // The next small write to another large page finds the map full: that page is merged.
    let at = 40 * LARGE + 8192;
    model[at as usize..at as usize + 4096].fill(0x77);
    vol.write(at, &model[at as usize..at as usize + 4096]).unwrap();
    assert_eq!(sparse(&pool, "d"), (32, 1));
    check(&pool, "d", &model);
    // A whole-page write over a large page drops its sparse entries.
    model[(3 * LARGE) as usize..(4 * LARGE) as usize].fill(3);
    vol.write(3 * LARGE, &model[(3 * LARGE) as usize..(4 * LARGE) as usize]).unwrap();
    assert_eq!(sparse(&pool, "d"), (31, 1));
    // Maintenance merges the coldest pages until the map is at most three quarters full.
    assert!(pool.maintain().unwrap());
    let (left, merged) = sparse(&pool, "d");
    assert!(left <= 24 && merged > 1, "left {left}, merged {merged}");
    check(&pool, "d", &model);
    // Sparse pages, merges and trims survive a checkpoint and a recovery scan.
    vol.trim(5 * LARGE + 4096, 3 * LARGE).unwrap(); // whole pages 6 and 7
    model[(6 * LARGE) as usize..(8 * LARGE) as usize].fill(0);
    for p in 10..14u64 {
        let at = p * LARGE + 12288;
        model[at as usize..at as usize + 4096].fill(0xC0 | p as u8);
        vol.write(at, &model[at as usize..at as usize + 4096]).unwrap();
    }
    let before = sparse(&pool, "d").0;
    pool.close().unwrap();
    let pool = Pool::open(vec![dev.clone()], &opts).unwrap();
    assert_eq!(pool.opened_from(), OpenedFrom::Checkpoint);
    assert_eq!(sparse(&pool, "d").0, before);
    check(&pool, "d", &model);
    let vol = pool.volume("d").unwrap();
    model[4096..8192].fill(0x99);
    vol.write(4096, &model[4096..8192]).unwrap();
    pool.flush().unwrap();
    drop(vol);
    drop(pool);
    let pool = Pool::open(vec![dev], &opts).unwrap();
    assert_eq!(pool.opened_from(), OpenedFrom::RecoveryScan);
    check(&pool, "d", &model);
}

/// A small write to a large page costs a small page, not a large one: device bytes written
/// per user byte on a dual-mapping volume against an LSA volume of the same large pages.
#[test]
fn small_writes_cost_small_pages() {
    let written = |spec: &VolumeSpec| {
        let (pool, _) = memory_pool(48, &inline_gc());
        let vol = pool.create_volume_spec("v", 64 * LARGE, spec).unwrap();
        vol.write(0, &vec![1u8; (64 * LARGE) as usize]).unwrap();
        pool.flush().unwrap();
        let before = pool.stats().device_bytes_written;
        for p in 0..64u64 {
            vol.write(p * LARGE + 4096, &[2u8; 4096]).unwrap();
        }
        pool.flush().unwrap();
        pool.stats().device_bytes_written - before
    };
    let dual = written(&dual_spec(1024));
    let lsa = written(&VolumeSpec::lsa(LARGE as u32));
    assert!(dual * 8 < lsa, "dual wrote {dual} bytes, lsa {lsa}");
}

/// The dual-mapping controller's map stays near what a map of its large pages costs: at most
/// 70 MiB per TiB of volume with the default sparse map full, against the page map's 1 GiB.
#[test]
fn dual_mapping_map_memory_per_tib() {
    let (pool, _) = memory_pool(48, &inline_gc());
    let tib = 1u64 << 40;
    pool.create_volume_spec("big", tib, &VolumeSpec::dual(LARGE as u32)).unwrap();
    let st = pool.stats();
    let v = &st.volumes[0];
    assert_eq!(v.controller, "dual");
    assert_eq!(v.sparse_capacity_pages, tib / 4096 / 2048, "the default sparse map");
    // Empty: the dense map alone, 4 bytes per 64 KiB page.
    assert_eq!(v.map_memory_bytes, tib / LARGE * 4);
    let bound = v.map_memory_bytes + v.sparse_capacity_pages * 32;
    assert!(bound <= 70 << 20, "{} MiB per TiB with the sparse map full", bound >> 20);
}

#[test]
fn bad_dual_mapping_settings_are_refused_and_change_nothing() {
    let (pool, _) = memory_pool(48, &inline_gc());
    let err = pool.create_volume_spec("a", 16 * LARGE, &VolumeSpec::dual(4096)).err().unwrap();
    assert!(
        matches!(err, Error::InvalidArgument(_)) && err.to_string().contains("larger than the grain"),
        "{err}"
    );
    let err = pool.create_volume_spec("a", 16 * LARGE, &dual_spec(0)).err().unwrap();
    assert!(err.to_string().contains("sparse map holds"), "{err}");
    let lsa_with_sparse = VolumeSpec {
        sparse_pages: Some(100),
        ..VolumeSpec::lsa(4096)
    };
    let err = pool.create_volume_spec("a", 16 * LARGE, &lsa_with_sparse).err().unwrap();
    assert!(err.to_string().contains("dual-mapping volumes only"), "{err}");
    assert!(pool.volume_names().is_empty());
}

#[test]
fn each_volume_keeps_its_own_policies() {
    let opts = inline_gc();
    let (pool, dev) = memory_pool(48, &opts);
    let db = VolumeSpec {
        placement: Some("sepbit".into()),
        victim: Some("fifo".into()),
        ..VolumeSpec::lsa(16384)
    };
    pool.create_volume_spec("db", 8 << 20, &db).unwrap();
    pool.create_volume_spec("objects", 8 << 20, &dual_spec(64)).unwrap();
    let policies = |pool: &Pool| {
        let mut v: Vec<(String, String, String, String, u32)> = pool
            .stats()
            .volumes
            .iter()
            .map(|v| {
                (
                    v.name.clone(),
                    v.controller.clone(),
                    v.placement.clone(),
                    v.victim.clone(),
                    v.page_bytes,
                )
            })
            .collect();
        v.sort();
        v
    };
    let pool_victim = pool.victim_policy().to_string();
    let want = vec![
        ("db".to_string(), "lsa".to_string(), "sepbit".to_string(), "fifo".to_string(), 16384),
        (
            "objects".into(),
            "dual".into(),
            pool.default_placement().into(),
            pool_victim.clone(),
            LARGE as u32,
        ),
    ];
    assert_eq!(policies(&pool), want);
    // Unknown names are refused whole.
    assert!(pool.set_volume_policies("db", Some("salsa"), Some("no-such")).is_err());
    assert!(pool.set_volume_policies("db", Some("no-such"), None).is_err());
    assert_eq!(policies(&pool), want);
    // Changes take effect for new writes, and are durable.
    let vol = pool.volume("db").unwrap();
    vol.write(0, &vec![7u8; 1 << 20]).unwrap();
    pool.set_volume_policies("db", Some("user-gc"), Some("")).unwrap();
    pool.set_volume_policies("objects", None, Some("greedy")).unwrap();
    vol.write(1 << 20, &vec![8u8; 1 << 20]).unwrap();
    let mut buf = vec![0u8; 2 << 20];
    vol.read(0, &mut buf).unwrap();
    assert!(buf[..1 << 20].iter().all(|&b| b == 7) && buf[1 << 20..].iter().all(|&b| b == 8));
    let want = vec![
        ("db".to_string(), "lsa".to_string(), "user-gc".to_string(), pool_victim, 16384),
        (
            "objects".into(),
            "dual".into(),
            pool.default_placement().into(),
            "greedy".into(),
            LARGE as u32,
        ),
    ];
    assert_eq!(policies(&pool), want);
    drop(vol);
    pool.close().unwrap();
    let pool = Pool::open(vec![dev], &opts).unwrap();
    assert_eq!(policies(&pool), want);
    assert_eq!(pool.volume("objects").unwrap().controller(), ControllerKind::Dual.name());
    let mut buf = vec![0u8; 2 << 20];
    pool.volume("db").unwrap().read(0, &mut buf).unwrap();
    assert!(buf[..1 << 20].iter().all(|&b| b == 7) && buf[1 << 20..].iter().all(|&b| b == 8));
}

/// Each volume's segments are cleaned by its own victim policy: two volumes take the same
/// skewed overwrites, one ranked FIFO (which moves live data greedy would leave) and one by
/// the pool's greedy policy; the FIFO volume's data is moved more.
#[test]
fn each_volume_is_cleaned_by_its_own_victim_policy() {
    let (pool, _) = memory_pool(48, &inline_gc());
    let size = pool.logical_capacity_bytes() / 2 / 4096 * 4096 - (1 << 20);
    for (name, victim) in [("fifo", Some("fifo")), ("greedy", None)] {
        let spec = VolumeSpec {
            victim: victim.map(String::from),
            placement: Some("user-gc".into()),
            ..VolumeSpec::lsa(4096)
        };
        let vol = pool.create_volume_spec(name, size, &spec).unwrap();
        vol.write(0, &vec![1u8; size as usize]).unwrap();
    }
    let pages = size / 4096;
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for i in 0..pages * 6 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // 90% of the writes to 10% of the pages, the same pages in both volumes.
        let page = if x % 10 < 9 { x / 10 % (pages / 10) } else { x / 10 % pages };
        let name = if i % 2 == 0 { "fifo" } else { "greedy" };
        pool.volume(name).unwrap().write(page * 4096, &[i as u8; 4096]).unwrap();
    }
    let st = pool.stats();
    let moved = |n: &str| st.volumes.iter().find(|v| v.name == n).unwrap().gc_bytes_relocated;
    assert!(
        moved("fifo") > moved("greedy") * 2,
        "fifo moved {} bytes, greedy {}",
        moved("fifo"),
        moved("greedy")
    );
}
