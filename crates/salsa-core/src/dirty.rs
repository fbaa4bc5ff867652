//! The write buffer: pages written to a volume but not yet given to its controller, held in
//! DRAM until a flush, the buffer's size or their age sends them down, as a file server's
//! writes wait in the kernel's page cache.
//!
//! Why: a write that is not flushed need not be durable (the NBD contract, and every block
//! device's), so a page overwritten before the next flush need never reach the log. Without
//! the buffer each overwrite costs a log write, its share of the GC's work and, when its
//! segment is reused, a device sync; with it, a client that rewrites a region (a sequential
//! pass over a volume, a database's hot pages) costs one log write per page per destage. A
//! destage writes each volume's pages in logical order, so a region rewritten between two
//! destages lands sequentially and the segments of its old copy empty whole. A run of 64 KiB or
//! more goes down in a payload buffer that the log's records hold rather than copy.
//!
//! Owns: the dirty pages of every buffered volume (page-mapped ones: `lsa` and `extent`; the
//! others write straight to their controller), in two sets per volume: `open`, which takes
//! writes, and `frozen`, which a destage is writing down; the destager thread; the counters.
//!
//! Invariants:
//! - a page's newest data is in `open`, else in `frozen`, else in the controller; reads look
//!   in that order, and take their copies of buffered pages before they read the controller,
//!   so a destage finishing meanwhile cannot hand them an older copy;
//! - [`crate::engine::Engine::flush`] destages every page before it flushes the log, so every
//!   write that returned before a flush is durable when the flush returns (the crash contract
//!   is the controllers', unchanged); a clean close destages before its checkpoint;
//! - `frozen` changes only under `order`, and every change of a volume that bypasses the
//!   buffer (trim, FUA and large writes, writes of writers that flush after every write,
//!   share, deletion) holds `order` while it writes down
//!   or drops the buffered pages it covers: so a destage never writes a page over a later
//!   trim, write or remap;
//! - the bytes held (pages and a fixed overhead each) never exceed the capacity, nor do they
//!   with the spare page buffers kept for reuse ([`SparePages`]): a writer
//!   that finds it full waits for the destager (or, without one, destages itself), and a write
//!   of more than a quarter of the capacity goes to the controller directly.
//!
//! Lock order: `destaging`, then `partial`, then `order`, then `state`.

use crate::controller::Controller;
use crate::error::Result;
use crate::format::ControllerKind;
use crate::log::payload::WriteBuffer;
use crate::log::Log;
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most bytes one destage write hands a controller.
const MAX_RUN_BYTES: u64 = 1 << 20;
/// Bytes counted per page on top of its data (map entry, reference count, allocation header).
pub const PAGE_OVERHEAD_BYTES: u64 = 64;
/// Smallest capacity the buffer accepts: room for a few large writes.
pub const MIN_CAPACITY_BYTES: u64 = 1 << 20;
/// How often the destager looks at the age of the buffer when nothing wakes it.
const DESTAGER_TICK: Duration = Duration::from_millis(100);
/// After a failed destage the destager waits this long before it tries again; writers that
/// find the buffer full meanwhile destage themselves and get the error.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// How long a page may stay buffered before the destager writes it down (ZFS commits its
/// transaction groups every 5 s; the kernel's page cache waits 30 s).
pub const DEFAULT_EXPIRE: Duration = Duration::from_secs(5);

/// What the write buffer did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteBufferStats {
    pub capacity_bytes: u64,
    /// Bytes held now (pages and per-page overhead).
    pub dirty_bytes: u64,
    pub dirty_pages: u64,
    /// Pages written into the buffer.
    pub pages_written: u64,
    /// Of those, pages that replaced a buffered copy: writes that never reached the log.
    pub pages_absorbed: u64,
    /// Destages (each writes down every page buffered when it starts).
    pub destages: u64,
    pub pages_destaged: u64,
    /// Writes that found the buffer full and waited for room.
    pub writer_waits: u64,
    /// Room held in the pool for buffered pages that no controller maps yet (counted as taken
    /// by the thin-provisioning limit, so a write the buffer acknowledged can be destaged).
    pub reserved_bytes: u64,
    /// Page buffers kept for reuse, counted as buffered pages are (within the capacity, with
    /// the buffered bytes).
    pub spare_bytes: u64,
}

type Page = Arc<PageBuf>;

/// A buffered page's bytes. When the last reference goes (the page was written down or
/// superseded, and no destage or read still holds it), they return to the buffer's spare pages
/// rather than to the allocator: a sequential writer frees and takes gigabytes of pages a
/// second, and glibc's malloc hands freed arenas back to the kernel, which zeroes them again
/// at their next use (a fifth of the server's time on 1 MiB sequential writes).
struct PageBuf {
    bytes: Box<[u8]>,
    spares: Arc<SparePages>,
}

impl std::ops::Deref for PageBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl PageBuf {
    /// The page's bytes, no longer counted as alive, for the caller to give back (several at
    /// once: [`SparePages::give_many`]).
    fn into_bytes(mut self) -> Box<[u8]> {
        let bytes = std::mem::take(&mut self.bytes);
        self.spares.live_bytes.fetch_sub(page_cost(bytes.len()), Relaxed);
        bytes
    }
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        if self.bytes.is_empty() {
            return; // taken by `into_bytes`
        }
        let bytes = std::mem::take(&mut self.bytes);
        self.spares.live_bytes.fetch_sub(page_cost(bytes.len()), Relaxed);
        self.spares.give(bytes);
    }
}

/// The spare pages of one length.
type SpareSize = (usize, Vec<Box<[u8]>>);

