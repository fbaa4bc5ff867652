//! Replacing a member of a redundant array and rebuilding it, while the pool serves.
//!
//! Steps (each durable before the next): the new device gets a superblock naming its slot and
//! a fresh member id; the array puts it in the slot as *rebuilding* (it takes every write from
//! now on, and is not read from); the segments in use at that moment are listed and the open
//! segments closed, so that every segment allocated afterwards is written whole with the new
//! member; the pool metadata records the new member id and the rebuild's progress. Then each
//! listed segment still holding the same data is rebuilt onto the new member (only live
//! segments: a log-structured pool knows which ones hold data), the progress written to the
//! pool metadata as it goes, so that a crash or a restart resumes where it was. At the end a
//! flush makes everything durable, and the member is read from again.
//!
//! A healthy device being replaced stays in service beside its replacement until the rebuild
//! ends, as MD's `--replace` and ZFS's `zpool replace` keep it: the slot is read from it,
//! written on both, and rebuilt by copying it, so the array keeps its redundancy throughout
//! (another member may fail meanwhile). It leaves at its first error (recorded in the pool
//! metadata by the next sync). The metadata names it with the progress, so an open given it
//! beside its replacement keeps it in service (else the rebuild resumes from the
//! redundancy). If the replacement fails
//! instead, it takes the slot back (without one, the slot stays failed), and the rebuild ends
//! with `Error::ReplacementFailed` while the pool serves on.

use super::open::{device_is_blank, read_superblock, write_superblock};
use super::Pool;
use crate::device::Device;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::format::{DeviceLayout, RebuildState, Superblock, FORMAT_VERSION};
use crate::log::capacity::SegmentState;
use crate::util::human_bytes;
use rand::Rng;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a rebuild runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct RebuildOptions {
    /// Most bytes written to the new member per second; `None`: as fast as it goes.
    pub rate_bytes_per_sec: Option<u64>,
    /// Take a new device that holds data or another pool (otherwise refused, nothing
    /// written, as `salsa format` refuses one without `--force`).
    pub overwrite: bool,
}

/// What a rebuild did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RebuildReport {
    /// Segments rebuilt (in use when it started and still holding the same data).
    pub segments_rebuilt: u64,
    /// Segments of the pool: what a whole-device resync would have rewritten.
    pub segments_total: u64,
    pub bytes_written: u64,
    pub seconds: f64,
}

/// The segments a rebuild must visit: in use now, from `from` on, with their generation.
fn live_segments(eng: &Engine, from: u32) -> Vec<(u32, u64)> {
    let cap = eng.log.capacity();
    (from..eng.log.geo().total_segments)
        .filter_map(|s| {
            let info = cap.segment(s);
            (info.state() != SegmentState::Free).then(|| (s, info.generation.load(SeqCst)))
        })
        .collect()
}

/// Whether the pool asked its long jobs to stop ([`Pool::begin_shutdown`]) or is closing.
fn stop_requested(eng: &Engine) -> bool {
    eng.shutting_down.load(SeqCst) || eng.stopping_long_jobs.load(SeqCst)
}

/// The longest a rate-limited rebuild sleeps before it looks at [`stop_requested`] and its
/// rate again.
const STOP_CHECK_INTERVAL: Duration = Duration::from_millis(50);

/// Holds a rebuild to its rate limit, which may change while it runs
/// ([`Pool::set_rebuild_rate`]): the bytes written since the limit last changed, over the
/// time since then.
struct RatePace {
    rate_bytes_per_sec: u64,
    since: Instant,
    bytes: u64,
}

impl RatePace {
    fn new(eng: &Engine) -> RatePace {
        RatePace {
            rate_bytes_per_sec: eng.rebuild_rate_bytes_per_sec.load(SeqCst),
            since: Instant::now(),
            bytes: 0,
        }
    }

