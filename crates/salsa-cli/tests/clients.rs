//! Real clients against `salsa serve`: qemu-img, qemu-io, nbdinfo, nbdcopy, fio's nbd engine,
//! and a file system on a loop device over nbdfuse.

mod common;
use common::*;
use salsa_nbd::proto::{CMD_DISC, CMD_FLUSH, CMD_READ, CMD_WRITE};
use std::process::Command;

#[test]
fn qemu_img_and_qemu_io() {
    require("qemu-io");
    require("qemu-img");
    let dir = test_dir("qemu");
    let srv = Server::start(&dir, "64M", &[]);
    let (ok, out) = run(Command::new("qemu-img").args(["info", &srv.uri()]));
    assert!(ok && out.contains("virtual size"), "{out}");
    let (ok, out) = run(Command::new("qemu-io").args(["-f", "raw", &srv.uri()]).args([
        "-c",
        "write -P 0xab 0 1M",
        "-c",
        "write -f -P 0xcd 1M 64k",
        "-c",
        "write -z 4k 8k",
        "-c",
        "discard 512k 64k",
        "-c",
        "write -P 0x11 2M 1000",
        "-c",
        "read -P 0xab 0 4k",
        "-c",
        "read -P 0 4k 8k",
        "-c",
        "read -P 0xab 12k 500k",
        "-c",
        "read -P 0 512k 64k",
        "-c",
        "read -P 0xcd 1M 64k",
        "-c",
        "read -P 0x11 2M 1000",
        "-c",
        "read -P 0 3M 1M",
        "-c",
        "flush",
    ]));
    assert!(ok && !out.contains("fail") && !out.contains("error"), "{out}");
    // Pattern checks can fail: prove it.
    let (_, out) = run(Command::new("qemu-io").args(["-f", "raw", &srv.uri(), "-c", "read -P 0x77 0 4k"]));
    assert!(out.contains("Pattern verification failed"), "{out}");
    srv.stop();
}

#[test]
fn nbdinfo_nbdcopy_and_block_status() {
    require("nbdinfo");
    require("nbdcopy");
    let dir = test_dir("nbdcopy");
    let srv = Server::start(&dir, "64M", &[]);
    let (ok, out) = run(Command::new("nbdinfo").args(["--list", &format!("nbd://127.0.0.1:{}", srv.port)]));
    assert!(ok && out.contains("export=\"default\"") && out.contains("base:allocation"), "{out}");
    let image = dir.join("in.img");
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    std::fs::write(&image, &data).unwrap();
    let (ok, out) = run(Command::new("nbdcopy").arg(&image).arg(srv.uri()));
    assert!(ok, "{out}");
    let back = dir.join("out.img");
    let (ok, out) = run(Command::new("nbdcopy").arg(srv.uri()).arg(&back));
    assert!(ok, "{out}");
    let copied = std::fs::read(&back).unwrap();
    assert_eq!(&copied[..data.len()], &data[..], "image differs after the round trip");
    assert!(copied[data.len()..].iter().all(|&b| b == 0));
    // Unwritten space is a hole that reads as zeros; the written part is data.
    let (ok, out) = run(Command::new("nbdinfo").args(["--map", &srv.uri()]));
    assert!(ok, "{out}");
    let first = out.lines().next().unwrap_or_default().split_whitespace().collect::<Vec<_>>();
    assert_eq!(first, vec!["0", &(8u32 << 20).to_string(), "0", "data"], "{out}");
    assert!(out.contains("hole,zero"), "{out}");
    srv.stop();
}

/// A compressing volume served over NBD: a compressible image copied in and out unchanged
/// (nbdcopy), fio's verified 4 KiB random writes (read-modify-writes of 16 KiB compressed
/// pages) while the GC runs through the server's write buffer, compressible 16 KiB random
/// writes (fio's `buffer_compress_percentage`); the server's statistics show the stored bytes
/// below the mapped, and the offline check passes.
#[test]
fn a_compressing_volume_serves_nbdcopy_and_fio_verified_writes() {
    require("fio");
    require("nbdcopy");
    let dir = test_dir("compressed-nbd");
    let device = dir.join("pool.img").display().to_string();
    let salsa = |args: &[&str]| run(Command::new(env!("CARGO_BIN_EXE_salsa")).args(args));
    let (ok, out) = salsa(&["format", "--segment-size", "1M", "--device", &format!("{device}:96M")]);
    assert!(ok, "{out}");
    let (ok, out) = salsa(&["volume", "create", "--device", &device, "c", "64M", "--compression", "zstd:1"]);
    assert!(ok, "{out}");
    let srv = Server::start_on(&dir, std::slice::from_ref(&device), &["--write-buffer", "4M"]);
    let uri = format!("nbd://127.0.0.1:{}/c", srv.port);
    // Text-like data: 16 MiB of lines from a small vocabulary.
    let words = ["salsa ", "segment ", "grain ", "record ", "volume ", "4096 ", "-17- ", "zone\n"];
    let mut data = Vec::with_capacity(16 << 20);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    while data.len() < 16 << 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(words[(x % 8) as usize].as_bytes());
    }
    data.truncate(16 << 20);
    let image = dir.join("in.img");
    std::fs::write(&image, &data).unwrap();
    let (ok, out) = run(Command::new("nbdcopy").arg(&image).arg(&uri));
    assert!(ok, "{out}");
    let back = dir.join("out.img");
    let (ok, out) = run(Command::new("nbdcopy").arg(&uri).arg(&back));
    assert!(ok, "{out}");
    let copied = std::fs::read(&back).unwrap();
    assert!(copied[..data.len()] == data[..], "image differs after the round trip");
    let fio = |extra: &[&str]| {
        let (ok, out) = run(Command::new("fio")
            .args([
                "--name=c",
                "--ioengine=nbd",
                &format!("--uri={uri}"),
                "--iodepth=16",
                "--offset=16M",
                "--size=40M",
            ])
            .args(extra));
        assert!(ok && !out.contains("verify: bad"), "fio {extra:?} failed:\n{out}");
    };
    fio(&["--rw=write", "--bs=1M", "--buffer_compress_percentage=70", "--refill_buffers"]);
    fio(&[
        "--rw=randwrite",
        "--bs=4k",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--number_ios=20000",
    ]);
    fio(&[
        "--rw=randwrite",
        "--bs=16k",
        "--buffer_compress_percentage=70",
        "--refill_buffers",
        "--number_ios=8000",
    ]);
    let (ok, out) = salsa(&["stats", "--json", "--device", &device]);
    assert!(ok, "{out}");
    let stats: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let vol = stats["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "c")
        .unwrap()
        .clone();
    let (mapped, stored) = (vol["mapped_bytes"].as_u64().unwrap(), vol["stored_bytes"].as_u64().unwrap());
    assert!(stored * 10 < mapped * 8, "stored {stored} of {mapped}: {vol}");
    assert!(stats["compressed_bytes_saved"].as_u64().unwrap() > 0, "{stats}");
    assert!(stats["gc_segments_cleaned"].as_u64().unwrap() > 0, "{stats}");
    let (ok, out) = salsa(&["stats", "--device", &device]);
    assert!(ok && out.contains("(zstd:1,"), "{out}");
    srv.stop();
    let (ok, out) = salsa(&["check", "--device", &device]);
    assert!(ok, "salsa check: {out}");
}

#[test]
fn fio_random_writes_verify_while_gc_runs() {
    fio_random_writes_verify("fio", &["--write-buffer", "0"]);
}

/// The same through a write buffer of 4 MiB whose pages expire after 50 ms: fio's verified
/// overwrites (each block once per pass, so none is absorbed) meet destages all the time,
/// writers wait for room, and every page reaches the log and the GC.
#[test]
fn fio_random_writes_verify_through_a_small_write_buffer() {
    let stats = fio_random_writes_verify("fio-buffered", &["--write-buffer", "4M", "--write-buffer-expire-ms", "50"]);
    let w = &stats["write_buffer"];
    assert!(w["destages"].as_u64().unwrap() > 10, "{w}");
    assert!(w["writer_waits"].as_u64().unwrap() > 0, "{w}");
    assert!(stats["gc_segments_cleaned"].as_u64().unwrap() > 0, "{stats}");
}

