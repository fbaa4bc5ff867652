//! The file store: files appended into segments of their own on an AMF volume, the table of
//! them kept by the journal.
//!
//! Data path: a writer gathers appends in memory and writes whole pages into its file's current
//! segment (taking the lowest free one when it has none or it is full); a sync writes the rest,
//! padded to a page (the file's next bytes start a new extent on the next page), flushes the
//! volume, then journals the file's new extents and flushes again. So a file's journaled
//! extents are always durable data, and a sync that returned survives a crash. Reads follow a
//! file's extents as the table held them when it was opened for reading; files are written
//! once, so that is all of it.
//!
//! A deleted or replaced file's segments are trimmed whole once its deletion is durable, so
//! SALSA's GC never copies a file's bytes on its account.

use crate::error::{Error, Result};
use crate::journal::Journal;
use crate::record::{push_extent, Extent, Record};
use crate::table::{check_name, FileKind, KindStats, Table, JOURNAL_SEGMENTS};
use parking_lot::Mutex;
use salsa_core::frontend::BlockVolume;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Most bytes one append to the volume carries, and the gathered bytes past which a writer
/// writes its whole pages out once the store holds more than its budget.
pub const WRITE_CHUNK_BYTES: usize = 1 << 20;

/// Bytes written and not yet on the volume the store holds in memory at most, across open
/// writers and closed files ([`FileWriter::close`]), before writers write theirs out: a
/// kernel file system's dirty page cache does the same for its files, so that a file deleted
/// soon after it was written (a write-ahead log whose memtable was flushed) never reaches the
/// device.
pub const HELD_BYTES_DEFAULT: u64 = 256 << 20;

struct State {
    table: Table,
    journal: Journal,
    /// Set by a failed volume write, flush or trim: the table in memory may say more than the
    /// volume holds, so nothing more is changed until the store is opened again.
    failed: Option<String>,
}

struct Shared {
    volume: Arc<dyn BlockVolume>,
    segment_bytes: u64,
    page_bytes: u64,
    state: Mutex<State>,
    held: Mutex<Held>,
}

/// What a file has that the table does not yet: bytes gathered in memory, the segment being
/// filled, and the extents written since the file's last sync.
#[derive(Default)]
struct Tail {
    buf: Vec<u8>,
    segment: Option<u64>,
    segment_used: u64,
    unsynced: Vec<Extent>,
}

impl Tail {
    fn is_empty(&self) -> bool {
        self.buf.is_empty() && self.unsynced.is_empty()
    }
}

/// The bytes the store holds in memory, and the tails of files closed without a sync.
#[derive(Default)]
struct Held {
    bytes: u64,
    closed: std::collections::BTreeMap<u64, Tail>,
}

/// A file store on one AMF volume. Cheap to clone; every clone is the same store.
#[derive(Clone)]
pub struct FileStore {
    shared: Arc<Shared>,
}

/// Per file kind, what the store holds, and the journal's place.
#[derive(Debug, Clone)]
pub struct StoreStats {
    pub kinds: [(FileKind, KindStats); 4],
    pub segment_bytes: u64,
    pub segments_total: u64,
    pub journal_generation: u64,
    pub journal_bytes: u64,
}

