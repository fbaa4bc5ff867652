//! Where the bytes of a segment go in a striped or mirrored array: pure arithmetic, no I/O.
//!
//! A segment of `segment_bytes` data bytes is cut into rows. A row holds one stripe unit per
//! data member (RAID-0: every member; RAID-5: all members but one, and that one holds the
//! row's parity; RAID-1: one "unit" that is the whole segment, on every member). Row `r` of a
//! segment sits at byte `r * unit` of the segment's area on every member, so consecutive rows
//! are consecutive on each member and a long write becomes one contiguous run per member.
//! RAID-5 parity rotates left-symmetrically: row `r` keeps its parity on member
//! `n - 1 - r % n`, and its data units on the members after it, wrapping around.

use crate::format::ArrayKind;

/// The striping of one array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stripe {
    pub kind: ArrayKind,
    pub members: u32,
    /// Bytes of one stripe unit (RAID-1: the whole segment).
    pub unit_bytes: u64,
    /// Data bytes of one segment.
    pub segment_bytes: u64,
}

/// A contiguous piece of a data range that lies on one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub row: u64,
    /// Index of the data unit within its row.
    pub unit: u32,
    pub member: u32,
    /// Byte offset in the segment's area on the member.
    pub member_offset: u64,
    /// Byte offset of the piece in the range.
    pub at: u64,
    pub len: u64,
}

impl Stripe {
    /// A stripe for `kind` over `members` devices; `unit_bytes` is ignored for RAID-1.
    pub fn new(kind: ArrayKind, members: u32, unit_bytes: u64, segment_bytes: u64) -> Stripe {
        let unit_bytes = if kind == ArrayKind::Raid1 { segment_bytes } else { unit_bytes };
        let s = Stripe {
            kind,
            members,
            unit_bytes,
            segment_bytes,
        };
        assert!(kind != ArrayKind::Linear, "a linear array does not stripe");
        assert!(members >= kind.min_members(), "too few members for {}", kind.name());
        assert!(
            unit_bytes > 0 && segment_bytes.is_multiple_of(s.row_bytes()),
            "segment of {segment_bytes} bytes is not a whole number of {}-byte rows",
            s.row_bytes()
        );
        s
    }

    /// Members that hold data in each row.
    pub fn data_members(&self) -> u32 {
        match self.kind {
            ArrayKind::Raid0 => self.members,
            ArrayKind::Raid5 => self.members - 1,
            ArrayKind::Raid1 | ArrayKind::Linear => 1,
        }
    }

    /// Data bytes of one row.
    pub fn row_bytes(&self) -> u64 {
        self.data_members() as u64 * self.unit_bytes
    }

    /// Rows in a segment.
    pub fn rows(&self) -> u64 {
        self.segment_bytes / self.row_bytes()
    }

    /// Bytes one segment takes on each member.
    pub fn member_segment_bytes(&self) -> u64 {
        self.rows() * self.unit_bytes
    }

    /// The member holding row `row`'s parity (RAID-5 only).
    pub fn parity_member(&self, row: u64) -> Option<u32> {
        (self.kind == ArrayKind::Raid5).then(|| self.members - 1 - (row % self.members as u64) as u32)
    }

    /// The member holding data unit `unit` of row `row` (RAID-1: the first mirror).
    pub fn data_member(&self, row: u64, unit: u32) -> u32 {
        match self.parity_member(row) {
            Some(p) => (p + 1 + unit) % self.members,
            None if self.kind == ArrayKind::Raid0 => unit,
            None => 0,
        }
    }

    /// Which data unit of its row `member` holds, `None` for the parity member.
    pub fn unit_of(&self, row: u64, member: u32) -> Option<u32> {
        match self.parity_member(row) {
            Some(p) if p == member => None,
            Some(p) => Some((member + self.members - p - 1) % self.members),
            None => Some(if self.kind == ArrayKind::Raid0 { member } else { 0 }),
        }
    }

    /// The pieces of data bytes `[offset, offset + len)` of a segment, in order.
    pub fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = Piece> + '_ {
        assert!(offset + len <= self.segment_bytes, "range leaves the segment");
        let end = offset + len;
        let mut at = offset;
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let row = at / self.row_bytes();
            let in_row = at % self.row_bytes();
            let unit = (in_row / self.unit_bytes) as u32;
            let in_unit = in_row % self.unit_bytes;
            let n = (self.unit_bytes - in_unit).min(end - at);
            let piece = Piece {
                row,
                unit,
                member: self.data_member(row, unit),
                member_offset: row * self.unit_bytes + in_unit,
                at: at - offset,
                len: n,
            };
            at += n;
            Some(piece)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn raid5_parity_rotates_and_every_member_holds_one_unit_per_row() {
        let s = Stripe::new(ArrayKind::Raid5, 4, 4096, 3 * 4096 * 8);
        assert_eq!((s.data_members(), s.row_bytes(), s.rows()), (3, 12288, 8));
        let parity: Vec<u32> = (0..5).map(|r| s.parity_member(r).unwrap()).collect();
        assert_eq!(parity, vec![3, 2, 1, 0, 3]);
        for row in 0..8 {
            let mut held: Vec<u32> = (0..3).map(|u| s.data_member(row, u)).collect();
            held.push(s.parity_member(row).unwrap());
            held.sort_unstable();
            assert_eq!(held, vec![0, 1, 2, 3], "row {row}");
            for u in 0..3 {
                assert_eq!(s.unit_of(row, s.data_member(row, u)), Some(u));
            }
            assert_eq!(s.unit_of(row, s.parity_member(row).unwrap()), None);
        }
    }

    proptest! {
        /// Every byte of a range lands once, on a data member, inside the segment's area, and
        /// two different bytes never share a place.
        #[test]
        fn pieces_cover_a_range_once_and_never_collide(
            kind in prop::sample::select(vec![ArrayKind::Raid0, ArrayKind::Raid1, ArrayKind::Raid5]),
            members in 3u32..7,
            unit_shift in 0u32..3,
            rows in 1u64..6,
            a in 0u64..10_000,
            b in 0u64..10_000,
        ) {
            let unit = 4096u64 << unit_shift;
            let probe = Stripe { kind, members, unit_bytes: unit, segment_bytes: 0 };
            let seg = if kind == ArrayKind::Raid1 { rows * unit } else { probe.row_bytes() * rows };
            let s = Stripe::new(kind, members, unit, seg);
            let (x, y) = (a * seg / 10_000, b * seg / 10_000);
            let (from, to) = (x.min(y), x.max(y));
            let mut seen = std::collections::HashSet::new();
            let mut covered = 0;
            for p in s.pieces(from, to - from) {
                prop_assert_eq!(p.at, covered);
                prop_assert!(p.member_offset + p.len <= s.member_segment_bytes());
                prop_assert_ne!(Some(p.member), s.parity_member(p.row));
                prop_assert!(seen.insert((p.member, p.member_offset)));
                covered += p.len;
            }
            prop_assert_eq!(covered, to - from);
        }
    }
}
