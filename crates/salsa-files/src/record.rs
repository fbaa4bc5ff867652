//! The file table's journal records, without I/O: how each change to the table is encoded, and
//! how a journal segment's bytes are parsed back. Bytes read from a device are untrusted, so
//! decoding uses checked arithmetic and bounds every count; it never panics (property-tested
//! with arbitrary bytes).
//!
//! A record: magic `SFJ1` (u32), kind (u8), payload length (u32), sequence number (u64), the
//! payload, and a crc32c of everything before it (u32). All integers little-endian. Records are
//! appended in batches of whole pages, each batch ended by a [`Record::Commit`]; the zeros that pad a batch to its page end are skipped
//! at replay (a page boundary follows), and replay stops at the first record that is not whole
//! and valid: what a crash left torn.

use crate::error::{Error, Result};

/// Marks a record's start ("SFJ1").
pub const RECORD_MAGIC: u32 = 0x314A_4653;
/// Bytes before a record's payload: magic, kind, length, sequence number.
pub const HEADER_BYTES: usize = 4 + 1 + 4 + 8;
/// Bytes after its payload: the crc.
pub const TRAILER_BYTES: usize = 4;
/// Longest file name (a path inside the store), in bytes.
pub const MAX_NAME_BYTES: usize = 4096;
/// Most extents one record carries.
pub const MAX_RECORD_EXTENTS: usize = 1 << 20;
/// Most files and directories a snapshot lists.
pub const MAX_SNAPSHOT_ENTRIES: usize = 1 << 20;

/// A run of a file's bytes on the volume: `len` bytes from volume offset `offset`. An extent
/// starts on a page; only a file's last write before a sync ends inside a page (the rest of
/// that page is padding, and the file's next bytes start a new extent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
}

/// Appends `next` to a file's extents in `list`: merged into the last one when it continues it
/// on the volume inside the same segment of `segment_bytes` (a file's next segment may follow
/// its last, but an extent never spans two), else as a new one. The writer and the table both
/// build extents this way, so a replayed journal gives the table the writer had.
pub fn push_extent(list: &mut Vec<Extent>, next: Extent, segment_bytes: u64) {
    match list.last_mut() {
        Some(last) if last.offset + last.len == next.offset && last.offset / segment_bytes == next.offset / segment_bytes => {
            last.len += next.len
        }
        _ => list.push(next),
    }
}

/// A file as a snapshot lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    pub id: u64,
    pub name: String,
    pub mtime_secs: u64,
    pub extents: Vec<Extent>,
}

/// The whole table, written at the start of a journal segment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    /// Which use of a journal segment this is: the valid snapshot with the highest wins.
    pub generation: u64,
    pub next_file_id: u64,
    pub dirs: Vec<String>,
    pub files: Vec<FileEntry>,
    /// Segments trimmed since the store was made, per file kind ([`crate::FileKind::ALL`]).
    pub trimmed_segments: [u64; 4],
}

/// One change to the file table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Snapshot(Snapshot),
    Create {
        id: u64,
        name: String,
        mtime_secs: u64,
    },
    /// Bytes appended to file `id`, as extents in file order.
    Extents {
        id: u64,
        extents: Vec<Extent>,
        mtime_secs: u64,
    },
    /// File `id` takes name `to`; a file that had that name is deleted.
    Rename {
        id: u64,
        to: String,
    },
    Delete {
        id: u64,
    },
    CreateDir {
        name: String,
    },
    DeleteDir {
        name: String,
    },
    /// Ends a batch: replay applies a batch's records only once it reads this, so a batch a
    /// crash tore applies whole or not at all.
    Commit,
}

impl Record {
    fn kind(&self) -> u8 {
        match self {
            Record::Snapshot(_) => 1,
            Record::Create { .. } => 2,
            Record::Extents { .. } => 3,
            Record::Rename { .. } => 4,
            Record::Delete { .. } => 5,
            Record::CreateDir { .. } => 6,
            Record::DeleteDir { .. } => 7,
            Record::Commit => 8,
        }
    }

