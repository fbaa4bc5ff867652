//! Unmodified RocksDB on an AMF volume through the plugin (`plugins/rocksdb`): Debian's
//! `db_bench` and `ldb` load it with LD_PRELOAD and name the file system by URI; a short
//! db_bench run flushes and compacts (so table files are deleted and their segments trimmed),
//! `ldb` finds the database consistent, and a writer of synced puts killed with SIGKILL at
//! seeded moments loses none of the puts it had seen acknowledged. No timing is asserted.
//!
//! Skipped with a message where RocksDB's tools or headers are missing
//! (`scripts/install-deps.sh` installs them).

mod common;
use common::library_dir;
use salsa_core::spec::DeviceSpec;
use salsa_core::{OpenOptions, Pool, PoolConfig, VolumeSpec};
use salsa_files::{FileKind, FileStore};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

const SEGMENT_BYTES: u64 = 1 << 20;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Why the test cannot run here, if it cannot.
fn missing_tools() -> Option<String> {
    for tool in ["db_bench", "ldb", "c++"] {
        if Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .map_or(true, |o| !o.status.success())
        {
            return Some(format!("{tool} is not installed"));
        }
    }
    if !Path::new("/usr/include/rocksdb/db.h").exists() {
        return Some("librocksdb-dev is not installed".into());
    }
    None
}

