//! The C API of SALSA: `libsalsa.so` and `salsa.h`, so that C and C++ storage engines can embed a
//! pool and call read, write, flush, trim, share (SHARE's remap) and the append-only (AMF) calls
//! directly, without a network hop.
//!
//! Owns: the opaque handles [`SalsaPool`] and [`SalsaVolume`], the mapping of engine errors to
//! negative errno values, and the calling thread's last error message.
//!
//! Rules every function keeps (they are the contract the header documents):
//! - Every function that can fail returns 0 or a positive count on success and a negative errno
//!   (`-EINVAL`, `-ENOSPC`, `-EIO`, `-EPERM`, ...) on failure; `salsa_last_error()` then names
//!   what failed, in words, until the thread's next call.
//! - No pointer a caller passes is trusted: a null handle, buffer or string is `-EINVAL`, never
//!   a crash; strings must be UTF-8. A panic inside the engine is caught and returned as `-EIO`,
//!   so it never unwinds into C.
//! - A pool outlives its handles: `salsa_pool_close` refuses (`-EBUSY`) while volume, file
//!   store, file writer or file reader handles of that pool are open, so no handle can reach a
//!   closed engine.
//! - Handles are thread-safe: any number of threads may do I/O through one volume handle.

use salsa_core::frontend::BlockVolume;
use salsa_core::spec::DeviceSpec;
use salsa_core::{ControllerKind, Device, Error, OpenOptions, Pool, PoolConfig, VolumeSpec};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

/// The most devices one pool may be given through this API.
pub const SALSA_MAX_DEVICES: usize = 64;

/// The largest single read or write (larger requests are split by the caller).
pub const SALSA_MAX_IO_BYTES: usize = 1 << 30;

/// A pool: open devices, the engine and its GC. Opaque to C.
pub struct SalsaPool {
    pool: Pool,
    /// Handles of this pool still open: volumes, file stores, file writers and readers (close
    /// waits for none: it refuses while any is).
    open_handles: Arc<AtomicUsize>,
}

/// A handle to one volume of a pool. Opaque to C. Every call on it goes through the
/// front-end-neutral volume interface; this crate keeps only the C ABI.
pub struct SalsaVolume {
    volume: Box<dyn BlockVolume>,
    _open: OpenHandle,
}

/// Counts one open handle against its pool for as long as it lives (volume, file store, file
/// writer or reader), so that `salsa_pool_close` refuses while any is open.
struct OpenHandle(Arc<AtomicUsize>);

impl OpenHandle {
    fn new(count: &Arc<AtomicUsize>) -> OpenHandle {
        count.fetch_add(1, SeqCst);
        OpenHandle(count.clone())
    }

    /// One more handle counted against the same pool (a file opened from a file store).
    fn another(&self) -> OpenHandle {
        OpenHandle::new(&self.0)
    }
}

impl Drop for OpenHandle {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

mod files;
pub use files::{SalsaFs, SalsaFsKindStats, SalsaFsReader, SalsaFsStats, SalsaFsWriter};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    // An interior NUL cannot be carried by a C string; it never appears in our messages, but a
    // device path could hold one.
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    // A call made while the thread's locals are being destroyed (a C++ static destructor at
    // exit closing its pool) keeps no message rather than panicking.
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = text);
}

/// What went wrong, as a negative errno and a message for `salsa_last_error`.
struct Failure {
    errno: c_int,
    message: String,
}

impl Failure {
    fn new(errno: c_int, message: impl Into<String>) -> Failure {
        Failure {
            errno,
            message: message.into(),
        }
    }
    fn invalid(message: impl Into<String>) -> Failure {
        Failure::new(libc::EINVAL, message)
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure::from_engine(&e)
    }
}