/// fio's verified random writes over NBD on a 96 MiB pool served with `serve_args`; returns
/// the pool's statistics at the end.
fn fio_random_writes_verify(name: &str, serve_args: &[&str]) -> serde_json::Value {
    require("fio");
    let dir = test_dir(name);
    let srv = Server::start(&dir, "96M", serve_args);
    let (ok, out) = run(Command::new("nbdinfo").args(["--size", &srv.uri()]));
    assert!(ok, "{out}");
    let size: u64 = out.trim().parse().unwrap();
    let half = size / 2 / (1 << 20) * (1 << 20);
    // Two jobs on two connections, each on its half: a sequential fill, then random 4 KiB
    // overwrites of everything at queue depth 32 with crc32c verification; the overwrites keep
    // the GC busy (the volume fills 80% of the pool). Then random 256 KiB overwrites, verified:
    // their pages are held by the records in the received payloads (zero-copy writes).
    for (rw, extra) in [
        ("write", vec!["--bs=1M"]),
        ("randwrite", vec!["--bs=4k", "--verify=crc32c", "--verify_fatal=1"]),
        ("randwrite", vec!["--bs=256k", "--verify=crc32c", "--verify_fatal=1"]),
    ] {
        let (ok, out) = run(Command::new("fio")
            .args([
                "--name=salsa",
                "--ioengine=nbd",
                &format!("--uri={}", srv.uri()),
                &format!("--rw={rw}"),
                "--iodepth=32",
            ])
            .args([
                "--numjobs=2",
                &format!("--size={half}"),
                &format!("--offset_increment={half}"),
                "--group_reporting",
            ])
            .args(extra));
        assert!(ok && !out.contains("verify: bad"), "fio {rw} failed:\n{out}");
    }
    let (ok, out) = run(Command::new(env!("CARGO_BIN_EXE_salsa"))
        .args(["stats", "--json", "--device"])
        .arg(dir.join("pool.img")));
    assert!(ok, "salsa stats: {out}");
    let stats: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let held = stats["user_bytes_held"].as_u64().unwrap();
    if stats["write_buffer"].is_null() {
        assert!(held >= half, "the large writes were copied, not held: {held} bytes held");
    }
    assert!(stats["payload_buffer_bytes"].as_u64().unwrap() <= 64 << 20, "{stats}");
    srv.stop();
    let (ok, out) = run(Command::new(env!("CARGO_BIN_EXE_salsa"))
        .args(["check", "--device"])
        .arg(dir.join("pool.img")));
    assert!(ok, "salsa check after fio: {out}");
    stats
}

/// `salsa device replace --rate 1 --device FIRST OLD NEW` started in the background: after its
/// first segment the rebuild pauses for days, until its limit changes.
fn replace_at_one_byte_a_second(first: &str, old: &str, new: &str) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_salsa"))
        .args(["device", "replace", "--rate", "1", "--device", first, old, new])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// A served RAID-5 pool of four 24 MiB files in a fresh directory, without read cache or write
/// buffer (every read comes from the members), holding [`Raid5Fixture::block`] at each of its
/// first 16 MiB, written and flushed.
struct Raid5Fixture {
    srv: Server,
    client: RawClient,
    /// Last: fields drop in order, and the directory goes after the server using it.
    dir: TestDir,
}

impl Raid5Fixture {
    fn start(name: &str) -> Raid5Fixture {
        let dir = test_dir(name);
        let members: Vec<String> = (0..4).map(|i| format!("{}/m{i}.img:24M", dir.display())).collect();
        let args = [
            "--array",
            "raid5",
            "--segment-size",
            "3M",
            "--read-cache",
            "0",
            "--write-buffer",
            "0",
        ];
        let srv = Server::start_on(&dir, &members, &args);
        let mut client = RawClient::connect(&srv.socket, "default");
        for i in 0..16u64 {
            assert_eq!(client.call(0, CMD_WRITE, i << 20, 1 << 20, &Self::block(i)).0, 0, "write {i}");
        }
        assert_eq!(client.call(0, CMD_FLUSH, 0, 0, &[]).0, 0, "flush");
        Raid5Fixture { dir, srv, client }
    }

    /// The bytes of MiB `i`.
    fn block(i: u64) -> Vec<u8> {
        (0..1u32 << 20).map(|b| (b as u64 * 31 + i * 7) as u8).collect()
    }

    /// Member file `i` (4: the one a replacement goes to).
    fn path(&self, i: usize) -> String {
        self.dir.join(format!("m{i}.img")).display().to_string()
    }

    fn salsa(&self, args: &[&str]) -> (bool, String) {
        run(Command::new(env!("CARGO_BIN_EXE_salsa")).args(args))
    }

    /// Every MiB written reads back through the server.
    fn read_back(&mut self, when: &str) {
        for i in 0..16u64 {
            let (error, data) = self.client.call(0, CMD_READ, i << 20, 1 << 20, &[]);
            assert!(error == 0 && data == Self::block(i), "{when}: MiB {i} (error {error})");
        }
    }

    /// `salsa stats --json`'s members.
    fn members(&self) -> serde_json::Value {
        let (ok, out) = self.salsa(&["stats", "--json", "--device", &self.path(0)]);
        assert!(ok, "salsa stats: {out}");
        serde_json::from_str::<serde_json::Value>(out.trim()).unwrap()["members"].clone()
    }

