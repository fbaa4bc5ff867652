//! The victim policies that watch user writes ([`VictimPolicy::watch_writes`]), and which
//! volume's writes go to which.
//!
//! It owns the routing table: the pool's policy watches every volume that has no victim
//! policy of its own; a volume with its own policy is watched by that one or by none. The
//! write path reads the table without a lock (one atomic load when no policy watches).

use crate::policy::victim::VictimPolicy;
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

/// See the module documentation.
#[derive(Default)]
pub struct WriteWatchers {
    /// Whether any policy watches (the write path's fast exit).
    any: AtomicBool,
    table: ArcSwap<Table>,
    /// Serialises updates of `table`.
    update: Mutex<()>,
}

#[derive(Default, Clone)]
struct Table {
    pool: Option<Arc<dyn VictimPolicy>>,
    /// Volumes with a victim policy of their own: `Some` when it watches.
    volumes: BTreeMap<u32, Option<Arc<dyn VictimPolicy>>>,
}

impl WriteWatchers {
    /// The pool's policy, if it watches writes.
    pub fn set_pool(&self, policy: Option<Arc<dyn VictimPolicy>>) {
        self.change(|t| t.pool = policy);
    }

    /// `volume`'s own policy: `None` when it follows the pool's, `Some(None)` when its own
    /// does not watch writes, `Some(Some(p))` when `p` does.
    pub fn set_volume(&self, volume: u32, own: Option<Option<Arc<dyn VictimPolicy>>>) {
        self.change(|t| match own {
            Some(p) => {
                t.volumes.insert(volume, p);
            }
            None => {
                t.volumes.remove(&volume);
            }
        });
    }

    fn change(&self, f: impl FnOnce(&mut Table)) {
        let _g = self.update.lock();
        let mut t = Table::clone(&self.table.load());
        f(&mut t);
        let any = t.pool.is_some() || t.volumes.values().any(Option::is_some);
        self.table.store(Arc::new(t));
        self.any.store(any, Relaxed);
    }

    fn watcher(&self, volume: u32, f: impl FnOnce(&dyn VictimPolicy)) {
        if !self.any.load(Relaxed) {
            return;
        }
        let t = self.table.load();
        let p = match t.volumes.get(&volume) {
            Some(own) => own.as_ref(),
            None => t.pool.as_ref(),
        };
        if let Some(p) = p {
            f(p.as_ref());
        }
    }

    /// A user page of `volume` was written.
    pub fn page_written(&self, volume: u32, page: u64) {
        self.watcher(volume, |p| p.user_page_written(volume, page));
    }

    /// User pages `[first, first + count)` of `volume` were trimmed.
    pub fn pages_trimmed(&self, volume: u32, first: u64, count: u64) {
        self.watcher(volume, |p| p.user_pages_trimmed(volume, first, count));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::victim::Candidate;
    use std::sync::atomic::AtomicU64;

    #[derive(Default)]
    struct Counting(AtomicU64);
    impl VictimPolicy for Counting {
        fn score(&self, _: &Candidate) -> f64 {
            0.0
        }
        fn user_page_written(&self, _: u32, _: u64) {
            self.0.fetch_add(1, Relaxed);
        }
    }

    #[test]
    fn a_volume_with_its_own_policy_is_watched_by_it_alone() {
        let w = WriteWatchers::default();
        let (pool, own) = (Arc::new(Counting::default()), Arc::new(Counting::default()));
        w.page_written(1, 0);
        w.set_pool(Some(pool.clone()));
        w.set_volume(2, Some(Some(own.clone())));
        w.set_volume(3, Some(None));
        for v in [1, 2, 2, 3] {
            w.page_written(v, 7);
        }
        assert_eq!((pool.0.load(Relaxed), own.0.load(Relaxed)), (1, 2));
        w.set_volume(2, None);
        w.page_written(2, 7);
        assert_eq!(pool.0.load(Relaxed), 2);
    }
}
