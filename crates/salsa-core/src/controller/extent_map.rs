//! An extent map: the page map of a volume written in long sequential runs (an append-only
//! AMF volume), kept as runs of pages whose entries follow each other instead of one entry per
//! page (FSTL's extent map). A run of mapped pages covers consecutive pages at consecutive
//! physical pages (one record's data); a run of trimmed pages shares one tombstone segment.
//! Unmapped pages are in no run.
//!
//! Owns: the runs, in chunks of [`CHUNK_PAGES`] pages, each chunk a sorted vector under its own
//! lock, so an update costs a search and a few moves inside one chunk whatever the volume's
//! size, and writers of different chunks never meet.
//!
//! Invariants (checked by [`ExtentMap::check`] in tests and asserted cheaply on update): the
//! runs of a chunk are sorted, do not overlap, stay inside the chunk, are never empty, hold
//! entries of one kind each, and two neighbours that could be one run are merged. The entry of
//! every page is what the flat map would hold after the same updates (a property test holds
//! the two side by side).

use super::map::{Encoding, Entry};
use parking_lot::Mutex;

/// Pages per chunk (8 MiB of 4 KiB pages): runs never cross a chunk.
pub const CHUNK_PAGES: u64 = 2048;

/// Consecutive pages whose encoded entries step by a fixed amount. 12 bytes: the first page
/// and the length fit 16 bits each (a chunk is 2048 pages), and packing keeps the 64-bit entry
/// from padding the run to 16.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C, packed(4))]
struct Run {
    /// First page, from the chunk's start.
    first: u16,
    count: u16,
    /// Encoded entry of the first page (never 0: unmapped pages are in no run).
    value: u64,
}

const _: () = assert!(std::mem::size_of::<Run>() == 12 && CHUNK_PAGES <= u16::MAX as u64);

impl Run {
    fn new(start: u32, len: u32, value: u64) -> Run {
        debug_assert!(start as u64 + len as u64 <= CHUNK_PAGES);
        Run {
            first: start as u16,
            count: len as u16,
            value,
        }
    }
    fn start(&self) -> u32 {
        self.first as u32
    }
    fn len(&self) -> u32 {
        self.count as u32
    }
}

/// The extent map of a volume.
pub struct ExtentMap {
    chunks: Box<[Mutex<Vec<Run>>]>,
    pages: u64,
    encoding: Encoding,
    /// Encoded step between the entries of consecutive mapped pages (grains per page).
    page_grains: u64,
}

impl ExtentMap {
    pub fn new(pages: u64, encoding: Encoding, page_grains: u32) -> ExtentMap {
        ExtentMap {
            chunks: (0..pages.div_ceil(CHUNK_PAGES)).map(|_| Mutex::new(Vec::new())).collect(),
            pages,
            encoding,
            page_grains: page_grains as u64,
        }
    }

    pub fn pages(&self) -> u64 {
        self.pages
    }

    pub fn page_grains(&self) -> u32 {
        self.page_grains as u32
    }

    /// The step of a run starting with the encoded entry `value`.
    fn step(&self, value: u64) -> u64 {
        match self.encoding.decode(value) {
            Entry::Mapped(_) => self.page_grains,
            _ => 0,
        }
    }

    fn same_kind(&self, a: u64, b: u64) -> bool {
        std::mem::discriminant(&self.encoding.decode(a)) == std::mem::discriminant(&self.encoding.decode(b))
    }

    /// Encoded entry of page `at` (from the chunk's start) of `run`, which covers it.
    fn value_at(&self, run: &Run, at: u32) -> u64 {
        run.value + (at - run.start()) as u64 * self.step(run.value)
    }

    fn locate(page: u64) -> (usize, u32) {
        ((page / CHUNK_PAGES) as usize, (page % CHUNK_PAGES) as u32)
    }

    /// Index of the run covering `at`, if any.
    fn find(runs: &[Run], at: u32) -> Option<usize> {
        let i = runs.partition_point(|r| r.start() <= at).checked_sub(1)?;
        (at < runs[i].start() + runs[i].len()).then_some(i)
    }

    pub fn load_raw(&self, page: u64) -> u64 {
        assert!(page < self.pages, "page {page} past the map's end");
        let (c, at) = Self::locate(page);
        let runs = self.chunks[c].lock();
        Self::find(&runs, at).map_or(0, |i| self.value_at(&runs[i], at))
    }