    /// Counts `bytes` written, then sleeps until the rate allows more, ending early when a
    /// stop is requested (a server's stop waits for the rebuild's next step), the rate
    /// changes (the pause of a low limit is minutes long) or no member is being rebuilt any
    /// more (the replacement failed).
    fn wrote(&mut self, eng: &Engine, bytes: u64) {
        let rate = eng.rebuild_rate_bytes_per_sec.load(SeqCst);
        if rate != self.rate_bytes_per_sec {
            *self = RatePace::new(eng);
        }
        self.bytes += bytes;
        if self.rate_bytes_per_sec == 0 {
            return;
        }
        // The limit comes from the user or the pool metadata: a pause past what an instant
        // can hold lasts until a stop or a new limit.
        let until = Duration::try_from_secs_f64(self.bytes as f64 / self.rate_bytes_per_sec as f64)
            .ok()
            .and_then(|d| self.since.checked_add(d));
        let rebuilding = || eng.log.array().member_status().iter().any(|m| m.rebuilding);
        while !stop_requested(eng) && eng.rebuild_rate_bytes_per_sec.load(SeqCst) == self.rate_bytes_per_sec && rebuilding() {
            let left = until.map_or(STOP_CHECK_INTERVAL, |u| u.saturating_duration_since(Instant::now()));
            if left.is_zero() {
                return;
            }
            std::thread::sleep(left.min(STOP_CHECK_INTERVAL));
        }
    }
}

/// Rebuilds `segments` onto slot `state.slot`, recording progress; stops early (and leaves the
/// rest for the next open) when the pool shuts down.
pub(crate) fn run_rebuild(
    eng: &Engine,
    mut state: RebuildState,
    segments: Vec<(u32, u64)>,
    progress: &dyn Fn(u64, u64),
) -> Result<RebuildReport> {
    let start = Instant::now();
    let mut pace = RatePace::new(eng);
    let mut report = RebuildReport {
        segments_total: eng.log.geo().total_segments as u64,
        ..RebuildReport::default()
    };
    let total = segments.len() as u64;
    let mut last_saved = Instant::now();
    for (i, (s, generation)) in segments.into_iter().enumerate() {
        if stop_requested(eng) {
            eng.log.array().sync_all()?;
            state.next_segment = s;
            save_progress(eng, Some(state))?;
            return Err(Error::InvalidArgument(format!(
                "the pool is shutting down; the rebuild stopped at segment {s} and resumes when the pool opens again"
            )));
        }
        eng.log.check_writable()?;
        replacement_still_there(eng)?;
        let mut bytes_written = 0;
        {
            // The GC waits (it would only move what is copied here). The hold keeps the
            // segment from being freed and reused while it is copied: emptied by overwrites,
            // released by any writer's sync and written by a new owner meanwhile, it would get
            // the copy's old bytes over the new owner's on the new member. A segment still
            // open was taken by its stream after the streams were closed above (allocated
            // before the list was made): everything in it was written with the new member, and
            // copying it would race with the writes still coming.
            let _gc = eng.gc_lock.write();
            let hold = eng.log.hold_segment(s, Some(generation));
            let open = eng.log.capacity().segment(s).state() == SegmentState::Staged;
            if hold.is_some() && !open {
                // The whole share: a segment in use is full but for the open ones, and
                // rebuilding an unwritten tail costs less than walking the chain to find it.
                let gps = eng.log.geo().grains_per_segment as u64;
                bytes_written = match eng.log.array().rebuild_segment(state.slot, s, gps) {
                    Ok(bytes) => bytes,
                    Err(e) => {
                        replacement_still_there(eng)?;
                        eng.log.poison(&e);
                        return Err(e);
                    }
                };
                report.bytes_written += bytes_written;
                report.segments_rebuilt += 1;
            }
        }
        progress(i as u64 + 1, total);
        pace.wrote(eng, bytes_written);
        if last_saved.elapsed() >= Duration::from_secs(1) {
            // Rebuilt data is durable before the progress that skips it.
            eng.log.array().sync_all()?;
            state.next_segment = s + 1;
            save_progress(eng, Some(state))?;
            last_saved = Instant::now();
        }
    }
    eng.flush()?;
    eng.log.array().sync_all()?;
    replacement_still_there(eng)?;
    eng.log.array().finish_rebuild(state.slot);
    save_progress(eng, None)?;
    report.seconds = start.elapsed().as_secs_f64();
    tracing::info!(
        "rebuilt {} of {} segments ({}) in {:.1} s",
        report.segments_rebuilt,
        report.segments_total,
        human_bytes(report.bytes_written),
        report.seconds
    );
    Ok(report)
}

