//! Policies written in Python: the adapters that let the engine call a Python class as a
//! [`VictimPolicy`] or a [`Placement`], the process-wide registry they are registered in, and
//! the log of errors they raised.
//!
//! Cost per call (measured in `docs/POLICIES.md`): a placement method is one Python call per
//! page placed (user write or relocation), a few hundred nanoseconds to a microsecond and a
//! half; victim selection is one call per victim choice with every candidate segment in one
//! [`Candidates`] batch, so its cost is paid once per segment cleaned, not once per segment
//! scored. The engine's threads take the GIL for each call, so Python policies run one at a
//! time; the Rust side releases the GIL for every engine call.
//!
//! Invariants: a policy's answer is checked (stream numbers in range, one finite-or-NaN score
//! per candidate) and a bad answer or an exception falls back to a safe one (stream 0, greedy
//! scores) and is logged; names are interned once, so registering a name again replaces the
//! policy without leaking.

use parking_lot::Mutex;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use salsa_core::policy::placement::{self, Placement};
use salsa_core::policy::victim::{self, Candidate, VictimPolicy};
use salsa_core::{Registry, StreamKind, MAX_POLICY_NAME_BYTES};
use std::sync::LazyLock;

/// The registry every pool and bench run opened from Python looks names up in.
static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(|| Mutex::new(Registry::builtin()));
/// Names and descriptions given to the registry, which keeps `&'static str`s: each distinct
/// string is leaked once.
static INTERNED: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
/// Errors raised by Python policies since the log was last read.
static ERRORS: Mutex<ErrorLog> = Mutex::new(ErrorLog {
    kept: Vec::new(),
    total: 0,
});

/// The most error messages kept; later ones are only counted.
const MAX_KEPT_ERRORS: usize = 16;

struct ErrorLog {
    kept: Vec<String>,
    total: u64,
}

/// The registry as it is now (built-ins plus every policy registered from Python).
pub(crate) fn registry() -> Registry {
    REGISTRY.lock().clone()
}

/// How many policy errors have been logged so far (a bench run compares before and after).
pub(crate) fn errors_logged() -> u64 {
    ERRORS.lock().total
}

thread_local! {
    /// Whether this thread has a Python thread state of its own (see [`attach`]).
    static HAS_THREAD_STATE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Takes the GIL to call a policy, from any thread. A thread Python does not know gets a
/// thread state on its first call and keeps it: `Python::attach` alone would create and
/// destroy one per call on an engine thread, which cost some 30 us per placement call (a
/// bench of a Python placement ran at a seventh of the built-in's speed); kept, a call costs
/// what taking the GIL costs.
fn attach<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> R {
    HAS_THREAD_STATE.with(|known| {
        if !known.get() {
            // SAFETY: the interpreter is initialised (this module was imported by it). When
            // this thread does not hold the GIL, PyGILState_Ensure takes it, creating the
            // thread's state if it has none, and PyEval_SaveThread releases it again while
            // keeping the state (the Ensure is never matched by a Release, so the state lives
            // as long as the thread). A thread that holds the GIL already has a state and is
            // left alone.
            unsafe {
                if pyo3::ffi::PyGILState_Check() == 0 {
                    let _ = pyo3::ffi::PyGILState_Ensure();
                    let _ = pyo3::ffi::PyEval_SaveThread();
                }
            }
            known.set(true);
        }
    });
    Python::attach(f)
}

fn log_error(policy: &str, method: &str, what: String) {
    let mut log = ERRORS.lock();
    log.total += 1;
    if log.kept.len() < MAX_KEPT_ERRORS {
        log.kept.push(format!("policy {policy:?}, {method}: {what}"));
    }
}

fn intern(s: &str) -> &'static str {
    let mut names = INTERNED.lock();
    if let Some(&known) = names.iter().find(|n| **n == s) {
        return known;
    }
    let leaked: &'static str = Box::leak(s.to_string().into_boxed_str());
    names.push(leaked);
    leaked
}

fn stream_name(s: StreamKind) -> String {
    match s {
        StreamKind::User(k) => format!("user:{k}"),
        StreamKind::Gc(k) => format!("gc:{k}"),
        StreamKind::Checkpoint => "checkpoint".to_string(),
    }
}

