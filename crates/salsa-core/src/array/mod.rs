//! The array layer: combines the pool's member devices into one physical address space of
//! segments, and does the I/O for a physical grain address.
//!
//! Owns: the [`Array`] trait, what the log asks of any layout (linear, and the RAID layouts to
//! come), the [`Member`] description and the [`ArrayKind`] recorded in every superblock. The
//! linear concatenation ([`linear::LinearArray`]) is the first layout.
//!
//! Invariants every layout keeps: a physical grain address is
//! `segment * grains_per_segment + grain_in_segment`; every access stays inside one segment; a
//! segment is written from its start, in order where its device needs it, and
//! [`Array::prepare_segment`] makes it writable from its start again before it is reused; a
//! write that returned is visible to reads, durable only after [`Array::sync_all`].

pub mod linear;

use crate::device::{Device, StorageType};
use crate::error::Result;
use crate::format::DeviceLayout;
use std::sync::Arc;

pub use crate::format::ArrayKind;

pub use linear::LinearArray;

/// One member device and the segments it holds.
pub struct Member {
    pub device: Arc<dyn Device>,
    pub first_segment: u32,
    pub segment_count: u32,
    pub layout: DeviceLayout,
}

/// What the log asks of an array (see the module documentation for the invariants).
pub trait Array: Send + Sync {
    fn kind(&self) -> ArrayKind;
    /// The member devices, in pool order.
    fn members(&self) -> &[Member];
    /// Whether buffers handed to the devices must be aligned (some member uses `O_DIRECT`).
    fn needs_aligned_buffers(&self) -> bool;
    /// The storage type `segment` lives on (allocation queues are kept per type).
    fn storage_type(&self, segment: u32) -> StorageType;
    /// Grains of `segment` that can be read: all of them, or those below the write pointer of
    /// a sequential zone.
    fn readable_grains(&self, segment: u32) -> u64;
    /// Makes a segment ready to be written from its start (a sequential zone that holds
    /// anything is reset). Called when a free segment is handed out, which is only after the
    /// metadata that emptied it is durable.
    fn prepare_segment(&self, segment: u32) -> Result<()>;
    /// Reads whole grains starting at a physical grain address.
    fn read(&self, grain: u64, buf: &mut [u8]) -> Result<()>;
    /// Writes the concatenation of `bufs` (whole grains in all) at a physical grain address, as
    /// one device write. Where a segment must be written in order, the write waits until every
    /// write before it in the segment is done.
    fn write_vectored(&self, grain: u64, bufs: &[std::io::IoSlice<'_>]) -> Result<()>;
    /// Writes whole grains starting at a physical grain address.
    fn write(&self, grain: u64, buf: &[u8]) -> Result<()> {
        self.write_vectored(grain, &[std::io::IoSlice::new(buf)])
    }
    /// Syncs every member.
    fn sync_all(&self) -> Result<()>;
    /// The devices (and their layouts) that hold a copy of the pool metadata: every member
    /// that can be written.
    fn metadata_devices(&self) -> Vec<(&dyn Device, DeviceLayout)>;
}
