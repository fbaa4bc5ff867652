//! Regular files and block devices, accessed with positioned reads and writes (`pread`/`pwrite`)
//! from many threads at once, with `O_DIRECT` where the file system supports it.
//!
//! The file is locked with `flock(LOCK_EX)` for as long as it is open, so a second process can
//! not serve the same pool.
//!
//! A zoned block device (host-managed SMR, ZNS) is recognised at open and exposes its zones
//! through [`KernelZones`]; it must be opened with `O_DIRECT`, so that writes reach the drive
//! in the order the pool issues them.

use super::kernel_zones::KernelZones;
use super::zone::Zoned;
use super::{check_range, Device, StorageType};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// A file or block device.
pub struct FileDevice {
    name: String,
    file: File,
    size_bytes: u64,
    direct: bool,
    zones: Option<KernelZones>,
    storage_type: StorageType,
    is_block_device: bool,
    /// Cleared when the file system or the drive refuses discards, so that they are not tried
    /// again for every freed segment.
    discard_supported: std::sync::atomic::AtomicBool,
}

impl AsRawFd for FileDevice {
    /// The open file, for a caller that does its own I/O on it (the in-place RAID-5 baseline
    /// of `salsa bench-raid` submits its pairs of I/O through io_uring).
    fn as_raw_fd(&self) -> std::os::unix::io::RawFd {
        self.file.as_raw_fd()
    }
}

/// How to open a file device.
#[derive(Debug, Clone, Copy)]
pub struct FileOpenOptions {
    /// Create a regular file of this size when the path does not exist.
    pub create_size_bytes: Option<u64>,
    /// Bypass the page cache (`O_DIRECT`); falls back to buffered I/O where unsupported.
    pub direct: bool,
    /// Open read-only.
    pub read_only: bool,
}

impl Default for FileOpenOptions {
    fn default() -> Self {
        FileOpenOptions {
            create_size_bytes: None,
            direct: true,
            read_only: false,
        }
    }
}

impl FileDevice {
    /// Opens (and if asked, creates) a device file and takes its exclusive lock.
    pub fn open(path: &Path, options: FileOpenOptions) -> io::Result<FileDevice> {
        let name = path.display().to_string();
        let exists = path.exists();
        if !exists {
            let Some(size) = options.create_size_bytes else {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{name} does not exist; give a size (PATH:SIZE) to create it"),
                ));
            };
            let file = OpenOptions::new().write(true).create_new(true).open(path)?;
            file.set_len(size)?;
            file.sync_all()?;
        }
        let open = |direct: bool| {
            let mut oo = OpenOptions::new();
            oo.read(true).write(!options.read_only);
            if direct {
                oo.custom_flags(libc::O_DIRECT);
            }
            oo.open(path)
        };
        let (file, direct) = if options.direct {
            match open(true) {
                Ok(f) => (f, true),
                // tmpfs and some others refuse O_DIRECT; buffered I/O with fdatasync is still correct.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (open(false)?, false),
                Err(e) => return Err(e),
            }
        } else {
            (open(false)?, false)
        };
        lock_exclusive(&file, &name)?;
        let meta = file.metadata()?;
        let (mut size_bytes, mut zones, mut storage_type) = (meta.len(), None, StorageType::Flash);
        let is_block_device = meta.file_type().is_block_device();
        if is_block_device {
            use std::os::unix::fs::MetadataExt;
            size_bytes = block_device_size(&file)?;
            zones = KernelZones::probe(&file, &name, size_bytes)?;
            if let Some(z) = &zones {
                if !direct {
                    return Err(io::Error::new(
                        io::ErrorKind::Unsupported,
                        format!("{name} is a zoned block device and refuses O_DIRECT; SALSA writes zones only with direct I/O"),
                    ));
                }
                // A smaller last zone is left unused.
                size_bytes = z.zone_count() as u64 * z.zone_bytes();
                storage_type = if rotational(meta.rdev()) {
                    StorageType::SmrSequential
                } else {
                    StorageType::Flash
                };
            }
        }
        let zones_present = zones.is_some();
        Ok(FileDevice {
            name,
            file,
            size_bytes,
            direct,
            zones,
            storage_type,
            is_block_device,
            // A zone is discarded by its reset, when the pool reuses it.
            discard_supported: std::sync::atomic::AtomicBool::new(!zones_present),
        })
    }

    /// Whether the page cache is bypassed.
    pub fn is_direct(&self) -> bool {
        self.direct
    }
}

/// How long a held lock is retried before the file is called busy. A process that forks (to
/// run any program) shares the lock of a file it had open with the child until the child
/// execs; a pool closed and reopened in that window would otherwise be refused.
const LOCK_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

