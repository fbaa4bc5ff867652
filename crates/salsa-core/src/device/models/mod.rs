//! Emulations of devices this machine lacks, each with the counters its paper's experiments
//! read: a commodity SSD with its FTL ([`ssd_model`]), a drive-managed SMR disk and a plain
//! disk actuator ([`smr_model`]), and a host-managed zoned drive over any device
//! ([`zoned_emulator`]). The SSD and disk models keep their own clock (modelled time) and
//! can also serve requests in real time; the zoned emulator keeps the zone rules and takes
//! its timing from a disk model around it.

pub mod smr_model;
pub mod ssd_model;
pub mod zoned_emulator;
