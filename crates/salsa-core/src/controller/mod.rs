//! Controllers map a volume's logical pages onto the capacity manager's segments. Each volume is
//! one controller instance with its own page size and allocation streams; the GC upcalls the
//! owning controller to move a victim's live data.
//!
//! The LSA page-map controller ([`lsa::LsaVolume`]) is the default. The interface it offers the
//! rest of the engine (read / write / trim / flush sealing / relocate / recovery replay /
//! checkpoint image) is what further controllers (dual mapping, hybrid, append-only, extent
//! map) implement; the atomic remap command (`share`) is a map-only operation on the same
//! entries and needs no new write path.

pub mod lsa;
pub mod map;
pub mod record;
