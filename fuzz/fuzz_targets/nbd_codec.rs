//! Arbitrary client bytes into the NBD handshake and request codec.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte picks how the input is split into reads.
    let (split, rest) = data.split_first().map(|(s, r)| (*s as usize % 64 + 1, r)).unwrap_or((1, data));
    salsa_nbd::fuzzing::drive(rest, &[split, 3, 17]);
});
