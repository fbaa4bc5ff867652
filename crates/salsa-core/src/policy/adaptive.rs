//! `adaptive-cost-benefit`: cost-benefit whose age exponent is chosen by shadow runs.
//!
//! Cost-benefit scores a segment `(1 - u) age^e / (1 + u)`. The exponent that cleans least
//! depends on the workload (`docs/BENCHMARKS.md`, "How much weight age should get"): about 0.5
//! under graded heat (Zipf), about 0.8 under a sharp split into hot and cold data, and no
//! fixed exponent is best on both. Rules that read the exponent off the real pool's own
//! victims failed there, because a change of exponent shows its cost at once and its benefit
//! only a pool turnover later. So this policy runs the candidates side by side instead, as
//! cache replacement's "set dueling" does: it samples a fixed share of the pool's logical
//! pages (by a hash of volume and page, so a sampled page sees all of its writes and the
//! sample keeps the workload's heat), replays their writes and trims into one small
//! log-structured model per candidate exponent (a user stream, a GC stream, victims chosen by
//! cost-benefit with that exponent, the same share of spare space as the pool, segments of a
//! sixteenth of the pool's or more), and ranks the real pool's segments
//! with the exponent whose model has written least per user page lately.
//!
//! It owns: the sample's page index and the models, behind one lock taken only by sampled
//! writes (one page in [`MIN_SAMPLE_RATE`] or fewer). Bounds: at most [`MAX_MODEL_PAGES`]
//! sampled pages, so the index and the models hold about 36 bytes per sampled page, at most
//! about 5 MiB whatever the pool's size (reported as `model_memory_bytes`); a page past the
//! bound is not modelled. Invariants asserted: a model never
//! takes a page off a segment whose valid count is zero, and never frees a segment whose
//! valid count is not zero once its live pages are moved.
//!
//! Until the models have written their space over twice (one turnover to fill, one of
//! cleaning), and on pools too small to model (fewer than [`MIN_MODEL_SEGMENTS`] model
//! segments), the exponent is the first candidate, 0.8. Starting there and not at 0.5 is
//! measured, not guessed: a switch costs about a pool turnover of cleaning before the pool's
//! segments sort themselves under the new exponent, and in the models' first turnover of
//! cleaning the smaller exponent always looks cheaper (a larger one pays at once for cold
//! segments it cleans and gains later), so an early verdict would be wrong for a hot/cold
//! split. Starting at 0.8, that split never switches; graded heat switches to 0.5 after the
//! warm-up, and its first turnovers cost 1% to 2% more than `sqrt-cost-benefit` would
//! (`docs/BENCHMARKS.md`). The models' counters halve every turnover, so the verdict follows
//! a workload that changes. The models' state is not persisted; a reopened pool starts them
//! again.

use super::victim::{Candidate, PoolShape, VictimPolicy};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

/// The exponents run side by side; the first is used until the models have warmed up (see
/// the module documentation for why 0.8 comes first).
pub const EXPONENTS: [f64; 2] = [0.8, 0.5];
/// One logical page in this many (or more, for large pools) is modelled.
pub const MIN_SAMPLE_RATE: u64 = 16;
/// The most pages a model holds; larger pools sample more sparsely.
pub const MAX_MODEL_PAGES: u64 = 1 << 17;
/// Fewest pages in a model segment.
const MIN_MODEL_SEGMENT_PAGES: u32 = 8;
/// A model with fewer segments than this says nothing useful; the policy stays at the first
/// exponent.
pub const MIN_MODEL_SEGMENTS: u32 = 32;
/// Free segments a model keeps (the GC runs below this).
const MODEL_FREE_TARGET: usize = 2;
/// A challenger's recent write amplification must be this much lower to take over.
const SWITCH_MARGIN: f64 = 0.98;

/// See the module documentation.
pub struct AdaptiveCostBenefit {
    /// The exponent in use, as `f64` bits.
    exponent_bits: AtomicU64,
    /// Times the exponent changed.
    switches: AtomicU64,
    shadow: OnceLock<ShadowCell>,
}

/// The models and the sample rate they were built for (read without the lock).
struct ShadowCell {
    rate: u64,
    state: Mutex<Shadow>,
}

impl Default for AdaptiveCostBenefit {
    fn default() -> Self {
        AdaptiveCostBenefit {
            exponent_bits: AtomicU64::new(EXPONENTS[0].to_bits()),
            switches: AtomicU64::new(0),
            shadow: OnceLock::new(),
        }
    }
}

