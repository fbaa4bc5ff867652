//! The superblock: one per device, at its start; what the device is and the pool it belongs to
//! (array layout, members, geometry, policies).

use super::*;

/// The placement of one device's structures (chosen by [`crate::layout`], stored in its
/// superblock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceLayout {
    /// Byte offset of this device's first segment.
    pub segments_offset_bytes: u64,
    /// Byte offsets of the two pool-metadata slots (used on device 0).
    pub meta_slot_offsets: [u64; 2],
}

/// How the members of a pool are combined; recorded in every superblock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArrayKind {
    /// The members' segments one after another; no redundancy.
    Linear = 0,
    /// Each segment striped across every member in stripe units; no redundancy.
    Raid0 = 1,
    /// Each segment written whole to every member.
    Raid1 = 2,
    /// Each segment striped across all members but one per row, with the row's parity on the
    /// remaining member, rotating row by row.
    Raid5 = 3,
}

impl ArrayKind {
    pub const ALL: [ArrayKind; 4] = [ArrayKind::Linear, ArrayKind::Raid0, ArrayKind::Raid1, ArrayKind::Raid5];

    pub fn name(self) -> &'static str {
        match self {
            ArrayKind::Linear => "linear",
            ArrayKind::Raid0 => "raid0",
            ArrayKind::Raid1 => "raid1",
            ArrayKind::Raid5 => "raid5",
        }
    }

    pub fn from_u8(v: u8) -> Option<ArrayKind> {
        Self::ALL.into_iter().find(|k| *k as u8 == v)
    }

    pub fn from_name(name: &str) -> Option<ArrayKind> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Fewest members the layout takes.
    pub fn min_members(self) -> u32 {
        match self {
            ArrayKind::Linear => 1,
            ArrayKind::Raid0 | ArrayKind::Raid1 => 2,
            ArrayKind::Raid5 => 3,
        }
    }

    /// Members that may fail without losing data.
    pub fn tolerated_failures(self, members: u32) -> u32 {
        match self {
            ArrayKind::Linear | ArrayKind::Raid0 => 0,
            ArrayKind::Raid1 => members.saturating_sub(1),
            ArrayKind::Raid5 => 1,
        }
    }

    /// Members that hold each row's data (RAID-1: one copy; linear: the one member).
    pub fn data_members(self, members: u32) -> u32 {
        match self {
            ArrayKind::Raid0 => members,
            ArrayKind::Raid5 => members.saturating_sub(1),
            ArrayKind::Linear | ArrayKind::Raid1 => 1,
        }
    }

    /// Bytes of a segment that each member holds.
    pub fn member_segment_bytes(self, members: u32, segment_bytes: u64) -> u64 {
        segment_bytes / self.data_members(members).max(1) as u64
    }

    /// Whether a segment is striped in units across the members (the stripe unit matters).
    pub fn is_striped(self) -> bool {
        matches!(self, ArrayKind::Raid0 | ArrayKind::Raid5)
    }
}

/// The superblock at offset 0 of every pool member.
#[derive(Debug, Clone, PartialEq)]
pub struct Superblock {
    /// Format version the superblock was read with ([`FORMAT_VERSION`] when written).
    pub format_version: u32,
    pub pool_id: u128,
    pub device_index: u32,
    pub device_count: u32,
    pub device_size_bytes: u64,
    pub storage_type: StorageType,
    pub grain_bytes: u32,
    pub segment_bytes: u64,
    /// Global index of this device's first segment.
    pub first_segment: u32,
    /// Segments on this device.
    pub segment_count: u32,
    /// Segments in the whole pool.
    pub total_segments: u32,
    /// A metadata page is written after at most this many data pages.
    pub meta_interval_pages: u32,
    /// Name of the victim-selection policy (see [`crate::policy`]).
    pub victim_policy: String,
    /// Placement policy of volumes created without naming one.
    pub default_placement: String,
    /// Aging factor of the aging-greedy policy, in thousandths.
    pub gc_aging_milli: u32,
    /// Spare space the pool was formatted with, in hundredths of a percent of physical space.
    pub spare_basis_points: u32,
    /// Where this device's metadata slots and segments sit.
    pub layout: DeviceLayout,
    /// How the members are combined.
    pub array: ArrayKind,
    /// Bytes written to one member before the next, in striped layouts (0 in a linear one).
    pub stripe_unit_bytes: u32,
    /// Random id of this member, chosen when it joined the pool (0 in a version-5 superblock).
    pub member_id: u64,
    /// Ids of every member, in slot order (empty in a version-5 superblock).
    pub member_ids: Vec<u64>,
}