impl Failure {
    /// The errno and message of an engine error.
    fn from_engine(e: &Error) -> Failure {
        let errno = match e {
            Error::VolumeNotFound(_) => libc::ENOENT,
            Error::VolumeExists(_) => libc::EEXIST,
            Error::InvalidConfig(_) | Error::InvalidArgument(_) => libc::EINVAL,
            Error::NoSpace(_) => libc::ENOSPC,
            Error::AppendOnly(_) => libc::EPERM,
            Error::ReadOnly(_) | Error::Poisoned(_) => libc::EROFS,
            Error::ShuttingDown => libc::ESHUTDOWN,
            // Only inside a memory-only read, which the C API does not offer.
            Error::NotInMemory => libc::EAGAIN,
            Error::ChecksumMismatch { .. } => libc::EBADMSG,
            Error::NotAPool { .. }
            | Error::DamagedSuperblock { .. }
            | Error::ForeignDevice { .. }
            | Error::ReplacedMember { .. }
            | Error::NotAMember { .. }
            | Error::MissingMember { .. }
            | Error::NewerFormat { .. }
            | Error::Corrupt(_) => libc::EUCLEAN,
            Error::Io { .. } | Error::Exhausted(_) | Error::ReplacementFailed(_) => libc::EIO,
        };
        Failure::new(errno, e.to_string())
    }
}

/// Runs `body`, turning its failure or panic into a negative errno and the thread's last error.
fn guarded(body: impl FnOnce() -> Result<c_int, Failure>) -> c_int {
    set_last_error("");
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(n)) => n,
        Ok(Err(f)) => {
            set_last_error(&f.message);
            -f.errno
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            set_last_error(&format!("internal error in SALSA (a bug; please report it): {what}"));
            -libc::EIO
        }
    }
}

/// A C string argument as UTF-8.
///
/// SAFETY (of callers): `s` is null or points to a NUL-terminated string that lives for the
/// call, as the header requires.
unsafe fn text<'a>(s: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if s.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-null, NUL-terminated and alive for the call (the header's contract).
    unsafe { CStr::from_ptr(s) }
        .to_str()
        .map_err(|_| Failure::invalid(format!("{what} is not UTF-8")))
}

/// A handle argument.
///
/// SAFETY (of callers): `p` is null or a handle this library returned and the caller has not
/// freed.
unsafe fn handle<'a, T>(p: *const T, what: &str) -> Result<&'a T, Failure> {
    // SAFETY: a non-null handle came from Box::into_raw in this library and is still live.
    unsafe { p.as_ref() }.ok_or_else(|| Failure::invalid(format!("{what} handle is NULL")))
}

/// Opens the devices named by `specs` (the same syntax as the command line: `PATH`,
/// `PATH:SIZE`, `ssd:file=PATH,size=SIZE`, ...).
///
/// SAFETY (of callers): `specs` is null or points to `n` C strings.
unsafe fn open_devices(specs: *const *const c_char, n: usize, create: bool) -> Result<Vec<Arc<dyn Device>>, Failure> {
    if specs.is_null() || n == 0 {
        return Err(Failure::invalid("no devices given"));
    }
    if n > SALSA_MAX_DEVICES {
        return Err(Failure::invalid(format!(
            "{n} devices given; a pool has at most {SALSA_MAX_DEVICES}"
        )));
    }
    // SAFETY: the caller passes an array of `n` pointers (checked non-null above).
    let specs = unsafe { std::slice::from_raw_parts(specs, n) };
    let mut devices = Vec::with_capacity(n);
    for (i, &s) in specs.iter().enumerate() {
        // SAFETY: each entry is null or a C string (the contract above).
        let spec: DeviceSpec = unsafe { text(s, &format!("device {i}")) }?.parse().map_err(Failure::invalid)?;
        let dev = if create { spec.open(false) } else { spec.open_existing(false) };
        devices.push(dev.map_err(|e| Failure::new(libc::ENOENT, e))?);
    }
    Ok(devices)
}

