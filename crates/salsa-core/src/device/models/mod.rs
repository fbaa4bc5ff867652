//! Emulations of devices this machine lacks, each with the counters its paper's experiments
//! read: a commodity SSD with its FTL ([`ssd_model`]), a drive-managed SMR disk and a plain
//! disk actuator ([`smr_model`]), and a host-managed zoned drive over any device
//! ([`zoned_emulator`]). Each keeps its own clock (modelled time) and can also serve requests
//! in real time.

pub mod smr_model;
pub mod ssd_model;
pub mod zoned_emulator;
