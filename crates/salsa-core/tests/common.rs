//! Helpers shared by the integration tests.
#![allow(dead_code)]

use salsa_core::device::MemoryDevice;
use salsa_core::{Device, OpenOptions, Pool, PoolConfig, Volume};
use std::sync::Arc;

pub const MIB: u64 = 1 << 20;
pub const PAGE: usize = 4096;

/// A count a test runs (seeds, cases): `default`, or the value of the environment variable
/// `var` for a longer sweep.
pub fn count_from_env<T: std::str::FromStr>(var: &str, default: T) -> T {
    std::env::var(var).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// A small pool config: 1 MiB segments, so a few MiB of writes keep the GC busy.
pub fn tiny_config() -> PoolConfig {
    PoolConfig {
        segment_bytes: Some(MIB),
        meta_interval_pages: Some(16),
        ..PoolConfig::default()
    }
}

pub fn inline_gc() -> OpenOptions {
    OpenOptions {
        background_gc: false,
        ..OpenOptions::default()
    }
}

pub fn memory_pool(size_mib: u64, opts: &OpenOptions) -> (Pool, Arc<dyn Device>) {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new("mem0", size_mib * MIB));
    let pool = Pool::create(vec![dev.clone()], &tiny_config(), opts).expect("create pool");
    (pool, dev)
}

/// A page whose bytes identify (volume, page, version), so a wrong block is recognisable.
pub fn pattern(vol: u32, page: u64, version: u64) -> Vec<u8> {
    let mut v = vec![0u8; PAGE];
    for (i, chunk) in v.chunks_mut(8).enumerate() {
        let word = (vol as u64) << 56 ^ page << 24 ^ version ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    v
}

/// Makes a page compressible: its first words repeated over it, how many depending on
/// (page, version), so that its compressed size changes as it is rewritten; its first 16
/// bytes (which name a pattern) stay as they are.
pub fn make_compressible(v: &mut [u8], page: u64, version: u64) {
    let words = 2 + ((version ^ page) % 300) as usize;
    for i in words * 8..v.len() {
        v[i] = v[i % (words * 8)];
    }
}

/// How long [`overwrite_from_threads_with`]'s threads overwrite.
#[derive(Clone, Copy)]
pub enum Overwrite {
    /// Each thread as many writes as the volume has pages, times this.
    Passes(u64),
    /// Each thread for this long.
    For(std::time::Duration),
}

/// [`overwrite_from_threads_with`] through `Volume::write`, for `passes` passes.
pub fn overwrite_from_threads(pool: &Pool, threads: u64, passes: u64) {
    overwrite_from_threads_with(pool, threads, Overwrite::Passes(passes), &|vol, at, data| {
        vol.write(at, data).unwrap()
    });
}

/// Fills a volume of 85% of `pool`'s capacity, then overwrites random pages from `threads`
/// threads for `how_long` (thread t owns the pages p with p % threads == t, so that the last
/// value of each page is known), every page written by `write(volume, offset, page)`; checks
/// that every page reads back its last write.
pub fn overwrite_from_threads_with(pool: &Pool, threads: u64, how_long: Overwrite, write: &(dyn Fn(&Volume, u64, &[u8]) + Sync)) {
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    let pages = (pool.logical_capacity_bytes() * 85 / 100) / PAGE as u64 / threads * threads;
    let vol = pool.create_volume("v", pages * PAGE as u64, PAGE as u32).unwrap();
    for p in 0..pages {
        write(&vol, p * PAGE as u64, &pattern(1, p, 1));
    }
    let started = std::time::Instant::now();
    // Whether a thread that made `i` overwrites is done.
    let done = |i: u64| match how_long {
        Overwrite::Passes(n) => i >= n * pages,
        Overwrite::For(d) => started.elapsed() >= d,
    };
    let last: Vec<Vec<u64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (vol, done) = (vol.clone(), &done);
                s.spawn(move || {
                    let mut rng = SmallRng::seed_from_u64(t);
                    let mut mine = vec![1u64; (pages / threads) as usize];
                    for i in (0..).take_while(|&i| !done(i)) {
                        let k = rng.gen_range(0..mine.len());
                        let p = k as u64 * threads + t;
                        write(&vol, p * PAGE as u64, &pattern(1, p, i + 2));
                        mine[k] = i + 2;
                    }
                    mine
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut buf = vec![0u8; PAGE];
    for p in 0..pages {
        vol.read(p * PAGE as u64, &mut buf).unwrap();
        let v = last[(p % threads) as usize][(p / threads) as usize];
        assert!(buf == pattern(1, p, v), "page {p} lost its last write");
    }
}
