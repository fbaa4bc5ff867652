//! Connection handling: listeners (TCP and Unix), one reader thread per connection driving the
//! [`proto`](crate::proto) codec, a shared pool of worker threads that execute requests
//! concurrently, and replies written as each request completes (possibly out of order).
//!
//! Limits: at most [`MAX_IN_FLIGHT_PER_CONNECTION`] requests per connection are executing or
//! queued (the reader stops reading until one finishes), at most [`MAX_CONNECTIONS`] connections,
//! request payloads at most [`proto::MAX_REQUEST_BYTES`].
//!
//! Shutdown: when the stop flag is raised, listeners stop accepting, readers stop reading new
//! requests, every request already read completes and is answered, then `serve` returns.

use crate::proto::{self, Catalog, Command, ExportInfo, Negotiated, ProtocolError, RawRequest, Step};
use parking_lot::{Condvar, Mutex};
use salsa_core::{ErrorKind, Pool, Volume};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

/// Requests one connection may have executing or queued.
pub const MAX_IN_FLIGHT_PER_CONNECTION: usize = 64;
/// Connections served at once; more are refused.
pub const MAX_CONNECTIONS: usize = 256;
/// Write payloads of rejected requests up to this size are read and discarded to keep the
/// stream in sync; larger ones close the connection.
const MAX_DISCARD_BYTES: u32 = 64 << 20;
/// How often blocked reads and accepts look at the stop flag.
const POLL: Duration = Duration::from_millis(100);

/// Where and how to serve.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub tcp: Option<SocketAddr>,
    pub unix: Option<PathBuf>,
    pub read_only: bool,
    /// Threads executing requests (shared by all connections).
    pub workers: usize,
}

/// The pool's volumes as NBD exports.
pub struct Exports {
    pool: Arc<Pool>,
    read_only: bool,
}

impl Exports {
    pub fn new(pool: Arc<Pool>, read_only: bool) -> Exports {
        Exports { pool, read_only }
    }

    fn info(&self, v: &Volume) -> ExportInfo {
        ExportInfo {
            name: v.name().to_string(),
            description: format!("SALSA volume ({} KiB pages)", v.page_bytes() / 1024),
            size_bytes: v.size_bytes(),
            read_only: self.read_only,
            preferred_block_bytes: v.page_bytes(),
        }
    }

    fn volume(&self, name: &str) -> Option<Volume> {
        if name.is_empty() {
            let names = self.pool.volume_names();
            let pick = if names.iter().any(|n| n == "default") {
                "default".to_string()
            } else {
                names.into_iter().next()?
            };
            return self.pool.volume(&pick).ok();
        }
        self.pool.volume(name).ok()
    }
}

impl Catalog for Exports {
    fn exports(&self) -> Vec<ExportInfo> {
        self.pool
            .volume_names()
            .iter()
            .filter_map(|n| self.pool.volume(n).ok())
            .map(|v| self.info(&v))
            .collect()
    }
    fn lookup(&self, name: &str) -> Option<ExportInfo> {
        self.volume(name).map(|v| self.info(&v))
    }
}

/// A connected client socket.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }
    fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
        }
    }
}

/// State shared by a connection's reader and the workers answering its requests.
struct Connection {
    writer: Mutex<Stream>,
    volume: Volume,
    negotiated: Negotiated,
    in_flight: Mutex<usize>,
    done: Condvar,
    broken: AtomicBool,
}

impl Connection {
    fn send(&self, bytes: &[u8]) {
        if self.broken.load(SeqCst) {
            return;
        }
        if self.writer.lock().write_all(bytes).is_err() {
            self.broken.store(true, SeqCst);
        }
    }
    fn finish_one(&self) {
        let mut n = self.in_flight.lock();
        *n -= 1;
        self.done.notify_all();
    }
}

struct Job {
    conn: Arc<Connection>,
    req: RawRequest,
    cmd: Command,
    payload: Vec<u8>,
}

/// Reads more bytes into `buf`; `Ok(false)` at end of stream. Timeouts return `Ok(true)` with
/// nothing read so the caller can look at the stop flag.
fn fill(stream: &mut Stream, buf: &mut Vec<u8>) -> io::Result<bool> {
    let mut chunk = [0u8; 256 << 10];
    match stream.read(&mut chunk) {
        Ok(0) => Ok(false),
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            Ok(true)
        }
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
            ) =>
        {
            Ok(true)
        }
        Err(e) => Err(e),
    }
}

