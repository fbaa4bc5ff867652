//! Crash simulation for tests: a device that keeps a durable image and the list of writes made
//! since the last sync. At a crash, each unsynced write is kept, dropped or torn at 512-byte
//! sectors, as a real disk with a volatile cache may do; afterwards the device refuses all I/O
//! until [`CrashDevice::restart`], which models the reboot.
//!
//! A crash happens either when the test calls [`CrashDevice::crash_now`] or automatically at the
//! N-th mutating operation (write or sync) given by [`CrashPlan::crash_after_ops`], so that a
//! seeded test can crash inside any engine path, GC and checkpoints included.

use crate::device::{check_range, Device};
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::io;

const SECTOR_BYTES: usize = 512;

/// When and how to crash.
#[derive(Debug, Clone, Copy, Default)]
pub struct CrashPlan {
    /// Crash just before the N-th write or sync (counted from 1); `None` = only on request.
    pub crash_after_ops: Option<u64>,
    /// Seed for the keep / drop / tear decisions.
    pub seed: u64,
}

struct State {
    durable: Vec<u8>,
    /// Writes since the last sync, in order: (offset, bytes).
    volatile: Vec<(u64, Vec<u8>)>,
    ops: u64,
    crashed: bool,
    plan: CrashPlan,
    crashes: u64,
}

/// In-memory device with a volatile write cache that a crash can lose or tear.
pub struct CrashDevice {
    name: String,
    size_bytes: u64,
    state: Mutex<State>,
}

impl CrashDevice {
    pub fn new(name: impl Into<String>, size_bytes: u64, plan: CrashPlan) -> CrashDevice {
        CrashDevice {
            name: name.into(),
            size_bytes,
            state: Mutex::new(State {
                durable: vec![0; size_bytes as usize],
                volatile: Vec::new(),
                ops: 0,
                crashed: false,
                plan,
                crashes: 0,
            }),
        }
    }

    /// Crashes now: unsynced writes are kept, dropped or torn; I/O fails until restart.
    pub fn crash_now(&self) {
        let mut st = self.state.lock();
        crash_locked(&mut st);
    }

    /// Whether the device has crashed and awaits restart.
    pub fn has_crashed(&self) -> bool {
        self.state.lock().crashed
    }

    /// Number of mutating operations seen so far.
    pub fn ops(&self) -> u64 {
        self.state.lock().ops
    }

    /// Comes back after a crash (or just re-arms the plan) with a new plan.
    pub fn restart(&self, plan: CrashPlan) {
        let mut st = self.state.lock();
        assert!(st.volatile.is_empty() || !st.crashed, "crash left volatile writes behind");
        st.crashed = false;
        st.ops = 0;
        st.plan = plan;
    }

    fn count_op(st: &mut State) -> io::Result<()> {
        if st.crashed {
            return Err(io::Error::other("device crashed (simulated power loss)"));
        }
        st.ops += 1;
        if st.plan.crash_after_ops == Some(st.ops) {
            crash_locked(st);
            return Err(io::Error::other("device crashed (simulated power loss)"));
        }
        Ok(())
    }
}

fn crash_locked(st: &mut State) {
    let mut rng = SmallRng::seed_from_u64(st.plan.seed ^ st.crashes.wrapping_mul(0x9e37_79b9));
    st.crashes += 1;
    let volatile = std::mem::take(&mut st.volatile);
    for (offset, bytes) in volatile {
        let choice = rng.gen_range(0..3);
        let start = offset as usize;
        match choice {
            0 => st.durable[start..start + bytes.len()].copy_from_slice(&bytes),
            1 => {}
            _ => {
                for (i, sector) in bytes.chunks(SECTOR_BYTES).enumerate() {
                    if rng.gen_bool(0.5) {
                        let at = start + i * SECTOR_BYTES;
                        st.durable[at..at + sector.len()].copy_from_slice(sector);
                    }
                }
            }
        }
    }
    st.crashed = true;
}

impl Device for CrashDevice {
    fn name(&self) -> &str {
        &self.name
    }
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self.size_bytes, offset, buf.len())?;
        let st = self.state.lock();
        if st.crashed {
            return Err(io::Error::other("device crashed (simulated power loss)"));
        }
        let start = offset as usize;
        let end = start + buf.len();
        buf.copy_from_slice(&st.durable[start..end]);
        // Overlay unsynced writes in order: the live view is durable + volatile.
        for (woff, bytes) in &st.volatile {
            let ws = *woff as usize;
            let we = ws + bytes.len();
            let lo = ws.max(start);
            let hi = we.min(end);
            if lo < hi {
                buf[lo - start..hi - start].copy_from_slice(&bytes[lo - ws..hi - ws]);
            }
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(self.size_bytes, offset, buf.len())?;
        let mut st = self.state.lock();
        Self::count_op(&mut st)?;
        st.volatile.push((offset, buf.to_vec()));
        Ok(())
    }
    /// A discard is a volatile write of zeros: reads see zeros until a crash, which drops or
    /// tears it like any unsynced write (the old bytes may come back), as the contract allows.
    /// Not counted as an operation, so the crash points of a seed stay where they were.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(io::Error::other)?;
        check_range(self.size_bytes, offset, len)?;
        let mut st = self.state.lock();
        if st.crashed {
            return Err(io::Error::other("device crashed (simulated power loss)"));
        }
        st.volatile.push((offset, vec![0; len]));
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        let mut st = self.state.lock();
        Self::count_op(&mut st)?;
        let volatile = std::mem::take(&mut st.volatile);
        for (offset, bytes) in volatile {
            let start = offset as usize;
            st.durable[start..start + bytes.len()].copy_from_slice(&bytes);
        }
        Ok(())
    }
}
