mod common;
use common::*;
use salsa_core::{OpenedFrom, Pool};

#[test]
fn write_read_trim_and_reopen_cleanly() {
    let (pool, dev) = memory_pool(48, &inline_gc());
    let size = pool.logical_capacity_bytes();
    let vol = pool.create_volume("a", size, 4096).unwrap();
    let mut buf = vec![0u8; PAGE];
    vol.read(0, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0), "never-written reads as zeros");
    for p in 0..100u64 {
        vol.write(p * PAGE as u64, &pattern(1, p, 1)).unwrap();
    }
    for p in 0..100u64 {
        vol.read(p * PAGE as u64, &mut buf).unwrap();
        assert_eq!(buf, pattern(1, p, 1), "page {p}");
    }
    // sub-page write is read-modify-write
    vol.write(10 * PAGE as u64 + 100, &[7u8; 50]).unwrap();
    vol.read(10 * PAGE as u64, &mut buf).unwrap();
    let mut expect = pattern(1, 10, 1);
    expect[100..150].fill(7);
    assert_eq!(buf, expect);
    vol.trim(20 * PAGE as u64, 10 * PAGE as u64).unwrap();
    vol.read(25 * PAGE as u64, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    vol.write_zeroes(30 * PAGE as u64 + 10, 20).unwrap();
    vol.read(30 * PAGE as u64, &mut buf).unwrap();
    let mut expect = pattern(1, 30, 1);
    expect[10..30].fill(0);
    assert_eq!(buf, expect);
    pool.close().unwrap();

    let pool = Pool::open(vec![dev.clone()], &inline_gc()).unwrap();
    assert_eq!(pool.opened_from(), OpenedFrom::Checkpoint);
    let vol = pool.volume("a").unwrap();
    vol.read(0, &mut buf).unwrap();
    assert_eq!(buf, pattern(1, 0, 1));
    vol.read(25 * PAGE as u64, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    vol.read(10 * PAGE as u64, &mut buf).unwrap();
    assert_eq!(&buf[100..150], &[7u8; 50]);
    drop(pool); // not a clean close: next open scans

    let pool = Pool::open(vec![dev], &inline_gc()).unwrap();
    assert_eq!(pool.opened_from(), OpenedFrom::RecoveryScan);
    let vol = pool.volume("a").unwrap();
    for p in [0u64, 5, 99] {
        vol.read(p * PAGE as u64, &mut buf).unwrap();
        assert_eq!(buf, pattern(1, p, 1), "page {p} after scan");
    }
    vol.read(25 * PAGE as u64, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0), "trim survives the scan");
}

#[test]
fn overwrites_with_gc_keep_every_page() {
    let (pool, _dev) = memory_pool(32, &inline_gc());
    let size = pool.logical_capacity_bytes();
    let vol = pool.create_volume("a", size, 4096).unwrap();
    let pages = size / PAGE as u64;
    let mut version = vec![0u64; pages as usize];
    let mut rng = 12345u64;
    for i in 0..pages * 6 {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let p = if i < pages { i } else { (rng >> 33) % pages };
        version[p as usize] += 1;
        vol.write(p * PAGE as u64, &pattern(1, p, version[p as usize])).unwrap();
    }
    let st = pool.stats();
    assert!(st.gc_bytes_relocated > 0, "GC ran");
    let mut buf = vec![0u8; PAGE];
    for p in 0..pages {
        vol.read(p * PAGE as u64, &mut buf).unwrap();
        assert_eq!(buf, pattern(1, p, version[p as usize]), "page {p}");
    }
}
