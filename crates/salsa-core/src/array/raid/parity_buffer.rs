//! The persistent parity buffer of a RAID-5 array: a small device (on real hardware NVM, an
//! NVMe PMR or a small SSD partition; any file or block device here) that keeps the parity of
//! the rows being filled across a flush, so that a flush in the middle of a row neither pads
//! the log to the row's end nor writes parity in place.
//!
//! Owns: the buffer's header (its pool, id and bank layout) and its two banks. Every array sync
//! that has something new writes the landed parity of every open row (see
//! [`super::rows::OpenRows::landed_rows`]) into the bank the previous write did not use, with a
//! higher sequence number and a crc32c of the entries, and syncs the buffer; opening reads the
//! valid bank with the highest sequence number.
//!
//! Invariants: a bank is written only after the members' sync returned, so every grain an
//! entry covers is durable on the members before the entry is (a crash between the two leaves
//! the previous bank, which covers less); a torn bank fails its crc and the other bank, from
//! the previous sync, stands; an entry never covers a grain that was not written.

use super::rows::LandedRow;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::format::{
    decode_parity_descriptor, encode_parity_descriptor, ParityBankHeader, ParityBufferHeader, PARITY_BANK_DESCRIPTORS_AT,
    PARITY_BLOCK_BYTES,
};
use crate::util::AlignedBuf;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

/// Fewest rows a bank must hold: at least one open row per stream of a busy pool.
pub const MIN_ENTRIES_PER_BANK: u64 = 64;

/// Entries of a parity buffer created as a new file with no size given.
pub const DEFAULT_ENTRIES_PER_BANK: u64 = 256;

/// Bytes a parity buffer needs to hold `entries` rows per bank for an array of this stripe
/// unit and row width.
pub fn buffer_bytes_for(unit_bytes: u32, row_grains: u32, entries: u64) -> u64 {
    let h = ParityBufferHeader {
        pool_id: 0,
        buffer_id: 0,
        unit_bytes,
        row_grains,
        bank_bytes: 0,
    };
    PARITY_BLOCK_BYTES as u64 + 2 * (PARITY_BLOCK_BYTES as u64 + h.bank_body_bytes(entries, true))
}

/// What the parity buffer has written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ParityBufferCounters {
    pub banks_written: u64,
    pub bytes_written: u64,
    /// Syncs that found nothing new to write.
    pub banks_skipped: u64,
}

struct BankState {
    /// Sequence number of the last bank written or read.
    seq: u64,
    /// The open rows' landed version the last bank reflected (`None`: none written yet).
    written_version: Option<u64>,
}

/// A parity buffer in use.
pub struct ParityBuffer {
    device: Arc<dyn Device>,
    header: ParityBufferHeader,
    state: Mutex<BankState>,
    banks_written: AtomicU64,
    bytes_written: AtomicU64,
    banks_skipped: AtomicU64,
}

impl ParityBuffer {
    /// Formats `device` as the parity buffer `buffer_id` of pool `pool_id`: writes its header
    /// and invalidates both banks. Refuses a device too small for [`MIN_ENTRIES_PER_BANK`].
    pub fn format(device: Arc<dyn Device>, pool_id: u128, buffer_id: u64, unit_bytes: u32, row_grains: u32) -> Result<ParityBuffer> {
        let size = device.size_bytes() / PARITY_BLOCK_BYTES as u64 * PARITY_BLOCK_BYTES as u64;
        let bank_bytes = (size.saturating_sub(PARITY_BLOCK_BYTES as u64) / 2) / PARITY_BLOCK_BYTES as u64 * PARITY_BLOCK_BYTES as u64;
        let header = ParityBufferHeader {
            pool_id,
            buffer_id,
            unit_bytes,
            row_grains,
            bank_bytes,
        };
        let needed = buffer_bytes_for(unit_bytes, row_grains, MIN_ENTRIES_PER_BANK);
        if bank_bytes < PARITY_BLOCK_BYTES as u64 || header.entries_per_bank() < MIN_ENTRIES_PER_BANK {
            return Err(Error::InvalidConfig(format!(
                "parity buffer {} holds {}; with a {} stripe unit it needs at least {} ({MIN_ENTRIES_PER_BANK} rows in each of two banks)",
                device.name(),
                crate::util::human_bytes(device.size_bytes()),
                crate::util::human_bytes(unit_bytes as u64),
                crate::util::human_bytes(needed)
            )));
        }
        let mut block = AlignedBuf::zeroed(3 * PARITY_BLOCK_BYTES);
        block[..PARITY_BLOCK_BYTES].copy_from_slice(&header.encode());
        device
            .write_at(&block[..PARITY_BLOCK_BYTES], 0)
            .map_err(|e| Error::device_io(&*device, "write", 0, e))?;
        // Zeroed bank headers: no bank is valid until the first sync.
        for bank in 0..2 {
            let at = header.bank_offset(bank);
            device
                .write_at(&block[PARITY_BLOCK_BYTES..2 * PARITY_BLOCK_BYTES], at)
                .map_err(|e| Error::device_io(&*device, "write", at, e))?;
        }
        device.sync().map_err(|e| Error::device_io(&*device, "sync", 0, e))?;
        Ok(ParityBuffer::with(device, header, 0))
    }

