//! Victim selection for garbage collection: the [`VictimPolicy`] trait and the built-in
//! policies. The engine hands each candidate segment to the policy as a [`Candidate`]; the
//! policy returns a score and the lowest score is cleaned first.

use crate::format::StreamKind;

/// What a policy may know about a segment.
#[derive(Debug, Clone, Copy)]
pub struct Candidate {
    pub segment: u32,
    /// Valid grains in the segment.
    pub valid_grains: u32,
    /// Grains a segment holds.
    pub capacity_grains: u32,
    /// Data sequence number when the segment was sealed.
    pub sealed_seq: u64,
    /// Current data sequence number ("now").
    pub now_seq: u64,
    /// Sequence number of the oldest sealed candidate (for normalising age).
    pub oldest_sealed_seq: u64,
    /// The stream the segment was written by.
    pub stream: StreamKind,
}

impl Candidate {
    /// Fraction of the segment still valid, in `[0, 1]`.
    pub fn utilization(&self) -> f64 {
        self.valid_grains as f64 / self.capacity_grains as f64
    }
    /// Age normalised to `[0, 1]`: 1 for the oldest candidate, 0 for one sealed now.
    pub fn relative_age(&self) -> f64 {
        let span = self.now_seq.saturating_sub(self.oldest_sealed_seq).max(1);
        self.now_seq.saturating_sub(self.sealed_seq) as f64 / span as f64
    }
}

/// Chooses GC victims: one instance for the pool, and one for each volume that names its own.
/// Implementations must be cheap: every candidate is scored on every victim choice, from GC
/// workers in parallel.
pub trait VictimPolicy: Send + Sync {
    /// Lower is cleaned first. Only segments that would free space are offered.
    fn score(&self, c: &Candidate) -> f64;

    /// Scores every candidate of one victim choice, appending one score per candidate, in
    /// order, to `scores` (which arrives empty). The engine calls this once per choice; the
    /// default scores one by one. A policy with a per-call cost (one written in Python) scores
    /// the batch at once. A NaN ranks last.
    fn score_batch(&self, candidates: &[Candidate], scores: &mut Vec<f64>) {
        scores.extend(candidates.iter().map(|c| self.score(c)));
    }
}

/// Greedy: the segment with the fewest valid grains.
pub struct Greedy;

impl VictimPolicy for Greedy {
    fn score(&self, c: &Candidate) -> f64 {
        c.utilization()
    }
}

/// FIFO: the segment sealed longest ago, whatever it holds (the order FSTL's TL1 and the
/// drive-managed SMR disks Skylight analysed clean their cache zones in; it needs no
/// bookkeeping but moves live data that greedy would leave alone).
pub struct Fifo;

impl VictimPolicy for Fifo {
    fn score(&self, c: &Candidate) -> f64 {
        c.sealed_seq as f64
    }
}

/// Cost-benefit (Rosenblum & Ousterhout): maximise (1 - u) * age / (1 + u).
pub struct CostBenefit;

impl VictimPolicy for CostBenefit {
    fn score(&self, c: &Candidate) -> f64 {
        let u = c.utilization();
        let age = c.now_seq.saturating_sub(c.sealed_seq) as f64 + 1.0;
        -((1.0 - u) * age / (1.0 + u))
    }
}

/// Ours: cost-benefit with the age weighed by its square root, `(1 - u) √age / (1 + u)`. With
/// data well separated by heat, plain cost-benefit lets age override utilisation too much:
/// old cold segments are cleaned while still nearly full, and hot ones wait. The square root
/// keeps age as a tie-breaker of the right scale (heatlog, Zipf 1.0 at 20% spare: WA 1.67 with
/// cost-benefit, 1.61 with this; 90/10: 1.59 -> 1.55; exponents 0.3 to 0.75 measured, 0.5
/// best).
pub struct SqrtAgeCostBenefit;

impl VictimPolicy for SqrtAgeCostBenefit {
    fn score(&self, c: &Candidate) -> f64 {
        let u = c.utilization();
        let age = c.now_seq.saturating_sub(c.sealed_seq) as f64 + 1.0;
        -((1.0 - u) * age.sqrt() / (1.0 + u))
    }
}

/// SALSA's generalised greedy: greedy on utilisation, discounted by the circular buffer's aging
/// factor so that old, slowly-invalidating (cold) segments are eventually cleaned. With a factor
/// of 0 it is greedy; under uniform random writes age carries no information and the choice stays
/// close to greedy, while under skew it stops cold segments from pinning free space.
pub struct AgingGreedy {
    pub aging: f64,
}

impl VictimPolicy for AgingGreedy {
    fn score(&self, c: &Candidate) -> f64 {
        c.utilization() * (1.0 - self.aging * c.relative_age())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(valid: u32, sealed: u64) -> Candidate {
        Candidate {
            segment: 0,
            valid_grains: valid,
            capacity_grains: 100,
            sealed_seq: sealed,
            now_seq: 1000,
            oldest_sealed_seq: 0,
            stream: StreamKind::User(0),
        }
    }

    #[test]
    fn greedy_prefers_emptier_and_aging_prefers_older_at_equal_utilisation() {
        assert!(Greedy.score(&cand(10, 0)) < Greedy.score(&cand(20, 0)));
        // FIFO takes the oldest even when it is fuller.
        assert!(Fifo.score(&cand(90, 0)) < Fifo.score(&cand(10, 900)));
        let a = AgingGreedy { aging: 0.5 };
        assert!(a.score(&cand(50, 0)) < a.score(&cand(50, 900)));
        assert!(CostBenefit.score(&cand(50, 0)) < CostBenefit.score(&cand(50, 900)));
        assert!(SqrtAgeCostBenefit.score(&cand(50, 0)) < SqrtAgeCostBenefit.score(&cand(50, 900)));
    }

    #[test]
    fn square_root_age_lets_utilisation_weigh_more_than_cost_benefit_does() {
        // A young, emptier segment against an old, fuller one: cost-benefit takes the old one,
        // the square-root variant the emptier one.
        let (young_empty, old_full) = (cand(10, 900), cand(60, 0));
        assert!(CostBenefit.score(&old_full) < CostBenefit.score(&young_empty));
        assert!(SqrtAgeCostBenefit.score(&young_empty) < SqrtAgeCostBenefit.score(&old_full));
    }
}
