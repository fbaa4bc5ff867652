//! The file store's C calls (`salsa_fs_*`): files on an append-only volume, for storage
//! engines that keep their data in files (the RocksDB plugin in `plugins/rocksdb`). The same
//! rules as the rest of the API: negative errno and `salsa_last_error()` on failure, no pointer
//! trusted, every handle counted against its pool so the pool cannot close under it.

use super::{bytes, bytes_mut, free, give, guarded, handle, text, Failure, OpenHandle, SalsaPool};
use salsa_files::{FileKind, FileReader, FileStore, FileWriter};
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::Arc;

/// A file store on one append-only volume. Opaque to C.
pub struct SalsaFs {
    store: FileStore,
    open: OpenHandle,
}

/// A file being written. Opaque to C; one thread at a time.
pub struct SalsaFsWriter {
    writer: Option<FileWriter>,
    _open: OpenHandle,
}

/// A file opened for reading. Opaque to C; any number of threads.
pub struct SalsaFsReader {
    reader: FileReader,
    _open: OpenHandle,
}

/// What the store holds of one kind of file.
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub struct SalsaFsKindStats {
    pub files: u64,
    pub bytes: u64,
    pub segments: u64,
    pub segments_trimmed: u64,
}

/// The store's statistics: per file kind (WAL, SST and blob, MANIFEST, other), the volume's
/// map memory, the segment size and count, and the journal's generation.
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub struct SalsaFsStats {
    pub wal: SalsaFsKindStats,
    pub sst: SalsaFsKindStats,
    pub manifest: SalsaFsKindStats,
    pub other: SalsaFsKindStats,
    pub segment_bytes: u64,
    pub segments_total: u64,
    pub journal_generation: u64,
}

impl From<salsa_files::Error> for Failure {
    fn from(e: salsa_files::Error) -> Failure {
        use salsa_files::Error as E;
        let errno = match &e {
            E::Volume(inner) => return Failure::from_engine(inner),
            E::NotFound(_) => libc::ENOENT,
            E::InvalidName(_) | E::NotAppendOnly(_) => libc::EINVAL,
            E::NotEmpty(_) => libc::ENOTEMPTY,
            E::Corrupt(_) | E::Foreign(_) => libc::EUCLEAN,
            E::NoSpace(_) => libc::ENOSPC,
            E::Failed(_) => libc::EIO,
        };
        Failure::new(errno, e.to_string())
    }
}

/// Opens the file store on the append-only volume `volume` of `pool` (making a new one on a
/// blank volume). `-EINVAL` for a volume that is not append-only, `-EUCLEAN` for one that holds
/// other data or a damaged table.
///
/// # Safety
/// `pool` is a live pool handle; `volume` a NUL-terminated string; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn salsa_fs_open(pool: *const SalsaPool, volume: *const c_char, out: *mut *mut SalsaFs) -> c_int {
    guarded(|| {
        // SAFETY: the contract above, for each argument.
        let (p, name) = unsafe { (handle(pool, "pool")?, text(volume, "volume name")?) };
        let vol = p.pool.volume(name)?;
        let store = FileStore::open(Arc::new(vol))?;
        let fs = SalsaFs {
            store,
            open: OpenHandle::new(&p.open_handles),
        };
        // SAFETY: the contract above.
        unsafe { give(out, fs) }
    })
}

/// Frees a file store handle (files stay). NULL is ignored.
///
/// # Safety
/// `fs` is NULL or a live handle no other thread uses; it is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn salsa_fs_free(fs: *mut SalsaFs) {
    // SAFETY: the contract above.
    unsafe { free(fs) }
}

