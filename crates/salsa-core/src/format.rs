//! Every on-disk structure, in one place. Each is self-identifying (magic, format version, pool
//! id) and protected by a crc32c; `docs/DESIGN.md` gives the byte layouts. Decoding treats the
//! bytes as untrusted: all arithmetic is checked and every failure is a [`FormatError`], never a
//! panic.

use crate::device::StorageType;
use crate::util::{Decoder, Encoder, Truncated};

/// Format version written by this build; newer versions are refused.
///
/// Version 6 added the array layout and the member list to the superblock, the controller kind
/// and settings to the volume table, and a copy of the pool metadata on every member. Version 7
/// added the parity buffer's id to the pool metadata; version 8 a victim policy per volume;
/// version 9 the members that hold log data; version 10 the AMF and extent controllers;
/// version 11 share entries in records (SHARE's remap) and the shared pages in checkpoints;
/// version 12 a rebuild's rate limit in the pool metadata (so that a resumed rebuild keeps it);
/// version 13 the healthy member a rebuild replaces, which serves its slot until the rebuild
/// ends (so that a restart keeps it in service when it is given again).
pub const FORMAT_VERSION: u32 = 13;
/// Oldest format version this build reads. A version-5 pool opens as it is (its superblocks
/// decode as a linear array without member ids; its records and checkpoint are unchanged) and
/// its pool metadata is rewritten as version 6 by the first write after it opens.
pub const OLDEST_READABLE_VERSION: u32 = 5;
/// Most member devices in one pool (bounded so the member list fits the superblock).
pub const MAX_DEVICES: usize = 256;
/// Most settings a volume-table entry carries.
pub const MAX_VOLUME_SETTINGS: usize = 16;
/// Longest policy name stored on disk.
pub const MAX_POLICY_NAME_BYTES: usize = 32;
/// Size of the superblock at offset 0 of every device.
pub const SUPERBLOCK_BYTES: usize = 4096;
/// Bytes at the head of every device that hold the superblock and the pool-metadata slots;
/// segments start here.
pub const DEVICE_RESERVED_BYTES: u64 = 1 << 20;
/// Offsets (on device 0) of the two alternating pool-metadata slots.
pub const POOL_META_SLOT_OFFSETS: [u64; 2] = [64 << 10, 544 << 10];
/// Maximum size of one pool-metadata slot.
pub const POOL_META_SLOT_BYTES: usize = 448 << 10;
/// Maximum number of volumes in a pool (bounded so the volume table fits its slot).
pub const MAX_VOLUMES: usize = 1024;
/// Most pages a volume may have (its map must fit in memory); the volume table and the
/// recovery scan refuse more.
pub const MAX_VOLUME_PAGES: u64 = 1 << 32;
/// Maximum length of a volume name in bytes.
pub const MAX_VOLUME_NAME_BYTES: usize = 64;
/// Maximum number of segments a checkpoint may occupy (bounded so the list fits its slot).
pub const MAX_CHECKPOINT_SEGMENTS: usize = 16 << 10;

const SUPERBLOCK_MAGIC: &[u8; 8] = b"SALSASB1";
const POOL_META_MAGIC: &[u8; 8] = b"SALSAPM1";
const RECORD_MAGIC: &[u8; 8] = b"SALSARC1";
const CHECKPOINT_MAGIC: &[u8; 8] = b"SALSACP1";
const PARITY_BUFFER_MAGIC: &[u8; 8] = b"SALSAPB1";
/// A bank whose entries are each a whole-block descriptor and a parity unit (the first layout,
/// still read).
const PARITY_BANK_MAGIC: &[u8; 8] = b"SALSAPK1";
/// A bank whose descriptors are packed, first into its header block, then into a table
/// before the parity units (written now).
const PARITY_BANK_MAGIC_PACKED: &[u8; 8] = b"SALSAPK2";
/// Where a packed bank's header block holds its first descriptors.
pub const PARITY_BANK_DESCRIPTORS_AT: usize = 64;

/// Why bytes failed to decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("no magic number (not written by SALSA, or never written)")]
    BadMagic,
    #[error("checksum mismatch")]
    BadChecksum,
    #[error("format version {0} is newer than this SALSA supports ({FORMAT_VERSION})")]
    NewerVersion(u32),
    #[error("format version {0} is older than this SALSA reads ({OLDEST_READABLE_VERSION} to {FORMAT_VERSION}); copy the data out with the SALSA that wrote it, then reformat")]
    OlderVersion(u32),
    #[error("truncated while reading {0}")]
    Truncated(&'static str),
    #[error("invalid field: {0}")]
    Invalid(String),
}

impl From<Truncated> for FormatError {
    fn from(t: Truncated) -> Self {
        FormatError::Truncated(t.0)
    }
}

fn crc(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// Writes `body` into a fixed block and puts the crc32c of everything before it in the last four
/// bytes.
fn seal_block(body: &[u8], block: &mut [u8]) {
    let n = block.len();
    assert!(
        body.len() + 4 <= n,
        "structure of {} bytes does not fit its {n}-byte block",
        body.len()
    );
    block.fill(0);
    block[..body.len()].copy_from_slice(body);
    let c = crc(&block[..n - 4]);
    block[n - 4..].copy_from_slice(&c.to_le_bytes());
}

/// Checks magic, the trailing crc and the version of a fixed block; returns a decoder after them
/// and the version the block was written with.
fn open_block<'a>(block: &'a [u8], magic: &[u8; 8]) -> Result<(Decoder<'a>, u32), FormatError> {
    if block.len() < 16 || &block[..8] != magic {
        return Err(FormatError::BadMagic);
    }
    let n = block.len();
    let stored = u32::from_le_bytes([block[n - 4], block[n - 3], block[n - 2], block[n - 1]]);
    if crc(&block[..n - 4]) != stored {
        return Err(FormatError::BadChecksum);
    }
    let mut d = Decoder::new(&block[..n - 4]);
    d.take(8, "magic")?;
    let version = d.u32("version")?;
    if version > FORMAT_VERSION {
        return Err(FormatError::NewerVersion(version));
    }
    if version < OLDEST_READABLE_VERSION {
        return Err(FormatError::OlderVersion(version));
    }
    Ok((d, version))
}

/// Encodes a policy name: a length byte and its bytes.
fn encode_name(e: &mut Encoder, name: &str) {
    let b = name.as_bytes();
    assert!(b.len() <= MAX_POLICY_NAME_BYTES, "policy name {name:?} is too long");
    e.u8(b.len() as u8).raw(b);
}

fn decode_name(d: &mut Decoder<'_>, what: &'static str) -> Result<String, FormatError> {
    let n = d.u8(what)? as usize;
    if n > MAX_POLICY_NAME_BYTES {
        return Err(FormatError::Invalid(format!("{what} length {n}")));
    }
    std::str::from_utf8(d.take(n, what)?)
        .map(str::to_string)
        .map_err(|_| FormatError::Invalid(format!("{what} is not UTF-8")))
}

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

