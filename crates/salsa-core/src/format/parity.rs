//! The RAID-5 parity buffer: its header, its banks' headers and their entry descriptors.

use super::*;

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
