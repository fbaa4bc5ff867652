//! `salsa.bench`: the `salsa bench` runner in-process (synthetic workloads, trace replay,
//! several placement and victim policies side by side, Python policies among them), with its
//! results handed back as JSON for the Python wrapper to turn into objects.

use crate::policy;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use salsa_cli::bench::{self as runner, trace, workload, Backing};
use salsa_core::spec::DeviceSpec;

/// Expands `placement+victim` items (`all`, `*` for every policy of a kind) against every
/// registered policy, Python ones included.
#[pyfunction]
pub fn compare_pairs(items: Vec<String>) -> PyResult<Vec<(String, String)>> {
    runner::compare_pairs(&items, &policy::registry()).map_err(PyValueError::new_err)
}

/// Runs `salsa bench` and returns `(results_json, table_markdown)`. See `salsa.bench` in the
/// Python package for the arguments.
#[pyfunction]
#[pyo3(signature = (*, workload, policies, memory_bytes, devices, spare_percent, segment_bytes, volume_bytes,
                    gc_garbage_percent, read_percent, block_bytes, queue_depth, precondition, warmup_volumes,
                    measure_volumes, realtime, gc_aging, seed, inline_gc, trace_format, trace_volume, trace_repeat,
                    out_dir, sample_ms, quiet))]
#[allow(clippy::too_many_arguments)]
pub fn bench(
    py: Python<'_>,
    workload: &str,
    policies: Vec<String>,
    memory_bytes: u64,
    devices: Vec<String>,
    spare_percent: f64,
    segment_bytes: Option<u64>,
    volume_bytes: Option<u64>,
    gc_garbage_percent: Option<f64>,
    read_percent: f64,
    block_bytes: u64,
    queue_depth: usize,
    precondition: bool,
    warmup_volumes: f64,
    measure_volumes: f64,
    realtime: bool,
    gc_aging: f64,
    seed: u64,
    inline_gc: bool,
    trace_format: Option<&str>,
    trace_volume: Option<String>,
    trace_repeat: u32,
    out_dir: Option<std::path::PathBuf>,
    sample_ms: u64,
    quiet: bool,
) -> PyResult<(String, String)> {
    let invalid = |m: String| PyValueError::new_err(m);
    let registry = policy::registry();
    let pairs = runner::compare_pairs(&policies, &registry).map_err(invalid)?;
    let backing = if devices.is_empty() {
        Backing::Memory(memory_bytes)
    } else {
        Backing::Files(
            devices
                .iter()
                .map(|d| d.parse::<DeviceSpec>())
                .collect::<Result<_, _>>()
                .map_err(invalid)?,
        )
    };
    if !(0.0..100.0).contains(&spare_percent) || !warmup_volumes.is_finite() || !measure_volumes.is_finite() || sample_ms == 0 {
        return Err(invalid(
            "spare_percent must be in [0, 100), the volumes finite and sample_ms positive".into(),
        ));
    }
    let p = runner::Params {
        backing,
        spare_percent,
        segment_bytes,
        volume_bytes,
        gc_garbage_percent,
        workload: workload.parse::<workload::Spec>().map_err(invalid)?,
        read_percent,
        block_bytes,
        queue_depth: queue_depth.clamp(1, 1024),
        precondition,
        warmup_volumes: warmup_volumes.max(0.0),
        measure_volumes: measure_volumes.max(0.0),
        realtime,
        policies: pairs,
        registry,
        gc_aging,
        seed,
        inline_gc,
        trace_format: trace_format.map(|f| f.parse::<trace::Format>()).transpose().map_err(invalid)?,
        trace_volume,
        trace_repeat: trace_repeat.max(1),
        device_trace: None,
        out_dir,
        sample_ms,
    };
    let errors_before = policy::errors_logged();
    let outcomes = py
        .detach(|| runner::run(&p, quiet))
        .map_err(pyo3::exceptions::PyRuntimeError::new_err)?;
    policy::raise_if_errors_since(errors_before)?;
    let all: Vec<&serde_json::Value> = outcomes.iter().map(|o| &o.json).collect();
    let results = serde_json::to_string(&all).map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
    Ok((results, runner::table(&outcomes)))
}
