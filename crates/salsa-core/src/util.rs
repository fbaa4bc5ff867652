//! Small shared helpers: aligned buffers for direct I/O and checked little-endian codecs.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of every buffer handed to a device: enough for `O_DIRECT` on any sector size.
pub const IO_ALIGN_BYTES: usize = 4096;

/// A zero-initialised heap buffer aligned to [`IO_ALIGN_BYTES`], as `O_DIRECT` requires.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// False for the empty placeholder, which owns no allocation.
    owned: bool,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like Vec<u8>, so moving it between threads
// and sharing `&AlignedBuf` (read-only access) are both sound.
unsafe impl Send for AlignedBuf {}
// SAFETY: see above; `&AlignedBuf` only permits reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` zero bytes. `len` of 0 allocates one alignment unit to keep the pointer valid.
    pub fn zeroed(len: usize) -> AlignedBuf {
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size (at least IO_ALIGN_BYTES) and a valid alignment.
        let raw = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        AlignedBuf { ptr, len, owned: true }
    }

    /// A zero-length buffer that owns nothing (a placeholder after the real one was taken).
    pub fn empty() -> AlignedBuf {
        AlignedBuf {
            ptr: NonNull::dangling(),
            len: 0,
            owned: false,
        }
    }

    fn layout(len: usize) -> Layout {
        let size = len.max(1).next_multiple_of(IO_ALIGN_BYTES);
        // Sizes come from engine geometry (at most a segment), never from a client directly.
        Layout::from_size_align(size, IO_ALIGN_BYTES).expect("buffer size overflows isize")
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: ptr was returned by alloc_zeroed with exactly this layout and is freed once.
            unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
        }
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
        AlignedBuf::zeroed(len)
    }

    /// Returns a buffer for reuse.
    pub fn put(&self, buf: AlignedBuf) {
        if !buf.owned {
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

impl<'a> Decoder<'a> {
    pub fn new(bytes: &'a [u8]) -> Decoder<'a> {
        Decoder { bytes, pos: 0 }
    }
    pub fn position(&self) -> usize {
        self.pos
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
