//! Typed errors of the engine. Every error names the device, volume or request it concerns and,
//! where the user can act, says what to do.

use std::io;

/// Result alias used throughout the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the engine can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A device read, write or sync failed.
    #[error("I/O error on device {device} ({op} at byte {offset}): {source}")]
    Io {
        device: String,
        op: &'static str,
        offset: u64,
        #[source]
        source: io::Error,
    },
    /// An earlier device write or sync failed; the pool refuses writes until it is reopened so
    /// that nothing acknowledged can be silently lost.
    #[error("pool is read-only after an earlier I/O error ({0}); fix the device and reopen the pool")]
    Poisoned(String),
    /// A device does not carry a SALSA superblock at all.
    #[error("device {device} is not a SALSA pool member: {reason}; check the path (nothing was changed on it)")]
    NotAPool { device: String, reason: String },
    /// A device carries a superblock that is damaged.
    #[error("device {device} has a damaged superblock: {reason}")]
    DamagedSuperblock { device: String, reason: String },
    /// A device without a superblock given together with members of a pool (a member that
    /// lost its superblock, or a wrong device): never "format it", which would lose the pool.
    #[error("{device}: no SALSA superblock; {why}")]
    NotAMember { device: String, why: String },
    /// A device was a member of this pool and has since been replaced by another device.
    #[error(
        "device {device} is no longer a member of this pool: it was member {slot} until it was replaced, and holds nothing the pool needs; give the device that replaced it, or leave it out to open degraded"
    )]
    ReplacedMember { device: String, slot: u32 },
    /// A device belongs to another pool.
    #[error("device {device} belongs to pool {found:032x}, not to pool {expected:032x}")]
    ForeignDevice { device: String, expected: u128, found: u128 },
    /// The pool has members that were not given.
    #[error("pool {pool:032x} has {expected} devices but {given} were given; missing member index {missing}: {why}")]
    MissingMember {
        pool: u128,
        expected: u32,
        given: u32,
        missing: u32,
        /// Why the pool cannot open without it.
        why: String,
    },
    /// Device format written by a newer SALSA.
    #[error("device {device} uses format version {found}, this SALSA reads up to version {supported}; upgrade SALSA")]
    NewerFormat { device: String, found: u32, supported: u32 },
    /// On-disk metadata failed validation.
    #[error("corrupt metadata: {0}")]
    Corrupt(String),
    /// Data read back does not match the checksum recorded when it was written.
    #[error("checksum mismatch reading volume {volume} page {page}: the data on the device is damaged")]
    ChecksumMismatch { volume: String, page: u64 },
    /// A replacement failed while it was rebuilt: the pool goes on without it.
    #[error("the replacement failed while it was rebuilt: {0}")]
    ReplacementFailed(String),
    /// The pool's physical space is exhausted: every page promised is in use.
    #[error("no space left in the pool: {0}")]
    NoSpace(String),
    /// The request is malformed (range past the end, bad size, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// A write or trim that breaks an append-only volume's rules (an overwrite, a write that
    /// leaves a hole); nothing was changed.
    #[error("{0}")]
    AppendOnly(String),
    /// Volume lookup failed.
    #[error("no volume named {0:?}")]
    VolumeNotFound(String),
    /// Volume name already used.
    #[error("a volume named {0:?} already exists")]
    VolumeExists(String),
    /// The volume or pool was opened read-only.
    #[error("{0} is read-only")]
    ReadOnly(String),
    /// The pool is being closed.
    #[error("the pool is shutting down")]
    ShuttingDown,
    /// A read inside `crate::log::memory_reads::memory_only` needed a device; nothing was
    /// read or counted, and the caller reads again where it may wait.
    #[error("the data is not in memory and this read may not wait for a device")]
    NotInMemory,
    /// A bounded counter of the on-disk format ran out (the pool metadata generation, which
    /// numbers epochs of sequence numbers; it takes about 16 million metadata writes).
    #[error("pool exhausted: {0}; copy its volumes to a newly formatted pool")]
    Exhausted(String),
}

impl Error {
    /// A failed read, write or sync of `dev`.
    pub fn device_io(dev: &dyn crate::device::Device, op: &'static str, offset: u64, source: io::Error) -> Error {
        Error::Io {
            device: dev.name().to_string(),
            op,
            offset,
            source,
        }
    }

    /// Whether this error should be reported to a block-device client as EIO (as opposed to
    /// EINVAL, ENOSPC, EPERM...). Front-ends use it to map errors to protocol codes.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::NoSpace(_) => ErrorKind::NoSpace,
            Error::InvalidArgument(_) => ErrorKind::InvalidArgument,
            Error::AppendOnly(_) => ErrorKind::NotPermitted,
            Error::ReadOnly(_) | Error::Poisoned(_) => ErrorKind::ReadOnly,
            Error::ShuttingDown => ErrorKind::ShuttingDown,
            _ => ErrorKind::Io,
        }
    }
}

/// Coarse classification of errors for front-ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    Io,
    NoSpace,
    InvalidArgument,
    /// The request breaks a rule of the volume (an overwrite of an append-only volume).
    NotPermitted,
    ReadOnly,
    ShuttingDown,
}