impl StoreStats {
    /// What the store holds of files of `kind`.
    pub fn of(&self, kind: FileKind) -> KindStats {
        self.kinds
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or_else(KindStats::default, |(_, s)| *s)
    }
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Normalises a name: no trailing or doubled slashes.
fn normal(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for part in name.split('/') {
        if part.is_empty() {
            continue;
        }
        if !out.is_empty() || name.starts_with('/') {
            out.push('/');
        }
        out.push_str(part);
    }
    if out.is_empty() && name.starts_with('/') {
        out.push('/');
    }
    out
}

/// A store's volume: its segment size and segment count, refused when it is not append-only
/// or has no segment for files beside the journal's two.
fn geometry(volume: &dyn BlockVolume) -> Result<(u64, u64)> {
    let segment_bytes = volume
        .segment_bytes()
        .ok_or_else(|| Error::NotAppendOnly(volume.name().to_string()))?;
    let total = volume.size_bytes() / segment_bytes;
    if total < JOURNAL_SEGMENTS + 1 {
        return Err(Error::NoSpace(format!(
            "volume {} has {total} segments; a file store needs at least {}",
            volume.name(),
            JOURNAL_SEGMENTS + 1
        )));
    }
    Ok((segment_bytes, total))
}

/// The statistics of the file store on `volume`, read without writing anything (for a
/// look-only command such as `salsa info`); `Ok(None)` when the volume is not append-only or
/// holds no file store.
pub fn inspect(volume: &dyn BlockVolume) -> Result<Option<StoreStats>> {
    let (segment_bytes, total) = match geometry(volume) {
        Ok(g) => g,
        Err(Error::NotAppendOnly(_) | Error::NoSpace(_)) => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut table = Table::new(segment_bytes, total);
    match Journal::read(volume, &mut table, segment_bytes) {
        Ok(Some((journal, _))) => {
            let (_, journal_bytes, journal_generation) = journal.position();
            Ok(Some(StoreStats {
                kinds: table.stats(),
                segment_bytes,
                segments_total: total,
                journal_generation,
                journal_bytes,
            }))
        }
        Ok(None) | Err(Error::Foreign(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

impl FileStore {
    /// Opens the store on `volume`, making a new one when the volume is blank. Refuses a volume
    /// that is not append-only, one that holds other data, and a damaged table. Segments no
    /// file owns but which hold data (a file's writes a crash left unjournaled) are trimmed.
    pub fn open(volume: Arc<dyn BlockVolume>) -> Result<FileStore> {
        let (segment_bytes, total) = geometry(&*volume)?;
        let mut table = Table::new(segment_bytes, total);
        let journal = match Journal::open(&*volume, &mut table, segment_bytes)? {
            Some(j) => j,
            None => {
                for s in JOURNAL_SEGMENTS..total {
                    if volume.write_point(s)? > 0 {
                        return Err(Error::Foreign(volume.name().to_string()));
                    }
                }
                Journal::create(&*volume, &table, segment_bytes)?
            }
        };
        let mut orphans = 0;
        for s in JOURNAL_SEGMENTS..total {
            if table.owner_of(s).is_none() && volume.write_point(s)? > 0 {
                volume.trim(s * segment_bytes, segment_bytes)?;
                orphans += 1;
            }
        }
        if orphans > 0 {
            tracing::info!("file store on {}: trimmed {orphans} segments no file owned", volume.name());
            volume.flush()?;
        }
        let page_bytes = volume.page_bytes() as u64;
        let state = State {
            table,
            journal,
            failed: None,
        };
        Ok(FileStore {
            shared: Arc::new(Shared {
                volume,
                segment_bytes,
                page_bytes,
                state: Mutex::new(state),
                held: Mutex::new(Held::default()),
            }),
        })
    }

    /// Writes every file closed without a sync out and makes the store durable: what a clean
    /// shutdown does (the last handle of the store does it when dropped).
    pub fn sync_all(&self) -> Result<()> {
        let closed = std::mem::take(&mut self.shared.held.lock().closed);
        for (id, mut tail) in closed {
            self.settle(id, &mut tail, true)?;
        }
        self.sync_metadata()
    }

    /// Writes the held tail of closed file `id` out (not durably), so that the table describes
    /// all of it; nothing when it has none.
    fn settle_closed(&self, id: u64) -> Result<()> {
        let tail = self.shared.held.lock().closed.remove(&id);
        match tail {
            Some(mut tail) => self.settle(id, &mut tail, false),
            None => Ok(()),
        }
    }

    /// Forgets the held tail of file `id` (deleted or replaced): its bytes are never written.
    fn drop_closed(&self, id: u64) {
        let mut held = self.shared.held.lock();
        if let Some(tail) = held.closed.remove(&id) {
            held.bytes -= tail.buf.len() as u64;
        }
    }

    /// Counts `n` more bytes held; returns whether the store now holds more than its budget.
    fn hold(&self, n: u64) -> bool {
        let mut held = self.shared.held.lock();
        held.bytes += n;
        held.bytes > HELD_BYTES_DEFAULT
    }

    /// While the store holds more than its budget, writes closed files' tails out (the oldest
    /// file first).
    fn shed_closed(&self) -> Result<()> {
        loop {
            let next = {
                let mut held = self.shared.held.lock();
                if held.bytes <= HELD_BYTES_DEFAULT {
                    return Ok(());
                }
                held.closed.pop_first()
            };
            match next {
                Some((id, mut tail)) => self.settle(id, &mut tail, false)?,
                None => return Ok(()),
            }
        }
    }

    /// Writes `tail` out whole (its last page padded) and journals its extents; `durable`: and
    /// commits the journal, so that everything appended to the file survives a crash.
    fn settle(&self, id: u64, tail: &mut Tail, durable: bool) -> Result<()> {
        let exists = self.shared.state.lock().table.file(id).is_some();
        if !exists {
            // Deleted (or replaced) while a writer still held it: nothing of it is written.
            let held = std::mem::take(&mut tail.buf).len() as u64;
            self.shared.held.lock().bytes -= held;
            tail.unsynced.clear();
            return Ok(());
        }
        self.write_out(id, tail, true)?;
        let extents = std::mem::take(&mut tail.unsynced);
        self.change(|shared, st| {
            if !extents.is_empty() && st.table.file(id).is_some() {
                let record = Record::Extents {
                    id,
                    extents,
                    mtime_secs: now_secs(),
                };
                st.table.apply(&record)?;
                st.journal.push(record);
            }
            if durable {
                let State { table, journal, .. } = st;
                journal.commit(&*shared.volume, table)?;
            }
            Ok(())
        })
    }

    /// Writes the bytes `tail` gathered: whole pages only, or (`pad`) all of them, the last page
    /// padded with zeros. Counts what left memory.
    fn write_out(&self, id: u64, tail: &mut Tail, pad: bool) -> Result<()> {
        let page = self.shared.page_bytes as usize;
        let valid = if pad { tail.buf.len() } else { tail.buf.len() / page * page };
        if valid == 0 {
            return Ok(());
        }
        let padded = valid.next_multiple_of(page);
        let mut data = std::mem::take(&mut tail.buf);
        tail.buf = data.split_off(valid);
        data.resize(padded, 0);
        self.shared.held.lock().bytes -= valid as u64;
        self.write_pages(id, tail, &data, valid as u64)
    }

    /// Writes `data` (whole pages, of which the first `valid` bytes are the file's) into the
    /// file's segments.
    fn write_pages(&self, id: u64, tail: &mut Tail, data: &[u8], valid: u64) -> Result<()> {
        let segment_bytes = self.shared.segment_bytes;
        let mut pos = 0usize;
        while pos < data.len() {
            let segment = match tail.segment {
                Some(s) if tail.segment_used < segment_bytes => s,
                _ => {
                    let s = self.change(|_, st| st.table.take_segment(id))?;
                    tail.segment = Some(s);
                    tail.segment_used = 0;
                    s
                }
            };
            let take = (data.len() - pos)
                .min((segment_bytes - tail.segment_used) as usize)
                .min(WRITE_CHUNK_BYTES);
            let offset = self
                .shared
                .volume
                .append(segment, &data[pos..pos + take])
                .map_err(|e| self.fail(e))?;
            tail.segment_used += take as u64;
            let file_bytes = (take as u64).min(valid.saturating_sub(pos as u64));
            if file_bytes > 0 {
                push_extent(&mut tail.unsynced, Extent { offset, len: file_bytes }, segment_bytes);
            }
            pos += take;
        }
        Ok(())
    }

    /// Marks the store failed after a volume error outside the table's lock.
    fn fail(&self, e: salsa_core::Error) -> Error {
        self.shared.state.lock().failed.get_or_insert_with(|| e.to_string());
        Error::Volume(e)
    }

    /// Runs a change of the table under its lock: refused after an earlier failure, and a
    /// volume error inside makes every later change fail too.
    fn change<T>(&self, f: impl FnOnce(&Shared, &mut State) -> Result<T>) -> Result<T> {
        let mut st = self.shared.state.lock();
        if let Some(why) = &st.failed {
            return Err(Error::Failed(why.clone()));
        }
        let out = f(&self.shared, &mut st);
        if let Err(Error::Volume(e)) = &out {
            st.failed = Some(e.to_string());
        }
        out
    }

    /// Applies `record`, makes it durable, then trims the segments it freed.
    fn journal(shared: &Shared, st: &mut State, record: Record) -> Result<()> {
        let freed = st.table.apply(&record)?;
        st.journal.push(record);
        let State { table, journal, .. } = st;
        journal.commit(&*shared.volume, table)?;
        for s in freed {
            shared.volume.trim(s * shared.segment_bytes, shared.segment_bytes)?;
        }
        Ok(())
    }

    /// Creates file `name` (replacing one of that name) and returns its writer. The file
    /// exists durably once the writer syncs, or [`FileStore::sync_metadata`] runs.
    pub fn create(&self, name: &str) -> Result<FileWriter> {
        let name = normal(name);
        check_name(&name)?;
        let id = self.change(|shared, st| {
            let id = st.table.next_file_id();
            let record = Record::Create {
                id,
                name: name.clone(),
                mtime_secs: now_secs(),
            };
            if let Some(old) = st.table.id_of(&name) {
                // The old file's segments are trimmed, so the replacement is made durable first;
                // what it still held in memory is never written.
                self.drop_closed(old);
                Self::journal(shared, st, record)?;
            } else {
                st.table.apply(&record)?;
                st.journal.push(record);
            }
            Ok(id)
        })?;
        Ok(FileWriter {
            store: self.clone(),
            id,
            tail: Tail::default(),
            size: 0,
        })
    }

    /// Makes every create, rename and directory change so far durable (a directory's fsync).
    pub fn sync_metadata(&self) -> Result<()> {
        self.change(|shared, st| {
            let State { table, journal, .. } = st;
            journal.commit(&*shared.volume, table)
        })
    }

    /// Whether changes to the table (creates of new names) wait for the next commit.
    pub fn has_pending_changes(&self) -> bool {
        self.shared.state.lock().journal.has_pending()
    }

    /// Opens file `name` for reading.
    pub fn open_reader(&self, name: &str) -> Result<FileReader> {
        self.with_file(name, |file| {
            let mut starts = Vec::with_capacity(file.extents.len());
            let mut at = 0;
            for e in &file.extents {
                starts.push(at);
                at += e.len;
            }
            FileReader {
                volume: self.shared.volume.clone(),
                extents: file.extents.clone(),
                starts,
                size: file.size,
            }
        })
    }

    /// Runs `f` on file `name` as the table holds it, after writing out what the file still
    /// held in memory since it was closed, so that `f` sees all of it.
    fn with_file<T>(&self, name: &str, f: impl FnOnce(&crate::table::File) -> T) -> Result<T> {
        let name = normal(name);
        // (Bound first: the table's lock must be let go before the settle takes it again.)
        let id = self.shared.state.lock().table.id_of(&name);
        if let Some(id) = id {
            self.settle_closed(id)?;
        }
        let st = self.shared.state.lock();
        let file = st
            .table
            .id_of(&name)
            .and_then(|id| st.table.file(id))
            .ok_or(Error::NotFound(name))?;
        Ok(f(file))
    }

    /// Deletes file `name`; its segments are trimmed once the deletion is durable.
    pub fn delete(&self, name: &str) -> Result<()> {
        let name = normal(name);
        self.change(|shared, st| {
            let id = st.table.id_of(&name).ok_or_else(|| Error::NotFound(name.clone()))?;
            self.drop_closed(id);
            Self::journal(shared, st, Record::Delete { id })
        })
    }

    /// Renames `from` to `to` (replacing a file named `to`), durably.
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        let (from, to) = (normal(from), normal(to));
        check_name(&to)?;
        self.change(|shared, st| {
            let id = st.table.id_of(&from).ok_or_else(|| Error::NotFound(from.clone()))?;
            if let Some(old) = st.table.id_of(&to).filter(|&old| old != id) {
                self.drop_closed(old);
            }
            Self::journal(shared, st, Record::Rename { id, to: to.clone() })
        })
    }

    /// Creates directory `name` (nothing when it exists), durably.
    pub fn create_dir(&self, name: &str) -> Result<()> {
        let name = normal(name);
        check_name(&name)?;
        self.change(|shared, st| {
            if st.table.is_dir(&name) {
                return Ok(());
            }
            Self::journal(shared, st, Record::CreateDir { name: name.clone() })
        })
    }

    /// Deletes directory `name`, which must be empty.
    pub fn delete_dir(&self, name: &str) -> Result<()> {
        let name = normal(name);
        self.change(|shared, st| {
            if !st.table.is_dir(&name) {
                return Err(Error::NotFound(name.clone()));
            }
            if !st.table.children(&name).is_empty() {
                return Err(Error::NotEmpty(name.clone()));
            }
            Self::journal(shared, st, Record::DeleteDir { name: name.clone() })
        })
    }

    /// Whether a file or directory `name` exists.
    pub fn exists(&self, name: &str) -> bool {
        let name = normal(name);
        let st = self.shared.state.lock();
        st.table.id_of(&name).is_some() || st.table.is_dir(&name) || !st.table.children(&name).is_empty()
    }

    /// Whether `name` is a directory.
    pub fn is_dir(&self, name: &str) -> bool {
        let name = normal(name);
        let st = self.shared.state.lock();
        st.table.is_dir(&name) || (st.table.id_of(&name).is_none() && !st.table.children(&name).is_empty())
    }

    /// The names directly under directory `dir`.
    pub fn children(&self, dir: &str) -> Vec<String> {
        self.shared.state.lock().table.children(&normal(dir))
    }

    /// A file's size in bytes (what its syncs made durable) and modification time.
    pub fn stat(&self, name: &str) -> Result<(u64, u64)> {
        self.with_file(name, |file| (file.size, file.mtime_secs))
    }

    pub fn stats(&self) -> StoreStats {
        let st = self.shared.state.lock();
        let (_, journal_bytes, journal_generation) = st.journal.position();
        StoreStats {
            kinds: st.table.stats(),
            segment_bytes: self.shared.segment_bytes,
            segments_total: self.shared.volume.size_bytes() / self.shared.segment_bytes,
            journal_generation,
            journal_bytes,
        }
    }

    /// The volume the store is on.
    pub fn volume(&self) -> &dyn BlockVolume {
        &*self.shared.volume
    }
}

/// Writes one file. Appends are gathered in memory (within the store's budget, see
/// [`HELD_BYTES_DEFAULT`]); [`FileWriter::sync`] makes them durable.
pub struct FileWriter {
    store: FileStore,
    id: u64,
    tail: Tail,
    size: u64,
}

impl FileWriter {
    /// Appends `data` to the file.
    pub fn append(&mut self, data: &[u8]) -> Result<()> {
        self.tail.buf.extend_from_slice(data);
        self.size += data.len() as u64;
        if self.store.hold(data.len() as u64) && self.tail.buf.len() >= WRITE_CHUNK_BYTES {
            self.store.write_out(self.id, &mut self.tail, false)?;
            self.store.shed_closed()?;
        }
        Ok(())
    }

    /// Bytes appended so far (durable or not).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Writes the whole pages gathered so far to the volume (not durable until a sync).
    pub fn flush(&mut self) -> Result<()> {
        self.store.write_out(self.id, &mut self.tail, false)
    }

    /// Makes everything appended so far durable: the data, then the file's extents (the
    /// journal's commit flushes the volume before it writes them).
    pub fn sync(&mut self) -> Result<()> {
        self.store.settle(self.id, &mut self.tail, true)
    }

    /// Ends the writer. As a kernel file system's close, this does not make the file durable
    /// (a sync before does): what it still holds stays in memory, within the store's budget,
    /// until the file is read, synced by [`FileStore::sync_all`] or the store's last handle,
    /// or deleted, in which case it is never written.
    pub fn close(mut self) -> Result<()> {
        let tail = std::mem::take(&mut self.tail);
        if tail.is_empty() {
            return Ok(());
        }
        let over = {
            let mut held = self.store.shared.held.lock();
            held.closed.insert(self.id, tail);
            held.bytes > HELD_BYTES_DEFAULT
        };
        if over {
            self.store.shed_closed()?;
        }
        Ok(())
    }
}

impl Drop for FileWriter {
    fn drop(&mut self) {
        // A writer dropped without close: what it held in memory is let go unwritten.
        let held = self.tail.buf.len() as u64;
        if held > 0 {
            self.store.shared.held.lock().bytes -= held;
        }
    }
}

impl Drop for FileStore {
    fn drop(&mut self) {
        // The last handle: every closed file's held bytes go to the volume, durably.
        if Arc::strong_count(&self.shared) == 1 && !self.shared.held.lock().closed.is_empty() {
            if let Err(e) = self.sync_all() {
                tracing::error!("file store on {}: writing closed files at shutdown: {e}", self.shared.volume.name());
            }
        }
    }
}

/// Reads one file as it was when opened.
pub struct FileReader {
    volume: Arc<dyn BlockVolume>,
    extents: Vec<Extent>,
    /// File offset of each extent.
    starts: Vec<u64>,
    size: u64,
}

impl FileReader {
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Reads from file offset `offset` into `buf`; returns the bytes read (fewer at the end).
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        if offset >= self.size {
            return Ok(0);
        }
        let want = (buf.len() as u64).min(self.size - offset) as usize;
        let mut done = 0usize;
        let mut i = self.starts.partition_point(|&s| s <= offset) - 1;
        while done < want {
            let e = self.extents[i];
            let inside = offset + done as u64 - self.starts[i];
            let n = ((e.len - inside) as usize).min(want - done);
            self.volume.read(e.offset + inside, &mut buf[done..done + n])?;
            done += n;
            i += 1;
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::normal;

    #[test]
    fn names_lose_doubled_and_trailing_slashes() {
        assert_eq!(normal("/db//000001.log"), "/db/000001.log");
        assert_eq!(normal("db/"), "db");
        assert_eq!(normal("/"), "/");
    }
}