    /// Sets the encoded entry of page `at` of a chunk's runs, returning the old one.
    fn set(&self, runs: &mut Vec<Run>, at: u32, value: u64) -> u64 {
        let old = match Self::find(runs, at) {
            Some(i) => {
                let run = runs[i];
                let old = self.value_at(&run, at);
                if old == value {
                    return old;
                }
                // Cut the page out of its run: what is left before and after it.
                let before = Run::new(run.start(), at - run.start(), run.value);
                let after = Run::new(at + 1, run.start() + run.len() - at - 1, old + self.step(run.value));
                let pieces: Vec<Run> = [before, after].into_iter().filter(|r| r.len() > 0).collect();
                runs.reserve_exact(pieces.len().saturating_sub(1));
                runs.splice(i..=i, pieces);
                old
            }
            None => 0,
        };
        if value != 0 {
            let i = runs.partition_point(|r| r.start() < at);
            let joins_left = i > 0
                && runs[i - 1].start() + runs[i - 1].len() == at
                && self.same_kind(runs[i - 1].value, value)
                && self.value_at_end(&runs[i - 1]) == value;
            let joins_right = i < runs.len()
                && runs[i].start() == at + 1
                && self.same_kind(runs[i].value, value)
                && runs[i].value == value + self.step(value);
            match (joins_left, joins_right) {
                (true, true) => {
                    let right = runs.remove(i);
                    runs[i - 1].count += 1 + right.count;
                }
                (true, false) => runs[i - 1].count += 1,
                (false, true) => runs[i] = Run::new(at, runs[i].len() + 1, value),
                (false, false) => {
                    // Exactly the room needed: the map's memory is what it reports.
                    runs.reserve_exact(1);
                    runs.insert(i, Run::new(at, 1, value));
                }
            }
        }
        // A chunk that shrank gives its memory back.
        if runs.len() * 2 < runs.capacity() {
            runs.shrink_to_fit();
        }
        old
    }

    /// The encoded entry the page after `run` would need to extend it.
    fn value_at_end(&self, run: &Run) -> u64 {
        run.value + run.len() as u64 * self.step(run.value)
    }

    /// Replaces the entry of `page`, returning the old one (encoded).
    pub fn swap_raw(&self, page: u64, value: u64) -> u64 {
        assert!(page < self.pages, "page {page} past the map's end");
        let (c, at) = Self::locate(page);
        let mut runs = self.chunks[c].lock();
        self.set(&mut runs, at, value)
    }

    /// Replaces `old` by `new` (encoded) only if the entry still is `old`.
    pub fn compare_exchange_raw(&self, page: u64, old: u64, new: u64) -> bool {
        assert!(page < self.pages, "page {page} past the map's end");
        let (c, at) = Self::locate(page);
        let mut runs = self.chunks[c].lock();
        let cur = Self::find(&runs, at).map_or(0, |i| self.value_at(&runs[i], at));
        if cur != old {
            return false;
        }
        self.set(&mut runs, at, new);
        true
    }

    /// Forgets every entry.
    pub fn clear(&self) {
        for c in self.chunks.iter() {
            *c.lock() = Vec::new();
        }
    }

    /// Runs held now.
    pub fn run_count(&self) -> u64 {
        self.chunks.iter().map(|c| c.lock().len() as u64).sum()
    }

    /// Bytes the map holds: a lock and a vector header per chunk, and the runs' room.
    pub fn memory_bytes(&self) -> u64 {
        let per_chunk = std::mem::size_of::<Mutex<Vec<Run>>>() as u64;
        let runs: u64 = self.chunks.iter().map(|c| c.lock().capacity() as u64).sum();
        self.chunks.len() as u64 * per_chunk + runs * std::mem::size_of::<Run>() as u64
    }

    /// Calls `visit(first page, pages, encoded entry of the first)` for every run, in page
    /// order (entries of a mapped run step by the page's grains).
    pub fn for_each_run(&self, mut visit: impl FnMut(u64, u64, u64)) {
        for (c, chunk) in self.chunks.iter().enumerate() {
            let base = c as u64 * CHUNK_PAGES;
            for r in chunk.lock().iter() {
                visit(base + r.start() as u64, r.len() as u64, r.value);
            }
        }
    }

    /// Bytes [`ExtentMap::encode_into`] appends.
    pub fn image_bytes(&self) -> u64 {
        8 + self.run_count() * IMAGE_RUN_BYTES
    }

