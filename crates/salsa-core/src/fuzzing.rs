//! Entry points for `cargo fuzz` (feature `fuzzing`; the target is
//! `fuzz/fuzz_targets/on_disk.rs`): bytes a damaged or foreign device could hold, given to
//! every decoder of the on-disk structures and to the decompressor of compressed pages. None
//! may panic, whatever the bytes; the unit tests run the same entry points on random bytes.

use crate::controller::compression;
use crate::format::{decode_every_structure, MAX_PARITY_ROW_GRAINS};

/// Structures are fixed blocks of this size on a pool of 4 KiB grains.
const BLOCK_BYTES: usize = 4096;

/// Decodes `data` as every on-disk structure and as a compressed page. The first byte picks
/// the format version written in the block (so the older versions' layouts are reached too),
/// the second the parity row width; the rest is the block's body, and the stored form of a
/// page of 4, 16 or 64 KiB.
pub fn on_disk(data: &[u8]) {
    let [version, row, rest @ ..] = data else { return };
    let version = crate::format::OLDEST_READABLE_VERSION + *version as u32 % (crate::format::FORMAT_VERSION + 2);
    let mut block = vec![0u8; BLOCK_BYTES];
    let n = rest.len().min(BLOCK_BYTES - 16);
    block[12..12 + n].copy_from_slice(&rest[..n]);
    decode_every_structure(&mut block, version, *row as u32 % (MAX_PARITY_ROW_GRAINS + 8));
    for page_bytes in [4096, 16384, 65536] {
        let mut page = vec![0u8; page_bytes];
        let _ = compression::decompress(rest, &mut page);
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    #[test]
    fn random_bytes_reach_every_decoder_without_a_panic() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        for i in 0..3000 {
            let mut data = vec![0u8; rng.gen_range(0..6000)];
            rng.fill(&mut data[..]);
            // Some inputs shaped as compressed pages: a codec byte, zeros, a length.
            if i % 3 == 0 && data.len() > 8 {
                data[2] = 1 + (i % 2) as u8;
                data[3..6].fill(0);
            }
            super::on_disk(&data);
        }
    }
}