fn errno_of(e: &salsa_core::Error) -> u32 {
    match e.kind() {
        ErrorKind::Io => proto::EIO,
        ErrorKind::NoSpace => proto::ENOSPC,
        ErrorKind::InvalidArgument => proto::EINVAL,
        ErrorKind::ReadOnly => proto::EPERM,
        ErrorKind::ShuttingDown => proto::ESHUTDOWN,
    }
}

/// Executes one command and encodes its reply.
fn execute(job: &Job) -> Vec<u8> {
    let Job { conn, req, cmd, payload } = job;
    let vol = &conn.volume;
    let structured = conn.negotiated.structured_replies;
    let cookie = req.cookie;
    let mut out = Vec::new();
    let fail = |out: &mut Vec<u8>, errno: u32, msg: &str| {
        if structured {
            proto::structured_error(out, cookie, errno, msg);
        } else {
            proto::simple_reply(out, cookie, errno, &[]);
        }
    };
    let ok = |out: &mut Vec<u8>| {
        if structured {
            proto::structured_done(out, cookie);
        } else {
            proto::simple_reply(out, cookie, 0, &[]);
        }
    };
    let with_fua = |r: salsa_core::Result<()>, fua: bool| r.and_then(|_| if fua { vol.flush() } else { Ok(()) });
    let result: salsa_core::Result<()> = match *cmd {
        Command::Read { offset, length, .. } => {
            let mut data = vec![0u8; length as usize];
            match vol.read(offset, &mut data) {
                Ok(()) => {
                    if structured {
                        proto::structured_data(&mut out, cookie, offset, &data, true);
                    } else {
                        proto::simple_reply(&mut out, cookie, 0, &data);
                    }
                    return out;
                }
                Err(e) => Err(e),
            }
        }
        Command::Write { offset, fua, .. } => with_fua(vol.write(offset, payload), fua),
        Command::Flush => vol.flush(),
        Command::Trim { offset, length, fua } => with_fua(vol.trim(offset, length as u64), fua),
        Command::WriteZeroes {
            offset,
            length,
            fua,
            no_hole,
            fast,
        } => {
            let page = vol.page_bytes() as u64;
            let aligned = offset.is_multiple_of(page) && (length as u64).is_multiple_of(page);
            if fast && (no_hole || !aligned) {
                // Zeroing would cost as much as writing: tell the client to write instead.
                fail(
                    &mut out,
                    proto::ENOTSUP,
                    "fast zeroing is only possible for whole pages without NO_HOLE",
                );
                return out;
            }
            let r = if no_hole {
                vol.write(offset, &vec![0u8; length as usize])
            } else {
                vol.write_zeroes(offset, length as u64)
            };
            with_fua(r, fua)
        }
        Command::Cache { .. } => Ok(()),
        Command::BlockStatus { offset, length, req_one } => {
            let extents = block_status(vol, offset, length, req_one);
            proto::structured_block_status(&mut out, cookie, &extents);
            return out;
        }
        Command::Disconnect => Ok(()),
    };
    match result {
        Ok(()) => ok(&mut out),
        Err(e) => {
            tracing::warn!("request {cmd} failed: {e}");
            fail(&mut out, errno_of(&e), &e.to_string())
        }
    }
    out
}

/// `base:allocation` extents covering `[offset, offset + length)` (at most 1024 descriptors).
fn block_status(vol: &Volume, offset: u64, length: u32, req_one: bool) -> Vec<(u32, u32)> {
    let page = vol.page_bytes() as u64;
    let end = offset + length as u64;
    let mut extents: Vec<(u32, u32)> = Vec::new();
    let mut at = offset;
    while at < end {
        let next = ((at / page) + 1) * page;
        let n = (next.min(end) - at) as u32;
        let flags = if vol.page_location(at / page).is_some() {
            0
        } else {
            proto::STATE_HOLE | proto::STATE_ZERO
        };
        match extents.last_mut() {
            Some((len, f)) if *f == flags && len.checked_add(n).is_some() => *len += n,
            _ => {
                if req_one && !extents.is_empty() || extents.len() >= 1024 {
                    break;
                }
                extents.push((n, flags));
            }
        }
        at += n as u64;
    }
    extents
}