/// Compiles `source` (under plugins/rocksdb) into `out` with the extra arguments.
fn compile(source: &str, out: &Path, extra: &[&str]) {
    let lib = library_dir();
    let run = Command::new("c++")
        .args(["-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(out)
        .arg(repo().join("plugins/rocksdb").join(source))
        .arg("-I")
        .arg(repo().join("crates/salsa-capi/include"))
        .args(extra)
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lsalsa", "-lrocksdb"])
        .output()
        .expect("c++ runs");
    assert!(
        run.status.success(),
        "compiling {source} failed:\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

/// A test's setting: the plugin built into a temporary directory, beside a pool on a file with
/// an AMF volume `kv`; `None` (with a message) where RocksDB's tools or headers are missing.
struct Fixture {
    work: tempfile::TempDir,
    plugin: PathBuf,
    image: String,
}

impl Fixture {
    fn new() -> Option<Fixture> {
        if let Some(why) = missing_tools() {
            eprintln!("skipped: {why} (scripts/install-deps.sh installs it)");
            return None;
        }
        let work = tempfile::tempdir().unwrap();
        let plugin = work.path().join("librocksdb_salsa.so");
        compile("salsa_fs.cc", &plugin, &["-fPIC", "-shared"]);
        let image = work.path().join("pool.img").display().to_string();
        let dev = format!("{image}:512M").parse::<DeviceSpec>().unwrap().open(false).unwrap();
        let cfg = PoolConfig {
            segment_bytes: Some(SEGMENT_BYTES),
            ..PoolConfig::default()
        };
        let pool = Pool::create(vec![dev], &cfg, &OpenOptions::default()).unwrap();
        pool.create_volume_spec("kv", 2 << 30, &VolumeSpec::amf(4096, Some(SEGMENT_BYTES)))
            .unwrap();
        pool.close().unwrap();
        Some(Fixture { work, plugin, image })
    }

    /// The plugin's URI for the volume.
    fn uri(&self) -> String {
        format!("salsa://kv@{}", self.image)
    }

    /// `program` with the plugin loaded. The library search path names only the directory
    /// the plugin was linked against: cargo's own path for tests also lists target/release,
    /// whose libsalsa.so is whatever `cargo build` made last, and the loader prefers it to
    /// the plugin's run path.
    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        c.env("LD_PRELOAD", &self.plugin).env("LD_LIBRARY_PATH", library_dir());
        c
    }

    /// Asserts that `ldb checkconsistency` finds database `db` consistent.
    fn assert_consistent(&self, db: &str, when: &str) {
        let check = self
            .command("ldb")
            .args([&format!("--fs_uri={}", self.uri()), &format!("--db={db}"), "checkconsistency"])
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&check.stdout).contains("OK"),
            "ldb checkconsistency {when}:\n{}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
    }

    /// The file store's statistics, read with the pool opened here.
    fn store_stats(&self) -> salsa_files::StoreStats {
        let dev = self.image.parse::<DeviceSpec>().unwrap().open_existing(false).unwrap();
        let pool = Pool::open(vec![dev], &OpenOptions::default()).unwrap();
        let store = FileStore::open(Arc::new(pool.volume("kv").unwrap())).unwrap();
        let stats = store.stats();
        drop(store);
        pool.close().unwrap();
        stats
    }
}

#[test]
fn db_bench_and_ldb_run_on_an_amf_volume_through_the_plugin() {
    let Some(fx) = Fixture::new() else { return };
    let uri = format!("--fs_uri={}", fx.uri());
    let run = fx
        .command("db_bench")
        .args([
            &uri,
            "--db=db",
            "--benchmarks=fillrandom,overwrite,readrandom,readwhilewriting",
            "--num=6000",
            "--value_size=4096",
            "--compression_type=none",
            "--write_buffer_size=1048576",
            "--target_file_size_base=2097152",
            "--max_bytes_for_level_base=8388608",
            "--duration=3",
            "--threads=2",
        ])
        .output()
        .expect("db_bench runs");
    let out = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "db_bench failed:\n{out}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    for bench in ["fillrandom", "overwrite", "readrandom", "readwhilewriting"] {
        assert!(
            out.lines().any(|l| l.starts_with(bench) && l.contains("ops/sec")),
            "no {bench} result:\n{out}"
        );
    }
    fx.assert_consistent("db", "after db_bench");
    // db_bench exits without closing its database: what the log held in memory (no memtable
    // was flushed) must still reach the volume, as a page cache would write it.
    let fill = fx
        .command("db_bench")
        .args([
            &uri,
            "--db=seq",
            "--benchmarks=fillseq",
            "--num=3000",
            "--value_size=1000",
            "--compression_type=none",
        ])
        .output()
        .unwrap();
    assert!(fill.status.success(), "db_bench fillseq: {}", String::from_utf8_lossy(&fill.stderr));
    let scan = fx.command("ldb").args([&uri, "--db=seq", "scan"]).output().unwrap();
    let keys = String::from_utf8_lossy(&scan.stdout).lines().count();
    assert_eq!(keys, 3000, "keys after db_bench's exit: {}", String::from_utf8_lossy(&scan.stderr));
    let stats = fx.store_stats();
    let (sst, wal, manifest) = (stats.of(FileKind::Sst), stats.of(FileKind::Wal), stats.of(FileKind::Manifest));
    assert!(sst.files > 0 && sst.bytes > 0, "table files: {sst:?}");
    assert!(
        sst.segments_trimmed > 0,
        "compactions deleted table files, whose segments were trimmed: {sst:?}"
    );
    // The logs still live (each database's current ones) reached the volume at db_bench's
    // exit; the earlier ones were deleted, most before they were ever written (their bytes
    // stayed in memory, as in a page cache), so few of their segments were ever trimmed.
    assert!(wal.bytes > 0 && manifest.files > 0, "logs: {wal:?}, manifests: {manifest:?}");
}

#[test]
fn a_writer_killed_at_seeded_moments_keeps_every_acknowledged_synced_put() {
    let Some(fx) = Fixture::new() else { return };
    let writer = fx.work.path().join("crash_writer");
    compile("crash_writer.cc", &writer, &[]);
    let uri = fx.uri();
    let mut acknowledged = 0u64;
    // Seeded kill moments, in milliseconds after the writer started.
    for (round, kill_after_ms) in [700u64, 1900, 400, 2600].into_iter().enumerate() {
        let mut child = fx
            .command(&writer)
            .args(["write", &uri, "db", &acknowledged.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(kill_after_ms));
        child.kill().unwrap();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.trim().is_empty(), "round {round}: the writer reported an error:\n{stderr}");
        let last = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.trim().parse::<u64>().ok())
            .max();
        if let Some(last) = last {
            acknowledged = acknowledged.max(last + 1);
        }
        let check = fx
            .command(&writer)
            .args(["check", &uri, "db", &acknowledged.to_string()])
            .output()
            .unwrap();
        assert!(
            check.status.success(),
            "round {round}: after the kill, {acknowledged} acknowledged puts do not all read back:\n{}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
    }
    assert!(
        acknowledged > 100,
        "the writer had only {acknowledged} puts acknowledged in four rounds"
    );
    fx.assert_consistent("db", "after the kills");
}