    /// Appends the record, with sequence number `seq`, to `out`.
    pub fn encode(&self, seq: u64, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&RECORD_MAGIC.to_le_bytes());
        out.push(self.kind());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&seq.to_le_bytes());
        let body = out.len();
        self.encode_payload(out);
        let len = (out.len() - body) as u32;
        out[start + 5..start + 9].copy_from_slice(&len.to_le_bytes());
        let crc = crc32c::crc32c(&out[start..]);
        out.extend_from_slice(&crc.to_le_bytes());
    }

    fn encode_payload(&self, out: &mut Vec<u8>) {
        match self {
            Record::Snapshot(s) => {
                put_u64(out, s.generation);
                put_u64(out, s.next_file_id);
                for t in s.trimmed_segments {
                    put_u64(out, t);
                }
                put_u32(out, s.dirs.len() as u32);
                for d in &s.dirs {
                    put_str(out, d);
                }
                put_u32(out, s.files.len() as u32);
                for f in &s.files {
                    put_u64(out, f.id);
                    put_str(out, &f.name);
                    put_u64(out, f.mtime_secs);
                    put_extents(out, &f.extents);
                }
            }
            Record::Create { id, name, mtime_secs } => {
                put_u64(out, *id);
                put_str(out, name);
                put_u64(out, *mtime_secs);
            }
            Record::Extents { id, extents, mtime_secs } => {
                put_u64(out, *id);
                put_u64(out, *mtime_secs);
                put_extents(out, extents);
            }
            Record::Rename { id, to } => {
                put_u64(out, *id);
                put_str(out, to);
            }
            Record::Delete { id } => put_u64(out, *id),
            Record::CreateDir { name } | Record::DeleteDir { name } => put_str(out, name),
            Record::Commit => {}
        }
    }
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u32(out, s.len() as u32);
    out.extend_from_slice(s.as_bytes());
}

fn put_extents(out: &mut Vec<u8>, extents: &[Extent]) {
    put_u32(out, extents.len() as u32);
    for e in extents {
        put_u64(out, e.offset);
        put_u64(out, e.len);
    }
}

/// Reads fields from a payload; every read is bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if self.bytes.len() < n {
            return Err(Error::Corrupt(format!("journal record: {what} cut short")));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn count(&mut self, max: usize, what: &str) -> Result<usize> {
        let n = self.u32(what)? as usize;
        if n > max {
            return Err(Error::Corrupt(format!("journal record: {n} {what}, at most {max}")));
        }
        Ok(n)
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.count(MAX_NAME_BYTES, what)?;
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| Error::Corrupt(format!("journal record: {what} is not UTF-8")))
    }

    fn extents(&mut self) -> Result<Vec<Extent>> {
        let n = self.count(MAX_RECORD_EXTENTS, "extents")?;
        // Each extent is 16 bytes: a count larger than the bytes left is damage, refused before
        // anything is allocated for it.
        if n.checked_mul(16).is_none_or(|b| b > self.bytes.len()) {
            return Err(Error::Corrupt("journal record: extents cut short".into()));
        }
        (0..n)
            .map(|_| {
                let offset = self.u64("extent offset")?;
                let len = self.u64("extent length")?;
                offset
                    .checked_add(len)
                    .ok_or_else(|| Error::Corrupt("journal record: extent past 2^64".into()))?;
                Ok(Extent { offset, len })
            })
            .collect()
    }

    fn finish(self, what: &str) -> Result<()> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(Error::Corrupt(format!(
                "journal record: {} bytes after the {what}",
                self.bytes.len()
            )))
        }
    }
}

fn decode_payload(kind: u8, payload: &[u8]) -> Result<Record> {
    let mut r = Reader { bytes: payload };
    let record = match kind {
        1 => {
            let generation = r.u64("generation")?;
            let next_file_id = r.u64("next file id")?;
            let mut trimmed_segments = [0u64; 4];
            for t in trimmed_segments.iter_mut() {
                *t = r.u64("trimmed segments")?;
            }
            let n = r.count(MAX_SNAPSHOT_ENTRIES, "directories")?;
            let dirs = (0..n).map(|_| r.string("directory name")).collect::<Result<_>>()?;
            let n = r.count(MAX_SNAPSHOT_ENTRIES, "files")?;
            let files = (0..n)
                .map(|_| {
                    Ok(FileEntry {
                        id: r.u64("file id")?,
                        name: r.string("file name")?,
                        mtime_secs: r.u64("mtime")?,
                        extents: r.extents()?,
                    })
                })
                .collect::<Result<_>>()?;
            Record::Snapshot(Snapshot {
                generation,
                next_file_id,
                dirs,
                files,
                trimmed_segments,
            })
        }
        2 => Record::Create {
            id: r.u64("file id")?,
            name: r.string("file name")?,
            mtime_secs: r.u64("mtime")?,
        },
        3 => {
            let id = r.u64("file id")?;
            let mtime_secs = r.u64("mtime")?;
            Record::Extents {
                id,
                extents: r.extents()?,
                mtime_secs,
            }
        }
        4 => Record::Rename {
            id: r.u64("file id")?,
            to: r.string("new name")?,
        },
        5 => Record::Delete { id: r.u64("file id")? },
        6 => Record::CreateDir {
            name: r.string("directory name")?,
        },
        7 => Record::DeleteDir {
            name: r.string("directory name")?,
        },
        8 => Record::Commit,
        other => return Err(Error::Corrupt(format!("journal record of unknown kind {other}"))),
    };
    r.finish("record")?;
    Ok(record)
}