/// Runs `f` on the store's handle and a name argument.
///
/// SAFETY (of callers): `fs` is null or a live handle; `name` null or a C string.
unsafe fn with_name(fs: *const SalsaFs, name: *const c_char, f: impl FnOnce(&SalsaFs, &str) -> Result<c_int, Failure>) -> c_int {
    guarded(|| {
        // SAFETY: forwarded from the caller's contract.
        let (fs, name) = unsafe { (handle(fs, "file store")?, text(name, "file name")?) };
        f(fs, name)
    })
}

/// Creates file `name` (replacing one of that name) and opens a writer on it.
///
/// # Safety
/// `fs` is a live handle; `name` a NUL-terminated string; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn salsa_fs_create(fs: *const SalsaFs, name: *const c_char, out: *mut *mut SalsaFsWriter) -> c_int {
    // SAFETY: the contract above.
    unsafe {
        with_name(fs, name, |fs, name| {
            let writer = fs.store.create(name)?;
            give(
                out,
                SalsaFsWriter {
                    writer: Some(writer),
                    _open: fs.open.another(),
                },
            )
        })
    }
}

/// Runs `f` on a writer that is still open.
///
/// SAFETY (of callers): `w` is null or a live writer handle used by this thread only.
unsafe fn with_writer(w: *mut SalsaFsWriter, f: impl FnOnce(&mut FileWriter) -> Result<c_int, Failure>) -> c_int {
    guarded(|| {
        // SAFETY: forwarded from the caller's contract.
        let w = unsafe { w.as_mut() }.ok_or_else(|| Failure::invalid("writer handle is NULL"))?;
        let writer = w
            .writer
            .as_mut()
            .ok_or_else(|| Failure::new(libc::EBADF, "the writer was closed"))?;
        f(writer)
    })
}

/// Appends `len` bytes to the file (gathered in memory; durable after a sync).
///
/// # Safety
/// `w` is a live writer handle; `buf` holds `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn salsa_fs_append(w: *mut SalsaFsWriter, buf: *const c_void, len: usize) -> c_int {
    // SAFETY: the contract above.
    unsafe {
        with_writer(w, |writer| {
            writer.append(bytes(buf, len)?)?;
            Ok(0)
        })
    }
}

/// Writes the whole pages gathered so far to the volume (not yet durable).
///
/// # Safety
/// `w` is a live writer handle.
#[no_mangle]
pub unsafe extern "C" fn salsa_fs_flush(w: *mut SalsaFsWriter) -> c_int {
    // SAFETY: the contract above.
    unsafe { with_writer(w, |writer| Ok(writer.flush().map(|_| 0)?)) }
}

/// Makes everything appended so far durable.
///
/// # Safety
/// `w` is a live writer handle.
#[no_mangle]
pub unsafe extern "C" fn salsa_fs_sync(w: *mut SalsaFsWriter) -> c_int {
    // SAFETY: the contract above.
    unsafe { with_writer(w, |writer| Ok(writer.sync().map(|_| 0)?)) }
}

/// Bytes appended to the file so far; 0 for a NULL or closed writer.
///
/// # Safety
/// `w` is NULL or a live writer handle.
#[no_mangle]
pub unsafe extern "C" fn salsa_fs_writer_size(w: *const SalsaFsWriter) -> u64 {
    // SAFETY: the contract above.
    unsafe { w.as_ref() }.and_then(|w| w.writer.as_ref()).map_or(0, |w| w.size())
}

/// Syncs and closes the file; the handle stays valid (for `salsa_fs_writer_free`) but takes no
/// more appends.
///
/// # Safety
/// `w` is a live writer handle.
#[no_mangle]
pub unsafe extern "C" fn salsa_fs_close(w: *mut SalsaFsWriter) -> c_int {
    guarded(|| {
        // SAFETY: the contract above.
        let w = unsafe { w.as_mut() }.ok_or_else(|| Failure::invalid("writer handle is NULL"))?;
        match w.writer.take() {
            Some(writer) => Ok(writer.close().map(|_| 0)?),
            None => Ok(0),
        }
    })
}