    /// Waits until member 1's `key` in [`Raid5Fixture::members`] is `value`.
    fn wait_for_member_1(&self, key: &str, value: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while self.members()[1][key] != value {
            assert!(
                std::time::Instant::now() < deadline,
                "member 1's {key} is not {value}: {}",
                self.members()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Stops the server (its client first); the directory is handed back, so that its member
    /// files outlive the server for as long as the caller keeps it.
    fn stop(self) -> TestDir {
        drop(self.client);
        self.srv.stop();
        self.dir
    }

    /// `salsa device replace` of member 1 onto file 4, paused after its first segment.
    fn replace_member_1_paused(&self) -> std::process::Child {
        replace_at_one_byte_a_second(&self.path(0), &self.path(1), &format!("{}:24M", self.path(4)))
    }
}

/// `salsa device replace` of a healthy member on a running server keeps the outgoing member
/// serving its slot until the rebuild ends (`salsa stats` names it), so the array keeps its
/// redundancy: another member failed meanwhile loses nothing, and every byte reads back the
/// same before, during and after. (Before, the outgoing member left as the rebuild began and
/// `salsa device fail` of a second member was refused: it would have lost the pool's data.)
#[test]
fn a_healthy_member_replaced_online_serves_its_slot_until_the_rebuild_ends() {
    let mut f = Raid5Fixture::start("replace-healthy");
    let replace = f.replace_member_1_paused();
    f.wait_for_member_1("outgoing", &f.path(1));
    assert_eq!(f.members()[1]["state"], "rebuilding");
    let (ok, out) = f.salsa(&["stats", "--device", &f.path(0)]);
    assert!(
        ok && out.contains(&format!("{} still serves the slot until the rebuild ends", f.path(1))),
        "{out}"
    );
    f.read_back("during the rebuild");
    let (ok, out) = f.salsa(&["device", "fail", "--device", &f.path(0), &f.path(2)]);
    assert!(ok, "a second member failed during the rebuild: {out}");
    f.read_back("with a second member failed during the rebuild");
    let (ok, out) = f.salsa(&["device", "rebuild-rate", "--device", &f.path(0), "none"]);
    assert!(ok, "salsa device rebuild-rate: {out}");
    let out = replace.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let m = f.members();
    assert!(
        m[1]["state"] == "ok" && m[1]["outgoing"].is_null() && m[2]["state"] == "failed",
        "{m}"
    );
    f.read_back("after the rebuild, from the new member and the survivors");
    let _dir = f.stop();
}

/// A healthy member's replacement interrupted by a crash of the server (kill -9) goes on with
/// the old member in service when the next server is given it beside the new one, as MD
/// keeps a `--replace` going when the array is assembled again: `salsa info` names it, a
/// second member failed through the control socket meanwhile loses nothing (without the old
/// member the array could not lose one), and once the rebuild ends the old member is refused.
#[test]
fn a_healthy_members_replacement_goes_on_with_it_after_a_crash() {
    let f = Raid5Fixture::start("replace-healthy-crash");
    let replace = f.replace_member_1_paused();
    f.wait_for_member_1("outgoing", &f.path(1));
    let paths: Vec<String> = [0, 1, 4, 2, 3].iter().map(|&i| f.path(i)).collect();
    let Raid5Fixture { dir, srv, client } = f;
    drop(client);
    srv.kill();
    let _ = replace.wait_with_output();
    let info = || {
        let mut args = vec!["info".to_string()];
        for p in &paths {
            args.extend(["--device".to_string(), p.clone()]);
        }
        run(Command::new(env!("CARGO_BIN_EXE_salsa")).args(&args))
    };
    let (ok, out) = info();
    assert!(
        ok && out.contains(&format!("{} still serves the slot until the rebuild ends", paths[1])),
        "salsa info with the old member beside the new: {out}"
    );
    let srv = Server::start_on(&dir, &paths, &["--read-cache", "0", "--write-buffer", "0"]);
    let client = RawClient::connect(&srv.socket, "default");
    let mut f = Raid5Fixture { dir, srv, client };
    let m = f.members();
    assert!(m[1]["state"] == "rebuilding" && m[1]["outgoing"] == paths[1].as_str(), "{m}");
    let (ok, out) = f.salsa(&["device", "fail", "--device", &f.path(0), &f.path(2)]);
    assert!(ok, "a second member failed during the resumed rebuild: {out}");
    f.read_back("with a second member failed during the resumed rebuild");
    let (ok, out) = f.salsa(&["device", "rebuild-rate", "--device", &f.path(0), "none"]);
    assert!(ok, "salsa device rebuild-rate: {out}");
    f.wait_for_member_1("state", "ok");
    assert!(f.members()[1]["outgoing"].is_null(), "{}", f.members());
    f.read_back("after the rebuild, from the new member and the survivors");
    let _dir = f.stop();
    let (ok, out) = info();
    assert!(!ok && out.contains("same member"), "the old member once rebuilt: {out}");
}

/// `salsa device fail` of the replacement while a healthy member is being replaced (a new
/// disk that turns out bad): the member it was to replace takes its slot back, the command
/// says so, the replace ends with a clear error, and the pool keeps serving every byte.
#[test]
fn failing_the_replacement_of_a_healthy_member_gives_the_slot_back() {
    let mut f = Raid5Fixture::start("replacement-failed");
    let replace = f.replace_member_1_paused();
    f.wait_for_member_1("state", "rebuilding");
    let (ok, out) = f.salsa(&["device", "fail", "--device", &f.path(0), &f.path(4)]);
    assert!(
        ok && out.contains(&format!("{}, which it was to replace, serves its slot again", f.path(1))),
        "salsa device fail: {out}"
    );
    let out = replace.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("the replacement failed while it was rebuilt"),
        "{err}"
    );
    let m = f.members();
    assert!(
        m[1]["name"] == f.path(1).as_str() && m[1]["state"] == "ok" && m[1]["outgoing"].is_null(),
        "{m}"
    );
    f.read_back("with the slot given back");
    let mut scrub: Vec<String> = vec!["check".into(), "--scrub".into()];
    for i in 0..4 {
        scrub.extend(["--device".to_string(), f.path(i)]);
    }
    let _dir = f.stop();
    let (ok, out) = run(Command::new(env!("CARGO_BIN_EXE_salsa")).args(&scrub));
    assert!(ok, "salsa check --scrub on the pool's own members: {out}");
}

/// A rebuild's rate limit, kept across a crash and changed offline and online: `salsa device
/// replace --rate 1` (one byte a second: after its first segment the rebuild pauses for days)
/// shows its limit in `salsa stats`; the server is killed; `salsa info` shows the member
/// being rebuilt and the limit; `salsa device rebuild-rate 2` changes it offline; the next
/// server resumes the rebuild at that limit, and `salsa device rebuild-rate none` through its
/// control socket lifts it, so that the rebuild finishes. With no rebuild left, and with a
/// rate that is not one, the command fails with a clear message. Both servers run an
/// `--on-event` command, which hears of every change of the member's state.
#[test]
fn a_rebuild_s_rate_limit_survives_a_crash_and_changes_offline_and_online() {
    let dir = test_dir("rebuild-rate");
    let path = |i: usize| dir.join(format!("m{i}.img")).display().to_string();
    let members: Vec<String> = (0..4).map(|i| format!("{}:24M", path(i))).collect();
    let salsa = |args: &[&str]| run(Command::new(env!("CARGO_BIN_EXE_salsa")).args(args));
    let events_log = dir.join("events.log");
    let on_event = format!(
        "echo \"$SALSA_EVENT $SALSA_SLOT $SALSA_MEMBER $SALSA_PREVIOUS_STATE\" >> {}",
        events_log.display()
    );
    let events = || std::fs::read_to_string(&events_log).unwrap_or_default();
    let wait_for_event = |line: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !events().lines().any(|l| l == line) {
            assert!(std::time::Instant::now() < deadline, "no event {line:?}: {:?}", events());
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    let srv = Server::start_on(
        &dir,
        &members,
        &["--array", "raid5", "--segment-size", "3M", "--on-event", &on_event],
    );
    // Data in several segments, so that the rebuild has more than one to copy.
    let mut c = RawClient::connect(&srv.socket, "default");
    for i in 0..16u64 {
        let block = vec![i as u8 + 1; 1 << 20];
        let (error, _) = c.call(0, 1, i << 20, block.len() as u32, &block);
        assert_eq!(error, 0, "write {i}");
    }
    assert_eq!(c.call(0, 3, 0, 0, &[]).0, 0, "flush");
    drop(c);
    let (ok, out) = salsa(&["device", "fail", "--device", &path(0), &path(1)]);
    assert!(ok, "salsa device fail: {out}");
    wait_for_event(&format!("member-failed 1 {} ok", path(1)));
    let new = format!("{}:24M", path(4));
    let rebuild_stats = || {
        let (ok, out) = salsa(&["stats", "--json", "--device", &path(0)]);
        assert!(ok, "salsa stats: {out}");
        serde_json::from_str::<serde_json::Value>(out.trim()).unwrap()["rebuild"].clone()
    };
    let wait_for = |what: &str, done: &dyn Fn(&serde_json::Value) -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let r = rebuild_stats();
            if done(&r) {
                return r;
            }
            assert!(std::time::Instant::now() < deadline, "{what}: {r}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    let mut replace = replace_at_one_byte_a_second(&path(0), &path(1), &new);
    let r = wait_for("no rebuild in the statistics", &|r| r.is_object());
    assert_eq!(r["rate_bytes_per_sec"], 1, "{r}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(replace.try_wait().unwrap().is_none(), "the rebuild ran past its rate limit");
    wait_for_event(&format!("member-rebuilding 1 {} failed", path(4)));
    srv.kill();
    let out = replace.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("closed the control connection"), "{err}");
    // Offline, on the pool as the crash left it.
    let pool: Vec<String> = [0, 4, 2, 3].iter().map(|&i| path(i)).collect();
    let on_pool = |first: &[&str]| {
        let mut args: Vec<String> = first.iter().map(|a| a.to_string()).collect();
        for p in &pool {
            args.extend(["--device".to_string(), p.clone()]);
        }
        run(Command::new(env!("CARGO_BIN_EXE_salsa")).args(args))
    };
    let (ok, out) = on_pool(&["info"]);
    assert!(ok, "salsa info: {out}");
    assert!(out.contains("DEGRADED: 1 being rebuilt") && out.contains("REBUILDING"), "{out}");
    assert!(out.contains("rebuild     slot 1:") && out.contains("at most 1 B/s"), "{out}");
    let (ok, out) = on_pool(&["device", "rebuild-rate", "2"]);
    assert!(ok && out.contains("at most 2 B/s"), "salsa device rebuild-rate offline: {out}");
    let srv = Server::start_on(&dir, &pool, &["--on-event", &on_event]);
    let r = rebuild_stats();
    assert!(
        r.is_object() && r["rate_bytes_per_sec"] == 2,
        "the rebuild did not resume at its limit: {r}"
    );
    // A server that starts with a member being rebuilt says so.
    wait_for_event(&format!("member-rebuilding 1 {} ok", path(4)));
    let (ok, out) = salsa(&["device", "rebuild-rate", "--device", &path(0), "none"]);
    assert!(ok && out.contains("without a rate limit"), "salsa device rebuild-rate: {out}");
    wait_for("the rebuild did not finish without its limit", &|r| r.is_null());
    wait_for_event(&format!("member-ok 1 {} rebuilding", path(4)));
    assert_eq!(events().lines().count(), 4, "each change once: {}", events());
    let (ok, out) = salsa(&["device", "rebuild-rate", "--device", &path(0), "10M"]);
    assert!(!ok && out.contains("no rebuild is in progress"), "{out}");
    let (ok, out) = salsa(&["device", "rebuild-rate", "--device", &path(0), "fast"]);
    assert!(!ok && out.contains("fast"), "{out}");
    srv.stop();
    let (ok, out) = on_pool(&["check", "--scrub"]);
    assert!(ok && out.contains("0 disagreed"), "salsa check --scrub after the rebuild: {out}");
}

/// fio over NBD on a RAID-5 pool of four files: random writes verified while the GC runs, and
/// while one member is failed and rebuilt onto a fifth file through the control socket; then
/// `salsa check --scrub` finds every parity right. Then a member file is removed and the pool,
/// reopened degraded on the other three, serves every block to fio's verification pass, and
/// an ext4 file system on it mounts, takes new files and fscks clean.
#[test]
fn fio_and_ext4_on_a_raid5_pool_survive_a_failure_a_rebuild_and_a_lost_member() {
    require("fio");
    require("nbdfuse");
    require("mkfs.ext4");
    let dir = test_dir("raid5");
    let path = |i: usize| dir.join(format!("m{i}.img")).display().to_string();
    let members: Vec<String> = (0..4).map(|i| format!("{}:40M", path(i))).collect();
    let fio = |srv: &Server, extra: &[&str]| {
        run(Command::new("fio")
            .args(["--name=raid5", "--ioengine=nbd", &format!("--uri={}", srv.uri()), "--rw=randwrite"])
            .args([
                "--iodepth=16",
                "--size=64M",
                "--bs=4k",
                "--randseed=7",
                "--verify=crc32c",
                "--verify_fatal=1",
                "--loops=6",
            ])
            .args(extra))
    };
    let salsa = |args: &[&str]| run(Command::new(env!("CARGO_BIN_EXE_salsa")).args(args));
    // A small write buffer: fio's overwrites still reach the log and keep the GC busy.
    let srv = Server::start_on(&dir, &members, &["--array", "raid5", "--write-buffer", "4M"]);
    let (report, fio_out) = std::thread::scope(|s| {
        let writer = s.spawn(|| fio(&srv, &[]));
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let (ok, out) = salsa(&["device", "fail", "--device", &path(0), &path(1)]);
        assert!(ok, "salsa device fail: {out}");
        let new = format!("{}:40M", path(4));
        let (ok, out) = salsa(&["device", "replace", "--device", &path(0), &path(1), &new]);
        assert!(ok, "salsa device replace: {out}");
        (out, writer.join().unwrap())
    });
    assert!(
        fio_out.0 && !fio_out.1.contains("verify: bad"),
        "fio during the failure and rebuild:\n{}",
        fio_out.1
    );
    assert!(report.contains("rebuilt") && report.contains("segments"), "{report}");
    let (ok, out) = salsa(&["stats", "--json", "--device", &path(0)]);
    assert!(ok, "salsa stats: {out}");
    let stats: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(stats["array"], "raid5", "{stats}");
    let members_now = stats["members"].as_array().unwrap();
    assert_eq!(members_now[1]["name"].as_str().unwrap(), path(4), "{stats}");
    for m in members_now {
        assert_eq!(m["state"], "ok", "{m}");
        assert!(m["parity_bytes_written"].as_u64().unwrap() > 0, "{m}");
    }
    assert!(stats["gc_segments_cleaned"].as_u64().unwrap() > 0, "the GC ran: {stats}");
    srv.stop();
    let pool: Vec<String> = [0, 4, 2, 3].iter().map(|&i| path(i)).collect();
    let mut args = vec!["check", "--scrub"];
    for p in &pool {
        args.extend(["--device", p.as_str()]);
    }
    let (ok, out) = salsa(&args);
    assert!(ok && out.contains("0 disagreed"), "salsa check --scrub after the rebuild: {out}");
    // The replaced member is stale: with it instead of the new one, the pool does not open.
    let mut stale = args.clone();
    stale[5] = Box::leak(path(1).into_boxed_str());
    let (ok, out) = salsa(&stale);
    assert!(!ok && out.contains("replaced"), "{out}");
    // A member is lost.
    std::fs::remove_file(path(2)).unwrap();
    let degraded: Vec<String> = [0, 4, 3].iter().map(|&i| path(i)).collect();
    let srv = Server::start_on(&dir, &degraded, &[]);
    let (ok, out) = fio(&srv, &["--verify_only"]);
    assert!(ok && !out.contains("verify: bad"), "fio verification on the degraded pool:\n{out}");
    assert!(srv.log().contains("opens degraded"), "{}", srv.log());
    with_filesystem(&srv, true, |mnt| {
        for i in 0..10 {
            std::fs::write(mnt.join(format!("f{i}")), file_bytes(i)).unwrap();
        }
    });
    with_filesystem(&srv, false, |mnt| {
        for i in 0..10 {
            assert_eq!(std::fs::read(mnt.join(format!("f{i}"))).unwrap(), file_bytes(i), "file f{i}");
        }
    });
    srv.stop();
    let mut check = vec!["check"];
    for d in &degraded {
        check.extend(["--device", d.as_str()]);
    }
    let (ok, out) = salsa(&check);
    assert!(ok, "salsa check of the degraded pool: {out}");
}

/// Mounts ext4 on a loop device over nbdfuse, runs `f`, unmounts and fscks.
fn with_filesystem(srv: &Server, mkfs: bool, f: impl FnOnce(&std::path::Path)) {
    let dir = &srv.dir;
    let mut attached = Attached::new(srv);
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let loopdev = attached.loop_device().to_string();
    if mkfs {
        let (ok, out) = run(Command::new("mkfs.ext4").args(["-q", "-F", &loopdev]));
        assert!(ok, "mkfs: {out}");
    }
    let (ok, out) = run(Command::new("mount").arg(&loopdev).arg(&mnt));
    assert!(ok, "mount: {out}");
    attached.mounted = Some(mnt.clone());
    f(&mnt);
    let (ok, out) = run(Command::new("umount").arg(&mnt));
    assert!(ok, "umount: {out}");
    attached.mounted = None;
    let (ok, out) = run(Command::new("fsck.ext4").args(["-f", "-n", &loopdev]));
    assert!(ok, "fsck is not clean: {out}");
}

/// A server's export attached as a loop device over nbdfuse (in `fuse/` of the server's
/// directory), and maybe mounted; dropping it unmounts, detaches and stops nbdfuse in that
/// order (so every write reaches the server), also when the test fails half way, so that no
/// mount, loop device or FUSE mount outlives the test.
struct Attached {
    fuse: std::process::Child,
    fuse_dir: std::path::PathBuf,
    loop_device: Option<String>,
    mounted: Option<std::path::PathBuf>,
}

impl Attached {
    fn new(srv: &Server) -> Attached {
        let fuse_dir = srv.dir.join("fuse");
        std::fs::create_dir_all(&fuse_dir).unwrap();
        let fuse = Command::new("nbdfuse").arg(&fuse_dir).arg(srv.uri()).spawn().unwrap();
        let mut attached = Attached {
            fuse,
            fuse_dir,
            loop_device: None,
            mounted: None,
        };
        let node = attached.fuse_dir.join("nbd");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !node.exists() {
            assert!(std::time::Instant::now() < deadline, "nbdfuse did not come up");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let (ok, out) = run(Command::new("losetup").args(["-f", "--show"]).arg(&node));
        assert!(ok, "losetup: {out}");
        attached.loop_device = Some(out.trim().to_string());
        attached
    }

    fn loop_device(&self) -> &str {
        self.loop_device.as_deref().unwrap_or_default()
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        if let Some(mnt) = self.mounted.take() {
            let _ = run(Command::new("umount").arg(&mnt));
        }
        if let Some(dev) = self.loop_device.take() {
            let _ = run(Command::new("losetup").args(["-d", &dev]));
        }
        let _ = run(Command::new("fusermount3").arg("-u").arg(&self.fuse_dir));
        if matches!(self.fuse.try_wait(), Ok(None)) {
            // Unmounted, nbdfuse exits by itself; wait a moment before making sure.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while matches!(self.fuse.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let _ = self.fuse.kill();
        }
        let _ = self.fuse.wait();
    }
}

fn file_bytes(i: usize) -> Vec<u8> {
    (0..(100_000 + i * 37_000)).map(|j| (j * 31 + i * 7) as u8).collect()
}

#[test]
fn ext4_on_nbdfuse_loop_survives_restart() {
    require("nbdfuse");
    require("mkfs.ext4");
    require("losetup");
    let dir = test_dir("ext4");
    let srv = Server::start(&dir, "128M", &[]);
    with_filesystem(&srv, true, |mnt| {
        for i in 0..20 {
            std::fs::write(mnt.join(format!("f{i}")), file_bytes(i)).unwrap();
        }
        std::fs::create_dir(mnt.join("sub")).unwrap();
        std::fs::write(mnt.join("sub/x"), b"hello").unwrap();
    });
    srv.stop();
    let srv = Server::start(&dir, "128M", &[]);
    with_filesystem(&srv, false, |mnt| {
        for i in 0..20 {
            assert_eq!(std::fs::read(mnt.join(format!("f{i}"))).unwrap(), file_bytes(i), "file f{i}");
        }
        assert_eq!(std::fs::read(mnt.join("sub/x")).unwrap(), b"hello");
    });
    srv.stop();
}

/// ext4 on a dual-mapping volume (64 KiB large pages): the file system's 4 KiB metadata
/// writes go to the sparse map, files land in large pages; its policy is changed while it is
/// served (through the control socket), and everything survives a restart and an fsck.
#[test]
fn ext4_on_a_dual_mapping_volume_with_policies_changed_online() {
    require("nbdfuse");
    require("mkfs.ext4");
    let dir = test_dir("ext4-dual");
    let device = format!("{}", dir.join("pool.img").display());
    let salsa = |args: &[&str]| {
        let (ok, out) = run(Command::new(env!("CARGO_BIN_EXE_salsa")).args(args));
        assert!(ok, "salsa {args:?}: {out}");
        out
    };
    salsa(&[
        "format",
        "-d",
        &format!("{device}:160M"),
        "--segment-size",
        "1M",
        "--no-default-volume",
    ]);
    salsa(&[
        "volume",
        "create",
        "-d",
        &device,
        "default",
        "96M",
        "--controller",
        "dual",
        "--victim",
        "greedy",
    ]);
    let srv = Server::start(&dir, "160M", &[]);
    with_filesystem(&srv, true, |mnt| {
        for i in 0..20 {
            std::fs::write(mnt.join(format!("f{i}")), file_bytes(i)).unwrap();
        }
        std::fs::create_dir(mnt.join("sub")).unwrap();
        std::fs::write(mnt.join("sub/x"), b"hello").unwrap();
    });
    let stats: serde_json::Value = serde_json::from_str(&salsa(&["stats", "--json", "-d", &device])).unwrap();
    let v = &stats["volumes"][0];
    assert_eq!(v["controller"], "dual");
    assert!(
        v["small_pages_written"].as_u64().unwrap() > 10,
        "ext4's metadata went to the sparse map: {v}"
    );
    // Changed while served, and recorded.
    salsa(&[
        "volume",
        "set",
        "-d",
        &device,
        "default",
        "--placement",
        "user-gc",
        "--victim",
        "fifo",
    ]);
    let stats: serde_json::Value = serde_json::from_str(&salsa(&["stats", "--json", "-d", &device])).unwrap();
    assert_eq!(
        (stats["volumes"][0]["placement"].as_str(), stats["volumes"][0]["victim"].as_str()),
        (Some("user-gc"), Some("fifo"))
    );
    srv.stop();
    let list: serde_json::Value = serde_json::from_str(&salsa(&["volume", "list", "-d", &device, "--json"])).unwrap();
    assert_eq!(list[0]["victim"], "fifo");
    assert_eq!(
        list[0]["settings"]["sparse_pages"],
        96 * 256 / 16,
        "the default: a sixteenth of its small pages"
    );
    let srv = Server::start(&dir, "160M", &[]);
    with_filesystem(&srv, false, |mnt| {
        for i in 0..20 {
            assert_eq!(std::fs::read(mnt.join(format!("f{i}"))).unwrap(), file_bytes(i), "file f{i}");
        }
        assert_eq!(std::fs::read(mnt.join("sub/x")).unwrap(), b"hello");
    });
    srv.stop();
}

#[test]
fn nbdsh_block_status_trim_and_multi_conn() {
    require("nbdsh");
    let dir = test_dir("nbdsh");
    let srv = Server::start(&dir, "64M", &[]);
    // nbdsh's launcher runs `python3`; the libnbd bindings live in the system Python.
    let path = format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default());
    let script = r#"
h.pwrite(b"\x42" * 131072, 1 << 20)
h.flush()
assert h.pread(131072, 1 << 20) == b"\x42" * 131072
h.trim(65536, 1 << 20)
h.zero(4096, (1 << 20) + 65536 + 8192)
entries = []
def f(metacontext, offset, e, err):
    entries.extend(e)
h.block_status(1 << 21, 0, f)
# never written + trimmed [0, 1M + 64K): one hole; then data, the zeroed page, data, hole.
assert entries[:8] == [(1 << 20) + 65536, 3, 8192, 0, 4096, 3, 53248, 0], entries
assert h.pread(8192, (1 << 20) + 65536) == b"\x42" * 8192
assert h.pread(4096, (1 << 20) + 65536 + 8192) == bytes(4096)
assert h.pread(4096, 1 << 20) == bytes(4096)
assert h.can_multi_conn() and h.can_fua() and h.can_trim() and h.can_zero() and h.can_fast_zero()
print("nbdsh ok")
"#;
    let (ok, out) = run(Command::new("nbdsh")
        .env("PATH", path)
        .args(["--base-allocation", "-u", &srv.uri(), "-c", script]));
    assert!(ok && out.contains("nbdsh ok"), "{out}");
    srv.stop();
}

/// An AMF volume over NBD: its segment is the preferred block size; appends are taken, an
/// overwrite is refused with EPERM and a partial-segment trim with EINVAL, changing nothing; a
/// whole-segment trim empties it for rewriting; the rules hold after a restart.
#[test]
fn an_amf_volume_over_nbd_refuses_overwrites_and_partial_trims() {
    require("nbdsh");
    let dir = test_dir("amf-nbd");
    let args = ["--controller", "amf", "--amf-segment", "256K"];
    let path = format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default());
    let nbdsh = |srv: &Server, script: &str| {
        let script = format!("import errno\n{script}\nprint(\"nbdsh ok\")\n");
        let (ok, out) = run(Command::new("nbdsh").env("PATH", &path).args(["-u", &srv.uri(), "-c", &script]));
        assert!(ok && out.contains("nbdsh ok"), "{out}");
    };
    let srv = Server::start(&dir, "64M", &args);
    nbdsh(
        &srv,
        r#"
SEG = 262144
assert h.get_block_size(nbd.SIZE_PREFERRED) == SEG, h.get_block_size(nbd.SIZE_PREFERRED)
h.pwrite(b"\x11" * 65536, 0)
h.pwrite(b"\x22" * 65536, 65536)
def refused(f, code):
    try:
        f()
    except nbd.Error as e:
        assert e.errnum == code, (e.errnum, code, e)
        return
    raise Exception("accepted")
refused(lambda: h.pwrite(b"\x33" * 4096, 0), errno.EPERM)
refused(lambda: h.pwrite(b"\x33" * 4096, 4 * 65536 + 4096), errno.EPERM)
refused(lambda: h.trim(65536, 0), errno.EINVAL)
refused(lambda: h.pwrite(b"\x33" * 512, 2 * 65536), errno.EINVAL)
assert h.pread(65536, 0) == b"\x11" * 65536
assert h.pread(65536, 65536) == b"\x22" * 65536
h.pwrite(b"\x55" * SEG, SEG)
h.trim(SEG, 0)
assert h.pread(SEG, 0) == bytes(SEG)
h.pwrite(b"\x44" * 4096, 0)
h.flush()
"#,
    );
    srv.stop();
    let srv = Server::start(&dir, "64M", &args);
    nbdsh(
        &srv,
        r#"
assert h.pread(4096, 0) == b"\x44" * 4096
assert h.pread(4096, 262144) == b"\x55" * 4096
try:
    h.pwrite(b"\x66" * 4096, 262144)
    raise Exception("an overwrite after the restart was accepted")
except nbd.Error as e:
    assert e.errnum == errno.EPERM, e
h.pwrite(b"\x66" * 4096, 262144 + 262144)
"#,
    );
    srv.stop();
}

#[test]
fn salsa_share_remaps_through_the_control_socket_and_offline() {
    require("nbdsh");
    let dir = test_dir("share-cli");
    let device = dir.join("pool.img");
    let path = format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default());
    let nbdsh = |srv: &Server, script: &str| {
        let script = format!("{script}\nprint(\"nbdsh ok\")\n");
        let (ok, out) = run(Command::new("nbdsh").env("PATH", &path).args(["-u", &srv.uri(), "-c", &script]));
        assert!(ok && out.contains("nbdsh ok"), "{out}");
    };
    let share = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_salsa"));
        cmd.arg("share").arg("--device").arg(&device).args(args);
        run(&mut cmd)
    };
    let srv = Server::start(&dir, "64M", &[]);
    nbdsh(&srv, "h.pwrite(bytes(i % 251 for i in range(65536)), 0)\nh.flush()");
    let (ok, out) = share(&["1M:0:64K", "2M:4K:4K"]);
    assert!(ok && out.contains("shared 2 range(s)"), "{out}");
    // Refused whole, with the reason: a partial page, overlapping destinations, no volume.
    let (ok, out) = share(&["5M:0:5K"]);
    assert!(!ok && out.contains("whole pages"), "{out}");
    let (ok, out) = share(&["6M:0:8K", "6M:0:4K"]);
    assert!(!ok && out.contains("overlapping"), "{out}");
    let (ok, out) = share(&["--volume", "nope", "6M:0:4K"]);
    assert!(!ok && out.contains("no volume"), "{out}");
    let (ok, out) = share(&["6M:0"]);
    assert!(!ok && out.contains("DST:SRC:LEN"), "{out}");
    nbdsh(
        &srv,
        r#"
data = bytes(i % 251 for i in range(65536))
assert h.pread(65536, 1 << 20) == data
assert h.pread(4096, 2 << 20) == data[4096:8192]
assert h.pread(8192, 5 << 20) == bytes(8192)
assert h.pread(8192, 6 << 20) == bytes(8192)
h.pwrite(b"\x01" * 4096, 0)
assert h.pread(4096, 1 << 20) == data[:4096]
h.flush()
"#,
    );
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_salsa"));
    let (ok, out) = run(cmd.args(["stats", "--json", "--device"]).arg(&device));
    assert!(ok, "{out}");
    let stats: serde_json::Value = serde_json::from_str(out.lines().last().unwrap_or("")).unwrap();
    assert_eq!(
        (stats["pages_shared"].as_u64(), stats["share_batches"].as_u64()),
        (Some(17), Some(1)),
        "{out}"
    );
    srv.stop();
    // Offline, on the pool's device.
    let (ok, out) = share(&["3M:1M:8K"]);
    assert!(ok && out.contains("shared 1 range(s)"), "{out}");
    // `salsa check` reads every page of every owner and finds the checkpoint and the log agree.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_salsa"));
    let (ok, out) = run(cmd.args(["check", "--device"]).arg(&device));
    assert!(ok && out.contains(" 0 problems"), "{out}");
    let srv = Server::start(&dir, "64M", &[]);
    nbdsh(
        &srv,
        r#"
data = bytes(i % 251 for i in range(65536))
assert h.pread(8192, 3 << 20) == data[:8192]
assert h.pread(4096, 0) == b"\x01" * 4096
"#,
    );
    srv.stop();
}

#[test]
fn stale_socket_is_replaced_and_a_second_server_is_refused() {
    let dir = test_dir("lock");
    let srv = Server::start(&dir, "48M", &[]);
    // A second server on the same pool is refused while the first runs.
    let (ok, out) = run(Command::new(env!("CARGO_BIN_EXE_salsa"))
        .args(["serve", "--no-tcp", "--unix"])
        .arg(dir.join("other.sock"))
        .arg("--device")
        .arg(dir.join("pool.img")));
    assert!(!ok && out.contains("in use by another SALSA process"), "{out}");
    // After kill -9 the socket file stays behind; the next server replaces it.
    let sock = srv.socket.clone();
    srv.kill();
    assert!(sock.exists(), "the killed server's socket should be left behind");
    let srv = Server::start(&dir, "48M", &[]);
    let c = RawClient::connect(&srv.socket, "");
    assert!(c.size > 0);
    drop(c);
    // And a live socket is never stolen.
    let (ok, out) = run(Command::new(env!("CARGO_BIN_EXE_salsa"))
        .args(["serve", "--no-tcp", "--unix"])
        .arg(&srv.socket)
        .arg("--device")
        .arg(dir.join("other.img:48M")));
    assert!(!ok && out.contains("another server is listening"), "{out}");
    srv.stop();
}

#[test]
fn serve_refuses_a_device_with_foreign_data() {
    let dir = test_dir("foreign");
    let img = dir.join("data.img");
    std::fs::write(&img, vec![7u8; 8 << 20]).unwrap();
    let (ok, out) = run(Command::new(env!("CARGO_BIN_EXE_salsa"))
        .args(["serve", "--no-tcp", "--unix"])
        .arg(dir.join("nbd.sock"))
        .arg("--device")
        .arg(&img));
    assert!(!ok && out.contains("salsa format --force"), "{out}");
    assert!(std::fs::read(&img).unwrap().iter().all(|&b| b == 7), "the device was modified");
    // A thread count out of range is refused before anything is opened.
    for bad in ["0", "257"] {
        let (ok, out) = run(Command::new(env!("CARGO_BIN_EXE_salsa"))
            .args(["serve", "--no-tcp", "--threads-per-connection", bad, "--device"])
            .arg(&img));
        assert!(!ok && out.contains("not in 1..=256"), "{out}");
    }
}

#[test]
fn salsa_check_passes_a_clean_pool_and_reports_damage() {
    require("nbdcopy");
    let dir = test_dir("check");
    let srv = Server::start(&dir, "48M", &[]);
    let image = dir.join("in.img");
    let block: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    let data: Vec<u8> = block.iter().cycle().take(1 << 20).copied().collect();
    std::fs::write(&image, &data).unwrap();
    let (ok, out) = run(Command::new("nbdcopy").arg(&image).arg(srv.uri()));
    assert!(ok, "{out}");
    srv.stop();
    let pool = dir.join("pool.img");
    let salsa = env!("CARGO_BIN_EXE_salsa");
    let (ok, out) = run(Command::new(salsa).args(["check", "--device"]).arg(&pool));
    assert!(ok && out.contains("0 problems"), "clean pool: {out}");
    // Damage one data page on the device (the first copy of the block found, whichever page
    // it is).
    let mut bytes = std::fs::read(&pool).unwrap();
    let at = (1 << 20..bytes.len())
        .step_by(4096)
        .find(|&o| bytes[o..o + 4096] == block[..])
        .expect("data page not found");
    bytes[at + 100] ^= 0x40;
    std::fs::write(&pool, &bytes).unwrap();
    let (ok, out) = run(Command::new(salsa).args(["check", "--device"]).arg(&pool));
    assert!(!ok, "check passed a damaged pool: {out}");
    // Every page holds the same block and nbdcopy writes concurrently, so which page sits
    // first on the device varies: exactly one page must be reported damaged.
    assert_eq!(out.matches(": checksum mismatch").count(), 1, "{out}");
}

/// A bit flipped in a data page on one member of a RAID-5 pool of files: `salsa check`
/// reads the page from the redundancy, says so, writes nothing and fails; `check --scrub`
/// tells the damaged page from the parity. Served, the pool reads every page right, rewrites
/// the damaged one and counts it for the member (`salsa stats --json`). Damaged again,
/// `check --scrub --repair` rewrites the page (not the parity) and passes; a check
/// afterwards finds nothing.
#[test]
fn check_and_scrub_find_and_repair_a_flipped_bit_on_a_raid5_member() {
    require("nbdcopy");
    let dir = test_dir("check-raid5");
    let path = |i: usize| dir.join(format!("m{i}.img")).display().to_string();
    let members: Vec<String> = (0..3).map(|i| format!("{}:24M", path(i))).collect();
    let srv = Server::start_on(&dir, &members, &["--array", "raid5"]);
    // Pages that each say which they are.
    let data: Vec<u8> = (0..256u32)
        .flat_map(|p| {
            let mut page = vec![0u8; 4096];
            for (i, b) in page.iter_mut().enumerate() {
                *b = (p as usize * 31 + i * 7) as u8;
            }
            page[..16].copy_from_slice(format!("salsa page {p:05}").as_bytes());
            page
        })
        .collect();
    let image = dir.join("in.img");
    std::fs::write(&image, &data).unwrap();
    let (ok, out) = run(Command::new("nbdcopy").arg("--flush").arg(&image).arg(srv.uri()));
    assert!(ok, "{out}");
    srv.stop();
    let salsa = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_salsa"));
        cmd.args(args);
        for i in 0..3 {
            cmd.args(["--device", &path(i)]);
        }
        run(&mut cmd)
    };
    // Damage page 100 where it sits on a member.
    let page = &data[100 * 4096..101 * 4096];
    let (member, at) = (0..3)
        .find_map(|i| {
            let bytes = std::fs::read(path(i)).unwrap();
            (0..bytes.len())
                .step_by(4096)
                .find(|&o| &bytes[o..o + 4096] == page)
                .map(|o| (i, o))
        })
        .expect("page 100 on a member");
    let mut bytes = std::fs::read(path(member)).unwrap();
    bytes[at + 1000] ^= 0x10;
    std::fs::write(path(member), &bytes).unwrap();

