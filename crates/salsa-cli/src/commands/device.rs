//! `salsa device fail`, `salsa device replace` and `salsa device rebuild-rate`: take a member
//! out, replace a member of a redundant pool and rebuild it, and change the running rebuild's
//! rate limit; offline (the command opens the pool itself) or online (through the running
//! server's control socket, while it serves), with a progress bar and an optional rate limit.
//! The control socket they use online is [`crate::control`].

use crate::control::{open_offline, request, running_server};
use crate::*;
use std::io::{BufRead, BufReader, Write};

/// Offline or online replacement of member `old` by `new`.
pub(crate) fn replace(
    devices: &[DeviceSpec],
    parity_buffer: Option<&DeviceSpec>,
    control: Option<&std::path::Path>,
    old: &str,
    new: &DeviceSpec,
    opts: salsa_core::RebuildOptions,
) -> Result<(), String> {
    if let Some(path) = running_server(devices, control) {
        return replace_online(&path, old, new, opts);
    }
    let pool = open_offline(devices, parity_buffer)?;
    let report = replace_with(&pool, old, new, opts, &progress_bar("rebuild"))?;
    print_report(&report_json(&report));
    pool.close().map_err(|e| e.to_string())
}

/// Opens `new` (creating it when a size is given) and replaces member `old` of `pool` with
/// it, offline or in the server. A file this created is removed again when the pool did not
/// take it; a member of the pool (by any path) is refused before it is opened, which would
/// find it locked by the pool itself.
pub(crate) fn replace_with(
    pool: &Pool,
    old: &str,
    new: &DeviceSpec,
    opts: salsa_core::RebuildOptions,
    progress: &dyn Fn(u64, u64),
) -> Result<salsa_core::RebuildReport, String> {
    use salsa_core::spec::file_id;
    if let Some(id) = file_id(&new.path) {
        let members = pool.members();
        if let Some((slot, m)) = members.iter().enumerate().find(|(_, m)| file_id(m.name.as_ref()) == Some(id)) {
            let hint = if m.failed {
                "; to rebuild a failed member onto itself, open the pool without it (leave it out of --device) and replace the missing slot"
            } else {
                ""
            };
            return Err(format!(
                "{} is already member {slot} of this pool ({}){hint}",
                new.path.display(),
                m.name
            ));
        }
    }
    let created = super::files_to_create::FilesToCreate::of(std::slice::from_ref(new), None);
    let dev = new.open(false)?;
    let name = dev.name().to_string();
    pool.replace_member(old, dev, opts, progress).map_err(|e| {
        let e = e.to_string();
        if pool.members().iter().any(|m| m.name == name) {
            e // the pool took it: it holds part of the rebuild
        } else {
            created.remove(e)
        }
    })
}

/// The report as JSON (the control socket's `ok` line).
pub(crate) fn report_json(r: &salsa_core::RebuildReport) -> serde_json::Value {
    serde_json::json!({
        "segments_rebuilt": r.segments_rebuilt,
        "segments_total": r.segments_total,
        "bytes_written": r.bytes_written,
        "seconds": r.seconds,
    })
}

fn print_report(v: &serde_json::Value) {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let secs = v["seconds"].as_f64().unwrap_or(0.0);
    println!(
        "rebuilt {} of {} segments ({}) in {secs:.1} s ({}/s); a whole-device resync would have rewritten all {}",
        n("segments_rebuilt"),
        n("segments_total"),
        human(n("bytes_written")),
        human((n("bytes_written") as f64 / secs.max(1e-9)) as u64),
        n("segments_total")
    );
}

fn replace_online(control: &std::path::Path, old: &str, new: &DeviceSpec, opts: salsa_core::RebuildOptions) -> Result<(), String> {
    let mut s = std::os::unix::net::UnixStream::connect(control).map_err(|e| format!("{}: {e}", control.display()))?;
    // The server resolves a relative path in its own directory, not in ours.
    let path = std::path::absolute(&new.path).unwrap_or_else(|_| new.path.clone());
    let spec = match new.size_bytes {
        Some(b) => format!("{}:{b}", path.display()),
        None => path.display().to_string(),
    };
    if old.contains(char::is_whitespace) || spec.contains(char::is_whitespace) {
        return Err("member names and paths with spaces cannot go through the control socket; replace offline".into());
    }
    let force = if opts.overwrite { " force" } else { "" };
    writeln!(s, "replace {old} {spec} {}{force}", opts.rate_bytes_per_sec.unwrap_or(0)).map_err(|e| e.to_string())?;
    let bar = progress_bar("rebuild");
    for line in BufReader::new(s).lines() {
        let line = line.map_err(|e| e.to_string())?;
        if let Some(rest) = line.strip_prefix("progress ") {
            let mut it = rest.split_whitespace().map(|x| x.parse::<u64>().unwrap_or(0));
            bar(it.next().unwrap_or(0), it.next().unwrap_or(0));
        } else if let Some(rest) = line.strip_prefix("ok ") {
            print_report(&serde_json::from_str(rest).unwrap_or_default());
            return Ok(());
        } else if let Some(rest) = line.strip_prefix("error ") {
            return Err(rest.to_string());
        }
    }
    Err("the server closed the control connection before the rebuild finished".into())
}

