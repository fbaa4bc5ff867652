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

/// Greedy that asks for live-band counts and checks each one it is handed against a count
/// of its own, made from the volumes' maps at the same moment (the GC is inline, so nothing
/// moves while it scores).
struct BandChecker {
    volumes: Arc<std::sync::OnceLock<(salsa_core::Geometry, Vec<salsa_core::Volume>)>>,
    /// Candidates checked, those whose count differed, and the most bands seen.
    checked: Arc<AtomicU64>,
    wrong: Arc<AtomicU64>,
    most: Arc<AtomicU64>,
}

impl VictimPolicy for BandChecker {
    fn score(&self, c: &Candidate) -> f64 {
        c.utilization()
    }

    fn score_batch(&self, candidates: &[Candidate], scores: &mut Vec<f64>) {
        if let Some((geo, volumes)) = self.volumes.get() {
            let segment_bytes = geo.grains_per_segment as u64 * geo.grain_bytes as u64;
            let mut bands: std::collections::HashMap<u32, std::collections::HashSet<(usize, u64)>> = Default::default();
            for (i, v) in volumes.iter().enumerate() {
                let band_pages = segment_bytes / v.page_bytes() as u64;
                for page in 0..v.pages() {
                    if let Some(g) = v.page_location(page) {
                        bands.entry(geo.segment_of(g)).or_default().insert((i, page / band_pages));
                    }
                }
            }
            for c in candidates {
                let want = bands.get(&c.segment).map_or(0, |b| b.len()) as u32;
                self.checked.fetch_add(1, Relaxed);
                self.most.fetch_max(c.live_bands as u64, Relaxed);
                if c.live_bands != want {
                    self.wrong.fetch_add(1, Relaxed);
                }
            }
        }
        scores.extend(candidates.iter().map(|c| self.score(c)));
    }

    fn counts_live_bands(&self) -> bool {
        true
    }
}

#[test]
fn a_policy_that_counts_live_bands_gets_the_counts_the_maps_hold() {
    let volumes = Arc::new(std::sync::OnceLock::new());
    let (checked, wrong, most) = (Arc::default(), Arc::<AtomicU64>::default(), Arc::<AtomicU64>::default());
    let mut policies = Registry::builtin();
    {
        let (volumes, checked, wrong, most) = (volumes.clone(), Arc::clone(&checked), wrong.clone(), most.clone());
        policies.add_victim("band-checker", "greedy that checks its live-band counts", move |_| {
            Box::new(BandChecker {
                volumes: volumes.clone(),
                checked: Arc::clone(&checked),
                wrong: wrong.clone(),
                most: most.clone(),
            })
        });
    }
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new("mem", 64 << 20));
    let opts = OpenOptions {
        background_gc: false,
        policies,
        ..OpenOptions::default()
    };
    let cfg = PoolConfig {
        segment_bytes: Some(1 << 20),
        victim_policy: "band-checker".into(),
        ..PoolConfig::default()
    };
    let pool = Pool::create(vec![dev], &cfg, &opts).unwrap();
    // Two volumes of different page sizes: bands are counted per volume, in its own pages.
    let size = pool.logical_capacity_bytes() / 3 / (1 << 20) * (1 << 20);
    let small = pool.create_volume("small", size, 4096).unwrap();
    let large = pool.create_volume("large", size, 16384).unwrap();
    volumes.set((pool.geometry(), vec![small.clone(), large.clone()])).ok().unwrap();
    small.write(0, &vec![1u8; size as usize]).unwrap();
    large.write(0, &vec![2u8; size as usize]).unwrap();
    // Random overwrites scatter the pages of each band over many segments.
    let mut x = 99u64;
    for i in 0..(size / 4096) * 3 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let (vol, page_bytes) = if i % 2 == 0 { (&small, 4096) } else { (&large, 16384) };
        let page = (x >> 33) % (size / page_bytes);
        vol.write(page * page_bytes, &vec![i as u8; page_bytes as usize]).unwrap();
    }
    assert!(pool.stats().gc_segments_cleaned > 10, "the GC ran");
    let (checked, wrong, most) = (checked.load(Relaxed), wrong.load(Relaxed), most.load(Relaxed));
    assert!(checked > 1000, "{checked} candidates checked");
    assert_eq!(wrong, 0, "{wrong} of {checked} candidates had a wrong band count");
    assert!(
        most > 4,
        "random writes leave segments with live pages of many bands (most: {most})"
    );
}
