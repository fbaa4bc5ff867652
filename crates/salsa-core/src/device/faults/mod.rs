//! Simulated faults, for the crash and fault tests (and for programs that test their own use of
//! a pool): a device whose unsynced writes a crash drops or tears ([`crash`]), and one that
//! fails the I/O it is told to ([`fault`]). They decorate any device; the engine and the
//! front-ends never use them.

pub mod crash;
pub mod fault;
