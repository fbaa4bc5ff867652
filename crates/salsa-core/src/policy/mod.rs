//! Policies: where data goes ([`placement`]) and which segment the GC cleans ([`victim`]), and
//! the [`Registry`] that maps the names stored on disk to the types that implement them.
//!
//! A pool stores its victim policy's name in its superblock and each volume stores its
//! placement policy's name in the volume table, so a pool reopens with the same policies. A
//! name the registry does not know is refused at open with the list of known names: register
//! your own policies in [`Registry`] and pass it in `OpenOptions::policies`
//! (`docs/POLICIES.md` walks through one).

pub mod adaptive;
pub mod heatlog;
pub mod page_age;
pub mod placement;
pub mod sepbit;
pub mod victim;

use placement::Placement;
use std::sync::Arc;
use victim::VictimPolicy;

/// Tunables handed to victim-policy constructors.
#[derive(Debug, Clone, Copy)]
pub struct VictimParams {
    /// Aging factor in `[0, 1]` (the pool's `gc_aging`).
    pub aging: f64,
}

type VictimCtor = Arc<dyn Fn(&VictimParams) -> Box<dyn VictimPolicy> + Send + Sync>;
type PlacementCtor = Arc<dyn Fn(u64) -> Box<dyn Placement> + Send + Sync>;

/// `(name, about)` pairs.
pub type Described = Vec<(&'static str, &'static str)>;

/// A named policy constructor.
#[derive(Clone)]
pub struct Entry<C> {
    pub name: &'static str,
    /// One line for `--help` and `salsa policies`.
    pub about: &'static str,
    build: C,
}

/// Known policies, by name.
#[derive(Clone)]
pub struct Registry {
    victims: Vec<Entry<VictimCtor>>,
    placements: Vec<Entry<PlacementCtor>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("victims", &self.victim_names())
            .field("placements", &self.placement_names())
            .finish()
    }
}

impl Default for Registry {
    fn default() -> Self {
        Registry::builtin()
    }
}

impl Registry {
    /// No policies at all.
    pub fn empty() -> Registry {
        Registry {
            victims: Vec::new(),
            placements: Vec::new(),
        }
    }

    /// The policies that ship with SALSA.
    pub fn builtin() -> Registry {
        let mut r = Registry::empty();
        r.add_victim("greedy", "the segment with the fewest valid grains", |_| Box::new(victim::Greedy));
        r.add_victim("min-valid", "greedy under the name FSTL gives it", |_| Box::new(victim::Greedy));
        r.add_victim(
            "min-assoc",
            "FSTL's min_assoc: live pages in the fewest logical bands, then the emptiest",
            |_| Box::new(victim::MinAssoc),
        );
        r.add_victim("fifo", "the segment sealed longest ago (FSTL's TL1, Skylight's SMR disks)", |_| {
            Box::new(victim::Fifo)
        });
        r.add_victim("cost-benefit", "Rosenblum & Ousterhout: (1 - u) age / (1 + u)", |_| {
            Box::new(victim::CostBenefit)
        });
        r.add_victim("sqrt-cost-benefit", "ours: (1 - u) sqrt(age) / (1 + u)", |_| {
            Box::new(victim::SqrtAgeCostBenefit)
        });
        r.add_victim(
            "adaptive-cost-benefit",
            "ours: cost-benefit with the age exponent (0.5 or 0.8) whose shadow model cleans least",
            |_| Box::new(adaptive::AdaptiveCostBenefit::default()),
        );
        r.add_victim("aging-greedy", "SALSA: greedy discounted by an aging factor", |p| {
            Box::new(victim::AgingGreedy { aging: p.aging })
        });
        r.add_placement("salsa", "SALSA: hot/cold user streams by segment age, one GC stream", |_| {
            Box::new(placement::SalsaHeat)
        });
        r.add_placement(
            "salsa-age",
            "SALSA's hot/cold classes by each page's age, for user writes and relocations: 2 user + 2 GC streams",
            |pages| Box::new(page_age::PageAgeHeat::new(pages)),
        );
        r.add_placement("user-gc", "one user stream, one GC stream", |_| Box::new(placement::UserGc));
        r.add_placement(
            "heatlog",
            "SALSA heat logs: 6 user + 6 GC classes by smoothed update interval",
            |pages| Box::new(heatlog::HeatLog::new(pages)),
        );
        r.add_placement("sepbit", "SepBIT (FAST'22): 6 classes by inferred invalidation time", |pages| {
            Box::new(sepbit::SepBit::new(pages))
        });
        r
    }

    /// Adds (or replaces) a victim policy.
    pub fn add_victim(
        &mut self,
        name: &'static str,
        about: &'static str,
        build: impl Fn(&VictimParams) -> Box<dyn VictimPolicy> + Send + Sync + 'static,
    ) {
        upsert(&mut self.victims, name, about, Arc::new(build));
    }

    /// Adds (or replaces) a placement policy; `build` gets the volume's size in pages.
    pub fn add_placement(
        &mut self,
        name: &'static str,
        about: &'static str,
        build: impl Fn(u64) -> Box<dyn Placement> + Send + Sync + 'static,
    ) {
        upsert(&mut self.placements, name, about, Arc::new(build));
    }

    pub fn victim_names(&self) -> Vec<&'static str> {
        names(&self.victims)
    }

    pub fn placement_names(&self) -> Vec<&'static str> {
        names(&self.placements)
    }

    /// `(name, about)` of every victim policy, then of every placement policy.
    pub fn describe(&self) -> (Described, Described) {
        (
            self.victims.iter().map(|e| (e.name, e.about)).collect(),
            self.placements.iter().map(|e| (e.name, e.about)).collect(),
        )
    }

    /// Checks that a victim policy of this name is registered, or says which names are.
    pub fn check_victim(&self, name: &str) -> Result<(), String> {
        lookup(&self.victims, "victim", name).map(|_| ())
    }

    /// Checks that a placement policy of this name is registered, or says which names are.
    pub fn check_placement(&self, name: &str) -> Result<(), String> {
        lookup(&self.placements, "placement", name).map(|_| ())
    }

    /// Builds the named victim policy, or says which names exist.
    pub fn victim(&self, name: &str, params: &VictimParams) -> Result<Box<dyn VictimPolicy>, String> {
        lookup(&self.victims, "victim", name).map(|build| build(params))
    }

    /// Builds the named placement policy for a volume of `pages` pages.
    pub fn placement(&self, name: &str, pages: u64) -> Result<Box<dyn Placement>, String> {
        lookup(&self.placements, "placement", name).map(|build| build(pages))
    }
}

fn upsert<C>(entries: &mut Vec<Entry<C>>, name: &'static str, about: &'static str, build: C) {
    assert!(
        name.len() <= crate::format::MAX_POLICY_NAME_BYTES,
        "policy name {name:?} is too long"
    );
    entries.retain(|e| e.name != name);
    entries.push(Entry { name, about, build });
}

fn names<C>(entries: &[Entry<C>]) -> Vec<&'static str> {
    entries.iter().map(|e| e.name).collect()
}

/// The constructor registered under `name`, or an error naming the known ones.
fn lookup<'a, C>(entries: &'a [Entry<C>], kind: &str, name: &str) -> Result<&'a C, String> {
    match entries.iter().find(|e| e.name == name) {
        Some(e) => Ok(&e.build),
        None => Err(format!("unknown {kind} policy {name:?}; known: {}", names(entries).join(", "))),
    }
}
