//! Fault injection: failed writes and syncs make the pool refuse writes (sticky until reopen)
//! without losing anything flushed; a flipped bit is an I/O error on read, never wrong data.

mod common;
use common::*;
use salsa_core::device::{FaultDevice, FaultPlan, MemoryDevice};
use salsa_core::{Device, Error, OpenOptions, Pool};
use std::sync::Arc;

fn fault_pool() -> (Pool, Arc<FaultDevice>) {
    let mem: Arc<dyn Device> = Arc::new(MemoryDevice::new("mem", 40 * MIB));
    let dev = Arc::new(FaultDevice::new(mem, FaultPlan::default()));
    // No read cache: these tests are about what reaches the device.
    let opts = OpenOptions {
        read_cache_bytes: 0,
        ..inline_gc()
    };
    let pool = Pool::create(vec![dev.clone() as Arc<dyn Device>], &tiny_config(), &opts).unwrap();
    pool.create_volume("v", pool.logical_capacity_bytes(), 4096).unwrap();
    (pool, dev)
}

/// Writes until the injected failure, checks the stickiness, reopens and checks the data.
/// With `payload_writes`, every fifth write is 16 pages through `Volume::write_payload`, whose
/// pages the records hold in the payload instead of copying.
fn run_failure(plan: FaultPlan, payload_writes: bool) {
    let (pool, dev) = fault_pool();
    let vol = pool.volume("v").unwrap();
    let pages = vol.size_bytes() / PAGE as u64;
    let mut flushed = vec![0u64; pages as usize];
    let mut latest = vec![0u64; pages as usize];
    dev.set_plan(plan.clone());
    let mut failed = false;
    // The pages of the request that failed: each may hold its old or its new value.
    let mut in_failed_request = 0..0;
    for i in 1..20_000u64 {
        let p = i.wrapping_mul(0x9e37_79b9) % pages;
        let n = if payload_writes && i % 5 == 0 { 16.min(pages - p) } else { 1 };
        let data: Vec<u8> = (p..p + n).flat_map(|q| pattern(1, q, i)).collect();
        for q in p..p + n {
            latest[q as usize] = i;
        }
        let written = match vol.payload_buffer(data.len()) {
            Some(mut buf) => {
                buf.copy_from_slice(&data);
                vol.write_payload(p * PAGE as u64, buf)
            }
            None => vol.write(p * PAGE as u64, &data),
        };
        if let Err(e) = written {
            in_failed_request = p..p + n;
            assert!(matches!(e, Error::Io { .. } | Error::Poisoned(_)), "{e}");
            failed = true;
            break;
        }
        if i % 97 == 0 {
            if let Err(e) = vol.flush() {
                assert!(matches!(e, Error::Io { .. } | Error::Poisoned(_)), "{e}");
                failed = true;
                break;
            }
            flushed.copy_from_slice(&latest);
        }
    }
    assert!(failed, "the injected failure never happened ({plan:?})");
    // Sticky: even with the device repaired, writes and flushes are refused until reopen.
    dev.set_plan(FaultPlan::default());
    assert!(matches!(vol.write(0, &pattern(1, 0, 1)), Err(Error::Poisoned(_))));
    assert!(matches!(vol.flush(), Err(Error::Poisoned(_))));
    // Reads still work and return data that was acknowledged.
    let mut buf = vec![0u8; PAGE];
    for p in (0..pages).step_by(31).filter(|p| !in_failed_request.contains(p)) {
        vol.read(p * PAGE as u64, &mut buf).unwrap();
        let v = latest[p as usize];
        let expect = if v == 0 { vec![0; PAGE] } else { pattern(1, p, v) };
        assert_eq!(buf, expect, "page {p} before reopen");
    }
    drop(vol);
    drop(pool);
    let pool = Pool::open(vec![dev as Arc<dyn Device>], &inline_gc()).unwrap();
    let vol = pool.volume("v").unwrap();
    for p in 0..pages {
        vol.read(p * PAGE as u64, &mut buf).unwrap();
        let ok = (flushed[p as usize]..=latest[p as usize]).any(|v| {
            if v == 0 {
                buf.iter().all(|&b| b == 0)
            } else {
                buf == pattern(1, p, v)
            }
        });
        assert!(ok, "page {p}: lost its flushed value {} after reopen", flushed[p as usize]);
    }
    // And the reopened pool accepts writes again.
    vol.write(0, &pattern(1, 0, 99)).unwrap();
    pool.flush().unwrap();
}