/// Page buffers kept for reuse, by size. Bound: a page is kept only while every page alive
/// (buffered, or still held by a destage or a read) and every spare page, each counted as
/// [`page_cost`], fit in the buffer's capacity; taking a spare page for a new one leaves that
/// sum as it is. So while any page is spare, buffered and spare bytes together are within the
/// capacity. The destager frees them all once the buffer has stayed empty for its expiry. Its
/// lock is a leaf: nothing else is taken under it (a page may be dropped under any lock).
#[derive(Default)]
struct SparePages {
    /// Spare pages by length. A short list searched in order, not a hash map: a pool has one
    /// page size per volume and few volume page sizes, and this is on every write's path.
    pages: Mutex<Vec<SpareSize>>,
    /// Spare pages, at [`page_cost`] each.
    spare_bytes: AtomicU64,
    /// Pages alive, at [`page_cost`] each.
    live_bytes: AtomicU64,
    capacity_bytes: AtomicU64,
}

impl SparePages {
    /// A page holding a copy of `data`, in a spare buffer when one of its size is there.
    fn page(self: &Arc<Self>, data: &[u8]) -> Page {
        let mut bytes = self.take(data.len());
        bytes.copy_from_slice(data);
        self.wrap(bytes)
    }

    fn wrap(self: &Arc<Self>, bytes: Box<[u8]>) -> Page {
        self.live_bytes.fetch_add(page_cost(bytes.len()), Relaxed);
        Arc::new(PageBuf {
            bytes,
            spares: self.clone(),
        })
    }

    /// A page of `len` bytes whose contents are whatever they were (the caller fills it).
    fn take(&self, len: usize) -> Box<[u8]> {
        let mut one = self.take_many(len, 1);
        one.pop().unwrap_or_default()
    }

    /// `count` pages of `len` bytes (contents unspecified), spare ones first, under one lock.
    fn take_many(&self, len: usize, count: usize) -> Vec<Box<[u8]>> {
        let mut out = Vec::with_capacity(count);
        {
            let mut pages = self.pages.lock();
            if let Some((_, spare)) = pages.iter_mut().find(|(l, _)| *l == len) {
                let reused = count.min(spare.len());
                out.extend(spare.drain(spare.len() - reused..));
            }
        }
        self.spare_bytes.fetch_sub(page_cost(len) * out.len() as u64, Relaxed);
        out.resize_with(count, || vec![0u8; len].into_boxed_slice());
        out
    }

    /// Keeps `bytes` for reuse if they fit (see the bound), else frees them.
    fn give(&self, bytes: Box<[u8]>) {
        let refused = self.keep(&mut self.pages.lock(), bytes);
        drop(refused); // freed after the lock is let go
    }

    /// [`SparePages::give`] of several pages, under one lock. A vector, not an iterator: no
    /// code of the caller's may run under the lock (dropping a page there would take it again).
    fn give_many(&self, all: Vec<Box<[u8]>>) {
        let mut refused = Vec::new();
        {
            let mut pages = self.pages.lock();
            refused.extend(all.into_iter().filter_map(|bytes| self.keep(&mut pages, bytes)));
        }
        drop(refused);
    }

    /// Keeps `bytes` in `pages` (the locked spare pages) if they fit; else gives them back.
    /// Under the lock, so two pages given at once cannot both take the last room.
    fn keep(&self, pages: &mut Vec<SpareSize>, bytes: Box<[u8]>) -> Option<Box<[u8]>> {
        if bytes.is_empty() {
            return None;
        }
        let cost = page_cost(bytes.len());
        let held = self.spare_bytes.load(Relaxed) + self.live_bytes.load(Relaxed);
        if held + cost > self.capacity_bytes.load(Relaxed) {
            return Some(bytes);
        }
        self.spare_bytes.fetch_add(cost, Relaxed);
        match pages.iter_mut().find(|(l, _)| *l == bytes.len()) {
            Some((_, spare)) => spare.push(bytes),
            None => pages.push((bytes.len(), vec![bytes])),
        }
        None
    }

    /// Frees every spare page.
    fn clear(&self) {
        let all = {
            let mut pages = self.pages.lock();
            self.spare_bytes.store(0, Relaxed);
            std::mem::take(&mut *pages)
        };
        drop(all);
    }
}

/// A write's payload received straight into write-buffer pages, so that buffering it copies
/// nothing ([`crate::Volume::paged_payload`], [`crate::Volume::write_paged`]): whole pages of
/// one buffered volume, from a page-aligned offset. Pages not handed to the buffer (the write
/// was refused, or the payload dropped) go back to the spare pages. While held, its pages
/// count neither as spare nor as buffered; its holder bounds how many it holds (the NBD
/// server: its request threads, one request each).
pub struct PagedPayload {
    offset: u64,
    pages: Vec<Box<[u8]>>,
    spares: Arc<SparePages>,
}

