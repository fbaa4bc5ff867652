//! The file table in memory: files (name, extents, size, time), directories, and which volume
//! segment each file owns. Every change is a [`Record`] applied here, the same way when it is
//! made and when the journal is replayed at open, so the table after a replay is the table the
//! journal describes.
//!
//! Invariants (checked on every apply): a segment belongs to at most one file and never to the
//! journal's two; every extent lies inside one segment of the volume; a name names at most one
//! file; file ids only grow. A change that would break one is refused and changes nothing.

use crate::error::{Error, Result};
use crate::record::{push_extent, Extent, FileEntry, Record, Snapshot};
use std::collections::{BTreeMap, BTreeSet};

/// Volume segments the journal uses (0 and 1, alternately); files start at this one.
pub const JOURNAL_SEGMENTS: u64 = 2;

/// What a file holds, by its name as RocksDB names its files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A write-ahead log (`*.log`).
    Wal,
    /// A table or blob file (`*.sst`, `*.blob`).
    Sst,
    /// `MANIFEST-*`.
    Manifest,
    /// Everything else (`CURRENT`, `OPTIONS-*`, `LOG`, `IDENTITY`, `LOCK`, ...).
    Other,
}

impl FileKind {
    pub const ALL: [FileKind; 4] = [FileKind::Wal, FileKind::Sst, FileKind::Manifest, FileKind::Other];

