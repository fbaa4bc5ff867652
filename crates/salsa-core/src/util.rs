//! Small shared helpers: aligned buffers for direct I/O, checked little-endian codecs, and
//! sizes as people read them.

use std::alloc::{alloc, alloc_zeroed, dealloc, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

/// Alignment of every buffer handed to a device: enough for `O_DIRECT` on any sector size.
pub const IO_ALIGN_BYTES: usize = 4096;

/// Huge-page size of x86-64 and arm64 (transparent huge pages).
pub const HUGE_PAGE_BYTES: usize = 2 << 20;

/// Bytes of [`shared_zeros`].
pub const SHARED_ZEROS_BYTES: usize = 1 << 20;

/// A megabyte of zeros aligned for direct I/O, allocated once for the whole process and never
/// written: what pads records and fills holes of pool files. (A buffer allocated per use cost a
/// fresh mapping and 256 page faults per megabyte written.)
pub fn shared_zeros() -> &'static [u8] {
    static ZEROS: std::sync::OnceLock<AlignedBuf> = std::sync::OnceLock::new();
    ZEROS.get_or_init(|| AlignedBuf::zeroed(SHARED_ZEROS_BYTES))
}

/// A zero-initialised heap buffer aligned to `IO_ALIGN_BYTES`, as `O_DIRECT` requires.
///
/// Large buffers live on transparent huge pages where the kernel grants them: a direct write
/// from a huge page pins one folio instead of hundreds of pages, and reaches the device as a
/// few long physically contiguous segments instead of being split by its segment limit (on
/// this project's machines that alone made 1 MiB record writes a third faster; see
/// BENCHMARKS.md, issue 3).
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

/// What keeps an [`AlignedBuf`]'s memory alive.
enum Backing {
    /// Nothing: the empty placeholder.
    None,
    /// Its own heap allocation of `AlignedBuf::heap_layout(len)`.
    Heap,
    /// A slice of a huge-page chunk, shared with the chunk's other buffers (held for its drop).
    Chunk { _chunk: Arc<HugeChunk> },
}