/// `Err` once the replacement being rebuilt has failed: its slot is failed again, or the
/// healthy member it replaced took the slot back (see [`crate::array::Array::take_replacement_failure`]).
/// The pool metadata then records the members as they are and no rebuild, and the pool goes
/// on serving: a replacement that dies is not a reason to stop the pool.
fn replacement_still_there(eng: &Engine) -> Result<()> {
    let Some(what) = eng.log.array().take_replacement_failure() else {
        return Ok(());
    };
    save_progress(eng, None)?;
    eng.log.record_failure_change()?;
    Err(Error::ReplacementFailed(what))
}

/// Writes the rebuild's progress (`None`: done) into the pool metadata, with the rate limit
/// it runs at now.
fn save_progress(eng: &Engine, state: Option<RebuildState>) -> Result<()> {
    let mut meta = eng.log.meta().lock();
    let mut next = meta.clone();
    next.rebuild = state.map(|s| {
        crate::array::naming_outgoing(
            eng.log.array(),
            RebuildState {
                rate_bytes_per_sec: eng.rebuild_rate_bytes_per_sec.load(SeqCst),
                ..s
            },
        )
    });
    next.member_ids = eng.log.array().member_ids();
    next.failed_members = eng.log.array().failed_ids();
    eng.log.write_pool_meta(&mut next)?;
    *meta = next;
    Ok(())
}

impl Pool {
    /// The slot of a member named by its device name or by its slot number.
    fn slot_of(&self, member: &str) -> Result<u32> {
        let status = self.eng.log.array().member_status();
        if let Some(i) = status.iter().position(|m| m.name == member) {
            return Ok(i as u32);
        }
        match member.parse::<u32>() {
            Ok(i) if (i as usize) < status.len() => Ok(i),
            _ => {
                let names: Vec<String> = status.iter().enumerate().map(|(i, m)| format!("{i}: {}", m.name)).collect();
                Err(Error::InvalidArgument(format!(
                    "{member:?} is not a member of this pool (members: {})",
                    names.join(", ")
                )))
            }
        }
    }