/// Which controller maps a volume; recorded in the volume table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ControllerKind {
    /// The LSA page map: one entry per page.
    #[default]
    Lsa = 0,
    /// Dual mapping: a dense map of large pages and a bounded sparse map of grain-sized pages
    /// for small and unaligned writes.
    Dual = 1,
    /// Hybrid: an LSA page map on the pool's slow devices, with hot page groups copied to its
    /// fast devices.
    Hybrid = 2,
    /// Application-managed flash: an append-only volume of segments over an extent map.
    Amf = 3,
    /// The LSA controller over an extent map (FSTL's): map memory in proportion to the runs
    /// written, bounded by the page map's.
    Extent = 4,
}

impl ControllerKind {
    /// Every kind, for messages and parsing.
    pub const ALL: [ControllerKind; 5] = [
        ControllerKind::Lsa,
        ControllerKind::Dual,
        ControllerKind::Hybrid,
        ControllerKind::Amf,
        ControllerKind::Extent,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ControllerKind::Lsa => "lsa",
            ControllerKind::Dual => "dual",
            ControllerKind::Hybrid => "hybrid",
            ControllerKind::Amf => "amf",
            ControllerKind::Extent => "extent",
        }
    }

    /// The kind named `name` (as [`ControllerKind::name`] spells it).
    pub fn from_name(name: &str) -> Option<ControllerKind> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    pub fn from_u8(v: u8) -> Option<ControllerKind> {
        Self::ALL.into_iter().find(|k| *k as u8 == v)
    }
}

/// One volume in the pool's volume table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRecord {
    /// Never reused within a pool, so records of a deleted volume can be told apart.
    pub id: u32,
    pub name: String,
    pub size_bytes: u64,
    pub page_bytes: u32,
    /// Name of the volume's placement policy (see [`crate::policy`]).
    pub placement: String,
    /// Name of the victim policy that ranks the volume's segments for the GC; empty: the
    /// pool's (versions before 8 had only the pool's).
    pub victim: String,
    /// The controller that maps it (version 5 knew only the page map).
    pub controller: ControllerKind,
    /// Controller settings as (key, value) pairs, keys defined by each controller, at most
    /// [`MAX_VOLUME_SETTINGS`]; a key this build does not know is refused at open rather than
    /// ignored.
    pub settings: Vec<(u16, u64)>,
}

/// The pool-wide mutable metadata, written alternately into two slots on device 0.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PoolMeta {
    pub pool_id: u128,
    /// Increases with every write; the valid slot with the highest generation wins.
    pub generation: u64,
    /// Random id of the session that wrote this; a clean checkpoint names its session.
    pub session_id: u64,
    /// True only when written by a clean shutdown together with a checkpoint.
    pub clean: bool,
    pub next_volume_id: u32,
    pub volumes: Vec<VolumeRecord>,
    pub checkpoint: Option<CheckpointRef>,
    /// Ids of the members marked failed: their contents are not trusted until they are
    /// replaced and rebuilt (at most [`MAX_DEVICES`]).
    pub failed_members: Vec<u64>,
    /// The current member of every slot, by id (empty: as the superblocks say; a replacement
    /// changes it here, so a replaced member that comes back is recognised as stale).
    pub member_ids: Vec<u64>,
    /// A member being rebuilt, and how far (resumed at the next open).
    pub rebuild: Option<RebuildState>,
    /// Id of the RAID-5 parity buffer that holds the parity of the rows being filled (0: none;
    /// flushes pad the log to whole rows instead). Version 7.
    pub parity_buffer_id: u64,
    /// Ids of the members that ever held a record (a segment of theirs was handed to a stream);
    /// the others hold at most a hybrid volume's copies or a checkpoint (which a scan
    /// replaces), and a linear pool opens without them. `None`: not known (written before version 9), every member counts.
    pub log_members: Option<Vec<u64>>,
}

/// Progress of a member's rebuild.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RebuildState {
    pub slot: u32,
    pub member_id: u64,
    /// Every segment below this one is rebuilt.
    pub next_segment: u32,
    /// Most bytes a second the rebuild writes to the new member; 0: no limit. (Pools of
    /// format 11 and older did not keep it: theirs read as 0.)
    pub rate_bytes_per_sec: u64,
    /// Id of the healthy member being replaced, which takes every write and serves the
    /// slot's reads until the rebuild ends; 0: none (the slot is rebuilt from the redundancy).
    /// Cleared in the metadata before any write that went around it counts as durable.
    /// (Pools of format 12 and older did not keep it: theirs read as 0.)
    pub outgoing_member_id: u64,
}

/// Where a clean-shutdown checkpoint lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRef {
    pub segments: Vec<u32>,
    pub bytes: u64,
    pub crc: u32,
}

impl PoolMeta {
    pub fn encode(&self) -> Vec<u8> {
        self.encode_as(FORMAT_VERSION)
    }

    /// The metadata as `version` lays it out, for version 11 or later: version 11 had no
    /// rebuild rate, and 12 no outgoing member (the tests that read such pools write them
    /// this way).
    fn encode_as(&self, version: u32) -> Vec<u8> {
        assert!((11..=FORMAT_VERSION).contains(&version), "pool metadata of version {version}");
        let mut e = Encoder::default();
        e.raw(POOL_META_MAGIC)
            .u32(version)
            .u128(self.pool_id)
            .u64(self.generation)
            .u64(self.session_id)
            .u8(self.clean as u8)
            .u32(self.next_volume_id)
            .u32(self.volumes.len() as u32);
        for v in &self.volumes {
            let name = v.name.as_bytes();
            e.u32(v.id).u16(name.len() as u16).raw(name).u64(v.size_bytes).u32(v.page_bytes);
            encode_name(&mut e, &v.placement);
            encode_name(&mut e, &v.victim);
            assert!(v.settings.len() <= MAX_VOLUME_SETTINGS, "too many volume settings");
            e.u8(v.controller as u8).u8(v.settings.len() as u8);
            for (key, value) in &v.settings {
                e.u16(*key).u64(*value);
            }
        }
        match &self.checkpoint {
            None => {
                e.u8(0);
            }
            Some(c) => {
                e.u8(1).u64(c.bytes).u32(c.crc).u32(c.segments.len() as u32);
                for s in &c.segments {
                    e.u32(*s);
                }
            }
        }
        assert!(self.failed_members.len() <= MAX_DEVICES, "too many failed members");
        e.u16(self.failed_members.len() as u16);
        for id in &self.failed_members {
            e.u64(*id);
        }
        assert!(self.member_ids.len() <= MAX_DEVICES, "too many members");
        e.u16(self.member_ids.len() as u16);
        for id in &self.member_ids {
            e.u64(*id);
        }
        match &self.rebuild {
            None => {
                e.u8(0);
            }
            Some(r) => {
                e.u8(1).u32(r.slot).u64(r.member_id).u32(r.next_segment);
                if version >= 12 {
                    e.u64(r.rate_bytes_per_sec);
                }
                if version >= 13 {
                    e.u64(r.outgoing_member_id);
                }
            }
        }
        e.u64(self.parity_buffer_id);
        match &self.log_members {
            None => {
                e.u8(0);
            }
            Some(ids) => {
                assert!(ids.len() <= MAX_DEVICES, "too many log members");
                e.u8(1).u16(ids.len() as u16);
                for id in ids {
                    e.u64(*id);
                }
            }
        }
        // Variable length: length-prefixed body, crc after it, padded to a 4 KiB multiple.
        let body_len = e.bytes.len() + 4;
        let block_len = body_len.next_multiple_of(4096);
        let mut block = vec![0u8; block_len];
        block[..e.bytes.len()].copy_from_slice(&e.bytes);
        let c = crc(&block[..block_len - 4]);
        block[block_len - 4..].copy_from_slice(&c.to_le_bytes());
        assert!(block.len() <= POOL_META_SLOT_BYTES, "pool metadata outgrew its slot");
        block
    }