    let (ok, out) = salsa(&["check", "--scrub"]);
    assert!(!ok, "check passed a damaged member: {out}");
    assert!(out.contains("0 problems, 4.0 KiB damaged on a member"), "{out}");
    assert!(
        out.contains("pages failing their checksum on a member: 1, of which 1 readable from the redundancy, 0 rewritten"),
        "{out}"
    );
    assert!(!out.contains("failed:"), "a read-only check took the member for failed: {out}");
    assert_eq!(
        std::fs::read(path(member)).unwrap(),
        bytes,
        "a check without --repair wrote to the member"
    );

    // Served, the pool repairs the page when it is read, and says so per member.
    let all: Vec<String> = (0..3).map(path).collect();
    let srv = Server::start_on(&dir, &all, &[]);
    let back = dir.join("out.img");
    let (ok, out) = run(Command::new("nbdcopy").arg(srv.uri()).arg(&back));
    assert!(ok, "{out}");
    assert!(
        std::fs::read(&back).unwrap()[..data.len()] == data[..],
        "the data read back differs"
    );
    let (ok, out) = run(Command::new(env!("CARGO_BIN_EXE_salsa")).args(["stats", "--json", "--device", &path(0)]));
    assert!(ok, "salsa stats: {out}");
    let stats: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let m = &stats["members"][member];
    assert_eq!(
        (m["damaged_bytes"].as_u64(), m["repaired_bytes"].as_u64()),
        (Some(4096), Some(4096)),
        "{m}"
    );
    srv.stop();
    assert!(
        &std::fs::read(path(member)).unwrap()[at..at + 4096] == page,
        "the read did not rewrite the page"
    );