/// Offline or online: marks member `member` failed.
pub(crate) fn fail(
    devices: &[DeviceSpec],
    parity_buffer: Option<&DeviceSpec>,
    control: Option<&std::path::Path>,
    member: &str,
) -> Result<(), String> {
    let online = running_server(devices, control);
    let back = if let Some(path) = &online {
        let answer = request(path, &format!("fail {member}"))?;
        let json: serde_json::Value = serde_json::from_str(answer.strip_prefix("ok ").unwrap_or_default()).unwrap_or_default();
        json["serves_again"].as_str().map(str::to_string)
    } else {
        let pool = open_offline(devices, parity_buffer)?;
        let back = fail_member(&pool, member)?;
        pool.close().map_err(|e| e.to_string())?;
        back
    };
    match back {
        Some(old) => println!(
            "replacement {member} marked failed; {old}, which it was to replace, serves its slot again (the pool keeps its redundancy)"
        ),
        None => {
            let pool = pool_arguments(devices, parity_buffer, control, online.is_some());
            println!("member {member} marked failed; replace it with: salsa device replace{pool} {member} NEW");
        }
    }
    Ok(())
}

/// Fails member `member` of `pool` (its name or slot number) and says what became of its slot:
/// `None` when it is failed, or the name of the member that took it back (`member` was the
/// replacement of a healthy member, which serves the slot again).
pub(crate) fn fail_member(pool: &salsa_core::Pool, member: &str) -> Result<Option<String>, String> {
    let before = pool.members();
    let slot = before.iter().position(|m| m.name == member).or_else(|| member.parse().ok());
    pool.fail_member(member).map_err(|e| e.to_string())?;
    let after = pool.members();
    let name = |list: &[salsa_core::MemberStatus]| slot.and_then(|s| list.get(s)).map(|m| m.name.clone());
    Ok(name(&after).filter(|now| Some(now) != name(&before).as_ref()))
}

/// The arguments that name the pool the way the user named it, for a command line the user
/// can run next: the server's control socket (or the first device, which finds it) when the
/// pool is served, else every device and the parity buffer.
fn pool_arguments(devices: &[DeviceSpec], parity_buffer: Option<&DeviceSpec>, control: Option<&std::path::Path>, online: bool) -> String {
    match (online, control) {
        (true, Some(c)) => format!(" --control {}", c.display()),
        (true, None) => devices.first().map(|d| format!(" -d {}", d.path.display())).unwrap_or_default(),
        (false, _) => {
            let mut args: String = devices.iter().map(|d| format!(" -d {}", d.path.display())).collect();
            if let Some(pb) = parity_buffer {
                args.push_str(&format!(" --parity-buffer {}", pb.path.display()));
            }
            args
        }
    }
}

/// Offline only: gives the pool on `devices` the parity buffer `new` (`None`: none), the old
/// one read from `old` or, not given, taken as lost.
pub(crate) fn set_parity_buffer(
    devices: &[DeviceSpec],
    old: Option<&DeviceSpec>,
    control: Option<&std::path::Path>,
    new: Option<&DeviceSpec>,
    force: bool,
) -> Result<(), String> {
    if running_server(devices, control).is_some() {
        return Err("the pool is being served: stop the server first (the change closes the pool cleanly)".into());
    }
    if devices.is_empty() {
        return Err("give the pool's devices (--device)".into());
    }
    salsa_core::spec::check_distinct(devices.iter().chain(old).chain(new))?;
    // A NEW that is there is judged before the pool opens (an open without the old buffer
    // records at once that it is gone).
    let existing = match new.filter(|s| !s.is_missing()) {
        Some(spec) => {
            let device = spec.open(false)?;
            super::admin::check_blank(std::slice::from_ref(&device), force)?;
            Some(device)
        }
        None => None,
    };
    let devs = open_present(devices, |d| d.open_existing(false))?;
    let mut opts = with_parity_buffer(rw_options(), old, None)?;
    opts.parity_buffer_lost = old.is_none();
    let pool = Pool::open(devs, &opts).map_err(|e| e.to_string())?;
    let Some(default_bytes) = pool.default_parity_buffer_bytes() else {
        pool.close().map_err(|e| e.to_string())?;
        return Err("a parity buffer keeps RAID-5 parity; this pool is not RAID-5".into());
    };
    let created = super::files_to_create::FilesToCreate::of(&[], new);
    let new_device = match (new, existing) {
        (_, Some(device)) => Some(device),
        (None, None) => None,
        (Some(spec), None) => {
            let mut spec = spec.clone();
            spec.size_bytes = spec.size_bytes.or(Some(default_bytes));
            Some(spec.open(false).map_err(|e| created.remove(e))?)
        }
    };
    let name = new_device.as_ref().map(|d| d.name().to_string());
    match pool.change_parity_buffer(new_device).map_err(|e| created.remove(e.to_string()))? {
        Some(id) => println!(
            "the pool's parity buffer is now {} (id {id:016x}): a flush keeps a partial row's parity there",
            name.unwrap_or_default()
        ),
        None => println!("the pool has no parity buffer now: a flush pads the log to a whole row"),
    }
    Ok(())
}

/// Offline or online: changes the rate limit of the rebuild in progress (`None`: no limit).
/// Offline, the pool opens (resuming its rebuild in the background for as long as it is
/// open) and keeps the new limit for the next open.
pub(crate) fn set_rebuild_rate(
    devices: &[DeviceSpec],
    parity_buffer: Option<&DeviceSpec>,
    control: Option<&std::path::Path>,
    rate: Option<u64>,
) -> Result<(), String> {
    if let Some(path) = running_server(devices, control) {
        request(&path, &format!("rebuild-rate {}", rate.unwrap_or(0)))?;
    } else {
        let pool = open_offline(devices, parity_buffer)?;
        pool.set_rebuild_rate(rate).map_err(|e| e.to_string())?;
        pool.close().map_err(|e| e.to_string())?;
    }
    match rate {
        Some(r) => println!("the rebuild now writes at most {}/s", human(r)),
        None => println!("the rebuild now runs without a rate limit"),
    }
    Ok(())
}