/// Stores a new handle in `*out`.
///
/// SAFETY (of callers): `out` is null or writable.
unsafe fn give<T>(out: *mut *mut T, value: T) -> Result<c_int, Failure> {
    // SAFETY: `out` is writable when non-null (the header's contract).
    let slot = unsafe { out.as_mut() }.ok_or_else(|| Failure::invalid("output handle pointer is NULL"))?;
    *slot = Box::into_raw(Box::new(value));
    Ok(0)
}

/// Formats a new pool on `n_devices` devices (each a device spec string, as on the command line;
/// a file spec with a size creates the file) and opens it. `segment_bytes` 0 picks the default.
/// Refuses devices that already hold a pool.
///
/// # Safety
/// `devices` points to `n_devices` NUL-terminated strings; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn salsa_pool_create(
    devices: *const *const c_char,
    n_devices: usize,
    segment_bytes: u64,
    out: *mut *mut SalsaPool,
) -> c_int {
    guarded(|| {
        // SAFETY: forwarded from this function's contract.
        let devs = unsafe { open_devices(devices, n_devices, true) }?;
        if let Some(d) = salsa_core::pool::first_non_blank(&devs)? {
            return Err(Failure::new(
                libc::EEXIST,
                format!(
                    "device {} already holds data or a pool; salsa_pool_create formats only blank devices",
                    d.name()
                ),
            ));
        }
        let cfg = PoolConfig {
            segment_bytes: (segment_bytes != 0).then_some(segment_bytes),
            ..PoolConfig::default()
        };
        let pool = Pool::create(devs, &cfg, &OpenOptions::default())?;
        // SAFETY: forwarded from this function's contract.
        unsafe {
            give(
                out,
                SalsaPool {
                    pool,
                    open_handles: Arc::default(),
                },
            )
        }
    })
}

/// Opens an existing pool on its devices (all of them, in any order).
///
/// # Safety
/// `devices` points to `n_devices` NUL-terminated strings; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn salsa_pool_open(devices: *const *const c_char, n_devices: usize, out: *mut *mut SalsaPool) -> c_int {
    guarded(|| {
        // SAFETY: forwarded from this function's contract.
        let devs = unsafe { open_devices(devices, n_devices, false) }?;
        let pool = Pool::open(devs, &OpenOptions::default())?;
        // SAFETY: forwarded from this function's contract.
        unsafe {
            give(
                out,
                SalsaPool {
                    pool,
                    open_handles: Arc::default(),
                },
            )
        }
    })
}

/// Closes the pool cleanly (a checkpoint: the next open needs no scan) and frees the handle.
/// Refused with `-EBUSY`, leaving the pool open, while any of its handles (volume, file store,
/// file writer, file reader) is open. On any other error the handle is freed all the same
/// (what was flushed stays durable).
///
/// # Safety
/// `pool` is a handle from `salsa_pool_create`/`salsa_pool_open`, not used by another thread
/// during the call and not used after it returns anything but `-EBUSY`.
#[no_mangle]
pub unsafe extern "C" fn salsa_pool_close(pool: *mut SalsaPool) -> c_int {
    guarded(|| {
        if pool.is_null() {
            return Err(Failure::invalid("pool handle is NULL"));
        }
        // SAFETY: a live handle (the contract).
        let open = unsafe { &*pool }.open_handles.load(SeqCst);
        if open > 0 {
            return Err(Failure::new(
                libc::EBUSY,
                format!("{open} handle(s) of this pool are open (volumes, file stores, their writers and readers); free them first"),
            ));
        }
        // SAFETY: the handle came from Box::into_raw and the caller gives it up here.
        let owned = unsafe { Box::from_raw(pool) };
        owned.pool.close()?;
        Ok(0)
    })
}

/// Writes every open record and syncs the devices: every write acknowledged before the call is
/// durable when it returns.
///
/// # Safety
/// `pool` is a live pool handle.
#[no_mangle]
pub unsafe extern "C" fn salsa_pool_flush(pool: *const SalsaPool) -> c_int {
    guarded(|| {
        // SAFETY: a live handle (the contract).
        unsafe { handle(pool, "pool") }?.pool.flush()?;
        Ok(0)
    })
}

