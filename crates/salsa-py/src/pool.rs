//! `salsa.Pool` and `salsa.Volume`: a pool opened or created on device specs (files, block
//! devices and the device models, as on the command line), its volumes, and their I/O.
//!
//! A pool and its volumes share one [`Shared`] handle, which owns the engine and every volume
//! handle given out (a Python `Volume` names its volume): closing the pool drops them all, so
//! its devices are released even while Python still holds `Volume` objects, and every later
//! call through one says the pool is closed instead of reaching a closed engine. Every engine
//! call runs with the GIL released.

use crate::{policy, to_py};
use parking_lot::RwLock;
use pyo3::exceptions::{PyFileExistsError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use salsa_core::frontend::BlockVolume;
use salsa_core::spec::DeviceSpec;
use salsa_core::{ArrayKind, ControllerKind, Device, OpenOptions, PoolConfig, VolumeSpec};
use std::collections::HashMap;
use std::sync::Arc;

/// The most devices one pool may be given, as the C API allows.
const MAX_DEVICES: usize = 64;
/// The largest single read (a larger one is split by the caller), as the C API allows.
const MAX_READ_BYTES: u64 = 1 << 30;

/// The engine and the volume handles given out, while the pool is open.
struct Shared {
    open: RwLock<Option<OpenPool>>,
}

struct OpenPool {
    pool: salsa_core::Pool,
    /// One engine handle per volume name a Python `Volume` was made for.
    volumes: parking_lot::Mutex<HashMap<String, salsa_core::Volume>>,
}

impl Shared {
    fn new(pool: salsa_core::Pool) -> Arc<Shared> {
        Arc::new(Shared {
            open: RwLock::new(Some(OpenPool {
                pool,
                volumes: Default::default(),
            })),
        })
    }

    /// Runs `f` on the open pool, with the GIL released.
    fn with<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&OpenPool) -> PyResult<T> + Send) -> PyResult<T> {
        py.detach(|| {
            let guard = self.open.read();
            f(guard.as_ref().ok_or_else(closed)?)
        })
    }

    fn with_pool<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&salsa_core::Pool) -> salsa_core::Result<T> + Send) -> PyResult<T> {
        self.with(py, |o| f(&o.pool).map_err(to_py))
    }

    /// Closes the engine (a checkpoint), after dropping every volume handle.
    fn close(&self) -> PyResult<()> {
        match self.open.write().take() {
            Some(open) => {
                drop(open.volumes);
                open.pool.close().map_err(to_py)
            }
            None => Ok(()),
        }
    }
}

fn closed() -> PyErr {
    PyValueError::new_err("the pool is closed")
}

fn open_devices(specs: &[String], create: bool) -> PyResult<Vec<Arc<dyn Device>>> {
    if specs.is_empty() || specs.len() > MAX_DEVICES {
        return Err(PyValueError::new_err(format!(
            "give 1 to {MAX_DEVICES} devices, not {}",
            specs.len()
        )));
    }
    specs
        .iter()
        .map(|s| {
            let spec: DeviceSpec = s.parse().map_err(PyValueError::new_err)?;
            let dev = if create { spec.open(false) } else { spec.open_existing(false) };
            dev.map_err(|e| pyo3::exceptions::PyOSError::new_err((2, e)))
        })
        .collect()
}

fn open_options(background_gc: bool) -> OpenOptions {
    OpenOptions {
        background_gc,
        policies: policy::registry(),
        ..OpenOptions::default()
    }
}

/// A SALSA pool: devices, the log-structured engine and its GC. Use `Pool.create` or
/// `Pool.open`; `close()` (or a `with` block) checkpoints it so the next open needs no scan.
#[pyclass(module = "salsa", frozen)]
pub struct Pool {
    shared: Arc<Shared>,
}

impl Drop for Pool {
    fn drop(&mut self) {
        // A pool dropped without close(): the engine's threads may be waiting for the GIL
        // to call a Python policy, so it is released while they are joined.
        if let Some(open) = self.shared.open.write().take() {
            Python::attach(|py| py.detach(move || drop(open)));
        }
    }
}

