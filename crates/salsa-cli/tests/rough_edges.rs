//! What a new user runs into: commands that only look at a pool never create files, a server
//! that cannot start leaves nothing behind, and listings read well.

mod common;
use common::*;
use std::process::Command;

fn salsa(dir: &std::path::Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_salsa"))
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[test]
fn looking_at_a_missing_pool_creates_nothing() {
    let dir = test_dir("missing");
    for args in [
        vec!["info", "--device", "missing.img:100M"],
        vec!["check", "--device", "missing.img:100M"],
        vec!["volume", "list", "--device", "missing.img:100M"],
        vec!["volume", "create", "--device", "missing.img:100M", "v", "1M"],
        vec!["device", "fail", "--device", "missing.img:100M", "0"],
    ] {
        let (ok, out) = salsa(&dir, &args);
        assert!(!ok && out.contains("no such file"), "{args:?}: {out}");
        assert!(!dir.join("missing.img").exists(), "{args:?} created the file");
    }
}

#[test]
fn a_server_that_cannot_start_leaves_nothing_behind() {
    let dir = test_dir("serve");
    // A missing parent directory is not created.
    let (ok, out) = salsa(
        &dir,
        &["serve", "--no-tcp", "--unix", "nbd.sock", "--device", "sub/dir/pool.img:64M"],
    );
    assert!(!ok && out.contains("does not exist"), "{out}");
    assert!(!dir.join("sub").exists(), "the directory was created");
    // A busy port is found before the pool file is created.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port().to_string();
    let (ok, out) = salsa(
        &dir,
        &["serve", "--listen", &format!("127.0.0.1:{port}"), "--device", "pool.img:64M"],
    );
    assert!(!ok && out.contains("cannot listen"), "{out}");
    assert!(!dir.join("pool.img").exists(), "a pool was created for a server that did not start");
    // A file too small for a pool is removed again.
    let (ok, out) = salsa(&dir, &["serve", "--no-tcp", "--unix", "nbd.sock", "--device", "tiny.img:3M"]);
    assert!(!ok && out.contains("too small"), "{out}");
    assert!(!dir.join("tiny.img").exists(), "the too-small pool file was left behind: {out}");
    // Nothing to listen on is said before anything is created.
    let (ok, out) = salsa(&dir, &["serve", "--no-tcp", "--device", "pool.img:64M"]);
    assert!(!ok && out.contains("nothing to listen on"), "{out}");
    assert!(!dir.join("pool.img").exists());
    // A format that fails removes the files it created, and only those.
    std::fs::write(dir.join("kept.img"), vec![0u8; 1 << 20]).unwrap();
    for (args, why) in [
        (
            vec!["format", "--array", "raid5", "-d", "a.img:64M", "-d", "b.img:64M"],
            "at least 3 devices",
        ),
        (vec!["format", "-d", "a.img:64M", "--parity-buffer", "pb.img"], "parity buffer"),
        (vec!["format", "-d", "a.img:64M", "-d", "kept.img"], "too small"),
    ] {
        let (ok, out) = salsa(&dir, &args);
        assert!(!ok && out.contains(why), "{args:?}: {out}");
        for f in ["a.img", "b.img", "pb.img"] {
            assert!(!dir.join(f).exists(), "{args:?} left {f} behind");
        }
        assert!(dir.join("kept.img").exists(), "{args:?} removed a file it did not create");
    }
}

/// `--compression` on create and set: shown by `volume list` (and its JSON), durable, and
/// refused with a reason where it cannot apply, changing nothing.
#[test]
fn volume_compression_is_chosen_shown_changed_and_refused_where_it_cannot_apply() {
    let dir = test_dir("compression");
    let (ok, out) = salsa(&dir, &["format", "--device", "pool.img:64M"]);
    assert!(ok, "{out}");
    let (ok, out) = salsa(
        &dir,
        &["volume", "create", "--device", "pool.img", "db", "4M", "--compression", "lz4"],
    );
    assert!(ok && out.contains("16.0 KiB pages, lz4 compression"), "{out}");
    for (args, why) in [
        (vec!["--compression", "gzip"], "not off, lz4, zstd"),
        (vec!["--compression", "zstd:40"], "outside 1 to 19"),
        (vec!["--compression", "lz4", "--page-size", "4K"], "larger than the grain"),
        (vec!["--compression", "lz4", "--controller", "dual"], "LSA volumes"),
    ] {
        let mut cmd = vec!["volume", "create", "--device", "pool.img", "other", "4M"];
        cmd.extend(args.iter().copied());
        let (ok, out) = salsa(&dir, &cmd);
        assert!(!ok && out.contains(why), "{args:?}: {out}");
    }
    let (ok, out) = salsa(&dir, &["volume", "set", "--device", "pool.img", "db", "--compression", "zstd:5"]);
    assert!(ok && out.contains("compression zstd:5"), "{out}");
    let (ok, out) = salsa(&dir, &["volume", "list", "--device", "pool.img"]);
    assert!(ok && out.lines().next().unwrap().contains("COMPRESSION"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("db ") && l.contains("zstd:5")), "{out}");
    assert!(!out.contains("other"), "a refused create left a volume: {out}");
    let (ok, out) = salsa(&dir, &["volume", "list", "--json", "--device", "pool.img"]);
    assert!(ok, "{out}");
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    let db = list.as_array().unwrap().iter().find(|v| v["name"] == "db").unwrap();
    assert_eq!((db["compression"].as_str(), db["stored_bytes"].as_u64()), (Some("zstd:5"), Some(0)));
    let (ok, out) = salsa(&dir, &["volume", "set", "--device", "pool.img", "db"]);
    assert!(!ok && out.contains("--compression"), "{out}");
}

#[test]
fn volume_list_has_a_header_human_sizes_and_json() {
    let dir = test_dir("list");
    let (ok, out) = salsa(&dir, &["format", "--device", "pool.img:64M"]);
    assert!(ok, "{out}");
    let (ok, out) = salsa(&dir, &["volume", "create", "--device", "pool.img", "db", "3M"]);
    assert!(ok, "{out}");
    let (ok, out) = salsa(&dir, &["volume", "list", "--device", "pool.img"]);
    assert!(ok, "{out}");
    let mut lines = out.lines();
    let header = lines.next().unwrap();
    assert!(
        header.starts_with("NAME") && header.contains("SIZE") && header.contains("CONTROLLER"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("db ") && l.contains("3.0 MiB") && l.contains("lsa")),
        "{out}"
    );
    let (ok, out) = salsa(&dir, &["volume", "list", "--json", "--device", "pool.img"]);
    assert!(ok, "{out}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let db = v.as_array().unwrap().iter().find(|x| x["name"] == "db").unwrap();
    assert_eq!(db["size_bytes"], 3 << 20);
    assert_eq!(db["controller"], "lsa");
}

#[test]
fn commands_refused_by_a_served_pool_point_to_the_server() {
    let dir = test_dir("served");
    let srv = start_server(&dir, &["--device", "pool.img:64M"], "pool.ctl");
    let (ok, out) = salsa(&dir, &["info", "--device", "pool.img"]);
    assert!(
        !ok && out.contains("salsa stats --device pool.img") && out.contains("pool.ctl"),
        "{out}"
    );
    let (ok, out) = salsa(&dir, &["stats", "--device", "pool.img"]);
    assert!(ok && out.contains("user written"), "{out}");
    stop_server(srv);
}

/// `salsa serve --no-tcp --unix nbd.sock ARGS` in `dir`, once its control socket `ctl` is there.
fn start_server(dir: &std::path::Path, args: &[&str], ctl: &str) -> std::process::Child {
    let srv = Command::new(env!("CARGO_BIN_EXE_salsa"))
        .current_dir(dir)
        .args(["serve", "--no-tcp", "--unix", "nbd.sock"])
        .args(args)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !dir.join(ctl).exists() {
        assert!(std::time::Instant::now() < deadline, "the server did not start");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    srv
}

/// Stops a server of [`start_server`]; it must exit cleanly.
fn stop_server(mut srv: std::process::Child) {
    // SAFETY: kill only sends a signal to our own child's pid.
    unsafe { libc::kill(srv.id() as i32, libc::SIGTERM) };
    assert!(srv.wait().unwrap().success());
}

/// An online replacement given a relative path from another directory creates the file where
/// the user meant, not in the server's directory; a member of the pool is refused as such
/// (before, the server tried to open it again and called it locked by another process).
#[test]
fn an_online_replacement_takes_paths_as_the_user_meant_them() {
    let dir = test_dir("online-replace");
    let members = ["--array", "raid5", "-d", "a.img:64M", "-d", "b.img:64M", "-d", "c.img:64M"];
    let srv = start_server(&dir, &members, "a.ctl");
    let sub = dir.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    let (ok, out) = salsa(&sub, &["device", "replace", "-d", "../a.img", "1", "../c.img"]);
    assert!(!ok && out.contains("already member 2 of this pool"), "{out}");
    let (ok, out) = salsa(&sub, &["device", "replace", "-d", "../a.img", "1", "new.img:64M"]);
    assert!(ok && out.contains("rebuilt"), "{out}");
    assert!(sub.join("new.img").exists() && !dir.join("new.img").exists());
    let (ok, out) = salsa(&dir, &["stats", "-d", "a.img"]);
    assert!(ok && out.contains("sub/new.img"), "{out}");
    stop_server(srv);
    let (ok, out) = salsa(&dir, &["check", "-d", "a.img", "-d", "sub/new.img", "-d", "c.img"]);
    assert!(ok, "{out}");
}

#[test]
fn stats_json_carries_the_device_models_counters_and_the_victim_policys_state() {
    let dir = test_dir("models");
    let mut srv = Command::new(env!("CARGO_BIN_EXE_salsa"))
        .current_dir(&dir)
        .args([
            "serve",
            "--no-tcp",
            "--unix",
            "nbd.sock",
            "--control",
            "pool.ctl",
            "--device",
            "ssd:size=256M",
            "--gc-policy",
            "adaptive-cost-benefit",
            "--pace-writes",
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !dir.join("pool.ctl").exists() {
        assert!(std::time::Instant::now() < deadline, "the server did not start");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (ok, out) = salsa(&dir, &["stats", "--json", "--control", "pool.ctl"]);
    assert!(ok, "{out}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let counters = v["device_counters"].as_array().unwrap();
    assert!(!counters.is_empty(), "the SSD model's counters are missing: {v}");
    assert!(
        counters
            .iter()
            .all(|c| c["device"].is_string() && c["counter"].is_string() && c["value"].is_u64()),
        "{v}"
    );
    // So do the times the metrics endpoint gives (syncs, GC work), in microseconds.
    assert!(v["sync_micros"].is_u64() && v["gc_micros"].is_u64(), "{v}");
    // The pacing of writers (asked for, not needed yet on an idle pool).
    assert_eq!(
        (v["paced_writes"].as_u64(), v["pacing_rate_bytes_per_sec"].as_u64()),
        (Some(0), Some(0)),
        "{v}"
    );
    // And what an adaptive victim policy has learned: the exponent it starts with.
    assert_eq!(v["victim_policy_state"]["age_exponent"].as_f64(), Some(0.8), "{v}");
    // The counters say what period they cover.
    assert!(v["counters_since_unix_seconds"].as_u64().is_some_and(|t| t > 1_700_000_000), "{v}");
    let (ok, out) = salsa(&dir, &["stats", "--control", "pool.ctl"]);
    assert!(ok && out.contains("victim policy     age_exponent 0.8"), "{out}");
    assert!(out.contains("counters since the server started"), "{out}");
    // SAFETY: kill only sends a signal to our own child's pid.
    unsafe { libc::kill(srv.id() as i32, libc::SIGTERM) };
    assert!(srv.wait().unwrap().success());
}

/// `--parity-buffer`: `salsa format` creates the buffer at the size the layout needs and
/// `salsa info` says the mode; a command that leaves it out is told to give it; a linear pool
/// refuses one before anything is written.
#[test]
fn a_raid5_parity_buffer_is_created_reported_and_required() {
    let dir = test_dir("parity-buffer");
    let members = ["-d", "m0.img:32M", "-d", "m1.img:32M", "-d", "m2.img:32M"];
    let mut format = vec!["format", "--array", "raid5", "--parity-buffer", "nvm.img"];
    format.extend(members);
    let (ok, out) = salsa(&dir, &format);
    assert!(ok, "{out}");
    let size = std::fs::metadata(dir.join("nvm.img")).unwrap().len();
    assert!((1 << 20..64 << 20).contains(&size), "parity buffer of {size} bytes");
    let existing = ["-d", "m0.img", "-d", "m1.img", "-d", "m2.img"];
    let mut info = vec!["info", "--parity-buffer", "nvm.img"];
    info.extend(existing);
    let (ok, out) = salsa(&dir, &info);
    assert!(ok && out.contains("parity buffer nvm.img"), "{out}");
    let mut without = vec!["info"];
    without.extend(existing);
    let (ok, out) = salsa(&dir, &without);
    assert!(!ok && out.contains("--parity-buffer"), "{out}");
    // Without a buffer, info says flushes pad.
    let (ok, out) = salsa(
        &dir,
        &[
            "format",
            "--array",
            "raid5",
            "-d",
            "p0.img:32M",
            "-d",
            "p1.img:32M",
            "-d",
            "p2.img:32M",
        ],
    );
    assert!(ok, "{out}");
    let (ok, out) = salsa(&dir, &["info", "-d", "p0.img", "-d", "p1.img", "-d", "p2.img"]);
    assert!(ok && out.contains("no parity buffer: a flush pads"), "{out}");
    // A linear pool refuses one, and leaves nothing behind.
    let (ok, out) = salsa(&dir, &["format", "--parity-buffer", "nvm2.img:8M", "-d", "l.img:32M"]);
    assert!(!ok && out.contains("parity buffer keeps RAID-5 parity"), "{out}");
    assert!(!dir.join("l.img").exists() && !dir.join("nvm2.img").exists(), "files left behind");
    // On a device that was there, it writes nothing.
    std::fs::write(dir.join("l.img"), vec![0u8; 32 << 20]).unwrap();
    let (ok, out) = salsa(&dir, &["format", "--parity-buffer", "nvm2.img:8M", "-d", "l.img"]);
    assert!(!ok && out.contains("parity buffer keeps RAID-5 parity"), "{out}");
    let (ok, out) = salsa(&dir, &["info", "-d", "l.img"]);
    assert!(!ok && out.contains("not a SALSA pool member"), "{out}");
}

/// A device named twice (by one path or two, or as a member and the parity buffer) is refused
/// by what it is, before anything is written; before, the second open found the file locked
/// by the first and blamed another process. Too few members of a RAID-5 pool say how many
/// the layout can do without.
#[test]
fn a_device_named_twice_or_too_few_members_get_a_clear_error() {
    let dir = test_dir("twice");
    let (ok, out) = salsa(
        &dir,
        &["format", "--array", "raid5", "-d", "a.img:64M", "-d", "b.img:64M", "-d", "./a.img"],
    );
    assert!(!ok && out.contains("a.img and ./a.img are the same file"), "{out}");
    assert!(!dir.join("a.img").exists() && !dir.join("b.img").exists(), "nothing is created");
    format_raid5_of_three(&dir);
    for args in [
        vec!["info", "-d", "a.img", "-d", "b.img", "-d", "a.img"],
        vec!["info", "-d", "a.img", "-d", "b.img", "-d", "c.img", "--parity-buffer", "b.img"],
        vec!["serve", "-d", "a.img", "-d", "b.img", "-d", "b.img"],
        vec!["device", "fail", "-d", "a.img", "-d", "b.img", "-d", "b.img", "0"],
    ] {
        let (ok, out) = salsa(&dir, &args);
        assert!(!ok && out.contains("given twice"), "{args:?}: {out}");
    }
    let (ok, out) = salsa(&dir, &["info", "-d", "a.img"]);
    assert!(
        !ok && out.contains("slots 1, 2") && out.contains("can do without at most 1"),
        "{out}"
    );
    let (ok, out) = salsa(&dir, &["info", "-d", "a.img", "-d", "c.img"]);
    assert!(ok, "one member missing: the pool opens degraded: {out}");
}

/// `salsa device replace` onto a device that holds another pool is refused with a pointer to
/// `--force`, the device untouched; with `--force` the rebuild runs.
#[test]
fn device_replace_refuses_a_device_holding_another_pool_without_force() {
    let dir = test_dir("replace-force");
    format_raid5_of_three(&dir);
    let (ok, out) = salsa(&dir, &["format", "-d", "other.img:64M"]);
    assert!(ok, "{out}");
    let other_before = std::fs::read(dir.join("other.img")).unwrap();
    let pool = ["-d", "a.img", "-d", "b.img", "-d", "c.img"];
    let mut replace = vec!["device", "replace"];
    replace.extend(pool);
    replace.extend(["c.img", "other.img"]);
    let (ok, out) = salsa(&dir, &replace);
    assert!(!ok && out.contains("holds SALSA pool") && out.contains("--force"), "{out}");
    assert!(std::fs::read(dir.join("other.img")).unwrap() == other_before, "other.img untouched");
    // A member of the pool, by another path, is refused as such.
    let mut member = vec!["device", "replace"];
    member.extend(pool);
    member.extend(["c.img", "./a.img"]);
    let (ok, out) = salsa(&dir, &member);
    assert!(!ok && out.contains("already member 0 of this pool"), "{out}");
    // A failed member given as its own replacement: how to do that.
    let mut fail = vec!["device", "fail"];
    fail.extend(pool);
    fail.push("a.img");
    let (ok, out) = salsa(&dir, &fail);
    assert!(ok, "{out}");
    let mut again = vec!["device", "replace"];
    again.extend(pool);
    again.extend(["a.img", "a.img"]);
    let (ok, out) = salsa(&dir, &again);
    assert!(!ok && out.contains("leave it out of --device"), "{out}");
    let (ok, out) = salsa(&dir, &["device", "replace", "-d", "b.img", "-d", "c.img", "0", "a.img"]);
    assert!(ok && out.contains("rebuilt"), "{out}");
    // A file the command created for a refused replacement is removed again.
    let mut refused = vec!["device", "replace"];
    refused.extend(pool);
    refused.extend(["7", "new.img:64M"]);
    let (ok, out) = salsa(&dir, &refused);
    assert!(!ok && out.contains("not a member"), "{out}");
    assert!(!dir.join("new.img").exists(), "{out}");
    replace.push("--force");
    let (ok, out) = salsa(&dir, &replace);
    assert!(ok && out.contains("rebuilt"), "{out}");
    let (ok, out) = salsa(&dir, &["check", "-d", "a.img", "-d", "b.img", "-d", "other.img"]);
    assert!(ok, "{out}");
}

/// A RAID-5 pool on a.img, b.img and c.img (64 MiB each) in `dir`.
/// The command `salsa device fail` prints for the replacement runs as printed (it names the
/// pool the way the user did), and a replaced member given again is refused as such.
#[test]
fn device_fail_prints_a_replace_command_that_runs() {
    let dir = test_dir("fail-hint");
    format_raid5_of_three(&dir);
    let (ok, out) = salsa(&dir, &["device", "fail", "-d", "a.img", "-d", "b.img", "-d", "c.img", "1"]);
    assert!(ok, "{out}");
    let hint = out
        .lines()
        .find_map(|l| l.split_once("replace it with: salsa ").map(|(_, cmd)| cmd.to_string()))
        .unwrap_or_else(|| panic!("no replace command in: {out}"));
    let args: Vec<&str> = hint.split_whitespace().map(|a| if a == "NEW" { "d.img:64M" } else { a }).collect();
    let (ok, out) = salsa(&dir, &args);
    assert!(ok, "{hint}: {out}");
    let (ok, out) = salsa(&dir, &["info", "-d", "a.img", "-d", "b.img", "-d", "c.img"]);
    assert!(!ok && out.contains("no longer a member") && out.contains("member 1"), "{out}");
    let (ok, out) = salsa(&dir, &["check", "-d", "a.img", "-d", "d.img", "-d", "c.img"]);
    assert!(ok, "{out}");
}

/// A member whose superblock was wiped is not blamed as "data that is not a pool" with advice
/// to format (which would lose the pool): the error says which slot the pool misses and how to
/// go on, and following it rebuilds the member.
#[test]
fn a_member_that_lost_its_superblock_is_not_offered_to_format() {
    let dir = test_dir("lost-superblock");
    format_raid5_of_three(&dir);
    let wipe = |name: &str| {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(dir.join(name)).unwrap();
        f.write_all_at(&vec![0u8; 1 << 20], 0).unwrap();
    };
    wipe("b.img");
    let all = ["-d", "a.img", "-d", "b.img", "-d", "c.img"];
    for command in [&["info"][..], &["serve", "--listen", "127.0.0.1:0"][..]] {
        let args: Vec<&str> = command.iter().chain(all.iter()).copied().collect();
        let (ok, out) = salsa(&dir, &args);
        assert!(!ok && !out.contains("format --force"), "{args:?}: {out}");
        assert!(out.contains("misses slot(s) 1") && out.contains("Leave it out"), "{args:?}: {out}");
    }
    let (ok, out) = salsa(&dir, &["device", "replace", "-d", "a.img", "-d", "c.img", "1", "b.img"]);
    assert!(ok, "{out}");
    let (ok, out) = salsa(&dir, &["check", "--scrub"].iter().chain(all.iter()).copied().collect::<Vec<_>>());
    assert!(ok && out.contains("0 problems"), "{out}");
    // Two wiped members of a RAID-5 pool: it cannot open, and says so.
    wipe("a.img");
    wipe("c.img");
    let (ok, out) = salsa(&dir, &["info", "-d", "a.img", "-d", "b.img", "-d", "c.img"]);
    assert!(
        !ok && out.contains("a.img, c.img") && out.contains("cannot open without those slots"),
        "{out}"
    );
}

/// A RAID-5 pool whose parity buffer is lost says how to go on, and `salsa device
/// parity-buffer` gives it a new one or none; a new one that holds data is refused with
/// nothing changed.
#[test]
fn a_lost_parity_buffer_is_replaced_or_done_without() {
    let dir = test_dir("parity-buffer-change");
    let mut args = vec!["format", "--array", "raid5", "--parity-buffer", "nvm.img"];
    args.extend(["-d", "a.img:64M", "-d", "b.img:64M", "-d", "c.img:64M"]);
    let (ok, out) = salsa(&dir, &args);
    assert!(ok, "{out}");
    std::fs::remove_file(dir.join("nvm.img")).unwrap();
    let pool = ["-d", "a.img", "-d", "b.img", "-d", "c.img"];
    fn with<'a>(pool: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        pool.iter().chain(extra).copied().collect()
    }
    let (ok, out) = salsa(&dir, &[&["info"][..], &with(&pool, &["--parity-buffer", "nvm.img"])].concat());
    assert!(!ok && out.contains("salsa device parity-buffer"), "{out}");
    let (ok, out) = salsa(&dir, &[&["info"][..], &pool].concat());
    assert!(!ok && out.contains("salsa device parity-buffer"), "{out}");
    // A new buffer holding data: refused, and the pool still wants its old one.
    std::fs::write(dir.join("data.img"), vec![7u8; 8 << 20]).unwrap();
    let (ok, out) = salsa(&dir, &[&["device", "parity-buffer"][..], &with(&pool, &["data.img"])].concat());
    assert!(!ok && out.contains("--force"), "{out}");
    let (ok, out) = salsa(&dir, &[&["info"][..], &pool].concat());
    assert!(!ok && out.contains("keeps the parity"), "nothing changed: {out}");
    let (ok, out) = salsa(&dir, &[&["device", "parity-buffer"][..], &with(&pool, &["nvm2.img"])].concat());
    assert!(ok && out.contains("is now nvm2.img"), "{out}");
    let (ok, out) = salsa(&dir, &[&["info"][..], &with(&pool, &["--parity-buffer", "nvm2.img"])].concat());
    assert!(ok && out.contains("parity buffer nvm2.img"), "{out}");
    let (ok, out) = salsa(
        &dir,
        &[
            &["device", "parity-buffer"][..],
            &with(&pool, &["--parity-buffer", "nvm2.img", "none"]),
        ]
        .concat(),
    );
    assert!(ok && out.contains("no parity buffer now"), "{out}");
    // A start that still names the buffer it dropped goes on without it; another device is
    // refused.
    let (ok, out) = salsa(&dir, &[&["info"][..], &with(&pool, &["--parity-buffer", "nvm2.img"])].concat());
    assert!(
        ok && out.contains("not in use by this pool") && out.contains("no parity buffer: a flush pads"),
        "{out}"
    );
    let (ok, out) = salsa(&dir, &[&["info"][..], &with(&pool, &["--parity-buffer", "data.img"])].concat());
    assert!(!ok && out.contains("never one of its own"), "{out}");
    let (ok, out) = salsa(&dir, &[&["check", "--scrub"][..], &pool].concat());
    assert!(ok && out.contains("no parity buffer: a flush pads"), "{out}");
}

fn format_raid5_of_three(dir: &std::path::Path) {
    let mut args = vec!["format", "--array", "raid5"];
    args.extend(["-d", "a.img:64M", "-d", "b.img:64M", "-d", "c.img:64M"]);
    let (ok, out) = salsa(dir, &args);
    assert!(ok, "{out}");
}

/// Commands that only look at a pool never advise `format --force` (which would destroy what
/// the file holds) for a file that is not a pool, and leave it as it was.
#[test]
fn look_only_commands_never_advise_formatting() {
    let dir = test_dir("foreign-look");
    std::fs::write(dir.join("data.img"), vec![7u8; 8 << 20]).unwrap();
    for args in [
        vec!["info", "--device", "data.img"],
        vec!["check", "--device", "data.img"],
        vec!["volume", "list", "--device", "data.img"],
    ] {
        let (ok, out) = salsa(&dir, &args);
        assert!(
            !ok && out.contains("not a SALSA pool member") && !out.contains("format"),
            "{args:?}: {out}"
        );
    }
    assert!(
        std::fs::read(dir.join("data.img")).unwrap().iter().all(|&b| b == 7),
        "the file was modified"
    );
}

/// `--listen` takes a host name as well as an address, and a wrong one says what it wants; a
/// directory given as a device says that a member is a file or a block device.
#[test]
fn listen_names_and_directories_get_a_message_that_names_the_fix() {
    let dir = test_dir("listen");
    std::fs::create_dir_all(dir.join("pool-dir")).unwrap();
    // The address parses (the server goes on to the device, and stops there).
    let (ok, out) = salsa(&dir, &["serve", "--listen", "localhost:10904", "--device", "pool-dir"]);
    assert!(
        !ok && out.contains("pool-dir is a directory") && out.contains("file or a block device"),
        "{out}"
    );
    let (ok, out) = salsa(&dir, &["serve", "--listen", "no port here", "--device", "pool-dir"]);
    assert!(!ok && out.contains("HOST:PORT"), "{out}");
    let (ok, out) = salsa(&dir, &["info", "--device", "pool-dir"]);
    assert!(!ok && out.contains("is a directory"), "{out}");
}

/// A scrub of a pool without redundancy says that it had nothing to compare instead of
/// reporting "0 rows compared, 0 disagreed" as if it had verified something.
#[test]
fn a_scrub_without_redundancy_says_it_compared_nothing() {
    let dir = test_dir("scrub-linear");
    let (ok, out) = salsa(&dir, &["format", "--device", "p.img:128M"]);
    assert!(ok, "{out}");
    let (ok, out) = salsa(&dir, &["check", "--device", "p.img", "--scrub"]);
    assert!(ok && out.contains("nothing to compare") && !out.contains("rows compared"), "{out}");
}

/// `info`, `check` and `volume` find the default pool (salsa-data/pool.img, what `salsa serve`
/// makes) without --device, as `stats` finds the default server; with no pool there, they say
/// so and create nothing. `format` still wants its devices named.
#[test]
fn look_and_volume_commands_find_the_default_pool() {
    let dir = test_dir("default-pool");
    let (ok, out) = salsa(&dir, &["info"]);
    assert!(!ok && out.contains("no pool at salsa-data/pool.img"), "{out}");
    assert!(!dir.join("salsa-data").exists(), "looking created the default directory");
    let (ok, out) = salsa(&dir, &["format"]);
    assert!(!ok && out.contains("--device"), "{out}");
    std::fs::create_dir_all(dir.join("salsa-data")).unwrap();
    let (ok, out) = salsa(&dir, &["format", "--device", "salsa-data/pool.img:128M"]);
    assert!(ok, "{out}");
    let (ok, out) = salsa(&dir, &["volume", "create", "v", "8M"]);
    assert!(ok, "{out}");
    let (ok, out) = salsa(&dir, &["info"]);
    assert!(ok && out.contains("default") && out.contains(" v "), "{out}");
    let (ok, out) = salsa(&dir, &["volume", "list"]);
    assert!(ok && out.contains("v "), "{out}");
    let (ok, out) = salsa(&dir, &["check"]);
    assert!(ok, "{out}");
}

/// A log written to a file (not a terminal) carries no colour codes.
#[test]
fn a_log_to_a_file_has_no_colour_codes() {
    let dir = test_dir("log-colour");
    let (ok, out) = salsa(&dir, &["-vv", "format", "--device", "p.img:128M"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("INFO") || out.contains("DEBUG"),
        "the format logged nothing at -vv: {out}"
    );
    assert!(!out.contains('\u{1b}'), "colour codes in a log to a pipe: {out:?}");
}