    /// Decodes a slot. The slot's length is found by trying 4 KiB multiples: the crc sits in the
    /// last four bytes of the encoded length.
    pub fn decode(slot: &[u8]) -> Result<PoolMeta, FormatError> {
        if slot.len() < 8 || &slot[..8] != POOL_META_MAGIC {
            return Err(FormatError::BadMagic);
        }
        let mut last_err = FormatError::BadChecksum;
        let mut len = 4096;
        while len <= slot.len().min(POOL_META_SLOT_BYTES) {
            match open_block(&slot[..len], POOL_META_MAGIC) {
                Ok((d, version)) => return Self::decode_body(d, version),
                Err(FormatError::BadChecksum) => {}
                Err(e) => last_err = e,
            }
            len += 4096;
        }
        Err(last_err)
    }

    fn decode_body(mut d: Decoder<'_>, version: u32) -> Result<PoolMeta, FormatError> {
        let pool_id = d.u128("pool id")?;
        let generation = d.u64("generation")?;
        let session_id = d.u64("session")?;
        let clean = d.u8("clean flag")? != 0;
        let next_volume_id = d.u32("next volume id")?;
        let count = d.u32("volume count")? as usize;
        if count > MAX_VOLUMES {
            return Err(FormatError::Invalid(format!("{count} volumes")));
        }
        let mut volumes = Vec::with_capacity(count);
        for _ in 0..count {
            let id = d.u32("volume id")?;
            let name_len = d.u16("name length")? as usize;
            if name_len > MAX_VOLUME_NAME_BYTES {
                return Err(FormatError::Invalid("volume name length".into()));
            }
            let name = std::str::from_utf8(d.take(name_len, "volume name")?)
                .map_err(|_| FormatError::Invalid("volume name is not UTF-8".into()))?
                .to_string();
            let size_bytes = d.u64("volume size")?;
            let page_bytes = d.u32("page size")?;
            let placement = decode_name(&mut d, "placement policy")?;
            let victim = if version >= 8 {
                decode_name(&mut d, "victim policy")?
            } else {
                String::new()
            };
            let (mut controller, mut settings) = (ControllerKind::Lsa, Vec::new());
            if version >= 6 {
                controller = ControllerKind::from_u8(d.u8("controller kind")?)
                    .ok_or_else(|| FormatError::Invalid(format!("controller kind of volume {name:?}")))?;
                let n = d.u8("settings count")? as usize;
                if n > MAX_VOLUME_SETTINGS {
                    return Err(FormatError::Invalid(format!("{n} settings of volume {name:?}")));
                }
                for _ in 0..n {
                    settings.push((d.u16("setting key")?, d.u64("setting value")?));
                }
            }
            if id >= next_volume_id {
                return Err(FormatError::Invalid("volume id beyond next id".into()));
            }
            volumes.push(VolumeRecord {
                id,
                name,
                size_bytes,
                page_bytes,
                placement,
                victim,
                controller,
                settings,
            });
        }
        let checkpoint = match d.u8("checkpoint flag")? {
            0 => None,
            _ => {
                let bytes = d.u64("checkpoint size")?;
                let crc = d.u32("checkpoint crc")?;
                let n = d.u32("checkpoint segments")? as usize;
                if n > MAX_CHECKPOINT_SEGMENTS {
                    return Err(FormatError::Invalid("checkpoint segment count".into()));
                }
                let mut segments = Vec::with_capacity(n);
                for _ in 0..n {
                    segments.push(d.u32("checkpoint segment")?);
                }
                Some(CheckpointRef { segments, bytes, crc })
            }
        };
        let mut failed_members = Vec::new();
        if version >= 6 {
            let n = d.u16("failed member count")? as usize;
            if n > MAX_DEVICES {
                return Err(FormatError::Invalid(format!("{n} failed members")));
            }
            for _ in 0..n {
                failed_members.push(d.u64("failed member")?);
            }
        }
        let mut member_ids = Vec::new();
        let mut rebuild = None;
        if version >= 6 {
            let n = d.u16("member count")? as usize;
            if n > MAX_DEVICES {
                return Err(FormatError::Invalid(format!("{n} members")));
            }
            for _ in 0..n {
                member_ids.push(d.u64("member id")?);
            }
            if d.u8("rebuild flag")? != 0 {
                let r = RebuildState {
                    slot: d.u32("rebuild slot")?,
                    member_id: d.u64("rebuild member")?,
                    next_segment: d.u32("rebuild progress")?,
                    rate_bytes_per_sec: if version >= 12 { d.u64("rebuild rate")? } else { 0 },
                    outgoing_member_id: if version >= 13 { d.u64("outgoing member")? } else { 0 },
                };
                if r.slot as usize >= member_ids.len() || member_ids[r.slot as usize] != r.member_id {
                    return Err(FormatError::Invalid("rebuild of a member not in the member list".into()));
                }
                if r.outgoing_member_id != 0 && member_ids.contains(&r.outgoing_member_id) {
                    return Err(FormatError::Invalid(
                        "the member a rebuild replaces is still in the member list".into(),
                    ));
                }
                rebuild = Some(r);
            }
        }
        let parity_buffer_id = if version >= 7 { d.u64("parity buffer id")? } else { 0 };
        let mut log_members = None;
        if version >= 9 && d.u8("log members flag")? != 0 {
            let n = d.u16("log member count")? as usize;
            if n > MAX_DEVICES {
                return Err(FormatError::Invalid(format!("{n} log members")));
            }
            let mut ids = Vec::with_capacity(n);
            for _ in 0..n {
                ids.push(d.u64("log member")?);
            }
            log_members = Some(ids);
        }
        Ok(PoolMeta {
            pool_id,
            generation,
            session_id,
            clean,
            next_volume_id,
            volumes,
            checkpoint,
            failed_members,
            member_ids,
            rebuild,
            parity_buffer_id,
            log_members,
        })
    }
}

/// Most user or GC streams a volume's placement policy may use.
pub const MAX_STREAMS_PER_KIND: u8 = 16;