impl PagedPayload {
    /// Byte offset of the first page in the volume.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Total bytes.
    pub fn len(&self) -> usize {
        self.pages.iter().map(|p| p.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// The pages in order, to receive the payload into.
    pub fn pages_mut(&mut self) -> impl Iterator<Item = &mut [u8]> {
        self.pages.iter_mut().map(|p| &mut p[..])
    }

    /// The pages in order.
    pub fn pages(&self) -> impl Iterator<Item = &[u8]> {
        self.pages.iter().map(|p| &p[..])
    }

    /// A copy of the payload's bytes, for a writer that cannot take its pages.
    pub fn to_vec(&self) -> Vec<u8> {
        // A copy per page, not per byte: this is the write path of writers that flush after
        // every write.
        self.pages.concat()
    }

    /// Whether every page is `page_bytes` long (the payload was made for a volume with pages
    /// of that size).
    pub(crate) fn has_pages_of(&self, page_bytes: usize) -> bool {
        self.pages.iter().all(|p| p.len() == page_bytes)
    }
}

impl Drop for PagedPayload {
    fn drop(&mut self) {
        self.spares.give_many(std::mem::take(&mut self.pages));
    }
}

struct VolumePages {
    vol: Arc<dyn Controller>,
    open: BTreeMap<u64, Page>,
    frozen: BTreeMap<u64, Page>,
    /// Buffered pages that held room in the pool ([`crate::log::Log::add_reserved_grains`])
    /// because the controller did not map them when they were buffered: until one is written
    /// down or leaves the buffer.
    reserved: BTreeSet<u64>,
}

impl VolumePages {
    /// Room for `page`'s grains, when neither the buffer nor the controller holds it yet.
    fn reserve(&mut self, log: &Log, page: u64) {
        if !self.reserved.contains(&page) && self.vol.page_location(page).is_none() {
            self.reserved.insert(page);
            log.add_reserved_grains(page_grains(log, &*self.vol) as i64);
        }
    }

    /// Gives `page`'s room back (written down, trimmed, or its volume deleted); whether it
    /// held any.
    fn release(&mut self, log: &Log, page: u64) -> bool {
        let held = self.reserved.remove(&page);
        if held {
            log.add_reserved_grains(-(page_grains(log, &*self.vol) as i64));
        }
        held
    }

    /// Bytes of the pages that hold room in the pool (buffered, not mapped by the controller).
    fn reserved_bytes(&self) -> u64 {
        self.reserved.len() as u64 * self.vol.page_bytes() as u64
    }
}

/// Grains one page of `vol` takes in the pool.
fn page_grains(log: &Log, vol: &dyn Controller) -> u64 {
    vol.page_bytes() as u64 / log.geo().grain_bytes as u64
}

#[derive(Default)]
struct State {
    volumes: HashMap<u32, VolumePages>,
    bytes: u64,
    pages: u64,
    /// When the oldest page of the open sets was written (`None`: they are empty).
    oldest: Option<Instant>,
    /// Writers waiting for room.
    waiting: u32,
    /// The destager's last destage failed.
    failed: bool,
    stop: bool,
}

impl State {
    fn forget(&mut self, page: &Page) {
        self.bytes -= cost(page);
        self.pages -= 1;
    }
}

fn cost(page: &Page) -> u64 {
    page_cost(page.len())
}

/// What a page of `len` bytes counts against the capacity.
fn page_cost(len: usize) -> u64 {
    len as u64 + PAGE_OVERHEAD_BYTES
}

/// What a destage does with a frozen page that was rewritten since the destage froze it (its
/// newer copy is open).
#[derive(Clone, Copy)]
enum Rewritten {
    /// Write the newer copy in its place. A flush or a close waits on the destage: it then
    /// finds the page at least as new as it promised, and the log takes one copy where it
    /// would take two.
    WriteNewest,
    /// Write neither: the newer copy goes down with a later destage, or with the flush that
    /// makes it durable (which destages everything open), and until then neither copy was
    /// promised to last. For destages nothing waits on (by age, by fill, for room): a region
    /// rewritten over and over (a sequential writer's working set) reaches the log once per
    /// flush or expiry, as the page cache writes it, not once per destage it meets, and its
    /// older copies free their memory at once.
    Skip,
}

/// The buffer of a pool (disabled until [`DirtyPages::enable`]).
#[derive(Default)]
pub struct DirtyPages {
    capacity_bytes: AtomicU64,
    expire_ms: AtomicU64,
    state: Mutex<State>,
    /// Room made (writers wait on it).
    room: Condvar,
    /// A destage wanted (a writer waits, the buffer is half full) or the destager told to
    /// stop: the destager waits on it alone, so that the writes and flushes of a busy pool do
    /// not wake it for nothing (at queue depth 1 that cost a tenth of the flush rate).
    wake: Condvar,
    /// One destage at a time.
    destaging: Mutex<()>,
    /// Serialises partial-page writes, which read the page they merge into.
    partial: Mutex<()>,
    /// Orders destage writes against changes that bypass the buffer (see the invariants).
    order: Mutex<()>,
    destager: Mutex<Option<JoinHandle<()>>>,
    pages_written: AtomicU64,
    pages_absorbed: AtomicU64,
    destages: AtomicU64,
    pages_destaged: AtomicU64,
    writer_waits: AtomicU64,
    spares: Arc<SparePages>,
}

impl DirtyPages {
    /// Buffers up to `capacity_bytes` (at least [`MIN_CAPACITY_BYTES`]; 0 leaves the buffer
    /// off) and, with a destager running, writes pages down once the oldest is `expire` old.
    pub fn enable(&self, capacity_bytes: u64, expire: Duration) {
        let capacity = if capacity_bytes == 0 {
            0
        } else {
            capacity_bytes.max(MIN_CAPACITY_BYTES)
        };
        self.capacity_bytes.store(capacity, Relaxed);
        self.spares.capacity_bytes.store(capacity, Relaxed);
        self.expire_ms.store(expire.as_millis().min(u64::MAX as u128) as u64, Relaxed);
    }

    fn capacity(&self) -> u64 {
        self.capacity_bytes.load(Relaxed)
    }

    /// Whether writes to `vol` go through the buffer.
    pub fn buffers(&self, vol: &dyn Controller) -> bool {
        self.capacity() > 0 && matches!(vol.kind(), ControllerKind::Lsa | ControllerKind::Extent)
    }

    /// Whether page `page` of volume `id` is buffered.
    pub fn holds(&self, id: u32, page: u64) -> bool {
        let st = self.state.lock();
        st.volumes
            .get(&id)
            .is_some_and(|v| v.open.contains_key(&page) || v.frozen.contains_key(&page))
    }

    /// Bytes of volume `id`'s buffered pages that its controller does not map yet (the pages
    /// that hold room in the pool).
    pub fn reserved_bytes_of(&self, id: u32) -> u64 {
        let st = self.state.lock();
        st.volumes.get(&id).map_or(0, VolumePages::reserved_bytes)
    }

    pub fn stats(&self) -> Option<WriteBufferStats> {
        let capacity_bytes = self.capacity();
        if capacity_bytes == 0 {
            return None;
        }
        let st = self.state.lock();
        Some(WriteBufferStats {
            capacity_bytes,
            dirty_bytes: st.bytes,
            dirty_pages: st.pages,
            pages_written: self.pages_written.load(Relaxed),
            pages_absorbed: self.pages_absorbed.load(Relaxed),
            destages: self.destages.load(Relaxed),
            pages_destaged: self.pages_destaged.load(Relaxed),
            writer_waits: self.writer_waits.load(Relaxed),
            reserved_bytes: st.volumes.values().map(VolumePages::reserved_bytes).sum(),
            spare_bytes: self.spares.spare_bytes.load(Relaxed),
        })
    }

    // ----- writes -----

    /// Writes `data` at byte `offset` of `vol` (a buffered volume, range checked).
    pub fn write(&self, log: &Log, vol: &Arc<dyn Controller>, offset: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            // (It would otherwise read and buffer the page at `offset`, which may be past the
            // end of the volume.)
            return Ok(());
        }
        if self.bypasses(data.len()) {
            return self.write_through(log, vol, offset, data);
        }
        let pb = vol.page_bytes() as u64;
        let end = offset + data.len() as u64;
        self.check_room(log, vol, offset / pb..end.div_ceil(pb))?;
        let (first_full, end_full) = (offset.div_ceil(pb) * pb, end / pb * pb);
        if end_full <= first_full {
            // Within one page, or the ends of two.
            let mid = ((offset / pb + 1) * pb).min(end);
            self.write_partial(log, vol, offset, &data[..(mid - offset) as usize])?;
            if mid < end {
                self.write_partial(log, vol, mid, &data[(mid - offset) as usize..])?;
            }
            return Ok(());
        }
        if offset < first_full {
            self.write_partial(log, vol, offset, &data[..(first_full - offset) as usize])?;
        }
        let whole = &data[(first_full - offset) as usize..(end_full - offset) as usize];
        let pages = whole
            .chunks(pb as usize)
            .enumerate()
            .map(|(i, c)| (first_full / pb + i as u64, self.spares.page(c)))
            .collect();
        self.insert(log, vol, pages)?;
        if end_full < end {
            self.write_partial(log, vol, end_full, &data[(end_full - offset) as usize..])?;
        }
        Ok(())
    }

    /// Pages to receive a write of `len` bytes at `offset` of `vol` into, when the write is
    /// whole pages (page-aligned, not empty) small enough to be buffered; `None` otherwise.
    pub fn paged_payload(&self, vol: &dyn Controller, offset: u64, len: usize) -> Option<PagedPayload> {
        let pb = vol.page_bytes() as u64;
        let whole = len > 0 && offset.is_multiple_of(pb) && (len as u64).is_multiple_of(pb);
        if !whole || self.bypasses(len) {
            return None;
        }
        let pages = self.spares.take_many(pb as usize, (len as u64 / pb) as usize);
        Some(PagedPayload {
            offset,
            pages,
            spares: self.spares.clone(),
        })
    }

    /// Whether a write of `len` bytes goes past the buffer, to the controller: one over a
    /// quarter of the capacity would hold too much of it at once.
    fn bypasses(&self, len: usize) -> bool {
        len as u64 > self.capacity() / 4
    }

    /// Buffers the pages of `payload` (pages of `vol`'s size, from
    /// [`DirtyPages::paged_payload`], range checked) without copying them.
    pub fn write_paged(&self, log: &Log, vol: &Arc<dyn Controller>, payload: PagedPayload) -> Result<()> {
        let left = self.buffer_paged(log, vol, payload, true)?;
        debug_assert!(left.is_none(), "a write that may wait is always buffered");
        Ok(())
    }

    /// [`DirtyPages::write_paged`] if the buffer has room for the pages at once: `Ok(None)`
    /// once they are buffered, `Ok(Some(payload))` with nothing written when the write would
    /// wait for a destage to make room. It never waits and never touches a device, so a
    /// front-end can run it on the thread that received the write.
    pub fn write_paged_now(&self, log: &Log, vol: &Arc<dyn Controller>, payload: PagedPayload) -> Result<Option<PagedPayload>> {
        self.buffer_paged(log, vol, payload, false)
    }

    /// Buffers the pages of `payload`, first waiting for room if `wait`; without `wait`, hands
    /// the payload back untouched when there is none.
    fn buffer_paged(&self, log: &Log, vol: &Arc<dyn Controller>, mut payload: PagedPayload, wait: bool) -> Result<Option<PagedPayload>> {
        let pb = vol.page_bytes() as u64;
        let first = payload.offset / pb;
        let count = payload.pages.len() as u64;
        debug_assert!(payload.has_pages_of(pb as usize));
        self.check_room(log, vol, first..first + count)?;
        let need = count * page_cost(pb as usize);
        let st = if wait {
            self.wait_for_room(log, need)?
        } else {
            let st = self.state.lock();
            if st.bytes + need > self.capacity() {
                return Ok(Some(payload));
            }
            st
        };
        let pages = std::mem::take(&mut payload.pages)
            .into_iter()
            .enumerate()
            .map(|(i, bytes)| (first + i as u64, self.spares.wrap(bytes)))
            .collect();
        self.insert_locked(st, log, vol, pages);
        Ok(None)
    }

    /// Refuses a write of `pages` when the pool has no room for those of them that neither the
    /// buffer nor the controller holds yet (what the controller itself would refuse), so the
    /// buffer never acknowledges a write it cannot destage for want of space.
    fn check_room(&self, log: &Log, vol: &Arc<dyn Controller>, pages: std::ops::Range<u64>) -> Result<()> {
        // Room for every page, new or not, is room enough (the count below can only be
        // smaller); only a pool near full needs each page looked up.
        if log.check_room((pages.end - pages.start) * page_grains(log, &**vol)).is_ok() {
            return Ok(());
        }
        let st = self.state.lock();
        let held = st.volumes.get(&vol.id()).map(|v| &v.reserved);
        let fresh = pages
            .filter(|p| !held.is_some_and(|r| r.contains(p)) && vol.page_location(*p).is_none())
            .count() as u64;
        drop(st);
        log.check_room(fresh * page_grains(log, &**vol))
    }

    /// A piece of one page: merged into the page's newest copy, which is then buffered.
    fn write_partial(&self, log: &Log, vol: &Arc<dyn Controller>, at: u64, piece: &[u8]) -> Result<()> {
        let pb = vol.page_bytes() as u64;
        let page = at / pb;
        let _p = self.partial.lock();
        let mut bytes = self.spares.take(pb as usize);
        if let Err(e) = self.read(log, vol, page * pb, &mut bytes) {
            self.spares.give(bytes);
            return Err(e);
        }
        let from = (at - page * pb) as usize;
        bytes[from..from + piece.len()].copy_from_slice(piece);
        self.insert(log, vol, vec![(page, self.spares.wrap(bytes))])
    }

    /// Puts whole pages into the volume's open set, waiting for room first.
    fn insert(&self, log: &Log, vol: &Arc<dyn Controller>, pages: Vec<(u64, Page)>) -> Result<()> {
        let need: u64 = pages.iter().map(|(_, p)| cost(p)).sum();
        let st = self.wait_for_room(log, need)?;
        self.insert_locked(st, log, vol, pages);
        Ok(())
    }

    /// The state, locked, once the buffer has room for `need` more bytes: a writer that finds
    /// it full wakes the destager and waits (or, without one, destages itself).
    fn wait_for_room(&self, log: &Log, need: u64) -> Result<parking_lot::MutexGuard<'_, State>> {
        let capacity = self.capacity();
        let mut st = self.state.lock();
        let mut waited = false;
        while st.bytes + need > capacity {
            if !waited {
                waited = true;
                self.writer_waits.fetch_add(1, Relaxed);
            }
            if self.destager.lock().is_some() && !st.failed && !st.stop {
                st.waiting += 1;
                self.wake.notify_one();
                self.room.wait_for(&mut st, DESTAGER_TICK);
                st.waiting -= 1;
            } else {
                drop(st);
                self.destage(log, Rewritten::Skip)?;
                st = self.state.lock();
            }
        }
        Ok(st)
    }

