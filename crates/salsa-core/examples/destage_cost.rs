//! What a write-buffer destage costs in CPU, without a network, a client or a disk in the way:
//! a pool on a file opened with `O_DIRECT` as `salsa serve` opens it, a volume rewritten sequentially in 1 MiB writes through the
//! write buffer (as `salsa serve` receives them), then a flush that destages every page. The
//! process's CPU time (all threads: the destaging caller, the log's write-back threads, the GC)
//! is reported per GiB destaged, round by round, and the median at the end.
//!
//! Usage: cargo run --release --example destage_cost -- [ROUNDS] [READ_CACHE_MIB] [POOL_FILE]
//! (defaults: 7 rounds, a 1024 MiB read cache (0 turns it off), salsa-destage-cost.img in the
//! current directory, created and removed). The disk's speed does not change the figures much:
//! they are CPU time, not wall time.

use salsa_core::device::file::{FileDevice, FileOpenOptions};
use salsa_core::{Device, OpenOptions, Pool, PoolConfig};
use std::sync::Arc;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const VOLUME_BYTES: u64 = 768 * MIB;
const WRITE_BYTES: usize = MIB as usize;

/// User + system CPU time of the whole process, in seconds.
fn process_cpu_s() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; RUSAGE_SELF is always valid.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    s(usage.ru_utime) + s(usage.ru_stime)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(7);
    let cache_mib: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1024);
    let path = std::path::PathBuf::from(args.next().unwrap_or_else(|| "salsa-destage-cost.img".into()));
    let _ = std::fs::remove_file(&path);
    let file = FileDevice::open(
        &path,
        FileOpenOptions {
            create_size_bytes: Some(1280 * MIB),
            direct: true,
            read_only: false,
        },
    )
    .expect("create the pool file");
    let dev: Arc<dyn Device> = Arc::new(file);
    let opts = OpenOptions {
        read_cache_bytes: cache_mib * MIB,
        write_buffer_bytes: 2 * VOLUME_BYTES,
        // Only the flush destages: the destager's age and fill triggers stay out of the way.
        write_buffer_expire: Duration::from_secs(3600),
        ..OpenOptions::default()
    };
    let pool = Pool::create(vec![dev], &PoolConfig::default(), &opts).expect("create pool");
    let vol = pool.create_volume("v", VOLUME_BYTES, 4096).expect("create volume");
    let data: Vec<u8> = (0..WRITE_BYTES).map(|i| (i * 7 % 251) as u8).collect();
    let mut per_gib = Vec::new();
    for round in 0..rounds {
        for at in (0..VOLUME_BYTES).step_by(WRITE_BYTES) {
            vol.write(at, &data).expect("write");
        }
        let before = process_cpu_s();
        pool.flush().expect("flush");
        let cpu_s = process_cpu_s() - before;
        let gib = VOLUME_BYTES as f64 / (1u64 << 30) as f64;
        println!("round {round}: destage {:.3} CPU s/GiB", cpu_s / gib);
        // The first round fills an empty volume (no old copies to drop): not counted.
        if round > 0 {
            per_gib.push(cpu_s / gib);
        }
    }
    per_gib.sort_by(f64::total_cmp);
    if let Some(m) = per_gib.get(per_gib.len() / 2) {
        println!("median: {m:.3} CPU s/GiB destaged (read cache {cache_mib} MiB)");
    }
    pool.close().expect("close");
    let _ = std::fs::remove_file(&path);
}
