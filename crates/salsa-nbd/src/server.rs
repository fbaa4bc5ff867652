//! Connection handling: listeners (TCP and Unix), and for each connection a small set of
//! threads that take turns reading requests through the [`proto`] codec
//! (leader/follower): the thread that read a request executes it and sends its reply as soon
//! as it completes (possibly out of order), while another thread reads the next one. No request
//! is handed from one thread to another, which on few cores is what costs most per request.
//! Replies are combined: one that is ready while another thread is sending is queued for that
//! thread, which sends the queue in one write. Large writes are received into payload buffers
//! of the volume, whose records then hold the pages instead of copying them.
//!
//! Limits: at most [`ServerConfig::threads_per_connection`] (capped at
//! [`MAX_THREADS_PER_CONNECTION`]) requests per connection execute at once; threads start on
//! demand, when no other thread of the connection is waiting for a request. At most
//! [`MAX_CONNECTIONS`] connections, request payloads at most [`proto::MAX_REQUEST_BYTES`],
//! replies queued for the sending thread at most [`MAX_PENDING_REPLY_BYTES`] (or one larger
//! reply alone).
//!
//! Shutdown: when the stop flag is raised, listeners stop accepting, connections stop reading
//! new requests, every request already read completes and is answered, then `run` returns.

use crate::proto::{self, Catalog, Command, ExportInfo, Negotiated, ProtocolError, RawRequest, Step, TlsMode};
use parking_lot::{Condvar, Mutex};
use salsa_core::frontend::{BlockVolume, RawVolume};
use salsa_core::{ErrorKind, Pool};
use salsa_core::{PagedPayload, WriteBuffer, WrittenNow};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::{Duration, Instant};

/// Requests one connection may have executing at once, whatever the configuration asks.
pub const MAX_THREADS_PER_CONNECTION: usize = 256;
/// A thread's reply and payload buffers are kept for its next request up to this size (a
/// 32 MiB request's are not).
const KEEP_BUFFER_BYTES: usize = 4 << 20;
/// Replies queued for the connection's sending thread, at most (one larger reply may be queued
/// alone).
pub const MAX_PENDING_REPLY_BYTES: usize = 1 << 20;
/// Replies to reads answered from memory are sent together once they reach this size (or
/// sooner, see [`serve_requests`]).
const MEMORY_REPLY_BATCH_BYTES: usize = 256 << 10;
/// Replies to paced writes one connection holds for their turn, at most (see
/// [`HeldReplies`]); a client with more writes in flight has the rest paced on threads that
/// sleep for their turns.
const MAX_HELD_REPLIES: usize = 1024;
/// The timer slack of a connection's threads: the thread that holds replies wakes for each
/// one's turn, and every microsecond late delays all the replies it holds (the default, 50
/// us, gave paced writes a p99 a quarter higher in `salsa bench-raid`: docs/BENCHMARKS.md).
const TIMER_SLACK: Duration = Duration::from_micros(1);
/// Connections served at once; more are refused.
pub const MAX_CONNECTIONS: usize = 256;
/// Write payloads of rejected requests up to this size are read and discarded to keep the
/// stream in sync; larger ones close the connection.
const MAX_DISCARD_BYTES: u32 = 64 << 20;
/// How often blocked reads and accepts look at the stop flag.
const POLL: Duration = Duration::from_millis(100);
/// Buffers per vectored read (Linux's `IOV_MAX`).
const MAX_IOVECS: usize = 1024;
/// A payload whose rest read from the socket is at least this large is followed by a small
/// receive-buffer fill (see `read_exact_vectored_or_stop`).
const LARGE_PAYLOAD_BYTES: usize = 64 << 10;
/// The low-water mark (`SO_RCVLOWAT`) a payload read from TCP sets while at least
/// [`LARGE_PAYLOAD_BYTES`] of the payload are still to come, never above what is left of it
/// (so a read never waits for bytes the client need not send). Why: without it the kernel
/// wakes the reading thread for every segment that arrives (64 KiB on loopback); each small
/// read opens the receive window a little and sends the client a window update, and the
/// client's kernel answers each by pushing a few more segments from inside its `send`. Under
/// fio's 1 MiB writes over loopback that was 6 window updates per MiB and half the throughput
/// a mark of 128 KiB or more gives (docs/BENCHMARKS.md). A Unix socket has no window: the mark
/// changed nothing there and is not set.
const PAYLOAD_LOW_WATER_BYTES: usize = 256 << 10;

/// Where and how to serve.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub tcp: Option<SocketAddr>,
    pub unix: Option<PathBuf>,
    pub read_only: bool,
    /// Requests of one connection executed at once, each on its own thread.
    pub threads_per_connection: usize,
    /// Whether clients may (or must) start TLS, and with what credentials (required unless
    /// the mode is off).
    pub tls: TlsMode,
    pub tls_server: Option<crate::tls::TlsServer>,
}

/// What a server serves: the pool's volumes, or one device served raw.
enum Source {
    Pool(Arc<Pool>),
    Raw(Arc<RawVolume>),
}

/// The exports of a server, and how many connections each has open (so that a volume is not
/// deleted under a client; see [`Exports::unless_open`]).
pub struct Exports {
    source: Source,
    read_only: bool,
    clients: StdMutex<std::collections::HashMap<String, usize>>,
}

/// A connection's hold on its export: counted by [`Exports::clients_of`] until dropped.
struct ClientOf<'a> {
    exports: &'a Exports,
    name: String,
}

impl Drop for ClientOf<'_> {
    fn drop(&mut self) {
        let mut clients = self.exports.clients.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = clients.get_mut(&self.name) {
            *n -= 1;
            if *n == 0 {
                clients.remove(&self.name);
            }
        }
    }
}

impl Exports {
    /// The pool's volumes, one export each.
    pub fn new(pool: Arc<Pool>, read_only: bool) -> Exports {
        Exports {
            source: Source::Pool(pool),
            read_only,
            clients: StdMutex::default(),
        }
    }

    /// One device served as it is (a baseline), as the only export.
    pub fn raw(export: RawVolume, read_only: bool) -> Exports {
        Exports {
            source: Source::Raw(Arc::new(export)),
            read_only,
            clients: StdMutex::default(),
        }
    }

    fn info(&self, v: &dyn BlockVolume) -> ExportInfo {
        ExportInfo {
            name: v.name().to_string(),
            description: v.description(),
            size_bytes: v.size_bytes(),
            read_only: self.read_only,
            preferred_block_bytes: v.preferred_block_bytes(),
        }
    }

    fn all(&self) -> Vec<Arc<dyn BlockVolume>> {
        match &self.source {
            Source::Pool(pool) => pool
                .volume_names()
                .iter()
                .filter_map(|n| pool.volume(n).ok())
                .map(|v| Arc::new(v) as Arc<dyn BlockVolume>)
                .collect(),
            Source::Raw(r) => vec![r.clone() as Arc<dyn BlockVolume>],
        }
    }

