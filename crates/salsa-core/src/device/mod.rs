//! Devices: the bottom layer. A device is a flat array of bytes that can be read, written and
//! synced at aligned offsets. Everything above sees only the [`Device`] trait.
//!
//! Owns: the [`Device`] contract, the storage types, the zone model, and the implementations:
//! real devices (regular files and block devices: [`file`](mod@file), Linux zoned block devices:
//! [`kernel_zones`]), memory, slices of a device; apart from them, the emulations of devices
//! this machine lacks ([`models`]: a host-managed zoned drive, a commodity SSD, a drive-managed
//! SMR disk, each with its counters) and simulated faults (`faults`: crash simulation, fault
//! injection; built for tests only, with the `fault-injection` feature).
//!
//! Contract every implementation keeps (the "assumptions about the underlying media"):
//! - A write that returned `Ok` is visible to every later read, but is durable only after a
//!   later `sync` returned `Ok`.
//! - A crash may drop or tear (at 512-byte sectors) any write not covered by a successful sync;
//!   it never changes bytes that were durable.
//! - Offsets and lengths passed by the engine are multiples of [`Device::alignment_bytes`].

mod declared;
#[cfg(any(test, feature = "fault-injection"))]
pub mod faults;
pub mod file;
pub mod kernel_zones;
mod memory;
pub mod models;
mod slice;
pub mod zone;

pub use declared::Declared;
#[cfg(any(test, feature = "fault-injection"))]
pub use faults::crash::{CrashDevice, CrashPlan};
#[cfg(any(test, feature = "fault-injection"))]
pub use faults::fault::{FaultDevice, FaultPlan};
pub use file::FileDevice;
pub use memory::MemoryDevice;
pub use models::smr_model::{DiskTimer, DiskTiming, DriveManagedSmr, SmrParams, TimedDisk};
pub use models::ssd_model::{SsdModel, SsdParams};
pub use models::zoned_emulator::{ZonedEmulator, ZonedGeometry};
pub use slice::SliceDevice;
pub use zone::{Zone, ZoneCondition, ZoneKind, Zoned};

use std::cell::Cell;
use std::io;
use std::time::Instant;

/// Kind of storage behind a device; the capacity manager keeps one allocation queue per type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum StorageType {
    Flash = 0,
    Hdd = 1,
    SmrConventional = 2,
    SmrSequential = 3,
    Nvm = 4,
}

impl StorageType {
    /// All types, in queue order.
    pub const ALL: [StorageType; 5] = [
        StorageType::Flash,
        StorageType::Hdd,
        StorageType::SmrConventional,
        StorageType::SmrSequential,
        StorageType::Nvm,
    ];

    pub fn from_u8(v: u8) -> Option<StorageType> {
        StorageType::ALL.get(v as usize).copied()
    }

    /// The name users write (`--device PATH@hdd`) and statistics show.
    pub fn name(self) -> &'static str {
        match self {
            StorageType::Flash => "flash",
            StorageType::Hdd => "hdd",
            StorageType::SmrConventional => "smr-conventional",
            StorageType::SmrSequential => "smr",
            StorageType::Nvm => "nvm",
        }
    }

    /// The type a user may declare for a flat device by name (`flash`/`ssd`, `hdd`/`disk`,
    /// `nvm`); zone types come from the zones themselves.
    pub fn declarable(name: &str) -> Option<StorageType> {
        match name {
            "flash" | "ssd" => Some(StorageType::Flash),
            "hdd" | "disk" => Some(StorageType::Hdd),
            "nvm" => Some(StorageType::Nvm),
            _ => None,
        }
    }
}