    /// Puts whole pages into the volume's open set, under the state's lock (which it lets go).
    fn insert_locked(&self, mut st: parking_lot::MutexGuard<'_, State>, log: &Log, vol: &Arc<dyn Controller>, pages: Vec<(u64, Page)>) {
        let capacity = self.capacity();
        let (mut added_bytes, mut added_pages, mut absorbed) = (0u64, 0u64, 0u64);
        let n = pages.len() as u64;
        let entry = st.volumes.entry(vol.id()).or_insert_with(|| VolumePages {
            vol: vol.clone(),
            open: BTreeMap::new(),
            frozen: BTreeMap::new(),
            reserved: BTreeSet::new(),
        });
        // Pages replaced, dropped after the lock is let go (a drop gives the bytes to the
        // spare pages, under their own lock).
        let mut superseded = Vec::with_capacity(pages.len());
        // A run of consecutive pages (every multi-page write) replaces the copies it finds
        // in one walk of the open set rather than a search per page: a sequential rewrite
        // finds every page there. Pages it does not find are inserted one by one.
        let consecutive = pages.len() > 1 && pages.windows(2).all(|w| w[0].0 + 1 == w[1].0);
        let fresh = if consecutive {
            let (first, last) = (pages[0].0, pages[pages.len() - 1].0);
            let mut found = entry.open.range_mut(first..=last).peekable();
            let mut fresh = Vec::new();
            for (p, page) in pages {
                match found.next_if(|(k, _)| **k == p) {
                    Some((_, slot)) => {
                        // Buffered already, so its room was settled when it first came.
                        added_bytes += cost(&page);
                        let old = std::mem::replace(slot, page);
                        added_bytes -= cost(&old);
                        absorbed += 1;
                        superseded.push(old);
                    }
                    None => fresh.push((p, page)),
                }
            }
            fresh
        } else {
            pages
        };
        for (p, page) in fresh {
            added_bytes += cost(&page);
            added_pages += 1;
            match entry.open.insert(p, page) {
                Some(old) => {
                    added_bytes -= cost(&old);
                    added_pages -= 1;
                    absorbed += 1;
                    superseded.push(old);
                }
                None => entry.reserve(log, p),
            }
        }
        st.bytes += added_bytes;
        st.pages += added_pages;
        if st.oldest.is_none() {
            st.oldest = Some(Instant::now());
        }
        if st.bytes >= capacity / 2 {
            self.wake.notify_one();
        }
        drop(st);
        // The replaced pages nobody else holds go back to the spare pages under one lock; a
        // page a destage or a read still holds goes back when they let go of it.
        let unheld = superseded.into_iter().filter_map(|p| Arc::try_unwrap(p).ok());
        self.spares.give_many(unheld.map(PageBuf::into_bytes).collect());
        self.pages_written.fetch_add(n, Relaxed);
        self.pages_absorbed.fetch_add(absorbed, Relaxed);
    }