/// The stream a segment was opened for: a user-write class or a GC class of the volume's
/// placement policy, or the checkpoint. Stored as one byte: user class `k` is `k`, GC class `k`
/// is `0x40 + k`, the checkpoint `0xFF`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamKind {
    User(u8),
    Gc(u8),
    Checkpoint,
}

impl StreamKind {
    pub fn to_u8(self) -> u8 {
        match self {
            StreamKind::User(k) => k,
            StreamKind::Gc(k) => 0x40 + k,
            StreamKind::Checkpoint => 0xFF,
        }
    }
    pub fn from_u8(v: u8) -> Option<StreamKind> {
        match v {
            0xFF => Some(StreamKind::Checkpoint),
            k if k < MAX_STREAMS_PER_KIND => Some(StreamKind::User(k)),
            k if (0x40..0x40 + MAX_STREAMS_PER_KIND).contains(&k) => Some(StreamKind::Gc(k - 0x40)),
            _ => None,
        }
    }
}

/// The identity of a segment in use, as every metadata page in it repeats it (there is no
/// header grain: the first record's metadata page starts the segment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentHeader {
    pub pool_id: u128,
    pub segment: u32,
    /// Unique per use of the segment (the id of its first record); records carry it, so records
    /// left over from an earlier use are never taken for current ones.
    pub incarnation: u64,
    pub volume_id: u32,
    pub stream: StreamKind,
    /// Data sequence number when the segment was opened (its age for cleaning policies).
    pub opened_seq: u64,
}

/// One entry of a metadata page: a data page written in this record, or a trimmed range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaEntry {
    /// The next data page of the record holds logical page `page` at version `seq`.
    Data { page: u64, seq: u64, crc: u32 },
    /// Pages `[page, page + count)` were trimmed at version `seq`.
    Trim { page: u64, count: u64, seq: u64 },
    /// Pages `[page, page + count)` were remapped at version `seq` to the data already at grains
    /// `grain`, `grain + page_grains`, ... (SHARE): the data lives in other records, or in this
    /// record's own data pages when the GC moved a shared page. Takes two slots.
    Share { page: u64, count: u64, grain: u64, seq: u64 },
}

impl MetaEntry {
    /// Metadata slots the entry takes.
    pub fn slots(&self) -> u32 {
        match self {
            MetaEntry::Share { .. } => 2,
            _ => 1,
        }
    }
}

/// Data sequence numbers are stored in 56 bits (7 bytes per metadata entry). 15-byte entries let
/// one 4 KiB metadata page describe 255 data pages, so a 1 MiB segment carries one metadata page
/// instead of two: 0.4% more space for data, which lowers write amplification everywhere.
pub const SEQ_BITS: u32 = 56;
/// Largest data sequence number the format can store.
pub const MAX_SEQ: u64 = (1 << SEQ_BITS) - 1;
const SEQ_BYTES: usize = SEQ_BITS as usize / 8;

/// An entry is `page u32, crc-or-count u32, seq u56`; which entries are trims is a bitmap in
/// front of them (one bit per entry), so data and trim entries take one slot each. A share entry
/// takes two: a trim-kind slot with sequence field 0 (no real entry has sequence number 0: they
/// start at 1 in every epoch) holding the first page and the count less one, then a data-kind
/// slot holding the grain (low 32 bits in the page field, high 32 in the crc field) and the
/// sequence number.
const ENTRY_BYTES: usize = 4 + 4 + SEQ_BYTES;
const RECORD_HEADER_BYTES: usize = RECORD_HEADER_BYTES_V5 + 4;
/// Version 5 had no padding field.
const RECORD_HEADER_BYTES_V5: usize = 8 + 4 + 16 + 4 + 8 + 4 + 1 + 8 + 8 + 8 + 4 + 4 + 4 + 4;

/// How many entries (and their kind bits) fit one metadata page of `grain_bytes`.
pub fn meta_entries_per_page(grain_bytes: usize) -> usize {
    entries_after_header(grain_bytes, RECORD_HEADER_BYTES)
}

fn entries_after_header(grain_bytes: usize, header_bytes: usize) -> usize {
    let room = grain_bytes.saturating_sub(header_bytes + 4);
    let fits = |n: usize| n * ENTRY_BYTES + n.div_ceil(8) <= room;
    let mut n = room * 8 / (ENTRY_BYTES * 8 + 1);
    while n > 0 && !fits(n) {
        n -= 1;
    }
    n
}

/// The metadata page at the head of every record: a record is this page followed by the data
/// pages its `Data` entries describe, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordMeta {
    pub pool_id: u128,
    pub segment: u32,
    pub incarnation: u64,
    /// The segment's owner, stream and age (the same in every record of one incarnation).
    pub volume_id: u32,
    pub stream: StreamKind,
    pub opened_seq: u64,
    /// Global, increasing with creation order.
    pub record_id: u64,
    /// Every record with an id up to this one was durable when this record was written.
    pub synced_through: u64,
    /// Grain offset of this page in its segment.
    pub start_grain: u32,
    /// Grains per data page of the owning volume.
    pub page_grains: u32,
    /// Grains of zeros written after the record's data pages, so that a flush ends on a
    /// full stripe of a parity array (0 elsewhere; version 5 had none). The next record starts
    /// after them.
    pub pad_grains: u32,
    pub entries: Vec<MetaEntry>,
}

impl RecordMeta {
    /// The identity of the segment this record is in.
    pub fn segment_header(&self) -> SegmentHeader {
        SegmentHeader {
            pool_id: self.pool_id,
            segment: self.segment,
            incarnation: self.incarnation,
            volume_id: self.volume_id,
            stream: self.stream,
            opened_seq: self.opened_seq,
        }
    }

    /// Metadata slots its entries take.
    pub fn slots(&self) -> u32 {
        self.entries.iter().map(|e| e.slots()).sum()
    }

    /// The pool grain of data page `slot` (counting data entries only), the record lying in
    /// the segment whose first grain is `segment_base`: its pages follow its metadata page.
    pub fn data_grain(&self, segment_base: u64, slot: usize) -> u64 {
        segment_base + self.start_grain as u64 + 1 + slot as u64 * self.page_grains as u64
    }

