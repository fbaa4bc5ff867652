//! Helpers shared by the integration tests.
#![allow(dead_code)]

use salsa_core::device::MemoryDevice;
use salsa_core::{Device, OpenOptions, Pool, PoolConfig};
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
