//! `salsa serve --on-event CMD`: runs a command when a member of the pool changes state (it
//! fails, or is missing at the start; its replacement is being rebuilt; it is in service
//! again), as `mdadm --monitor --program` and ZFS's event daemon do, so that an operator is
//! told without watching the log.
//!
//! Owns: one thread that compares the members' states with what it saw last, every
//! [`POLL_INTERVAL`], and the commands it started. Invariants: a change is reported once, in
//! slot order, also for members already failed when the server starts (seen against `ok`); at
//! most [`RUNNING_MAX`] commands run at once, and a change seen while that many run is logged
//! and not run (a command that hangs cannot pile up processes); a command that cannot start
//! or fails is logged, and the server serves on.
//!
//! The command runs with `sh -c`, its output in the server's log, and these variables:
//! `SALSA_EVENT` (`member-failed`, `member-rebuilding` or `member-ok`), `SALSA_SLOT`,
//! `SALSA_MEMBER` (the member's device), `SALSA_STATE` and `SALSA_PREVIOUS_STATE` (`ok`,
//! `failed` or `rebuilding`), `SALSA_ARRAY` (the array's description). A RAID-5 parity
//! buffer that goes out of service is reported once too, as `parity-buffer-failed` with
//! `SALSA_MEMBER` the buffer's device, `SALSA_STATE` `failed`, `SALSA_PREVIOUS_STATE` `ok` and
//! `SALSA_REASON` what failed (no `SALSA_SLOT`).

use salsa_core::Pool;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

/// How often the members' states are compared.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// Most event commands running at once.
pub(crate) const RUNNING_MAX: usize = 4;

/// One member's change of state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemberEvent {
    pub(crate) slot: usize,
    pub(crate) member: String,
    pub(crate) previous: &'static str,
    pub(crate) state: &'static str,
}

impl MemberEvent {
    pub(crate) fn name(&self) -> String {
        format!("member-{}", self.state)
    }
}

/// The changes from `before` to `now` (each a member's device and state, by slot), in slot
/// order. A slot `before` does not have counts as `ok`.
pub(crate) fn changes(before: &[(String, &'static str)], now: &[(String, &'static str)]) -> Vec<MemberEvent> {
    now.iter()
        .enumerate()
        .filter_map(|(slot, (member, state))| {
            let previous = before.get(slot).map_or("ok", |(_, s)| *s);
            (previous != *state).then(|| MemberEvent {
                slot,
                member: member.clone(),
                previous,
                state,
            })
        })
        .collect()
}

fn member_states(pool: &Pool) -> Vec<(String, &'static str)> {
    pool.members().iter().map(|m| (m.name.clone(), m.state())).collect()
}

/// Runs until `stop`: reports every change of a member's state with `command`.
pub(crate) fn events_thread(pool: Arc<Pool>, command: String, stop: Arc<AtomicBool>) {
    let array = pool.array_description();
    let mut seen: Vec<(String, &'static str)> = Vec::new();
    let mut running: Vec<Child> = Vec::new();
    let mut buffer_reported = false;
    while !stop.load(SeqCst) {
        running.retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_)) | Err(_)));
        let now = member_states(&pool);
        for e in changes(&seen, &now) {
            eprintln!("salsa: member {} ({}): {} -> {}", e.slot, e.member, e.previous, e.state);
            let vars = [
                ("SALSA_EVENT", e.name()),
                ("SALSA_SLOT", e.slot.to_string()),
                ("SALSA_MEMBER", e.member.clone()),
                ("SALSA_STATE", e.state.to_string()),
                ("SALSA_PREVIOUS_STATE", e.previous.to_string()),
                ("SALSA_ARRAY", array.clone()),
            ];
            run_event(&command, &mut running, &format!("{} of member {}", e.name(), e.slot), &vars);
        }
        seen = now;
        if let Some(b) = pool.parity_buffer().filter(|b| b.failed.is_some() && !buffer_reported) {
            buffer_reported = true;
            let why = b.failed.unwrap_or_default();
            eprintln!("salsa: parity buffer {}: ok -> failed ({why})", b.name);
            let vars = [
                ("SALSA_EVENT", "parity-buffer-failed".to_string()),
                ("SALSA_MEMBER", b.name.clone()),
                ("SALSA_STATE", "failed".to_string()),
                ("SALSA_PREVIOUS_STATE", "ok".to_string()),
                ("SALSA_REASON", why),
                ("SALSA_ARRAY", pool.array_description()),
            ];
            run_event(&command, &mut running, "parity-buffer-failed", &vars);
        }
        std::thread::sleep(POLL_INTERVAL);
    }
    // Commands still running finish on their own.
}

/// Starts `command` for one event with `vars` in its environment, unless [`RUNNING_MAX`]
/// commands still run (then the event, `what`, is logged as not reported).
fn run_event(command: &str, running: &mut Vec<Child>, what: &str, vars: &[(&str, String)]) {
    if running.len() >= RUNNING_MAX {
        eprintln!("salsa: {RUNNING_MAX} event commands still run; {what} not reported");
        return;
    }
    let child = Command::new("sh")
        .args(["-c", command])
        .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(std::process::Stdio::null())
        .spawn();
    match child {
        Ok(c) => running.push(c),
        Err(err) => eprintln!("salsa: cannot run the event command for {what}: {err}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn states(list: &[(&str, &'static str)]) -> Vec<(String, &'static str)> {
        list.iter().map(|(n, s)| (n.to_string(), *s)).collect()
    }

    #[test]
    fn each_change_is_reported_once_and_a_failed_start_counts() {
        let start = states(&[("a", "ok"), ("b", "failed"), ("c", "ok")]);
        let first = changes(&[], &start);
        assert_eq!(first.len(), 1, "{first:?}");
        assert_eq!(
            (first[0].slot, first[0].name(), first[0].previous),
            (1, "member-failed".into(), "ok")
        );
        assert!(changes(&start, &start).is_empty());
        let rebuilding = states(&[("a", "ok"), ("d", "rebuilding"), ("c", "failed")]);
        let e = changes(&start, &rebuilding);
        let got: Vec<(usize, String, &str)> = e.iter().map(|e| (e.slot, e.name(), e.member.as_str())).collect();
        assert_eq!(got, vec![(1, "member-rebuilding".into(), "d"), (2, "member-failed".into(), "c")]);
        let e = changes(&rebuilding, &states(&[("a", "ok"), ("d", "ok"), ("c", "failed")]));
        assert_eq!((e.len(), e[0].name(), e[0].previous), (1, "member-ok".into(), "rebuilding"));
    }
}
