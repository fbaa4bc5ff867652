//! The pool metadata: the volume table, the members and their states, the rebuild in progress
//! and the latest checkpoint, in two alternating slots on every member.

use super::*;

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
    pub(super) fn encode_as(&self, version: u32) -> Vec<u8> {
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
