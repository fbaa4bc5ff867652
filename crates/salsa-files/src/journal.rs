//! The journal of the file table on the volume: segments 0 and 1 in turn. A journal segment
//! starts with a snapshot of the whole table and continues with the changes made since, in
//! batches of whole pages (each ended by a commit record and applied at replay only whole),
//! each batch made durable by a volume flush before the change it
//! carries is acted on (a deleted file's segments are trimmed only after its deletion is
//! durable). When a batch does not fit, the other segment is trimmed and starts again with a
//! snapshot of a higher generation; once that is durable, the old segment is trimmed.
//!
//! Open takes the valid snapshot with the highest generation and replays the records after it
//! while their sequence numbers follow on; the first record that is torn, damaged or out of
//! sequence ends the journal. A journal that ended before its segment's write point (a torn
//! batch) is rolled into the other segment at once, so that later batches are never written
//! behind bytes a replay stops at.

use crate::error::{Error, Result};
use crate::record::{parse_at, Parsed, Record, Snapshot};
use crate::table::Table;
use salsa_core::frontend::BlockVolume;

/// Where the journal stands.
#[derive(Debug)]
pub struct Journal {
    /// The journal segment written now (0 or 1).
    segment: u64,
    /// Bytes written into it.
    write_point: u64,
    generation: u64,
    next_seq: u64,
    /// Changes applied to the table and not yet written.
    pending: Vec<Record>,
    segment_bytes: u64,
    page_bytes: u64,
}

/// What open found in one journal segment.
struct Found {
    segment: u64,
    write_point: u64,
    bytes: Vec<u8>,
    snapshot: Snapshot,
    seq: u64,
    next: usize,
}

impl Journal {
    /// An empty journal, before the first snapshot ([`Journal::roll`] writes it into segment 0).
    fn empty(segment_bytes: u64, page_bytes: u64) -> Journal {
        Journal {
            segment: 1,
            write_point: 0,
            generation: 0,
            next_seq: 1,
            pending: Vec::new(),
            segment_bytes,
            page_bytes,
        }
    }

    /// Reads the journal of `volume` into `table`. `Ok(None)` when the volume is blank (both
    /// journal segments empty), so the caller decides whether to make a new store.
    pub fn open(volume: &dyn BlockVolume, table: &mut Table, segment_bytes: u64) -> Result<Option<Journal>> {
        let Some((mut journal, torn)) = Self::read(volume, table, segment_bytes)? else {
            return Ok(None);
        };
        if torn {
            tracing::warn!(
                "file table journal ends before byte {} written (a torn batch); starting a new journal segment",
                journal.write_point
            );
            journal.roll(volume, table)?;
        }
        Ok(Some(journal))
    }

    /// Reads the journal into `table` and writes nothing: the journal's place, and whether it
    /// ended before its segment's write point (a torn batch, which [`Journal::open`] rolls
    /// away). `Ok(None)` for a blank volume.
    pub fn read(volume: &dyn BlockVolume, table: &mut Table, segment_bytes: u64) -> Result<Option<(Journal, bool)>> {
        let page_bytes = volume.page_bytes() as u64;
        let mut best: Option<Found> = None;
        let mut written = false;
        for segment in 0..2 {
            let write_point = volume.write_point(segment)?;
            if write_point == 0 {
                continue;
            }
            written = true;
            let mut bytes = vec![0u8; write_point as usize];
            volume.read(segment * segment_bytes, &mut bytes)?;
            if let Parsed::Record {
                seq,
                record: Record::Snapshot(snapshot),
                next,
            } = parse_at(&bytes, 0)
            {
                if best.as_ref().is_none_or(|b| snapshot.generation > b.snapshot.generation) {
                    best = Some(Found {
                        segment,
                        write_point,
                        bytes,
                        snapshot,
                        seq,
                        next,
                    });
                }
            }
        }
        let Some(found) = best else {
            if written {
                return Err(Error::Foreign(volume.name().to_string()));
            }
            return Ok(None);
        };
        table.apply(&Record::Snapshot(found.snapshot.clone()))?;
        // `pos` and `seq`: where the last whole batch ended; `batch`: the records read since.
        let (mut pos, mut seq) = (found.next, found.seq);
        let (mut at, mut at_seq, mut batch) = (pos, seq, Vec::new());
        loop {
            match parse_at(&found.bytes, at) {
                Parsed::Record {
                    seq: s,
                    record: Record::Commit,
                    next,
                } if s == at_seq + 1 => {
                    for (s, record) in batch.drain(..) {
                        table
                            .apply(&record)
                            .map_err(|e| Error::Corrupt(format!("journal record {s} does not apply: {e}")))?;
                    }
                    (at, at_seq) = (next, s);
                    (pos, seq) = (at, at_seq);
                }
                Parsed::Record { seq: s, record, next } if s == at_seq + 1 && !matches!(record, Record::Snapshot(_)) => {
                    batch.push((s, record));
                    (at, at_seq) = (next, s);
                }
                Parsed::Padding if batch.is_empty() => {
                    at = (at as u64 + 1).next_multiple_of(page_bytes) as usize;
                    pos = at;
                }
                _ => break,
            }
        }
        let end = (pos as u64).next_multiple_of(page_bytes);
        let journal = Journal {
            segment: found.segment,
            write_point: found.write_point,
            generation: found.snapshot.generation,
            next_seq: seq + 1,
            pending: Vec::new(),
            segment_bytes,
            page_bytes,
        };
        Ok(Some((journal, end < found.write_point)))
    }

