//! Inline compression of a volume's pages: the codec a volume uses ([`Compression`], recorded
//! in its volume-table entry as one setting) and the stored form of a compressed page.
//!
//! A page is compressed alone and stored in the smallest whole number of grains that holds
//! it; a page that would not save at least one grain is stored as it is (decided by the
//! compressor running out of room, so incompressible data costs one pass and no second
//! copy). The stored form of a compressed page is an 8-byte header (codec, reserved zeros,
//! compressed length) followed by the compressed bytes and zeros to the grain's end. The
//! codec travels with the data, so a volume's codec can change while pages written with the
//! old one stay readable.
//!
//! Invariants: a stored page is shorter than its page by at least one grain; decompression
//! either yields exactly one page or fails (a damaged page is an error, never garbage; the
//! log has checked the stored bytes' checksum before this runs).

use std::cell::RefCell;

/// Bytes in front of a compressed page's data: codec, three reserved bytes, length (u32 LE).
pub const STORED_HEADER_BYTES: usize = 8;
const CODEC_LZ4: u8 = 1;
const CODEC_ZSTD: u8 = 2;
/// zstd levels a volume may use.
pub const ZSTD_LEVELS: std::ops::RangeInclusive<i32> = 1..=19;
const ZSTD_DEFAULT_LEVEL: i32 = 3;

/// How a volume compresses the pages it writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    #[default]
    Off,
    Lz4,
    Zstd(i32),
}

impl Compression {
    /// Parses `off`, `lz4`, `zstd` or `zstd:LEVEL`.
    pub fn parse(s: &str) -> Result<Compression, String> {
        match s {
            "off" | "none" => Ok(Compression::Off),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd(ZSTD_DEFAULT_LEVEL)),
            _ => {
                let level = s
                    .strip_prefix("zstd:")
                    .ok_or_else(|| format!("compression {s:?} is not off, lz4, zstd or zstd:LEVEL"))?;
                let level: i32 = level.parse().map_err(|_| format!("zstd level {level:?} is not a number"))?;
                if !ZSTD_LEVELS.contains(&level) {
                    return Err(format!(
                        "zstd level {level} is outside {} to {}",
                        ZSTD_LEVELS.start(),
                        ZSTD_LEVELS.end()
                    ));
                }
                Ok(Compression::Zstd(level))
            }
        }
    }

    /// The name [`Compression::parse`] reads back.
    pub fn name(&self) -> String {
        match self {
            Compression::Off => "off".into(),
            Compression::Lz4 => "lz4".into(),
            Compression::Zstd(level) => format!("zstd:{level}"),
        }
    }

    /// The value of the volume-table setting: the codec in the low byte, zstd's level above.
    pub fn to_setting(self) -> u64 {
        match self {
            Compression::Off => 0,
            Compression::Lz4 => CODEC_LZ4 as u64,
            Compression::Zstd(level) => CODEC_ZSTD as u64 | (level as u64) << 8,
        }
    }

    /// Reads a setting value written by [`Compression::to_setting`].
    pub fn from_setting(v: u64) -> Result<Compression, String> {
        let level = (v >> 8) as i32;
        match (v & 0xFF) as u8 {
            0 if v == 0 => Ok(Compression::Off),
            CODEC_LZ4 if v == CODEC_LZ4 as u64 => Ok(Compression::Lz4),
            CODEC_ZSTD if v >> 8 <= *ZSTD_LEVELS.end() as u64 && ZSTD_LEVELS.contains(&level) => Ok(Compression::Zstd(level)),
            _ => Err(format!("compression setting {v:#x} is unknown (written by a newer SALSA?)")),
        }
    }

    pub fn is_on(&self) -> bool {
        *self != Compression::Off
    }

    /// Compresses `page` into `out` (cleared first) as its stored form, a whole number of
    /// `grain_bytes` grains, when that saves at least one grain over the page; returns the
    /// grains, or `None` when the page is to be stored as it is.
    pub fn compress(&self, page: &[u8], grain_bytes: usize, out: &mut Vec<u8>) -> Option<u32> {
        let room = page.len().checked_sub(grain_bytes)?.checked_sub(STORED_HEADER_BYTES)?;
        if room == 0 || !self.is_on() || looks_incompressible(page, page.len() / grain_bytes) {
            return None;
        }
        out.clear();
        let (codec, len) = match *self {
            Compression::Off => return None,
            Compression::Lz4 => {
                out.resize(STORED_HEADER_BYTES + lz4_flex::block::get_maximum_output_size(page.len()), 0);
                let n = lz4_flex::block::compress_into(page, &mut out[STORED_HEADER_BYTES..]).ok()?;
                (CODEC_LZ4, n)
            }
            Compression::Zstd(level) => {
                // The compressor stops with an error when the output would not fit: the early
                // abort of an incompressible page.
                out.resize(STORED_HEADER_BYTES + room, 0);
                let n = ZSTD_COMPRESSOR.with(|c| {
                    let mut c = c.borrow_mut();
                    if c.as_ref().is_none_or(|(l, _)| *l != level) {
                        *c = Some((level, zstd::bulk::Compressor::new(level).ok()?));
                    }
                    let (_, comp) = c.as_mut()?;
                    comp.compress_to_buffer(page, &mut out[STORED_HEADER_BYTES..]).ok()
                })?;
                (CODEC_ZSTD, n)
            }
        };
        if len > room {
            return None;
        }
        let stored = (STORED_HEADER_BYTES + len).div_ceil(grain_bytes) * grain_bytes;
        out.truncate(STORED_HEADER_BYTES + len);
        out.resize(stored, 0);
        out[0] = codec;
        out[1..4].fill(0);
        out[4..8].copy_from_slice(&(len as u32).to_le_bytes());
        Some((stored / grain_bytes) as u32)
    }
}