    // Damaged again, and repaired by the scrub this time.
    let mut bytes = std::fs::read(path(member)).unwrap();
    bytes[at + 2000] ^= 0x01;
    std::fs::write(path(member), &bytes).unwrap();
    let (ok, out) = salsa(&["check", "--scrub", "--repair"]);
    assert!(ok, "check --scrub --repair: {out}");
    assert!(out.contains("of which 1 readable from the redundancy, 1 rewritten"), "{out}");
    assert!(out.contains("4.0 KiB rewritten from the redundancy"), "{out}");
    let repaired = std::fs::read(path(member)).unwrap();
    assert!(&repaired[at..at + 4096] == page, "the page was not rewritten on its member");

    let (ok, out) = salsa(&["check", "--scrub"]);
    assert!(ok && out.contains("0 problems") && out.contains("0 disagreed"), "{out}");

    // Served: the scrub goes through the server and the pool keeps serving; the offline
    // check says to stop the server first.
    let srv = Server::start_on(&dir, &all, &[]);
    let (ok, out) = salsa(&["check"]);
    assert!(!ok && out.contains("stop the server first"), "{out}");
    let mut bytes = std::fs::read(path(member)).unwrap();
    bytes[at + 3000] ^= 0x04;
    std::fs::write(path(member), &bytes).unwrap();
    let (ok, out) = salsa(&["check", "--scrub"]);
    assert!(!ok && out.contains("1 disagreed") && out.contains("0 rewritten"), "{out}");
    let (ok, out) = salsa(&["check", "--scrub", "--repair"]);
    assert!(
        ok && out.contains("1 rewritten") && out.contains("4.0 KiB rewritten from the redundancy"),
        "{out}"
    );
    let (ok, out) = salsa(&["check", "--scrub"]);
    assert!(ok && out.contains("0 disagreed") && !out.contains("rewritten from"), "{out}");
    let (ok, out) = run(Command::new("nbdcopy").arg(srv.uri()).arg(&back));
    assert!(ok && std::fs::read(&back).unwrap()[..data.len()] == data[..], "{out}");
    srv.stop();
}