/// Frees a writer handle (what was not synced may be lost). NULL is ignored.
///
/// # Safety
/// `w` is NULL or a live writer handle no other thread uses; it is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn salsa_fs_writer_free(w: *mut SalsaFsWriter) {
    // SAFETY: the contract above.
    unsafe { free(w) }
}

/// Opens file `name` for reading (`-ENOENT` when there is none).
///
/// # Safety
/// `fs` is a live handle; `name` a NUL-terminated string; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn salsa_fs_open_reader(fs: *const SalsaFs, name: *const c_char, out: *mut *mut SalsaFsReader) -> c_int {
    // SAFETY: the contract above.
    unsafe {
        with_name(fs, name, |fs, name| {
            let reader = fs.store.open_reader(name)?;
            give(
                out,
                SalsaFsReader {
                    reader,
                    _open: fs.open.another(),
                },
            )
        })
    }
}

/// Reads up to `len` bytes at file offset `offset`; returns the bytes read (0 at the end).
///
/// # Safety
/// `r` is a live reader handle; `buf` has room for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn salsa_fs_read(r: *const SalsaFsReader, offset: u64, buf: *mut c_void, len: usize) -> i64 {
    let mut done = 0usize;
    let rc = guarded(|| {
        // SAFETY: the contract above.
        let (r, out) = unsafe { (handle(r, "reader")?, bytes_mut(buf, len)?) };
        done = r.reader.read_at(offset, out)?;
        Ok(0)
    });
    if rc < 0 {
        rc as i64
    } else {
        done as i64
    }
}

/// The file's size as the reader sees it; 0 for a NULL handle.
///
/// # Safety
/// `r` is NULL or a live reader handle.
#[no_mangle]
pub unsafe extern "C" fn salsa_fs_reader_size(r: *const SalsaFsReader) -> u64 {
    // SAFETY: the contract above.
    unsafe { r.as_ref() }.map_or(0, |r| r.reader.size())
}

/// Frees a reader handle. NULL is ignored.
///
/// # Safety
/// `r` is NULL or a live reader handle no other thread uses; it is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn salsa_fs_reader_free(r: *mut SalsaFsReader) {
    // SAFETY: the contract above.
    unsafe { free(r) }
}

/// Deletes file `name`, durably; its segments are trimmed whole.
///
/// # Safety
/// `fs` is a live handle; `name` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn salsa_fs_delete(fs: *const SalsaFs, name: *const c_char) -> c_int {
    // SAFETY: the contract above.
    unsafe { with_name(fs, name, |fs, name| Ok(fs.store.delete(name).map(|_| 0)?)) }
}

/// Renames `from` to `to`, replacing a file named `to`, durably.
///
/// # Safety
/// `fs` is a live handle; `from` and `to` NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn salsa_fs_rename(fs: *const SalsaFs, from: *const c_char, to: *const c_char) -> c_int {
    // SAFETY: the contract above.
    unsafe {
        with_name(fs, from, |fs, from| {
            let to = text(to, "new name")?;
            Ok(fs.store.rename(from, to).map(|_| 0)?)
        })
    }
}

/// Creates directory `name` (0 when it exists), durably.
///
/// # Safety
/// `fs` is a live handle; `name` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn salsa_fs_create_dir(fs: *const SalsaFs, name: *const c_char) -> c_int {
    // SAFETY: the contract above.
    unsafe { with_name(fs, name, |fs, name| Ok(fs.store.create_dir(name).map(|_| 0)?)) }
}

/// Deletes the empty directory `name` (`-ENOTEMPTY` when it holds anything).
///
/// # Safety
/// `fs` is a live handle; `name` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn salsa_fs_delete_dir(fs: *const SalsaFs, name: *const c_char) -> c_int {
    // SAFETY: the contract above.
    unsafe { with_name(fs, name, |fs, name| Ok(fs.store.delete_dir(name).map(|_| 0)?)) }
}

