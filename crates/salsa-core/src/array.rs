//! The array layer: combines the pool's devices linearly into one physical address space of
//! segments, and does the I/O for a physical grain address.
//!
//! Owns: the mapping from a global segment index to (device, byte offset). Invariants: a segment
//! never crosses a device boundary; every access stays inside one segment.

use crate::device::{Device, StorageType};
use crate::error::{Error, Result};
use crate::format::DEVICE_RESERVED_BYTES;
use std::sync::Arc;

/// One member device and the segments it holds.
pub struct Member {
    pub device: Arc<dyn Device>,
    pub first_segment: u32,
    pub segment_count: u32,
}

/// Linear concatenation of the members.
pub struct Array {
    members: Vec<Member>,
    segment_bytes: u64,
    grain_bytes: u64,
    grains_per_segment: u64,
    /// Member index of every segment, for O(1) lookup.
    owner: Vec<u16>,
    /// Some member uses `O_DIRECT`; fixed when the array is built (asked on every page read).
    aligned_buffers: bool,
}

impl Array {
    pub fn new(members: Vec<Member>, segment_bytes: u64, grain_bytes: u64) -> Array {
        let mut owner = Vec::new();
        for (i, m) in members.iter().enumerate() {
            assert_eq!(m.first_segment as usize, owner.len(), "members must be contiguous");
            owner.extend(std::iter::repeat_n(i as u16, m.segment_count as usize));
        }
        let aligned_buffers = members.iter().any(|m| m.device.alignment_bytes() > 512);
        Array {
            members,
            segment_bytes,
            grain_bytes,
            grains_per_segment: segment_bytes / grain_bytes,
            owner,
            aligned_buffers,
        }
    }

    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// Whether buffers handed to the devices must be aligned (some member uses `O_DIRECT`).
    pub fn needs_aligned_buffers(&self) -> bool {
        self.aligned_buffers
    }

    pub fn segment_count(&self) -> u32 {
        self.owner.len() as u32
    }

    pub fn storage_type(&self, segment: u32) -> StorageType {
        self.members[self.owner[segment as usize] as usize].device.storage_type()
    }

    /// Device and byte offset of grain `grain_in_segment` of `segment`.
    fn locate(&self, segment: u32, grain_in_segment: u64, len: usize) -> (&dyn Device, u64) {
        assert!(
            grain_in_segment * self.grain_bytes + len as u64 <= self.segment_bytes,
            "access crosses the end of segment {segment}"
        );
        let m = &self.members[self.owner[segment as usize] as usize];
        let offset = DEVICE_RESERVED_BYTES + (segment - m.first_segment) as u64 * self.segment_bytes + grain_in_segment * self.grain_bytes;
        (m.device.as_ref(), offset)
    }

    /// Reads whole grains starting at a physical grain address.
    pub fn read(&self, grain: u64, buf: &mut [u8]) -> Result<()> {
        let segment = (grain / self.grains_per_segment) as u32;
        let (dev, offset) = self.locate(segment, grain % self.grains_per_segment, buf.len());
        dev.read_at(buf, offset).map_err(|source| Error::Io {
            device: dev.name().to_string(),
            op: "read",
            offset,
            source,
        })
    }

    /// Writes whole grains starting at a physical grain address.
    pub fn write(&self, grain: u64, buf: &[u8]) -> Result<()> {
        let segment = (grain / self.grains_per_segment) as u32;
        let (dev, offset) = self.locate(segment, grain % self.grains_per_segment, buf.len());
        dev.write_at(buf, offset).map_err(|source| Error::Io {
            device: dev.name().to_string(),
            op: "write",
            offset,
            source,
        })
    }

    /// Syncs every member.
    pub fn sync_all(&self) -> Result<()> {
        for m in &self.members {
            m.device.sync().map_err(|source| Error::Io {
                device: m.device.name().to_string(),
                op: "sync",
                offset: 0,
                source,
            })?;
        }
        Ok(())
    }
}