/// NBD over TLS as nbdkit and qemu-nbd offer it: certificates and pre-shared keys, checked with
/// libnbd's nbdinfo and nbdcopy (GnuTLS on the client side) and qemu-img (a data round trip
/// each); a plaintext client is refused when TLS is required, and so are a wrong key, an
/// unknown identity and a client that does not trust the server's certificate.
#[test]
fn nbd_over_tls_with_certificates_and_psk() {
    require("nbdinfo");
    require("nbdcopy");
    require("openssl");
    let dir = test_dir("tls");
    let pki = dir.join("pki");
    std::fs::create_dir_all(&pki).unwrap();
    let openssl = |args: &[&str]| {
        let (ok, out) = run(Command::new("openssl").args(args).current_dir(&pki));
        assert!(ok, "openssl {args:?}: {out}");
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca-key.pem",
        "-out",
        "ca-cert.pem",
        "-days",
        "2",
        "-subj",
        "/CN=salsa test CA",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server-key.pem",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    std::fs::write(pki.join("ext.cnf"), "subjectAltName=DNS:localhost,IP:127.0.0.1\n").unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca-cert.pem",
        "-CAkey",
        "ca-key.pem",
        "-CAcreateserial",
        "-out",
        "server-cert.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 11) as u8).collect();
    let image = dir.join("in.img");
    std::fs::write(&image, &data).unwrap();
    let round_trip = |uri: &str, what: &str| {
        let (ok, out) = run(Command::new("nbdcopy").arg(&image).arg(uri));
        assert!(ok, "{what}: {out}");
        let back = dir.join("out.img");
        let (ok, out) = run(Command::new("nbdcopy").arg(uri).arg(&back));
        assert!(ok, "{what}: {out}");
        assert!(std::fs::read(&back).unwrap()[..data.len()] == data[..], "{what}: data differs");
    };

    // Certificates, TLS required (the default with credentials).
    let pki_arg = pki.to_str().unwrap().to_string();
    let srv = Server::start(&dir, "64M", &["--tls-certificates", &pki_arg]);
    let tls_uri = format!("nbds://localhost:{}/default?tls-certificates={pki_arg}", srv.port);
    let (ok, out) = run(Command::new("nbdinfo").arg(&tls_uri));
    assert!(ok && out.contains("with TLS"), "{out}");
    round_trip(&tls_uri, "certificates");
    let (ok, out) = run(Command::new("nbdinfo").arg(srv.uri()));
    assert!(!ok, "a plaintext client was served although TLS is required: {out}");
    // A client that trusts another CA refuses the server.
    let other = dir.join("other-ca");
    std::fs::create_dir_all(&other).unwrap();
    let (ok, out) = run(Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "k.pem",
            "-out",
            "ca-cert.pem",
            "-days",
            "2",
            "-subj",
            "/CN=other",
        ])
        .current_dir(&other));
    assert!(ok, "{out}");
    let (ok, out) = run(Command::new("nbdinfo").arg(format!(
        "nbds://localhost:{}/default?tls-certificates={}",
        srv.port,
        other.display()
    )));
    assert!(!ok, "a client that does not trust the certificate connected: {out}");
    if which("qemu-img") {
        let (ok, out) = run(Command::new("qemu-img").args([
            "info",
            "--object",
            &format!("tls-creds-x509,id=tls0,endpoint=client,dir={pki_arg}"),
            "--image-opts",
            &format!("driver=nbd,host=localhost,port={},export=default,tls-creds=tls0", srv.port),
        ]));
        assert!(ok && out.contains("virtual size"), "qemu-img over TLS: {out}");
    }
    srv.stop();

    // Pre-shared keys, TLS optional: both kinds of client are served.
    let key: String = (0..32).map(|i| format!("{:02x}", (i * 37 + 11) as u8)).collect();
    let psk = dir.join("keys.psk");
    std::fs::write(&psk, format!("# test keys\nalice:{key}\n")).unwrap();
    let srv = Server::start(&dir, "64M", &["--tls", "on", "--tls-psk", psk.to_str().unwrap()]);
    let psk_uri =
        |user: &str, file: &std::path::Path| format!("nbds://{user}@localhost:{}/default?tls-psk-file={}", srv.port, file.display());
    round_trip(&psk_uri("alice", &psk), "PSK");
    let (ok, out) = run(Command::new("nbdinfo").arg(srv.uri()));
    assert!(ok && out.contains("without TLS"), "--tls on serves plaintext clients too: {out}");
    let wrong = dir.join("wrong.psk");
    std::fs::write(&wrong, format!("alice:{}\n", "ab".repeat(32))).unwrap();
    let (ok, out) = run(Command::new("nbdinfo").arg(psk_uri("alice", &wrong)));
    assert!(!ok, "a wrong key was accepted: {out}");
    std::fs::write(&wrong, format!("bob:{key}\n")).unwrap();
    let (ok, out) = run(Command::new("nbdinfo").arg(psk_uri("bob", &wrong)));
    assert!(!ok, "an unknown identity was accepted: {out}");
    srv.stop();

    // Bad credentials stop the server before it creates anything.
    let (ok, out) = run(Command::new(env!("CARGO_BIN_EXE_salsa")).args([
        "serve",
        "--device",
        dir.join("never.img:64M").to_str().unwrap(),
        "--tls-psk",
        image.to_str().unwrap(),
    ]));
    assert!(!ok && out.contains("nothing was created"), "{out}");
    assert!(!dir.join("never.img").exists());
}

