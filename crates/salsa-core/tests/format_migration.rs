//! Format version 6 reads pools written by version 5 and upgrades them, and keeps the pool
//! metadata on every member.
//!
//! The fixtures under `tests/fixtures/format-v5/` are two pools of two 24 MiB members, written
//! by the version-5 build (commit b51a52b) with the workload in `fixtures/format-v5/README.md`:
//! one closed cleanly (a version-5 checkpoint), one dropped without closing (opened by
//! scanning version-5 records).

mod common;

use common::MIB;
use salsa_core::device::MemoryDevice;
use salsa_core::{Device, OpenOptions, OpenedFrom, Pool};
use std::io::Read;
use std::sync::Arc;

/// The format version this build writes (version 7 added the RAID-5 parity buffer id to the
/// pool metadata, version 8 a victim policy per volume, version 12 a rebuild's rate limit,
/// version 13 the outgoing member of a rebuild, version 14 sized records of compressed volumes).
const CURRENT_VERSION: u32 = 14;

const MEMBER_BYTES: u64 = 24 * MIB;
/// Offsets of the two pool-metadata slots on a flat member (format constants).
const META_SLOTS: [u64; 2] = [64 << 10, 544 << 10];

fn fixture(kind: &str) -> Vec<Arc<dyn Device>> {
    (0..2)
        .map(|i| {
            let path = format!("{}/tests/fixtures/format-v5/{kind}-m{i}.img.gz", env!("CARGO_MANIFEST_DIR"));
            let mut bytes = Vec::new();
            flate2::read::GzDecoder::new(std::fs::File::open(&path).expect(&path))
                .read_to_end(&mut bytes)
                .unwrap();
            assert_eq!(bytes.len() as u64, MEMBER_BYTES);
            let dev = MemoryDevice::new(format!("{kind}-m{i}"), MEMBER_BYTES);
            dev.write_at(&bytes, 0).unwrap();
            Arc::new(dev) as Arc<dyn Device>
        })
        .collect()
}

/// The fixture's page contents: one 8-byte word repeated, naming (volume, page, round).
fn page(vol: u64, page: u64, round: u64, len: usize) -> Vec<u8> {
    let word = (vol << 48 | round << 32 | page).to_le_bytes();
    word.iter().copied().cycle().take(len).collect()
}

/// What the version-5 workload left: alpha (4 KiB pages) written in round 0, every third page
/// rewritten in round 1, pages 100..150 trimmed; beta (16 KiB pages) pages 0..200 written,
/// 0..10 trimmed.
fn expected_alpha(p: u64) -> Vec<u8> {
    if (100..150).contains(&p) {
        vec![0; 4096]
    } else {
        page(1, p, if p.is_multiple_of(3) { 1 } else { 0 }, 4096)
    }
}

fn expected_beta(p: u64) -> Vec<u8> {
    if !(10..200).contains(&p) {
        vec![0; 16384]
    } else {
        page(2, p, 0, 16384)
    }
}

fn verify(pool: &Pool) {
    let alpha = pool.volume("alpha").unwrap();
    let beta = pool.volume("beta").unwrap();
    assert_eq!((alpha.size_bytes(), alpha.page_bytes(), alpha.controller()), (8 * MIB, 4096, "lsa"));
    assert_eq!((beta.size_bytes(), beta.page_bytes()), (4 * MIB, 16384));
    let mut buf = vec![0u8; 4096];
    for p in 0..2048 {
        alpha.read(p * 4096, &mut buf).unwrap();
        assert!(buf == expected_alpha(p), "alpha page {p}");
    }
    let mut buf = vec![0u8; 16384];
    for p in 0..256 {
        beta.read(p * 16384, &mut buf).unwrap();
        assert!(buf == expected_beta(p), "beta page {p}");
    }
    let placements: Vec<String> = pool.stats().volumes.iter().map(|v| v.placement.clone()).collect();
    assert!(placements.contains(&"sepbit".to_string()), "{placements:?}");
}

/// The format version of the newest pool-metadata copy on `dev` (0 when it has none).
fn meta_version(dev: &dyn Device) -> u32 {
    let mut best = (0u64, 0u32);
    for off in META_SLOTS {
        let mut b = vec![0u8; 4096];
        dev.read_at(&mut b, off).unwrap();
        if &b[..8] == b"SALSAPM1" {
            let version = u32::from_le_bytes(b[8..12].try_into().unwrap());
            let generation = u64::from_le_bytes(b[28..36].try_into().unwrap());
            best = best.max((generation, version));
        }
    }
    best.1
}

fn superblock_version(dev: &dyn Device) -> u32 {
    let mut b = vec![0u8; 4096];
    dev.read_at(&mut b, 0).unwrap();
    u32::from_le_bytes(b[8..12].try_into().unwrap())
}

fn opts() -> OpenOptions {
    OpenOptions {
        background_gc: false,
        ..OpenOptions::default()
    }
}