/// A storage device: regular file, block device, memory, or an emulation.
pub trait Device: Send + Sync {
    /// Human-readable identity used in every error message (usually the path).
    fn name(&self) -> &str;
    /// Capacity in bytes.
    fn size_bytes(&self) -> u64;
    /// The storage type the device declares.
    fn storage_type(&self) -> StorageType {
        StorageType::Flash
    }
    /// Whether this stands in for a member that was not given at open: it fails every I/O
    /// and knows nothing of the device, not even its storage type.
    fn is_stand_in(&self) -> bool {
        false
    }
    /// Offsets, lengths and buffer addresses must be multiples of this.
    fn alignment_bytes(&self) -> usize {
        512
    }
    /// Alignment the device prefers for large sequential writes (a drive-managed SMR band, an
    /// erase block); the pool starts its segments on such a boundary. 0 when it has none.
    fn preferred_alignment_bytes(&self) -> u64 {
        0
    }
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`. Not durable until [`Device::sync`].
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Writes the concatenation of `bufs` at `offset`, as one write (each piece meets
    /// [`Device::alignment_bytes`]). The default gathers the pieces into one buffer and calls
    /// [`Device::write_at`], so that decorators and models keep their semantics unchanged; a
    /// file writes them with `pwritev`, without the copy.
    fn write_vectored_at(&self, bufs: &[io::IoSlice<'_>], offset: u64) -> io::Result<()> {
        if let [one] = bufs {
            return self.write_at(one, offset);
        }
        let total = bufs.iter().map(|b| b.len()).sum();
        let mut all = crate::util::AlignedBuf::zeroed(total);
        let mut at = 0;
        for b in bufs {
            all[at..at + b.len()].copy_from_slice(b);
            at += b.len();
        }
        self.write_at(&all, offset)
    }
    /// Reads into each of `bufs` in turn, from `offset` on, as one read where the device can
    /// (each piece meets [`Device::alignment_bytes`]). The default reads them one by one; a
    /// file uses `preadv`.
    fn read_vectored_at(&self, bufs: &mut [io::IoSliceMut<'_>], offset: u64) -> io::Result<()> {
        let mut at = offset;
        for b in bufs.iter_mut() {
            self.read_at(b, at)?;
            at += b.len() as u64;
        }
        Ok(())
    }
    /// Makes every write that returned before this call durable.
    fn sync(&self) -> io::Result<()>;
    /// Tells the device that nothing needs the bytes of a range any more (TRIM, UNMAP, a hole
    /// punched in a file), so that an SSD need not move them in its own garbage collection.
    /// Advisory: afterwards the range reads its old bytes or zeros, and a crash may undo the
    /// discard; bytes outside the range never change. The pool discards only segments that
    /// are free (every record that emptied them is durable). The default does nothing.
    fn discard(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    /// Whether a discarded range costs work when it is written next: a hole punched in a
    /// regular file is allocated anew by the file system (an `O_DIRECT` write into it also
    /// converts an unwritten extent), so a discard pays off only for space that stays free a
    /// while; the pool then keeps an eighth of its segments free undiscarded and discards only
    /// the free segments beyond that (see `Log::discard_released`). A drive's TRIM or a model's
    /// unmap costs nothing on reuse.
    fn discard_reallocates(&self) -> bool {
        false
    }
    /// Whether any part of a range has no storage allocated under it (a hole in a sparse or
    /// punched regular file), so that its next write makes the file system allocate (and, on
    /// a flush, commit its journal). Only devices that [`Device::discard_reallocates`] have
    /// holes; an error answers `false` (a hint only: a hole costs speed, never data).
    fn has_hole(&self, _offset: u64, _len: u64) -> bool {
        false
    }
    /// Zone management, for zoned devices (host-managed SMR, ZNS); `None` for flat devices.
    fn zones(&self) -> Option<&dyn Zoned> {
        None
    }
    /// Counters the device keeps about itself (models report wear here), as name/value pairs.
    fn counters(&self) -> Vec<(String, u64)> {
        Vec::new()
    }
}

/// Inside `impl Device for` a decorator that wraps another device in its field `$inner`:
/// forwards everything that describes the device (size, storage type, alignments, zones), so
/// that a decorator cannot hide a property from the pool. (A trace recorder that did not
/// forward the zones made the pool treat a zoned drive as flat.) A new property of the trait
/// is forwarded here once, for every decorator.
#[macro_export]
macro_rules! forward_device_properties {
    ($inner:ident) => {
        fn size_bytes(&self) -> u64 {
            self.$inner.size_bytes()
        }
        fn storage_type(&self) -> $crate::device::StorageType {
            self.$inner.storage_type()
        }
        fn alignment_bytes(&self) -> usize {
            self.$inner.alignment_bytes()
        }
        fn preferred_alignment_bytes(&self) -> u64 {
            self.$inner.preferred_alignment_bytes()
        }
        fn zones(&self) -> Option<&dyn $crate::device::Zoned> {
            self.$inner.zones()
        }
    };
}

/// I/O of a device model that keeps its data by logical address on a backing device: checks the
/// range, does the I/O (`io`), then lets the model account for it (`account(offset, len)`),
/// only for I/O that happened.
pub(crate) fn modelled_io(
    capacity_bytes: u64,
    offset: u64,
    len: usize,
    io: impl FnOnce() -> io::Result<()>,
    account: impl FnOnce(u64, u64),
) -> io::Result<()> {
    check_range(capacity_bytes, offset, len)?;
    if len == 0 {
        return Ok(());
    }
    io()?;
    account(offset, len as u64);
    Ok(())
}

thread_local! {
    /// Inside [`issued_together`]: the latest completion of the real-time models' requests
    /// made so far (`Some(None)`: none yet); outside it, `None`.
    static ISSUED_TOGETHER: Cell<Option<Option<Instant>>> = const { Cell::new(None) };
}

/// Runs `f` with its requests to models that keep real time
/// ([`SsdModel::set_real_time`]) in flight together, as a host that submits them all at once
/// has them: each request returns as soon as the model has scheduled it, and this returns
/// when the last of them completes. Requests to any other device are unaffected. (The
/// [`Device`] calls are synchronous; without this, a thread that writes to two models waits
/// for the first before the second starts.)
pub fn issued_together<R>(f: impl FnOnce() -> R) -> R {
    /// Restores the caller's state (a nested call, or none), even if `f` panics.
    struct Restore(Option<Option<Instant>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            ISSUED_TOGETHER.with(|c| c.set(self.0));
        }
    }
    let outer = ISSUED_TOGETHER.with(|c| c.replace(Some(None)));
    let restore = Restore(outer);
    let result = f();
    let latest = ISSUED_TOGETHER.with(|c| c.get()).flatten();
    drop(restore);
    if let Some(at) = latest {
        complete_at(at);
    }
    result
}

/// Returns when a real-time model's request completes at `at` (inside [`issued_together`],
/// at once, leaving the wait to it).
pub(crate) fn complete_at(at: Instant) {
    let deferred = ISSUED_TOGETHER.with(|c| match c.get() {
        Some(latest) => {
            c.set(Some(Some(latest.map_or(at, |l| l.max(at)))));
            true
        }
        None => false,
    });
    if !deferred {
        let now = Instant::now();
        if at > now {
            std::thread::sleep(at - now);
        }
    }
}

/// Checks that an access lies inside the device, with checked arithmetic (for any `Device`
/// implementation, in this crate or outside it).
pub fn check_range(size: u64, offset: u64, len: usize) -> io::Result<()> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= size => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("access of {len} bytes at {offset} is past the device end {size}"),
        )),
    }
}