fn which(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// `salsa volume` on a served pool goes through the server: a volume created is an export at
/// once, a grown one shows its new size to the next client, both are durable; a volume whose
/// export a client has open is not deleted, and is once the client is gone.
#[test]
fn volumes_are_created_grown_and_deleted_on_a_served_pool() {
    let dir = test_dir("volume-online");
    let device = dir.join("pool.img").display().to_string();
    let salsa = |args: &[&str]| run(Command::new(env!("CARGO_BIN_EXE_salsa")).args(args));
    let srv = Server::start(&dir, "96M", &[]);
    let (ok, out) = salsa(&["volume", "create", "-d", &device, "v2", "8M", "--victim", "greedy"]);
    assert!(ok && out.contains("created volume v2"), "{out}");
    let mut client = RawClient::connect(&srv.socket, "v2");
    assert_eq!(client.size, 8 << 20);
    let block = vec![0x5au8; 4096];
    assert_eq!(client.call(0, CMD_WRITE, 4096, 4096, &block).0, 0);
    let (ok, out) = salsa(&["volume", "resize", "-d", &device, "v2", "16M"]);
    assert!(ok, "{out}");
    assert_eq!(
        RawClient::connect(&srv.socket, "v2").size,
        16 << 20,
        "the next client sees the new size"
    );
    let (ok, out) = salsa(&["volume", "delete", "-d", &device, "v2"]);
    assert!(!ok && out.contains("open by 1 client"), "{out}");
    assert_eq!(
        client.call(0, CMD_READ, 4096, 4096, &[]),
        (0, block.clone()),
        "refused, and still served"
    );
    assert_eq!(client.call(0, CMD_FLUSH, 0, 0, &[]).0, 0);
    let (ok, out) = salsa(&["volume", "list", "-d", &device, "--json"]);
    assert!(ok, "{out}");
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    let v2 = list
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "v2")
        .expect("v2 listed")
        .clone();
    assert_eq!((v2["size_bytes"].as_u64(), v2["victim"].as_str()), (Some(16 << 20), Some("greedy")));
    drop(client);
    srv.stop();
    // Durable: the pool reopened offline has it, with its data.
    let (ok, out) = salsa(&["volume", "list", "-d", &device]);
    assert!(ok && out.contains("v2") && out.contains("16.0 MiB"), "{out}");
    let srv = Server::start(&dir, "96M", &[]);
    let mut client = RawClient::connect(&srv.socket, "v2");
    assert_eq!(client.call(0, CMD_READ, 4096, 4096, &[]), (0, block));
    client.send(0, CMD_DISC, 8, 0, 0, &[]).unwrap();
    drop(client);
    // The server counts the client gone once its connection closes.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let out = loop {
        let (ok, out) = salsa(&["volume", "delete", "-d", &device, "v2"]);
        if ok || std::time::Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(out.contains("deleted volume v2"), "{out}");
    let (ok, out) = salsa(&["volume", "list", "-d", &device]);
    assert!(ok && !out.contains("v2") && out.contains("default"), "{out}");
    let (ok, out) = salsa(&["volume", "create", "-d", &device, "default", "1M"]);
    assert!(!ok && out.contains("already exists"), "{out}");
    srv.stop();
}