    /// Writes `data` to the controller itself (a large write, or one that must be durable at
    /// once): buffered pages it covers partly are written down first, so the controller's
    /// read-modify-write merges into their newest copy; those it covers whole are dropped
    /// once it is written (not before: a read meanwhile must not find an older copy).
    ///
    /// A write that covers a page in part holds `partial` as [`DirtyPages::write_partial`]
    /// does: otherwise a buffered partial write could read the page from the controller, this
    /// write change another part of it there, and the buffered copy (the old page with the
    /// other part merged) then hide this write from every read and overwrite it at the next
    /// destage. MariaDB on ext4 of 1 KiB blocks lost its index pages that way: its
    /// writers flush after every write, so some of its small writes pass the buffer
    /// ([`crate::pool::Volume`]'s `passes_buffer`) while others are buffered.
    pub fn write_through(&self, log: &Log, vol: &Arc<dyn Controller>, offset: u64, data: &[u8]) -> Result<()> {
        let pb = vol.page_bytes() as u64;
        let end = offset + data.len() as u64;
        let (first, last) = (offset / pb, end.div_ceil(pb));
        let _p = (!offset.is_multiple_of(pb) || !end.is_multiple_of(pb)).then(|| self.partial.lock());
        let _o = self.order.lock();
        let covered = self.snapshot(vol.id(), first..last);
        if covered.is_empty() {
            return vol.write(log, offset, data, None);
        }
        let edges: Vec<(u64, Page)> = covered
            .iter()
            .filter(|(p, _)| (*p == first && !offset.is_multiple_of(pb)) || (*p == last - 1 && !end.is_multiple_of(pb)))
            .cloned()
            .collect();
        self.write_down(log, vol, &edges)?;
        self.write_below(log, vol, covered.iter().map(|(p, _)| *p), offset, data, None)?;
        self.drop_superseded(log, vol.id(), first..last, &covered);
        Ok(())
    }

