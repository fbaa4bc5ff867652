//! Member I/O at once: a request of an array that goes to several members (a record's write,
//! a victim's read, a sync, a rebuild's reads) runs its members' parts on a fixed set of
//! threads the process shares, rather than on threads spawned for the request.
//!
//! Why: spawning and joining three threads costs about 85 us on this machine (mostly system
//! time: a stack mapped and unmapped per thread), handing three jobs to waiting threads about
//! 18 us; a RAID-5 pool under random writes made about 3,500 spawns a second, every one on the
//! path of a record write or a GC read (docs/BENCHMARKS.md).
//!
//! Owns: the shared threads ([`MEMBER_IO_THREADS`], named `salsa-io-N`, built on first use).
//! Invariants: the first job runs on the caller's thread, so a request always makes progress
//! even with every shared thread busy; at most [`MEMBER_IO_THREADS`] other jobs run at once,
//! process-wide, the rest wait their turn in order; a job that panics is reported to its
//! caller as `None`, never as a panic of the caller.

use std::panic::AssertUnwindSafe;
use std::sync::OnceLock;

/// Threads shared by every array of the process for member I/O beyond the caller's own.
pub const MEMBER_IO_THREADS: usize = 16;

/// The shared threads; `None` when they could not be started (jobs then run one after
/// another on the caller's thread).
fn threads() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(MEMBER_IO_THREADS)
            .thread_name(|i| format!("salsa-io-{i}"))
            .build()
            .inspect_err(|e| tracing::warn!("member I/O threads could not start ({e}); members are accessed one after another"))
            .ok()
    })
    .as_ref()
}

/// Runs every job at once (the first on this thread) and returns their results in order; a
/// job that panicked gives `None`.
pub fn run_all<T: Send, F: FnOnce() -> T + Send>(jobs: Vec<F>) -> Vec<Option<T>> {
    let run = |job: F| std::panic::catch_unwind(AssertUnwindSafe(job)).ok();
    let mut results: Vec<Option<T>> = (0..jobs.len()).map(|_| None).collect();
    let mut jobs = jobs.into_iter();
    let (Some(first), Some((first_result, other_results))) = (jobs.next(), results.split_first_mut()) else {
        return results;
    };
    match threads() {
        Some(pool) if jobs.len() > 0 => pool.in_place_scope(|s| {
            for (job, slot) in jobs.zip(other_results.iter_mut()) {
                s.spawn(move |_| *slot = run(job));
            }
            *first_result = run(first);
        }),
        _ => {
            *first_result = run(first);
            for (job, slot) in jobs.zip(other_results.iter_mut()) {
                *slot = run(job);
            }
        }
    }
    results
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::Barrier;

    #[test]
    fn every_job_runs_once_and_results_keep_their_order() {
        let ran = AtomicUsize::new(0);
        let jobs: Vec<_> = (0..40u64)
            .map(|i| {
                let ran = &ran;
                move || {
                    ran.fetch_add(1, SeqCst);
                    i * i
                }
            })
            .collect();
        let out = run_all(jobs);
        assert_eq!(ran.load(SeqCst), 40);
        assert_eq!(out, (0..40u64).map(|i| Some(i * i)).collect::<Vec<_>>());
        assert!(run_all(Vec::<fn() -> u8>::new()).is_empty());
    }

    /// Four jobs that each wait for the other three can only finish if they run at once.
    #[test]
    fn jobs_run_at_once() {
        let barrier = Barrier::new(4);
        let jobs: Vec<_> = (0..4)
            .map(|i| {
                let barrier = &barrier;
                move || {
                    barrier.wait();
                    i
                }
            })
            .collect();
        assert_eq!(run_all(jobs), vec![Some(0), Some(1), Some(2), Some(3)]);
    }

    #[test]
    fn a_job_that_panics_is_none_and_the_others_finish() {
        let jobs: Vec<Box<dyn FnOnce() -> u32 + Send>> = vec![
            Box::new(|| 1),
            Box::new(|| panic!("a member job failed on purpose")),
            Box::new(|| 3),
        ];
        assert_eq!(run_all(jobs), vec![Some(1), None, Some(3)]);
        let first_panics: Vec<Box<dyn FnOnce() -> u32 + Send>> =
            vec![Box::new(|| panic!("the caller's own job failed on purpose")), Box::new(|| 2)];
        assert_eq!(run_all(first_panics), vec![None, Some(2)]);
    }
}