/// A member file gone from a RAID-5 pool (a dead disk whose node vanished) does not keep the
/// server from starting with the command line it always had: the pool opens degraded, serves
/// reads and writes, and the file is not created again, even with a size given; `salsa info`
/// shows the same. With two gone it says which slots it misses.
#[test]
fn a_member_file_gone_leaves_a_raid5_pool_serving_degraded() {
    let dir = test_dir("member-gone");
    let path = |name: &str| dir.join(name).display().to_string();
    let salsa = |args: &[&str]| run(Command::new(env!("CARGO_BIN_EXE_salsa")).args(args));
    format_raid5_of_three(&dir);
    let srv = Server::start_on(&dir, &[path("a.img"), path("b.img"), path("c.img")], &[]);
    let mut client = RawClient::connect(&srv.socket, "default");
    let block: Vec<u8> = (0..4096u32).map(|i| (i * 13 + 1) as u8).collect();
    assert_eq!(client.call(0, CMD_WRITE, 1 << 20, 4096, &block).0, 0);
    assert_eq!(client.call(0, CMD_FLUSH, 0, 0, &[]).0, 0);
    drop(client);
    srv.stop();
    std::fs::remove_file(dir.join("b.img")).unwrap();
    let srv = Server::start_on(&dir, &[path("a.img"), format!("{}:64M", path("b.img")), path("c.img")], &[]);
    assert!(!dir.join("b.img").exists(), "the missing member was created again");
    let mut client = RawClient::connect(&srv.socket, "default");
    assert_eq!(client.call(0, CMD_READ, 1 << 20, 4096, &[]), (0, block.clone()));
    assert_eq!(client.call(0, CMD_WRITE, 2 << 20, 4096, &block).0, 0);
    assert_eq!(client.call(0, CMD_FLUSH, 0, 0, &[]).0, 0);
    drop(client);
    assert!(srv.log().contains("does not exist: the pool opens without it"), "{}", srv.log());
    srv.stop();
    let (ok, out) = salsa(&["info", "-d", &path("a.img"), "-d", &path("b.img"), "-d", &path("c.img")]);
    assert!(ok && out.contains("(does not exist)") && out.contains("DEGRADED"), "{out}");
    std::fs::remove_file(dir.join("c.img")).unwrap();
    let (ok, out) = salsa(&["info", "-d", &path("a.img"), "-d", &path("b.img"), "-d", &path("c.img")]);
    assert!(!ok && out.contains("slots 1, 2"), "{out}");
    assert!(!dir.join("b.img").exists() && !dir.join("c.img").exists());
}

/// `salsa serve --hot-spare`: a member that fails is rebuilt onto the spare at once, without
/// being asked, while the pool serves; the data reads back, the spare is a member after a
/// restart. A spare that holds data, and spares for a pool without redundancy, are refused at
/// start with nothing created.
#[test]
fn a_hot_spare_takes_the_place_of_a_failed_member_by_itself() {
    let dir = test_dir("hot-spare");
    let path = |name: &str| dir.join(name).display().to_string();
    let salsa = |args: &[&str]| run(Command::new(env!("CARGO_BIN_EXE_salsa")).args(args));
    format_raid5_of_three(&dir);
    let members = [path("a.img"), path("b.img"), path("c.img")];
    let spare = format!("{}:64M", path("spare.img"));
    let srv = Server::start_on(&dir, &members, &["--hot-spare", &spare]);
    assert!(!dir.join("spare.img").exists(), "a spare is created when it is needed");
    let mut client = RawClient::connect(&srv.socket, "default");
    let blocks: Vec<Vec<u8>> = (0..64u32).map(|b| (0..4096u32).map(|i| (i * 7 + b * 31) as u8).collect()).collect();
    for (b, block) in blocks.iter().enumerate() {
        assert_eq!(client.call(0, CMD_WRITE, b as u64 * (256 << 10), 4096, block).0, 0);
    }
    assert_eq!(client.call(0, CMD_FLUSH, 0, 0, &[]).0, 0);
    let (ok, out) = salsa(&["device", "fail", "-d", &path("a.img"), "1"]);
    assert!(ok, "{out}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (ok, out) = salsa(&["stats", "--json", "-d", &path("a.img")]);
        assert!(ok, "{out}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let m = &v["members"][1];
        if m["name"].as_str().is_some_and(|n| n.ends_with("spare.img")) && m["state"] == "ok" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the spare did not take over: {v}\n{}",
            srv.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    for (b, block) in blocks.iter().enumerate() {
        assert_eq!(
            client.call(0, CMD_READ, b as u64 * (256 << 10), 4096, &[]),
            (0, block.clone()),
            "block {b}"
        );
    }
    drop(client);
    srv.stop();
    let (ok, out) = salsa(&[
        "check",
        "--scrub",
        "-d",
        &path("a.img"),
        "-d",
        &path("spare.img"),
        "-d",
        &path("c.img"),
    ]);
    assert!(ok && out.contains("0 problems") && out.contains("0 disagreed"), "{out}");
    // Refused at start: a spare holding data (untouched), and spares of a linear pool.
    std::fs::write(dir.join("full.img"), vec![9u8; 4 << 20]).unwrap();
    let (ok, out) = salsa(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "-d",
        &path("a.img"),
        "-d",
        &path("spare.img"),
        "-d",
        &path("c.img"),
        "--hot-spare",
        &path("full.img"),
    ]);
    assert!(!ok && out.contains("hot spare") && out.contains("holds data"), "{out}");
    assert_eq!(std::fs::read(dir.join("full.img")).unwrap(), vec![9u8; 4 << 20]);
    let (ok, out) = salsa(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "-d",
        &format!("{}:32M", path("linear.img")),
        "--hot-spare",
        &format!("{}:32M", path("s2.img")),
    ]);
    assert!(!ok && out.contains("redundant pool"), "{out}");
    assert!(
        !dir.join("linear.img").exists() && !dir.join("s2.img").exists(),
        "files left behind"
    );
}

/// Formats a RAID-5 pool of `dir`/a.img, b.img and c.img (64 MiB each).
fn format_raid5_of_three(dir: &std::path::Path) {
    let member = |name: &str| format!("{}:64M", dir.join(name).display());
    let (ok, out) = run(Command::new(env!("CARGO_BIN_EXE_salsa")).args([
        "format",
        "--array",
        "raid5",
        "-d",
        &member("a.img"),
        "-d",
        &member("b.img"),
        "-d",
        &member("c.img"),
    ]));
    assert!(ok, "{out}");
}
