//! Offline pool administration: `salsa format`, `info` and `check` (`salsa volume` is in
//! [`super::volume`]).

use crate::*;

/// Refuses devices that hold anything, unless forced.
pub(crate) fn check_blank(devs: &[Arc<dyn salsa_core::Device>], force: bool) -> Result<(), String> {
    if force {
        return Ok(());
    }
    for d in devs {
        if salsa_core::pool::read_superblock(d.as_ref()).is_ok() {
            return Err(format!("{} already holds a SALSA pool; use --force to overwrite it", d.name()));
        }
        if !salsa_core::pool::device_is_blank(d.as_ref()).map_err(|e| e.to_string())? {
            return Err(format!(
                "{} holds data (its first MiB is not all zeros); use --force to overwrite it",
                d.name()
            ));
        }
    }
    Ok(())
}

pub(crate) fn format_pool(devices: &Devices, f: &FormatArgs, force: bool, default_volume: bool) -> Result<(), String> {
    // Files this format creates are removed again if it fails.
    let created = super::files_to_create::FilesToCreate::of(&devices.devices, devices.parity_buffer.as_ref());
    let pool = create_pool(devices, f, force).map_err(|e| created.remove(e))?;
    if default_volume {
        let size = f.create_default_volume(&pool)?;
        println!("created volume default: {}", human(size));
    }
    println!("formatted pool {:032x}", pool.pool_id());
    pool.close().map_err(|e| e.to_string())
}

/// The new pool on `devices`, refused on devices that hold data unless `force`.
fn create_pool(devices: &Devices, f: &FormatArgs, force: bool) -> Result<Pool, String> {
    let cfg = f.pool_config()?;
    let devs = devices.open(false)?;
    check_blank(&devs, force)?;
    let opts = with_parity_buffer(rw_options(), devices.parity_buffer.as_ref(), Some((&cfg, devs.len())))?;
    Pool::create(devs, &cfg, &opts).map_err(|e| e.to_string())
}

pub(crate) fn info(devices: &Devices) -> Result<(), String> {
    let pool = devices.open_pool(ro_options())?;
    let st = pool.stats();
    println!("pool        {:032x}", pool.pool_id());
    for d in &devices.devices {
        let gone = if d.is_missing() { " (does not exist)" } else { "" };
        println!("device      {}{gone}", d.path.display());
    }
    println!("array       {}", pool.array_description());
    print_members(&st);
    print_space(&pool, &st);
    println!("volumes     {}", st.volumes.len());
    for v in &st.volumes {
        print_volume(v);
        if v.controller == "amf" {
            print_file_store(&pool, &v.name);
        }
    }
    Ok(())
}

/// The file store on an AMF volume (the RocksDB plugin's), per file kind, when it holds one.
fn print_file_store(pool: &salsa_core::Pool, name: &str) {
    let Ok(volume) = pool.volume(name) else { return };
    match salsa_files::inspect(&volume) {
        Ok(Some(fs)) => {
            let kinds: Vec<String> = fs
                .kinds
                .iter()
                .map(|(kind, k)| {
                    format!(
                        "{} {} files {} in {} segments ({} trimmed)",
                        kind.name(),
                        k.files,
                        human(k.bytes),
                        k.segments,
                        k.segments_trimmed
                    )
                })
                .collect();
            println!("  {:<20}      file store: {}", "", kinds.join("; "));
        }
        Ok(None) => {}
        Err(e) => println!("  {:<20}      file store: unreadable ({e})", ""),
    }
}

/// Each member of the array with its state and counters, and a rebuild in progress.
fn print_members(st: &salsa_core::Stats) {
    for (i, m) in st.members.iter().enumerate() {
        // What needs attention in capitals.
        let state = match m.state() {
            "ok" => "ok".to_string(),
            other => other.to_uppercase(),
        };
        println!(
            "  member {i:<3} {state:<10} {} ({})  read {}  written {} (parity {})  errors {}r/{}w  damaged {}  repaired {}",
            m.name,
            m.storage_type,
            human(m.bytes_read),
            human(m.bytes_written),
            human(m.parity_bytes_written),
            m.read_errors,
            m.write_errors,
            human(m.damaged_bytes),
            human(m.repaired_bytes)
        );
        if let Some(out) = &m.outgoing {
            println!("             {out} still serves the slot until the rebuild ends");
        }
    }
    if let Some(r) = st.rebuild {
        println!(
            "rebuild     slot {}: {} of {} segments passed, {}; it resumes when the pool opens for writing",
            r.slot,
            r.next_segment,
            r.total_segments,
            rate_limit_text(r.rate_bytes_per_sec)
        );
    }
}