    /// The checksums of the record's data pages, in slot order.
    pub fn data_crcs(&self) -> impl Iterator<Item = u32> + '_ {
        self.entries.iter().filter_map(|e| match e {
            MetaEntry::Data { crc, .. } => Some(*crc),
            _ => None,
        })
    }

    /// Number of data pages the record carries.
    pub fn data_pages(&self) -> usize {
        self.entries.iter().filter(|e| matches!(e, MetaEntry::Data { .. })).count()
    }

    /// Grains from this record's metadata page to the next record's: the page, the data
    /// pages and the padding. `None` when the fields overflow (a damaged page).
    pub fn span_grains(&self) -> Option<usize> {
        self.data_pages()
            .checked_mul(self.page_grains as usize)?
            .checked_add(1)?
            .checked_add(self.pad_grains as usize)
    }

    pub fn encode_into(&self, block: &mut [u8]) {
        let mut e = Encoder::default();
        e.raw(RECORD_MAGIC)
            .u32(FORMAT_VERSION)
            .u128(self.pool_id)
            .u32(self.segment)
            .u64(self.incarnation)
            .u32(self.volume_id)
            .u8(self.stream.to_u8())
            .u64(self.opened_seq)
            .u64(self.record_id)
            .u64(self.synced_through)
            .u32(self.start_grain)
            .u32(self.page_grains)
            .u32(self.pad_grains)
            .u32(self.data_pages() as u32)
            .u32(self.slots());
        let mut trims = vec![0u8; (self.slots() as usize).div_ceil(8)];
        let mut slot = 0usize;
        for entry in self.entries.iter() {
            if matches!(entry, MetaEntry::Trim { .. } | MetaEntry::Share { .. }) {
                trims[slot / 8] |= 1 << (slot % 8);
            }
            slot += entry.slots() as usize;
        }
        e.raw(&trims);
        // Pages and trim lengths fit 32 bits: a volume has at most 2^32 pages
        // (`MAX_VOLUME_PAGES`, checked when it is created or resized), and a trim covers 1 to
        // 2^32 pages, stored less one.
        // Sequence numbers stay within `SEQ_BITS` (the engine's epochs are bounded so).
        let narrow = |v: u64, what: &str| u32::try_from(v).unwrap_or_else(|_| panic!("{what} {v} exceeds 32 bits"));
        let seq_bytes = |seq: u64| {
            assert!(seq <= MAX_SEQ, "sequence number {seq} exceeds {SEQ_BITS} bits");
            let b = seq.to_le_bytes();
            let mut out = [0u8; SEQ_BYTES];
            out.copy_from_slice(&b[..SEQ_BYTES]);
            out
        };
        for entry in &self.entries {
            match *entry {
                MetaEntry::Data { page, seq, crc } => {
                    e.u32(narrow(page, "page")).u32(crc).raw(&seq_bytes(seq));
                }
                MetaEntry::Trim { page, count, seq } => {
                    assert!(count >= 1 && seq > 0, "empty trim entry or sequence number 0");
                    e.u32(narrow(page, "trim start"))
                        .u32(narrow(count - 1, "trim length"))
                        .raw(&seq_bytes(seq));
                }
                MetaEntry::Share { page, count, grain, seq } => {
                    assert!(count >= 1 && seq > 0, "empty share entry or sequence number 0");
                    e.u32(narrow(page, "share start"))
                        .u32(narrow(count - 1, "share length"))
                        .raw(&seq_bytes(0))
                        .u32(grain as u32)
                        .u32((grain >> 32) as u32)
                        .raw(&seq_bytes(seq));
                }
            }
        }
        seal_block(&e.bytes, block);
    }

    pub fn decode(block: &[u8]) -> Result<RecordMeta, FormatError> {
        let (mut d, version) = open_block(block, RECORD_MAGIC)?;
        let pool_id = d.u128("pool id")?;
        let segment = d.u32("segment")?;
        let incarnation = d.u64("incarnation")?;
        let volume_id = d.u32("volume id")?;
        let stream = StreamKind::from_u8(d.u8("stream")?).ok_or_else(|| FormatError::Invalid("stream kind".into()))?;
        let opened_seq = d.u64("opened seq")?;
        let record_id = d.u64("record id")?;
        let synced_through = d.u64("synced through")?;
        let start_grain = d.u32("start grain")?;
        let page_grains = d.u32("page grains")?;
        let (pad_grains, header_bytes) = if version >= 6 {
            (d.u32("pad grains")?, RECORD_HEADER_BYTES)
        } else {
            (0, RECORD_HEADER_BYTES_V5)
        };
        let data_pages = d.u32("data pages")? as usize;
        let count = d.u32("entry count")? as usize;
        if count > entries_after_header(block.len(), header_bytes) || page_grains == 0 {
            return Err(FormatError::Invalid("entry count".into()));
        }
        let trims = d.take(count.div_ceil(8), "trim bitmap")?.to_vec();
        let is_trim = |i: usize| trims[i / 8] & (1 << (i % 8)) != 0;
        let mut entries = Vec::with_capacity(count);
        let slot = |d: &mut Decoder<'_>| -> Result<(u32, u32, u64), FormatError> {
            let page = d.u32("entry page")?;
            let crc_or_count = d.u32("entry crc")?;
            let mut seq_le = [0u8; 8];
            seq_le[..SEQ_BYTES].copy_from_slice(d.take(SEQ_BYTES, "entry seq")?);
            Ok((page, crc_or_count, u64::from_le_bytes(seq_le)))
        };
        let mut i = 0;
        while i < count {
            let (page, crc_or_count, seq) = slot(&mut d)?;
            let page = page as u64;
            i += 1;
            if is_trim(i - 1) && seq == 0 {
                // A share entry's first slot; the second holds the grain and the sequence.
                if i >= count || is_trim(i) {
                    return Err(FormatError::Invalid("share entry without its second slot".into()));
                }
                let (low, high, seq) = slot(&mut d)?;
                i += 1;
                entries.push(MetaEntry::Share {
                    page,
                    count: crc_or_count as u64 + 1,
                    grain: (high as u64) << 32 | low as u64,
                    seq,
                });
                continue;
            }
            entries.push(if is_trim(i - 1) {
                MetaEntry::Trim {
                    page,
                    count: crc_or_count as u64 + 1,
                    seq,
                }
            } else {
                MetaEntry::Data {
                    page,
                    seq,
                    crc: crc_or_count,
                }
            });
        }
        let meta = RecordMeta {
            pool_id,
            segment,
            incarnation,
            volume_id,
            stream,
            opened_seq,
            record_id,
            synced_through,
            start_grain,
            page_grains,
            pad_grains,
            entries,
        };
        if meta.data_pages() != data_pages {
            return Err(FormatError::Invalid("data page count".into()));
        }
        Ok(meta)
    }
}

/// Header of a checkpoint blob (the blob itself: this header, then for each volume its id, page
/// count, entry width and raw map, then the per-grain crc table and per-segment ages).
pub fn encode_checkpoint_header(pool_id: u128, session_id: u64, next_seq: u64, next_record: u64) -> Vec<u8> {
    let mut e = Encoder::default();
    e.raw(CHECKPOINT_MAGIC)
        .u32(FORMAT_VERSION)
        .u128(pool_id)
        .u64(session_id)
        .u64(next_seq)
        .u64(next_record);
    e.bytes
}

/// Parsed checkpoint header.
pub struct CheckpointHeader {
    pub pool_id: u128,
    pub session_id: u64,
}

pub fn decode_checkpoint_header(d: &mut Decoder<'_>) -> Result<CheckpointHeader, FormatError> {
    if d.take(8, "checkpoint magic")? != CHECKPOINT_MAGIC {
        return Err(FormatError::BadMagic);
    }
    let version = d.u32("checkpoint version")?;
    if version > FORMAT_VERSION {
        return Err(FormatError::NewerVersion(version));
    }
    if version < OLDEST_READABLE_VERSION {
        return Err(FormatError::OlderVersion(version));
    }
    let header = CheckpointHeader {
        pool_id: d.u128("pool id")?,
        session_id: d.u64("session")?,
    };
    // Two reserved words (written as zero).
    d.u64("reserved")?;
    d.u64("reserved")?;
    Ok(header)
}