/// Serves one connection until it disconnects, breaks, or `stop` is raised.
fn handle(mut stream: Stream, exports: &Exports, jobs: &crossbeam_channel::Sender<Job>, stop: &AtomicBool) -> Result<(), String> {
    stream.set_read_timeout(Some(POLL)).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    proto::Handshake::greeting(&mut out);
    stream.write_all(&out).map_err(|e| e.to_string())?;
    let mut hs = proto::Handshake::new();
    let mut buf = Vec::new();
    let negotiated = loop {
        let mut consumed = 0;
        out.clear();
        let step = hs.step(&buf, &mut consumed, &mut out, exports);
        buf.drain(..consumed);
        if !out.is_empty() {
            stream.write_all(&out).map_err(|e| e.to_string())?;
        }
        match step {
            Ok(Step::Done(n)) => break n,
            Ok(Step::Progress) => continue,
            Ok(Step::NeedMore) => {
                if stop.load(SeqCst) {
                    return Ok(());
                }
                if !fill(&mut stream, &mut buf).map_err(|e| e.to_string())? {
                    return Ok(());
                }
            }
            Err(ProtocolError::Aborted) => return Ok(()),
            Err(e) => return Err(e.to_string()),
        }
    };
    let Some(volume) = exports.volume(&negotiated.export.name) else {
        return Err("export vanished".into());
    };
    let conn = Arc::new(Connection {
        writer: Mutex::new(stream.try_clone().map_err(|e| e.to_string())?),
        volume,
        negotiated,
        in_flight: Mutex::new(0),
        done: Condvar::new(),
        broken: AtomicBool::new(false),
    });
    let result = transmission(&mut stream, &mut buf, &conn, jobs, stop);
    // Every request read is answered before the connection closes.
    let mut n = conn.in_flight.lock();
    while *n > 0 {
        conn.done.wait_for(&mut n, POLL);
    }
    drop(n);
    stream.shutdown();
    result
}

fn transmission(
    stream: &mut Stream,
    buf: &mut Vec<u8>,
    conn: &Arc<Connection>,
    jobs: &crossbeam_channel::Sender<Job>,
    stop: &AtomicBool,
) -> Result<(), String> {
    loop {
        if stop.load(SeqCst) || conn.broken.load(SeqCst) {
            return Ok(());
        }
        let req = match proto::parse_request(buf) {
            Ok(Some(r)) => r,
            Ok(None) => {
                if !fill(stream, buf).map_err(|e| e.to_string())? {
                    return Ok(()); // client went away
                }
                continue;
            }
            Err(e) => return Err(e.to_string()),
        };
        let payload_len = req.payload_bytes();
        if payload_len > MAX_DISCARD_BYTES {
            return Err(ProtocolError::PayloadTooLarge(payload_len).to_string());
        }
        // The payload goes straight into its own buffer: what is already buffered, then the
        // rest read from the socket directly (no copy through `buf`, no shifting of `buf`).
        let have = (buf.len() - proto::REQUEST_HEADER_BYTES).min(payload_len as usize);
        let mut payload = Vec::with_capacity(payload_len as usize);
        payload.extend_from_slice(&buf[proto::REQUEST_HEADER_BYTES..proto::REQUEST_HEADER_BYTES + have]);
        buf.drain(..proto::REQUEST_HEADER_BYTES + have);
        while payload.len() < payload_len as usize {
            // read_to_end fills spare capacity without zeroing it first.
            let want = (payload_len as usize - payload.len()) as u64;
            match (&mut *stream).take(want).read_to_end(&mut payload) {
                Ok(0) => return Ok(()), // vanished mid-payload: the partial write is never applied
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                    ) =>
                {
                    if stop.load(SeqCst) {
                        return Ok(());
                    }
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        let cmd = match proto::validate(&req, &conn.negotiated) {
            Ok(c) => c,
            Err(errno) => {
                let mut out = Vec::new();
                if conn.negotiated.structured_replies {
                    proto::structured_error(&mut out, req.cookie, errno, "invalid request");
                } else {
                    proto::simple_reply(&mut out, req.cookie, errno, &[]);
                }
                conn.send(&out);
                continue;
            }
        };
        if cmd == Command::Disconnect {
            return Ok(());
        }
        {
            let mut n = conn.in_flight.lock();
            while *n >= MAX_IN_FLIGHT_PER_CONNECTION {
                conn.done.wait_for(&mut n, POLL);
            }
            *n += 1;
        }
        if jobs
            .send(Job {
                conn: conn.clone(),
                req,
                cmd,
                payload,
            })
            .is_err()
        {
            conn.finish_one();
            return Err("worker pool stopped".into());
        }
    }
}

/// Binds a Unix socket, replacing a stale one left by a killed server but refusing one that a
/// live server answers on.
pub fn bind_unix(path: &Path) -> Result<UnixListener, String> {
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(format!("another server is listening on {}", path.display()));
        }
        std::fs::remove_file(path).map_err(|e| format!("cannot remove stale socket {}: {e}", path.display()))?;
    }
    UnixListener::bind(path).map_err(|e| format!("cannot listen on {}: {e}", path.display()))
}