/// The pool's size, segments, free space, spare and logical capacity, and its policies.
fn print_space(pool: &Pool, st: &salsa_core::Stats) {
    let g = pool.geometry();
    println!("physical    {}", human(g.total_grains * g.grain_bytes as u64));
    println!(
        "segments    {} x {} (grain {})",
        g.total_segments,
        human(g.segment_bytes),
        human(g.grain_bytes as u64)
    );
    println!(
        "free        {} segments ({})",
        st.free_segments,
        human(st.free_segments as u64 * g.segment_bytes)
    );
    println!("spare       {}%", pool.spare_percent());
    println!(
        "logical     {} ({} bytes: what a volume of the default placement can hold beside the spare)",
        human(pool.logical_capacity_bytes()),
        pool.logical_capacity_bytes()
    );
    println!("victim      {}", pool.victim_policy());
    println!("placement   {} (default for new volumes)", pool.default_placement());
    println!("opened from {:?}", pool.opened_from());
}

/// One volume with its settings, and what its controller adds.
fn print_volume(v: &salsa_core::VolumeStats) {
    println!(
        "  {:<20} {:<6} size {:>10}  page {:>6}  mapped {:>10}  map {:>9}  storage {}  placement {} ({})  victim {}",
        v.name,
        v.controller,
        human(v.size_bytes),
        human(v.page_bytes as u64),
        human(v.mapped_bytes),
        human(v.map_memory_bytes),
        v.storage,
        v.placement,
        human(v.placement_memory_bytes),
        v.victim
    );
    if v.compression.is_on() {
        println!(
            "  {:<20}      compression {}: {} stored for {} mapped ({:.2}x)",
            "",
            v.compression,
            human(v.stored_bytes),
            human(v.mapped_bytes),
            v.mapped_bytes as f64 / v.stored_bytes.max(1) as f64
        );
    }
    if v.controller == "amf" {
        println!(
            "  {:<20}      append-only segments of {}: {} of {} written, {} full; map of {} runs",
            "",
            human(v.settings.iter().find(|(k, _)| k == "segment_bytes").map_or(0, |s| s.1)),
            v.amf_segments_written,
            v.amf_segments,
            v.amf_segments_full,
            v.map_runs
        );
    }
    if v.controller == "dual" {
        println!(
            "  {:<20}      sparse map {} of {} small pages, {} large pages merged",
            "", v.sparse_pages, v.sparse_capacity_pages, v.merged_pages
        );
    }
    if v.controller == "hybrid" {
        println!(
            "  {:<20}      fast tier {} in {} segments{}, {} promoted, {} demoted, read {} fast / {} slow",
            "",
            human(v.fast_tier_bytes),
            v.fast_tier_segments,
            if v.fast_tier_failed {
                " (FAILED: reads go to the slow tier)"
            } else {
                ""
            },
            v.promotions,
            v.demotions,
            human(v.fast_read_bytes),
            human(v.slow_read_bytes)
        );
    }
}

/// `salsa check --scrub`: compares the array's redundancy with the data, and with `repair`
/// rewrites what disagrees; false when something disagreed and was not repaired. Through the
/// running server when one answers (the pool keeps serving), else offline.
pub(crate) fn scrub_pool(devices: &Devices, repair: bool) -> Result<bool, String> {
    let line = if repair { "scrub repair" } else { "scrub" };
    if let Some(control) = crate::control::running_server(&devices.devices, None) {
        let answer = crate::control::request(&control, line)?;
        let v: serde_json::Value = serde_json::from_str(&answer).map_err(|e| format!("the server answered {answer:?}: {e}"))?;
        return Ok(print_scrub(&v, repair));
    }
    let opts = if repair { rw_options() } else { ro_options() };
    let pool = devices.open_pool(opts)?;
    let clean = print_scrub(&scrub_json(&pool, repair)?, repair);
    if repair {
        pool.close().map_err(|e| e.to_string())?;
    }
    Ok(clean)
}