/// Makes every create and rename so far durable (a directory's fsync).
///
/// # Safety
/// `fs` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn salsa_fs_sync_metadata(fs: *const SalsaFs) -> c_int {
    guarded(|| {
        // SAFETY: the contract above.
        let fs = unsafe { handle(fs, "file store") }?;
        Ok(fs.store.sync_metadata().map(|_| 0)?)
    })
}

/// 1 when `name` is a file, 2 when it is a directory, 0 when it does not exist.
///
/// # Safety
/// `fs` is a live handle; `name` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn salsa_fs_exists(fs: *const SalsaFs, name: *const c_char) -> c_int {
    // SAFETY: the contract above.
    unsafe {
        with_name(fs, name, |fs, name| {
            Ok(if fs.store.is_dir(name) {
                2
            } else if fs.store.exists(name) {
                1
            } else {
                0
            })
        })
    }
}

/// Stores file `name`'s size and modification time (seconds since 1970) in `*size` and
/// `*mtime_secs` (either may be NULL).
///
/// # Safety
/// `fs` is a live handle; `name` a NUL-terminated string; `size` and `mtime_secs` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn salsa_fs_stat(fs: *const SalsaFs, name: *const c_char, size: *mut u64, mtime_secs: *mut u64) -> c_int {
    // SAFETY: the contract above.
    unsafe {
        with_name(fs, name, |fs, name| {
            let (s, m) = fs.store.stat(name)?;
            if let Some(out) = size.as_mut() {
                *out = s;
            }
            if let Some(out) = mtime_secs.as_mut() {
                *out = m;
            }
            Ok(0)
        })
    }
}

/// Calls `each(name, context)` for every name directly under directory `dir`; returns how
/// many.
///
/// # Safety
/// `fs` is a live handle; `dir` a NUL-terminated string; `each` a function that does not call
/// back into this store's handle and does not keep `name` past its return.
#[no_mangle]
pub unsafe extern "C" fn salsa_fs_children(
    fs: *const SalsaFs,
    dir: *const c_char,
    each: Option<unsafe extern "C" fn(name: *const c_char, context: *mut c_void)>,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the contract above.
    unsafe {
        with_name(fs, dir, |fs, dir| {
            let each = each.ok_or_else(|| Failure::invalid("callback is NULL"))?;
            let names = fs.store.children(dir);
            for name in &names {
                let c = CString::new(name.as_str()).map_err(|_| Failure::invalid("a name holds NUL"))?;
                // SAFETY: a live C string for the call; the callback's contract above.
                each(c.as_ptr(), context);
            }
            Ok(names.len().min(c_int::MAX as usize) as c_int)
        })
    }
}

/// Fills `*out` with the store's statistics.
///
/// # Safety
/// `fs` is a live handle; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn salsa_fs_stats(fs: *const SalsaFs, out: *mut SalsaFsStats) -> c_int {
    guarded(|| {
        // SAFETY: the contract above.
        let fs = unsafe { handle(fs, "file store") }?;
        // SAFETY: the contract above.
        let out = unsafe { out.as_mut() }.ok_or_else(|| Failure::invalid("stats pointer is NULL"))?;
        let s = fs.store.stats();
        let mut stats = SalsaFsStats {
            segment_bytes: s.segment_bytes,
            segments_total: s.segments_total,
            journal_generation: s.journal_generation,
            ..SalsaFsStats::default()
        };
        for (kind, k) in s.kinds {
            let slot = match kind {
                FileKind::Wal => &mut stats.wal,
                FileKind::Sst => &mut stats.sst,
                FileKind::Manifest => &mut stats.manifest,
                FileKind::Other => &mut stats.other,
            };
            *slot = SalsaFsKindStats {
                files: k.files,
                bytes: k.bytes,
                segments: k.segments,
                segments_trimmed: k.segments_trimmed,
            };
        }
        *out = stats;
        Ok(0)
    })
}
