//! `salsa._salsa`: the native half of the `salsa` Python package (the Python half is
//! `python/salsa/__init__.py`). It exposes pools and volumes (`pool`), the benchmark runner
//! and trace replay (`bench`), and lets placement and victim-selection policies written in
//! Python be registered so that the engine calls them (`policy`).
//!
//! Rules every entry point keeps:
//! - The GIL is released for every call into the engine: the engine's own threads (GC
//!   workers, writers) call Python policies, which take the GIL, so a caller holding it across
//!   an engine call would deadlock.
//! - Nothing a Python caller passes is trusted: sizes, offsets and names are checked by the
//!   engine and refused with `ValueError`; device faults are `OSError` with an errno.
//! - A policy written in Python that raises, or answers out of range, never takes the engine
//!   down: the call falls back to a safe answer (stream 0; greedy scores) and the error is
//!   kept for `policy_errors()`, and a bench run that saw one raises it.

mod bench;
mod policy;
mod pool;

use pyo3::exceptions::{PyKeyError, PyOSError, PyValueError};
use pyo3::prelude::*;
use salsa_core::Error;

/// An engine error as the Python exception a caller would expect: `ValueError` for a bad
/// argument or configuration, `KeyError` for an unknown volume, `OSError` (with its errno)
/// for what the devices or the pool's state refused.
pub(crate) fn to_py(e: Error) -> PyErr {
    let message = e.to_string();
    match e {
        Error::InvalidArgument(_) | Error::InvalidConfig(_) | Error::AppendOnly(_) | Error::VolumeExists(_) => {
            PyValueError::new_err(message)
        }
        Error::VolumeNotFound(_) => PyKeyError::new_err(message),
        Error::NoSpace(_) => PyOSError::new_err((28, message)),
        Error::ReadOnly(_) => PyOSError::new_err((30, message)),
        Error::ShuttingDown => PyOSError::new_err((108, message)),
        _ => PyOSError::new_err((5, message)),
    }
}

#[pymodule]
fn _salsa(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<pool::Pool>()?;
    m.add_class::<pool::Volume>()?;
    m.add_class::<policy::Candidates>()?;
    m.add_class::<policy::SegmentView>()?;
    m.add_class::<policy::UserWrite>()?;
    m.add_class::<policy::Relocation>()?;
    m.add_function(wrap_pyfunction!(policy::register_victim, m)?)?;
    m.add_function(wrap_pyfunction!(policy::register_placement, m)?)?;
    m.add_function(wrap_pyfunction!(policy::policies, m)?)?;
    m.add_function(wrap_pyfunction!(policy::policy_errors, m)?)?;
    m.add_function(wrap_pyfunction!(bench::bench, m)?)?;
    m.add_function(wrap_pyfunction!(bench::compare_pairs, m)?)?;
    Ok(())
}