/// Every candidate segment of one victim choice, as parallel lists (index `i` of each list
/// describes candidate `i`). Each attribute read builds a new list: bind the ones you use once.
#[pyclass(frozen, get_all, module = "salsa")]
pub struct Candidates {
    /// Segment numbers.
    segment: Vec<u32>,
    /// Valid grains in each segment.
    valid_grains: Vec<u32>,
    /// Grains a segment holds (the same for every segment of a pool).
    capacity_grains: u32,
    /// The pool's write clock when each segment was sealed.
    sealed_seq: Vec<u64>,
    /// The pool's write clock now.
    now_seq: u64,
    /// The oldest `sealed_seq` among the candidates.
    oldest_sealed_seq: u64,
    /// The stream that wrote each segment: `"user:K"` or `"gc:K"`.
    stream: Vec<String>,
    /// Distinct logical bands (a segment's worth of one volume's addresses) each segment's
    /// live pages belong to: counted when the policy's `counts_live_bands` is true, else 0.
    live_bands: Vec<u32>,
}

#[pymethods]
impl Candidates {
    fn __len__(&self) -> usize {
        self.segment.len()
    }
    fn __repr__(&self) -> String {
        format!("Candidates({} segments, now_seq={})", self.segment.len(), self.now_seq)
    }
}

/// A segment as a placement policy sees it.
#[pyclass(frozen, get_all, module = "salsa", skip_from_py_object)]
#[derive(Clone)]
pub struct SegmentView {
    segment: u32,
    /// `"user:K"` or `"gc:K"`.
    stream: String,
    /// The pool's write clock when the segment was opened.
    opened_seq: u64,
    /// When it was sealed; 0 while it is still open.
    sealed_seq: u64,
}

impl From<&placement::SegmentView> for SegmentView {
    fn from(v: &placement::SegmentView) -> SegmentView {
        SegmentView {
            segment: v.segment,
            stream: stream_name(v.stream),
            opened_seq: v.opened_seq,
            sealed_seq: v.sealed_seq,
        }
    }
}

/// A user write about to be placed.
#[pyclass(frozen, get_all, module = "salsa")]
pub struct UserWrite {
    /// Logical page of the volume.
    page: u64,
    /// The pool's write clock: one tick per page written or trimmed, in any volume.
    now: u64,
    /// Where the page's current version lives (`None`: never written, or trimmed).
    previous: Option<SegmentView>,
    /// Pages of the volume holding data, and its size in pages.
    mapped_pages: u64,
    volume_pages: u64,
}

/// A live page the GC is about to move.
#[pyclass(frozen, get_all, module = "salsa")]
pub struct Relocation {
    page: u64,
    now: u64,
    /// The segment being cleaned.
    victim: SegmentView,
    mapped_pages: u64,
    volume_pages: u64,
}

/// A victim policy written in Python: an object with `score(candidates) -> list[float]`.
struct PyVictim {
    name: &'static str,
    object: Py<PyAny>,
    /// The object's `counts_live_bands` attribute, read once when it was built.
    counts_live_bands: bool,
}

impl VictimPolicy for PyVictim {
    fn score(&self, c: &Candidate) -> f64 {
        let mut scores = Vec::with_capacity(1);
        self.score_batch(std::slice::from_ref(c), &mut scores);
        scores[0]
    }

    fn score_batch(&self, candidates: &[Candidate], scores: &mut Vec<f64>) {
        let Some(first) = candidates.first() else { return };
        let batch = Candidates {
            segment: candidates.iter().map(|c| c.segment).collect(),
            valid_grains: candidates.iter().map(|c| c.valid_grains).collect(),
            capacity_grains: first.capacity_grains,
            sealed_seq: candidates.iter().map(|c| c.sealed_seq).collect(),
            now_seq: first.now_seq,
            oldest_sealed_seq: first.oldest_sealed_seq,
            stream: candidates.iter().map(|c| stream_name(c.stream)).collect(),
            live_bands: candidates.iter().map(|c| c.live_bands).collect(),
        };
        let answer = attach(|py| {
            self.object
                .bind(py)
                .call_method1("score", (batch,))
                .and_then(|r| r.extract::<Vec<f64>>())
                .map_err(|e| e.to_string())
        });
        match answer {
            Ok(v) if v.len() == candidates.len() => scores.extend(v),
            Ok(v) => {
                log_error(
                    self.name,
                    "score",
                    format!("returned {} scores for {} candidates", v.len(), candidates.len()),
                );
                victim::Greedy.score_batch(candidates, scores);
            }
            Err(e) => {
                log_error(self.name, "score", e);
                victim::Greedy.score_batch(candidates, scores);
            }
        }
    }

    fn counts_live_bands(&self) -> bool {
        self.counts_live_bands
    }
}