/// Creates a volume of `size_bytes` and opens a handle to it. `controller` is `"lsa"` (the page
/// map, the default when NULL), `"extent"`, `"dual"`, `"hybrid"` or `"amf"` (append-only
/// segments of `segment_bytes`, 0 for the default); `page_bytes` 0 means 4096.
///
/// # Safety
/// `pool` is a live pool handle; `name` and `controller` (or NULL) are NUL-terminated strings;
/// `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn salsa_volume_create(
    pool: *const SalsaPool,
    name: *const c_char,
    size_bytes: u64,
    controller: *const c_char,
    page_bytes: u32,
    segment_bytes: u64,
    out: *mut *mut SalsaVolume,
) -> c_int {
    guarded(|| {
        // SAFETY: the contract above, for each argument.
        let (p, name) = unsafe { (handle(pool, "pool")?, text(name, "volume name")?) };
        let controller = if controller.is_null() {
            "lsa"
        } else {
            // SAFETY: the contract above.
            unsafe { text(controller, "controller") }?
        };
        let kind = ControllerKind::from_name(controller)
            .ok_or_else(|| Failure::invalid(format!("unknown controller {controller:?}; use lsa, extent, dual, hybrid or amf")))?;
        let page_bytes = if page_bytes == 0 { 4096 } else { page_bytes };
        let mut spec = VolumeSpec::lsa(page_bytes);
        spec.controller = kind;
        if segment_bytes != 0 {
            if kind != ControllerKind::Amf {
                return Err(Failure::invalid("segment_bytes is for amf volumes only; pass 0"));
            }
            spec.segment_bytes = Some(segment_bytes);
        }
        let volume = p.pool.create_volume_spec(name, size_bytes, &spec)?;
        let v = SalsaVolume {
            volume: Box::new(volume),
            _open: OpenHandle::new(&p.open_handles),
        };
        // SAFETY: the contract above.
        unsafe { give(out, v) }
    })
}

/// Opens a handle to the volume named `name` (`-ENOENT` when there is none).
///
/// # Safety
/// `pool` is a live pool handle; `name` is a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn salsa_volume_open(pool: *const SalsaPool, name: *const c_char, out: *mut *mut SalsaVolume) -> c_int {
    guarded(|| {
        // SAFETY: the contract above, for each argument.
        let (p, name) = unsafe { (handle(pool, "pool")?, text(name, "volume name")?) };
        let volume = p.pool.volume(name)?;
        let v = SalsaVolume {
            volume: Box::new(volume),
            _open: OpenHandle::new(&p.open_handles),
        };
        // SAFETY: the contract above.
        unsafe { give(out, v) }
    })
}

/// Frees a volume handle (the volume and its data stay). NULL is ignored.
///
/// # Safety
/// `volume` is NULL or a live volume handle that no other thread is using; it is not used
/// afterwards.
#[no_mangle]
pub unsafe extern "C" fn salsa_volume_free(volume: *mut SalsaVolume) {
    // SAFETY: the contract above.
    unsafe { free(volume) }
}

/// Drops the handle `p` (NULL is ignored): the twin of [`give`].
///
/// SAFETY (of callers): `p` is null or a handle from `give` that no other thread uses and the
/// caller gives up here.
unsafe fn free<T>(p: *mut T) {
    if !p.is_null() {
        // SAFETY: the handle came from Box::into_raw in `give`, and the caller gives it up.
        drop(unsafe { Box::from_raw(p) });
    }
}

/// The volume's size in bytes (0 for a NULL handle).
///
/// # Safety
/// `volume` is NULL or a live volume handle.
#[no_mangle]
pub unsafe extern "C" fn salsa_volume_size(volume: *const SalsaVolume) -> u64 {
    // SAFETY: the contract above.
    unsafe { volume.as_ref() }.map_or(0, |v| v.volume.size_bytes())
}

