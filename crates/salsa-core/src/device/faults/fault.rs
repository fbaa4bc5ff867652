//! Fault injection for tests: wraps a device and fails chosen writes or syncs, flips a bit in
//! data returned by reads of a chosen range, slows its writes, syncs or discards down, or dies (fails
//! everything).

use crate::device::Device;
use parking_lot::Mutex;
use std::io;
use std::sync::Arc;

/// Which operations fail.
#[derive(Debug, Clone, Default)]
pub struct FaultPlan {
    /// Fail the N-th write (from 1) and every later one while `sticky`.
    pub fail_write: Option<u64>,
    /// Fail the N-th sync (from 1).
    pub fail_sync: Option<u64>,
    /// Keep failing after the first injected failure.
    pub sticky: bool,
    /// Flip bit 0 of the byte at each of these device offsets when a read covers it.
    pub flip_bits_at: Vec<u64>,
    /// The device is dead: every read, write and sync fails.
    pub dead: bool,
    /// Every read fails (a device whose media went bad; writes and syncs still succeed).
    pub fail_reads: bool,
    /// Every discard takes this long (an SSD whose TRIM is slow, a file system punching holes
    /// under load).
    pub discard_delay: Option<std::time::Duration>,
    /// Every write takes this long (a slow disk, so a test can act while one is under way).
    pub write_delay: Option<std::time::Duration>,
    /// Every sync takes this long (a disk whose cache flush is slow).
    pub sync_delay: Option<std::time::Duration>,
    /// Every read takes this long after it read its bytes: it returns what the device held
    /// when it began (a slow disk, so a test can act while a copy is under way).
    pub read_delay: Option<std::time::Duration>,
}

struct Counters {
    writes: u64,
    syncs: u64,
    failing: bool,
}

/// A device decorator that injects failures.
pub struct FaultDevice {
    inner: Arc<dyn Device>,
    plan: Mutex<FaultPlan>,
    counters: Mutex<Counters>,
}

impl FaultDevice {
    pub fn new(inner: Arc<dyn Device>, plan: FaultPlan) -> FaultDevice {
        FaultDevice {
            inner,
            plan: Mutex::new(plan),
            counters: Mutex::new(Counters {
                writes: 0,
                syncs: 0,
                failing: false,
            }),
        }
    }

    /// Replaces the plan and clears the counters (the "device was repaired" step).
    pub fn set_plan(&self, plan: FaultPlan) {
        *self.plan.lock() = plan;
        *self.counters.lock() = Counters {
            writes: 0,
            syncs: 0,
            failing: false,
        };
    }
}

fn injected(what: &str) -> io::Error {
    io::Error::other(format!("injected {what} failure"))
}

impl Device for FaultDevice {
    fn name(&self) -> &str {
        self.inner.name()
    }
    crate::forward_device_properties!(inner);
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.plan.lock().dead || self.plan.lock().fail_reads {
            return Err(injected("read"));
        }
        self.inner.read_at(buf, offset)?;
        let delay = {
            let plan = self.plan.lock();
            for &at in &plan.flip_bits_at {
                if at >= offset && at < offset + buf.len() as u64 {
                    buf[(at - offset) as usize] ^= 1;
                }
            }
            plan.read_delay
        };
        if let Some(delay) = delay {
            std::thread::sleep(delay);
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let delay = {
            let plan = self.plan.lock();
            let mut c = self.counters.lock();
            c.writes += 1;
            if plan.dead || (c.failing && plan.sticky) || plan.fail_write == Some(c.writes) {
                c.failing = true;
                return Err(injected("write"));
            }
            plan.write_delay
        };
        if let Some(delay) = delay {
            std::thread::sleep(delay);
        }
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        let delay = {
            let plan = self.plan.lock();
            let mut c = self.counters.lock();
            c.syncs += 1;
            if plan.dead || (c.failing && plan.sticky) || plan.fail_sync == Some(c.syncs) {
                c.failing = true;
                return Err(injected("sync"));
            }
            plan.sync_delay
        };
        if let Some(delay) = delay {
            std::thread::sleep(delay);
        }
        self.inner.sync()
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let delay = {
            let plan = self.plan.lock();
            if plan.dead {
                return Err(injected("discard"));
            }
            plan.discard_delay
        };
        if let Some(delay) = delay {
            std::thread::sleep(delay);
        }
        self.inner.discard(offset, len)
    }
    fn discard_reallocates(&self) -> bool {
        self.inner.discard_reallocates()
    }
    fn has_hole(&self, offset: u64, len: u64) -> bool {
        self.inner.has_hole(offset, len)
    }
    fn counters(&self) -> Vec<(String, u64)> {
        self.inner.counters()
    }
}