    /// The export named `name`; the empty name is `default`, or the first.
    fn volume(&self, name: &str) -> Option<Arc<dyn BlockVolume>> {
        let all = self.all();
        if name.is_empty() {
            let pick = all.iter().position(|v| v.name() == "default").unwrap_or(0);
            return all.into_iter().nth(pick);
        }
        all.into_iter().find(|v| v.name() == name)
    }

    /// Opens export `name` for a connection: its handle, and the hold that counts the
    /// connection as its client until dropped.
    fn open(&self, name: &str) -> Option<(Arc<dyn BlockVolume>, ClientOf<'_>)> {
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        let export = self.volume(name)?;
        let name = export.name().to_string();
        *clients.entry(name.clone()).or_insert(0) += 1;
        Some((export, ClientOf { exports: self, name }))
    }

    /// Connections that have export `name` open now.
    pub fn clients_of(&self, name: &str) -> usize {
        self.clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .copied()
            .unwrap_or(0)
    }

    /// Runs `change` (deleting the volume behind export `name`, say) only when no connection
    /// has the export open, and lets no connection open it while `change` runs; otherwise
    /// `Err` with the number of connections that have it open.
    pub fn unless_open<T>(&self, name: &str, change: impl FnOnce() -> T) -> Result<T, usize> {
        let clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        match clients.get(name).copied().unwrap_or(0) {
            0 => Ok(change()),
            n => Err(n),
        }
    }
}

impl Catalog for Exports {
    fn exports(&self) -> Vec<ExportInfo> {
        self.all().iter().map(|v| self.info(v.as_ref())).collect()
    }
    fn lookup(&self, name: &str) -> Option<ExportInfo> {
        self.volume(name).map(|v| self.info(v.as_ref()))
    }
}