#[pymethods]
impl Pool {
    /// Formats a new pool on blank devices and opens it.
    #[staticmethod]
    #[pyo3(signature = (devices, *, spare_percent=None, segment_bytes=None, victim=None, placement=None, gc_aging=None, array="linear", background_gc=true))]
    #[allow(clippy::too_many_arguments)]
    fn create(
        py: Python<'_>,
        devices: Vec<String>,
        spare_percent: Option<f64>,
        segment_bytes: Option<u64>,
        victim: Option<String>,
        placement: Option<String>,
        gc_aging: Option<f64>,
        array: &str,
        background_gc: bool,
    ) -> PyResult<Pool> {
        let defaults = PoolConfig::default();
        let cfg = PoolConfig {
            spare_percent: spare_percent.unwrap_or(defaults.spare_percent),
            segment_bytes,
            victim_policy: victim.unwrap_or(defaults.victim_policy.clone()),
            default_placement: placement.unwrap_or(defaults.default_placement.clone()),
            gc_aging: gc_aging.unwrap_or(defaults.gc_aging),
            array: ArrayKind::from_name(array).ok_or_else(|| {
                let names: Vec<&str> = ArrayKind::ALL.iter().map(|k| k.name()).collect();
                PyValueError::new_err(format!("unknown array layout {array:?}; known: {}", names.join(", ")))
            })?,
            ..defaults
        };
        let devs = open_devices(&devices, true)?;
        let opts = open_options(background_gc);
        let pool = py.detach(|| {
            if let Some(d) = salsa_core::pool::first_non_blank(&devs).map_err(to_py)? {
                return Err(PyFileExistsError::new_err(format!(
                    "device {} already holds data or a pool; Pool.create formats only blank devices",
                    d.name()
                )));
            }
            salsa_core::Pool::create(devs, &cfg, &opts).map_err(to_py)
        })?;
        Ok(Pool { shared: Shared::new(pool) })
    }

    /// Opens an existing pool on all its devices (any order), recovering it if it was not
    /// closed cleanly.
    #[staticmethod]
    #[pyo3(signature = (devices, *, background_gc=true))]
    fn open(py: Python<'_>, devices: Vec<String>, background_gc: bool) -> PyResult<Pool> {
        let devs = open_devices(&devices, false)?;
        let opts = open_options(background_gc);
        let pool = py.detach(|| salsa_core::Pool::open(devs, &opts).map_err(to_py))?;
        Ok(Pool { shared: Shared::new(pool) })
    }

    /// Creates a volume. `controller`: lsa (page map, the default), extent, dual, hybrid or
    /// amf; `placement` and `victim`: the volume's own policies (default: the pool's).
    #[pyo3(signature = (name, size_bytes, *, page_bytes=4096, controller="lsa", placement=None, victim=None))]
    #[allow(clippy::too_many_arguments)]
    fn create_volume(
        &self,
        py: Python<'_>,
        name: String,
        size_bytes: u64,
        page_bytes: u32,
        controller: &str,
        placement: Option<String>,
        victim: Option<String>,
    ) -> PyResult<Volume> {
        let kind = ControllerKind::from_name(controller).ok_or_else(|| {
            let names: Vec<&str> = ControllerKind::ALL.iter().map(|k| k.name()).collect();
            PyValueError::new_err(format!("unknown controller {controller:?}; known: {}", names.join(", ")))
        })?;
        let spec = VolumeSpec {
            controller: kind,
            placement,
            victim,
            ..VolumeSpec::lsa(page_bytes)
        };
        self.shared.with(py, |o| {
            let v = o.pool.create_volume_spec(&name, size_bytes, &spec).map_err(to_py)?;
            o.volumes.lock().insert(name.clone(), v);
            Ok(())
        })?;
        Volume::new(py, &self.shared, name)
    }

    /// The volume named `name` (`KeyError` if there is none).
    fn volume(&self, py: Python<'_>, name: String) -> PyResult<Volume> {
        self.shared.with(py, |o| {
            if !o.volumes.lock().contains_key(&name) {
                let v = o.pool.volume(&name).map_err(to_py)?;
                o.volumes.lock().insert(name.clone(), v);
            }
            Ok(())
        })?;
        Volume::new(py, &self.shared, name)
    }

    fn volume_names(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        self.shared.with_pool(py, |p| Ok(p.volume_names()))
    }

    /// Deletes a volume and its data; its `Volume` objects then refuse every call.
    fn delete_volume(&self, py: Python<'_>, name: String) -> PyResult<()> {
        self.shared.with(py, |o| {
            o.volumes.lock().remove(&name);
            o.pool.delete_volume(&name).map_err(to_py)
        })
    }