/// The smallest write that costs no read-modify-write (the page size; 0 for a NULL handle).
///
/// # Safety
/// `volume` is NULL or a live volume handle.
#[no_mangle]
pub unsafe extern "C" fn salsa_volume_page_bytes(volume: *const SalsaVolume) -> u32 {
    // SAFETY: the contract above.
    unsafe { volume.as_ref() }.map_or(0, |v| v.volume.preferred_block_bytes())
}

/// An append-only volume's segment size; 0 for any other volume (or a NULL handle).
///
/// # Safety
/// `volume` is NULL or a live volume handle.
#[no_mangle]
pub unsafe extern "C" fn salsa_volume_segment_bytes(volume: *const SalsaVolume) -> u64 {
    // SAFETY: the contract above.
    unsafe { volume.as_ref() }.and_then(|v| v.volume.segment_bytes()).unwrap_or(0)
}

/// Checks a buffer argument: `len` 0 needs no buffer, otherwise it must be non-null and at
/// most [`SALSA_MAX_IO_BYTES`]; `false` for an empty one.
fn check_buffer(null: bool, len: usize) -> Result<bool, Failure> {
    if len == 0 {
        return Ok(false);
    }
    if null {
        return Err(Failure::invalid("buffer is NULL"));
    }
    if len > SALSA_MAX_IO_BYTES {
        return Err(Failure::invalid(format!(
            "{len} bytes in one request; at most {SALSA_MAX_IO_BYTES}"
        )));
    }
    Ok(true)
}

/// A buffer argument as a slice.
///
/// SAFETY (of callers): `buf` is null or points to `len` bytes that live for the call.
unsafe fn bytes<'a>(buf: *const c_void, len: usize) -> Result<&'a [u8], Failure> {
    if !check_buffer(buf.is_null(), len)? {
        return Ok(&[]);
    }
    // SAFETY: non-null, `len` readable bytes (the contract).
    Ok(unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) })
}

/// A buffer argument to fill, as a slice.
///
/// SAFETY (of callers): `buf` is null or points to `len` writable bytes, not aliased during the
/// call.
unsafe fn bytes_mut<'a>(buf: *mut c_void, len: usize) -> Result<&'a mut [u8], Failure> {
    if !check_buffer(buf.is_null(), len)? {
        return Ok(&mut []);
    }
    // SAFETY: non-null, `len` writable bytes not aliased during the call (the contract).
    Ok(unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) })
}

/// Reads `len` bytes at `offset` into `buf`. Never-written and trimmed bytes read as zeros; a
/// checksum mismatch is `-EBADMSG`, never wrong data.
///
/// # Safety
/// `volume` is a live volume handle; `buf` has room for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn salsa_read(volume: *const SalsaVolume, offset: u64, buf: *mut c_void, len: usize) -> c_int {
    guarded(|| {
        // SAFETY: the contract above.
        let (v, out) = unsafe { (handle(volume, "volume")?, bytes_mut(buf, len)?) };
        if !out.is_empty() {
            v.volume.read(offset, out)?;
        }
        Ok(0)
    })
}

/// Writes `len` bytes from `buf` at `offset`; durable after the next flush.
///
/// # Safety
/// `volume` is a live volume handle; `buf` holds `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn salsa_write(volume: *const SalsaVolume, offset: u64, buf: *const c_void, len: usize) -> c_int {
    guarded(|| {
        // SAFETY: the contract above.
        let (v, data) = unsafe { (handle(volume, "volume")?, bytes(buf, len)?) };
        v.volume.write(offset, data)?;
        Ok(0)
    })
}

/// Writes like `salsa_write` and returns only once the write is durable (FUA).
///
/// # Safety
/// `volume` is a live volume handle; `buf` holds `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn salsa_write_fua(volume: *const SalsaVolume, offset: u64, buf: *const c_void, len: usize) -> c_int {
    guarded(|| {
        // SAFETY: the contract above.
        let (v, data) = unsafe { (handle(volume, "volume")?, bytes(buf, len)?) };
        v.volume.write_fua(offset, data)?;
        Ok(0)
    })
}