/// Scrubs `pool` (see [`scrub_pool`]); the report as JSON, as the control socket's `scrub`
/// answers it.
pub(crate) fn scrub_json(pool: &Pool, repair: bool) -> Result<serde_json::Value, String> {
    let before = pool.members();
    let r = pool.scrub(repair).map_err(|e| e.to_string())?;
    // Also what the chain walks rebuilt and rewrote on the way (damaged metadata pages): this
    // scrub's part of each member's count (a server's counts run since it opened the pool).
    let rewritten: Vec<serde_json::Value> = pool
        .members()
        .iter()
        .zip(&before)
        .map(|(m, b)| (m, m.repaired_bytes.saturating_sub(b.repaired_bytes)))
        .filter(|(_, bytes)| *bytes > 0)
        .map(|(m, bytes)| serde_json::json!({"name": m.name, "repaired_bytes": bytes}))
        .collect();
    Ok(serde_json::json!({
        "segments": r.segments, "rows_checked": r.rows_checked,
        "rows_mismatched": r.rows_mismatched, "rows_repaired": r.rows_repaired,
        "pages_damaged": r.pages_damaged, "pages_repairable": r.pages_repairable,
        "pages_repaired": r.pages_repaired, "array": pool.array_description(),
        "redundant": pool.has_redundancy(),
        "members_repaired": rewritten,
    }))
}

/// Prints a scrub's report ([`scrub_json`]); whether everything that disagreed was repaired.
fn print_scrub(v: &serde_json::Value, repair: bool) -> bool {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    if v["redundant"] == false {
        // A scrub that compares nothing says so rather than report zeros as if it verified.
        println!(
            "scrub: nothing to compare: the array ({}) keeps no redundancy (no parity, no second copy of the data); its pages are verified by their checksums only",
            v["array"].as_str().unwrap_or("?")
        );
        return true;
    }
    println!(
        "scrub: {} segments in use, {} rows compared, {} disagreed with their data, {} repaired ({})",
        n("segments"),
        n("rows_checked"),
        n("rows_mismatched"),
        n("rows_repaired"),
        v["array"].as_str().unwrap_or("?")
    );
    if n("pages_damaged") > 0 {
        println!(
            "scrub: pages failing their checksum on a member: {}, of which {} readable from the redundancy, {} rewritten{}",
            n("pages_damaged"),
            n("pages_repairable"),
            n("pages_repaired"),
            if repair {
                ""
            } else {
                " (`salsa check --scrub --repair` rewrites them)"
            }
        );
    }
    for m in v["members_repaired"].as_array().into_iter().flatten() {
        println!(
            "scrub: member {}: {} rewritten from the redundancy",
            m["name"].as_str().unwrap_or("?"),
            human(m["repaired_bytes"].as_u64().unwrap_or(0))
        );
    }
    n("rows_mismatched") == n("rows_repaired")
}

/// What `salsa check` found.
pub(crate) struct CheckOutcome {
    /// Pages unreadable or mapped differently, and other damage no redundancy covers.
    pub problems: u64,
    /// Bytes that failed their checksum on one member and were read from the redundancy
    /// instead: the data is intact, the member is not (check writes nothing).
    pub repairable_bytes: u64,
}

/// A page found damaged: its volume, its number and the grain it was read from.
type DamagedPage = (String, u64, Option<u64>);

/// What the first open of `salsa check` saw: every page's location as a server would open the
/// pool (the checkpoint after a clean shutdown), the pages that failed their checksum, and the
/// members' counters after reading every mapped page.
struct OpenView {
    locations: std::collections::HashMap<String, Vec<Option<u64>>>,
    damaged: std::collections::HashSet<DamagedPage>,
    members: Vec<salsa_core::MemberStatus>,
}