fn lock_exclusive(file: &File, name: &str) -> io::Result<()> {
    let deadline = std::time::Instant::now() + LOCK_RETRY;
    loop {
        // SAFETY: flock only reads the descriptor number, which `file` keeps open for the call.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(err);
        }
        if std::time::Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("{name} is in use by another SALSA process (the pool is locked while open)"),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Whether the block device `rdev` spins, from sysfs (a partition asks its disk); a disk
/// unless sysfs says otherwise.
fn rotational(rdev: u64) -> bool {
    let (major, minor) = (libc::major(rdev as libc::dev_t), libc::minor(rdev as libc::dev_t));
    let base = format!("/sys/dev/block/{major}:{minor}");
    [format!("{base}/queue/rotational"), format!("{base}/../queue/rotational")]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim() != "0")
        .unwrap_or(true)
}

/// Most pieces one `pwritev` takes (Linux's `IOV_MAX`).
const IOV_MAX: usize = 1024;

impl FileDevice {
    /// Through the page cache, starts the writeback of what was just written, so that the next
    /// sync finds little dirty data and returns quickly (durability still comes only from
    /// sync). Nothing to do with `O_DIRECT`.
    fn start_writeback(&self, offset: u64, len: usize) {
        if !self.direct {
            // SAFETY: sync_file_range only reads the descriptor, which `self.file` keeps open.
            unsafe { libc::sync_file_range(self.file.as_raw_fd(), offset as i64, len as i64, libc::SYNC_FILE_RANGE_WRITE) };
        }
    }
}

fn block_device_size(file: &File) -> io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let mut f = file;
    let size = f.seek(SeekFrom::End(0))?;
    f.seek(SeekFrom::Start(0))?;
    Ok(size)
}

impl Device for FileDevice {
    fn name(&self) -> &str {
        &self.name
    }
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    fn storage_type(&self) -> StorageType {
        self.storage_type
    }
    fn zones(&self) -> Option<&dyn Zoned> {
        self.zones.as_ref().map(|z| z as &dyn Zoned)
    }
    fn alignment_bytes(&self) -> usize {
        if self.direct {
            4096
        } else {
            512
        }
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self.size_bytes, offset, buf.len())?;
        self.file.read_exact_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(self.size_bytes, offset, buf.len())?;
        self.file.write_all_at(buf, offset)?;
        self.start_writeback(offset, buf.len());
        Ok(())
    }
    fn read_vectored_at(&self, bufs: &mut [io::IoSliceMut<'_>], offset: u64) -> io::Result<()> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        check_range(self.size_bytes, offset, total)?;
        let mut rest = bufs;
        let mut at = offset;
        while !rest.is_empty() {
            let count = rest.len().min(IOV_MAX);
            // SAFETY: IoSliceMut is ABI-compatible with iovec on Unix (a guarantee of std), and
            // the first `count` slices of `rest` are valid for writes for the whole call.
            let n = unsafe { libc::preadv(self.file.as_raw_fd(), rest.as_ptr().cast(), count as libc::c_int, at as libc::off_t) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "preadv read nothing"));
            }
            io::IoSliceMut::advance_slices(&mut rest, n as usize);
            at += n as u64;
        }
        Ok(())
    }
    fn write_vectored_at(&self, bufs: &[io::IoSlice<'_>], offset: u64) -> io::Result<()> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        check_range(self.size_bytes, offset, total)?;
        let mut pieces: Vec<io::IoSlice<'_>> = bufs.to_vec();
        let mut rest = &mut pieces[..];
        let mut at = offset;
        while !rest.is_empty() {
            let count = rest.len().min(IOV_MAX);
            // SAFETY: IoSlice is ABI-compatible with iovec on Unix (a guarantee of std), and the
            // first `count` slices of `rest` are valid for reads for the whole call.
            let n = unsafe { libc::pwritev(self.file.as_raw_fd(), rest.as_ptr().cast(), count as libc::c_int, at as libc::off_t) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "pwritev wrote nothing"));
            }
            io::IoSlice::advance_slices(&mut rest, n as usize);
            at += n as u64;
        }
        self.start_writeback(offset, total);
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    /// `BLKDISCARD` on a block device, a punched hole (which also gives the space back to the
    /// file system) in a regular file; nothing where neither is supported.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        use std::sync::atomic::Ordering::Relaxed;
        check_range(self.size_bytes, offset, usize::try_from(len).map_err(io::Error::other)?)?;
        if len == 0 || !self.discard_supported.load(Relaxed) {
            return Ok(());
        }
        let rc = if self.is_block_device {
            let range = [offset, len];
            // SAFETY: BLKDISCARD reads two u64 (start, length) from the pointer, which points at
            // `range` for the whole call; the descriptor is kept open by `self.file`.
            unsafe { libc::ioctl(self.file.as_raw_fd(), BLKDISCARD, range.as_ptr()) }
        } else {
            // SAFETY: fallocate only reads the descriptor, which `self.file` keeps open.
            unsafe {
                libc::fallocate(
                    self.file.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset as libc::off_t,
                    len as libc::off_t,
                )
            }
        };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY) | Some(libc::EINVAL) => {
                tracing::info!("{}: discard not supported ({e}); freed segments are not discarded", self.name);
                self.discard_supported.store(false, Relaxed);
                Ok(())
            }
            _ => Err(e),
        }
    }
    /// A punched hole is allocated again by the file system when the segment is reused; a
    /// block device's discard is the drive's own business.
    fn discard_reallocates(&self) -> bool {
        !self.is_block_device
    }
    /// `lseek(SEEK_HOLE)`: the first hole at or after `offset` (the end of the file counts as
    /// one) lies inside the range.
    fn has_hole(&self, offset: u64, len: u64) -> bool {
        let Some(end) = offset.checked_add(len) else {
            return false;
        };
        if self.is_block_device || len == 0 || end > self.size_bytes {
            return false;
        }
        let Ok(start) = libc::off_t::try_from(offset) else {
            return false;
        };
        // SAFETY: lseek only reads the descriptor, which `self.file` keeps open; the file
        // position it moves is not used (every read and write is positioned).
        let hole = unsafe { libc::lseek(self.file.as_raw_fd(), start, libc::SEEK_HOLE) };
        hole >= 0 && (hole as u64) < end
    }
}