/// Makes every write acknowledged before the call durable (pool-wide).
///
/// # Safety
/// `volume` is a live volume handle.
#[no_mangle]
pub unsafe extern "C" fn salsa_flush(volume: *const SalsaVolume) -> c_int {
    guarded(|| {
        // SAFETY: the contract above.
        unsafe { handle(volume, "volume") }?.volume.flush()?;
        Ok(0)
    })
}

/// Discards the whole pages inside the range (they read as zeros). On an append-only volume
/// only whole segments may be trimmed (`-EINVAL` otherwise).
///
/// # Safety
/// `volume` is a live volume handle.
#[no_mangle]
pub unsafe extern "C" fn salsa_trim(volume: *const SalsaVolume, offset: u64, len: u64) -> c_int {
    guarded(|| {
        // SAFETY: the contract above.
        unsafe { handle(volume, "volume") }?.volume.trim(offset, len)?;
        Ok(0)
    })
}

/// Makes the range read as zeros (on an append-only volume: appends zeros, under its rules).
///
/// # Safety
/// `volume` is a live volume handle.
#[no_mangle]
pub unsafe extern "C" fn salsa_write_zeroes(volume: *const SalsaVolume, offset: u64, len: u64) -> c_int {
    guarded(|| {
        // SAFETY: the contract above.
        unsafe { handle(volume, "volume") }?.volume.write_zeroes(offset, len)?;
        Ok(0)
    })
}

/// One range of a share batch, in bytes: afterwards `[dst_offset, dst_offset + len_bytes)` reads
/// what `[src_offset, src_offset + len_bytes)` read.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SalsaShareRange {
    pub dst_offset: u64,
    pub src_offset: u64,
    pub len_bytes: u64,
}

/// Remaps `n_ranges` ranges of the volume without copying data (SHARE): afterwards each
/// destination reads what its source read before the call. The batch is atomic across crashes
/// (all of it or none of it) and durable at the next flush, like a write. Ranges are whole
/// pages with destinations that do not overlap; at most 256 ranges, and entries that fit one
/// record (a range whose source was written sequentially is one). A bad batch is `-EINVAL`
/// with nothing changed; volumes that are not page-mapped (`lsa`, `extent`) refuse it.
///
/// # Safety
/// `volume` is a live volume handle; `ranges` points to `n_ranges` ranges.
#[no_mangle]
pub unsafe extern "C" fn salsa_share(volume: *const SalsaVolume, ranges: *const SalsaShareRange, n_ranges: usize) -> c_int {
    guarded(|| {
        // SAFETY: the contract above.
        let v = unsafe { handle(volume, "volume") }?;
        if ranges.is_null() || n_ranges == 0 {
            return Err(Failure::invalid("no ranges given"));
        }
        if n_ranges > salsa_core::pool::MAX_SHARE_RANGES {
            return Err(Failure::invalid(format!(
                "{n_ranges} ranges in one batch; at most {}",
                salsa_core::pool::MAX_SHARE_RANGES
            )));
        }
        // SAFETY: non-null, `n_ranges` readable ranges (the contract).
        let given = unsafe { std::slice::from_raw_parts(ranges, n_ranges) };
        let batch: Vec<salsa_core::ShareRange> = given
            .iter()
            .map(|r| salsa_core::ShareRange {
                dst_offset: r.dst_offset,
                src_offset: r.src_offset,
                len_bytes: r.len_bytes,
            })
            .collect();
        v.volume.share(&batch)?;
        Ok(0)
    })
}

