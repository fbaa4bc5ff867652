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
//! even with every shared thread busy; the other jobs wait their turn in one queue, in order,
//! taken by the [`MEMBER_IO_THREADS`] shared threads and by callers waiting for their own jobs
//! (so a job that calls [`run_all`] itself always makes progress); [`run_all`] returns only
//! once every job it was given has finished, so a job may borrow from its caller; a job that
//! panics is reported to its caller as `None`, never as a panic of the caller, and leaves the
//! shared thread that ran it serving.

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};

/// Threads shared by every array of the process for member I/O beyond the caller's own.
pub const MEMBER_IO_THREADS: usize = 16;

/// A job handed to the shared threads, its borrows' lifetime erased (see [`run_all`]).
type Task = Box<dyn FnOnce() + Send + 'static>;

/// The shared threads' queue. Idle threads sleep on `queued` and take tasks in order.
///
/// Why not a work-stealing pool: rayon's idle workers poll every other worker's queue and
/// yield for a while before they sleep, and each member write woke several of them: on RAID-5
/// random writes the 16 member I/O threads took 41% of a core and 134,000 involuntary context
/// switches a second doing little else (docs/BENCHMARKS.md), on a host of two cores where the
/// GC and the writers need that time.
struct Shared {
    tasks: Mutex<VecDeque<Task>>,
    queued: Condvar,
}

/// How many of one call's tasks have not finished; its caller waits for none.
struct Latch {
    remaining: Mutex<usize>,
    finished: Condvar,
}

/// The shared threads, started on first use; `None` when none could start (jobs then run one
/// after another on the caller's thread).
fn threads() -> Option<&'static Shared> {
    static SHARED: Shared = Shared {
        tasks: Mutex::new(VecDeque::new()),
        queued: Condvar::new(),
    };
    static STARTED: OnceLock<bool> = OnceLock::new();
    let started = *STARTED.get_or_init(|| {
        let shared = &SHARED;
        let mut started = 0;
        for i in 0..MEMBER_IO_THREADS {
            let spawned = std::thread::Builder::new().name(format!("salsa-io-{i}")).spawn(move || loop {
                let task = {
                    let mut tasks = shared.tasks.lock();
                    loop {
                        match tasks.pop_front() {
                            Some(task) => break task,
                            None => shared.queued.wait(&mut tasks),
                        }
                    }
                };
                task();
            });
            match spawned {
                Ok(_) => started += 1,
                Err(e) => {
                    tracing::warn!("member I/O thread {i} could not start ({e})");
                    break;
                }
            }
        }
        if started == 0 {
            tracing::warn!("no member I/O thread could start; members are accessed one after another");
        }
        started > 0
    });
    started.then_some(&SHARED)
}

/// A pointer to a result slot of [`run_all`]'s caller, handed to the task that fills it.
struct SlotPtr<T>(*mut Option<T>);
// SAFETY: the slot is written by exactly one task, on one thread, and read by the caller only
// after that task has finished (the latch orders the two); `T: Send` may move between threads.
unsafe impl<T: Send> Send for SlotPtr<T> {}

/// Runs every job at once (the first on this thread) and returns their results in order; a
/// job that panicked gives `None`.
///
/// While its jobs run elsewhere the caller takes queued tasks (any caller's) and runs them
/// too, so that a job that itself calls `run_all` (a GC read that reconstructs from parity)
/// always makes progress, even with every shared thread waiting in such a call.
pub fn run_all<T: Send, F: FnOnce() -> T + Send>(jobs: Vec<F>) -> Vec<Option<T>> {
    let run = |job: F| std::panic::catch_unwind(AssertUnwindSafe(job)).ok();
    let mut results: Vec<Option<T>> = (0..jobs.len()).map(|_| None).collect();
    let mut jobs = jobs.into_iter();
    let (Some(first), Some((first_slot, other_slots))) = (jobs.next(), results.split_first_mut()) else {
        return results;
    };
    let shared = match threads() {
        Some(shared) if jobs.len() > 0 => shared,
        _ => {
            *first_slot = run(first);
            for (job, slot) in jobs.zip(other_slots.iter_mut()) {
                *slot = run(job);
            }
            return results;
        }
    };
    let latch = Arc::new(Latch {
        remaining: Mutex::new(jobs.len()),
        finished: Condvar::new(),
    });
    {
        let mut tasks = shared.tasks.lock();
        for (job, slot) in jobs.zip(other_slots.iter_mut()) {
            let slot = SlotPtr(slot as *mut Option<T>);
            let latch = latch.clone();
            let task: Box<dyn FnOnce() + Send + '_> = Box::new(move || {
                let slot = slot;
                let result = std::panic::catch_unwind(AssertUnwindSafe(job)).ok();
                // SAFETY: `slot` points into `results`, which the caller neither reads nor
                // moves until this task has counted itself finished below.
                unsafe { *slot.0 = result };
                let mut remaining = latch.remaining.lock();
                *remaining -= 1;
                if *remaining == 0 {
                    latch.finished.notify_all();
                }
            });
            // SAFETY: the task borrows what the caller's jobs borrow and the caller's
            // `results`; the caller does not return (nor unwind: the jobs' panics are caught,
            // and nothing else in the wait below panics) until every task has run and counted
            // itself finished, so no borrow outlives its lender. The latch is shared by `Arc`,
            // so a task may still touch it after the caller has gone.
            let task: Task = unsafe { std::mem::transmute::<Box<dyn FnOnce() + Send + '_>, Task>(task) };
            tasks.push_back(task);
            shared.queued.notify_one();
        }
    }
    *first_slot = run(first);
    loop {
        if *latch.remaining.lock() == 0 {
            break;
        }
        let task = shared.tasks.lock().pop_front();
        match task {
            Some(task) => task(),
            None => {
                // Every task of this call is taken: wait for the last to finish.
                let mut remaining = latch.remaining.lock();
                while *remaining > 0 {
                    latch.finished.wait(&mut remaining);
                }
                break;
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

    /// Jobs that run jobs themselves (a GC read that reconstructs a page from parity) finish
    /// with more of them than shared threads: a caller waiting for its jobs runs queued ones.
    #[test]
    fn nested_calls_finish_with_more_jobs_than_threads() {
        let outer: Vec<_> = (0..2 * MEMBER_IO_THREADS as u64)
            .map(|i| {
                move || {
                    let inner: Vec<_> = (0..4u64)
                        .map(|j| {
                            move || {
                                std::thread::sleep(std::time::Duration::from_millis(1));
                                i * 10 + j
                            }
                        })
                        .collect();
                    run_all(inner).into_iter().map(|r| r.expect("an inner job")).sum::<u64>()
                }
            })
            .collect();
        let expected: Vec<_> = (0..2 * MEMBER_IO_THREADS as u64).map(|i| Some(40 * i + 6)).collect();
        // A deadlock fails the test instead of hanging the suite.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(run_all(outer)));
        let out = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("nested calls did not finish in 60 s");
        assert_eq!(out, expected);
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