/// What [`parse_at`] found at a position of a journal segment.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A whole, valid record with its sequence number, and the position after it.
    Record { seq: u64, record: Record, next: usize },
    /// Zeros where a record would start: the padding of a batch; the next batch starts at the
    /// next page.
    Padding,
    /// Anything else: the end of what the journal holds (never written, or torn).
    End,
}

/// Parses the record at `pos` of `bytes` (a journal segment's written part).
pub fn parse_at(bytes: &[u8], pos: usize) -> Parsed {
    let Some(header) = pos.checked_add(HEADER_BYTES).and_then(|end| bytes.get(pos..end)) else {
        return Parsed::End;
    };
    let magic = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    if magic == 0 {
        return Parsed::Padding;
    }
    if magic != RECORD_MAGIC {
        return Parsed::End;
    }
    let kind = header[4];
    let len = u32::from_le_bytes([header[5], header[6], header[7], header[8]]) as usize;
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&header[9..17]);
    let seq = u64::from_le_bytes(seq);
    let Some(end) = (pos + HEADER_BYTES).checked_add(len).and_then(|e| e.checked_add(TRAILER_BYTES)) else {
        return Parsed::End;
    };
    let Some(whole) = bytes.get(pos..end) else {
        return Parsed::End;
    };
    let (covered, crc) = whole.split_at(whole.len() - TRAILER_BYTES);
    if crc32c::crc32c(covered) != u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]) {
        return Parsed::End;
    }
    match decode_payload(kind, &covered[HEADER_BYTES..]) {
        Ok(record) => Parsed::Record { seq, record, next: end },
        Err(_) => Parsed::End,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn samples() -> Vec<Record> {
        let e = |offset, len| Extent { offset, len };
        vec![
            Record::Snapshot(Snapshot {
                generation: 7,
                next_file_id: 12,
                dirs: vec!["db".into(), "db/archive".into()],
                files: vec![FileEntry {
                    id: 3,
                    name: "db/000003.log".into(),
                    mtime_secs: 99,
                    extents: vec![e(8192, 5000)],
                }],
                trimmed_segments: [1, 2, 3, 4],
            }),
            Record::Create {
                id: 4,
                name: "db/MANIFEST-000004".into(),
                mtime_secs: 1,
            },
            Record::Extents {
                id: 4,
                extents: vec![e(0, 4096), e(16384, 10)],
                mtime_secs: 2,
            },
            Record::Rename {
                id: 4,
                to: "db/CURRENT".into(),
            },
            Record::Delete { id: 4 },
            Record::CreateDir { name: "db".into() },
            Record::DeleteDir { name: "db".into() },
            Record::Commit,
        ]
    }

    #[test]
    fn every_record_reads_back_as_written() {
        let mut bytes = Vec::new();
        let mut ends = Vec::new();
        for (seq, r) in samples().iter().enumerate() {
            r.encode(seq as u64 + 100, &mut bytes);
            ends.push(bytes.len());
        }
        let mut pos = 0;
        for (i, r) in samples().into_iter().enumerate() {
            assert_eq!(
                parse_at(&bytes, pos),
                Parsed::Record {
                    seq: i as u64 + 100,
                    record: r,
                    next: ends[i]
                }
            );
            pos = ends[i];
        }
        assert_eq!(parse_at(&bytes, pos), Parsed::End);
    }

    #[test]
    fn a_torn_or_damaged_record_ends_the_journal_and_zeros_are_padding() {
        let mut bytes = Vec::new();
        Record::Create {
            id: 1,
            name: "a".into(),
            mtime_secs: 0,
        }
        .encode(1, &mut bytes);
        let whole = bytes.len();
        assert_eq!(parse_at(&bytes[..whole - 1], 0), Parsed::End);
        for i in 0..whole {
            let mut damaged = bytes.clone();
            damaged[i] ^= 0x10;
            assert!(
                !matches!(parse_at(&damaged, 0), Parsed::Record { .. }),
                "flip at byte {i} went unnoticed"
            );
        }
        assert_eq!(parse_at(&[0u8; 64], 0), Parsed::Padding);
    }

    proptest! {
        #[test]
        fn parsing_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512), pos in 0usize..600) {
            let _ = parse_at(&bytes, pos);
        }

        #[test]
        fn a_valid_envelope_around_arbitrary_payload_never_panics(kind in 0u8..9, payload in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut bytes = Vec::new();
            bytes.extend_from_slice(&RECORD_MAGIC.to_le_bytes());
            bytes.push(kind);
            bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            bytes.extend_from_slice(&5u64.to_le_bytes());
            bytes.extend_from_slice(&payload);
            let crc = crc32c::crc32c(&bytes);
            bytes.extend_from_slice(&crc.to_le_bytes());
            let _ = parse_at(&bytes, 0);
        }
    }
}
