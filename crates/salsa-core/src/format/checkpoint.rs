//! The checkpoint blob's header (the blob: this header, then each volume's map, the crc table
//! and the segments' ages).

use super::*;

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