    /// Drops the buffered whole pages of `[offset, offset + len)` of `vol` after `trim` has
    /// discarded them below.
    pub fn trim(&self, log: &Log, vol: &Arc<dyn Controller>, offset: u64, len: u64, trim: impl FnOnce() -> Result<()>) -> Result<()> {
        let pb = vol.page_bytes() as u64;
        let pages = offset.div_ceil(pb)..(offset + len) / pb;
        let _o = self.order.lock();
        let covered = self.snapshot(vol.id(), pages.clone());
        trim()?;
        self.drop_superseded(log, vol.id(), pages, &covered);
        Ok(())
    }

    /// Writes every buffered page of `vol` down, then runs `then` while nothing else reaches
    /// the volume's controller through the buffer (a share, which must see every write that
    /// returned before it).
    pub fn write_down_volume<T>(&self, log: &Log, vol: &Arc<dyn Controller>, then: impl FnOnce() -> Result<T>) -> Result<T> {
        let _o = self.order.lock();
        let all = self.snapshot(vol.id(), 0..u64::MAX);
        self.write_down(log, vol, &all)?;
        self.drop_superseded(log, vol.id(), 0..u64::MAX, &all);
        then()
    }

    /// Forgets every buffered page of a volume being deleted.
    pub fn forget_volume(&self, log: &Log, id: u32) {
        let _o = self.order.lock();
        let mut st = self.state.lock();
        if let Some(v) = st.volumes.remove(&id) {
            for p in v.open.values().chain(v.frozen.values()) {
                st.forget(p);
            }
            log.add_reserved_grains(-((v.reserved.len() as u64 * page_grains(log, &*v.vol)) as i64));
        }
        self.room.notify_all();
    }

    /// Writes `data` at `offset` to `vol`'s controller, which counts the pages it maps as new
    /// itself: the room those of `pages` hold is given back first, and taken again for the
    /// ones still buffered and unmapped if the write fails.
    fn write_below(
        &self,
        log: &Log,
        vol: &Arc<dyn Controller>,
        pages: impl Iterator<Item = u64>,
        offset: u64,
        data: &[u8],
        payload: Option<&Arc<WriteBuffer>>,
    ) -> Result<()> {
        let gave: Vec<u64> = {
            let mut st = self.state.lock();
            match st.volumes.get_mut(&vol.id()) {
                Some(v) => pages.filter(|p| v.release(log, *p)).collect(),
                None => Vec::new(),
            }
        };
        let r = vol.write(log, offset, data, payload);
        if r.is_err() && !gave.is_empty() {
            let mut st = self.state.lock();
            if let Some(v) = st.volumes.get_mut(&vol.id()) {
                for p in gave {
                    if v.open.contains_key(&p) || v.frozen.contains_key(&p) {
                        v.reserve(log, p);
                    }
                }
            }
        }
        r
    }

    /// The newest buffered copy of every page in `pages` that has one.
    fn snapshot(&self, id: u32, pages: std::ops::Range<u64>) -> Vec<(u64, Page)> {
        if pages.is_empty() {
            // (A trim inside one page covers no whole page.)
            return Vec::new();
        }
        let st = self.state.lock();
        let Some(v) = st.volumes.get(&id) else { return Vec::new() };
        let mut out: BTreeMap<u64, Page> = v.frozen.range(pages.clone()).map(|(k, p)| (*k, p.clone())).collect();
        out.extend(v.open.range(pages).map(|(k, p)| (*k, p.clone())));
        out.into_iter().collect()
    }

