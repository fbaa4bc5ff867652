//! `salsa serve --hot-spare DEV`: hot spares of a redundant pool. When a member fails, the
//! server rebuilds it onto the next spare at once, without being asked, as MD's and ZFS's
//! spares do; the rebuild is the one `salsa device replace` runs (only the segments in use,
//! while the pool serves, resumed at the next start if the server stops first).
//!
//! Owns: the spares not used yet, checked at start ([`check_spares`]: each blank or a file
//! still to be created, none a member or named twice) and one thread that looks at the
//! members' states every [`POLL_INTERVAL`]. Invariants: one rebuild at a time (a member that
//! fails while another is rebuilt waits for the next turn); a spare the pool refused is
//! logged and not tried again; the thread ends when every spare is used, or when the server
//! stops, after the pool's rebuild has stopped (the server calls `begin_shutdown` before it
//! joins it).

use crate::*;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::Duration;

/// How often the members' states are looked at.
const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Refuses, before the pool opens, spares that cannot serve: one that holds data or a pool,
/// and a missing file without a size ([`check_layout`] judges the pool once it is open).
pub(crate) fn check_spares(spares: &[DeviceSpec]) -> Result<(), String> {
    for s in spares {
        if s.is_missing() {
            if s.size_bytes.is_none() {
                return Err(format!(
                    "hot spare {}: no such file; give a size (PATH:SIZE) to have it created when it is needed",
                    s.path.display()
                ));
            }
            continue;
        }
        let device = s.open_existing(true)?;
        super::admin::check_blank(std::slice::from_ref(&device), false).map_err(|e| format!("hot spare {e}"))?;
    }
    Ok(())
}

/// Refuses hot spares for a pool whose layout has no redundancy to rebuild from.
pub(crate) fn check_layout(pool: &Pool) -> Result<(), String> {
    match pool.array_layout() {
        "raid1" | "raid5" => Ok(()),
        other => Err(format!(
            "hot spares serve a redundant pool (raid1, raid5); this pool is {other}: a failed member cannot be rebuilt"
        )),
    }
}

/// Runs until `stop`, or until every spare is used: rebuilds each member that fails onto the
/// next of `spares`.
pub(crate) fn spares_thread(pool: Arc<Pool>, spares: Vec<DeviceSpec>, stop: Arc<AtomicBool>) {
    let mut left = spares.into_iter();
    let mut next = left.next();
    while let (Some(spare), false) = (next.as_ref(), stop.load(SeqCst)) {
        let members = pool.members();
        let rebuilding = members.iter().any(|m| m.rebuilding);
        let failed = members.iter().position(|m| m.failed);
        if let (Some(slot), false) = (failed, rebuilding) {
            eprintln!(
                "salsa: member {slot} ({}) failed: rebuilding it onto hot spare {}",
                members[slot].name,
                spare.path.display()
            );
            let result = super::device::replace_with(&pool, &slot.to_string(), spare, salsa_core::RebuildOptions::default(), &|_, _| {});
            match result {
                Ok(r) => eprintln!(
                    "salsa: hot spare {} is member {slot} now: rebuilt {} of {} segments",
                    spare.path.display(),
                    r.segments_rebuilt,
                    r.segments_total
                ),
                // Stopped by the server's stop: it resumes at the next start.
                Err(_) if stop.load(SeqCst) => break,
                Err(e) => eprintln!("salsa: hot spare {} not used: {e}", spare.path.display()),
            }
            next = left.next();
            continue;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}
