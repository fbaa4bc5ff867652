//! An extent map: the page map of a volume written in long sequential runs (an append-only
//! AMF volume), kept as runs of pages whose entries follow each other instead of one entry per
//! page (FSTL's extent map). A run of mapped pages covers consecutive pages at consecutive
//! physical pages (one record's data); a run of trimmed pages shares one tombstone segment.
//! Unmapped pages are in no run.
//!
//! Owns: the runs, in chunks of [`CHUNK_PAGES`] pages, each chunk a sorted vector under its own
//! lock, so an update costs a search and a few moves inside one chunk whatever the volume's
//! size, and writers of different chunks never meet. The checkpoint image cuts the chunks into
//! image chunks of 2048 pages, its layout whatever the size of the map's chunks. Entries are
//! held in 4 bytes where the map's encoding fits them (as the flat map's), else in 8.
//!
//! Invariants (checked by `ExtentMap::check` in tests and asserted cheaply on update): the
//! runs of a chunk are sorted, do not overlap, stay inside the chunk, are never empty, hold
//! entries of one kind each, and two neighbours that could be one run are merged. The entry of
//! every page is what the flat map would hold after the same updates (a property test holds
//! the two side by side).

use super::map_entry::{Encoding, Entry};
use parking_lot::Mutex;

/// Pages per chunk (64 MiB of 4 KiB pages): runs never cross a chunk. A chunk's lock and header
/// cost as much as four runs, mapped or not: with chunks of 2048 pages (8 MiB) they were most
/// of an AMF volume's map (an append-only volume has far more addresses than data); the price
/// of larger chunks is a longer move inside one on an update of a fragmented chunk (at most
/// the flat layout's bytes, 64 KiB).
pub const CHUNK_PAGES: u64 = 16384;
/// Pages per chunk of the checkpoint image: the image's layout predates the larger chunks and
/// stays as it was, so a map's chunks are a whole number of image chunks.
const IMAGE_CHUNK_PAGES: u64 = 2048;

/// An encoded entry as the map holds it: `u32` where the encoding's largest value fits (the
/// flat map's narrow entries), `u64` otherwise.
trait Slot: Copy + Default + PartialEq + std::fmt::Debug {
    fn get(self) -> u64;
    /// `v` is at most the encoding's largest value, which the map's width holds.
    fn of(v: u64) -> Self;
}

impl Slot for u32 {
    fn get(self) -> u64 {
        self as u64
    }
    fn of(v: u64) -> u32 {
        // The map is narrow only where the encoding's largest value fits: a wider entry is a
        // caller's bug, never truncated.
        u32::try_from(v).unwrap_or_else(|_| panic!("map entry {v} past a narrow map's 32 bits"))
    }
}

impl Slot for u64 {
    fn get(self) -> u64 {
        self
    }
    fn of(v: u64) -> u64 {
        v
    }
}

/// Consecutive pages whose encoded entries step by a fixed amount. 8 bytes with 4-byte entries,
/// 12 with 8-byte ones: the first page and the length fit 16 bits each (a chunk is at most
/// 65535 pages), and packing keeps an 8-byte entry from padding the run to 16.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C, packed(4))]
struct Run<S> {
    /// First page, from the chunk's start.
    first: u16,
    count: u16,
    /// Encoded entry of the first page (never 0: unmapped pages are in no run).
    entry: S,
}

const _: () = assert!(
    std::mem::size_of::<Run<u32>>() == 8
        && std::mem::size_of::<Run<u64>>() == 12
        && CHUNK_PAGES <= u16::MAX as u64
        && CHUNK_PAGES.is_multiple_of(IMAGE_CHUNK_PAGES)
);

impl<S: Slot> Run<S> {
    fn new(start: u32, len: u32, value: u64) -> Run<S> {
        debug_assert!(start as u64 + len as u64 <= u16::MAX as u64);
        Run {
            first: start as u16,
            count: len as u16,
            entry: S::of(value),
        }
    }
    fn start(&self) -> u32 {
        self.first as u32
    }
    fn len(&self) -> u32 {
        self.count as u32
    }
    fn value(&self) -> u64 {
        let entry = self.entry;
        entry.get()
    }
}

/// One chunk's entries.
enum Chunk<S> {
    Runs(Vec<Run<S>>),
    /// More runs than one entry per page would cost (small random writes): the flat map's
    /// layout, until a count of its runs shows they fit in half the room again.
    Flat {
        slots: Box<[S]>,
        updates: u32,
    },
}