    /// Checkpoint image: the run count, then each run (first page, length, encoded entry).
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let count_at = out.len();
        out.extend_from_slice(&0u64.to_le_bytes());
        let mut count = 0u64;
        self.for_each_run(|first, len, value| {
            out.extend_from_slice(&first.to_le_bytes());
            out.extend_from_slice(&(len as u32).to_le_bytes());
            out.extend_from_slice(&value.to_le_bytes());
            count += 1;
        });
        out[count_at..count_at + 8].copy_from_slice(&count.to_le_bytes());
    }

    /// Loads an image written by [`ExtentMap::encode_into`] into this (empty) map; every run
    /// is checked (inside the volume and one chunk, sorted, entries in range and of one kind).
    pub fn load_image(&self, d: &mut crate::util::Decoder<'_>) -> std::result::Result<(), String> {
        let count = d.u64("run count").map_err(|e| e.to_string())?;
        if count > self.pages {
            return Err(format!("{count} runs in a map of {} pages", self.pages));
        }
        let mut next_free = 0u64;
        for _ in 0..count {
            let first = d.u64("run start").map_err(|e| e.to_string())?;
            let len = d.u32("run length").map_err(|e| e.to_string())? as u64;
            let value = d.u64("run entry").map_err(|e| e.to_string())?;
            let end = first.checked_add(len).ok_or("run past the end")?;
            if len == 0 || first < next_free || end > self.pages || (first / CHUNK_PAGES) != (end - 1) / CHUNK_PAGES {
                return Err(format!("run of {len} pages at {first} is out of place"));
            }
            let last = (len - 1).checked_mul(self.step_checked(value)?).and_then(|s| value.checked_add(s));
            if value == 0 || last.is_none_or(|l| l > self.encoding.max_value() || !self.same_kind(value, l)) {
                return Err(format!("run of {len} pages at {first} has entries out of range"));
            }
            let (c, at) = Self::locate(first);
            let mut runs = self.chunks[c].lock();
            runs.reserve_exact(1);
            runs.push(Run::new(at, len as u32, value));
            next_free = end;
        }
        Ok(())
    }

    fn step_checked(&self, value: u64) -> std::result::Result<u64, String> {
        if value > self.encoding.max_value() {
            return Err(format!("map entry {value} out of range"));
        }
        Ok(self.step(value))
    }

    /// Checks every invariant of the module documentation (tests).
    #[cfg(test)]
    pub fn check(&self) -> std::result::Result<(), String> {
        for (c, chunk) in self.chunks.iter().enumerate() {
            let runs = chunk.lock();
            let chunk_pages = (self.pages - c as u64 * CHUNK_PAGES).min(CHUNK_PAGES);
            for (i, r) in runs.iter().enumerate() {
                if r.len() == 0 || r.value == 0 || r.start() as u64 + r.len() as u64 > chunk_pages {
                    return Err(format!("chunk {c}: bad run {r:?}"));
                }
                if !self.same_kind(r.value, self.value_at(r, r.start() + r.len() - 1)) {
                    return Err(format!("chunk {c}: run {r:?} mixes kinds"));
                }
                if let Some(p) = i.checked_sub(1).map(|p| runs[p]) {
                    if p.start() + p.len() > r.start() {
                        return Err(format!("chunk {c}: {p:?} overlaps {r:?}"));
                    }
                    if p.start() + p.len() == r.start() && self.same_kind(p.value, r.value) && self.value_at_end(&p) == r.value {
                        return Err(format!("chunk {c}: {p:?} and {r:?} are not merged"));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Bytes of one run in a checkpoint image.
const IMAGE_RUN_BYTES: u64 = 8 + 4 + 8;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::map::PageMap;
    use proptest::prelude::*;

    const ENC: Encoding = Encoding {
        total_grains: 1 << 20,
        total_segments: 256,
    };

    #[derive(Debug, Clone)]
    enum Op {
        /// Write `len` pages from `page` at consecutive grains from `grain` (one record).
        Write {
            page: u64,
            len: u64,
            grain: u64,
        },
        Trim {
            page: u64,
            len: u64,
            segment: u32,
        },
        Forget {
            page: u64,
        },
        Cas {
            page: u64,
            grain: u64,
        },
    }

    fn op(pages: u64) -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..pages, 1..300u64, 0..(1u64 << 19)).prop_map(|(page, len, grain)| Op::Write { page, len, grain }),
            1 => (0..pages, 1..3000u64, 0..256u32).prop_map(|(page, len, segment)| Op::Trim { page, len, segment }),
            1 => (0..pages).prop_map(|page| Op::Forget { page }),
            1 => (0..pages, 0..(1u64 << 19)).prop_map(|(page, grain)| Op::Cas { page, grain }),
        ]
    }

    proptest! {
        /// Every page reads what the flat map reads after the same updates, swaps return the
        /// same old entries, and the invariants hold after every step.
        #[test]
        fn extents_agree_with_the_flat_map(ops in proptest::collection::vec(op(5000), 1..120), page_grains in 1u32..5) {
            let pages = 5000;
            let flat = PageMap::new(pages, ENC);
            let ext = ExtentMap::new(pages, ENC, page_grains);
            for o in ops {
                match o {
                    Op::Write { page, len, grain } => {
                        for k in 0..len.min(pages - page) {
                            let e = Entry::Mapped(grain + k * page_grains as u64);
                            let v = ENC.encode(e);
                            prop_assert_eq!(ext.swap_raw(page + k, v), ENC.encode(flat.swap(page + k, e)));
                        }
                    }
                    Op::Trim { page, len, segment } => {
                        for p in page..(page + len).min(pages) {
                            let e = Entry::Trimmed(segment);
                            prop_assert_eq!(ext.swap_raw(p, ENC.encode(e)), ENC.encode(flat.swap(p, e)));
                        }
                    }
                    Op::Forget { page } => {
                        prop_assert_eq!(ext.swap_raw(page, 0), ENC.encode(flat.swap(page, Entry::Unmapped)));
                    }
                    Op::Cas { page, grain } => {
                        let cur = flat.load(page);
                        let new = Entry::Mapped(grain);
                        // Half the time against the current entry, half against a stale one.
                        let old = if grain % 2 == 0 { cur } else { Entry::Mapped(grain + 1) };
                        let want = flat.compare_exchange(page, old, new);
                        prop_assert_eq!(ext.compare_exchange_raw(page, ENC.encode(old), ENC.encode(new)), want);
                    }
                }
                prop_assert_eq!(ext.check(), Ok(()));
            }
            for p in 0..pages {
                prop_assert_eq!(ext.load_raw(p), flat.load_raw(p), "page {}", p);
            }
            let mut image = Vec::new();
            ext.encode_into(&mut image);
            prop_assert_eq!(image.len() as u64, ext.image_bytes());
            let back = ExtentMap::new(pages, ENC, page_grains);
            back.load_image(&mut crate::util::Decoder::new(&image)).unwrap();
            prop_assert_eq!(back.check(), Ok(()));
            for p in 0..pages {
                prop_assert_eq!(back.load_raw(p), flat.load_raw(p));
            }
        }
    }

    #[test]
    fn a_sequentially_written_volume_is_a_run_per_record_and_chunk() {
        let pages = 4 * CHUNK_PAGES;
        let m = ExtentMap::new(pages, ENC, 1);
        // Records of 256 pages, each after a one-grain header.
        let mut grain = 0;
        for first in (0..pages).step_by(256) {
            grain += 1;
            for k in 0..256 {
                m.swap_raw(first + k, ENC.encode(Entry::Mapped(grain + k)));
            }
            grain += 256;
        }
        assert_eq!(m.run_count(), pages / 256);
        assert!(
            m.memory_bytes() * 50 < pages * 4,
            "{} bytes against the flat map's {}",
            m.memory_bytes(),
            pages * 4
        );
        // Trimming everything leaves a run per chunk (one tombstone segment).
        for p in 0..pages {
            m.swap_raw(p, ENC.encode(Entry::Trimmed(3)));
        }
        assert_eq!(m.run_count(), 4);
        m.check().unwrap();
    }

    #[test]
    fn corrupt_images_are_refused() {
        let m = ExtentMap::new(100, ENC, 1);
        let image = |runs: &[(u64, u32, u64)]| {
            let mut out = (runs.len() as u64).to_le_bytes().to_vec();
            for &(first, len, value) in runs {
                out.extend_from_slice(&first.to_le_bytes());
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(&value.to_le_bytes());
            }
            out
        };
        for bad in [
            image(&[(0, 0, 5)]),
            image(&[(90, 20, 5)]),
            image(&[(0, 5, 0)]),
            image(&[(10, 5, 5), (12, 5, 100)]),
            image(&[(0, 5, ENC.max_value() + 1)]),
            image(&[(0, 5, ENC.total_grains - 1)]),
            image(&[(0, 5, u64::MAX - 1)]),
            image(&[(0, 1, 5)])[..20].to_vec(),
        ] {
            let fresh = ExtentMap::new(100, ENC, 1);
            assert!(fresh.load_image(&mut crate::util::Decoder::new(&bad)).is_err(), "{bad:?}");
        }
        m.load_image(&mut crate::util::Decoder::new(&image(&[(0, 5, 5), (10, 2, ENC.total_grains + 2)])))
            .unwrap();
        m.check().unwrap();
        assert_eq!(m.load_raw(4), 9);
    }
}