impl AdaptiveCostBenefit {
    /// The exponent the policy ranks with now.
    pub fn exponent(&self) -> f64 {
        f64::from_bits(self.exponent_bits.load(Relaxed))
    }

    /// The models' recent write amplification, one per exponent of [`EXPONENTS`] (`None`
    /// while a model has not warmed up, or when the pool is not modelled).
    pub fn model_write_amplification(&self) -> Vec<Option<f64>> {
        match self.shadow.get() {
            Some(cell) => cell.state.lock().recent_write_amplification(),
            None => vec![None; EXPONENTS.len()],
        }
    }
}

impl VictimPolicy for AdaptiveCostBenefit {
    fn score(&self, c: &Candidate) -> f64 {
        cost_benefit(c, self.exponent())
    }

    fn score_batch(&self, candidates: &[Candidate], scores: &mut Vec<f64>) {
        let e = self.exponent();
        scores.extend(candidates.iter().map(|c| cost_benefit(c, e)));
    }

    fn watch_writes(&self, shape: &PoolShape) -> bool {
        let Some((rate, shadow)) = Shadow::for_pool(shape) else {
            return false;
        };
        self.shadow
            .set(ShadowCell {
                rate,
                state: Mutex::new(shadow),
            })
            .is_ok()
    }

    fn user_page_written(&self, volume: u32, page: u64) {
        let Some(cell) = self.shadow.get() else { return };
        let key = page_key(volume, page);
        // Unsampled pages (most of them) return before the lock.
        if !mix(key).is_multiple_of(cell.rate) {
            return;
        }
        let mut s = cell.state.lock();
        s.write(key);
        if let Some(best) = s.best(self.exponent()) {
            self.exponent_bits.store(best.to_bits(), Relaxed);
            self.switches.fetch_add(1, Relaxed);
        }
    }

    fn state(&self) -> Vec<(String, f64)> {
        let mut v = vec![
            ("age_exponent".to_string(), self.exponent()),
            ("exponent_switches".to_string(), self.switches.load(Relaxed) as f64),
        ];
        // A model's figure only once it is trusted.
        for (e, wa) in EXPONENTS.iter().zip(self.model_write_amplification()) {
            if let Some(wa) = wa {
                v.push((format!("model_write_amplification_e{e}"), wa));
            }
        }
        if let Some(cell) = self.shadow.get() {
            v.push(("model_memory_bytes".to_string(), cell.state.lock().memory_bytes() as f64));
        }
        v
    }

    fn user_pages_trimmed(&self, volume: u32, first: u64, count: u64) {
        let Some(cell) = self.shadow.get() else { return };
        cell.state.lock().trim(cell.rate, volume, first, count);
    }
}

/// A candidate's score: see [`score`].
fn cost_benefit(c: &Candidate, exponent: f64) -> f64 {
    score(c.utilization(), c.now_seq.saturating_sub(c.sealed_seq), exponent)
}

/// `(1 - u) (age + 1)^e / (1 + u)`, negated (lower is cleaned first): the same score ranks
/// the pool's segments and the models'.
fn score(utilization: f64, age: u64, exponent: f64) -> f64 {
    -((1.0 - utilization) * (age as f64 + 1.0).powf(exponent) / (1.0 + utilization))
}

/// Pages of a volume below 2^48 (1 EiB of 4 KiB pages) have keys of their own.
const PAGE_MASK: u64 = (1 << 48) - 1;

/// Volume and page in one key.
fn page_key(volume: u32, page: u64) -> u64 {
    ((volume as u64) << 48) | (page & PAGE_MASK)
}

/// SplitMix64's finaliser: a well-spread hash, so that the pages it sends to the sample are
/// a fair share of any address pattern.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The sampled pages and one model per exponent.
struct Shadow {
    /// Sampled page key -> dense index into the models' page arrays.
    index: HashMap<u64, u32>,
    /// The most pages modelled (97% of a model's space, as the pool keeps 3% free).
    max_pages: u32,
    models: Vec<Model>,
    /// Sampled user writes seen.
    writes: u64,
    /// Writes of one epoch: the models' counters halve at each epoch's end.
    epoch_writes: u64,
    /// Writes before the models are trusted.
    warmup_writes: u64,
}