/// The chunks, with entries of the width the encoding needs.
enum Chunks {
    Narrow(Box<[Mutex<Chunk<u32>>]>),
    Wide(Box<[Mutex<Chunk<u64>>]>),
}

/// Runs `$body` with `$c` bound to the map's chunks, whichever their width.
macro_rules! with_chunks {
    ($map:expr, $c:ident => $body:expr) => {
        match &$map.chunks {
            Chunks::Narrow($c) => $body,
            Chunks::Wide($c) => $body,
        }
    };
}

/// Image tags of a chunk.
const IMAGE_RUNS: u8 = 0;
const IMAGE_NARROW: u8 = 1;
const IMAGE_WIDE: u8 = 2;
/// Bytes of one run in a checkpoint image (its entry in 8 bytes whatever the map holds).
const IMAGE_RUN_BYTES: u64 = 12;

/// An image chunk: its runs, from its first page, or a span of a flat chunk's entries.
enum ImageChunk<'a, S> {
    Runs(Vec<Run<S>>),
    Flat(&'a [S]),
}

/// The extent map of a volume.
pub struct ExtentMap {
    chunks: Chunks,
    pages: u64,
    /// Pages per chunk: [`CHUNK_PAGES`], or fewer in tests (a multiple of the image's chunk).
    chunk_pages: u64,
    encoding: Encoding,
    /// Encoded step between the entries of consecutive mapped pages (grains per page).
    page_grains: u64,
}

impl ExtentMap {
    pub fn new(pages: u64, encoding: Encoding, page_grains: u32) -> ExtentMap {
        Self::with_chunk_pages(pages, encoding, page_grains, CHUNK_PAGES)
    }

