//! Every on-disk structure, one file per family (superblock, pool metadata, records,
//! checkpoint, parity buffer), with the limits and the block envelope they share here. Each is
//! self-identifying (magic, format version, pool id) and protected by a crc32c;
//! `docs/DESIGN.md` gives the byte layouts. Decoding treats the bytes as untrusted: all
//! arithmetic is checked and every failure is a [`FormatError`], never a panic.

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
/// ends (so that a restart keeps it in service when it is given again); version 14 sized
/// records (a nibble per data page: a compressed volume's pages differ in size) and the
/// stored sizes of compressed volumes' pages in checkpoints.
pub const FORMAT_VERSION: u32 = 14;
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

mod superblock;
pub use superblock::*;
mod pool_meta;
pub use pool_meta::*;
mod record;
pub use record::*;
mod checkpoint;
pub use checkpoint::*;
mod parity;
pub use parity::*;

/// Seals `block` as each fixed-size on-disk structure in turn (its magic, `version`, a valid
/// checksum over the rest as it is) and decodes it as every one of them, so that the bytes
/// reach the decoders' bodies. For the tests and the fuzzer: whatever the bytes, nothing may
/// panic, overflow or divide by zero (what open computes from a parity header included).
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn decode_every_structure(block: &mut [u8], version: u32, row_grains: u32) {
    if block.len() < 16 {
        return;
    }
    let n = block.len();
    block[8..12].copy_from_slice(&version.to_le_bytes());
    for magic in [
        RECORD_MAGIC,
        SUPERBLOCK_MAGIC,
        POOL_META_MAGIC,
        PARITY_BUFFER_MAGIC,
        PARITY_BANK_MAGIC,
        PARITY_BANK_MAGIC_PACKED,
    ] {
        block[..8].copy_from_slice(magic);
        let c = crc(&block[..n - 4]);
        block[n - 4..].copy_from_slice(&c.to_le_bytes());
        let _ = RecordMeta::decode(block);
        let _ = Superblock::decode(block);
        let _ = PoolMeta::decode(block);
        if let Ok(h) = ParityBufferHeader::decode(block) {
            let _ = (h.entries_per_bank(), h.bank_offset(1), h.descriptor_bytes());
        }
        let _ = ParityBankHeader::decode(block);
    }
    let _ = decode_parity_descriptor(block, row_grains);
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
            data_sizes: None,
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
                    stored_grains: 0,
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
    fn sized_records_carry_each_data_page_size() {
        // Data pages, trims and shares of compressed pages (each share's stored size in its
        // grain field's top byte), until the metadata page is full.
        let mut entries: Vec<MetaEntry> = Vec::new();
        let mut slots = 0;
        for p in 0u64.. {
            let entry = match p % 50 {
                7 => MetaEntry::Trim {
                    page: p,
                    count: 2,
                    seq: p + 1,
                },
                21 => MetaEntry::Share {
                    page: p,
                    count: 4,
                    grain: 0xAB_CDEF_0123_4567 + p,
                    seq: p + 1,
                    stored_grains: (p % 15) as u8,
                },
                _ => MetaEntry::Data {
                    page: p,
                    seq: p + 1,
                    crc: p as u32,
                },
            };
            if slots + entry.slots() as usize > crate::format::sized_meta_entries_per_page(4096) {
                break;
            }
            slots += entry.slots() as usize;
            entries.push(entry);
        }
        assert!(entries
            .iter()
            .any(|e| matches!(e, MetaEntry::Share { stored_grains, .. } if *stored_grains > 1)));
        let data = entries.iter().filter(|e| matches!(e, MetaEntry::Data { .. })).count();
        let sizes: Vec<u8> = (0..data).map(|i| (i % 16 + 1) as u8).collect();
        let meta = RecordMeta {
            pool_id: 1,
            segment: 2,
            incarnation: 3,
            volume_id: 4,
            stream: StreamKind::User(0),
            opened_seq: 5,
            record_id: 6,
            synced_through: 5,
            start_grain: 0,
            page_grains: 16,
            pad_grains: 0,
            entries,
            data_sizes: Some(sizes.clone()),
        };
        let mut block = vec![0u8; 4096];
        meta.encode_into(&mut block);
        let back = RecordMeta::decode(&block).unwrap();
        assert_eq!(back, meta);
        let total: usize = sizes.iter().map(|&g| g as usize).sum();
        assert_eq!(back.data_grains(), Some(total));
        assert_eq!(back.span_grains(), Some(total + 1));
        assert_eq!(back.data_grain(1000, 3), 1000 + 1 + 1 + 2 + 3);
        let layout: Vec<(usize, u32)> = back.data_layout().take(3).collect();
        assert_eq!(layout, vec![(0, 1), (1, 2), (3, 3)]);
        // A size larger than the record's pages is refused, though the page's checksum holds.
        let mut small = meta.clone();
        small.page_grains = 15;
        small.data_sizes = Some(sizes.iter().map(|&g| g.min(15)).collect());
        small.encode_into(&mut block);
        assert!(RecordMeta::decode(&block).is_ok());
        // The page-grains field rewritten and the block re-sealed.
        let with_page_grains = |block: &[u8], field: u32| {
            let mut raw = block.to_vec();
            let at = 8 + 4 + 16 + 4 + 8 + 4 + 1 + 8 + 8 + 8 + 4;
            raw[at..at + 4].copy_from_slice(&field.to_le_bytes());
            let end = raw.len() - 4;
            let crc = crc(&raw[..end]);
            raw[end..].copy_from_slice(&crc.to_le_bytes());
            raw
        };
        // It says 15 with the sized flag; 3 is smaller than its data pages.
        assert!(RecordMeta::decode(&with_page_grains(&block, 3 | crate::format::SIZED_RECORD)).is_err());
        // A share of pages stored in 3 grains is refused in a record of 3-grain pages (a page
        // stored whole is size 0) and read in one of 4-grain pages.
        let share = RecordMeta {
            page_grains: 4,
            data_sizes: None,
            entries: vec![MetaEntry::Share {
                page: 9,
                count: 2,
                grain: 77,
                seq: 8,
                stored_grains: 3,
            }],
            ..meta.clone()
        };
        share.encode_into(&mut block);
        assert_eq!(RecordMeta::decode(&block).unwrap(), share);
        let err = RecordMeta::decode(&with_page_grains(&block, 3)).unwrap_err();
        assert!(err.to_string().contains("stored page size"), "{err}");
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
            data_sizes: None,
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
            data_sizes: None,
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
            let row_grains = rng.gen_range(0..=MAX_PARITY_ROW_GRAINS + 8);
            decode_every_structure(&mut block, FORMAT_VERSION, row_grains);
        }
    }
}