/// A huge-page-aligned allocation, freed when its last buffer is dropped.
struct HugeChunk {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the chunk only owns its allocation; access goes through the AlignedBufs carved from
// it, which never overlap.
unsafe impl Send for HugeChunk {}
// SAFETY: as above; the chunk itself is never read or written through `&HugeChunk`.
unsafe impl Sync for HugeChunk {}

impl HugeChunk {
    /// Allocates `bytes` (a multiple of [`HUGE_PAGE_BYTES`]) zeroed, asking the kernel for huge
    /// pages before the first touch so that the zeroing faults them in as huge pages.
    fn zeroed(bytes: usize) -> Arc<HugeChunk> {
        debug_assert!(bytes > 0 && bytes.is_multiple_of(HUGE_PAGE_BYTES));
        // Sizes come from engine geometry, never from a client directly.
        let layout = Layout::from_size_align(bytes, HUGE_PAGE_BYTES).expect("buffer size overflows isize");
        // SAFETY: the layout has a non-zero size and a valid alignment.
        let raw = unsafe { alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        // SAFETY: ptr is valid for layout.size() bytes. The hint only changes how the kernel
        // backs the range (it fails harmlessly where huge pages are off), and the zeroing
        // writes within the allocation.
        unsafe {
            libc::madvise(ptr.as_ptr().cast(), bytes, libc::MADV_HUGEPAGE);
            std::ptr::write_bytes(ptr.as_ptr(), 0, bytes);
        }
        Arc::new(HugeChunk { ptr, layout })
    }

    /// The buffer of bytes `[offset, offset + len)` of the chunk; the caller gives no two
    /// buffers overlapping ranges.
    fn buffer(self: &Arc<Self>, offset: usize, len: usize) -> AlignedBuf {
        assert!(offset.is_multiple_of(IO_ALIGN_BYTES) && offset + len <= self.layout.size());
        AlignedBuf {
            // SAFETY: offset + len <= layout.size(), so the pointer stays inside the allocation.
            ptr: unsafe { NonNull::new_unchecked(self.ptr.as_ptr().add(offset)) },
            len,
            backing: Backing::Chunk { _chunk: self.clone() },
        }
    }

    /// Carves the chunk into `count` buffers of `len` bytes (`count * len` fits in it).
    fn split(self: &Arc<Self>, len: usize, count: usize) -> impl Iterator<Item = AlignedBuf> + '_ {
        assert!(len.is_multiple_of(IO_ALIGN_BYTES));
        (0..count).map(move |i| self.buffer(i * len, len))
    }
}

impl Drop for HugeChunk {
    fn drop(&mut self) {
        // SAFETY: ptr was returned by alloc with exactly this layout and is freed once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

// SAFETY: AlignedBuf owns its bytes exclusively (its own allocation, or a slice of a chunk that
// no other buffer overlaps), like Vec<u8>, so moving it between threads and sharing
// `&AlignedBuf` (read-only access) are both sound.
unsafe impl Send for AlignedBuf {}
// SAFETY: see above; `&AlignedBuf` only permits reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` zero bytes. `len` of 0 allocates one alignment unit to keep the pointer
    /// valid. A buffer of more than half a huge page whose size wastes at most an eighth of a
    /// whole number of huge pages gets them.
    pub fn zeroed(len: usize) -> AlignedBuf {
        let huge = len.next_multiple_of(HUGE_PAGE_BYTES);
        if len > HUGE_PAGE_BYTES / 2 && huge - len <= len / 8 {
            return HugeChunk::zeroed(huge).buffer(0, len);
        }
        let layout = Self::heap_layout(len);
        // SAFETY: the layout has a non-zero size (at least IO_ALIGN_BYTES) and a valid alignment.
        let raw = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        AlignedBuf {
            ptr,
            len,
            backing: Backing::Heap,
        }
    }

    /// A zero-length buffer that owns nothing (a placeholder after the real one was taken).
    pub fn empty() -> AlignedBuf {
        AlignedBuf {
            ptr: NonNull::dangling(),
            len: 0,
            backing: Backing::None,
        }
    }

    /// Whether the buffer holds memory worth recycling.
    fn owns_memory(&self) -> bool {
        !matches!(self.backing, Backing::None)
    }

    fn heap_layout(len: usize) -> Layout {
        let size = len.max(1).next_multiple_of(IO_ALIGN_BYTES);
        // Sizes come from engine geometry (at most a segment), never from a client directly.
        Layout::from_size_align(size, IO_ALIGN_BYTES).expect("buffer size overflows isize")
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if matches!(self.backing, Backing::Heap) {
            // SAFETY: ptr was returned by alloc_zeroed with exactly this layout and is freed once.
            unsafe { dealloc(self.ptr.as_ptr(), Self::heap_layout(self.len)) }
        }
        // A chunk slice releases its share of the chunk with the Arc.
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised (zeroed) bytes for the lifetime of self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// Recycles I/O buffers by exact size, so the hot paths do not map, fault in and zero fresh
/// memory for every record and every victim read. Bounded: beyond `max_bytes` buffers are freed.
///
/// Buffers from a quarter of a huge page up to half of one (records and victims of 1 MiB
/// segments, the default) are carved several to a huge-page chunk, so they get huge pages
/// without rounding each up to 2 MiB.
pub struct BufferPool {
    free: parking_lot::Mutex<(std::collections::HashMap<usize, Vec<AlignedBuf>>, usize)>,
    max_bytes: usize,
}

impl BufferPool {
    pub fn new(max_bytes: usize) -> BufferPool {
        BufferPool {
            free: parking_lot::Mutex::new((std::collections::HashMap::new(), 0)),
            max_bytes,
        }
    }

    /// A buffer of exactly `len` bytes. Its contents are unspecified (a recycled buffer keeps
    /// old bytes): callers overwrite everything they later write or read back.
    pub fn get(&self, len: usize) -> AlignedBuf {
        let mut g = self.free.lock();
        if let Some(b) = g.0.get_mut(&len).and_then(|v| v.pop()) {
            g.1 -= len;
            return b;
        }
        drop(g);
        if (HUGE_PAGE_BYTES / 4..=HUGE_PAGE_BYTES / 2).contains(&len) && len.is_multiple_of(IO_ALIGN_BYTES) {
            let chunk = HugeChunk::zeroed(HUGE_PAGE_BYTES);
            let mut parts = chunk.split(len, HUGE_PAGE_BYTES / len);
            let first = parts.next().expect("at least two buffers per chunk");
            for b in parts {
                self.put(b);
            }
            return first;
        }
        AlignedBuf::zeroed(len)
    }

    /// Returns a buffer for reuse.
    pub fn put(&self, buf: AlignedBuf) {
        if !buf.owns_memory() {
            return;
        }
        let mut g = self.free.lock();
        if g.1 + buf.len <= self.max_bytes {
            g.1 += buf.len;
            g.0.entry(buf.len).or_default().push(buf);
        }
    }
}

/// Appends little-endian fields to a byte buffer.
#[derive(Default)]
pub struct Encoder {
    pub bytes: Vec<u8>,
}

impl Encoder {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.bytes.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u128(&mut self, v: u128) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn raw(&mut self, v: &[u8]) -> &mut Self {
        self.bytes.extend_from_slice(v);
        self
    }
}

/// Reads little-endian fields from untrusted bytes; every read is bounds-checked.
pub struct Decoder<'a> {
    bytes: &'a [u8],
    pos: usize,
}

/// A short or malformed buffer; carries what was being read.
#[derive(Debug)]
pub struct Truncated(pub &'static str);

impl std::fmt::Display for Truncated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "truncated at the {}", self.0)
    }
}

impl<'a> Decoder<'a> {
    pub fn new(bytes: &'a [u8]) -> Decoder<'a> {
        Decoder { bytes, pos: 0 }
    }
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], Truncated> {
        let end = self.pos.checked_add(n).ok_or(Truncated(what))?;
        let s = self.bytes.get(self.pos..end).ok_or(Truncated(what))?;
        self.pos = end;
        Ok(s)
    }
    pub fn u8(&mut self, what: &'static str) -> Result<u8, Truncated> {
        Ok(self.take(1, what)?[0])
    }
    pub fn u16(&mut self, what: &'static str) -> Result<u16, Truncated> {
        let mut a = [0; 2];
        a.copy_from_slice(self.take(2, what)?);
        Ok(u16::from_le_bytes(a))
    }
    pub fn u32(&mut self, what: &'static str) -> Result<u32, Truncated> {
        let mut a = [0; 4];
        a.copy_from_slice(self.take(4, what)?);
        Ok(u32::from_le_bytes(a))
    }
    pub fn u64(&mut self, what: &'static str) -> Result<u64, Truncated> {
        let mut a = [0; 8];
        a.copy_from_slice(self.take(8, what)?);
        Ok(u64::from_le_bytes(a))
    }
    pub fn u128(&mut self, what: &'static str) -> Result<u128, Truncated> {
        let mut a = [0; 16];
        a.copy_from_slice(self.take(16, what)?);
        Ok(u128::from_le_bytes(a))
    }
}

/// A byte count for messages: `1.5 GiB`, `64 KiB`, `512 bytes`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} bytes");
    }
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill_and_check(bufs: &mut [AlignedBuf]) {
        for (i, b) in bufs.iter_mut().enumerate() {
            b.fill(i as u8 + 1);
        }
        for (i, b) in bufs.iter().enumerate() {
            assert!(b.iter().all(|&x| x == i as u8 + 1), "buffer {i} was overwritten by another");
        }
    }

    #[test]
    fn buffers_carved_from_one_huge_page_chunk_are_aligned_zeroed_and_disjoint() {
        let pool = BufferPool::new(64 << 20);
        let len = (1 << 20) - 8192;
        let mut bufs: Vec<AlignedBuf> = (0..5).map(|_| pool.get(len)).collect();
        for b in &bufs {
            assert_eq!(b.len(), len);
            assert_eq!(b.as_ptr() as usize % IO_ALIGN_BYTES, 0);
            assert!(b.iter().all(|&x| x == 0), "a fresh buffer is zeroed");
        }
        // Two to a chunk: the first two share one, and the second came from the free list.
        assert_eq!(bufs[1].as_ptr() as usize - bufs[0].as_ptr() as usize, len);
        fill_and_check(&mut bufs);
        // Recycled buffers come back with their contents; dropping the chunk's buffers in any
        // order is fine.
        let p = bufs[3].as_ptr();
        pool.put(bufs.remove(3));
        assert_eq!(pool.get(len).as_ptr(), p);
        drop(bufs);
    }

    #[test]
    fn a_large_buffer_keeps_the_length_asked_for() {
        for len in [
            HUGE_PAGE_BYTES,
            2 * HUGE_PAGE_BYTES - 4096,
            2 * HUGE_PAGE_BYTES + 1,
            3 * HUGE_PAGE_BYTES - 100,
        ] {
            let b = AlignedBuf::zeroed(len);
            assert_eq!(b.len(), len);
            assert_eq!(b.as_ptr() as usize % IO_ALIGN_BYTES, 0);
            assert!(b.iter().all(|&x| x == 0));
        }
        let mut bufs: Vec<AlignedBuf> = [4096, 3 << 20, 4 << 20].iter().map(|&l| AlignedBuf::zeroed(l)).collect();
        fill_and_check(&mut bufs);
    }

    #[test]
    fn the_pool_frees_what_exceeds_its_bound() {
        let pool = BufferPool::new(1 << 20);
        let bufs: Vec<AlignedBuf> = (0..4).map(|_| pool.get(512 << 10)).collect();
        for b in bufs {
            pool.put(b);
        }
        assert_eq!(pool.free.lock().1, 1 << 20);
        pool.put(AlignedBuf::empty());
        assert_eq!(pool.free.lock().1, 1 << 20);
    }
}