impl Superblock {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::default();
        e.raw(SUPERBLOCK_MAGIC)
            .u32(FORMAT_VERSION)
            .u128(self.pool_id)
            .u32(self.device_index)
            .u32(self.device_count)
            .u64(self.device_size_bytes)
            .u8(self.storage_type as u8)
            .u32(self.grain_bytes)
            .u64(self.segment_bytes)
            .u32(self.first_segment)
            .u32(self.segment_count)
            .u32(self.total_segments)
            .u32(self.meta_interval_pages);
        encode_name(&mut e, &self.victim_policy);
        encode_name(&mut e, &self.default_placement);
        e.u32(self.gc_aging_milli)
            .u32(self.spare_basis_points)
            .u64(self.layout.segments_offset_bytes)
            .u64(self.layout.meta_slot_offsets[0])
            .u64(self.layout.meta_slot_offsets[1])
            .u8(self.array as u8)
            .u32(self.stripe_unit_bytes)
            .u64(self.member_id)
            .u16(self.member_ids.len() as u16);
        for id in &self.member_ids {
            e.u64(*id);
        }
        let mut block = vec![0u8; SUPERBLOCK_BYTES];
        seal_block(&e.bytes, &mut block);
        block
    }

    pub fn decode(block: &[u8]) -> Result<Superblock, FormatError> {
        let (mut d, format_version) = open_block(block, SUPERBLOCK_MAGIC)?;
        let mut sb = Superblock {
            format_version,
            pool_id: d.u128("pool id")?,
            device_index: d.u32("device index")?,
            device_count: d.u32("device count")?,
            device_size_bytes: d.u64("device size")?,
            storage_type: StorageType::from_u8(d.u8("storage type")?).ok_or_else(|| FormatError::Invalid("storage type".into()))?,
            grain_bytes: d.u32("grain size")?,
            segment_bytes: d.u64("segment size")?,
            first_segment: d.u32("first segment")?,
            segment_count: d.u32("segment count")?,
            total_segments: d.u32("total segments")?,
            meta_interval_pages: d.u32("metadata interval")?,
            victim_policy: decode_name(&mut d, "victim policy")?,
            default_placement: decode_name(&mut d, "default placement policy")?,
            gc_aging_milli: d.u32("aging factor")?,
            spare_basis_points: d.u32("spare")?,
            layout: DeviceLayout {
                segments_offset_bytes: d.u64("segments offset")?,
                meta_slot_offsets: [d.u64("metadata slot 0")?, d.u64("metadata slot 1")?],
            },
            array: ArrayKind::Linear,
            stripe_unit_bytes: 0,
            member_id: 0,
            member_ids: Vec::new(),
        };
        if format_version >= 6 {
            sb.array = ArrayKind::from_u8(d.u8("array kind")?).ok_or_else(|| FormatError::Invalid("array kind".into()))?;
            sb.stripe_unit_bytes = d.u32("stripe unit")?;
            sb.member_id = d.u64("member id")?;
            let n = d.u16("member count")? as usize;
            if n != sb.device_count as usize {
                return Err(FormatError::Invalid("member list length".into()));
            }
            for _ in 0..n {
                sb.member_ids.push(d.u64("member id")?);
            }
        }
        sb.validate()?;
        Ok(sb)
    }

    fn validate(&self) -> Result<(), FormatError> {
        let bad = |what: &str| Err(FormatError::Invalid(what.to_string()));
        if !self.grain_bytes.is_power_of_two() || !(4096..=65536).contains(&self.grain_bytes) {
            return bad("grain size");
        }
        if !self.segment_bytes.is_multiple_of(self.grain_bytes as u64) || !((1 << 20)..=(1 << 30)).contains(&self.segment_bytes) {
            return bad("segment size");
        }
        if self.device_count == 0 || self.device_index >= self.device_count || self.device_count as usize > MAX_DEVICES {
            return bad("device index");
        }
        if self.format_version >= 6 {
            let mut ids = self.member_ids.clone();
            ids.sort_unstable();
            ids.dedup();
            if ids.len() != self.member_ids.len() || ids.first() == Some(&0) {
                return bad("member ids are not distinct");
            }
            if self.member_ids.get(self.device_index as usize) != Some(&self.member_id) {
                return bad("member id is not in its slot of the member list");
            }
        }
        if self.device_count < self.array.min_members() {
            return bad("too few members for the array layout");
        }
        if self.array.is_striped() {
            let unit = self.stripe_unit_bytes as u64;
            if !unit.is_power_of_two() || unit < self.grain_bytes as u64 || unit > self.segment_bytes {
                return bad("stripe unit");
            }
            if !self
                .segment_bytes
                .is_multiple_of(unit * self.array.data_members(self.device_count) as u64)
            {
                return bad("segment size is not a whole number of rows");
            }
        } else if self.stripe_unit_bytes != 0 {
            return bad("stripe unit of an array that does not stripe");
        }
        let end = (self.first_segment as u64).checked_add(self.segment_count as u64);
        if end.is_none_or(|e| e > self.total_segments as u64) {
            return bad("segment range");
        }
        self.layout
            .validate(
                self.device_size_bytes,
                self.array.member_segment_bytes(self.device_count, self.segment_bytes),
                self.segment_count,
            )
            .map_err(FormatError::Invalid)?;
        if self.meta_interval_pages == 0 {
            return bad("metadata interval");
        }
        Ok(())
    }
}
