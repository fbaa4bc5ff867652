//! Records in segments: the segment header, the metadata page of a record (its entries:
//! pages, trims, shares) and the streams records belong to.

use super::*;

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
    /// `grain`, `grain + stride`, ... (SHARE), where the stride is `stored_grains`, the grains
    /// each page's data takes as stored (compressed pages of a compressing volume), or
    /// `page_grains` when it is 0 (whole pages): the data lives in other records, or in this
    /// record's own data pages when the GC moved a shared page. Takes two slots; the stored
    /// size rides in the top byte of the grain field (grains stay below 2^56).
    Share {
        page: u64,
        count: u64,
        grain: u64,
        seq: u64,
        stored_grains: u8,
    },
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
pub(super) const RECORD_HEADER_BYTES: usize = RECORD_HEADER_BYTES_V5 + 4;
/// Version 5 had no padding field.
const RECORD_HEADER_BYTES_V5: usize = 8 + 4 + 16 + 4 + 8 + 4 + 1 + 8 + 8 + 8 + 4 + 4 + 4 + 4;

/// How many entries (and their kind bits) fit one metadata page of `grain_bytes`.
pub fn meta_entries_per_page(grain_bytes: usize) -> usize {
    entries_after_header(grain_bytes, RECORD_HEADER_BYTES, false)
}

/// How many entries fit the metadata page of a sized record (each may be a data page with
/// its size nibble).
pub fn sized_meta_entries_per_page(grain_bytes: usize) -> usize {
    entries_after_header(grain_bytes, RECORD_HEADER_BYTES, true)
}

fn entries_after_header(grain_bytes: usize, header_bytes: usize, sized: bool) -> usize {
    let room = grain_bytes.saturating_sub(header_bytes + 4);
    let nibbles = |n: usize| if sized { n.div_ceil(2) } else { 0 };
    let fits = |n: usize| n * ENTRY_BYTES + n.div_ceil(8) + nibbles(n) <= room;
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
    /// Grains each data page takes, in slot order, when the record's pages differ in size (a
    /// compressed volume's: each at most `page_grains`); `None`: every one takes
    /// `page_grains`. Stored as a nibble per data page (grains less one) after the kind
    /// bitmap, flagged by [`SIZED_RECORD`] in the page-grains field (format 14).
    pub data_sizes: Option<Vec<u8>>,
}