    /// Makes everything written so far durable.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        self.shared.with_pool(py, |p| p.flush())
    }

    /// The pool's statistics as a dict, as `salsa stats --json` gives them.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let text = self
            .shared
            .with_pool(py, |p| Ok(salsa_cli::stats_json::stats_json(p).to_string()))?;
        py.import("json")?.call_method1("loads", (text,))
    }

    /// Logical bytes the pool offers at its spare percentage.
    #[getter]
    fn logical_capacity_bytes(&self, py: Python<'_>) -> PyResult<u64> {
        self.shared.with_pool(py, |p| Ok(p.logical_capacity_bytes()))
    }

    #[getter]
    fn victim_policy(&self, py: Python<'_>) -> PyResult<String> {
        self.shared.with_pool(py, |p| Ok(p.victim_policy().to_string()))
    }

    #[getter]
    fn closed(&self) -> bool {
        self.shared.open.read().is_none()
    }

    /// Closes the pool cleanly (a checkpoint). Closing a closed pool does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.shared.close())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }
}

/// One volume of a pool: byte-addressed reads and writes.
#[pyclass(module = "salsa", frozen)]
pub struct Volume {
    shared: Arc<Shared>,
    name: String,
    size_bytes: u64,
    page_bytes: u32,
    controller: &'static str,
}

impl Volume {
    fn new(py: Python<'_>, shared: &Arc<Shared>, name: String) -> PyResult<Volume> {
        let (size_bytes, page_bytes, controller) = Volume::on(shared, py, &name, |v| Ok((v.size_bytes(), v.page_bytes(), v.controller())))?;
        Ok(Volume {
            shared: shared.clone(),
            name,
            size_bytes,
            page_bytes,
            controller,
        })
    }

    fn on<T: Send>(
        shared: &Shared,
        py: Python<'_>,
        name: &str,
        f: impl FnOnce(&salsa_core::Volume) -> salsa_core::Result<T> + Send,
    ) -> PyResult<T> {
        shared.with(py, |o| {
            // A clone of the handle, so that the map's lock is not held across the I/O.
            let v = o
                .volumes
                .lock()
                .get(name)
                .cloned()
                .ok_or_else(|| PyValueError::new_err(format!("volume {name:?} was deleted")))?;
            f(&v).map_err(to_py)
        })
    }

    /// Runs `f` on the volume through the front-end-neutral interface, which every I/O method
    /// of this class goes through.
    fn with<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&dyn BlockVolume) -> salsa_core::Result<T> + Send) -> PyResult<T> {
        Volume::on(&self.shared, py, &self.name, |v| f(v))
    }
}

#[pymethods]
impl Volume {
    #[getter]
    fn name(&self) -> String {
        self.name.clone()
    }
    #[getter]
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    #[getter]
    fn page_bytes(&self) -> u32 {
        self.page_bytes
    }
    #[getter]
    fn controller(&self) -> &'static str {
        self.controller
    }
    #[getter]
    fn mapped_bytes(&self, py: Python<'_>) -> PyResult<u64> {
        Volume::on(&self.shared, py, &self.name, |v| Ok(v.mapped_bytes()))
    }

    /// Reads `length` bytes at `offset` (both multiples of the page size).
    fn read<'py>(&self, py: Python<'py>, offset: u64, length: u64) -> PyResult<Bound<'py, PyBytes>> {
        if length > MAX_READ_BYTES {
            return Err(PyValueError::new_err(format!(
                "read of {length} bytes: at most {MAX_READ_BYTES} at once"
            )));
        }
        let mut buf = vec![0u8; length as usize];
        self.with(py, |v| v.read(offset, &mut buf))?;
        Ok(PyBytes::new(py, &buf))
    }

    /// Writes `data` at `offset` (both multiples of the page size); `fua`: durable on return.
    #[pyo3(signature = (offset, data, *, fua=false))]
    fn write(&self, py: Python<'_>, offset: u64, data: &[u8], fua: bool) -> PyResult<()> {
        self.with(py, |v| if fua { v.write_fua(offset, data) } else { v.write(offset, data) })
    }

    /// Unmaps `length` bytes at `offset`; they read back as zeros.
    fn trim(&self, py: Python<'_>, offset: u64, length: u64) -> PyResult<()> {
        self.with(py, |v| v.trim(offset, length))
    }

    fn write_zeroes(&self, py: Python<'_>, offset: u64, length: u64) -> PyResult<()> {
        self.with(py, |v| v.write_zeroes(offset, length))
    }

    /// Makes this volume's writes durable.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |v| v.flush())
    }

    fn __repr__(&self) -> String {
        format!("Volume({:?}, {} bytes, {} controller)", self.name, self.size_bytes, self.controller)
    }
}