impl Shadow {
    /// Models for a pool of `shape`, and their sample rate; `None` when the pool is too small
    /// to model.
    fn for_pool(shape: &PoolShape) -> Option<(u64, Shadow)> {
        let mut rate = MIN_SAMPLE_RATE;
        while shape.usable_grains / rate > MAX_MODEL_PAGES {
            rate = rate.checked_mul(2)?;
        }
        let model_pages = shape.usable_grains / rate;
        let segment_pages = (shape.segment_data_grains as u64 / rate).max(MIN_MODEL_SEGMENT_PAGES as u64);
        let segments = model_pages / segment_pages;
        if segments < MIN_MODEL_SEGMENTS as u64 {
            return None;
        }
        let (segments, segment_pages) = (u32::try_from(segments).ok()?, u32::try_from(segment_pages).ok()?);
        // The open segments and the GC's free target are the models' own overhead, as the
        // pool's usable space leaves its own out.
        let space = (segments as u64).saturating_sub(MODEL_FREE_TARGET as u64 + 2) * segment_pages as u64;
        let max_pages = u32::try_from(space * 97 / 100).ok()?;
        let models = EXPONENTS.iter().map(|&e| Model::new(segments, segment_pages, e)).collect();
        let turnover = segments as u64 * segment_pages as u64;
        Some((
            rate,
            Shadow {
                index: HashMap::new(),
                max_pages,
                models,
                writes: 0,
                epoch_writes: turnover,
                warmup_writes: 2 * turnover,
            },
        ))
    }

    fn write(&mut self, key: u64) {
        let next = self.index.len() as u32;
        let idx = match self.index.get(&key) {
            Some(&i) => i,
            None if next < self.max_pages => {
                self.index.insert(key, next);
                next
            }
            // Past the bound the page is not modelled (the models would be full).
            None => return,
        };
        self.writes += 1;
        let halve = self.writes.is_multiple_of(self.epoch_writes);
        for m in &mut self.models {
            m.write(idx);
            if halve {
                m.halve_counters();
            }
        }
    }

    fn trim(&mut self, rate: u64, volume: u32, first: u64, count: u64) {
        let end = first.saturating_add(count);
        // Walk whichever is shorter: the range, or the sampled pages.
        let idxs: Vec<u32> = if count <= self.index.len() as u64 {
            (first..end)
                .map(|p| page_key(volume, p))
                .filter(|k| mix(*k).is_multiple_of(rate))
                .filter_map(|k| self.index.get(&k).copied())
                .collect()
        } else {
            // The volume's bits as `page_key` keeps them.
            let volume_bits = page_key(volume, 0) >> 48;
            let in_range = |k: u64| k >> 48 == volume_bits && (first..end).contains(&(k & PAGE_MASK));
            self.index.iter().filter(|(k, _)| in_range(**k)).map(|(_, &i)| i).collect()
        };
        for m in &mut self.models {
            for &i in &idxs {
                m.trim(i);
            }
        }
    }

    /// Memory held by the sample's index and the models, in bytes (the index counted at
    /// its key, value and one control byte per slot of its capacity).
    fn memory_bytes(&self) -> u64 {
        let index = self.index.capacity() as u64 * (8 + 4 + 1);
        index + self.models.iter().map(Model::memory_bytes).sum::<u64>()
    }

    /// Each model's recent write amplification, once warmed up.
    fn recent_write_amplification(&self) -> Vec<Option<f64>> {
        self.models
            .iter()
            .map(|m| {
                (self.writes >= self.warmup_writes)
                    .then(|| m.recent_write_amplification())
                    .flatten()
            })
            .collect()
    }

    /// The exponent to rank with: `current` unless another model has written clearly less
    /// lately.
    fn best(&self, current: f64) -> Option<f64> {
        if self.writes < self.warmup_writes || !self.writes.is_multiple_of(64) {
            return None;
        }
        let was = self.models.iter().find(|m| m.exponent == current)?.recent_write_amplification()?;
        let (best, wa) = self
            .models
            .iter()
            .filter_map(|m| Some((m.exponent, m.recent_write_amplification()?)))
            .min_by(|a, b| a.1.total_cmp(&b.1))?;
        (wa < was * SWITCH_MARGIN).then_some(best)
    }
}

const NOWHERE: u32 = u32::MAX;