/// Opens the pool as a server would and reads every mapped page, reporting each that fails.
fn read_open_view(devices: &Devices) -> Result<OpenView, String> {
    let normal = devices.open_pool(ro_options())?;
    let mut view = OpenView {
        locations: std::collections::HashMap::new(),
        damaged: std::collections::HashSet::new(),
        members: Vec::new(),
    };
    for name in normal.volume_names() {
        let v = normal.volume(&name).map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; v.page_bytes() as usize];
        let mut locs = Vec::with_capacity(v.pages() as usize);
        for p in 0..v.pages() {
            let loc = v.page_location(p);
            // Every page the open view maps must match its checksum.
            if loc.is_some() {
                if let Err(e) = v.read(p * v.page_bytes() as u64, &mut buf) {
                    println!("volume {name}: page {p}: {e}");
                    view.damaged.insert((name.clone(), p, loc));
                }
            }
            locs.push(loc);
        }
        view.locations.insert(name, locs);
    }
    view.members = normal.stats().members;
    Ok(view)
}

pub(crate) fn check(devices: &Devices) -> Result<CheckOutcome, String> {
    // First as a server would open it, then again, rebuilding everything from the log alone.
    // One at a time: the pool is locked while open.
    let open_view = read_open_view(devices)?;
    // Pages found damaged at open: the scan's view reads the same bytes, so they are reported
    // once.
    let mut damage = open_view.damaged.len() as u64;
    let mut repairable_bytes = 0u64;
    let scanned = devices.open_pool_with_progress(
        OpenOptions {
            force_scan: true,
            ..ro_options()
        },
        &progress_bar("scan"),
    )?;
    // Damage the redundancy covered: data pages found by the reads of the first open, and
    // metadata pages (and data pages of records not known durable) by the scan of the second.
    // The larger count of the two per member: both may have met the same pages.
    for (at_read, at_scan) in open_view.members.iter().zip(scanned.stats().members) {
        let bytes = at_read.damaged_bytes.max(at_scan.damaged_bytes);
        if bytes > 0 {
            println!(
                "member {}: {} failed their checksum there and were read from the redundancy (not rewritten: check writes nothing; `salsa check --scrub --repair` does)",
                at_scan.name,
                human(bytes)
            );
            repairable_bytes += bytes;
        }
    }
    let mut pages_checked = 0u64;
    for name in scanned.volume_names() {
        let b = scanned.volume(&name).map_err(|e| e.to_string())?;
        let Some(a) = open_view.locations.get(&name) else {
            println!("volume {name}: present in the log but not at open");
            damage += 1;
            continue;
        };
        let (checked, problems) = verify_scanned_volume(&name, &b, a, &open_view.damaged);
        pages_checked += checked;
        damage += problems;
    }
    println!(
        "checked {pages_checked} mapped pages in {} volumes: {damage} problems{}",
        scanned.volume_names().len(),
        if repairable_bytes > 0 {
            format!(", {} damaged on a member but intact in the redundancy", human(repairable_bytes))
        } else {
            String::new()
        }
    );
    Ok(CheckOutcome {
        problems: damage,
        repairable_bytes,
    })
}

/// Compares volume `name` as the log alone rebuilt it (`b`) with the locations the open view
/// saw (`a`) and reads every page the log maps; the pages read and the problems found (pages
/// mapped differently, pages failing their checksum that the open view did not already report).
fn verify_scanned_volume(
    name: &str,
    b: &salsa_core::Volume,
    a: &[Option<u64>],
    damaged: &std::collections::HashSet<DamagedPage>,
) -> (u64, u64) {
    let (mut pages_checked, mut damage) = (0u64, 0u64);
    let mut buf = vec![0u8; b.page_bytes() as usize];
    let mut differ = 0;
    let progress = progress_bar("verify");
    for p in 0..b.pages() {
        let (at_open, in_log) = (a.get(p as usize).copied().flatten(), b.page_location(p));
        if at_open != in_log {
            if differ < 10 {
                println!("volume {name}: page {p}: checkpoint says grain {at_open:?}, the log says grain {in_log:?}");
            }
            differ += 1;
        }
        if in_log.is_some() {
            pages_checked += 1;
            if let Err(e) = b.read(p * b.page_bytes() as u64, &mut buf) {
                if !damaged.contains(&(name.to_string(), p, in_log)) {
                    println!("volume {name}: page {p}: {e}");
                    damage += 1;
                }
            }
        }
        if p % 65536 == 0 || p + 1 == b.pages() {
            progress(p + 1, b.pages());
        }
    }
    if differ > 0 {
        println!("volume {name}: {differ} pages map differently in the checkpoint and in the log");
        damage += differ;
    }
    (pages_checked, damage)
}