/// `_IO(0x12, 119)`: discard a byte range of a block device.
const BLKDISCARD: libc::c_ulong = 0x1277;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemoryDevice;
    use crate::util::AlignedBuf;
    use std::io::IoSlice;

    fn pieces(count: usize) -> Vec<AlignedBuf> {
        (0..count)
            .map(|i| {
                let mut b = AlignedBuf::zeroed(4096);
                b.fill((i % 251) as u8 + 1);
                b
            })
            .collect()
    }

    /// Writes `count` 4 KiB pieces as one vectored write at 8 KiB and reads them back.
    fn round_trip(dev: &dyn Device, count: usize) {
        let bufs = pieces(count);
        let slices: Vec<IoSlice<'_>> = bufs.iter().map(|b| IoSlice::new(b)).collect();
        dev.write_vectored_at(&slices, 8192).unwrap();
        let mut back = AlignedBuf::zeroed(count * 4096);
        dev.read_at(&mut back, 8192).unwrap();
        for (i, b) in bufs.iter().enumerate() {
            assert!(back[i * 4096..(i + 1) * 4096] == b[..], "piece {i} of {count} read back wrong");
        }
    }

    #[test]
    fn vectored_writes_land_in_order_on_a_file_and_through_the_default() {
        let scratch = tempfile::tempdir().unwrap();
        let path = scratch.path().join("vectored.img");
        let opts = FileOpenOptions {
            create_size_bytes: Some(16 << 20),
            ..FileOpenOptions::default()
        };
        let file = FileDevice::open(&path, opts).unwrap();
        // One piece, a few, and more than one pwritev takes.
        for count in [1, 3, IOV_MAX + 300] {
            round_trip(&file, count);
        }
        let bufs = pieces(2);
        let slices: Vec<IoSlice<'_>> = bufs.iter().map(|b| IoSlice::new(b)).collect();
        assert!(
            file.write_vectored_at(&slices, (16 << 20) - 4096).is_err(),
            "a write past the end is refused"
        );
        drop(file);
        let mem = MemoryDevice::new("mem", 16 << 20);
        for count in [1, 3, 700] {
            round_trip(&mem, count);
        }
    }

    #[test]
    fn holes_are_found_where_nothing_was_written_or_a_hole_was_punched() {
        const MIB: u64 = 1 << 20;
        let scratch = tempfile::tempdir().unwrap();
        let path = scratch.path().join("holes.img");
        let opts = FileOpenOptions {
            create_size_bytes: Some(8 * MIB),
            ..FileOpenOptions::default()
        };
        let file = FileDevice::open(&path, opts).unwrap();
        assert!(file.discard_reallocates());
        assert!(file.has_hole(0, 8 * MIB), "a new file is one hole");
        file.write_at(&AlignedBuf::zeroed(2 * MIB as usize), 2 * MIB).unwrap();
        assert!(!file.has_hole(2 * MIB, 2 * MIB), "written zeros are allocated");
        assert!(file.has_hole(MIB, 2 * MIB), "a range reaching into unwritten space has a hole");
        assert!(file.has_hole(4 * MIB, MIB));
        file.discard(3 * MIB, MIB).unwrap();
        assert!(!file.has_hole(2 * MIB, MIB));
        assert!(file.has_hole(2 * MIB, 2 * MIB), "a punched megabyte is a hole again");
        assert!(!file.has_hole(7 * MIB, 2 * MIB), "a range past the end is not asked about");
        assert!(!file.has_hole(2 * MIB, 0));
        drop(file);
        assert!(!MemoryDevice::new("mem", MIB).has_hole(0, MIB), "memory has no holes");
    }
}