/// A log-structured store of modelled pages: one user stream, one GC stream, segments of
/// `segment_pages`, cost-benefit victims with `exponent`.
struct Model {
    exponent: f64,
    segment_pages: u32,
    /// Page -> the segment holding it.
    location: Vec<u32>,
    valid: Vec<u32>,
    sealed_at: Vec<u64>,
    /// Pages appended to each segment, in order (some since overwritten).
    contents: Vec<Vec<u32>>,
    sealed: Vec<bool>,
    free: Vec<u32>,
    user_open: u32,
    gc_open: u32,
    now: u64,
    /// Decayed counts of user writes and GC moves.
    user_writes: f64,
    gc_moves: f64,
}

impl Model {
    fn new(segments: u32, segment_pages: u32, exponent: f64) -> Model {
        let n = segments as usize;
        let mut m = Model {
            exponent,
            segment_pages,
            location: Vec::new(),
            valid: vec![0; n],
            sealed_at: vec![0; n],
            contents: vec![Vec::new(); n],
            sealed: vec![false; n],
            free: (0..segments).rev().collect(),
            user_open: NOWHERE,
            gc_open: NOWHERE,
            now: 0,
            user_writes: 0.0,
            gc_moves: 0.0,
        };
        m.user_open = m.free.pop().unwrap_or(NOWHERE);
        m.gc_open = m.free.pop().unwrap_or(NOWHERE);
        m
    }

    fn memory_bytes(&self) -> u64 {
        let per_segment = 4 + 8 + 1 + std::mem::size_of::<Vec<u32>>() as u64;
        let contents: u64 = self.contents.iter().map(|c| c.capacity() as u64 * 4).sum();
        self.location.capacity() as u64 * 4 + self.valid.len() as u64 * per_segment + contents + self.free.capacity() as u64 * 4
    }

    fn recent_write_amplification(&self) -> Option<f64> {
        (self.user_writes > 0.0).then(|| (self.user_writes + self.gc_moves) / self.user_writes)
    }

    fn halve_counters(&mut self) {
        self.user_writes /= 2.0;
        self.gc_moves /= 2.0;
    }

    fn unmap(&mut self, page: u32) {
        let Some(&seg) = self.location.get(page as usize) else { return };
        if seg != NOWHERE {
            assert!(self.valid[seg as usize] > 0, "model segment {seg} counts no valid page");
            self.valid[seg as usize] -= 1;
            self.location[page as usize] = NOWHERE;
        }
    }

    fn write(&mut self, page: u32) {
        if self.location.len() <= page as usize {
            self.location.resize(page as usize + 1, NOWHERE);
        }
        self.now += 1;
        self.user_writes += 1.0;
        self.unmap(page);
        if !self.append(page, false) {
            return;
        }
        while self.free.len() < MODEL_FREE_TARGET {
            if !self.clean_one() {
                break;
            }
        }
    }

    fn trim(&mut self, page: u32) {
        self.unmap(page);
    }

    /// Appends to the user or GC stream; `false` when the model has no segment to open (it
    /// cannot happen while the pages stay under the bound, but a model never panics on it).
    fn append(&mut self, page: u32, gc: bool) -> bool {
        let seg = if gc { self.gc_open } else { self.user_open };
        if seg == NOWHERE {
            return false;
        }
        let s = seg as usize;
        self.location[page as usize] = seg;
        self.valid[s] += 1;
        self.contents[s].push(page);
        if self.contents[s].len() as u32 == self.segment_pages {
            self.sealed[s] = true;
            self.sealed_at[s] = self.now;
            let next = self.free.pop().unwrap_or(NOWHERE);
            if gc {
                self.gc_open = next;
            } else {
                self.user_open = next;
            }
        }
        true
    }

    /// Cleans the best sealed segment; `false` when none would free anything.
    fn clean_one(&mut self) -> bool {
        let mut best: Option<(f64, usize)> = None;
        for s in 0..self.valid.len() {
            if !self.sealed[s] || self.valid[s] >= self.segment_pages {
                continue;
            }
            let u = self.valid[s] as f64 / self.segment_pages as f64;
            let sc = score(u, self.now - self.sealed_at[s], self.exponent);
            if best.is_none_or(|(b, _)| sc < b) {
                best = Some((sc, s));
            }
        }
        let Some((_, victim)) = best else { return false };
        let pages = std::mem::take(&mut self.contents[victim]);
        for &p in &pages {
            if self.location[p as usize] == victim as u32 {
                self.valid[victim] -= 1;
                self.gc_moves += 1.0;
                if self.gc_open == NOWHERE || !self.append(p, true) {
                    // No GC segment (cannot happen with the free target kept): the page stays
                    // counted where it was, and the victim is not freed.
                    self.valid[victim] += 1;
                    self.contents[victim] = pages;
                    return false;
                }
            }
        }
        assert_eq!(self.valid[victim], 0, "model victim {victim} freed with valid pages");
        let mut reuse = pages;
        reuse.clear();
        self.contents[victim] = reuse;
        self.sealed[victim] = false;
        self.free.push(victim as u32);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::SmallRng, Rng, SeedableRng};