    pub fn of(name: &str) -> FileKind {
        let base = name.rsplit('/').next().unwrap_or(name);
        if base.ends_with(".log") {
            FileKind::Wal
        } else if base.ends_with(".sst") || base.ends_with(".blob") {
            FileKind::Sst
        } else if base.starts_with("MANIFEST") {
            FileKind::Manifest
        } else {
            FileKind::Other
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FileKind::Wal => "wal",
            FileKind::Sst => "sst",
            FileKind::Manifest => "manifest",
            FileKind::Other => "other",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One file.
#[derive(Debug, Clone)]
pub struct File {
    pub name: String,
    pub mtime_secs: u64,
    pub extents: Vec<Extent>,
    pub size: u64,
    /// Segments it owns: those its extents lie in, and the one a writer took and has not
    /// written yet.
    pub segments: BTreeSet<u64>,
}

/// Per file kind: what the table holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KindStats {
    pub files: u64,
    pub bytes: u64,
    pub segments: u64,
    /// Segments trimmed whole since the store was made (a file deleted or replaced).
    pub segments_trimmed: u64,
}

/// The file table.
#[derive(Debug)]
pub struct Table {
    segment_bytes: u64,
    total_segments: u64,
    files: BTreeMap<u64, File>,
    names: BTreeMap<String, u64>,
    dirs: BTreeSet<String>,
    next_file_id: u64,
    owner: BTreeMap<u64, u64>,
    trimmed_segments: [u64; 4],
}

impl Table {
    pub fn new(segment_bytes: u64, total_segments: u64) -> Table {
        Table {
            segment_bytes,
            total_segments,
            files: BTreeMap::new(),
            names: BTreeMap::new(),
            dirs: BTreeSet::new(),
            next_file_id: 1,
            owner: BTreeMap::new(),
            trimmed_segments: [0; 4],
        }
    }

    pub fn file(&self, id: u64) -> Option<&File> {
        self.files.get(&id)
    }

    pub fn id_of(&self, name: &str) -> Option<u64> {
        self.names.get(name).copied()
    }

    pub fn is_dir(&self, name: &str) -> bool {
        self.dirs.contains(name)
    }

    pub fn next_file_id(&self) -> u64 {
        self.next_file_id
    }

    /// The segment's owner, if any file owns it.
    pub fn owner_of(&self, segment: u64) -> Option<u64> {
        self.owner.get(&segment).copied()
    }

    /// The names directly under directory `dir` (files and directories), without the prefix.
    pub fn children(&self, dir: &str) -> Vec<String> {
        let prefix = if dir.is_empty() || dir.ends_with('/') {
            dir.to_string()
        } else {
            format!("{dir}/")
        };
        let mut out = BTreeSet::new();
        for name in self.names.keys().chain(self.dirs.iter()) {
            if let Some(rest) = name.strip_prefix(&prefix) {
                if !rest.is_empty() {
                    out.insert(rest.split('/').next().unwrap_or(rest).to_string());
                }
            }
        }
        out.into_iter().collect()
    }

    /// Takes the lowest free segment for file `id` (a writer's next segment).
    pub fn take_segment(&mut self, id: u64) -> Result<u64> {
        let file = self.files.get_mut(&id).ok_or_else(|| Error::NotFound(format!("file {id}")))?;
        let mut candidate = JOURNAL_SEGMENTS;
        for (&s, _) in self.owner.range(JOURNAL_SEGMENTS..) {
            if s != candidate {
                break;
            }
            candidate += 1;
        }
        if candidate >= self.total_segments {
            return Err(Error::NoSpace(format!(
                "all {} file segments of the volume are in use; delete files or grow the volume",
                self.total_segments - JOURNAL_SEGMENTS
            )));
        }
        self.owner.insert(candidate, id);
        file.segments.insert(candidate);
        Ok(candidate)
    }

    /// Applies one change; returns the segments it freed (to be trimmed once it is durable).
    pub fn apply(&mut self, record: &Record) -> Result<Vec<u64>> {
        match record {
            Record::Snapshot(s) => {
                self.load(s)?;
                Ok(Vec::new())
            }
            Record::Create { id, name, mtime_secs } => {
                check_name(name)?;
                if *id < self.next_file_id || self.files.contains_key(id) {
                    return Err(Error::Corrupt(format!("file id {id} reused (next is {})", self.next_file_id)));
                }
                let freed = match self.names.get(name) {
                    Some(&old) => self.remove(old),
                    None => Vec::new(),
                };
                self.next_file_id = id + 1;
                self.names.insert(name.clone(), *id);
                let file = File {
                    name: name.clone(),
                    mtime_secs: *mtime_secs,
                    extents: Vec::new(),
                    size: 0,
                    segments: BTreeSet::new(),
                };
                self.files.insert(*id, file);
                Ok(freed)
            }
            Record::Extents { id, extents, mtime_secs } => {
                for e in extents {
                    let segment = self.segment_of(e)?;
                    if let Some(&other) = self.owner.get(&segment) {
                        if other != *id {
                            return Err(Error::Corrupt(format!("segment {segment} of file {id} belongs to file {other}")));
                        }
                    }
                }
                let file = self
                    .files
                    .get_mut(id)
                    .ok_or_else(|| Error::Corrupt(format!("extents of unknown file {id}")))?;
                for e in extents {
                    let segment = e.offset / self.segment_bytes;
                    self.owner.insert(segment, *id);
                    file.segments.insert(segment);
                    file.size += e.len;
                    push_extent(&mut file.extents, *e, self.segment_bytes);
                }
                file.mtime_secs = *mtime_secs;
                Ok(Vec::new())
            }
            Record::Rename { id, to } => {
                check_name(to)?;
                let from = self
                    .files
                    .get(id)
                    .ok_or_else(|| Error::NotFound(format!("file {id}")))?
                    .name
                    .clone();
                let freed = match self.names.get(to) {
                    Some(&old) if old != *id => self.remove(old),
                    _ => Vec::new(),
                };
                self.names.remove(&from);
                self.names.insert(to.clone(), *id);
                if let Some(f) = self.files.get_mut(id) {
                    f.name = to.clone();
                }
                Ok(freed)
            }
            Record::Delete { id } => {
                if !self.files.contains_key(id) {
                    return Err(Error::NotFound(format!("file {id}")));
                }
                Ok(self.remove(*id))
            }
            Record::CreateDir { name } => {
                check_name(name)?;
                self.dirs.insert(name.clone());
                Ok(Vec::new())
            }
            Record::DeleteDir { name } => {
                self.dirs.remove(name);
                Ok(Vec::new())
            }
            Record::Commit => Ok(Vec::new()),
        }
    }

    /// The segment an extent lies in, refusing one outside the file segments or across two.
    fn segment_of(&self, e: &Extent) -> Result<u64> {
        let segment = e.offset / self.segment_bytes;
        let end = e
            .offset
            .checked_add(e.len)
            .ok_or_else(|| Error::Corrupt("extent past 2^64".into()))?;
        if segment < JOURNAL_SEGMENTS || segment >= self.total_segments || e.len == 0 || end > (segment + 1) * self.segment_bytes {
            return Err(Error::Corrupt(format!(
                "extent of {} bytes at {} is not inside one file segment of {} bytes",
                e.len, e.offset, self.segment_bytes
            )));
        }
        Ok(segment)
    }

    /// Removes file `id`; returns its segments and counts them as trimmed.
    fn remove(&mut self, id: u64) -> Vec<u64> {
        let Some(file) = self.files.remove(&id) else { return Vec::new() };
        self.names.remove(&file.name);
        for s in &file.segments {
            self.owner.remove(s);
        }
        self.trimmed_segments[FileKind::of(&file.name).index()] += file.segments.len() as u64;
        file.segments.into_iter().collect()
    }

    /// Gives back a segment a writer took and never wrote (its file is gone or it failed).
    pub fn release_segment(&mut self, id: u64, segment: u64) {
        if self.owner.get(&segment) == Some(&id) {
            self.owner.remove(&segment);
        }
        if let Some(f) = self.files.get_mut(&id) {
            f.segments.remove(&segment);
        }
    }

    fn load(&mut self, s: &Snapshot) -> Result<()> {
        let mut fresh = Table::new(self.segment_bytes, self.total_segments);
        fresh.trimmed_segments = s.trimmed_segments;
        for d in &s.dirs {
            fresh.apply(&Record::CreateDir { name: d.clone() })?;
        }
        for f in &s.files {
            if fresh.names.contains_key(&f.name) {
                return Err(Error::Corrupt(format!("snapshot names {} twice", f.name)));
            }
            fresh.apply(&Record::Create {
                id: f.id,
                name: f.name.clone(),
                mtime_secs: f.mtime_secs,
            })?;
            fresh.apply(&Record::Extents {
                id: f.id,
                extents: f.extents.clone(),
                mtime_secs: f.mtime_secs,
            })?;
        }
        if s.next_file_id < fresh.next_file_id {
            return Err(Error::Corrupt(format!(
                "snapshot's next file id {} is not above its files",
                s.next_file_id
            )));
        }
        fresh.next_file_id = s.next_file_id;
        *self = fresh;
        Ok(())
    }

    /// The whole table as a snapshot of `generation`.
    pub fn snapshot(&self, generation: u64) -> Snapshot {
        Snapshot {
            generation,
            next_file_id: self.next_file_id,
            dirs: self.dirs.iter().cloned().collect(),
            files: self
                .files
                .iter()
                .map(|(&id, f)| FileEntry {
                    id,
                    name: f.name.clone(),
                    mtime_secs: f.mtime_secs,
                    extents: f.extents.clone(),
                })
                .collect(),
            trimmed_segments: self.trimmed_segments,
        }
    }

    /// Per file kind: files, bytes, segments owned and segments trimmed.
    pub fn stats(&self) -> [(FileKind, KindStats); 4] {
        let mut out = FileKind::ALL.map(|k| {
            (
                k,
                KindStats {
                    segments_trimmed: self.trimmed_segments[k.index()],
                    ..KindStats::default()
                },
            )
        });
        for f in self.files.values() {
            let s = &mut out[FileKind::of(&f.name).index()].1;
            s.files += 1;
            s.bytes += f.size;
            s.segments += f.segments.len() as u64;
        }
        out
    }
}

/// A file or directory name: non-empty, at most [`crate::record::MAX_NAME_BYTES`], no NUL.
pub fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > crate::record::MAX_NAME_BYTES || name.contains('\0') {
        return Err(Error::InvalidName(name.chars().take(80).collect()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEG: u64 = 1 << 20;

    fn table() -> Table {
        Table::new(SEG, 10)
    }

    #[test]
    fn extents_claim_their_segments_and_a_delete_frees_them() {
        let mut t = table();
        t.apply(&Record::Create {
            id: 1,
            name: "db/1.sst".into(),
            mtime_secs: 0,
        })
        .unwrap();
        let s = t.take_segment(1).unwrap();
        assert_eq!(s, JOURNAL_SEGMENTS);
        let e = |offset, len| Extent { offset, len };
        t.apply(&Record::Extents {
            id: 1,
            extents: vec![e(s * SEG, 4096), e(s * SEG + 4096, 100)],
            mtime_secs: 1,
        })
        .unwrap();
        assert_eq!(t.file(1).unwrap().extents, vec![e(s * SEG, 4196)]);
        t.apply(&Record::Create {
            id: 2,
            name: "db/2.log".into(),
            mtime_secs: 0,
        })
        .unwrap();
        // Another file's segment is refused, and nothing changes.
        assert!(t
            .apply(&Record::Extents {
                id: 2,
                extents: vec![e(s * SEG + 8192, 10)],
                mtime_secs: 1
            })
            .is_err());
        assert_eq!(t.file(2).unwrap().size, 0);
        // Across a segment boundary, or in the journal's segments: refused.
        assert!(t
            .apply(&Record::Extents {
                id: 2,
                extents: vec![e(4 * SEG - 10, 20)],
                mtime_secs: 1
            })
            .is_err());
        assert!(t
            .apply(&Record::Extents {
                id: 2,
                extents: vec![e(SEG, 20)],
                mtime_secs: 1
            })
            .is_err());
        assert_eq!(t.apply(&Record::Delete { id: 1 }).unwrap(), vec![s]);
        assert_eq!(t.owner_of(s), None);
        assert_eq!(t.stats()[1].1.segments_trimmed, 1);
    }

    #[test]
    fn rename_over_a_file_replaces_it_and_a_snapshot_loads_back_the_same_table() {
        let mut t = table();
        t.apply(&Record::CreateDir { name: "db".into() }).unwrap();
        t.apply(&Record::Create {
            id: 1,
            name: "db/CURRENT".into(),
            mtime_secs: 0,
        })
        .unwrap();
        let a = t.take_segment(1).unwrap();
        t.apply(&Record::Extents {
            id: 1,
            extents: vec![Extent { offset: a * SEG, len: 16 }],
            mtime_secs: 0,
        })
        .unwrap();
        t.apply(&Record::Create {
            id: 2,
            name: "db/CURRENT.tmp".into(),
            mtime_secs: 0,
        })
        .unwrap();
        assert_eq!(
            t.apply(&Record::Rename {
                id: 2,
                to: "db/CURRENT".into()
            })
            .unwrap(),
            vec![a]
        );
        assert_eq!(t.id_of("db/CURRENT"), Some(2));
        assert_eq!(t.children("db"), vec!["CURRENT".to_string()]);
        assert_eq!(t.children(""), vec!["db".to_string()]);
        let snap = t.snapshot(3);
        let mut back = table();
        back.apply(&Record::Snapshot(snap.clone())).unwrap();
        assert_eq!(back.snapshot(3), snap);
        // Ids only grow.
        assert!(back
            .apply(&Record::Create {
                id: 2,
                name: "x".into(),
                mtime_secs: 0
            })
            .is_err());
    }
}