/// A placement policy written in Python: `user_streams` and `gc_streams` attributes and
/// `place_user(w) -> int`, `place_gc(r) -> int`; optionally `trimmed(first, count)`,
/// `segment_reclaimed(victim, now)`, `resize(pages)` and `state_bytes() -> int`.
struct PyPlacement {
    name: &'static str,
    object: Py<PyAny>,
    users: u8,
    gcs: u8,
    has_trimmed: bool,
    has_reclaimed: bool,
    has_resize: bool,
    has_state_bytes: bool,
}

impl PyPlacement {
    /// Reads the declared streams and which optional methods the object has.
    fn new(name: &'static str, object: Bound<'_, PyAny>) -> PyResult<PyPlacement> {
        let streams = |attr: &str| -> PyResult<u8> {
            let n: i64 = object.getattr(attr)?.extract()?;
            if (1..=16).contains(&n) {
                Ok(n as u8)
            } else {
                Err(PyValueError::new_err(format!("{attr} must be 1 to 16, not {n}")))
            }
        };
        for method in ["place_user", "place_gc"] {
            if !object.hasattr(method)? {
                return Err(PyTypeError::new_err(format!("a placement policy needs a {method} method")));
            }
        }
        Ok(PyPlacement {
            name,
            users: streams("user_streams")?,
            gcs: streams("gc_streams")?,
            has_trimmed: object.hasattr("trimmed")?,
            has_reclaimed: object.hasattr("segment_reclaimed")?,
            has_resize: object.hasattr("resize")?,
            has_state_bytes: object.hasattr("state_bytes")?,
            object: object.unbind(),
        })
    }

    /// Calls `method` with `arg` and reads a stream number below `limit`; 0 on any fault.
    fn stream<A: for<'py> IntoPyObject<'py>>(&self, method: &str, arg: A, limit: u8) -> u8 {
        let answer = attach(|py| {
            self.object
                .bind(py)
                .call_method1(method, (arg,))
                .and_then(|r| r.extract::<i64>())
                .map_err(|e| e.to_string())
        });
        match answer {
            Ok(k) if (0..limit as i64).contains(&k) => k as u8,
            Ok(k) => {
                log_error(self.name, method, format!("returned stream {k}; it declared {limit}"));
                0
            }
            Err(e) => {
                log_error(self.name, method, e);
                0
            }
        }
    }