fn upgrade(kind: &str, expected_open: OpenedFrom) {
    let devs = fixture(kind);
    assert_eq!((meta_version(devs[0].as_ref()), meta_version(devs[1].as_ref())), (5, 0));
    // Read-only opening changes nothing.
    let before: Vec<Vec<u8>> = devs
        .iter()
        .map(|d| {
            let mut b = vec![0u8; MIB as usize];
            d.read_at(&mut b, 0).unwrap();
            b
        })
        .collect();
    let ro = Pool::open(devs.clone(), &OpenOptions { read_only: true, ..opts() }).unwrap();
    verify(&ro);
    drop(ro);
    for (d, b) in devs.iter().zip(&before) {
        let mut now = vec![0u8; MIB as usize];
        d.read_at(&mut now, 0).unwrap();
        assert!(&now == b, "a read-only open wrote to {}", d.name());
    }

    let pool = Pool::open(devs.clone(), &opts()).unwrap();
    assert_eq!(pool.opened_from(), expected_open);
    verify(&pool);
    // The metadata is the current version now, with a copy on every member; the superblocks stay as
    // they were (a version-5 superblock reads as a linear array).
    for d in &devs {
        assert_eq!(meta_version(d.as_ref()), CURRENT_VERSION, "{}", d.name());
        assert_eq!(superblock_version(d.as_ref()), 5, "{}", d.name());
    }
    assert_eq!(pool.array_layout(), "linear");
    // New writes land in current-version records next to the old ones.
    let alpha = pool.volume("alpha").unwrap();
    alpha.write(5 * 4096, &page(1, 5, 7, 4096)).unwrap();
    pool.create_volume("gamma", MIB, 4096)
        .unwrap()
        .write(0, &page(3, 0, 0, 4096))
        .unwrap();
    pool.close().unwrap();

    for force_scan in [false, true] {
        let pool = Pool::open(devs.clone(), &OpenOptions { force_scan, ..opts() }).unwrap();
        let want = if force_scan {
            OpenedFrom::RecoveryScan
        } else {
            OpenedFrom::Checkpoint
        };
        assert_eq!(pool.opened_from(), want);
        let mut buf = vec![0u8; 4096];
        pool.volume("alpha").unwrap().read(5 * 4096, &mut buf).unwrap();
        assert!(buf == page(1, 5, 7, 4096));
        pool.volume("gamma").unwrap().read(0, &mut buf).unwrap();
        assert!(buf == page(3, 0, 0, 4096));
        pool.volume("alpha").unwrap().write(5 * 4096, &expected_alpha(5)).unwrap();
        pool.delete_volume("gamma").unwrap();
        verify(&pool);
        pool.create_volume("gamma", MIB, 4096)
            .unwrap()
            .write(0, &page(3, 0, 0, 4096))
            .unwrap();
        pool.volume("alpha").unwrap().write(5 * 4096, &page(1, 5, 7, 4096)).unwrap();
        pool.close().unwrap();
    }
}

#[test]
fn a_cleanly_closed_version_5_pool_opens_from_its_checkpoint_and_upgrades() {
    upgrade("clean", OpenedFrom::Checkpoint);
}

#[test]
fn a_crashed_version_5_pool_is_recovered_from_its_records_and_upgrades() {
    upgrade("crash", OpenedFrom::RecoveryScan);
}

#[test]
fn every_member_keeps_the_pool_metadata_so_losing_one_copy_loses_nothing() {
    let devs: Vec<Arc<dyn Device>> = (0..3)
        .map(|i| Arc::new(MemoryDevice::new(format!("m{i}"), 16 * MIB)) as Arc<dyn Device>)
        .collect();
    let pool = Pool::create(devs.clone(), &common::tiny_config(), &opts()).unwrap();
    pool.create_volume("v", 4 * MIB, 4096)
        .unwrap()
        .write(0, &page(1, 0, 0, 4096))
        .unwrap();
    pool.close().unwrap();
    for d in &devs {
        assert_eq!(meta_version(d.as_ref()), CURRENT_VERSION, "{}", d.name());
        assert_eq!(superblock_version(d.as_ref()), CURRENT_VERSION, "{}", d.name());
    }
    // Both slots of member 0 destroyed: the copy on another member opens the pool, from its
    // checkpoint.
    for off in META_SLOTS {
        devs[0].write_at(&vec![0xA5u8; 4096], off).unwrap();
    }
    let pool = Pool::open(devs.clone(), &opts()).unwrap();
    assert_eq!(pool.opened_from(), OpenedFrom::Checkpoint);
    let mut buf = vec![0u8; 4096];
    pool.volume("v").unwrap().read(0, &mut buf).unwrap();
    assert!(buf == page(1, 0, 0, 4096));
    pool.close().unwrap();
    // Every copy destroyed: a clear error, naming the members.
    for d in &devs {
        for off in META_SLOTS {
            d.write_at(&vec![0xA5u8; 4096], off).unwrap();
        }
    }
    let e = Pool::open(devs.clone(), &opts()).err().expect("opened without pool metadata");
    assert!(e.to_string().contains("every copy damaged") && e.to_string().contains("m2"), "{e}");
}

#[test]
fn a_member_given_twice_or_a_copy_of_one_is_refused_without_writing() {
    let devs: Vec<Arc<dyn Device>> = (0..2)
        .map(|i| Arc::new(MemoryDevice::new(format!("m{i}"), 16 * MIB)) as Arc<dyn Device>)
        .collect();
    Pool::create(devs.clone(), &common::tiny_config(), &opts())
        .unwrap()
        .close()
        .unwrap();
    // A byte-for-byte copy of member 0 in the place of member 1.
    let copy = MemoryDevice::new("copy-of-m0", 16 * MIB);
    let mut b = vec![0u8; (16 * MIB) as usize];
    devs[0].read_at(&mut b, 0).unwrap();
    copy.write_at(&b, 0).unwrap();
    let e = Pool::open(vec![devs[0].clone(), Arc::new(copy)], &opts())
        .err()
        .expect("a copy of a member opened");
    assert!(e.to_string().contains("same member"), "{e}");
    let mut after = vec![0u8; (16 * MIB) as usize];
    devs[0].read_at(&mut after, 0).unwrap();
    assert!(after == b, "the refused open wrote to member 0");
    // The order members are given in does not matter.
    Pool::open(vec![devs[1].clone(), devs[0].clone()], &opts())
        .unwrap()
        .close()
        .unwrap();
}