    /// Replaces member `old` (its device name or slot number) with `new` and rebuilds it
    /// onto `new` while the pool serves; returns when the rebuild is done. `new` must not
    /// belong to this pool and must be at least as large as the slot needs. A healthy `old`
    /// serves its slot until then (see the module documentation).
    pub fn replace_member(
        &self,
        old: &str,
        new: Arc<dyn Device>,
        opts: RebuildOptions,
        progress: &dyn Fn(u64, u64),
    ) -> Result<RebuildReport> {
        self.eng.log.check_writable()?;
        let array = self.eng.log.array();
        if !self.eng.log.has_redundancy() {
            return Err(crate::array::no_redundancy_to_rebuild(array.kind()));
        }
        let slot = self.slot_of(old)?;
        let status = array.member_status();
        if status.iter().any(|m| m.rebuilding) && !status[slot as usize].rebuilding {
            return Err(Error::InvalidArgument(
                "another member is being rebuilt; wait for it to finish".into(),
            ));
        }
        let ids = array.member_ids();
        self.check_replacement(new.as_ref(), &ids, &status, opts.overwrite)?;
        // The new member's superblock: a healthy member's, with its own slot, id and layout.
        let template = (0..status.len())
            .filter(|i| *i != slot as usize && !status[*i].failed && !status[*i].rebuilding)
            .find_map(|i| read_superblock(array.members()[i].device.as_ref()).ok())
            .ok_or_else(|| Error::InvalidArgument("no healthy member left to copy the pool's description from".into()))?;
        let member_segment_bytes = template.array.member_segment_bytes(template.device_count, template.segment_bytes);
        let (layout, count) = DeviceLayout::plan(new.as_ref(), member_segment_bytes)?;
        if count < template.segment_count as u64 {
            return Err(Error::InvalidArgument(format!(
                "{} ({}) is too small: the slot needs {} segments of {} after a {} header",
                new.name(),
                human_bytes(new.size_bytes()),
                template.segment_count,
                human_bytes(member_segment_bytes),
                human_bytes(layout.segments_offset_bytes)
            )));
        }
        let mut ids = ids;
        let member_id = loop {
            let id = rand::thread_rng().gen::<u64>();
            if id != 0 && !ids.contains(&id) {
                break id;
            }
        };
        ids[slot as usize] = member_id;
        let sb = Superblock {
            format_version: FORMAT_VERSION,
            device_index: slot,
            device_size_bytes: new.size_bytes(),
            storage_type: new.storage_type(),
            layout,
            member_id,
            member_ids: ids,
            ..template
        };
        write_superblock(new.as_ref(), &sb)?;
        array.replace_member(slot, new.clone(), member_id, layout)?;
        let segments = live_segments(&self.eng, 0);
        // Segments allocated from here on are written whole, with the new member.
        self.eng.log.close_all_streams()?;
        // Records sealed before (queued for write-back, or being written) go to the listed
        // segments: every one must be on the members before those are rebuilt. One being
        // written while its segment was rebuilt was lost on the new member when the rebuild
        // read the old bytes before the write and wrote them over it after (or when its write
        // began before the new member took writes): 2 to 6 runs in 150 of
        // `a_member_killed_at_random_points_loses_nothing` read a page back damaged once the
        // other mirror was gone.
        self.eng.flush()?;
        let rate = opts.rate_bytes_per_sec.unwrap_or(0);
        self.eng.rebuild_rate_bytes_per_sec.store(rate, SeqCst);
        let state = RebuildState {
            slot,
            member_id,
            next_segment: 0,
            rate_bytes_per_sec: rate,
            outgoing_member_id: 0, // (save_progress names it)
        };
        save_progress(&self.eng, Some(state))?;
        tracing::info!(
            "rebuilding slot {slot} onto {}: {} of {} segments hold data",
            new.name(),
            segments.len(),
            self.eng.log.geo().total_segments
        );
        run_rebuild(&self.eng, state, segments, progress)
    }

    /// Refuses a replacement device that is already a healthy member of this pool, holds
    /// another pool, or holds data, unless `overwrite` (a member this pool replaced earlier
    /// holds nothing it needs).
    fn check_replacement(&self, new: &dyn Device, ids: &[u64], status: &[crate::array::MemberStatus], overwrite: bool) -> Result<()> {
        // A healthy member of this pool, whatever name it is given by.
        let in_service = |id: u64| ids.iter().zip(status).any(|(i, m)| *i == id && !m.failed);
        match read_superblock(new) {
            Ok(sb) if sb.pool_id == self.pool_id() && (status.iter().any(|m| m.name == new.name()) || in_service(sb.member_id)) => {
                return Err(Error::InvalidArgument(format!("{} is already a member of this pool", new.name())));
            }
            // A member this pool replaced earlier holds nothing it needs.
            Ok(sb) if sb.pool_id == self.pool_id() || overwrite => {}
            Ok(sb) => {
                return Err(Error::InvalidArgument(format!(
                    "{} holds SALSA pool {:032x}; to overwrite it, give --force",
                    new.name(),
                    sb.pool_id
                )))
            }
            Err(_) if overwrite || device_is_blank(new)? => {}
            Err(_) => {
                return Err(Error::InvalidArgument(format!(
                    "{} holds data (its first MiB is not blank); to overwrite it, give --force",
                    new.name()
                )))
            }
        }
        Ok(())
    }

