//! The example of docs/POLICIES.md: a placement policy and a victim policy written outside the
//! engine, registered by name, used by a pool, and found again when the pool is reopened.

use salsa_core::device::MemoryDevice;
use salsa_core::policy::placement::{PageClock, Placement, Relocation, UserWrite};
use salsa_core::policy::victim::{Candidate, VictimPolicy};
use salsa_core::StreamKind;
use salsa_core::{Device, OpenOptions, Pool, PoolConfig, Registry};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

// --- the example policy (docs/POLICIES.md) ---------------------------------------------------

/// Two user streams split at a fixed age, one GC stream per source stream.
pub struct AgeSplit {
    clock: PageClock,
    /// Writes placed hot, for the test to see that the policy is in use.
    hot_writes: AtomicU64,
}

impl AgeSplit {
    pub fn new(pages: u64) -> AgeSplit {
        AgeSplit {
            clock: PageClock::new(pages),
            hot_writes: AtomicU64::new(0),
        }
    }
}

impl Placement for AgeSplit {
    fn user_streams(&self) -> u8 {
        2
    }
    fn gc_streams(&self) -> u8 {
        2
    }
    fn place_user(&self, w: &UserWrite) -> StreamKind {
        // Hot: rewritten within a quarter of the live pages' worth of writes.
        match self.clock.stamp(w.page, w.now) {
            Some(interval) if interval < w.mapped_pages / 4 => {
                self.hot_writes.fetch_add(1, Relaxed);
                StreamKind::User(0)
            }
            _ => StreamKind::User(1),
        }
    }
    fn place_gc(&self, r: &Relocation) -> StreamKind {
        match r.victim.stream {
            StreamKind::User(0) | StreamKind::Gc(0) => StreamKind::Gc(0),
            _ => StreamKind::Gc(1),
        }
    }
    fn trimmed(&self, first: u64, count: u64) {
        self.clock.forget(first, count);
    }
    fn resize(&self, pages: u64) {
        self.clock.resize(pages);
    }
    fn state_bytes(&self) -> u64 {
        self.clock.bytes()
    }
}

/// Greedy, but a segment written by a GC stream counts 10% fuller (its data proved cold).
pub struct ColdPenalty;

impl VictimPolicy for ColdPenalty {
    fn score(&self, c: &Candidate) -> f64 {
        let u = c.utilization();
        if matches!(c.stream, StreamKind::Gc(_)) {
            u * 1.1
        } else {
            u
        }
    }
}

pub fn registry() -> Registry {
    let mut r = Registry::builtin();
    r.add_placement("age-split", "two user streams split at a fixed age", |pages| {
        Box::new(AgeSplit::new(pages))
    });
    r.add_victim("cold-penalty", "greedy that spares GC-written segments", |_| Box::new(ColdPenalty));
    r
}

// --- the test ----------------------------------------------------------------------------------

#[test]
fn a_registered_policy_runs_and_is_found_again_at_open() {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new("mem", 64 << 20));
    let opts = OpenOptions {
        background_gc: false,
        policies: registry(),
        ..OpenOptions::default()
    };
    let cfg = PoolConfig {
        segment_bytes: Some(1 << 20),
        victim_policy: "cold-penalty".into(),
        default_placement: "age-split".into(),
        ..PoolConfig::default()
    };
    let pool = Pool::create(vec![dev.clone()], &cfg, &opts).unwrap();
    let size = pool.logical_capacity_bytes();
    let vol = pool.create_volume("v", size, 4096).unwrap();
    let pages = size / 4096;
    // Skewed overwrites: a tenth of the pages takes most writes, so the GC runs and both
    // streams fill.
    let mut x = 12345u64;
    for i in 0..pages * 4 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let p = if i % 8 != 0 { (x >> 33) % (pages / 10) } else { (x >> 33) % pages };
        let mut page = vec![0u8; 4096];
        page[..8].copy_from_slice(&p.to_le_bytes());
        page[8..16].copy_from_slice(&i.to_le_bytes());
        vol.write(p * 4096, &page).unwrap();
    }
    let st = pool.stats();
    assert!(st.gc_segments_cleaned > 10, "the GC ran: {}", st.gc_segments_cleaned);
    assert_eq!(st.volumes[0].placement, "age-split");
    assert_eq!(st.volumes[0].placement_memory_bytes, pages * 4);
    assert_eq!(pool.victim_policy(), "cold-penalty");
    pool.close().unwrap();

    // Reopening without the registration is refused with the names it knows.
    let e = Pool::open(vec![dev.clone()], &OpenOptions::default())
        .err()
        .expect("unknown policy");
    assert!(e.to_string().contains("cold-penalty") || e.to_string().contains("age-split"), "{e}");
    // With it, the pool opens and every page is still readable.
    let pool = Pool::open(vec![dev], &opts).unwrap();
    let vol = pool.volume("v").unwrap();
    let mut buf = vec![0u8; 4096];
    for p in (0..pages).step_by(97) {
        vol.read(p * 4096, &mut buf).unwrap();
        let stored = u64::from_le_bytes(buf[..8].try_into().unwrap());
        assert!(stored == p || buf.iter().all(|b| *b == 0), "page {p} holds page {stored}");
    }
    pool.close().unwrap();
}