#[test]
fn failed_write_is_sticky_and_loses_nothing_flushed() {
    for payload_writes in [false, true] {
        for n in [3, 40, 400] {
            let plan = FaultPlan {
                fail_write: Some(n),
                ..FaultPlan::default()
            };
            run_failure(plan, payload_writes);
        }
    }
}

#[test]
fn failed_sync_is_sticky_and_loses_nothing_flushed() {
    for payload_writes in [false, true] {
        for n in [2, 10, 60] {
            let plan = FaultPlan {
                fail_sync: Some(n),
                ..FaultPlan::default()
            };
            run_failure(plan, payload_writes);
        }
    }
}

#[test]
fn flipped_bit_is_an_io_error_not_wrong_data() {
    let (pool, dev) = fault_pool();
    let vol = pool.volume("v").unwrap();
    let target = pattern(1, 7, 1);
    vol.write(7 * PAGE as u64, &target).unwrap();
    vol.write(8 * PAGE as u64, &pattern(1, 8, 1)).unwrap();
    pool.flush().unwrap();
    // Find the page on the device.
    let mut at = None;
    let mut buf = vec![0u8; PAGE];
    for off in (0..dev.size_bytes()).step_by(PAGE) {
        dev.read_at(&mut buf, off).unwrap();
        if buf == target {
            at = Some(off);
            break;
        }
    }
    let at = at.expect("page not found on the device");
    dev.set_plan(FaultPlan {
        flip_bits_at: vec![at + 1000],
        ..FaultPlan::default()
    });
    let e = vol.read(7 * PAGE as u64, &mut buf).unwrap_err();
    assert!(matches!(e, Error::ChecksumMismatch { page: 7, .. }), "{e}");
    // Its neighbour is unaffected.
    vol.read(8 * PAGE as u64, &mut buf).unwrap();
    assert_eq!(buf, pattern(1, 8, 1));
}

#[test]
fn damaged_metadata_page_is_survived_by_recovery() {
    let mem: Arc<dyn Device> = Arc::new(MemoryDevice::new("mem", 40 * MIB));
    let pool = Pool::create(vec![mem.clone()], &tiny_config(), &inline_gc()).unwrap();
    let vol = pool.create_volume("v", 8 * MIB, 4096).unwrap();
    for p in 0..1000u64 {
        vol.write(p * PAGE as u64, &pattern(1, p, 1)).unwrap();
    }
    pool.flush().unwrap();
    drop(vol);
    drop(pool);
    // Flip a byte in every metadata page of the first data segment (grain 1 is a record head).
    let mut buf = vec![0u8; PAGE];
    for off in (MIB..2 * MIB).step_by(PAGE) {
        mem.read_at(&mut buf, off).unwrap();
        if &buf[..8] == b"SALSARC1" {
            buf[200] ^= 0xff;
            mem.write_at(&buf, off).unwrap();
        }
    }
    // Recovery must not panic; pages whose records are unreadable may read as an older value
    // (here: never written = zeros) but never as another page's data.
    let pool = Pool::open(vec![mem], &inline_gc()).unwrap();
    let vol = pool.volume("v").unwrap();
    for p in 0..1000u64 {
        vol.read(p * PAGE as u64, &mut buf).unwrap();
        assert!(buf == pattern(1, p, 1) || buf.iter().all(|&b| b == 0), "page {p}");
    }
}