    fn shape() -> PoolShape {
        // A 512 MiB pool of 1 MiB segments and 4 KiB grains.
        PoolShape {
            usable_grains: 118_000,
            segment_data_grains: 255,
        }
    }

    /// Writes `volumes` volume-worths of `pick` to the policy and returns its exponent.
    fn run(pick: impl Fn(&mut SmallRng, u64) -> u64, volumes: u64) -> (f64, Vec<Option<f64>>) {
        let p = AdaptiveCostBenefit::default();
        assert!(p.watch_writes(&shape()));
        let pages = 100_000u64;
        for page in 0..pages {
            p.user_page_written(1, page);
        }
        let mut rng = SmallRng::seed_from_u64(1);
        for _ in 0..volumes * pages {
            p.user_page_written(1, pick(&mut rng, pages));
        }
        let state = p.state();
        assert_eq!(state[0], ("age_exponent".to_string(), p.exponent()));
        assert_eq!(state.len(), 3 + EXPONENTS.len(), "{state:?}");
        // The sample of 100,000 pages is about 6,000 pages: well under a megabyte in all.
        let (_, memory) = state.last().unwrap();
        assert!(*memory > 50_000.0 && *memory < 1_000_000.0, "{state:?}");
        (p.exponent(), p.model_write_amplification())
    }

    fn hot_cold(rng: &mut SmallRng, pages: u64) -> u64 {
        if rng.gen_bool(0.9) {
            rng.gen_range(0..pages / 10)
        } else {
            rng.gen_range(pages / 10..pages)
        }
    }

    /// Graded heat: page `pages * x^4` for a uniform `x`, a density falling as a power of
    /// the page (scattered over the volume by a multiplicative hash).
    fn graded(rng: &mut SmallRng, pages: u64) -> u64 {
        let x: f64 = rng.gen();
        let rank = ((pages as f64) * x.powi(4)) as u64;
        rank.wrapping_mul(0x9e37_79b9) % pages
    }

    #[test]
    fn a_sharp_hot_cold_split_keeps_the_larger_exponent_and_graded_heat_takes_the_square_root() {
        let (e, wa) = run(hot_cold, 6);
        assert_eq!(e, 0.8, "hot/cold 90/10: models at {wa:?}");
        assert!(wa.iter().all(Option::is_some), "{wa:?}");
        let (e, wa) = run(graded, 6);
        assert_eq!(e, 0.5, "graded heat: models at {wa:?}");
        let [Some(larger), Some(smaller)] = wa[..] else {
            panic!("models not warm: {wa:?}")
        };
        assert!(smaller < larger, "{wa:?}");
    }

    #[test]
    fn small_pools_are_not_modelled_and_keep_the_first_exponent() {
        let p = AdaptiveCostBenefit::default();
        assert!(!p.watch_writes(&PoolShape {
            usable_grains: 4096,
            segment_data_grains: 255
        }));
        p.user_page_written(0, 0);
        assert_eq!(p.exponent(), EXPONENTS[0]);
        assert_eq!(p.model_write_amplification(), vec![None, None]);
    }

    #[test]
    fn trims_leave_the_models_consistent_and_huge_ranges_cost_what_the_sample_holds() {
        let p = AdaptiveCostBenefit::default();
        assert!(p.watch_writes(&shape()));
        for page in 0..50_000 {
            p.user_page_written(3, page);
        }
        p.user_pages_trimmed(3, 0, u64::MAX / 2);
        p.user_pages_trimmed(3, 10, 100);
        let cell = p.shadow.get().unwrap();
        let s = cell.state.lock();
        for m in &s.models {
            assert_eq!(m.valid.iter().sum::<u32>(), 0, "every sampled page was trimmed");
            assert!(m.location.iter().all(|&l| l == NOWHERE));
        }
    }
}