    fn with(device: Arc<dyn Device>, header: ParityBufferHeader, seq: u64) -> ParityBuffer {
        ParityBuffer {
            device,
            header,
            state: Mutex::new(BankState {
                seq,
                written_version: None,
            }),
            banks_written: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            banks_skipped: AtomicU64::new(0),
        }
    }

    /// Opens the parity buffer `buffer_id` of pool `pool_id` on `device` and returns the rows
    /// of its newest valid bank. Refuses, writing nothing, a device that is not a parity
    /// buffer, one of another pool or another buffer, or one laid out for another stripe.
    /// Whether `device` carries a parity buffer header of pool `pool_id` (of any buffer id);
    /// `None` when its first block cannot be read.
    pub fn belongs_to(device: &dyn Device, pool_id: u128) -> Option<bool> {
        let mut block = AlignedBuf::zeroed(PARITY_BLOCK_BYTES);
        device.read_at(&mut block, 0).ok()?;
        Some(ParityBufferHeader::decode(&block).is_ok_and(|h| h.pool_id == pool_id))
    }

    pub fn open(
        device: Arc<dyn Device>,
        pool_id: u128,
        buffer_id: u64,
        unit_bytes: u32,
        row_grains: u32,
    ) -> Result<(ParityBuffer, Vec<LandedRow>)> {
        let name = device.name().to_string();
        let refuse = |reason: String| Error::InvalidConfig(format!("{name} is not this pool's parity buffer: {reason}"));
        let mut block = AlignedBuf::zeroed(PARITY_BLOCK_BYTES);
        device
            .read_at(&mut block, 0)
            .map_err(|e| Error::device_io(&*device, "read", 0, e))?;
        let header = ParityBufferHeader::decode(&block).map_err(|e| refuse(e.to_string()))?;
        if header.pool_id != pool_id {
            return Err(refuse(format!("it belongs to pool {:032x}", header.pool_id)));
        }
        if header.buffer_id != buffer_id {
            return Err(refuse(format!(
                "it is buffer {:016x}, the pool uses {buffer_id:016x} (an older copy?)",
                header.buffer_id
            )));
        }
        if header.unit_bytes != unit_bytes || header.row_grains != row_grains {
            return Err(refuse(format!(
                "laid out for {}-byte units and {}-grain rows, the array has {unit_bytes} and {row_grains}",
                header.unit_bytes, header.row_grains
            )));
        }
        let end = header.bank_offset(2);
        if end > device.size_bytes() {
            return Err(refuse(format!("it is {} bytes, its banks end at {end}", device.size_bytes())));
        }
        let mut best: Option<(u64, Vec<LandedRow>)> = None;
        for bank in 0..2 {
            match Self::read_bank(&*device, &header, bank)? {
                Some((seq, rows)) if best.as_ref().is_none_or(|(s, _)| seq > *s) => best = Some((seq, rows)),
                _ => {}
            }
        }
        let (seq, rows) = best.unwrap_or((0, Vec::new()));
        Ok((ParityBuffer::with(device, header, seq), rows))
    }