/// Flag in a record's page-grains field: a nibble per data page tells its grains.
pub const SIZED_RECORD: u32 = 1 << 31;
/// Grains a page of a sized record takes at most (a nibble holds the grains less one).
pub const MAX_SIZED_PAGE_GRAINS: u32 = 16;
/// Bits of a share entry's grain field that hold the grain; the byte above them holds the
/// shared pages' stored size.
pub const SHARE_GRAIN_BITS: u32 = 56;

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
        segment_base + self.start_grain as u64 + 1 + self.data_offset(slot) as u64
    }

    /// Grains from the record's first data grain to data page `slot`'s.
    pub fn data_offset(&self, slot: usize) -> usize {
        match &self.data_sizes {
            None => slot * self.page_grains as usize,
            Some(sizes) => sizes[..slot].iter().map(|&g| g as usize).sum(),
        }
    }

    /// Grains data page `slot` takes.
    pub fn data_page_grains(&self, slot: usize) -> u32 {
        match &self.data_sizes {
            None => self.page_grains,
            Some(sizes) => sizes[slot] as u32,
        }
    }

    /// Per data page, in slot order: its offset from the first data grain and its grains.
    pub fn data_layout(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        let mut at = 0usize;
        (0..self.data_pages()).map(move |slot| {
            let g = self.data_page_grains(slot);
            let here = at;
            at += g as usize;
            (here, g)
        })
    }

    /// Grains of all the record's data pages. `None` on overflow (a damaged page).
    pub fn data_grains(&self) -> Option<usize> {
        match &self.data_sizes {
            None => self.data_pages().checked_mul(self.page_grains as usize),
            Some(sizes) => Some(sizes.iter().map(|&g| g as usize).sum()),
        }
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
        self.data_grains()?.checked_add(1)?.checked_add(self.pad_grains as usize)
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
            .u32(self.page_grains | if self.data_sizes.is_some() { SIZED_RECORD } else { 0 })
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
        if let Some(sizes) = &self.data_sizes {
            assert_eq!(sizes.len(), self.data_pages(), "a size per data page");
            let mut nibbles = vec![0u8; sizes.len().div_ceil(2)];
            for (i, &g) in sizes.iter().enumerate() {
                assert!(
                    g >= 1 && g as u32 <= self.page_grains.min(MAX_SIZED_PAGE_GRAINS),
                    "data page of {g} grains"
                );
                nibbles[i / 2] |= (g - 1) << (4 * (i % 2));
            }
            e.raw(&nibbles);
        }
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
                MetaEntry::Share {
                    page,
                    count,
                    grain,
                    seq,
                    stored_grains,
                } => {
                    assert!(count >= 1 && seq > 0, "empty share entry or sequence number 0");
                    assert!(grain < 1 << SHARE_GRAIN_BITS, "grain {grain} exceeds {SHARE_GRAIN_BITS} bits");
                    assert!(
                        stored_grains == 0 || (stored_grains as u32) < self.page_grains.min(MAX_SIZED_PAGE_GRAINS),
                        "share of pages stored in {stored_grains} grains"
                    );
                    e.u32(narrow(page, "share start"))
                        .u32(narrow(count - 1, "share length"))
                        .raw(&seq_bytes(0))
                        .u32(grain as u32)
                        .u32((grain >> 32) as u32 | (stored_grains as u32) << (SHARE_GRAIN_BITS - 32))
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
        let page_grains_field = d.u32("page grains")?;
        let sized = page_grains_field & SIZED_RECORD != 0;
        let page_grains = page_grains_field & !SIZED_RECORD;
        let (pad_grains, header_bytes) = if version >= 6 {
            (d.u32("pad grains")?, RECORD_HEADER_BYTES)
        } else {
            (0, RECORD_HEADER_BYTES_V5)
        };
        let data_pages = d.u32("data pages")? as usize;
        let count = d.u32("entry count")? as usize;
        if count > entries_after_header(block.len(), header_bytes, sized) || page_grains == 0 {
            return Err(FormatError::Invalid("entry count".into()));
        }
        if sized && (version < 14 || data_pages > count || page_grains > MAX_SIZED_PAGE_GRAINS) {
            return Err(FormatError::Invalid("sized record".into()));
        }
        let trims = d.take(count.div_ceil(8), "trim bitmap")?.to_vec();
        let data_sizes = if sized {
            let nibbles = d.take(data_pages.div_ceil(2), "data page sizes")?;
            let sizes: Vec<u8> = (0..data_pages).map(|i| (nibbles[i / 2] >> (4 * (i % 2)) & 0xF) + 1).collect();
            if sizes.iter().any(|&g| g as u32 > page_grains) {
                return Err(FormatError::Invalid("data page larger than the record's pages".into()));
            }
            Some(sizes)
        } else {
            None
        };
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
                let stored_grains = (high >> (SHARE_GRAIN_BITS - 32)) as u8;
                if stored_grains != 0 && stored_grains as u32 >= page_grains.min(MAX_SIZED_PAGE_GRAINS) {
                    return Err(FormatError::Invalid("share entry's stored page size".into()));
                }
                let high = high & ((1 << (SHARE_GRAIN_BITS - 32)) - 1);
                entries.push(MetaEntry::Share {
                    page,
                    count: crc_or_count as u64 + 1,
                    grain: (high as u64) << 32 | low as u64,
                    seq,
                    stored_grains,
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
            data_sizes,
        };
        if meta.data_pages() != data_pages {
            return Err(FormatError::Invalid("data page count".into()));
        }
        Ok(meta)
    }
}