/// Size of a parity buffer's header block, of a bank's header block and the unit its entry
/// descriptors are rounded up to (so every part of the buffer can be written with `O_DIRECT`).
pub const PARITY_BLOCK_BYTES: usize = 4096;

/// Most data grains a RAID-5 row may have for its parity to be kept in a parity buffer (the
/// bits of an entry's coverage map).
pub const MAX_PARITY_ROW_GRAINS: u32 = 1 << 16;

/// Largest bank a parity buffer header may name (its offsets then never overflow).
pub const MAX_PARITY_BANK_BYTES: u64 = 1 << 40;

/// The first block of a RAID-5 parity buffer: the pool it serves and the layout of its two
/// banks. Each sync writes the parity of the rows being filled into the bank the previous
/// sync did not use, so a torn bank leaves the previous one whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParityBufferHeader {
    pub pool_id: u128,
    pub buffer_id: u64,
    /// Bytes of parity per entry: the array's stripe unit.
    pub unit_bytes: u32,
    /// Data grains per row: the bits of an entry's coverage map.
    pub row_grains: u32,
    /// Bytes of each bank: its header block and its entries.
    pub bank_bytes: u64,
}

impl ParityBufferHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::default();
        e.raw(PARITY_BUFFER_MAGIC)
            .u32(FORMAT_VERSION)
            .u128(self.pool_id)
            .u64(self.buffer_id)
            .u32(self.unit_bytes)
            .u32(self.row_grains)
            .u64(self.bank_bytes);
        let mut block = vec![0u8; PARITY_BLOCK_BYTES];
        seal_block(&e.bytes, &mut block);
        block
    }

    pub fn decode(block: &[u8]) -> Result<ParityBufferHeader, FormatError> {
        let (mut d, _) = open_block(block, PARITY_BUFFER_MAGIC)?;
        let h = ParityBufferHeader {
            pool_id: d.u128("pool id")?,
            buffer_id: d.u64("buffer id")?,
            unit_bytes: d.u32("stripe unit")?,
            row_grains: d.u32("row grains")?,
            bank_bytes: d.u64("bank size")?,
        };
        if !h.unit_bytes.is_power_of_two() || (h.unit_bytes as usize) < PARITY_BLOCK_BYTES || h.unit_bytes > 1 << 20 {
            return Err(FormatError::Invalid(format!("parity buffer stripe unit {}", h.unit_bytes)));
        }
        if h.row_grains == 0 || h.row_grains > MAX_PARITY_ROW_GRAINS {
            return Err(FormatError::Invalid(format!("parity buffer row of {} grains", h.row_grains)));
        }
        if !h.bank_bytes.is_multiple_of(PARITY_BLOCK_BYTES as u64)
            || h.bank_bytes < PARITY_BLOCK_BYTES as u64 + h.bank_body_bytes(1, true)
            || h.bank_bytes > MAX_PARITY_BANK_BYTES
        {
            return Err(FormatError::Invalid(format!("parity buffer bank of {} bytes", h.bank_bytes)));
        }
        Ok(h)
    }

    /// Bytes of an entry's descriptor (segment, row, coverage map).
    pub fn descriptor_bytes(&self) -> u64 {
        12 + self.row_grains.div_ceil(8) as u64
    }

    /// Descriptors a packed bank keeps in its header block (after its fields, before its crc).
    pub fn descriptors_in_header(&self) -> u64 {
        (PARITY_BLOCK_BYTES - PARITY_BANK_DESCRIPTORS_AT - 4) as u64 / self.descriptor_bytes()
    }

    /// Bytes of the entries of a bank of `count` entries, after its header block. Packed (the
    /// layout written now): the descriptors past those the header block holds, one after
    /// another, padded to whole blocks, then the parity units. Not packed (the first layout,
    /// which a buffer written by an older build may hold): per entry its descriptor padded to
    /// a whole block, then its unit.
    pub fn bank_body_bytes(&self, count: u64, packed: bool) -> u64 {
        let block = PARITY_BLOCK_BYTES as u64;
        if packed {
            let table = count.saturating_sub(self.descriptors_in_header()) * self.descriptor_bytes();
            table.next_multiple_of(block) + count * self.unit_bytes as u64
        } else {
            count * (self.descriptor_bytes().next_multiple_of(block) + self.unit_bytes as u64)
        }
    }

    /// Entries a bank holds (in the packed layout; never fewer than in the first).
    pub fn entries_per_bank(&self) -> u64 {
        let room = self.bank_bytes.saturating_sub(PARITY_BLOCK_BYTES as u64);
        let (unit, desc) = (self.unit_bytes as u64, self.descriptor_bytes());
        // Without the table's padding: n units and the descriptors past the header's.
        let mut n = (room / unit).min((room + self.descriptors_in_header() * desc) / (unit + desc));
        // The padding takes less than a block: at most a few entries fewer.
        while n > 0 && self.bank_body_bytes(n, true) > room {
            n -= 1;
        }
        n
    }

    /// Byte offset of bank 0 or 1.
    pub fn bank_offset(&self, bank: usize) -> u64 {
        PARITY_BLOCK_BYTES as u64 + bank as u64 * self.bank_bytes
    }
}

/// The header block of a bank: which sync wrote it, how many entries follow, and the crc32c
/// of those entries (descriptors and parity).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParityBankHeader {
    pub buffer_id: u64,
    /// Increases with every bank written; the valid bank with the highest wins.
    pub seq: u64,
    pub count: u32,
    pub body_crc: u32,
    /// The entries' layout (told by the magic): packed descriptors, or one block each.
    pub packed: bool,
}

impl ParityBankHeader {
    /// Seals the header into `block`, with `descriptors` (a packed bank's first ones, at
    /// [`PARITY_BANK_DESCRIPTORS_AT`]) under its crc.
    pub fn encode_into(&self, block: &mut [u8], descriptors: &[u8]) {
        let mut e = Encoder::default();
        e.raw(if self.packed { PARITY_BANK_MAGIC_PACKED } else { PARITY_BANK_MAGIC })
            .u32(FORMAT_VERSION)
            .u64(self.buffer_id)
            .u64(self.seq)
            .u32(self.count)
            .u32(self.body_crc);
        if !descriptors.is_empty() {
            assert!(self.packed, "descriptors in the header block of a bank of the first layout");
            e.bytes.resize(PARITY_BANK_DESCRIPTORS_AT, 0);
            e.raw(descriptors);
        }
        seal_block(&e.bytes, block);
    }