    /// Resumes a rebuild that an earlier session left unfinished (in the background).
    pub(crate) fn resume_rebuild(&self) -> Result<()> {
        let Some(state) = self.eng.log.meta().lock().rebuild else {
            return Ok(());
        };
        if !self
            .eng
            .log
            .array()
            .member_status()
            .get(state.slot as usize)
            .is_some_and(|m| m.rebuilding)
        {
            tracing::warn!(
                "the rebuild of slot {} cannot resume: its new member is not here; replace it again",
                state.slot
            );
            return Ok(());
        }
        let eng = self.eng.clone();
        let segments = live_segments(&eng, state.next_segment);
        eng.rebuild_rate_bytes_per_sec.store(state.rate_bytes_per_sec, SeqCst);
        let limit = match state.rate_bytes_per_sec {
            0 => String::new(),
            rate => format!(", at most {}/s", human_bytes(rate)),
        };
        tracing::info!(
            "resuming the rebuild of slot {} at segment {}{limit}",
            state.slot,
            state.next_segment
        );
        let h = std::thread::Builder::new()
            .name("salsa-rebuild".into())
            .spawn(move || {
                match run_rebuild(&eng, state, segments, &|_, _| {}) {
                    // Stopped by the close (or a server's stop): it resumes at the next open.
                    Err(e) if stop_requested(&eng) => tracing::info!("rebuild of slot {}: {e}", state.slot),
                    Err(e) => tracing::error!("rebuild of slot {} failed: {e}", state.slot),
                    Ok(_) => {}
                }
            })
            .map_err(|e| Error::InvalidConfig(format!("cannot start the rebuild thread: {e}")))?;
        self.gc_threads.lock().push(h);
        Ok(())
    }

    /// Changes the rate limit of the rebuild in progress (`None`: no limit), at once and in
    /// the pool metadata, so that the rebuild keeps it when it resumes at the next open.
    /// Refused when no rebuild is in progress.
    pub fn set_rebuild_rate(&self, rate_bytes_per_sec: Option<u64>) -> Result<()> {
        self.eng.log.check_writable()?;
        // Under the metadata lock, as the rebuild saves its progress: what it saves next
        // carries the new rate, and its end (no progress left) cannot slip in between.
        let mut meta = self.eng.log.meta().lock();
        let Some(state) = meta.rebuild else {
            return Err(Error::InvalidArgument("no rebuild is in progress".into()));
        };
        let rate = rate_bytes_per_sec.unwrap_or(0);
        let mut next = meta.clone();
        next.rebuild = Some(crate::array::naming_outgoing(
            self.eng.log.array(),
            RebuildState {
                rate_bytes_per_sec: rate,
                ..state
            },
        ));
        self.eng.log.write_pool_meta(&mut next)?;
        *meta = next;
        self.eng.rebuild_rate_bytes_per_sec.store(rate, SeqCst);
        Ok(())
    }

    /// Marks member `member` (its device name or slot number) failed, as a dying disk would
    /// be: it is no longer used, and the pool metadata records it before this returns. Refused
    /// when the array would lose data.
    pub fn fail_member(&self, member: &str) -> Result<()> {
        self.eng.log.check_writable()?;
        let slot = self.slot_of(member)?;
        self.eng.log.array().fail_member(slot)?;
        self.eng.flush()?;
        // An idle pool's flush syncs nothing: the failure is recorded here either way.
        self.eng.log.record_failure_change()
    }

    /// Asks long background jobs (a rebuild) to stop at their next step; a rebuild stopped
    /// this way resumes at the next open. The pool still serves, and its GC still runs, until
    /// it is closed: the close writes the write buffer down, which may need the GC's room.
    pub fn begin_shutdown(&self) {
        self.eng.stopping_long_jobs.store(true, SeqCst);
    }

    /// Whether a member is being rebuilt.
    pub fn rebuild_in_progress(&self) -> bool {
        self.eng.log.array().member_status().iter().any(|m| m.rebuilding)
    }
}
