//! Crashes at every point of a short workload, and at seeded points of longer ones, on a device
//! that drops or tears what was not synced. After each crash the pool and the store reopen and
//! every file must read exactly as the table stood after the last change that returned, or
//! after the change in flight at the crash: a sync that returned is never lost, a rename or
//! delete is all or nothing, and no file holds bytes it was never given.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use salsa_core::device::{CrashDevice, CrashPlan};
use salsa_core::{Device, OpenOptions, Pool, PoolConfig, VolumeSpec};
use salsa_files::{FileStore, FileWriter};
use std::collections::BTreeMap;
use std::sync::Arc;

const MIB: u64 = 1 << 20;
/// Small journal segments, so that a short workload rolls the journal several times.
const SEG: u64 = 64 << 10;

/// Every file's content by name.
type Files = BTreeMap<String, Vec<u8>>;

fn opts() -> OpenOptions {
    OpenOptions {
        background_gc: false,
        write_back_threads: 0,
        ..OpenOptions::default()
    }
}

struct Open {
    writer: FileWriter,
    name: String,
    content: Vec<u8>,
}

/// The workload's model: `durable` is the table as of the last change that returned; `live`
/// the table the change under way makes (equal to `durable` between changes).
struct Model {
    durable: Files,
    live: Files,
}

/// Runs `steps` seeded operations; stops at the first error, which must be the crash
/// (`crashed` says whether the device crashed). Returns the model.
fn workload(store: &FileStore, seed: u64, steps: usize, crashed: &dyn Fn() -> bool) -> Model {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut m = Model {
        durable: Files::new(),
        live: Files::new(),
    };
    let mut open: Vec<Open> = Vec::new();
    let names = |rng: &mut SmallRng| format!("db/{:02}.{}", rng.gen_range(0..12), ["log", "sst", "tmp"][rng.gen_range(0..3)]);
    for _ in 0..steps {
        let closed: Vec<String> = m.live.keys().filter(|n| !open.iter().any(|o| &o.name == *n)).cloned().collect();
        let ok = match rng.gen_range(0..10) {
            0 | 1 => {
                let name = names(&mut rng);
                if open.iter().any(|o| o.name == name) {
                    continue;
                }
                // Replacing a file commits at once; a new name waits for the next commit.
                m.live.insert(name.clone(), Vec::new());
                match store.create(&name) {
                    Ok(writer) => {
                        if m.durable.contains_key(&name) {
                            m.durable = m.live.clone();
                        }
                        open.push(Open {
                            writer,
                            name,
                            content: Vec::new(),
                        });
                        true
                    }
                    Err(_) => false,
                }
            }
            2..=4 if !open.is_empty() => {
                let i = rng.gen_range(0..open.len());
                let len = if rng.gen_bool(0.3) {
                    rng.gen_range(1..200)
                } else {
                    rng.gen_range(1..20_000)
                };
                let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                open[i].content.extend_from_slice(&data);
                open[i].writer.append(&data).is_ok()
            }
            5 | 6 if !open.is_empty() => {
                // A sync, then half the time a close; or a close alone, which (as a kernel
                // file system's) promises nothing: what the file held since its last sync
                // may be lost, and the model keeps its synced content.
                let i = rng.gen_range(0..open.len());
                match rng.gen_range(0..4) {
                    0 => open.swap_remove(i).writer.close().is_ok(),
                    k => {
                        m.live.insert(open[i].name.clone(), open[i].content.clone());
                        let r = open[i].writer.sync();
                        if k == 1 && r.is_ok() {
                            open.swap_remove(i).writer.close().is_ok()
                        } else {
                            r.is_ok()
                        }
                    }
                }
            }
            7 if !closed.is_empty() => {
                let name = &closed[rng.gen_range(0..closed.len())];
                m.live.remove(name);
                store.delete(name).is_ok()
            }
            8 if !closed.is_empty() => {
                let from = closed[rng.gen_range(0..closed.len())].clone();
                let to = names(&mut rng);
                if open.iter().any(|o| o.name == to) {
                    continue;
                }
                let content = m.live.remove(&from).unwrap_or_default();
                m.live.insert(to.clone(), content);
                store.rename(&from, &to).is_ok()
            }
            9 => store.sync_metadata().is_ok(),
            _ => continue,
        };
        if !ok {
            assert!(crashed(), "seed {seed}: an operation failed without a crash");
            return m;
        }
        // Every change that commits made the whole live table durable; one that did not
        // commit (an append, a create of a new name) left `durable` as it was, which
        // `live` may now pass, and the next commit catches up.
        if committed(store) {
            m.durable = m.live.clone();
        }
    }
    m
}