/// An append-only volume: stores in `*write_point` how many bytes of `segment` are written
/// (the offset inside the segment the next append goes to). `-EINVAL` on other volumes.
///
/// # Safety
/// `volume` is a live volume handle; `write_point` is writable.
#[no_mangle]
pub unsafe extern "C" fn salsa_amf_write_point(volume: *const SalsaVolume, segment: u64, write_point: *mut u64) -> c_int {
    guarded(|| {
        // SAFETY: the contract above.
        let v = unsafe { handle(volume, "volume") }?;
        // SAFETY: the contract above.
        let out = unsafe { write_point.as_mut() }.ok_or_else(|| Failure::invalid("write_point pointer is NULL"))?;
        *out = v.volume.write_point(segment)?;
        Ok(0)
    })
}

/// An append-only volume: writes `len` bytes (whole pages) at `segment`'s write point and
/// stores the volume offset they went to in `*offset` (may be NULL). Appenders of one segment
/// are serialised; an append that does not fit in the segment is `-EPERM` and changes nothing.
///
/// # Safety
/// `volume` is a live volume handle; `buf` holds `len` bytes; `offset` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn salsa_amf_append(
    volume: *const SalsaVolume,
    segment: u64,
    buf: *const c_void,
    len: usize,
    offset: *mut u64,
) -> c_int {
    guarded(|| {
        // SAFETY: the contract above.
        let (v, data) = unsafe { (handle(volume, "volume")?, bytes(buf, len)?) };
        let at = v.volume.append(segment, data)?;
        // SAFETY: the contract above.
        if let Some(out) = unsafe { offset.as_mut() } {
            *out = at;
        }
        Ok(0)
    })
}

/// Calls `each(name, value, context)` for each of the pool's counters: its own
/// (`user_bytes_written`, `user_bytes_read`, `device_bytes_written`, `gc_bytes_relocated`,
/// `flushes`, `syncs`), each volume's (`volume.NAME.mapped_bytes`, `.map_memory_bytes`,
/// `.gc_bytes_relocated`) and each device's (`device.NAME.COUNTER`: a device model's flash
/// programs, erasures, modelled time, ...). Returns how many.
///
/// # Safety
/// `pool` is a live pool handle; `each` does not call back into the pool and does not keep
/// `name` past its return.
#[no_mangle]
pub unsafe extern "C" fn salsa_pool_counters(
    pool: *const SalsaPool,
    each: Option<unsafe extern "C" fn(name: *const c_char, value: u64, context: *mut c_void)>,
    context: *mut c_void,
) -> c_int {
    guarded(|| {
        // SAFETY: the contract above.
        let p = unsafe { handle(pool, "pool") }?;
        let each = each.ok_or_else(|| Failure::invalid("callback is NULL"))?;
        let s = p.pool.stats();
        let mut counters: Vec<(String, u64)> = vec![
            ("user_bytes_written".into(), s.user_bytes_written),
            ("user_bytes_read".into(), s.user_bytes_read),
            ("device_bytes_written".into(), s.device_bytes_written),
            ("gc_bytes_relocated".into(), s.gc_bytes_relocated),
            ("flushes".into(), s.flushes),
            ("syncs".into(), s.syncs),
        ];
        for v in &s.volumes {
            counters.push((format!("volume.{}.mapped_bytes", v.name), v.mapped_bytes));
            counters.push((format!("volume.{}.map_memory_bytes", v.name), v.map_memory_bytes));
            counters.push((format!("volume.{}.gc_bytes_relocated", v.name), v.gc_bytes_relocated));
        }
        for (device, counter, value) in &s.device_counters {
            counters.push((format!("device.{device}.{counter}"), *value));
        }
        for (name, value) in &counters {
            let c = CString::new(name.replace('\0', "")).unwrap_or_default();
            // SAFETY: a live C string for the call; the callback's contract above.
            unsafe { each(c.as_ptr(), *value, context) };
        }
        Ok(counters.len().min(c_int::MAX as usize) as c_int)
    })
}

/// The message of the calling thread's last failed call ("" after a call that succeeded).
/// Valid until the thread's next call into this library; never NULL.
#[no_mangle]
pub extern "C" fn salsa_last_error() -> *const c_char {
    LAST_ERROR.try_with(|e| e.borrow().as_ptr()).unwrap_or(c"".as_ptr())
}
