//! Arbitrary device bytes into every decoder of SALSA's on-disk structures (superblock, pool
//! metadata, records, parity buffer) and into the decompressor of compressed pages.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    salsa_core::fuzzing::on_disk(data);
});