/// Its name ([`Compression::name`]), padded as the format asks (tables of volumes).
impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(&self.name())
    }
}

/// The sample the entropy is measured on: runs of this many consecutive bytes...
const SAMPLE_RUN_BYTES: usize = 32;
/// ...one every this many bytes (an eighth of the page). Runs, not every n-th byte: data
/// made of machine words has bytes of other entropy at some offsets in each word (fio's
/// random buffers do), which a stride would see alone.
const SAMPLE_EVERY_BYTES: usize = 256;
/// A page is taken as incompressible above `8 - 8 / grains + ENTROPY_MARGIN_BITS` bits a byte
/// (at most [`MAX_COMPRESSIBLE_BITS`]): entropy coding alone saves about `(8 - H) / 8` of it,
/// and saving a grain of `grains` takes `1 / grains`; the margin leaves room for what repeats
/// save beyond the byte distribution.
const ENTROPY_MARGIN_BITS: f64 = 0.5;
const MAX_COMPRESSIBLE_BITS: f64 = 7.5;

/// Whether a sample of `page`'s bytes looks too random to save one of its `grains` grains:
/// its byte distribution's entropy is high. The cheap early abort (as btrfs's heuristic): a
/// page that would not compress costs a histogram of an eighth of its bytes and a pass over its
/// words for repeats, not a compressor's whole pass. Text, digits and database pages measure far lower, even where
/// they have no repeats for lz4 to find (zstd's entropy stage still shrinks them).
fn looks_incompressible(page: &[u8], grains: usize) -> bool {
    let mut counts = [0u32; 256];
    let mut n = 0u32;
    for run in page.chunks(SAMPLE_EVERY_BYTES) {
        for &b in &run[..run.len().min(SAMPLE_RUN_BYTES)] {
            counts[b as usize] += 1;
            n += 1;
        }
    }
    if n < 256 || grains < 2 {
        return false;
    }
    let n = n as f64;
    let entropy: f64 = counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / n;
            -p * p.log2()
        })
        .sum();
    entropy > (8.0 - 8.0 / grains as f64 + ENTROPY_MARGIN_BITS).min(MAX_COMPRESSIBLE_BITS) && !repeats_words(page, grains)
}