    /// Bank `bank` if it is whole (magic, header crc, entries crc): its sequence number and
    /// rows. A torn or never-written bank is `None`.
    fn read_bank(device: &dyn Device, header: &ParityBufferHeader, bank: usize) -> Result<Option<(u64, Vec<LandedRow>)>> {
        let at = header.bank_offset(bank);
        let mut block = AlignedBuf::zeroed(PARITY_BLOCK_BYTES);
        device
            .read_at(&mut block, at)
            .map_err(|e| Error::device_io(device, "read", at, e))?;
        let Ok(bank_header) = ParityBankHeader::decode(&block) else {
            return Ok(None);
        };
        if bank_header.buffer_id != header.buffer_id || bank_header.count as u64 > header.entries_per_bank() {
            return Ok(None);
        }
        let count = bank_header.count as usize;
        let body_len = header.bank_body_bytes(count as u64, bank_header.packed);
        if PARITY_BLOCK_BYTES as u64 + body_len > header.bank_bytes {
            return Ok(None);
        }
        let body_len = body_len as usize;
        let mut body = AlignedBuf::zeroed(body_len.max(PARITY_BLOCK_BYTES));
        if body_len > 0 {
            let from = at + PARITY_BLOCK_BYTES as u64;
            device
                .read_at(&mut body[..body_len], from)
                .map_err(|e| Error::device_io(device, "read", from, e))?;
        }
        if crc32c::crc32c(&body[..body_len]) != bank_header.body_crc {
            return Ok(None);
        }
        let (desc, unit) = (header.descriptor_bytes() as usize, header.unit_bytes as usize);
        let in_header = header.descriptors_in_header() as usize;
        // Packed: the descriptors' table, then the units; the first layout: entries of equal size.
        let (table, entry) = (body_len - count * unit, body_len.checked_div(count).unwrap_or(0));
        let mut rows = Vec::with_capacity(count);
        for i in 0..count {
            // Where entry i's descriptor and parity lie in either layout.
            let (descriptor, parity_at) = if bank_header.packed {
                let descriptor = if i < in_header {
                    let at = PARITY_BANK_DESCRIPTORS_AT + i * desc;
                    &block[at..at + desc]
                } else {
                    let at = (i - in_header) * desc;
                    &body[at..at + desc]
                };
                (descriptor, table + i * unit)
            } else {
                (&body[i * entry..i * entry + desc], i * entry + entry - unit)
            };
            let Ok((segment, row, covered)) = decode_parity_descriptor(descriptor, header.row_grains) else {
                return Ok(None);
            };
            rows.push(LandedRow {
                segment,
                row,
                covered,
                parity: body[parity_at..parity_at + unit].to_vec(),
            });
        }
        Ok(Some((bank_header.seq, rows)))
    }

    /// The header: size of the banks and what they hold.
    pub fn header(&self) -> &ParityBufferHeader {
        &self.header
    }

    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    pub fn counters(&self) -> ParityBufferCounters {
        ParityBufferCounters {
            banks_written: self.banks_written.load(SeqCst),
            bytes_written: self.bytes_written.load(SeqCst),
            banks_skipped: self.banks_skipped.load(SeqCst),
        }
    }

