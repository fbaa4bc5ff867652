//! Victim selection for garbage collection: a documented trait and the built-in policies. The
//! capacity manager hands each candidate segment to the policy as a [`Candidate`]; the policy
//! returns a score and the lowest score is cleaned first.

use crate::format::GcPolicyId;

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

/// Chooses GC victims. Implementations must be cheap: `score` runs for every candidate on
/// every victim choice.
pub trait VictimPolicy: Send + Sync {
    /// Name used on the command line and in statistics.
    fn name(&self) -> &'static str;
    /// Lower is cleaned first.
    fn score(&self, c: &Candidate) -> f64;
}

/// Greedy: the segment with the fewest valid grains.
pub struct Greedy;

impl VictimPolicy for Greedy {
    fn name(&self) -> &'static str {
        "greedy"
    }
    fn score(&self, c: &Candidate) -> f64 {
        c.utilization()
    }
}

/// Cost-benefit (Rosenblum & Ousterhout): maximise (1 - u) * age / (1 + u).
pub struct CostBenefit;

impl VictimPolicy for CostBenefit {
    fn name(&self) -> &'static str {
        "cost-benefit"
    }
    fn score(&self, c: &Candidate) -> f64 {
        let u = c.utilization();
        let age = c.now_seq.saturating_sub(c.sealed_seq) as f64 + 1.0;
        -((1.0 - u) * age / (1.0 + u))
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
    fn name(&self) -> &'static str {
        "aging-greedy"
    }
    fn score(&self, c: &Candidate) -> f64 {
        c.utilization() * (1.0 - self.aging * c.relative_age())
    }
}

/// Builds the policy stored in a pool's superblock.
pub fn build(id: GcPolicyId, aging_milli: u32) -> Box<dyn VictimPolicy> {
    match id {
        GcPolicyId::Greedy => Box::new(Greedy),
        GcPolicyId::CostBenefit => Box::new(CostBenefit),
        GcPolicyId::AgingGreedy => Box::new(AgingGreedy {
            aging: aging_milli as f64 / 1000.0,
        }),
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
        }
    }

    #[test]
    fn greedy_prefers_emptier_and_aging_prefers_older_at_equal_utilisation() {
        assert!(Greedy.score(&cand(10, 0)) < Greedy.score(&cand(20, 0)));
        let a = AgingGreedy { aging: 0.5 };
        assert!(a.score(&cand(50, 0)) < a.score(&cand(50, 900)));
        assert!(CostBenefit.score(&cand(50, 0)) < CostBenefit.score(&cand(50, 900)));
    }
}