/// Whether at least one in `grains` of `page`'s aligned 8-byte words repeats an earlier one:
/// data of random-looking bytes that an LZ codec still shrinks (a record or identifier
/// written over and over), which the byte distribution cannot see. A hash table of the words,
/// one slot per word and no chaining (a collision only misses a repeat), reused per thread.
fn repeats_words(page: &[u8], grains: usize) -> bool {
    let words = page.len() / 8;
    let slots = (words * 2).next_power_of_two();
    WORD_TABLE.with(|t| {
        let mut t = t.borrow_mut();
        t.clear();
        t.resize(slots, 0);
        let mut repeats = 0usize;
        for w in page.chunks_exact(8) {
            let w = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
            // (Zero words are what an empty slot holds: counted as repeats, as they are.)
            let slot = (w.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as usize & (slots - 1);
            if t[slot] == w {
                repeats += 1;
            } else {
                t[slot] = w;
            }
        }
        repeats * grains >= words
    })
}

thread_local! {
    /// The word table of [`repeats_words`].
    static WORD_TABLE: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    /// One zstd context per thread and level: making one per page costs more than the page.
    static ZSTD_COMPRESSOR: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(None) };
    static ZSTD_DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// Decompresses a page's stored form into `page` (the whole page); fails on anything but a
/// well-formed stored page of exactly that size.
pub fn decompress(stored: &[u8], page: &mut [u8]) -> Result<(), String> {
    if stored.len() < STORED_HEADER_BYTES || stored[1..4] != [0, 0, 0] {
        return Err("not a compressed page".into());
    }
    let len = u32::from_le_bytes([stored[4], stored[5], stored[6], stored[7]]) as usize;
    let data = stored
        .get(STORED_HEADER_BYTES..STORED_HEADER_BYTES.checked_add(len).ok_or("length overflows")?)
        .ok_or_else(|| format!("compressed length {len} runs past the stored page ({} bytes)", stored.len()))?;
    let n = match stored[0] {
        CODEC_LZ4 => lz4_flex::block::decompress_into(data, page).map_err(|e| format!("lz4: {e}"))?,
        CODEC_ZSTD => ZSTD_DECOMPRESSOR.with(|d| -> Result<usize, String> {
            let mut d = d.borrow_mut();
            if d.is_none() {
                *d = Some(zstd::bulk::Decompressor::new().map_err(|e| format!("zstd: {e}"))?);
            }
            let dec = d.as_mut().ok_or("zstd context")?;
            dec.decompress_to_buffer(data, page).map_err(|e| format!("zstd: {e}"))
        })?,
        codec => return Err(format!("unknown codec {codec}")),
    };
    if n != page.len() {
        return Err(format!("decompressed to {n} bytes, not a page of {}", page.len()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An endless sequence of pseudo-random words from `seed` (xorshift64).
    fn xorshift(seed: u64) -> impl Iterator<Item = u64> {
        let mut x = seed | 1;
        std::iter::repeat_with(move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        })
    }

    /// `len` random bytes from `seed`.
    fn random_page(len: usize, seed: u64) -> Vec<u8> {
        xorshift(seed).take(len).map(|x| x as u8).collect()
    }

    /// Words from a small vocabulary: text-like data both codecs shrink.
    fn text_page(len: usize, seed: u64) -> Vec<u8> {
        const WORDS: [&str; 12] = [
            "salsa ", "segment ", "grain ", "page ", "record ", "volume ", "1234 ", "-0987-", "log ", "map ", "zone ", "flash ",
        ];
        let mut out = Vec::with_capacity(len + 16);
        for x in xorshift(seed) {
            if out.len() >= len {
                break;
            }
            out.extend_from_slice(WORDS[(x % 12) as usize].as_bytes());
        }
        out.truncate(len);
        out
    }

    /// Random decimal digits (as sysbench's columns): no repeats for lz4 to find, but fewer
    /// than four bits of entropy a byte, which zstd's entropy stage takes.
    fn digits_page(len: usize, seed: u64) -> Vec<u8> {
        xorshift(seed).take(len).map(|x| b"0123456789"[(x % 10) as usize]).collect()
    }

    proptest::proptest! {
        /// Any page, compressible or not, comes back whole, or is stored as it is; a stored
        /// form is always whole grains smaller than the page.
        #[test]
        fn any_page_round_trips(
            seed in proptest::prelude::any::<u64>(),
            distinct in 1usize..3000,
            grains in 2usize..=16,
            zstd in proptest::prelude::any::<bool>(),
        ) {
            let len = grains * 4096;
            let words: Vec<u64> = xorshift(seed).take(distinct).collect();
            let page: Vec<u8> = (0..len / 8).flat_map(|i| words[i % distinct].to_le_bytes()).collect();
            let c = if zstd { Compression::Zstd(1) } else { Compression::Lz4 };
            let mut out = Vec::new();
            if let Some(g) = c.compress(&page, 4096, &mut out) {
                proptest::prop_assert!((g as usize) < grains && out.len() == g as usize * 4096);
                let mut back = vec![0u8; len];
                decompress(&out, &mut back).unwrap();
                proptest::prop_assert!(back == page);
            }
        }
    }

    #[test]
    fn settings_and_names_round_trip() {
        for c in [Compression::Off, Compression::Lz4, Compression::Zstd(1), Compression::Zstd(19)] {
            assert_eq!(Compression::from_setting(c.to_setting()), Ok(c));
            assert_eq!(Compression::parse(&c.name()), Ok(c));
        }
        assert_eq!(Compression::parse("zstd"), Ok(Compression::Zstd(3)));
        for bad in ["gzip", "zstd:0", "zstd:23", "zstd:x", "lz4:1"] {
            assert!(Compression::parse(bad).is_err(), "{bad}");
        }
        for bad in [3u64, 0x101, CODEC_ZSTD as u64, CODEC_ZSTD as u64 | 40 << 8] {
            assert!(Compression::from_setting(bad).is_err(), "{bad:#x}");
        }
    }

    #[test]
    fn compressible_pages_shrink_to_whole_grains_and_come_back() {
        let mut out = Vec::new();
        for c in [Compression::Lz4, Compression::Zstd(1), Compression::Zstd(9)] {
            for (page, gb) in [
                (vec![7u8; 16384], 4096),
                (text_page(65536, 3), 4096),
                (text_page(8192, 5), 4096),
                (digits_page(16384, 7), 4096),
            ] {
                let Some(grains) = c.compress(&page, gb, &mut out) else {
                    assert!(c == Compression::Lz4 && page[0].is_ascii_digit(), "{c:?} kept {} bytes", page.len());
                    continue;
                };
                assert_eq!(out.len(), grains as usize * gb);
                assert!(out.len() < page.len());
                let mut back = vec![0u8; page.len()];
                decompress(&out, &mut back).unwrap();
                assert_eq!(back, page, "{c:?}");
            }
        }
    }

    #[test]
    fn incompressible_or_one_grain_pages_are_stored_as_they_are() {
        let random = random_page(16384, 0x1234_5678_9abc_def1);
        let mut out = Vec::new();
        for c in [Compression::Lz4, Compression::Zstd(3), Compression::Off] {
            assert_eq!(c.compress(&random, 4096, &mut out), None);
            assert_eq!(c.compress(&[0u8; 4096], 4096, &mut out), None, "a page of one grain cannot shrink");
        }
    }

    #[test]
    fn the_entropy_sample_tells_random_pages_from_compressible_ones() {
        let random = random_page(16384, 0x9e37_79b9_7f4a_7c15);
        assert!(looks_incompressible(&random, 4));
        assert!(looks_incompressible(&random[..8192], 2));
        assert!(!looks_incompressible(&digits_page(16384, 3), 4));
        assert!(!looks_incompressible(&text_page(16384, 3), 4));
        assert!(!looks_incompressible(&[0u8; 16384], 4));
        // Half random, half zeros (fio's buffer_compress_percentage=50): compressible.
        let mut half = random.clone();
        half[8192..].fill(0);
        assert!(!looks_incompressible(&half, 4));
        // Random words whose high bytes vary little (a 48-bit generator's): incompressible
        // though every fourth byte alone would look compressible.
        let words: Vec<u8> = random
            .chunks(8)
            .flat_map(|w| {
                let mut w: [u8; 8] = w.try_into().unwrap();
                w[6] &= 0x0F;
                w[7] = 0;
                w
            })
            .collect();
        assert!(looks_incompressible(&words, 4));
        // Random words repeated (a period of 700 words in 2048): random bytes, yet an LZ
        // codec shrinks them; the word table sees the repeats.
        let repeated: Vec<u8> = (0..2048).flat_map(|i| random[(i % 700) * 8..(i % 700) * 8 + 8].to_vec()).collect();
        assert!(!looks_incompressible(&repeated, 4));
    }

    #[test]
    fn damaged_stored_pages_are_errors_not_garbage() {
        let page = text_page(16384, 9);
        let mut out = Vec::new();
        let mut back = vec![0u8; 16384];
        for c in [Compression::Lz4, Compression::Zstd(3)] {
            c.compress(&page, 4096, &mut out).unwrap();
            let mut bad = out.clone();
            bad[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
            assert!(decompress(&bad, &mut back).is_err());
            let mut bad = out.clone();
            bad[0] = 9;
            assert!(decompress(&bad, &mut back).is_err());
            let mut short = vec![0u8; 8192];
            assert!(decompress(&out, &mut short).is_err(), "a page of another size");
            // Flipped bytes in the data: an error or the wrong size, never a silent success
            // with other bytes (the log's checksum catches it before this in any case).
            let mut bad = out.clone();
            for b in bad[8..40].iter_mut() {
                *b ^= 0x5A;
            }
            if decompress(&bad, &mut back).is_ok() {
                assert_ne!(back, page);
            }
        }
    }
}