/// A connected client socket.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> std::os::unix::io::RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }
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
    /// Sets the socket's receive low-water mark on a TCP stream (nothing on a Unix one): a
    /// blocking read then returns once `bytes` have arrived or its buffers are full, a time-out
    /// or the end of the stream come first. A failure is only logged: the mark saves wakeups
    /// and changes no result.
    fn set_receive_low_water(&self, bytes: usize) {
        let Stream::Tcp(s) = self else { return };
        let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        // SAFETY: `s` owns an open socket for the call's duration, and the option value is a
        // `c_int` whose address and size are passed together.
        let rc = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            tracing::debug!("SO_RCVLOWAT {bytes}: {}", io::Error::last_os_error());
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
    fn read_vectored(&mut self, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read_vectored(bufs),
            Stream::Unix(s) => s.read_vectored(bufs),
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

/// The receiving half of a connection: the socket, bytes read but not yet parsed, and whether
/// the request stream has ended (client gone or disconnected, protocol error, shutdown).
struct Receiver {
    stream: Stream,
    inbox: Inbox,
    ended: bool,
    /// A write was answered by the receiving thread since it last waited for the socket: before
    /// it waits again, it asks the volume for write-behind ([`write_behind`]).
    wrote: bool,
    /// Replies to paced writes, held until their turn.
    held: HeldReplies,
}

/// Replies to writes the receiving thread wrote at once while the pool paces writes
/// (`salsa_core::Volume::write_paged_now`), each held until its turn: a client that waits for
/// its replies before it writes more is held to the pool's rate, and no thread sleeps per
/// write (on a host of few cores, the wake-ups of threads sleeping per write were most of a
/// paced write's latency tail: docs/BENCHMARKS.md). The thread that holds the receiver sends
/// them when due, waking for them while it waits for the client, and sends them all when the
/// request stream ends. At most [`MAX_HELD_REPLIES`]: a write that finds the queue full is
/// executed by a thread that may wait, whose write the pacer holds by sleeping.
#[derive(Default)]
struct HeldReplies {
    /// When each reply is due, and its request's cookie; the earliest first.
    queue: BinaryHeap<Reverse<(Instant, u64)>>,
}

impl HeldReplies {
    fn is_full(&self) -> bool {
        self.queue.len() >= MAX_HELD_REPLIES
    }

    fn hold(&mut self, due: Instant, cookie: u64) {
        self.queue.push(Reverse((due, cookie)));
    }

    /// Appends to `out` the replies due by `now` (or a little before: [`salsa_core::ack_due`];
    /// a write's success is a simple reply with or without structured replies, as
    /// [`status_reply`] sends it); returns when the next one is due.
    fn release(&mut self, out: &mut Vec<u8>, now: Instant) -> Option<Instant> {
        while let Some(&Reverse((due, cookie))) = self.queue.peek() {
            if !salsa_core::ack_due(due, now) {
                return Some(due);
            }
            self.queue.pop();
            proto::simple_reply(out, cookie, 0, &[]);
        }
        None
    }

    /// Appends every held reply to `out`, due or not: the request stream ended, and the writes
    /// are done.
    fn release_all(&mut self, out: &mut Vec<u8>) {
        while let Some(Reverse((_, cookie))) = self.queue.pop() {
            proto::simple_reply(out, cookie, 0, &[]);
        }
    }
}

/// One connection, served by up to `max_threads` threads in turn (leader/follower): whichever
/// thread holds the receiver reads the next request, lets go of the receiver and executes the
/// request itself, so a request never waits for a hand-off to another thread.
struct Connection {
    receiver: StdMutex<Receiver>,
    /// The socket's sending side, used by the thread that set `outbox.sending`.
    writer: StdMutex<Stream>,
    outbox: Mutex<Outbox>,
    /// Signalled when the queued replies were taken for sending.
    drained: Condvar,
    volume: Arc<dyn BlockVolume>,
    negotiated: Negotiated,
    broken: AtomicBool,
    /// Threads serving this connection, and how many of them are waiting for a request.
    threads: AtomicUsize,
    waiting: AtomicUsize,
    max_threads: usize,
    /// Why the request stream ended, when it was an error.
    error: Mutex<Option<String>>,
}

impl Connection {
    /// Sends one reply whole. Replies are combined: a thread that finds another one writing
    /// to the socket queues its reply for that thread and returns, and the writer sends
    /// everything queued in one write before it lets go. Under load that means one send (and
    /// far fewer TCP segments and acknowledgements) for many replies, instead of every thread
    /// contending for the socket with its own.
    fn send(&self, bytes: &[u8]) {
        let mut outbox = self.outbox.lock();
        loop {
            if self.broken.load(SeqCst) {
                return;
            }
            if !outbox.sending {
                break;
            }
            // Bounded: a reply joins the queue if it fits in MAX_PENDING_REPLY_BYTES, or if the
            // queue is empty (so a large reply waits for one hand-over at most, never starves).
            if outbox.pending.is_empty() || outbox.pending.len() + bytes.len() <= MAX_PENDING_REPLY_BYTES {
                outbox.pending.extend_from_slice(bytes);
                return;
            }
            self.drained.wait(&mut outbox);
        }
        outbox.sending = true;
        drop(outbox);
        let mut writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let mut ok = writer.write_all(bytes).is_ok();
        let mut batch = Vec::new();
        loop {
            let mut outbox = self.outbox.lock();
            if !ok {
                self.broken.store(true, SeqCst);
                outbox.pending.clear();
            }
            if outbox.pending.is_empty() {
                outbox.sending = false;
                self.drained.notify_all();
                return;
            }
            if batch.capacity() > KEEP_BUFFER_BYTES {
                batch = Vec::new();
            }
            // The queue takes the emptied batch buffer, so both keep their capacity.
            batch.clear();
            std::mem::swap(&mut batch, &mut outbox.pending);
            self.drained.notify_all();
            drop(outbox);
            ok = writer.write_all(&batch).is_ok();
        }
    }
}

/// Replies queued for the thread that is writing to the socket.
#[derive(Default)]
struct Outbox {
    /// A thread is writing replies; the others queue theirs in `pending`.
    sending: bool,
    pending: Vec<u8>,
}

/// A request read whole and validated. A write's payload is in `held` (received where the
/// volume keeps it, so the pages are never copied again) or in the reading thread's buffer.
struct Request {
    req: RawRequest,
    cmd: Command,
    held: Option<Held>,
}

/// A write's payload received where the volume keeps it.
enum Held {
    /// A buffer the volume's log records may hold (unbuffered volumes).
    Buffer(WriteBuffer),
    /// Write-buffer pages (buffered volumes).
    Pages(PagedPayload),
}

/// Bytes read from a client and not yet parsed: a fixed buffer, initialised once, so reading
/// costs no allocation and no zeroing per request.
struct Inbox {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// Most bytes the next [`Inbox::fill`] reads: [`Inbox::BYTES`], or [`Inbox::TAIL_BYTES`]
    /// right after at least [`LARGE_PAYLOAD_BYTES`] of a payload were read from the socket. Why: a stream
    /// of large writes has the next payload queued behind each header, and a full fill would
    /// take up to `BYTES` of it, each byte then copied again into the pages that keep it.
    next_fill_bytes: usize,
}

impl Inbox {
    /// Room for the largest message parsed from it whole: a request header, or an option of
    /// up to [`proto::MAX_OPTION_BYTES`] with its header (longer ones are discarded piecewise).
    const BYTES: usize = 256 << 10;
    /// What is read past a payload received straight from the socket: room for the headers
    /// of the requests behind it (many small ones) and little of a large one's payload.
    const TAIL_BYTES: usize = 4 << 10;

    fn new() -> Inbox {
        Inbox {
            buf: vec![0u8; Self::BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            next_fill_bytes: Self::BYTES,
        }
    }

    fn data(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    fn consume(&mut self, n: usize) {
        debug_assert!(n <= self.end - self.start);
        self.start += n.min(self.end - self.start);
    }

    /// Reads more bytes; `Ok(false)` at end of stream. Timeouts return `Ok(true)` with nothing
    /// read so the caller can look at the stop flag.
    fn fill(&mut self, stream: &mut Stream) -> io::Result<bool> {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        } else if self.end == self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        if self.end == self.buf.len() {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "message larger than the receive buffer"));
        }
        let limit = (self.end + self.next_fill_bytes).min(self.buf.len());
        self.next_fill_bytes = Self::BYTES;
        match stream.read(&mut self.buf[self.end..limit]) {
            Ok(0) => Ok(false),
            Ok(n) => {
                self.end += n;
                Ok(true)
            }
            Err(e) if is_retry(&e) => Ok(true),
            Err(e) if client_left(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Errors that mean the client closed its end: the connection ends as at end of stream, not
/// as a failure (a health check that connects and leaves before the greeting is one).
fn client_left(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted
    )
}

/// Writes a handshake message; `Ok(false)` when the client has left.
fn send_handshake(stream: &mut Stream, bytes: &[u8]) -> Result<bool, String> {
    match stream.write_all(bytes) {
        Ok(()) => Ok(true),
        Err(e) if client_left(&e) => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}

/// Errors after which reading may simply go on (after a look at the stop flag).
fn is_retry(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

fn errno_of(e: &salsa_core::Error) -> u32 {
    match e.kind() {
        ErrorKind::Io => proto::EIO,
        ErrorKind::NoSpace => proto::ENOSPC,
        ErrorKind::InvalidArgument => proto::EINVAL,
        ErrorKind::ReadOnly | ErrorKind::NotPermitted => proto::EPERM,
        ErrorKind::ShuttingDown => proto::ESHUTDOWN,
    }
}

/// Appends an error reply: a structured error chunk with `msg` when structured replies were
/// negotiated, else a simple reply carrying only the errno.
fn error_reply(out: &mut Vec<u8>, structured: bool, cookie: u64, errno: u32, msg: &str) {
    if structured {
        proto::structured_error(out, cookie, errno, msg);
    } else {
        proto::simple_reply(out, cookie, errno, &[]);
    }
}

/// Executes one request and appends its reply to `out`.
fn execute(conn: &Connection, request: Request, payload: &[u8], out: &mut Vec<u8>) {
    let Request { req, cmd, held } = request;
    let vol = &conn.volume;
    let structured = conn.negotiated.structured_replies;
    let cookie = req.cookie;
    let fail = |out: &mut Vec<u8>, errno: u32, msg: &str| error_reply(out, structured, cookie, errno, msg);
    let with_fua = |r: salsa_core::Result<()>, fua: bool| r.and_then(|_| if fua { vol.flush() } else { Ok(()) });
    let result: salsa_core::Result<()> = match cmd {
        Command::Read { offset, length, .. } => {
            match append_read_reply(out, structured, cookie, offset, length, |buf| vol.read(offset, buf).map(|()| true)) {
                Ok(_) => return,
                Err(e) => Err(e),
            }
        }
        Command::Write { offset, fua, .. } => {
            let written = match held {
                Some(Held::Buffer(buf)) => vol.write_payload(offset, buf),
                Some(Held::Pages(pages)) => vol.write_paged(pages),
                None => vol.write(offset, payload),
            };
            with_fua(written, fua)
        }
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
                fail(out, proto::ENOTSUP, "fast zeroing is only possible for whole pages without NO_HOLE");
                return;
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
            let extents = block_status(vol.as_ref(), offset, length, req_one);
            proto::structured_block_status(out, cookie, &extents);
            return;
        }
        Command::Disconnect => Ok(()),
    };
    status_reply(out, structured, cookie, &cmd, result);
}

/// Appends the reply to a request that returns no data: done, or its error. Success is a
/// simple reply even with structured replies negotiated (the protocol allows either for
/// every command but a read): 16 bytes that a client reads in one go, where a structured
/// chunk's 20 take libnbd two reads, one more system call per write and flush on the
/// client's side. Errors go structured, with their message.
fn status_reply(out: &mut Vec<u8>, structured: bool, cookie: u64, cmd: &Command, result: salsa_core::Result<()>) {
    match result {
        Ok(()) => proto::simple_reply(out, cookie, 0, &[]),
        Err(e) => {
            tracing::warn!("request {cmd} failed: {e}");
            error_reply(out, structured, cookie, errno_of(&e), &e.to_string())
        }
    }
}

/// Appends the reply to a read of `length` bytes at `offset`, its data read by `read`
/// straight into the reply after its header. When `read` fails or declines (`Ok(false)`),
/// nothing is appended.
fn append_read_reply(
    out: &mut Vec<u8>,
    structured: bool,
    cookie: u64,
    offset: u64,
    length: u32,
    read: impl FnOnce(&mut [u8]) -> salsa_core::Result<bool>,
) -> salsa_core::Result<bool> {
    let start = out.len();
    if structured {
        proto::structured_data_header(out, cookie, offset, length, true);
    } else {
        proto::simple_reply(out, cookie, 0, &[]);
    }
    let data_at = out.len();
    out.resize(data_at + length as usize, 0);
    let r = read(&mut out[data_at..]);
    if !matches!(r, Ok(true)) {
        out.truncate(start);
    }
    r
}

/// Answers, into `answered`, a request that needs no wait, on the thread that received it: a
/// read whose data is all in memory, or a write (without FUA) whose pages the write buffer
/// takes at once (its reply held in `replies` until its turn while the pool paces writes).
/// Gives the request back when a thread that may wait must execute it.
fn answer_at_once(conn: &Connection, request: Request, answered: &mut Vec<u8>, replies: &mut HeldReplies) -> Option<Request> {
    match request.cmd {
        Command::Read { .. } if answer_from_memory(conn, &request, answered) => None,
        Command::Write { fua: false, .. } if !replies.is_full() => {
            let Request { req, cmd, held } = request;
            let pages = match held {
                Some(Held::Pages(pages)) => pages,
                held => return Some(Request { req, cmd, held }),
            };
            let result = match conn.volume.write_paged_now(pages) {
                Ok(WrittenNow::Written { ack_at: None }) => Ok(()),
                Ok(WrittenNow::Written { ack_at: Some(due) }) => {
                    replies.hold(due, req.cookie);
                    return None;
                }
                Ok(WrittenNow::NotNow(pages)) => {
                    let held = Some(Held::Pages(pages));
                    return Some(Request { req, cmd, held });
                }
                Err(e) => Err(e),
            };
            status_reply(answered, conn.negotiated.structured_replies, req.cookie, &cmd, result);
            None
        }
        _ => Some(request),
    }
}

/// Appends the reply to `request` to `answered` if it is a read of at most
/// [`MEMORY_REPLY_BATCH_BYTES`] whose data is all in memory;
/// `false` (nothing appended) for any other request, and for a read that needs a device or
/// fails (it is then executed as usual, which reports the error).
fn answer_from_memory(conn: &Connection, request: &Request, answered: &mut Vec<u8>) -> bool {
    let Command::Read { offset, length, .. } = request.cmd else {
        return false;
    };
    if length as usize > MEMORY_REPLY_BATCH_BYTES {
        // A large read amortises the hand-over; trying it here could cost a second read
        // and a reply buffer as large as the request.
        return false;
    }
    let structured = conn.negotiated.structured_replies;
    let read = |buf: &mut [u8]| conn.volume.read_from_memory(offset, buf);
    matches!(
        append_read_reply(answered, structured, request.req.cookie, offset, length, read),
        Ok(true)
    )
}

/// `base:allocation` extents covering `[offset, offset + length)` (at most 1024 descriptors).
fn block_status(vol: &dyn BlockVolume, offset: u64, length: u32, req_one: bool) -> Vec<(u32, u32)> {
    let page = vol.page_bytes() as u64;
    let end = offset + length as u64;
    let mut extents: Vec<(u32, u32)> = Vec::new();
    let mut at = offset;
    while at < end {
        let next = ((at / page) + 1) * page;
        let n = (next.min(end) - at) as u32;
        let flags = if vol.page_mapped(at / page) {
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

/// Serves one connection until it disconnects, breaks, or `stop` is raised, with at most
/// `max_threads` threads executing its requests.
/// How a listener offers TLS.
#[derive(Clone)]
struct Tls {
    mode: TlsMode,
    server: Option<crate::tls::TlsServer>,
}

fn handle(mut stream: Stream, exports: &Exports, max_threads: usize, tls: &Tls, stop: &AtomicBool) -> Result<(), String> {
    stream.set_read_timeout(Some(POLL)).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    proto::Handshake::greeting(&mut out);
    if !send_handshake(&mut stream, &out)? {
        return Ok(());
    }
    let mut hs = proto::Handshake::with_tls(if tls.server.is_some() { tls.mode } else { TlsMode::Off });
    let mut inbox = Inbox::new();
    let negotiated = loop {
        let mut consumed = 0;
        out.clear();
        let step = hs.step(inbox.data(), &mut consumed, &mut out, exports);
        inbox.consume(consumed);
        if !out.is_empty() && !send_handshake(&mut stream, &out)? {
            return Ok(());
        }
        match step {
            Ok(Step::Done(n)) => break n,
            Ok(Step::Progress) => continue,
            Ok(Step::StartTls) => {
                // The client waits for the ACK before its TLS handshake: anything already
                // here was sent in the clear after asking for TLS (an attack, or a broken
                // client).
                if !inbox.data().is_empty() {
                    return Err(ProtocolError::DataBeforeTls.to_string());
                }
                let Some(server) = &tls.server else {
                    return Err("STARTTLS accepted without credentials".into());
                };
                let plain = server.upgrade(stream).map_err(|e| e.to_string())?;
                stream = Stream::Unix(plain);
                stream.set_read_timeout(Some(POLL)).map_err(|e| e.to_string())?;
                hs.tls_started();
                continue;
            }
            Ok(Step::NeedMore) => {
                if stop.load(SeqCst) {
                    return Ok(());
                }
                if !inbox.fill(&mut stream).map_err(|e| e.to_string())? {
                    return Ok(());
                }
            }
            Err(ProtocolError::Aborted) => return Ok(()),
            Err(e) => return Err(e.to_string()),
        }
    };
    let Some((volume, _client)) = exports.open(&negotiated.export.name) else {
        return Err("export vanished".into());
    };
    let closer = stream.try_clone().map_err(|e| e.to_string())?;
    let conn = Connection {
        writer: StdMutex::new(stream.try_clone().map_err(|e| e.to_string())?),
        receiver: StdMutex::new(Receiver {
            stream,
            inbox,
            ended: false,
            wrote: false,
            held: HeldReplies::default(),
        }),
        outbox: Mutex::new(Outbox::default()),
        drained: Condvar::new(),
        volume,
        negotiated,
        broken: AtomicBool::new(false),
        threads: AtomicUsize::new(1),
        waiting: AtomicUsize::new(0),
        max_threads,
        error: Mutex::new(None),
    };
    // Every request read is answered before the connection closes: the scope waits for every
    // thread to finish the request it took.
    std::thread::scope(|scope| serve_requests(scope, &conn, stop));
    closer.shutdown();
    match conn.error.into_inner() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// One of a connection's threads: takes the next request, executes it, answers it, until the
/// request stream ends. While it executes, another thread (started here if none is waiting and
/// the limit allows) takes the next request.
///
/// A read whose data is all in memory, and a write the write buffer takes without waiting, is
/// answered by the thread holding the receiver, without letting go of it: handing the
/// receiver to another thread costs two context switches, more than such a request. Its reply
/// waits in `answered`, so that the replies to the requests of one burst go out in one send:
/// `answered` is sent before the receiver waits for the socket, when it reaches
/// [`MEMORY_REPLY_BATCH_BYTES`], and before a request that may wait is executed. So is any
/// write or flush when the writers flush after every write and nothing else of the client has
/// arrived: such a client sends nothing more until it is answered.
fn serve_requests<'scope, 'env>(scope: &'scope std::thread::Scope<'scope, 'env>, conn: &'env Connection, stop: &'env AtomicBool) {
    set_timer_slack(TIMER_SLACK);
    let mut out = Vec::new();
    let mut payload = Vec::new();
    let mut answered = Vec::new();
    loop {
        conn.waiting.fetch_add(1, SeqCst);
        let request = {
            // A thread that panicked while holding the receiver cannot have left it half
            // updated in a way that matters: the stream is then ended below.
            let mut rx = conn.receiver.lock().unwrap_or_else(PoisonError::into_inner);
            loop {
                if rx.ended {
                    break None;
                }
                match next_request(&mut rx, conn, stop, &mut payload, &mut answered) {
                    Ok(Some(r)) => {
                        let write = matches!(r.cmd, Command::Write { .. });
                        let r = match answer_at_once(conn, r, &mut answered, &mut rx.held) {
                            Some(r)
                                if (write || r.cmd == Command::Flush)
                                    && rx.inbox.data().is_empty()
                                    && conn.volume.writers_flush_every_write() =>
                            {
                                // A client that flushes after every write sends nothing more
                                // until this write or flush is answered, so handing the socket
                                // to another thread first would only put two context switches
                                // on the path of each: it is executed here, after the replies
                                // already answered go out (it may wait).
                                send_answered(conn, &mut answered);
                                let in_thread_buffer = in_thread_buffer(&r, &payload);
                                execute(conn, r, in_thread_buffer, &mut answered);
                                None
                            }
                            r => r,
                        };
                        if let Some(r) = r {
                            break Some(r);
                        }
                        rx.wrote |= write;
                        if answered.len() >= MEMORY_REPLY_BATCH_BYTES {
                            send_answered(conn, &mut answered);
                        }
                    }
                    Ok(None) => {
                        rx.ended = true;
                        rx.held.release_all(&mut answered);
                        break None;
                    }
                    Err(e) => {
                        rx.ended = true;
                        rx.held.release_all(&mut answered);
                        *conn.error.lock() = Some(e);
                        break None;
                    }
                }
            }
        };
        send_answered(conn, &mut answered);
        let still_waiting = conn.waiting.fetch_sub(1, SeqCst) - 1;
        let Some(request) = request else { return };
        if still_waiting == 0
            && conn
                .threads
                .fetch_update(SeqCst, SeqCst, |n| (n < conn.max_threads).then_some(n + 1))
                .is_ok()
        {
            scope.spawn(move || serve_requests(scope, conn, stop));
        }
        out.clear();
        let write = matches!(request.cmd, Command::Write { .. });
        let in_thread_buffer = in_thread_buffer(&request, &payload);
        execute(conn, request, in_thread_buffer, &mut out);
        conn.send(&out);
        if write && conn.waiting.load(SeqCst) > 0 {
            // Answered, and another thread waits on the socket for the client's next
            // request. Other workers may still hold earlier ones: the engine writes ahead
            // only while no write is under way, which is what keeps this to idle writers.
            write_behind(conn);
        }
        if out.capacity() > KEEP_BUFFER_BYTES {
            out = Vec::new();
        }
        if payload.len() > KEEP_BUFFER_BYTES {
            payload = Vec::new();
        }
    }
}

/// The part of a thread's payload buffer that holds `request`'s payload: none when the payload
/// went where the volume keeps it.
fn in_thread_buffer<'a>(request: &Request, payload: &'a [u8]) -> &'a [u8] {
    if request.held.is_some() {
        &[]
    } else {
        &payload[..request.req.payload_bytes() as usize]
    }
}

/// Asks the volume for write-behind after a write was answered with nothing else of the
/// client under way. A failure is the pool's (it is poisoned, and the next flush or write
/// reports it to the client), so it is only logged here.
fn write_behind(conn: &Connection) {
    if let Err(e) = conn.volume.write_behind() {
        tracing::debug!("write-behind failed: {e}");
    }
}

/// Sends the replies answered from memory, if any.
fn send_answered(conn: &Connection, answered: &mut Vec<u8>) {
    if !answered.is_empty() {
        conn.send(answered);
        answered.clear();
    }
    if answered.capacity() > KEEP_BUFFER_BYTES {
        *answered = Vec::new();
    }
}

/// Reads the next request whole, a write's payload into `payload` (grown as needed, never
/// shrunk here); answers invalid requests itself. `answered` (replies not yet sent) is sent
/// before anything waits for the socket, so no client waits for a reply while the server
/// waits for that client. `Ok(None)` when the stream ends cleanly: the client disconnected or
/// went away, a reply could not be sent, or `stop`.
fn next_request(
    rx: &mut Receiver,
    conn: &Connection,
    stop: &AtomicBool,
    payload: &mut Vec<u8>,
    answered: &mut Vec<u8>,
) -> Result<Option<Request>, String> {
    let Receiver {
        stream,
        inbox,
        wrote,
        held,
        ..
    } = rx;
    loop {
        if stop.load(SeqCst) || conn.broken.load(SeqCst) {
            return Ok(None);
        }
        let req = match proto::parse_request(inbox.data()) {
            Ok(Some(r)) => r,
            Ok(None) => {
                send_answered(conn, answered);
                if std::mem::take(wrote) {
                    // Every request received is answered (or held for its turn) and the
                    // client has sent nothing more yet.
                    write_behind(conn);
                }
                send_held_until_readable(stream, held, conn, answered);
                if !inbox.fill(stream).map_err(|e| e.to_string())? {
                    return Ok(None); // client went away
                }
                continue;
            }
            Err(e) => return Err(e.to_string()),
        };
        inbox.consume(proto::REQUEST_HEADER_BYTES);
        let payload_bytes = req.payload_bytes() as usize;
        if payload_bytes > inbox.data().len() {
            send_answered(conn, answered); // the payload's rest is read from the socket
        }
        let cmd = proto::validate(&req, &conn.negotiated);
        let mut held = None;
        if cmd.is_ok() {
            // The payload goes straight where the volume keeps it (the write buffer's pages,
            // or a buffer the log's records can hold: large writes, while the pool's budget
            // lasts) or else into the thread's buffer: what is already buffered, then the rest
            // read from the socket directly.
            held = if payload_bytes == 0 {
                None
            } else if let Some(pages) = conn.volume.paged_payload(req.offset, payload_bytes) {
                Some(Held::Pages(pages))
            } else {
                conn.volume.payload_buffer(payload_bytes).map(Held::Buffer)
            };
            let received = match held.as_mut() {
                Some(Held::Pages(pages)) => {
                    let mut dests: Vec<&mut [u8]> = pages.pages_mut().collect();
                    read_exact_vectored_or_stop(stream, inbox, &mut dests, stop)?
                }
                Some(Held::Buffer(buf)) => read_exact_or_stop(stream, inbox, &mut buf[..], stop)?,
                None => {
                    if payload.len() < payload_bytes {
                        payload.resize(payload_bytes, 0);
                    }
                    read_exact_or_stop(stream, inbox, &mut payload[..payload_bytes], stop)?
                }
            };
            if !received {
                return Ok(None); // vanished mid-payload: the partial write is never applied
            }
        } else if !discard(stream, inbox, payload_bytes, stop)? {
            return Ok(None);
        }
        let cmd = match cmd {
            Ok(c) => c,
            Err(errno) => {
                let mut out = Vec::new();
                error_reply(&mut out, conn.negotiated.structured_replies, req.cookie, errno, "invalid request");
                conn.send(&out);
                continue;
            }
        };
        if cmd == Command::Disconnect {
            return Ok(None);
        }
        return Ok(Some(Request { req, cmd, held }));
    }
}

/// Sends the held replies as they come due until the client has sent something (or none is
/// held): a client whose writes are all held sends nothing until they are answered.
fn send_held_until_readable(stream: &Stream, held: &mut HeldReplies, conn: &Connection, out: &mut Vec<u8>) {
    loop {
        let next = held.release(out, Instant::now());
        send_answered(conn, out);
        let Some(due) = next else { return };
        if conn.broken.load(SeqCst) || readable_within(stream, due.saturating_duration_since(Instant::now())) {
            return;
        }
    }
}

/// Sets the calling thread's timer slack (how late the kernel may wake it from a timed
/// wait, to wake several threads at once). A failure changes only when the thread wakes.
fn set_timer_slack(slack: Duration) {
    let nanos = slack.as_nanos().min(libc::c_ulong::MAX as u128) as libc::c_ulong;
    // SAFETY: PR_SET_TIMERSLACK sets a number of the calling thread; no memory is passed.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, nanos, 0, 0, 0) };
}

/// Whether `stream` has bytes to read (or an end or error to report) within `wait`. A
/// failed poll says yes: the read that follows reports what is wrong.
fn readable_within(stream: &Stream, wait: Duration) -> bool {
    let mut fd = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let timeout = libc::timespec {
        tv_sec: wait.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: wait.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `fd` and `timeout` are valid for the call, which reads one pollfd (and writes
    // its `revents`) and the timespec; no signal mask is passed.
    let rc = unsafe { libc::ppoll(&mut fd, 1, &timeout, std::ptr::null()) };
    rc != 0
}

/// Fills `dest` with what the inbox holds, then from the socket. `Ok(false)` if the stream
/// ends first or `stop` is raised while waiting.
fn read_exact_or_stop(stream: &mut Stream, inbox: &mut Inbox, dest: &mut [u8], stop: &AtomicBool) -> Result<bool, String> {
    read_exact_vectored_or_stop(stream, inbox, &mut [dest], stop)
}

/// [`read_exact_or_stop`] into several buffers in turn, with vectored reads (a 1 MiB write
/// into 4 KiB pages takes a few system calls, not 256).
fn read_exact_vectored_or_stop(stream: &mut Stream, inbox: &mut Inbox, dests: &mut [&mut [u8]], stop: &AtomicBool) -> Result<bool, String> {
    // The next byte goes to `dests[first][at..]`; `fill` moves past `n` bytes received and
    // past every buffer then full (empty ones included).
    let (mut first, mut at) = (0, 0);
    let fill = |first: &mut usize, at: &mut usize, mut n: usize, dests: &[&mut [u8]]| {
        while *first < dests.len() {
            let take = (dests[*first].len() - *at).min(n);
            n -= take;
            *at += take;
            if *at < dests[*first].len() {
                break;
            }
            (*first, *at) = (*first + 1, 0);
        }
    };
    fill(&mut first, &mut at, 0, dests);
    // What the inbox holds first, buffer by buffer.
    while first < dests.len() && !inbox.data().is_empty() {
        let dest = &mut dests[first][at..];
        let have = inbox.data().len().min(dest.len());
        dest[..have].copy_from_slice(&inbox.data()[..have]);
        inbox.consume(have);
        fill(&mut first, &mut at, have, dests);
    }
    if first == dests.len() {
        return Ok(true);
    }
    // The rest comes from the socket; the inbox is empty. The last read also takes up to
    // `Inbox::TAIL_BYTES` of what follows into the inbox (the next request's header, without
    // a system call of its own). After a large payload the fill that follows is kept as
    // small, so that a next large payload queued behind its header is not read into the
    // inbox and copied again; after a small one, a full fill takes the next requests in one
    // system call.
    inbox.start = 0;
    inbox.end = 0;
    let rest_bytes: usize = dests[first..].iter().map(|d| d.len()).sum::<usize>() - at;
    if rest_bytes >= LARGE_PAYLOAD_BYTES {
        inbox.next_fill_bytes = Inbox::TAIL_BYTES;
    }
    // Set while a large part of the payload is still to come; reset before returning (the
    // early returns end the connection).
    let mut low_water_bytes = 1;
    while first < dests.len() {
        // At most IOV_MAX (1024 on Linux) buffers per call.
        let rest = &mut dests[first..];
        let last_read = rest.len() < MAX_IOVECS;
        let mut slices: Vec<io::IoSliceMut<'_>> = Vec::with_capacity(rest.len().min(MAX_IOVECS) + 1);
        let mut wanted = 0;
        for (i, d) in rest.iter_mut().take(MAX_IOVECS).enumerate() {
            let d = if i == 0 { &mut d[at..] } else { &mut d[..] };
            wanted += d.len();
            slices.push(io::IoSliceMut::new(d));
        }
        if last_read {
            slices.push(io::IoSliceMut::new(&mut inbox.buf[..Inbox::TAIL_BYTES]));
        }
        let wanted_low_water = if wanted >= LARGE_PAYLOAD_BYTES {
            wanted.min(PAYLOAD_LOW_WATER_BYTES)
        } else {
            1
        };
        if wanted_low_water != low_water_bytes {
            stream.set_receive_low_water(wanted_low_water);
            low_water_bytes = wanted_low_water;
        }
        let n = match stream.read_vectored(&mut slices) {
            Ok(0) => return Ok(false),
            Ok(n) => n,
            Err(e) if is_retry(&e) => {
                if stop.load(SeqCst) {
                    return Ok(false);
                }
                continue;
            }
            Err(e) => return Err(e.to_string()),
        };
        drop(slices);
        let past = n.saturating_sub(wanted);
        inbox.end = past;
        fill(&mut first, &mut at, n - past, dests);
    }
    if low_water_bytes != 1 {
        stream.set_receive_low_water(1);
    }
    Ok(true)
}

/// Reads and drops the `n`-byte payload of a refused request so the stream stays in step (a
/// payload above [`MAX_DISCARD_BYTES`] closes the connection instead).
fn discard(stream: &mut Stream, inbox: &mut Inbox, mut n: usize, stop: &AtomicBool) -> Result<bool, String> {
    if n > MAX_DISCARD_BYTES as usize {
        return Err(ProtocolError::PayloadTooLarge(n as u32).to_string());
    }
    loop {
        let take = inbox.data().len().min(n);
        inbox.consume(take);
        n -= take;
        if n == 0 {
            return Ok(true);
        }
        if stop.load(SeqCst) || !inbox.fill(stream).map_err(|e| e.to_string())? {
            return Ok(false);
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
    threads_per_connection: usize,
    tls: Tls,
}

impl Listening {
    /// Binds the configured addresses (so errors surface before serving starts) to serve the
    /// pool's volumes.
    pub fn bind(pool: Arc<Pool>, cfg: &ServerConfig) -> Result<Listening, String> {
        Listening::bind_exports(Exports::new(pool, cfg.read_only), cfg)
    }

    /// Binds the configured addresses to serve `exports`.
    pub fn bind_exports(exports: Exports, cfg: &ServerConfig) -> Result<Listening, String> {
        if cfg.tcp.is_none() && cfg.unix.is_none() {
            return Err("nothing to listen on: give a TCP address or a Unix socket".into());
        }
        if cfg.tls != TlsMode::Off && cfg.tls_server.is_none() {
            return Err("TLS needs credentials: certificates or a PSK file".into());
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
            exports: Arc::new(exports),
            threads_per_connection: cfg.threads_per_connection.clamp(1, MAX_THREADS_PER_CONNECTION),
            tls: Tls {
                mode: cfg.tls,
                server: cfg.tls_server.clone(),
            },
        })
    }

    /// What the listeners serve (the control socket asks it which exports are open).
    pub fn exports(&self) -> Arc<Exports> {
        self.exports.clone()
    }

    /// The bound TCP address (useful with port 0).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Accepts and serves connections until `stop` is raised, then waits for every connection
    /// to answer what it has read.
    pub fn run(self, stop: Arc<AtomicBool>) {
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
                let (exports, stop, active, threads) = (self.exports.clone(), stop.clone(), active.clone(), self.threads_per_connection);
                let tls = self.tls.clone();
                conns.push(std::thread::spawn(move || {
                    if let Err(e) = handle(s, &exports, threads, &tls, &stop) {
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
        if let Some((_, p)) = &self.unix {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A payload split over the inbox (part of its first buffers) and the socket (in pieces
    /// of odd sizes) lands in the buffers in order, and the bytes after it stay unread.
    #[test]
    fn a_vectored_payload_read_fills_every_buffer_in_order() {
        let (client, server) = UnixStream::pair().unwrap();
        let mut stream = Stream::Unix(server);
        let payload: Vec<u8> = (0..5 * 4096 + 100).map(|i| (i * 7 + i / 4096) as u8).collect();
        let mut inbox = Inbox::new();
        // The inbox holds the first 5000 bytes (past the end of the first page).
        {
            let mut c = client.try_clone().unwrap();
            c.write_all(&payload[..5000]).unwrap();
            assert!(inbox.fill(&mut stream).unwrap());
            assert_eq!(inbox.data().len(), 5000);
        }
        let rest = payload[5000..].to_vec();
        let writer = std::thread::spawn(move || {
            let mut c = client;
            for piece in rest.chunks(3001) {
                c.write_all(piece).unwrap();
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        let mut pages = vec![vec![0u8; 4096]; 5];
        let mut tail = [0u8; 100];
        let mut dests: Vec<&mut [u8]> = pages.iter_mut().map(|p| &mut p[..]).collect();
        dests.push(&mut tail[..60]);
        let stop = AtomicBool::new(false);
        assert!(read_exact_vectored_or_stop(&mut stream, &mut inbox, &mut dests, &stop).unwrap());
        let got: Vec<u8> = pages.concat().into_iter().chain(tail[..60].iter().copied()).collect();
        assert!(got == payload[..5 * 4096 + 60], "bytes out of order");
        writer.join().unwrap();
        // The last 40 bytes are still there for the next read.
        let mut after = [0u8; 40];
        assert!(read_exact_or_stop(&mut stream, &mut inbox, &mut after, &stop).unwrap());
        assert_eq!(&after[..], &payload[5 * 4096 + 60..]);
    }

    /// A payload read from the socket takes the bytes behind it into the inbox, at most
    /// `Inbox::TAIL_BYTES` of them. After a large payload the fill that follows reads no more
    /// than that: a large payload queued behind the next header is left on the socket for its
    /// own pages, not read into the inbox to be copied again. After a small one the next fill
    /// is a full one. The bytes arrive whole and in order either way.
    #[test]
    fn a_payload_read_from_the_socket_takes_only_a_small_tail_into_the_inbox() {
        for (pages, small_fill_after) in [(32usize, true), (3, false)] {
            let (client, server) = UnixStream::pair().unwrap();
            let mut stream = Stream::Unix(server);
            let payload_bytes = pages * 4096;
            let all: Vec<u8> = (0..payload_bytes + 40 + (64 << 10)).map(|i| (i * 13 + i / 251) as u8).collect();
            let sent = all.clone();
            let writer = std::thread::spawn(move || {
                let mut c = client;
                c.write_all(&sent).unwrap();
                c // kept open until joined
            });
            // Let the whole stream be queued before the payload is read.
            std::thread::sleep(Duration::from_millis(100));
            let mut inbox = Inbox::new();
            let stop = AtomicBool::new(false);
            let mut bufs = vec![vec![0u8; 4096]; pages];
            let mut dests: Vec<&mut [u8]> = bufs.iter_mut().map(|p| &mut p[..]).collect();
            assert!(read_exact_vectored_or_stop(&mut stream, &mut inbox, &mut dests, &stop).unwrap());
            assert!(bufs.concat() == all[..payload_bytes], "the payload's bytes");
            let tail = inbox.data().len();
            assert!(tail > 0 && tail <= Inbox::TAIL_BYTES, "took {tail} bytes past the payload");
            assert_eq!(inbox.data(), &all[payload_bytes..payload_bytes + tail]);
            inbox.consume(tail);
            assert!(inbox.fill(&mut stream).unwrap());
            let got = inbox.data().len();
            assert_eq!(got <= Inbox::TAIL_BYTES, small_fill_after, "fill of {got} after {pages} pages");
            assert_eq!(inbox.data(), &all[payload_bytes + tail..payload_bytes + tail + got]);
            inbox.consume(got);
            let mut rest = vec![0u8; all.len() - payload_bytes - tail - got];
            assert!(read_exact_or_stop(&mut stream, &mut inbox, &mut rest, &stop).unwrap());
            assert!(rest == all[payload_bytes + tail + got..], "the bytes after");
            drop(writer.join().unwrap());
        }
    }

    /// The socket's receive low-water mark, as the kernel reports it.
    fn receive_low_water(s: &TcpStream) -> libc::c_int {
        let mut value: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: an open socket, and a `c_int` out-value whose size is passed with it.
        let rc = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "getsockopt: {}", io::Error::last_os_error());
        value
    }

    /// While a large payload arrives over TCP the read asks the kernel not to wake it before
    /// `PAYLOAD_LOW_WATER_BYTES` (or the payload's rest) are in, and afterwards the mark is back
    /// at one byte: left raised, the header read of a client waiting at queue depth 1 would
    /// wait for bytes that never come. The client here pauses mid-payload, and the next small
    /// request is answered at once.
    #[test]
    fn a_large_tcp_payload_is_read_with_a_raised_low_water_mark_that_is_lowered_after() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let observer = server.try_clone().unwrap();
        let mut stream = Stream::Tcp(server);
        // Blocked reads look at `stop` this often, so a read left waiting fails the test
        // instead of hanging it.
        stream.set_read_timeout(Some(POLL)).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        assert_eq!(receive_low_water(&observer), 1);
        let payload: Vec<u8> = (0..(1usize << 20)).map(|i| (i * 31 + i / 4093) as u8).collect();
        let sent = payload.clone();
        let (paused_tx, paused_rx) = std::sync::mpsc::channel();
        let (resume_tx, resume_rx) = std::sync::mpsc::channel::<()>();
        let writer = std::thread::spawn(move || {
            let mut c = client;
            c.write_all(&sent[..300 << 10]).unwrap();
            paused_tx.send(()).unwrap();
            resume_rx.recv().unwrap();
            c.write_all(&sent[300 << 10..]).unwrap();
            c.write_all(b"next").unwrap();
            c
        });
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let reader_stop = stop.clone();
        let reader = std::thread::spawn(move || {
            let stop = reader_stop;
            let mut inbox = Inbox::new();
            let mut pages = vec![vec![0u8; 4096]; 256];
            let mut dests: Vec<&mut [u8]> = pages.iter_mut().map(|p| &mut p[..]).collect();
            assert!(read_exact_vectored_or_stop(&mut stream, &mut inbox, &mut dests, &stop).unwrap());
            let mut next = [0u8; 4];
            let read_next = read_exact_or_stop(&mut stream, &mut inbox, &mut next, &stop).unwrap();
            done_tx.send(()).unwrap();
            (pages.concat(), next, read_next)
        });
        paused_rx.recv().unwrap();
        // The reader has taken what was sent and waits for more with the mark raised.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while receive_low_water(&observer) != PAYLOAD_LOW_WATER_BYTES as libc::c_int {
            assert!(std::time::Instant::now() < deadline, "the mark was never raised");
            std::thread::sleep(Duration::from_millis(5));
        }
        resume_tx.send(()).unwrap();
        let answered = done_rx.recv_timeout(Duration::from_secs(10)).is_ok();
        stop.store(true, SeqCst);
        let (got, next, read_next) = reader.join().unwrap();
        assert!(answered && read_next, "the request after the payload was never read");
        assert!(got == payload, "the payload's bytes");
        assert_eq!(&next, b"next");
        assert_eq!(receive_low_water(&observer), 1, "the mark is lowered after the payload");
        drop(writer.join().unwrap());
    }

    /// Nothing to read (a request without payload) is a full read at once, with nothing
    /// waiting in the inbox or on the socket.
    #[test]
    fn an_empty_payload_read_returns_at_once() {
        let (_client, server) = UnixStream::pair().unwrap();
        let mut stream = Stream::Unix(server);
        let mut inbox = Inbox::new();
        let stop = AtomicBool::new(false);
        assert!(read_exact_or_stop(&mut stream, &mut inbox, &mut [], &stop).unwrap());
        let mut dests: Vec<&mut [u8]> = vec![&mut [], &mut []];
        assert!(read_exact_vectored_or_stop(&mut stream, &mut inbox, &mut dests, &stop).unwrap());
    }

    /// A client that leaves before the greeting (a health check's connect and close) ends its
    /// connection as an end of stream does, not as a failure to warn about.
    #[test]
    fn a_client_gone_before_the_greeting_is_not_a_failure() {
        let dev: Arc<dyn salsa_core::Device> = Arc::new(salsa_core::device::MemoryDevice::new("mem0", 16 << 20));
        let config = salsa_core::PoolConfig {
            segment_bytes: Some(1 << 20),
            ..salsa_core::PoolConfig::default()
        };
        let pool = Pool::create(vec![dev], &config, &salsa_core::OpenOptions::default()).unwrap();
        let exports = Exports::new(Arc::new(pool), false);
        let tls = Tls {
            mode: TlsMode::Off,
            server: None,
        };
        let (client, server) = UnixStream::pair().unwrap();
        drop(client);
        let stop = AtomicBool::new(false);
        assert_eq!(handle(Stream::Unix(server), &exports, 1, &tls, &stop), Ok(()));
    }

    /// The stream ending mid-payload is reported as such, not as a full read.
    #[test]
    fn a_vectored_payload_read_reports_a_client_gone_mid_payload() {
        let (client, server) = UnixStream::pair().unwrap();
        let mut stream = Stream::Unix(server);
        let mut c = client;
        c.write_all(&[1u8; 6000]).unwrap();
        drop(c);
        let mut pages = vec![vec![0u8; 4096]; 2];
        let mut dests: Vec<&mut [u8]> = pages.iter_mut().map(|p| &mut p[..]).collect();
        let stop = AtomicBool::new(false);
        let mut inbox = Inbox::new();
        assert!(!read_exact_vectored_or_stop(&mut stream, &mut inbox, &mut dests, &stop).unwrap());
    }
}