    /// Makes `rows` (taken when the open rows' landed version was `version`, before the
    /// members' sync) the buffer's durable content: writes them as the next bank and syncs.
    /// Skipped when the last bank already reflected `version`.
    pub fn persist(&self, rows: &[LandedRow], version: u64) -> Result<()> {
        let mut state = self.state.lock();
        if state.written_version == Some(version) {
            self.banks_skipped.fetch_add(1, SeqCst);
            return Ok(());
        }
        let capacity = self.header.entries_per_bank();
        if rows.len() as u64 > capacity {
            return Err(Error::NoSpace(format!(
                "{} rows are being filled, the parity buffer {} holds {capacity} per bank; give a larger one (about {})",
                rows.len(),
                self.device.name(),
                crate::util::human_bytes(buffer_bytes_for(
                    self.header.unit_bytes,
                    self.header.row_grains,
                    rows.len() as u64 * 2
                ))
            )));
        }
        // Packed: the descriptors in the header block as far as they fit (the rest in a table
        // after it), then the parity units, so a flush that leaves one row open writes a
        // header block and one unit (a block per descriptor had added a fifth to the bytes).
        let (desc, unit) = (self.header.descriptor_bytes() as usize, self.header.unit_bytes as usize);
        let mut descriptors = vec![0u8; rows.len() * desc];
        for (r, d) in rows.iter().zip(descriptors.chunks_mut(desc)) {
            encode_parity_descriptor(r.segment, r.row, &r.covered, d);
        }
        let (first, rest) = descriptors.split_at((self.header.descriptors_in_header() as usize * desc).min(descriptors.len()));
        let body = self.header.bank_body_bytes(rows.len() as u64, true) as usize;
        let table = body - rows.len() * unit;
        let mut buf = AlignedBuf::zeroed(PARITY_BLOCK_BYTES + body);
        let (table_bytes, parity) = buf[PARITY_BLOCK_BYTES..].split_at_mut(table);
        table_bytes[..rest.len()].copy_from_slice(rest);
        for (r, p) in rows.iter().zip(parity.chunks_mut(unit)) {
            p.copy_from_slice(&r.parity);
        }
        let seq = state.seq + 1;
        let bank_header = ParityBankHeader {
            buffer_id: self.header.buffer_id,
            seq,
            count: rows.len() as u32,
            body_crc: crc32c::crc32c(&buf[PARITY_BLOCK_BYTES..]),
            packed: true,
        };
        bank_header.encode_into(&mut buf[..PARITY_BLOCK_BYTES], first);
        // Banks alternate: odd sequence numbers go to bank 1, even ones to bank 0.
        let at = self.header.bank_offset((seq % 2) as usize);
        self.device
            .write_at(&buf, at)
            .map_err(|e| Error::device_io(&*self.device, "write", at, e))?;
        self.device.sync().map_err(|e| Error::device_io(&*self.device, "sync", at, e))?;
        state.seq = seq;
        state.written_version = Some(version);
        self.banks_written.fetch_add(1, SeqCst);
        self.bytes_written.fetch_add(buf.len() as u64, SeqCst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemoryDevice;

    const UNIT: u32 = 16 * 1024;
    const ROW_GRAINS: u32 = 12;

    fn rows(n: usize) -> Vec<LandedRow> {
        (0..n)
            .map(|i| LandedRow {
                segment: i as u32 * 7 + 1,
                row: i as u64 * 3 + 2,
                covered: (0..ROW_GRAINS as usize).map(|g| (g + i) % 3 == 0).collect(),
                parity: (0..UNIT as usize).map(|b| (b * 31 + i * 17) as u8).collect(),
            })
            .collect()
    }

    fn buffer() -> (Arc<dyn Device>, ParityBuffer) {
        let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new("pb", buffer_bytes_for(UNIT, ROW_GRAINS, 1024)));
        let pb = ParityBuffer::format(dev.clone(), 5, 9, UNIT, ROW_GRAINS).unwrap();
        (dev, pb)
    }

    #[test]
    fn a_packed_bank_holds_its_descriptors_in_the_header_then_in_a_table() {
        let (dev, pb) = buffer();
        // One open row: the header block and one parity unit, nothing else.
        pb.persist(&rows(1), 1).unwrap();
        assert_eq!(pb.counters().bytes_written, PARITY_BLOCK_BYTES as u64 + UNIT as u64);
        let (_, read) = ParityBuffer::open(dev.clone(), 5, 9, UNIT, ROW_GRAINS).unwrap();
        assert_eq!(read, rows(1));
        // More rows than the header block has room for: the rest go to the table.
        let many = pb.header().descriptors_in_header() as usize + 40;
        assert!(many as u64 <= pb.header().entries_per_bank());
        pb.persist(&rows(many), 2).unwrap();
        let (_, read) = ParityBuffer::open(dev.clone(), 5, 9, UNIT, ROW_GRAINS).unwrap();
        assert_eq!(read, rows(many));
        // A flipped bit in a header block's descriptor fails that bank; the other one stands.
        let at = pb.header().bank_offset(0) + PARITY_BANK_DESCRIPTORS_AT as u64 + 3;
        let mut b = [0u8; 1];
        dev.read_at(&mut b, at).unwrap();
        dev.write_at(&[b[0] ^ 0x10], at).unwrap();
        let (_, read) = ParityBuffer::open(dev, 5, 9, UNIT, ROW_GRAINS).unwrap();
        assert_eq!(read, rows(1), "bank 0 (seq 2) is damaged: bank 1 (seq 1) is the newest valid");
    }

    #[test]
    fn a_bank_in_the_first_layout_is_still_read() {
        let (dev, pb) = buffer();
        pb.persist(&rows(2), 1).unwrap();
        // What an older build wrote at the next sync: a whole block per descriptor.
        let h = pb.header().clone();
        let (desc_block, unit) = (PARITY_BLOCK_BYTES, UNIT as usize);
        let old = rows(3);
        let mut bank = vec![0u8; PARITY_BLOCK_BYTES + old.len() * (desc_block + unit)];
        for (r, e) in old.iter().zip(bank[PARITY_BLOCK_BYTES..].chunks_mut(desc_block + unit)) {
            encode_parity_descriptor(r.segment, r.row, &r.covered, &mut e[..h.descriptor_bytes() as usize]);
            e[desc_block..].copy_from_slice(&r.parity);
        }
        assert_eq!(bank.len() as u64 - PARITY_BLOCK_BYTES as u64, h.bank_body_bytes(3, false));
        let bank_header = ParityBankHeader {
            buffer_id: h.buffer_id,
            seq: 2,
            count: old.len() as u32,
            body_crc: crc32c::crc32c(&bank[PARITY_BLOCK_BYTES..]),
            packed: false,
        };
        bank_header.encode_into(&mut bank[..PARITY_BLOCK_BYTES], &[]);
        dev.write_at(&bank, h.bank_offset(0)).unwrap();
        let (reopened, read) = ParityBuffer::open(dev.clone(), 5, 9, UNIT, ROW_GRAINS).unwrap();
        assert_eq!(read, old);
        // The next bank is written packed, and read back.
        reopened.persist(&rows(4), 3).unwrap();
        let (_, read) = ParityBuffer::open(dev, 5, 9, UNIT, ROW_GRAINS).unwrap();
        assert_eq!(read, rows(4));
    }

    proptest::proptest! {
        /// Whatever a bank holds (a header sealed with good crcs over a body of the length its
        /// count and layout imply, with any descriptors, or random damage to the banks),
        /// opening the buffer never panics and returns only well-formed rows.
        #[test]
        fn any_bank_contents_open_without_panicking(
            count in proptest::prop_oneof![3 => 0u32..600, 1 => proptest::prelude::any::<u32>()],
            packed in proptest::prelude::any::<bool>(),
            fill in proptest::prelude::any::<u64>(),
            flips in proptest::option::weighted(0.3, proptest::collection::vec((proptest::prelude::any::<u64>(), proptest::prelude::any::<u8>()), 1..4)),
        ) {
            let (dev, pb) = buffer();
            pb.persist(&rows(3), 1).unwrap();
            let h = pb.header().clone();
            // A forged bank 0 of seq 2 whose crcs are right: its count, layout and descriptors
            // are what is tested.
            let body_len = h.bank_body_bytes(count as u64, packed).min(1 << 24) as usize;
            let mut x = fill | 1;
            let mut bank: Vec<u8> = (0..PARITY_BLOCK_BYTES + body_len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let forged = ParityBankHeader {
                buffer_id: h.buffer_id,
                seq: 2,
                count,
                body_crc: crc32c::crc32c(&bank[PARITY_BLOCK_BYTES..]),
                packed,
            };
            let in_header = if packed { (h.descriptors_in_header() * h.descriptor_bytes()) as usize } else { 0 };
            let descriptors = bank[PARITY_BLOCK_BYTES..].iter().copied().take(in_header).collect::<Vec<u8>>();
            forged.encode_into(&mut bank[..PARITY_BLOCK_BYTES], &descriptors);
            let end = (PARITY_BLOCK_BYTES as u64 + h.bank_bytes).min(bank.len() as u64) as usize;
            dev.write_at(&bank[..end], h.bank_offset(0)).unwrap();
            for (at, b) in flips.unwrap_or_default() {
                dev.write_at(&[b], h.bank_offset(0) + at % (2 * h.bank_bytes)).unwrap();
            }
            if let Ok((_, rows)) = ParityBuffer::open(dev, 5, 9, UNIT, ROW_GRAINS) {
                proptest::prop_assert!(rows.len() as u64 <= h.entries_per_bank());
                for r in rows {
                    proptest::prop_assert_eq!(r.parity.len(), UNIT as usize);
                    proptest::prop_assert_eq!(r.covered.len(), ROW_GRAINS as usize);
                }
            }
        }
    }

    #[test]
    fn a_bank_holds_at_least_as_many_rows_packed_as_in_the_first_layout() {
        for (unit, row_grains, entries) in [(4096, 2, 64), (16384, 12, 256), (65536, 4096, 64), (4096, 1 << 16, 64)] {
            let bytes = buffer_bytes_for(unit, row_grains, entries);
            let h = ParityBufferHeader {
                pool_id: 0,
                buffer_id: 0,
                unit_bytes: unit,
                row_grains,
                bank_bytes: (bytes - PARITY_BLOCK_BYTES as u64) / 2,
            };
            assert!(h.entries_per_bank() >= entries, "{unit} {row_grains}");
            assert!(PARITY_BLOCK_BYTES as u64 + h.bank_body_bytes(h.entries_per_bank(), true) <= h.bank_bytes);
            let first_layout = (h.bank_bytes - PARITY_BLOCK_BYTES as u64) / h.bank_body_bytes(1, false);
            assert!(h.entries_per_bank() >= first_layout);
        }
    }
}