    pub fn decode(block: &[u8]) -> Result<ParityBankHeader, FormatError> {
        let packed = block.starts_with(PARITY_BANK_MAGIC_PACKED);
        let (mut d, _) = open_block(block, if packed { PARITY_BANK_MAGIC_PACKED } else { PARITY_BANK_MAGIC })?;
        Ok(ParityBankHeader {
            buffer_id: d.u64("buffer id")?,
            seq: d.u64("bank sequence")?,
            count: d.u32("entry count")?,
            body_crc: d.u32("entries crc")?,
            packed,
        })
    }
}

/// Writes the descriptor of one parity-buffer entry: segment, row and which data grains of
/// the row its parity covers (one bit each, grain-major within the row's data).
pub fn encode_parity_descriptor(segment: u32, row: u64, covered: &[bool], out: &mut [u8]) {
    out.fill(0);
    out[..4].copy_from_slice(&segment.to_le_bytes());
    out[4..12].copy_from_slice(&row.to_le_bytes());
    for (i, c) in covered.iter().enumerate() {
        if *c {
            out[12 + i / 8] |= 1 << (i % 8);
        }
    }
}

/// Reads a descriptor written by [`encode_parity_descriptor`] for rows of `row_grains` grains.
pub fn decode_parity_descriptor(block: &[u8], row_grains: u32) -> Result<(u32, u64, Vec<bool>), FormatError> {
    let mut d = Decoder::new(block);
    let segment = d.u32("entry segment")?;
    let row = d.u64("entry row")?;
    let bits = d.take(row_grains.div_ceil(8) as usize, "entry coverage")?;
    let covered = (0..row_grains as usize).map(|i| bits[i / 8] & (1 << (i % 8)) != 0).collect();
    Ok((segment, row, covered))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_meta_round_trips_and_detects_damage() {
        let meta = RecordMeta {
            pool_id: 7,
            segment: 3,
            incarnation: 11,
            volume_id: 4,
            stream: StreamKind::Gc(2),
            opened_seq: 99,
            record_id: 12,
            synced_through: 10,
            start_grain: 1,
            page_grains: 1,
            pad_grains: 3,
            entries: vec![
                MetaEntry::Data {
                    page: 5,
                    seq: 9,
                    crc: 0xdead,
                },
                MetaEntry::Trim {
                    page: 100,
                    count: 20,
                    seq: 10,
                },
                MetaEntry::Share {
                    page: 7,
                    count: 3,
                    grain: 0x1_2345_6789,
                    seq: 11,
                },
                MetaEntry::Data { page: 6, seq: 12, crc: 1 },
            ],
        };
        let mut block = vec![0u8; 4096];
        meta.encode_into(&mut block);
        assert_eq!(RecordMeta::decode(&block).unwrap(), meta);
        assert_eq!((meta.slots(), meta.data_pages()), (5, 2));
        block[100] ^= 1;
        assert_eq!(RecordMeta::decode(&block), Err(FormatError::BadChecksum));
    }

    #[test]
    #[should_panic(expected = "exceeds 56 bits")]
    fn a_sequence_number_past_the_format_s_width_is_never_written_truncated() {
        let meta = RecordMeta {
            pool_id: 1,
            segment: 0,
            incarnation: 1,
            volume_id: 1,
            stream: StreamKind::User(0),
            opened_seq: 1,
            record_id: 1,
            synced_through: 0,
            start_grain: 0,
            page_grains: 1,
            pad_grains: 0,
            entries: vec![MetaEntry::Data {
                page: 0,
                seq: MAX_SEQ + 1,
                crc: 0,
            }],
        };
        meta.encode_into(&mut vec![0u8; 4096]);
    }

    #[test]
    fn a_full_metadata_page_of_mixed_entries_round_trips_at_the_limits() {
        let n = meta_entries_per_page(4096);
        assert_eq!(n, 264, "15-byte entries and a kind bit each in a 4 KiB page");
        let entries = (0..n as u64)
            .map(|i| {
                if i % 7 == 3 {
                    MetaEntry::Trim {
                        page: if i == 3 { 0 } else { u32::MAX as u64 - i },
                        count: if i == 3 { 1 << 32 } else { i + 1 },
                        seq: MAX_SEQ - i,
                    }
                } else {
                    MetaEntry::Data {
                        page: u32::MAX as u64 - i,
                        seq: (7 << 48) + (0xab << 32) + i,
                        crc: i as u32 ^ 0xa5a5_a5a5,
                    }
                }
            })
            .collect();
        let meta = RecordMeta {
            pool_id: u128::MAX,
            segment: 9,
            incarnation: 1,
            volume_id: u32::MAX,
            stream: StreamKind::User(15),
            opened_seq: u64::MAX,
            record_id: 2,
            synced_through: 1,
            start_grain: 1,
            page_grains: 1,
            pad_grains: u32::MAX,
            entries,
        };
        let mut block = vec![0u8; 4096];
        meta.encode_into(&mut block);
        assert_eq!(RecordMeta::decode(&block).unwrap(), meta);
        // Flipping a trim bit (and fixing the checksum) changes the entry's meaning, never
        // panics, and keeps the data page count honest.
        let bit_at = RECORD_HEADER_BYTES;
        block[bit_at] ^= 1;
        let n = block.len();
        let c = crc(&block[..n - 4]);
        block[n - 4..].copy_from_slice(&c.to_le_bytes());
        assert!(matches!(RecordMeta::decode(&block), Err(FormatError::Invalid(_))));
    }

    #[test]
    fn parity_buffer_structures_round_trip() {
        let h = ParityBufferHeader {
            pool_id: 9,
            buffer_id: 77,
            unit_bytes: 16 << 10,
            row_grains: 12,
            bank_bytes: 1 << 20,
        };
        assert_eq!(ParityBufferHeader::decode(&h.encode()).unwrap(), h);
        assert_eq!(h.descriptor_bytes(), 12 + 2);
        // Packed: the units alone, the descriptors fitting the header block (the first
        // layout held 51: a block per descriptor).
        assert_eq!(h.entries_per_bank(), (1_048_576 - 4096) / 16384);
        assert_eq!(h.bank_body_bytes(51, false), 51 * (4096 + 16384));
        for packed in [false, true] {
            let b = ParityBankHeader {
                buffer_id: 77,
                seq: 5,
                count: 3,
                body_crc: 0xABCD,
                packed,
            };
            let mut block = vec![0u8; PARITY_BLOCK_BYTES];
            b.encode_into(&mut block, if packed { &[1, 2, 3] } else { &[] });
            assert_eq!(ParityBankHeader::decode(&block).unwrap(), b);
            assert_eq!(
                block[PARITY_BANK_DESCRIPTORS_AT..PARITY_BANK_DESCRIPTORS_AT + 3] == [1, 2, 3],
                packed
            );
        }
        let covered: Vec<bool> = (0..12).map(|i| i % 3 == 0).collect();
        let mut d = vec![0u8; 14];
        encode_parity_descriptor(4, 9, &covered, &mut d);
        assert_eq!(decode_parity_descriptor(&d, 12).unwrap(), (4, 9, covered));
        // A header whose bank cannot hold one entry is refused.
        let small = ParityBufferHeader { bank_bytes: 8192, ..h };
        assert!(ParityBufferHeader::decode(&small.encode()).is_err());
    }

    #[test]
    fn pool_meta_round_trips() {
        let pm = PoolMeta {
            pool_id: 1,
            generation: 2,
            session_id: 3,
            clean: true,
            next_volume_id: 2,
            volumes: vec![VolumeRecord {
                id: 1,
                name: "db".into(),
                size_bytes: 1 << 30,
                page_bytes: 4096,
                placement: "sepbit".into(),
                victim: "fifo".into(),
                controller: ControllerKind::Lsa,
                settings: vec![(3, u64::MAX), (0, 7)],
            }],
            checkpoint: Some(CheckpointRef {
                segments: vec![4, 5],
                bytes: 9000,
                crc: 77,
            }),
            failed_members: vec![42, u64::MAX],
            member_ids: vec![5, 42, 6],
            rebuild: Some(RebuildState {
                slot: 1,
                member_id: 42,
                next_segment: 99,
                rate_bytes_per_sec: 200 << 20,
                outgoing_member_id: 7,
            }),
            parity_buffer_id: 0xFEED,
            log_members: Some(vec![42, 5]),
        };
        let mut slot = pm.encode();
        slot.resize(POOL_META_SLOT_BYTES, 0xAA);
        assert_eq!(PoolMeta::decode(&slot).unwrap(), pm);
        // Not known (a pool written before version 9): every member counts.
        let unknown = PoolMeta {
            log_members: None,
            ..pm.clone()
        };
        let mut slot = unknown.encode();
        slot.resize(POOL_META_SLOT_BYTES, 0xAA);
        assert_eq!(PoolMeta::decode(&slot).unwrap(), unknown);
        // A pool of version 11 kept no rebuild rate: its rebuild reads back without a limit,
        // and every field after it (the parity buffer, the log members) where it was.
        let mut slot = pm.encode_as(11);
        slot.resize(POOL_META_SLOT_BYTES, 0xAA);
        let old = PoolMeta::decode(&slot).unwrap();
        let rebuild = pm.rebuild.map(|r| RebuildState {
            rate_bytes_per_sec: 0,
            outgoing_member_id: 0,
            ..r
        });
        assert_eq!(old, PoolMeta { rebuild, ..pm.clone() });
        // A pool of version 12 kept no outgoing member: its rebuild reads back without one.
        let mut slot = pm.encode_as(12);
        slot.resize(POOL_META_SLOT_BYTES, 0xAA);
        let old = PoolMeta::decode(&slot).unwrap();
        let rebuild = pm.rebuild.map(|r| RebuildState {
            outgoing_member_id: 0,
            ..r
        });
        assert_eq!(old, PoolMeta { rebuild, ..pm.clone() });
        // An outgoing member that is also a current member is refused.
        let mut bad = pm.clone();
        bad.rebuild.as_mut().unwrap().outgoing_member_id = 5;
        let mut slot = bad.encode();
        slot.resize(POOL_META_SLOT_BYTES, 0xAA);
        assert!(PoolMeta::decode(&slot).is_err());
    }

    /// Re-seals a pool-metadata block after a field was changed in place.
    fn reseal(block: &mut [u8]) {
        let n = block.len();
        let c = crc(&block[..n - 4]);
        block[n - 4..].copy_from_slice(&c.to_le_bytes());
    }

    #[test]
    fn a_volume_of_an_unknown_controller_kind_is_refused() {
        let mut pm = PoolMeta {
            pool_id: 1,
            next_volume_id: 2,
            ..PoolMeta::default()
        };
        pm.volumes.push(VolumeRecord {
            id: 1,
            name: "v".into(),
            size_bytes: 1 << 20,
            page_bytes: 4096,
            placement: "salsa".into(),
            victim: String::new(),
            controller: ControllerKind::Lsa,
            settings: vec![],
        });
        let mut block = pm.encode();
        // The controller byte follows the placement name and the (empty) victim name.
        let at = block.windows(5).position(|w| w == b"salsa").unwrap() + 5 + 1;
        assert_eq!(block[at], ControllerKind::Lsa as u8);
        block[at] = 200;
        reseal(&mut block);
        let err = PoolMeta::decode(&block).unwrap_err();
        assert!(err.to_string().contains("controller kind"), "{err}");
    }

    fn superblock() -> Superblock {
        Superblock {
            format_version: FORMAT_VERSION,
            pool_id: 9,
            device_index: 1,
            device_count: 3,
            device_size_bytes: 64 << 20,
            storage_type: StorageType::Flash,
            grain_bytes: 4096,
            segment_bytes: 1 << 20,
            first_segment: 63,
            segment_count: 63,
            total_segments: 189,
            meta_interval_pages: 255,
            victim_policy: "greedy".into(),
            default_placement: "salsa".into(),
            gc_aging_milli: 100,
            spare_basis_points: 2000,
            layout: DeviceLayout {
                segments_offset_bytes: 1 << 20,
                meta_slot_offsets: POOL_META_SLOT_OFFSETS,
            },
            array: ArrayKind::Linear,
            stripe_unit_bytes: 0,
            member_id: 22,
            member_ids: vec![11, 22, 33],
        }
    }

    #[test]
    fn superblock_round_trips_with_its_member_list() {
        let sb = superblock();
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
    }

    #[test]
    fn a_superblock_whose_member_list_disagrees_with_its_slot_is_refused() {
        for (ids, member_id) in [(vec![11, 22, 22], 22), (vec![11, 22, 33], 33), (vec![0, 22, 33], 22)] {
            let sb = Superblock {
                member_ids: ids.clone(),
                member_id,
                ..superblock()
            };
            assert!(
                matches!(Superblock::decode(&sb.encode()), Err(FormatError::Invalid(_))),
                "{ids:?} {member_id}"
            );
        }
    }

    #[test]
    fn decoders_never_panic_on_garbage() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        for _ in 0..2000 {
            let mut block = vec![0u8; 4096];
            rng.fill(&mut block[..]);
            // Valid magic, version and crc, so the decoders get past the envelope into the body.
            block[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
            for magic in [
                RECORD_MAGIC,
                SUPERBLOCK_MAGIC,
                POOL_META_MAGIC,
                PARITY_BUFFER_MAGIC,
                PARITY_BANK_MAGIC,
            ] {
                block[..8].copy_from_slice(magic);
                let c = crc(&block[..4092]);
                block[4092..].copy_from_slice(&c.to_le_bytes());
                let _ = RecordMeta::decode(&block);
                let _ = Superblock::decode(&block);
                let _ = PoolMeta::decode(&block);
                if let Ok(h) = ParityBufferHeader::decode(&block) {
                    // What open computes from a header must not overflow or divide by zero.
                    let _ = (h.entries_per_bank(), h.bank_offset(1), h.descriptor_bytes());
                }
                let _ = ParityBankHeader::decode(&block);
            }
            let row_grains = rng.gen_range(0..=MAX_PARITY_ROW_GRAINS + 8);
            let _ = decode_parity_descriptor(&block, row_grains);
        }
    }
}