/// Listeners bound and ready; [`Listening::run`] serves until `stop`.
pub struct Listening {
    tcp: Option<TcpListener>,
    unix: Option<(UnixListener, PathBuf)>,
    exports: Arc<Exports>,
    workers: usize,
}

impl Listening {
    /// Binds the configured addresses (so errors surface before serving starts).
    pub fn bind(pool: Arc<Pool>, cfg: &ServerConfig) -> Result<Listening, String> {
        if cfg.tcp.is_none() && cfg.unix.is_none() {
            return Err("nothing to listen on: give a TCP address or a Unix socket".into());
        }
        let tcp = match cfg.tcp {
            Some(addr) => {
                let l = TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
                l.set_nonblocking(true).map_err(|e| e.to_string())?;
                Some(l)
            }
            None => None,
        };
        let unix = match &cfg.unix {
            Some(p) => {
                let l = bind_unix(p)?;
                l.set_nonblocking(true).map_err(|e| e.to_string())?;
                Some((l, p.clone()))
            }
            None => None,
        };
        Ok(Listening {
            tcp,
            unix,
            exports: Arc::new(Exports::new(pool, cfg.read_only)),
            workers: cfg.workers.clamp(1, 1024),
        })
    }

    /// The bound TCP address (useful with port 0).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Accepts and serves connections until `stop` is raised, then waits for every connection
    /// to answer what it has read.
    pub fn run(self, stop: Arc<AtomicBool>) {
        let (tx, rx) = crossbeam_channel::bounded::<Job>(MAX_IN_FLIGHT_PER_CONNECTION * 4);
        let workers: Vec<_> = (0..self.workers)
            .map(|_| {
                let rx = rx.clone();
                std::thread::spawn(move || {
                    while let Ok(job) = rx.recv() {
                        let reply = execute(&job);
                        job.conn.send(&reply);
                        job.conn.finish_one();
                    }
                })
            })
            .collect();
        let active = Arc::new(AtomicUsize::new(0));
        let mut conns = Vec::new();
        while !stop.load(SeqCst) {
            let mut accepted = Vec::new();
            if let Some(l) = &self.tcp {
                while let Ok((s, peer)) = l.accept() {
                    let _ = s.set_nodelay(true);
                    let _ = s.set_nonblocking(false);
                    tracing::info!("connection from {peer}");
                    accepted.push(Stream::Tcp(s));
                }
            }
            if let Some((l, _)) = &self.unix {
                while let Ok((s, _)) = l.accept() {
                    let _ = s.set_nonblocking(false);
                    accepted.push(Stream::Unix(s));
                }
            }
            for s in accepted {
                if active.load(SeqCst) >= MAX_CONNECTIONS {
                    tracing::warn!("refusing a connection: {MAX_CONNECTIONS} already open");
                    s.shutdown();
                    continue;
                }
                active.fetch_add(1, SeqCst);
                let (exports, tx, stop, active) = (self.exports.clone(), tx.clone(), stop.clone(), active.clone());
                conns.push(std::thread::spawn(move || {
                    if let Err(e) = handle(s, &exports, &tx, &stop) {
                        tracing::warn!("connection closed: {e}");
                    }
                    active.fetch_sub(1, SeqCst);
                }));
            }
            conns.retain(|h| !h.is_finished());
            std::thread::sleep(Duration::from_millis(20));
        }
        for h in conns {
            let _ = h.join();
        }
        drop(tx);
        for w in workers {
            let _ = w.join();
        }
        if let Some((_, p)) = &self.unix {
            let _ = std::fs::remove_file(p);
        }
    }
}