    /// After `pages` were written down or superseded below: drops every frozen page of the
    /// range (older than what went down; only holders of `order` change `frozen`) and every
    /// open page still holding the copy `covered` saw (one written since is newer: it stays).
    fn drop_superseded(&self, log: &Log, id: u32, pages: std::ops::Range<u64>, covered: &[(u64, Page)]) {
        if pages.is_empty() {
            return;
        }
        let mut st = self.state.lock();
        let Some(v) = st.volumes.get_mut(&id) else { return };
        let mut gone = Vec::new();
        let mut left = Vec::new();
        let frozen: Vec<u64> = v.frozen.range(pages).map(|(k, _)| *k).collect();
        for k in frozen {
            gone.extend(v.frozen.remove(&k));
            left.push(k);
        }
        let mut newer = Vec::new();
        for (k, page) in covered {
            match v.open.get(k) {
                Some(p) if Arc::ptr_eq(p, page) => {
                    gone.extend(v.open.remove(k));
                    left.push(*k);
                }
                Some(_) => newer.push(*k),
                None => {}
            }
        }
        // A page with no copy left gives its room back (it is mapped below now, or trimmed).
        for k in left {
            if !v.open.contains_key(&k) && !v.frozen.contains_key(&k) {
                v.release(log, k);
            }
        }
        // A copy written meanwhile stays; if what was below is gone (a trim), it now needs
        // room of its own, which a rewrite of a buffered page does not look for again.
        for k in newer {
            v.reserve(log, k);
        }
        for p in &gone {
            st.forget(p);
        }
        self.room.notify_all();
    }

    /// Writes `pages` (sorted, of one volume) to its controller, consecutive pages together.
    /// The caller holds `order`.
    fn write_down(&self, log: &Log, vol: &Arc<dyn Controller>, pages: &[(u64, Page)]) -> Result<()> {
        let pb = vol.page_bytes() as u64;
        let per_run = (MAX_RUN_BYTES / pb).max(1) as usize;
        let mut i = 0;
        while i < pages.len() {
            let mut j = i + 1;
            while j < pages.len() && j - i < per_run && pages[j].0 == pages[j - 1].0 + 1 {
                j += 1;
            }
            // A run long enough for a payload buffer goes down in one, which the log's records
            // hold instead of copying the pages a second time.
            let len = (j - i) * pb as usize;
            let payload = log.payloads().get(len).map(|mut payload| {
                for (k, (_, p)) in pages[i..j].iter().enumerate() {
                    payload[k * pb as usize..(k + 1) * pb as usize].copy_from_slice(p);
                }
                Arc::new(payload)
            });
            let mut buf = Vec::new();
            if payload.is_none() {
                buf.reserve_exact(len);
                for (_, p) in &pages[i..j] {
                    buf.extend_from_slice(p);
                }
            }
            let data = payload.as_deref().map_or(&buf[..], |p| &p[..]);
            let at = pages[i].0 * pb;
            self.write_below(log, vol, pages[i..j].iter().map(|(p, _)| *p), at, data, payload.as_ref())?;
            self.pages_destaged.fetch_add((j - i) as u64, Relaxed);
            i = j;
        }
        Ok(())
    }

    // ----- reads -----

    /// Reads `buf.len()` bytes at `offset` of `vol`: buffered pages from memory, the rest from
    /// the controller.
    pub fn read(&self, log: &Log, vol: &Arc<dyn Controller>, offset: u64, buf: &mut [u8]) -> Result<()> {
        let pb = vol.page_bytes() as u64;
        let end = offset + buf.len() as u64;
        let (first, last) = (offset / pb, end.div_ceil(pb));
        let copies: Vec<Option<Page>> = {
            let st = self.state.lock();
            match st.volumes.get(&vol.id()) {
                Some(v) if !(v.open.is_empty() && v.frozen.is_empty()) => (first..last)
                    .map(|p| v.open.get(&p).or_else(|| v.frozen.get(&p)).cloned())
                    .collect(),
                _ => Vec::new(),
            }
        };
        if copies.is_empty() {
            return vol.read(log, offset, buf);
        }
        let span = |from_page: u64, to_page: u64| (offset.max(from_page * pb), end.min(to_page * pb));
        let mut i = 0;
        while i < copies.len() {
            if copies[i].is_some() {
                i += 1;
                continue;
            }
            let mut j = i + 1;
            while j < copies.len() && copies[j].is_none() {
                j += 1;
            }
            let (from, to) = span(first + i as u64, first + j as u64);
            vol.read(log, from, &mut buf[(from - offset) as usize..(to - offset) as usize])?;
            i = j;
        }
        for (i, copy) in copies.iter().enumerate() {
            if let Some(page) = copy {
                let p = first + i as u64;
                let (from, to) = span(p, p + 1);
                let at = (from - p * pb) as usize;
                buf[(from - offset) as usize..(to - offset) as usize].copy_from_slice(&page[at..at + (to - from) as usize]);
            }
        }
        Ok(())
    }

    // ----- destage -----

    /// Writes down every page buffered when it starts: the open sets are frozen, then each
    /// volume's frozen pages go to its controller in logical order, in runs of consecutive
    /// pages. On an error the pages not written stay buffered (and are retried by the next
    /// destage or flush).
    pub fn destage_all(&self, log: &Log) -> Result<()> {
        self.destage(log, Rewritten::WriteNewest)
    }