/// Whether the store has nothing queued: every change so far is durable.
fn committed(store: &FileStore) -> bool {
    !store.has_pending_changes()
}

fn read_files(store: &FileStore) -> Files {
    let mut out = Files::new();
    for name in store.children("db") {
        let path = format!("db/{name}");
        let r = store.open_reader(&path).unwrap();
        let mut buf = vec![0u8; r.size() as usize];
        r.read_at(0, &mut buf).unwrap();
        out.insert(path, buf);
    }
    out
}

/// One run: a fresh pool, the workload with a crash before device operation `crash_at`
/// (`None`: no crash), recovery, the check. Returns the device operations the run made and the
/// journal's generation at the crash (how many times it rolled, plus one).
fn run(seed: u64, steps: usize, crash_at: Option<u64>) -> (u64, u64) {
    let dev = Arc::new(CrashDevice::new("crash0", 48 * MIB, CrashPlan::default()));
    let devs = || -> Vec<Arc<dyn Device>> { vec![dev.clone()] };
    let cfg = PoolConfig {
        segment_bytes: Some(MIB),
        meta_interval_pages: Some(8),
        ..PoolConfig::default()
    };
    let pool = Pool::create(devs(), &cfg, &opts()).unwrap();
    let vol = pool.create_volume_spec("kv", 12 * MIB, &VolumeSpec::amf(4096, Some(SEG))).unwrap();
    let store = FileStore::open(Arc::new(vol)).unwrap();
    store.create_dir("db").unwrap();
    pool.flush().unwrap();
    dev.restart(CrashPlan {
        crash_after_ops: crash_at,
        seed,
    });
    let model = workload(&store, seed, steps, &|| dev.has_crashed());
    let ops = dev.ops();
    let generation = store.stats().journal_generation;
    if crash_at.is_none() || !dev.has_crashed() {
        dev.crash_now();
    }
    drop(store);
    drop(pool);
    dev.restart(CrashPlan::default());
    let pool = Pool::open(devs(), &opts()).unwrap_or_else(|e| panic!("seed {seed} crash at {crash_at:?}: pool reopen: {e}"));
    let store = FileStore::open(Arc::new(pool.volume("kv").unwrap()))
        .unwrap_or_else(|e| panic!("seed {seed} crash at {crash_at:?}: store reopen: {e}"));
    let found = read_files(&store);
    let durable_names: Vec<_> = model.durable.keys().collect();
    let live_names: Vec<_> = model.live.keys().collect();
    assert!(
        found == model.durable || found == model.live,
        "seed {seed} crash at {crash_at:?}: files {:?} are neither the durable table {durable_names:?} nor the one in flight {live_names:?}",
        found.iter().map(|(n, c)| (n, c.len())).collect::<Vec<_>>()
    );
    // The reopened store takes new files, and a second reopen finds them.
    let mut w = store.create("db/after").unwrap();
    w.append(b"after the crash").unwrap();
    w.close().unwrap();
    drop(store);
    pool.close().unwrap();
    let pool = Pool::open(devs(), &opts()).unwrap();
    let store = FileStore::open(Arc::new(pool.volume("kv").unwrap())).unwrap();
    let r = store.open_reader("db/after").unwrap();
    let mut buf = vec![0u8; r.size() as usize];
    r.read_at(0, &mut buf).unwrap();
    assert_eq!(buf, b"after the crash", "seed {seed} crash at {crash_at:?}");
    (ops, generation)
}

fn count_from_env(var: &str, default: u64) -> u64 {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A crash before every device write and sync of a short workload, journal rolls included.
#[test]
fn a_crash_at_every_point_of_a_short_workload_loses_no_synced_change() {
    let seed = 7;
    let steps = 200;
    let (total, generation) = run(seed, steps, None);
    assert!(total > 50, "the workload made only {total} device operations");
    assert!(generation >= 3, "the journal rolled only {} times", generation - 1);
    for crash_at in 1..=total {
        run(seed, steps, Some(crash_at));
    }
}

/// Seeded crash points of longer workloads.
#[test]
fn crashes_at_seeded_points_of_longer_workloads_lose_no_synced_change() {
    let seeds = count_from_env("SALSA_FILES_CRASH_SEEDS", 24);
    for seed in 0..seeds {
        let steps = 300;
        let (total, _) = run(1000 + seed, steps, None);
        let mut rng = SmallRng::seed_from_u64(seed);
        for _ in 0..4 {
            run(1000 + seed, steps, Some(rng.gen_range(1..=total)));
        }
    }
}