    /// Calls an optional notification method; a fault is logged.
    fn notify<A: for<'py> pyo3::call::PyCallArgs<'py>>(&self, method: &str, args: A) {
        let result = attach(|py| {
            self.object
                .bind(py)
                .call_method1(method, args)
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        if let Err(e) = result {
            log_error(self.name, method, e);
        }
    }
}

impl Placement for PyPlacement {
    fn user_streams(&self) -> u8 {
        self.users
    }
    fn gc_streams(&self) -> u8 {
        self.gcs
    }
    fn place_user(&self, w: &placement::UserWrite) -> StreamKind {
        let arg = UserWrite {
            page: w.page,
            now: w.now,
            previous: w.previous.as_ref().map(SegmentView::from),
            mapped_pages: w.mapped_pages,
            volume_pages: w.volume_pages,
        };
        StreamKind::User(self.stream("place_user", arg, self.users))
    }
    fn place_gc(&self, r: &placement::Relocation) -> StreamKind {
        let arg = Relocation {
            page: r.page,
            now: r.now,
            victim: SegmentView::from(&r.victim),
            mapped_pages: r.mapped_pages,
            volume_pages: r.volume_pages,
        };
        StreamKind::Gc(self.stream("place_gc", arg, self.gcs))
    }
    fn trimmed(&self, first: u64, count: u64) {
        if self.has_trimmed {
            self.notify("trimmed", (first, count));
        }
    }
    fn segment_reclaimed(&self, victim: &placement::SegmentView, now: u64) {
        if self.has_reclaimed {
            self.notify("segment_reclaimed", (SegmentView::from(victim), now));
        }
    }
    fn resize(&self, pages: u64) {
        if self.has_resize {
            self.notify("resize", (pages,));
        }
    }
    fn state_bytes(&self) -> u64 {
        if !self.has_state_bytes {
            return 0;
        }
        let answer = attach(|py| {
            self.object
                .bind(py)
                .call_method0("state_bytes")
                .and_then(|r| r.extract::<u64>())
                .map_err(|e| e.to_string())
        });
        answer.unwrap_or_else(|e| {
            log_error(self.name, "state_bytes", e);
            0
        })
    }
}

/// Checks a name a Python caller wants to register.
fn check_name(name: &str, builtin: &[&str]) -> PyResult<()> {
    if name.is_empty() || name.len() > MAX_POLICY_NAME_BYTES || name.contains(['+', ',', '*']) {
        return Err(PyValueError::new_err(format!(
            "policy name {name:?} must be 1 to {MAX_POLICY_NAME_BYTES} bytes without '+', ',' or '*'"
        )));
    }
    if builtin.contains(&name) {
        return Err(PyValueError::new_err(format!("{name:?} is a built-in policy; choose another name")));
    }
    Ok(())
}

/// Registers a victim-selection policy written in Python under `name`. `factory(aging)`
/// returns the policy object (a class works: it is called with the pool's aging factor);
/// the object's `score(candidates)` returns one score per candidate, lowest cleaned first.
/// The factory is called once now to check the object.
#[pyfunction]
#[pyo3(signature = (name, factory, about = ""))]
pub fn register_victim(py: Python<'_>, name: &str, factory: Py<PyAny>, about: &str) -> PyResult<()> {
    check_name(name, &Registry::builtin().victim_names())?;
    let probe = factory.bind(py).call1((0.0f64,))?;
    if !probe.hasattr("score")? {
        return Err(PyTypeError::new_err("a victim policy needs a score(candidates) method"));
    }
    let name = intern(name);
    REGISTRY.lock().add_victim(name, intern(about), move |params| {
        attach(|py| match factory.bind(py).call1((params.aging,)) {
            Ok(object) => Box::new(PyVictim {
                name,
                // Absent or not a bool: the policy does not read the counts.
                counts_live_bands: object
                    .getattr("counts_live_bands")
                    .and_then(|a| a.extract::<bool>())
                    .unwrap_or(false),
                object: object.unbind(),
            }) as Box<dyn VictimPolicy>,
            Err(e) => {
                log_error(name, "factory", e.to_string());
                Box::new(victim::Greedy)
            }
        })
    });
    Ok(())
}

/// Registers a placement policy written in Python under `name`. `factory(volume_pages)`
/// returns the policy object, one per volume. The factory is called once now to check the
/// object.
#[pyfunction]
#[pyo3(signature = (name, factory, about = ""))]
pub fn register_placement(py: Python<'_>, name: &str, factory: Py<PyAny>, about: &str) -> PyResult<()> {
    check_name(name, &Registry::builtin().placement_names())?;
    PyPlacement::new("probe", factory.bind(py).call1((1024u64,))?)?;
    let name = intern(name);
    REGISTRY.lock().add_placement(name, intern(about), move |pages| {
        attach(
            |py| match factory.bind(py).call1((pages,)).and_then(|object| PyPlacement::new(name, object)) {
                Ok(p) => Box::new(p) as Box<dyn Placement>,
                Err(e) => {
                    log_error(name, "factory", e.to_string());
                    Box::new(placement::UserGc)
                }
            },
        )
    });
    Ok(())
}

/// `(name, about)` of each policy of one kind.
type Described = Vec<(String, String)>;

/// `(victims, placements)`: every registered policy as `(name, about)` pairs.
#[pyfunction]
pub fn policies() -> (Described, Described) {
    let (victims, placements) = REGISTRY.lock().describe();
    let owned = |v: Vec<(&str, &str)>| v.into_iter().map(|(n, a)| (n.to_string(), a.to_string())).collect();
    (owned(victims), owned(placements))
}

/// The errors Python policies raised (the first 16; the total is in the last line when more),
/// and clears the log.
#[pyfunction]
pub fn policy_errors() -> Vec<String> {
    let mut log = ERRORS.lock();
    let mut out = std::mem::take(&mut log.kept);
    if log.total > out.len() as u64 {
        out.push(format!("... {} errors in all", log.total));
    }
    log.total = 0;
    out
}

/// A bench run's result when a Python policy raised during it: the first error logged after
/// `since` errors (as [`errors_logged`] counted before the run).
pub(crate) fn raise_if_errors_since(since: u64) -> PyResult<()> {
    let log = ERRORS.lock();
    if log.total <= since {
        return Ok(());
    }
    let first = log
        .kept
        .get(since as usize)
        .cloned()
        .unwrap_or_else(|| format!("{} errors in Python policies", log.total - since));
    Err(PyRuntimeError::new_err(format!(
        "a Python policy failed during the run (fell back to a safe answer, so the figures are not the policy's): {first}"
    )))
}
