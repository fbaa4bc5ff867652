//! The emulated host-managed zoned device refuses every illegal operation as a real drive does,
//! keeps its zone state across restarts, and after a crash keeps everything that was synced.

use salsa_core::device::{CrashDevice, CrashPlan, FileDevice, MemoryDevice, ZoneCondition, ZoneKind, Zoned, ZonedEmulator, ZonedGeometry};
use salsa_core::{Device, StorageType};
use std::sync::Arc;

const ZONE: u64 = 1 << 20;

fn geometry(conventional: u32) -> ZonedGeometry {
    ZonedGeometry {
        zone_bytes: ZONE,
        conventional_zones: conventional,
        storage_type: StorageType::SmrSequential,
    }
}

fn memory_drive(zones: u64, conventional: u32) -> ZonedEmulator {
    let backing = Arc::new(MemoryDevice::new("mem", zones * ZONE + (1 << 20)));
    ZonedEmulator::open_or_create(backing, geometry(conventional)).unwrap()
}

fn block(byte: u8, len: usize) -> Vec<u8> {
    vec![byte; len]
}

fn expect_err(r: std::io::Result<()>, what: &str) -> String {
    match r {
        Ok(()) => panic!("{what} was accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn geometry_and_report() {
    let d = memory_drive(8, 2);
    assert_eq!(d.zone_count(), 8);
    assert_eq!(d.size_bytes(), 8 * ZONE);
    let zones = d.report_zones(0, 100).unwrap();
    assert_eq!(zones.len(), 8);
    assert_eq!(zones[0].kind, ZoneKind::Conventional);
    assert_eq!(zones[1].condition, ZoneCondition::NotWritePointer);
    assert_eq!(zones[2].kind, ZoneKind::SequentialRequired);
    assert_eq!(zones[2].condition, ZoneCondition::Empty);
    assert_eq!(zones[5].start_bytes, 5 * ZONE);
    assert!(d.report_zones(8, 1).is_err(), "report past the last zone");
}

#[test]
fn sequential_zone_rules() {
    let d = memory_drive(8, 2);
    let z2 = 2 * ZONE;
    // Conventional zones take writes anywhere, in any order, also across their boundary.
    d.write_at(&block(1, 4096), 3 * 4096).unwrap();
    d.write_at(&block(2, 8192), ZONE - 4096).unwrap();
    // Only at the write pointer.
    let e = expect_err(d.write_at(&block(3, 4096), z2 + 4096), "a write ahead of the write pointer");
    assert!(e.contains("write pointer"), "{e}");
    d.write_at(&block(3, 4096), z2).unwrap();
    expect_err(d.write_at(&block(3, 4096), z2), "a rewrite below the write pointer");
    d.write_at(&block(4, 4096), z2 + 4096).unwrap();
    let r = d.report_zones(2, 1).unwrap()[0];
    assert_eq!((r.condition, r.write_pointer_bytes), (ZoneCondition::Open, z2 + 8192));
    // Reads stop at the write pointer.
    let mut buf = vec![0u8; 8192];
    d.read_at(&mut buf, z2).unwrap();
    assert_eq!(&buf[..4096], &block(3, 4096)[..]);
    assert_eq!(&buf[4096..], &block(4, 4096)[..]);
    let e = expect_err(d.read_at(&mut vec![0u8; 4096], z2 + 8192), "a read at the write pointer");
    assert!(e.contains("past its write pointer"), "{e}");
    expect_err(d.read_at(&mut vec![0u8; 12288], z2), "a read across the write pointer");
    expect_err(d.read_at(&mut vec![0u8; 4096], 5 * ZONE), "a read of an empty zone");
    // Never across a zone boundary, never from conventional into sequential.
    let z3 = 3 * ZONE;
    d.write_at(&block(5, ZONE as usize - 4096), z3).unwrap();
    let e = expect_err(d.write_at(&block(6, 8192), z3 + ZONE - 4096), "a write across a zone end");
    assert!(e.contains("crosses"), "{e}");
    expect_err(
        d.write_at(&block(6, 8192), z2 - 4096),
        "a write from a conventional into a sequential zone",
    );
    // A full zone takes nothing more.
    d.write_at(&block(6, 4096), z3 + ZONE - 4096).unwrap();
    assert_eq!(d.report_zones(3, 1).unwrap()[0].condition, ZoneCondition::Full);
    let e = expect_err(d.write_at(&block(7, 4096), z3 + ZONE - 4096), "a write to a full zone");
    assert!(e.contains("full"), "{e}");
    let e = expect_err(
        d.write_at(&block(7, 4096), z3 + ZONE + 4096),
        "a write into the middle of an empty zone",
    );
    assert!(e.contains("write pointer"), "{e}");
    // Past the device end.
    expect_err(d.write_at(&block(7, 4096), 8 * ZONE), "a write past the end");
    expect_err(d.read_at(&mut vec![0u8; 4096], 8 * ZONE), "a read past the end");
}

#[test]
fn reset_and_finish() {
    let d = memory_drive(6, 1);
    let z1 = ZONE;
    d.write_at(&block(9, 8192), z1).unwrap();
    // Finish: full, the unwritten tail reads as zeros, no more writes.
    d.finish_zone(1).unwrap();
    let r = d.report_zones(1, 1).unwrap()[0];
    assert_eq!(r.condition, ZoneCondition::Full);
    let mut buf = vec![1u8; 16384];
    d.read_at(&mut buf, z1).unwrap();
    assert!(buf[..8192].iter().all(|&b| b == 9));
    assert!(
        buf[8192..].iter().all(|&b| b == 0),
        "a finished zone's unwritten tail reads as zeros"
    );
    expect_err(d.write_at(&block(1, 4096), z1 + 8192), "a write to a finished zone");
    // Reset: empty, its old data unreadable, writable from the start again.
    d.reset_zone(1).unwrap();
    assert_eq!(d.report_zones(1, 1).unwrap()[0].condition, ZoneCondition::Empty);
    expect_err(d.read_at(&mut vec![0u8; 4096], z1), "a read of a reset zone");
    d.write_at(&block(2, 4096), z1).unwrap();
    // Zone management on a conventional zone or a zone that does not exist.
    let e = expect_err(d.reset_zone(0), "a reset of a conventional zone");
    assert!(e.contains("conventional"), "{e}");
    expect_err(d.finish_zone(0), "a finish of a conventional zone");
    expect_err(d.reset_zone(6), "a reset of a zone past the end");
    expect_err(d.finish_zone(u32::MAX), "a finish of zone u32::MAX");
}

#[test]
fn state_persists_in_its_file_and_foreign_files_are_refused() {
    // Removed with all it holds when dropped, last (declared first), pass or fail.
    let scratch = tempfile::tempdir().unwrap();
    let path = scratch.path().join("zoned.img");
    let open_file = || {
        let f = FileDevice::open(
            &path,
            salsa_core::device::file::FileOpenOptions {
                create_size_bytes: Some(8 * ZONE + (1 << 20)),
                direct: false,
                read_only: false,
            },
        )
        .unwrap();
        Arc::new(f) as Arc<dyn Device>
    };
    {
        let d = ZonedEmulator::open_or_create(open_file(), geometry(1)).unwrap();
        d.write_at(&block(5, 12288), 2 * ZONE).unwrap();
        d.write_at(&block(6, 4096), 3 * ZONE).unwrap();
        d.finish_zone(3).unwrap();
        d.sync().unwrap();
    }
    {
        let d = ZonedEmulator::open_or_create(open_file(), geometry(1)).unwrap();
        let r = d.report_zones(2, 2).unwrap();
        assert_eq!(r[0].write_pointer_bytes, 2 * ZONE + 12288);
        assert_eq!(r[1].condition, ZoneCondition::Full);
        let mut buf = vec![0u8; 12288];
        d.read_at(&mut buf, 2 * ZONE).unwrap();
        assert!(buf.iter().all(|&b| b == 5));
    }
    let e = ZonedEmulator::open_or_create(open_file(), geometry(2))
        .err()
        .expect("other geometry");
    assert!(e.to_string().contains("another geometry"), "{e}");
    // A file with other data where the zone state belongs is not taken for a zoned drive.
    std::fs::write(&path, vec![0xabu8; (8 * ZONE + (1 << 20)) as usize]).unwrap();
    let e = ZonedEmulator::open_or_create(open_file(), geometry(1)).err().expect("foreign file");
    assert!(e.to_string().contains("not an emulated zoned drive"), "{e}");
}

/// Synced writes survive a power loss; unsynced ones may vanish, and then the write pointer is
/// behind them, so nothing unwritten ever reads back.
#[test]
fn crash_keeps_what_was_synced() {
    for seed in 0..20 {
        let backing = Arc::new(CrashDevice::new(
            "crash",
            8 * ZONE + (1 << 20),
            CrashPlan {
                seed,
                crash_after_ops: None,
            },
        ));
        let d = ZonedEmulator::open_or_create(backing.clone(), geometry(1)).unwrap();
        d.write_at(&block(1, 8192), ZONE).unwrap();
        d.sync().unwrap();
        d.write_at(&block(2, 8192), ZONE + 8192).unwrap();
        d.reset_zone(2).unwrap_or(());
        d.write_at(&block(3, 4096), 2 * ZONE).unwrap();
        backing.crash_now();
        backing.restart(CrashPlan::default());
        let d = ZonedEmulator::open_or_create(backing.clone(), geometry(1)).unwrap();
        let r = d.report_zones(1, 1).unwrap()[0];
        assert!(r.write_pointer_bytes >= ZONE + 8192, "seed {seed}: synced data lost");
        let mut buf = vec![0u8; (r.write_pointer_bytes - ZONE) as usize];
        d.read_at(&mut buf, ZONE).unwrap();
        assert!(buf[..8192].iter().all(|&b| b == 1), "seed {seed}");
        assert!(
            buf[8192..].iter().all(|&b| b == 2),
            "seed {seed}: unsynced data torn below the write pointer"
        );
        // The other write of zone 2 was never synced: it is gone or intact.
        let r2 = d.report_zones(2, 1).unwrap()[0];
        if r2.write_pointer_bytes > 2 * ZONE {
            let mut b = vec![0u8; 4096];
            d.read_at(&mut b, 2 * ZONE).unwrap();
            assert!(b.iter().all(|&x| x == 3), "seed {seed}");
        }
    }
}

/// The kernel path: a block device is asked for its zones through the zone ioctls. This
/// machine has no zoned block device, so the test checks what it can: a loop device (a
/// conventional block device) answers "no zones", keeps its full size, and carries a pool.
/// Skipped, saying so, where loop devices cannot be set up (not root, no losetup).
#[test]
fn a_loop_device_answers_the_zone_ioctls_as_a_conventional_disk() {
    let scratch = tempfile::tempdir().unwrap();
    let image = scratch.path().join("disk.img");
    std::fs::File::create(&image).unwrap().set_len(64 << 20).unwrap();
    let out = std::process::Command::new("losetup")
        .args(["--find", "--show"])
        .arg(&image)
        .output();
    let loop_dev = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        other => {
            eprintln!("skipped: cannot set up a loop device here ({other:?})");
            return;
        }
    };
    struct Detach(String);
    impl Drop for Detach {
        fn drop(&mut self) {
            let _ = std::process::Command::new("losetup").args(["--detach", &self.0]).status();
        }
    }
    let _detach = Detach(loop_dev.clone());
    let dev = FileDevice::open(std::path::Path::new(&loop_dev), Default::default()).unwrap();
    assert!(dev.zones().is_none(), "{loop_dev} is not zoned");
    assert_eq!(dev.size_bytes(), 64 << 20);
    let dev: Arc<dyn Device> = Arc::new(dev);
    let pool = salsa_core::Pool::create(vec![dev], &Default::default(), &Default::default()).unwrap();
    let vol = pool.create_volume("v", 16 << 20, 4096).unwrap();
    vol.write(4096, &block(7, 4096)).unwrap();
    let mut back = block(0, 4096);
    vol.read(4096, &mut back).unwrap();
    assert_eq!(back, block(7, 4096));
    pool.close().unwrap();
}

/// Decorators (fault injection, disk timing) show the pool the zones and geometry of the drive
/// they wrap, so a pool on a decorated zoned drive still writes it zone by zone.
#[test]
fn decorators_show_the_zones_of_the_drive_they_wrap() {
    use salsa_core::device::{DiskTiming, FaultDevice, FaultPlan, TimedDisk};
    let drive: Arc<dyn Device> = Arc::new(memory_drive(8, 1));
    let decorated: [Arc<dyn Device>; 2] = [
        Arc::new(FaultDevice::new(drive.clone(), FaultPlan::default())),
        Arc::new(TimedDisk::new(drive.clone(), DiskTiming::default())),
    ];
    for d in decorated {
        let z = d.zones().expect("the zones of the wrapped drive");
        assert_eq!((z.zone_bytes(), z.zone_count()), (ZONE, 8));
        assert_eq!(d.size_bytes(), drive.size_bytes());
        assert_eq!(d.storage_type(), drive.storage_type());
        assert_eq!(d.preferred_alignment_bytes(), drive.preferred_alignment_bytes());
        assert_eq!(d.alignment_bytes(), drive.alignment_bytes());
    }
}