    /// [`DirtyPages::destage_all`], with frozen pages rewritten since they were frozen
    /// handled as `rewritten` says.
    fn destage(&self, log: &Log, rewritten: Rewritten) -> Result<()> {
        if self.capacity() == 0 {
            return Ok(());
        }
        let _d = self.destaging.lock();
        let ids: Vec<u32> = {
            let _o = self.order.lock();
            let mut st = self.state.lock();
            st.oldest = None;
            let mut replaced = Vec::new();
            for v in st.volumes.values_mut() {
                if v.frozen.is_empty() {
                    std::mem::swap(&mut v.frozen, &mut v.open);
                } else {
                    // A destage that failed left pages: the open copies are newer.
                    for (k, p) in std::mem::take(&mut v.open) {
                        replaced.extend(v.frozen.insert(k, p));
                    }
                }
            }
            for p in &replaced {
                st.forget(p);
            }
            st.volumes.iter().filter(|(_, v)| !v.frozen.is_empty()).map(|(id, _)| *id).collect()
        };
        if ids.is_empty() {
            return Ok(());
        }
        self.destages.fetch_add(1, Relaxed);
        for id in ids {
            loop {
                let _o = self.order.lock();
                // A range of at most a run's frozen pages, under `order`; `write_down` splits
                // the chunk into runs of consecutive pages. A frozen page rewritten since it
                // was frozen is written as its newer, open copy or not at all (`rewritten`).
                let (vol, range, chunk, newer, skipped) = {
                    let st = self.state.lock();
                    let Some(v) = st.volumes.get(&id) else { break };
                    let per_chunk = (MAX_RUN_BYTES / v.vol.page_bytes() as u64).max(1) as usize;
                    let mut range = None;
                    let mut chunk: Vec<(u64, Page)> = Vec::new();
                    let mut newer: Vec<(u64, Page)> = Vec::new();
                    let mut skipped = 0u64;
                    for (k, p) in v.frozen.iter().take(per_chunk) {
                        let r = range.get_or_insert(*k..*k);
                        r.end = k + 1;
                        match (v.open.get(k), rewritten) {
                            (Some(open), Rewritten::WriteNewest) => {
                                chunk.push((*k, open.clone()));
                                newer.push((*k, open.clone()));
                            }
                            (Some(_), Rewritten::Skip) => skipped += 1,
                            (None, _) => chunk.push((*k, p.clone())),
                        }
                    }
                    (v.vol.clone(), range, chunk, newer, skipped)
                };
                let Some(range) = range else { break };
                if vol.is_retired() {
                    drop(_o);
                    self.forget_volume(log, id);
                    break;
                }
                self.write_down(log, &vol, &chunk)?;
                self.pages_absorbed.fetch_add(newer.len() as u64 + skipped, Relaxed);
                // The range's frozen pages are all written down or superseded (`frozen`
                // changes only under `order`, held since they were taken), and so are the
                // open copies written in their place unless rewritten again meanwhile.
                self.drop_superseded(log, id, range, &newer);
            }
        }
        Ok(())
    }

    /// Starts the thread that destages when the buffer is half full, a writer waits for
    /// room, or the oldest page is older than the expiry.
    pub fn start_destager<O: BufferOwner>(owner: &Arc<O>) -> Result<()> {
        let d = owner.write_buffer();
        if d.capacity() == 0 {
            return Ok(());
        }
        let o = owner.clone();
        let h = std::thread::Builder::new()
            .name("salsa-destage".into())
            .spawn(move || destager(&*o))
            .map_err(|e| crate::error::Error::InvalidConfig(format!("cannot start the write buffer's destager: {e}")))?;
        *d.destager.lock() = Some(h);
        Ok(())
    }

    /// Stops the destager (the buffer keeps its pages: close and flush destage them).
    pub fn stop_destager(&self) {
        self.state.lock().stop = true;
        self.wake.notify_one();
        self.room.notify_all();
        let h = self.destager.lock().take();
        if let Some(h) = h {
            let _ = h.join();
        }
    }
}

/// What the destager thread needs from whoever owns the buffer (the engine): the buffer and
/// the log it destages to. A trait, so that the buffer does not depend on the engine.
pub trait BufferOwner: Send + Sync + 'static {
    fn write_buffer(&self) -> &DirtyPages;
    fn log(&self) -> &Log;
}

fn destager(owner: &dyn BufferOwner) {
    let d = owner.write_buffer();
    let capacity = d.capacity();
    let expire = Duration::from_millis(d.expire_ms.load(Relaxed));
    // Since when the buffer has been empty: after an expiry of that, its spare pages go back
    // to the system.
    let mut empty_since: Option<Instant> = None;
    loop {
        {
            let mut st = d.state.lock();
            loop {
                if st.stop {
                    return;
                }
                let due = st.waiting > 0 || st.bytes >= capacity / 2 || st.oldest.is_some_and(|t| t.elapsed() >= expire);
                if due {
                    break;
                }
                if st.pages > 0 {
                    empty_since = None;
                } else if empty_since.get_or_insert_with(Instant::now).elapsed() >= expire {
                    d.spares.clear();
                }
                d.wake.wait_for(&mut st, DESTAGER_TICK);
            }
        }
        let r = d.destage(owner.log(), Rewritten::Skip);
        let mut st = d.state.lock();
        st.failed = r.is_err();
        d.room.notify_all();
        if let Err(e) = r {
            tracing::warn!("write buffer: destage failed, {} bytes stay buffered: {e}", st.bytes);
            d.wake.wait_for(&mut st, RETRY_AFTER);
        }
    }
}
