//! The control socket of a running server: how a command reaches it (the client side:
//! [`running_server`], [`request`], or [`open_offline`] when no server has the pool) and how
//! the server accepts its connections ([`control_thread`]). What each request does is
//! `commands::control_requests`; this module depends on no command, so that every command can
//! use it.
//!
//! The control socket speaks lines: a client sends one request line (`stats`, `scrub`,
//! `scrub repair`, `fail <member>`, `volume <JSON of a salsa volume command>` (see
//! `salsa volume`), `share <volume> <dst>:<src>:<len> ...`, `replace <member> <new device
//! spec> [<bytes per second> [force]]`, or `rebuild-rate <bytes per second, 0: no limit>`); the server
//! answers `stats` and `scrub` with one JSON line, `fail`, `share` and `rebuild-rate` with `ok`
//! or `error`, `volume` with `ok <JSON string to print>` or `error`, and `replace` with
//! `progress <done> <total>` lines and
//! a final `ok <json>` or `error <message>` line. A client that sends nothing gets the
//! statistics (what `salsa stats` did before requests existed).

use crate::*;
use std::io::{BufRead, BufReader, Write};
use std::sync::Arc;

/// The control socket of a server that answers: `control`, or the one next to the first
/// device.
pub(crate) fn running_server(devices: &[DeviceSpec], control: Option<&std::path::Path>) -> Option<std::path::PathBuf> {
    control
        .map(|p| p.to_path_buf())
        .or_else(|| devices.first().map(|d| salsa_core::spec::control_path_for(&d.path)))
        .filter(|p| std::os::unix::net::UnixStream::connect(p).is_ok())
}

/// Opens the pool on `devices` for a change, when no server has it.
pub(crate) fn open_offline(devices: &[DeviceSpec], parity_buffer: Option<&DeviceSpec>) -> Result<Pool, String> {
    if devices.is_empty() {
        return Err("give the pool's devices (--device), or --control of the server that serves it".into());
    }
    salsa_core::spec::check_distinct(devices.iter().chain(parity_buffer))?;
    let devs = open_present(devices, |d| d.open_existing(false))?;
    let opts = with_parity_buffer(rw_options(), parity_buffer, None)?;
    Pool::open(devs, &opts).map_err(|e| e.to_string())
}

/// Sends one request line to the server at `control` and returns its one-line answer, or the
/// error it answered with.
pub(crate) fn request(control: &std::path::Path, line: &str) -> Result<String, String> {
    let mut s = std::os::unix::net::UnixStream::connect(control).map_err(|e| format!("{}: {e}", control.display()))?;
    writeln!(s, "{line}").map_err(|e| e.to_string())?;
    let mut answer = String::new();
    BufReader::new(s).read_line(&mut answer).map_err(|e| e.to_string())?;
    match answer.trim() {
        "" => Err("the server closed the control connection without an answer".into()),
        a => match a.strip_prefix("error ") {
            Some(e) => Err(e.to_string()),
            None => Ok(a.to_string()),
        },
    }
}

/// Most control connections answered at once (a rebuild holds one for its whole run).
const CONTROL_CONNECTIONS_MAX: usize = 8;

/// Answers one control connection.
pub(crate) type ControlAnswer = Arc<dyn Fn(std::os::unix::net::UnixStream) + Send + Sync>;

/// When this process began serving: the pool's counters (`salsa stats`) run from then.
pub(crate) static SERVING_SINCE: std::sync::OnceLock<std::time::SystemTime> = std::sync::OnceLock::new();

/// Answers the control socket with `answer` (for a pool,
/// [`crate::commands::control_requests::answer`]), each connection on its own thread, until
/// `stop`; waits for the connections in progress.
pub(crate) fn control_thread(listener: std::os::unix::net::UnixListener, answer: ControlAnswer, stop: Arc<std::sync::atomic::AtomicBool>) {
    SERVING_SINCE.get_or_init(std::time::SystemTime::now);
    let _ = listener.set_nonblocking(true);
    let mut running: Vec<std::thread::JoinHandle<()>> = Vec::new();
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        running.retain(|h| !h.is_finished());
        match listener.accept() {
            Ok((s, _)) if running.len() < CONTROL_CONNECTIONS_MAX => {
                let answer = answer.clone();
                running.push(std::thread::spawn(move || answer(s)));
            }
            Ok((mut s, _)) => {
                let _ = writeln!(s, "error the server is busy with {CONTROL_CONNECTIONS_MAX} control requests");
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    }
    for h in running {
        let _ = h.join();
    }
}