    /// A map of chunks of `chunk_pages` (tests: more chunks in fewer pages).
    fn with_chunk_pages(pages: u64, encoding: Encoding, page_grains: u32, chunk_pages: u64) -> ExtentMap {
        assert!(chunk_pages <= CHUNK_PAGES && chunk_pages.is_multiple_of(IMAGE_CHUNK_PAGES) && chunk_pages > 0);
        fn empty<S>(count: u64) -> Box<[Mutex<Chunk<S>>]> {
            (0..count).map(|_| Mutex::new(Chunk::Runs(Vec::new()))).collect()
        }
        let count = pages.div_ceil(chunk_pages);
        ExtentMap {
            chunks: if encoding.narrow() {
                Chunks::Narrow(empty(count))
            } else {
                Chunks::Wide(empty(count))
            },
            pages,
            chunk_pages,
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

    /// Bytes of one entry in the flat layout.
    fn width(&self) -> u64 {
        match self.chunks {
            Chunks::Narrow(_) => 4,
            Chunks::Wide(_) => 8,
        }
    }

    /// Pages of chunk `c` (the last may be short).
    fn pages_of_chunk(&self, c: usize) -> u64 {
        (self.pages - c as u64 * self.chunk_pages).min(self.chunk_pages)
    }

    /// Updates of a flat chunk between two counts of its runs (a count reads the whole chunk).
    fn recount_updates(&self) -> u32 {
        (self.chunk_pages / 2) as u32
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
    fn value_at<S: Slot>(&self, run: &Run<S>, at: u32) -> u64 {
        run.value() + (at - run.start()) as u64 * self.step(run.value())
    }

    /// The encoded entry the page after `run` would need to extend it.
    fn value_at_end<S: Slot>(&self, run: &Run<S>) -> u64 {
        run.value() + run.len() as u64 * self.step(run.value())
    }

    /// Whether `run` and `next` (which starts where `run` ends) continue each other.
    fn continues<S: Slot>(&self, run: &Run<S>, next_start: u32, next_value: u64) -> bool {
        run.start() + run.len() == next_start && self.same_kind(run.value(), next_value) && self.value_at_end(run) == next_value
    }

    fn locate(&self, page: u64) -> (usize, u32) {
        ((page / self.chunk_pages) as usize, (page % self.chunk_pages) as u32)
    }

    /// Index of the run covering `at`, if any.
    fn find<S: Slot>(runs: &[Run<S>], at: u32) -> Option<usize> {
        let i = runs.partition_point(|r| r.start() <= at).checked_sub(1)?;
        (at < runs[i].start() + runs[i].len()).then_some(i)
    }

    fn get<S: Slot>(&self, chunk: &Chunk<S>, at: u32) -> u64 {
        match chunk {
            Chunk::Runs(runs) => Self::find(runs, at).map_or(0, |i| self.value_at(&runs[i], at)),
            Chunk::Flat { slots, .. } => slots[at as usize].get(),
        }
    }

    /// The runs of the flat entries `slots`.
    fn runs_of_flat<S: Slot>(&self, slots: &[S]) -> Vec<Run<S>> {
        let mut runs: Vec<Run<S>> = Vec::new();
        for (at, v) in slots.iter().enumerate() {
            let (at, v) = (at as u32, v.get());
            if v == 0 {
                continue;
            }
            match runs.last_mut() {
                Some(r) if self.continues(r, at, v) => r.count += 1,
                _ => runs.push(Run::new(at, 1, v)),
            }
        }
        runs
    }

    /// Whether `runs` of entries `S` cost more than the flat layout of the chunk (then it
    /// becomes flat).
    fn too_many<S>(&self, runs: usize, chunk_pages: u64) -> bool {
        runs as u64 * std::mem::size_of::<Run<S>>() as u64 > chunk_pages * std::mem::size_of::<S>() as u64
    }

    fn flatten<S: Slot>(&self, runs: &[Run<S>], chunk_pages: u64) -> Box<[S]> {
        let mut slots = vec![S::default(); chunk_pages as usize].into_boxed_slice();
        for r in runs {
            for at in r.start()..r.start() + r.len() {
                slots[at as usize] = S::of(self.value_at(r, at));
            }
        }
        slots
    }

    /// The layout `runs` call for in a chunk of `n` pages.
    fn chunk_of<S: Slot>(&self, mut runs: Vec<Run<S>>, n: u64) -> Chunk<S> {
        if self.too_many::<S>(runs.len(), n) {
            Chunk::Flat {
                slots: self.flatten(&runs, n),
                updates: 0,
            }
        } else {
            runs.shrink_to_fit();
            Chunk::Runs(runs)
        }
    }

    /// Sets the encoded entry of page `at` of chunk `c`, returning the old one; switches the
    /// chunk's layout when the other one is cheaper.
    fn set<S: Slot>(&self, chunk: &mut Chunk<S>, c: usize, at: u32, value: u64) -> u64 {
        let n = self.pages_of_chunk(c);
        match chunk {
            Chunk::Runs(runs) => {
                let old = self.set_in_runs(runs, at, value);
                if self.too_many::<S>(runs.len(), n) {
                    *chunk = Chunk::Flat {
                        slots: self.flatten(runs, n),
                        updates: 0,
                    };
                }
                old
            }
            Chunk::Flat { slots, updates } => {
                let old = slots[at as usize].get();
                slots[at as usize] = S::of(value);
                *updates += 1;
                if *updates >= self.recount_updates() {
                    *updates = 0;
                    let runs = self.runs_of_flat(slots);
                    // Back to runs only with room to spare, so a chunk does not flip-flop.
                    if !self.too_many::<S>(runs.len() * 2, n) {
                        *chunk = Chunk::Runs(runs);
                    }
                }
                old
            }
        }
    }

    /// Sets the encoded entry of page `at` of a chunk's runs, returning the old one.
    fn set_in_runs<S: Slot>(&self, runs: &mut Vec<Run<S>>, at: u32, value: u64) -> u64 {
        let old = match Self::find(runs, at) {
            Some(i) => {
                let run = runs[i];
                let old = self.value_at(&run, at);
                if old == value {
                    return old;
                }
                // Cut the page out of its run: what is left before and after it.
                let before = (at > run.start()).then(|| Run::new(run.start(), at - run.start(), run.value()));
                let after_len = run.start() + run.len() - at - 1;
                let after = (after_len > 0).then(|| Run::new(at + 1, after_len, old + self.step(run.value())));
                let pieces: Vec<Run<S>> = [before, after].into_iter().flatten().collect();
                runs.reserve_exact(pieces.len().saturating_sub(1));
                runs.splice(i..=i, pieces);
                old
            }
            None => 0,
        };
        if value != 0 {
            let i = runs.partition_point(|r| r.start() < at);
            let joins_left = i > 0 && self.continues(&runs[i - 1], at, value);
            let joins_right = i < runs.len()
                && runs[i].start() == at + 1
                && self.same_kind(runs[i].value(), value)
                && runs[i].value() == value + self.step(value);
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

    pub fn load_raw(&self, page: u64) -> u64 {
        assert!(page < self.pages, "page {page} past the map's end");
        let (c, at) = self.locate(page);
        with_chunks!(self, chunks => self.get(&chunks[c].lock(), at))
    }

    /// Replaces the entry of `page`, returning the old one (encoded).
    pub fn swap_raw(&self, page: u64, value: u64) -> u64 {
        assert!(page < self.pages, "page {page} past the map's end");
        let (c, at) = self.locate(page);
        with_chunks!(self, chunks => self.set(&mut chunks[c].lock(), c, at, value))
    }

    /// Replaces `old` by `new` (encoded) only if the entry still is `old`.
    pub fn compare_exchange_raw(&self, page: u64, old: u64, new: u64) -> bool {
        assert!(page < self.pages, "page {page} past the map's end");
        let (c, at) = self.locate(page);
        with_chunks!(self, chunks => {
            let mut chunk = chunks[c].lock();
            if self.get(&chunk, at) != old {
                return false;
            }
            self.set(&mut chunk, c, at, new);
            true
        })
    }

    /// Forgets every entry.
    pub fn clear(&self) {
        with_chunks!(self, chunks => {
            for c in chunks.iter() {
                *c.lock() = Chunk::Runs(Vec::new());
            }
        })
    }

    /// Runs held now (a flat chunk's counted).
    pub fn run_count(&self) -> u64 {
        let mut n = 0;
        self.for_each_run(|_, _, _| n += 1);
        n
    }

    /// Chunks in the flat layout.
    #[cfg(test)]
    pub fn flat_chunks(&self) -> u64 {
        with_chunks!(self, chunks => chunks.iter().filter(|c| matches!(*c.lock(), Chunk::Flat { .. })).count() as u64)
    }

    /// Bytes the map holds: a lock and a header per chunk, and the runs' or entries' room.
    pub fn memory_bytes(&self) -> u64 {
        fn bytes<S>(chunks: &[Mutex<Chunk<S>>]) -> u64 {
            let held: u64 = chunks
                .iter()
                .map(|c| match &*c.lock() {
                    Chunk::Runs(runs) => runs.capacity() as u64 * std::mem::size_of::<Run<S>>() as u64,
                    Chunk::Flat { slots, .. } => std::mem::size_of_val::<[S]>(slots) as u64,
                })
                .sum();
            chunks.len() as u64 * std::mem::size_of::<Mutex<Chunk<S>>>() as u64 + held
        }
        with_chunks!(self, chunks => bytes(chunks))
    }

    /// Calls `visit(first page, pages, encoded entry of the first)` for every run, in page
    /// order (entries of a mapped run step by the page's grains).
    pub fn for_each_run(&self, mut visit: impl FnMut(u64, u64, u64)) {
        with_chunks!(self, chunks => {
            for (c, chunk) in chunks.iter().enumerate() {
                let base = c as u64 * self.chunk_pages;
                let chunk = chunk.lock();
                let flat_runs;
                let runs = match &*chunk {
                    Chunk::Runs(runs) => runs.as_slice(),
                    Chunk::Flat { slots, .. } => {
                        flat_runs = self.runs_of_flat(slots);
                        flat_runs.as_slice()
                    }
                };
                for r in runs {
                    visit(base + r.start() as u64, r.len() as u64, r.value());
                }
            }
        })
    }

    /// Calls `visit` with each image chunk of chunk `c` (its pages cut every
    /// [`IMAGE_CHUNK_PAGES`]): a run crossing a cut is cut in two there.
    fn image_chunks_of<S: Slot>(&self, c: usize, chunk: &Chunk<S>, mut visit: impl FnMut(ImageChunk<'_, S>)) {
        let n = self.pages_of_chunk(c) as u32;
        for first in (0..n).step_by(IMAGE_CHUNK_PAGES as usize) {
            let end = (first + IMAGE_CHUNK_PAGES as u32).min(n);
            match chunk {
                Chunk::Runs(runs) => {
                    let from = runs.partition_point(|r| r.start() + r.len() <= first);
                    let pieces = runs[from..]
                        .iter()
                        .take_while(|r| r.start() < end)
                        .map(|r| {
                            let start = r.start().max(first);
                            let stop = (r.start() + r.len()).min(end);
                            Run::new(start - first, stop - start, self.value_at(r, start))
                        })
                        .collect();
                    visit(ImageChunk::Runs(pieces));
                }
                Chunk::Flat { slots, .. } => visit(ImageChunk::Flat(&slots[first as usize..end as usize])),
            }
        }
    }

    /// Bytes [`ExtentMap::encode_into`] appends, counted without cutting the runs (the
    /// pool's stats ask for it): a header per image chunk, and a run once per image chunk
    /// it touches.
    pub fn image_bytes(&self) -> u64 {
        fn bytes<S: Slot>(map: &ExtentMap, chunks: &[Mutex<Chunk<S>>]) -> u64 {
            let image_chunk = |page: u32| page as u64 / IMAGE_CHUNK_PAGES;
            let mut bytes = 0;
            for (c, chunk) in chunks.iter().enumerate() {
                let n = map.pages_of_chunk(c);
                let cuts = n.div_ceil(IMAGE_CHUNK_PAGES);
                bytes += match &*chunk.lock() {
                    Chunk::Runs(runs) => {
                        let pieces: u64 = runs
                            .iter()
                            .map(|r| image_chunk(r.start() + r.len() - 1) - image_chunk(r.start()) + 1)
                            .sum();
                        cuts * (1 + 2) + pieces * IMAGE_RUN_BYTES
                    }
                    Chunk::Flat { .. } => cuts + n * map.width(),
                };
            }
            bytes
        }
        8 + with_chunks!(self, chunks => bytes(self, chunks))
    }

    /// Checkpoint image: the count of image chunks ([`IMAGE_CHUNK_PAGES`] each), then per image
    /// chunk its layout: its runs (count, then first page, length and encoded entry of each,
    /// the entry in 8 bytes) or its flat entries (in the map's width).
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.pages.div_ceil(IMAGE_CHUNK_PAGES).to_le_bytes());
        let width = self.width() as usize;
        let flat_tag = if width == 4 { IMAGE_NARROW } else { IMAGE_WIDE };
        with_chunks!(self, chunks => {
            for (c, chunk) in chunks.iter().enumerate() {
                self.image_chunks_of(c, &chunk.lock(), |piece| match piece {
                    ImageChunk::Runs(runs) => {
                        out.push(IMAGE_RUNS);
                        out.extend_from_slice(&(runs.len() as u16).to_le_bytes());
                        for r in runs {
                            out.extend_from_slice(&r.first.to_le_bytes());
                            out.extend_from_slice(&{ r.count }.to_le_bytes());
                            out.extend_from_slice(&r.value().to_le_bytes());
                        }
                    }
                    ImageChunk::Flat(slots) => {
                        out.push(flat_tag);
                        slots.iter().for_each(|v| out.extend_from_slice(&v.get().to_le_bytes()[..width]));
                    }
                });
            }
        })
    }

    /// Loads an image written by [`ExtentMap::encode_into`] into this map; every run is checked
    /// (inside its image chunk, sorted, not overlapping, entries in range and of one kind) and
    /// every flat entry is in range. Runs that meet across image chunks are merged, and a chunk
    /// takes the layout its runs call for. Only a whole image changes the map.
    pub fn load_image(&self, d: &mut crate::util::Decoder<'_>) -> std::result::Result<(), String> {
        let count = d.u64("chunk count").map_err(|e| e.to_string())?;
        let image_chunks = self.pages.div_ceil(IMAGE_CHUNK_PAGES);
        if count != image_chunks {
            return Err(format!("{count} chunks in the image, {image_chunks} in the map"));
        }
        with_chunks!(self, chunks => self.load_chunks(chunks, d))
    }

    /// [`ExtentMap::load_image`] past the chunk count, into `chunks`.
    fn load_chunks<S: Slot>(&self, chunks: &[Mutex<Chunk<S>>], d: &mut crate::util::Decoder<'_>) -> std::result::Result<(), String> {
        let mut loaded = Vec::with_capacity(chunks.len());
        for c in 0..chunks.len() {
            let n = self.pages_of_chunk(c);
            let mut runs: Vec<Run<S>> = Vec::new();
            for first in (0..n).step_by(IMAGE_CHUNK_PAGES as usize) {
                let ic = (c as u64 * self.chunk_pages + first) / IMAGE_CHUNK_PAGES;
                for p in self.load_image_chunk::<S>(d, ic, (n - first).min(IMAGE_CHUNK_PAGES))? {
                    let (start, value) = (first as u32 + p.start(), p.value());
                    match runs.last_mut() {
                        Some(r) if self.continues(r, start, value) => r.count += p.count,
                        _ => runs.push(Run::new(start, p.len(), value)),
                    }
                }
            }
            loaded.push(self.chunk_of(runs, n));
        }
        for (slot, chunk) in chunks.iter().zip(loaded) {
            *slot.lock() = chunk;
        }
        Ok(())
    }

    /// The runs of image chunk `ic` of `n` pages, from its first page.
    fn load_image_chunk<S: Slot>(&self, d: &mut crate::util::Decoder<'_>, ic: u64, n: u64) -> std::result::Result<Vec<Run<S>>, String> {
        match d.u8("chunk layout").map_err(|e| e.to_string())? {
            IMAGE_RUNS => {
                let k = d.u16("run count").map_err(|e| e.to_string())? as u64;
                if k > n {
                    return Err(format!("chunk {ic}: {k} runs in {n} pages"));
                }
                let mut runs = Vec::with_capacity(k as usize);
                let mut next_free = 0u64;
                for _ in 0..k {
                    let first = d.u16("run start").map_err(|e| e.to_string())? as u64;
                    let len = d.u16("run length").map_err(|e| e.to_string())? as u64;
                    let value = d.u64("run entry").map_err(|e| e.to_string())?;
                    if len == 0 || first < next_free || first + len > n {
                        return Err(format!("chunk {ic}: run of {len} pages at {first} is out of place"));
                    }
                    let last = (len - 1).checked_mul(self.step_checked(value)?).and_then(|s| value.checked_add(s));
                    if value == 0 || last.is_none_or(|l| l > self.encoding.max_value() || !self.same_kind(value, l)) {
                        return Err(format!("chunk {ic}: run of {len} pages at {first} has entries out of range"));
                    }
                    runs.push(Run::new(first as u32, len as u32, value));
                    next_free = first + len;
                }
                Ok(runs)
            }
            tag @ (IMAGE_NARROW | IMAGE_WIDE) => {
                let width = if tag == IMAGE_NARROW { 4 } else { 8 };
                if width != self.width() {
                    return Err(format!("chunk {ic}: entries of {width} bytes in a map of {}", self.width()));
                }
                let raw = d.take((n * width) as usize, "flat chunk").map_err(|e| e.to_string())?;
                let mut slots = vec![S::default(); n as usize];
                for (at, b) in raw.chunks_exact(width as usize).enumerate() {
                    let mut v = [0u8; 8];
                    v[..width as usize].copy_from_slice(b);
                    let v = u64::from_le_bytes(v);
                    if v > self.encoding.max_value() {
                        return Err(format!("chunk {ic}: map entry {v} out of range"));
                    }
                    slots[at] = S::of(v);
                }
                Ok(self.runs_of_flat(&slots))
            }
            tag => Err(format!("chunk {ic}: unknown layout {tag}")),
        }
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
        with_chunks!(self, chunks => {
            for (c, chunk) in chunks.iter().enumerate() {
                if let Chunk::Runs(runs) = &*chunk.lock() {
                    self.check_runs(c, runs)?;
                }
            }
            Ok(())
        })
    }

    #[cfg(test)]
    fn check_runs<S: Slot>(&self, c: usize, runs: &[Run<S>]) -> std::result::Result<(), String> {
        let chunk_pages = self.pages_of_chunk(c);
        if self.too_many::<S>(runs.len(), chunk_pages) {
            return Err(format!("chunk {c}: {} runs should be flat", runs.len()));
        }
        for (i, r) in runs.iter().enumerate() {
            if r.len() == 0 || r.value() == 0 || r.start() as u64 + r.len() as u64 > chunk_pages {
                return Err(format!("chunk {c}: bad run {r:?}"));
            }
            if !self.same_kind(r.value(), self.value_at(r, r.start() + r.len() - 1)) {
                return Err(format!("chunk {c}: run {r:?} mixes kinds"));
            }
            if let Some(p) = i.checked_sub(1).map(|p| runs[p]) {
                if p.start() + p.len() > r.start() {
                    return Err(format!("chunk {c}: {p:?} overlaps {r:?}"));
                }
                if self.continues(&p, r.start(), r.value()) {
                    return Err(format!("chunk {c}: {p:?} and {r:?} are not merged"));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::map::PageMap;
    use proptest::prelude::*;

    const ENC: Encoding = Encoding {
        total_grains: 1 << 20,
        total_segments: 256,
    };
    const WIDE: Encoding = Encoding {
        total_grains: 1 << 40,
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
        /// same old entries, and the invariants hold after every step; the image round-trips
        /// through chunks of the map (4096 pages here) cut into image chunks (2048).
        #[test]
        fn extents_agree_with_the_flat_map(ops in proptest::collection::vec(op(10_000), 1..120), page_grains in 1u32..5, wide in any::<bool>()) {
            // Entries of 4 bytes, or of 8 (a pool past 2^32 grains).
            let enc = if wide { WIDE } else { ENC };
            let pages = 10_000;
            let flat = PageMap::new(pages, enc);
            let ext = ExtentMap::with_chunk_pages(pages, enc, page_grains, 2 * IMAGE_CHUNK_PAGES);
            for o in ops {
                match o {
                    Op::Write { page, len, grain } => {
                        for k in 0..len.min(pages - page) {
                            let e = Entry::Mapped(grain + k * page_grains as u64);
                            let v = enc.encode(e);
                            prop_assert_eq!(ext.swap_raw(page + k, v), enc.encode(flat.swap(page + k, e)));
                        }
                    }
                    Op::Trim { page, len, segment } => {
                        for p in page..(page + len).min(pages) {
                            let e = Entry::Trimmed(segment);
                            prop_assert_eq!(ext.swap_raw(p, enc.encode(e)), enc.encode(flat.swap(p, e)));
                        }
                    }
                    Op::Forget { page } => {
                        prop_assert_eq!(ext.swap_raw(page, 0), enc.encode(flat.swap(page, Entry::Unmapped)));
                    }
                    Op::Cas { page, grain } => {
                        let cur = flat.load(page);
                        let new = Entry::Mapped(grain);
                        // Half the time against the current entry, half against a stale one.
                        let old = if grain % 2 == 0 { cur } else { Entry::Mapped(grain + 1) };
                        let want = flat.compare_exchange(page, old, new);
                        prop_assert_eq!(ext.compare_exchange_raw(page, enc.encode(old), enc.encode(new)), want);
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
            // Into a map of other chunks: the image does not depend on them.
            for chunk_pages in [IMAGE_CHUNK_PAGES, CHUNK_PAGES] {
                let back = ExtentMap::with_chunk_pages(pages, enc, page_grains, chunk_pages);
                back.load_image(&mut crate::util::Decoder::new(&image)).unwrap();
                prop_assert_eq!(back.check(), Ok(()));
                for p in 0..pages {
                    prop_assert_eq!(back.load_raw(p), flat.load_raw(p));
                }
                let mut again = Vec::new();
                back.encode_into(&mut again);
                prop_assert_eq!(&again, &image);
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
        // 8 bytes a run of 256 pages, where the flat map holds 1 KiB: over 100x.
        assert!(
            m.memory_bytes() * 100 < pages * 4,
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

    /// A chunk's lock and header are what an unwritten stretch of the volume costs: an empty
    /// map of 4 GiB of 4 KiB pages takes under a thousandth of the flat map's bytes (with
    /// chunks of 2048 pages it took a two-hundredth).
    #[test]
    fn an_unwritten_volume_costs_a_thousandth_of_the_flat_map() {
        let pages = 1 << 20;
        let m = ExtentMap::new(pages, ENC, 1);
        assert!(m.memory_bytes() * 1000 < pages * 4, "{} bytes", m.memory_bytes());
        let small = ExtentMap::with_chunk_pages(pages, ENC, 1, IMAGE_CHUNK_PAGES);
        assert!(small.memory_bytes() * 1000 > pages * 4, "{} bytes", small.memory_bytes());
    }

    /// Small random writes turn a chunk flat (its memory bounded by the flat map's), and
    /// rewriting it sequentially turns it back into runs; every page reads as the flat map's
    /// throughout, and the image round-trips in both layouts.
    #[test]
    fn random_writes_turn_a_chunk_flat_and_sequential_ones_turn_it_back() {
        random_writes_turn_a_chunk_flat_and_back(ENC);
        random_writes_turn_a_chunk_flat_and_back(WIDE);
    }

    fn random_writes_turn_a_chunk_flat_and_back(enc: Encoding) {
        // Two image chunks a chunk, so that a flat chunk's image is cut.
        const CHUNK_PAGES: u64 = 2 * IMAGE_CHUNK_PAGES;
        let pages = 2 * CHUNK_PAGES;
        let flat = PageMap::new(pages, enc);
        let ext = ExtentMap::with_chunk_pages(pages, enc, 1, CHUNK_PAGES);
        let mut x = 12345u64;
        for _ in 0..6000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let page = (x >> 33) % CHUNK_PAGES;
            let e = Entry::Mapped((x >> 13) % (1 << 19));
            assert_eq!(ext.swap_raw(page, enc.encode(e)), enc.encode(flat.swap(page, e)));
        }
        assert_eq!(ext.flat_chunks(), 1, "chunk 0 went flat");
        assert!(
            ext.memory_bytes() <= CHUNK_PAGES * if enc.narrow() { 4 } else { 8 } + 256,
            "bounded by the flat layout: {}",
            ext.memory_bytes()
        );
        let round_trip = |ext: &ExtentMap| {
            let mut image = Vec::new();
            ext.encode_into(&mut image);
            assert_eq!(image.len() as u64, ext.image_bytes());
            for chunk_pages in [IMAGE_CHUNK_PAGES, CHUNK_PAGES, super::CHUNK_PAGES] {
                let back = ExtentMap::with_chunk_pages(pages, enc, 1, chunk_pages);
                back.load_image(&mut crate::util::Decoder::new(&image)).unwrap();
                back.check().unwrap();
                for p in 0..pages {
                    assert_eq!(back.load_raw(p), flat.load_raw(p), "page {p}");
                }
            }
        };
        round_trip(&ext);
        // Twice over: a count of the runs comes every half chunk of updates, and one in the
        // first pass may still see the random pages.
        for base in [10_000, 20_000] {
            for p in 0..CHUNK_PAGES {
                let e = Entry::Mapped(base + p);
                assert_eq!(ext.swap_raw(p, enc.encode(e)), enc.encode(flat.swap(p, e)));
            }
        }
        assert_eq!(ext.flat_chunks(), 0, "back to runs");
        assert_eq!(ext.run_count(), 1);
        ext.check().unwrap();
        round_trip(&ext);
    }

    #[test]
    fn corrupt_images_are_refused() {
        // One chunk of 100 pages.
        let image = |runs: &[(u16, u16, u64)]| {
            let mut out = 1u64.to_le_bytes().to_vec();
            out.push(IMAGE_RUNS);
            out.extend_from_slice(&(runs.len() as u16).to_le_bytes());
            for &(first, len, value) in runs {
                out.extend_from_slice(&first.to_le_bytes());
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(&value.to_le_bytes());
            }
            out
        };
        let mut wide_flat = 1u64.to_le_bytes().to_vec();
        wide_flat.push(IMAGE_WIDE);
        wide_flat.extend(std::iter::repeat_n(0u8, 800));
        let mut bad_flat = 1u64.to_le_bytes().to_vec();
        bad_flat.push(IMAGE_NARROW);
        bad_flat.extend(std::iter::repeat_n(0xFFu8, 400));
        let mut two_chunks = image(&[]);
        two_chunks[0] = 2;
        for bad in [
            image(&[(0, 0, 5)]),
            image(&[(90, 20, 5)]),
            image(&[(0, 5, 0)]),
            image(&[(10, 5, 5), (12, 5, 100)]),
            image(&[(0, 5, ENC.max_value() + 1)]),
            image(&[(0, 5, ENC.total_grains - 1)]),
            image(&[(0, 5, u64::MAX - 1)]),
            image(&[(0, 1, 5)])[..20].to_vec(),
            wide_flat,
            bad_flat,
            two_chunks,
            vec![1, 0, 0, 0, 0, 0, 0, 0, 9],
        ] {
            let fresh = ExtentMap::new(100, ENC, 1);
            assert!(fresh.load_image(&mut crate::util::Decoder::new(&bad)).is_err(), "{bad:?}");
        }
        let m = ExtentMap::new(100, ENC, 1);
        m.load_image(&mut crate::util::Decoder::new(&image(&[(0, 5, 5), (10, 2, ENC.total_grains + 2)])))
            .unwrap();
        m.check().unwrap();
        assert_eq!(m.load_raw(4), 9);
    }
}