    /// A new store's journal: the empty table's snapshot, durable.
    pub fn create(volume: &dyn BlockVolume, table: &Table, segment_bytes: u64) -> Result<Journal> {
        let mut journal = Journal::empty(segment_bytes, volume.page_bytes() as u64);
        journal.roll(volume, table)?;
        Ok(journal)
    }

    /// Queues a change already applied to the table.
    pub fn push(&mut self, record: Record) {
        self.pending.push(record);
    }

    /// Whether changes wait to be written.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Writes the queued changes and makes them durable (rolling to the other segment when
    /// they do not fit).
    pub fn commit(&mut self, volume: &dyn BlockVolume, table: &Table) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let mut bytes = Vec::new();
        let mut seq = self.next_seq;
        for record in self.pending.iter().chain([&Record::Commit]) {
            record.encode(seq, &mut bytes);
            seq += 1;
        }
        let padded = (bytes.len() as u64).next_multiple_of(self.page_bytes);
        if self.write_point + padded > self.segment_bytes {
            return self.roll(volume, table);
        }
        bytes.resize(padded as usize, 0);
        // Every data write a batch's extents describe returned before its record was queued,
        // so one flush here makes them durable before the journal says they exist.
        if self.pending.iter().any(|r| matches!(r, Record::Extents { .. })) {
            volume.flush()?;
        }
        volume.append(self.segment, &bytes)?;
        volume.flush()?;
        self.write_point += padded;
        self.next_seq = seq;
        self.pending.clear();
        Ok(())
    }

    /// Starts the other journal segment with a snapshot of `table` (which holds every queued
    /// change), then trims the old one.
    pub fn roll(&mut self, volume: &dyn BlockVolume, table: &Table) -> Result<()> {
        let other = 1 - self.segment;
        let generation = self.generation + 1;
        let mut bytes = Vec::new();
        Record::Snapshot(table.snapshot(generation)).encode(self.next_seq, &mut bytes);
        let padded = (bytes.len() as u64).next_multiple_of(self.page_bytes);
        if padded > self.segment_bytes {
            return Err(Error::NoSpace(format!(
                "the file table takes {padded} bytes, more than a journal segment of {} bytes: use larger segments",
                self.segment_bytes
            )));
        }
        bytes.resize(padded as usize, 0);
        // As a batch: the extents the snapshot lists are durable data before it is written.
        volume.flush()?;
        volume.trim(other * self.segment_bytes, self.segment_bytes)?;
        volume.append(other, &bytes)?;
        volume.flush()?;
        // The new snapshot is durable and of a higher generation: the old segment is no longer
        // read at open, and is emptied for its next turn.
        if self.generation > 0 {
            volume.trim(self.segment * self.segment_bytes, self.segment_bytes)?;
        }
        self.segment = other;
        self.write_point = padded;
        self.generation = generation;
        self.next_seq += 1;
        self.pending.clear();
        Ok(())
    }

    /// The journal segment written now, its bytes written and the generation.
    pub fn position(&self) -> (u64, u64, u64) {
        (self.segment, self.write_point, self.generation)
    }
}
