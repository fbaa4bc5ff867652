//! The NBD protocol (`doc/proto.md` of the NetworkBlockDevice project), sans IO.
//!
//! Owns: byte layouts and constants, the fixed-newstyle handshake as a state machine
//! ([`Handshake`]), parsing and validation of transmission requests ([`parse_request`],
//! [`validate`]) and encoding of simple and structured replies.
//!
//! Everything here takes bytes already received and appends bytes to send; nothing blocks and
//! nothing panics on what a client sends: every length is bounded and every sum is checked.

use std::fmt;

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
pub const REPLY_MAGIC_OPT: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const CLIENT_FLAG_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const CLIENT_FLAG_NO_ZEROES: u32 = 1 << 1;

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

pub const TFLAG_HAS_FLAGS: u16 = 1 << 0;
pub const TFLAG_READ_ONLY: u16 = 1 << 1;
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TFLAG_SEND_DF: u16 = 1 << 7;
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const TFLAG_SEND_CACHE: u16 = 1 << 10;
pub const TFLAG_SEND_FAST_ZERO: u16 = 1 << 11;

pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// The meta context we serve.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// Its id on a connection.
pub const BASE_ALLOCATION_ID: u32 = 1;

/// Largest payload of one request (reads and writes), advertised as the maximum block size.
pub const MAX_REQUEST_BYTES: u32 = 32 << 20;
/// Largest option payload accepted; longer ones are discarded and refused with ERR_TOO_BIG.
pub const MAX_OPTION_BYTES: u32 = 64 << 10;
/// Options a client may send before it must pick an export ("endless option haggling").
pub const MAX_OPTIONS: u32 = 1024;
/// Size of a request header.
pub const REQUEST_HEADER_BYTES: usize = 28;

/// Protocol violations after which the connection is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("client did not negotiate fixed newstyle")]
    NotFixedNewstyle,
    #[error("bad option magic {0:#x}")]
    BadOptionMagic(u64),
    #[error("bad request magic {0:#x}")]
    BadRequestMagic(u32),
    #[error("too many options ({MAX_OPTIONS})")]
    TooManyOptions,
    #[error("client asked for unknown export {0:?} with EXPORT_NAME")]
    UnknownExport(String),
    #[error("client aborted the handshake")]
    Aborted,
    #[error("write payload of {0} bytes is too large to discard")]
    PayloadTooLarge(u32),
    #[error("client chose an export with EXPORT_NAME before starting TLS, which this server requires")]
    TlsRequired,
    #[error("client sent data after STARTTLS before the TLS handshake")]
    DataBeforeTls,
}

/// Whether the handshake offers TLS (`NBD_OPT_STARTTLS`), as nbdkit's `--tls` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsMode {
    /// STARTTLS is refused as unsupported.
    #[default]
    Off,
    /// A client may start TLS or not.
    On,
    /// Every option but STARTTLS and ABORT is refused (ERR_TLS_REQD) until TLS is started.
    Require,
}

/// What a client may learn about an export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    pub name: String,
    pub description: String,
    pub size_bytes: u64,
    pub read_only: bool,
    /// Preferred block size (the volume's page size).
    pub preferred_block_bytes: u32,
}

impl ExportInfo {
    /// Transmission flags we advertise for this export.
    pub fn transmission_flags(&self) -> u16 {
        let mut f = TFLAG_HAS_FLAGS
            | TFLAG_SEND_FLUSH
            | TFLAG_SEND_FUA
            | TFLAG_SEND_TRIM
            | TFLAG_SEND_WRITE_ZEROES
            | TFLAG_SEND_DF
            | TFLAG_CAN_MULTI_CONN
            | TFLAG_SEND_CACHE
            | TFLAG_SEND_FAST_ZERO;
        if self.read_only {
            f |= TFLAG_READ_ONLY;
        }
        f
    }
}

/// The exports a server offers.
pub trait Catalog {
    fn exports(&self) -> Vec<ExportInfo>;
    /// The export named `name`; the empty name means the default export.
    fn lookup(&self, name: &str) -> Option<ExportInfo>;
}

/// What the connection negotiated when the handshake ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    pub export: ExportInfo,
    pub structured_replies: bool,
    /// Whether `base:allocation` was selected (block status allowed).
    pub base_allocation: bool,
}

/// Result of feeding bytes to the handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// More input is needed; nothing was consumed.
    NeedMore,
    /// Some input was consumed (and maybe output produced); call again.
    Progress,
    /// Transmission phase begins.
    Done(Negotiated),
    /// The client asked for TLS and was told yes (the ACK is in the output): send it, run the
    /// TLS handshake on the connection, call [`Handshake::tls_started`], and go on with the
    /// options over TLS. Nothing may follow the option in the input.
    StartTls,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HsState {
    ClientFlags,
    Options,
    /// Discarding the rest of an over-long option, then answering it with ERR_TOO_BIG.
    Discard {
        option: u32,
        left: u32,
    },
}

/// The server side of the fixed-newstyle handshake.
#[derive(Debug)]
pub struct Handshake {
    state: HsState,
    no_zeroes: bool,
    structured: bool,
    base_allocation: bool,
    options: u32,
    tls: TlsMode,
    tls_active: bool,
}

impl Default for Handshake {
    fn default() -> Self {
        Self::new()
    }
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

fn option_reply(out: &mut Vec<u8>, option: u32, kind: u32, data: &[u8]) {
    out.extend_from_slice(&REPLY_MAGIC_OPT.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

fn option_error(out: &mut Vec<u8>, option: u32, kind: u32, msg: &str) {
    option_reply(out, option, kind, msg.as_bytes());
}

/// A length-prefixed (u32) string inside option data.
fn take_string(data: &[u8], pos: &mut usize) -> Option<String> {
    let len = be32(data.get(*pos..*pos + 4)?) as usize;
    *pos += 4;
    let end = pos.checked_add(len)?;
    let s = std::str::from_utf8(data.get(*pos..end)?).ok()?.to_string();
    *pos = end;
    Some(s)
}

impl Handshake {
    pub fn new() -> Handshake {
        Handshake {
            state: HsState::ClientFlags,
            no_zeroes: false,
            structured: false,
            base_allocation: false,
            options: 0,
            tls: TlsMode::Off,
            tls_active: false,
        }
    }

    /// A handshake that offers TLS as `mode` says.
    pub fn with_tls(mode: TlsMode) -> Handshake {
        Handshake {
            tls: mode,
            ..Handshake::new()
        }
    }

    /// TLS is up: the options go on over it. What was negotiated before is forgotten, as the
    /// protocol asks (a man in the middle could have sent it).
    pub fn tls_started(&mut self) {
        self.tls_active = true;
        self.structured = false;
        self.base_allocation = false;
    }

    /// Whether TLS was started on this connection.
    pub fn tls_active(&self) -> bool {
        self.tls_active
    }

    /// The server's opening bytes.
    pub fn greeting(out: &mut Vec<u8>) {
        out.extend_from_slice(&NBDMAGIC.to_be_bytes());
        out.extend_from_slice(&IHAVEOPT.to_be_bytes());
        out.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    }

    /// Consumes at most one message from the front of `input` (advancing `*consumed`) and
    /// appends any reply to `out`.
    pub fn step(&mut self, input: &[u8], consumed: &mut usize, out: &mut Vec<u8>, catalog: &dyn Catalog) -> Result<Step, ProtocolError> {
        match self.state {
            HsState::ClientFlags => {
                let Some(b) = input.get(..4) else { return Ok(Step::NeedMore) };
                let flags = be32(b);
                *consumed += 4;
                if flags & CLIENT_FLAG_FIXED_NEWSTYLE == 0 {
                    return Err(ProtocolError::NotFixedNewstyle);
                }
                // Unknown client flags: the spec says to close; clients never send them.
                if flags & !(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES) != 0 {
                    return Err(ProtocolError::NotFixedNewstyle);
                }
                self.no_zeroes = flags & CLIENT_FLAG_NO_ZEROES != 0;
                self.state = HsState::Options;
                Ok(Step::Progress)
            }
            HsState::Discard { option, left } => {
                let n = (input.len() as u64).min(left as u64) as u32;
                if n == 0 {
                    return Ok(Step::NeedMore);
                }
                *consumed += n as usize;
                if n == left {
                    self.state = HsState::Options;
                    option_error(out, option, REP_ERR_TOO_BIG, "option data too long");
                } else {
                    self.state = HsState::Discard { option, left: left - n };
                }
                Ok(Step::Progress)
            }
            HsState::Options => {
                let Some(h) = input.get(..16) else { return Ok(Step::NeedMore) };
                let magic = be64(h);
                if magic != IHAVEOPT {
                    return Err(ProtocolError::BadOptionMagic(magic));
                }
                let option = be32(&h[8..]);
                let len = be32(&h[12..]);
                self.options += 1;
                if self.options > MAX_OPTIONS {
                    return Err(ProtocolError::TooManyOptions);
                }
                if len > MAX_OPTION_BYTES {
                    *consumed += 16;
                    self.state = HsState::Discard { option, left: len };
                    if len == 0 {
                        self.state = HsState::Options;
                    }
                    return Ok(Step::Progress);
                }
                let Some(data) = input.get(16..16 + len as usize) else {
                    return Ok(Step::NeedMore);
                };
                *consumed += 16 + len as usize;
                self.option(option, data, out, catalog)
            }
        }
    }

    fn option(&mut self, option: u32, data: &[u8], out: &mut Vec<u8>, catalog: &dyn Catalog) -> Result<Step, ProtocolError> {
        if self.tls == TlsMode::Require && !self.tls_active && option != OPT_STARTTLS && option != OPT_ABORT {
            if option == OPT_EXPORT_NAME {
                // No error reply exists for EXPORT_NAME: the server closes.
                return Err(ProtocolError::TlsRequired);
            }
            option_error(
                out,
                option,
                REP_ERR_TLS_REQD,
                "this server requires TLS: start it with STARTTLS first",
            );
            return Ok(Step::Progress);
        }
        match option {
            OPT_STARTTLS => {
                if self.tls == TlsMode::Off {
                    option_error(out, option, REP_ERR_UNSUP, "TLS is not enabled on this server (salsa serve --tls)");
                } else if self.tls_active {
                    option_error(out, option, REP_ERR_INVALID, "TLS is already active");
                } else if !data.is_empty() {
                    option_error(out, option, REP_ERR_INVALID, "STARTTLS takes no data");
                } else {
                    option_reply(out, option, REP_ACK, &[]);
                    return Ok(Step::StartTls);
                }
                Ok(Step::Progress)
            }
            OPT_EXPORT_NAME => {
                let name = String::from_utf8_lossy(data).to_string();
                let Some(export) = catalog.lookup(&name) else {
                    return Err(ProtocolError::UnknownExport(name));
                };
                out.extend_from_slice(&export.size_bytes.to_be_bytes());
                out.extend_from_slice(&export.transmission_flags().to_be_bytes());
                if !self.no_zeroes {
                    out.extend_from_slice(&[0u8; 124]);
                }
                Ok(Step::Done(Negotiated {
                    export,
                    structured_replies: self.structured,
                    base_allocation: self.base_allocation,
                }))
            }
            OPT_ABORT => {
                if data.is_empty() {
                    option_reply(out, option, REP_ACK, &[]);
                }
                Err(ProtocolError::Aborted)
            }
            OPT_LIST => {
                if !data.is_empty() {
                    option_error(out, option, REP_ERR_INVALID, "LIST takes no data");
                    return Ok(Step::Progress);
                }
                for e in catalog.exports() {
                    let mut d = Vec::new();
                    d.extend_from_slice(&(e.name.len() as u32).to_be_bytes());
                    d.extend_from_slice(e.name.as_bytes());
                    d.extend_from_slice(e.description.as_bytes());
                    option_reply(out, option, REP_SERVER, &d);
                }
                option_reply(out, option, REP_ACK, &[]);
                Ok(Step::Progress)
            }
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    option_error(out, option, REP_ERR_INVALID, "STRUCTURED_REPLY takes no data");
                } else {
                    self.structured = true;
                    option_reply(out, option, REP_ACK, &[]);
                }
                Ok(Step::Progress)
            }
            OPT_INFO | OPT_GO => self.info_or_go(option, data, out, catalog),
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                self.meta_context(option, data, out, catalog);
                Ok(Step::Progress)
            }
            _ => {
                option_error(out, option, REP_ERR_UNSUP, "option not supported");
                Ok(Step::Progress)
            }
        }
    }

    fn info_or_go(&mut self, option: u32, data: &[u8], out: &mut Vec<u8>, catalog: &dyn Catalog) -> Result<Step, ProtocolError> {
        let mut pos = 0;
        let Some(name) = take_string(data, &mut pos) else {
            option_error(out, option, REP_ERR_INVALID, "malformed export name");
            return Ok(Step::Progress);
        };
        let Some(n) = data.get(pos..pos + 2).map(be16) else {
            option_error(out, option, REP_ERR_INVALID, "missing information request count");
            return Ok(Step::Progress);
        };
        pos += 2;
        if data.len() != pos + 2 * n as usize {
            option_error(out, option, REP_ERR_INVALID, "information request count does not match the data");
            return Ok(Step::Progress);
        }
        let requests: Vec<u16> = (0..n as usize).map(|i| be16(&data[pos + 2 * i..])).collect();
        let Some(export) = catalog.lookup(&name) else {
            option_error(out, option, REP_ERR_UNKNOWN, &format!("no export named {name:?}"));
            return Ok(Step::Progress);
        };
        let mut info = Vec::new();
        info.extend_from_slice(&INFO_EXPORT.to_be_bytes());
        info.extend_from_slice(&export.size_bytes.to_be_bytes());
        info.extend_from_slice(&export.transmission_flags().to_be_bytes());
        option_reply(out, option, REP_INFO, &info);
        for r in requests {
            let mut d = r.to_be_bytes().to_vec();
            match r {
                INFO_NAME => d.extend_from_slice(export.name.as_bytes()),
                INFO_DESCRIPTION => d.extend_from_slice(export.description.as_bytes()),
                INFO_BLOCK_SIZE => {
                    d.extend_from_slice(&1u32.to_be_bytes());
                    d.extend_from_slice(&export.preferred_block_bytes.clamp(512, MAX_REQUEST_BYTES).to_be_bytes());
                    d.extend_from_slice(&MAX_REQUEST_BYTES.to_be_bytes());
                }
                _ => continue,
            }
            option_reply(out, option, REP_INFO, &d);
        }
        option_reply(out, option, REP_ACK, &[]);
        if option == OPT_GO {
            return Ok(Step::Done(Negotiated {
                export,
                structured_replies: self.structured,
                base_allocation: self.base_allocation,
            }));
        }
        Ok(Step::Progress)
    }

    fn meta_context(&mut self, option: u32, data: &[u8], out: &mut Vec<u8>, catalog: &dyn Catalog) {
        if option == OPT_SET_META_CONTEXT && !self.structured {
            option_error(out, option, REP_ERR_INVALID, "structured replies must be negotiated first");
            return;
        }
        let mut pos = 0;
        let Some(name) = take_string(data, &mut pos) else {
            option_error(out, option, REP_ERR_INVALID, "malformed export name");
            return;
        };
        let Some(count) = data.get(pos..pos + 4).map(be32) else {
            option_error(out, option, REP_ERR_INVALID, "missing query count");
            return;
        };
        pos += 4;
        let mut queries = Vec::new();
        for _ in 0..count {
            match take_string(data, &mut pos) {
                Some(q) => queries.push(q),
                None => {
                    option_error(out, option, REP_ERR_INVALID, "malformed query");
                    return;
                }
            }
        }
        if pos != data.len() {
            option_error(out, option, REP_ERR_INVALID, "trailing bytes after the queries");
            return;
        }
        if catalog.lookup(&name).is_none() {
            option_error(out, option, REP_ERR_UNKNOWN, &format!("no export named {name:?}"));
            return;
        }
        // LIST with no queries lists everything; "base:" lists the namespace.
        let matches = |q: &str| q == BASE_ALLOCATION || (option == OPT_LIST_META_CONTEXT && q == "base:");
        let selected = if option == OPT_LIST_META_CONTEXT && queries.is_empty() {
            true
        } else {
            queries.iter().any(|q| matches(q))
        };
        if option == OPT_SET_META_CONTEXT {
            self.base_allocation = selected;
        }
        if selected {
            let mut d = BASE_ALLOCATION_ID.to_be_bytes().to_vec();
            d.extend_from_slice(BASE_ALLOCATION.as_bytes());
            option_reply(out, option, REP_META_CONTEXT, &d);
        }
        option_reply(out, option, REP_ACK, &[]);
    }
}

/// A request header as received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawRequest {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

impl RawRequest {
    /// Payload bytes that follow the header on the wire (writes only).
    pub fn payload_bytes(&self) -> u32 {
        if self.kind == CMD_WRITE {
            self.length
        } else {
            0
        }
    }
}

/// Parses a request header from the front of `input`; `Ok(None)` when more bytes are needed.
pub fn parse_request(input: &[u8]) -> Result<Option<RawRequest>, ProtocolError> {
    let Some(h) = input.get(..REQUEST_HEADER_BYTES) else {
        return Ok(None);
    };
    let magic = be32(h);
    if magic != REQUEST_MAGIC {
        return Err(ProtocolError::BadRequestMagic(magic));
    }
    Ok(Some(RawRequest {
        flags: be16(&h[4..]),
        kind: be16(&h[6..]),
        cookie: be64(&h[8..]),
        offset: be64(&h[16..]),
        length: be32(&h[24..]),
    }))
}

/// A validated command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Read {
        offset: u64,
        length: u32,
        df: bool,
    },
    Write {
        offset: u64,
        length: u32,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        length: u32,
        fua: bool,
    },
    WriteZeroes {
        offset: u64,
        length: u32,
        fua: bool,
        no_hole: bool,
        fast: bool,
    },
    Cache {
        offset: u64,
        length: u32,
    },
    BlockStatus {
        offset: u64,
        length: u32,
        req_one: bool,
    },
    Disconnect,
}

/// Checks a request against the export and what was negotiated, the way nbdkit does: unknown
/// commands and flags, flags on the wrong command, zero or oversized lengths, ranges that
/// overflow or pass the end, writes to a read-only export. Returns the errno to answer with.
pub fn validate(r: &RawRequest, n: &Negotiated) -> Result<Command, u32> {
    let allowed_flags = match r.kind {
        CMD_READ => CMD_FLAG_DF,
        CMD_WRITE | CMD_TRIM => CMD_FLAG_FUA,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
        CMD_FLUSH | CMD_CACHE | CMD_DISC => 0,
        _ => return Err(EINVAL),
    };
    if r.flags & !allowed_flags != 0 {
        return Err(EINVAL);
    }
    if r.kind == CMD_READ && r.flags & CMD_FLAG_DF != 0 && !n.structured_replies {
        return Err(EINVAL);
    }
    match r.kind {
        CMD_DISC => return Ok(Command::Disconnect),
        CMD_FLUSH => {
            return if r.offset != 0 || r.length != 0 {
                Err(EINVAL)
            } else {
                Ok(Command::Flush)
            };
        }
        _ => {}
    }
    if r.length == 0 {
        return Err(EINVAL);
    }
    let is_write = matches!(r.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if is_write && n.export.read_only {
        return Err(EPERM);
    }
    if matches!(r.kind, CMD_READ | CMD_WRITE) && r.length > MAX_REQUEST_BYTES {
        return Err(if r.kind == CMD_WRITE { EOVERFLOW } else { EINVAL });
    }
    let end = r.offset.checked_add(r.length as u64);
    if end.is_none_or(|e| e > n.export.size_bytes) {
        return Err(if is_write { ENOSPC } else { EINVAL });
    }
    let fua = r.flags & CMD_FLAG_FUA != 0;
    let (offset, length) = (r.offset, r.length);
    Ok(match r.kind {
        CMD_READ => Command::Read {
            offset,
            length,
            df: r.flags & CMD_FLAG_DF != 0,
        },
        CMD_WRITE => Command::Write { offset, length, fua },
        CMD_TRIM => Command::Trim { offset, length, fua },
        CMD_WRITE_ZEROES => Command::WriteZeroes {
            offset,
            length,
            fua,
            no_hole: r.flags & CMD_FLAG_NO_HOLE != 0,
            fast: r.flags & CMD_FLAG_FAST_ZERO != 0,
        },
        CMD_CACHE => Command::Cache { offset, length },
        CMD_BLOCK_STATUS => {
            if !n.base_allocation {
                return Err(EINVAL);
            }
            Command::BlockStatus {
                offset,
                length,
                req_one: r.flags & CMD_FLAG_REQ_ONE != 0,
            }
        }
        _ => return Err(EINVAL),
    })
}

/// Client side: an option (`IHAVEOPT`, option, length, data). Used by test clients and tools.
pub fn encode_option(option: u32, data: &[u8]) -> Vec<u8> {
    let mut v = IHAVEOPT.to_be_bytes().to_vec();
    v.extend_from_slice(&option.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

/// Client side: a request header followed by `payload` (the write data, if any).
pub fn encode_request(flags: u16, kind: u16, cookie: u64, offset: u64, length: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = REQUEST_MAGIC.to_be_bytes().to_vec();
    v.extend_from_slice(&flags.to_be_bytes());
    v.extend_from_slice(&kind.to_be_bytes());
    v.extend_from_slice(&cookie.to_be_bytes());
    v.extend_from_slice(&offset.to_be_bytes());
    v.extend_from_slice(&length.to_be_bytes());
    v.extend_from_slice(payload);
    v
}

/// A simple reply header (with `data` for a successful read).
pub fn simple_reply(out: &mut Vec<u8>, cookie: u64, error: u32, data: &[u8]) {
    out.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    out.extend_from_slice(data);
}

fn chunk_header(out: &mut Vec<u8>, flags: u16, kind: u16, cookie: u64, len: u32) {
    out.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
}

/// Structured: read data at `offset`.
pub fn structured_data(out: &mut Vec<u8>, cookie: u64, offset: u64, data: &[u8], done: bool) {
    structured_data_header(out, cookie, offset, data.len() as u32, done);
    out.extend_from_slice(data);
}

/// Structured: the header of a data chunk of `len` bytes at `offset`; the caller appends the
/// data itself (so a read can land straight in the reply).
pub fn structured_data_header(out: &mut Vec<u8>, cookie: u64, offset: u64, len: u32, done: bool) {
    chunk_header(out, if done { REPLY_FLAG_DONE } else { 0 }, REPLY_TYPE_OFFSET_DATA, cookie, 8 + len);
    out.extend_from_slice(&offset.to_be_bytes());
}

/// Structured: a hole (reads as zeros) at `offset`.
pub fn structured_hole(out: &mut Vec<u8>, cookie: u64, offset: u64, len: u32, done: bool) {
    chunk_header(out, if done { REPLY_FLAG_DONE } else { 0 }, REPLY_TYPE_OFFSET_HOLE, cookie, 12);
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
}

/// Structured: an error (final).
pub fn structured_error(out: &mut Vec<u8>, cookie: u64, error: u32, msg: &str) {
    let msg = &msg.as_bytes()[..msg.len().min(4096)];
    chunk_header(out, REPLY_FLAG_DONE, REPLY_TYPE_ERROR, cookie, 6 + msg.len() as u32);
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg);
}

/// Structured: block status descriptors (length, flags) for `base:allocation` (final).
pub fn structured_block_status(out: &mut Vec<u8>, cookie: u64, extents: &[(u32, u32)]) {
    chunk_header(out, REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, cookie, 4 + 8 * extents.len() as u32);
    out.extend_from_slice(&BASE_ALLOCATION_ID.to_be_bytes());
    for (len, flags) in extents {
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&flags.to_be_bytes());
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct One;
    impl Catalog for One {
        fn exports(&self) -> Vec<ExportInfo> {
            vec![self.lookup("default").unwrap()]
        }
        fn lookup(&self, name: &str) -> Option<ExportInfo> {
            (name.is_empty() || name == "default").then(|| ExportInfo {
                name: "default".into(),
                description: "test".into(),
                size_bytes: 1 << 20,
                read_only: false,
                preferred_block_bytes: 4096,
            })
        }
    }

    /// Feeds everything, returns the output and the final step.
    fn drive(h: &mut Handshake, input: &[u8]) -> (Vec<u8>, Result<Step, ProtocolError>) {
        let mut out = Vec::new();
        let mut pos = 0;
        loop {
            let mut consumed = 0;
            match h.step(&input[pos..], &mut consumed, &mut out, &One) {
                Ok(Step::Progress) => pos += consumed,
                other => return (out, other),
            }
        }
    }

    #[test]
    fn go_negotiates_structured_replies_and_base_allocation() {
        let mut h = Handshake::new();
        let mut input = (CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES).to_be_bytes().to_vec();
        input.extend(encode_option(OPT_STRUCTURED_REPLY, &[]));
        let mut q = 7u32.to_be_bytes().to_vec();
        q.extend_from_slice(b"default");
        q.extend_from_slice(&1u32.to_be_bytes());
        q.extend_from_slice(&(BASE_ALLOCATION.len() as u32).to_be_bytes());
        q.extend_from_slice(BASE_ALLOCATION.as_bytes());
        input.extend(encode_option(OPT_SET_META_CONTEXT, &q));
        input.extend(encode_option(12345, b"whatever"));
        let mut go = 0u32.to_be_bytes().to_vec();
        go.extend_from_slice(&1u16.to_be_bytes());
        go.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        input.extend(encode_option(OPT_GO, &go));
        let (out, step) = drive(&mut h, &input);
        let Ok(Step::Done(n)) = step else { panic!("{step:?}") };
        assert!(n.structured_replies && n.base_allocation);
        assert_eq!(n.export.name, "default");
        // The unknown option got ERR_UNSUP without losing the stream.
        let unsup = REP_ERR_UNSUP.to_be_bytes();
        assert!(out.windows(4).any(|w| w == unsup));
    }

    #[test]
    fn starttls_when_required_and_what_it_resets() {
        let flags = CLIENT_FLAG_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        let mut go = 0u32.to_be_bytes().to_vec();
        go.extend_from_slice(&0u16.to_be_bytes());
        // Required: options before STARTTLS get ERR_TLS_REQD, EXPORT_NAME closes.
        let mut h = Handshake::with_tls(TlsMode::Require);
        let mut input = flags.clone();
        input.extend(encode_option(OPT_STRUCTURED_REPLY, &[]));
        input.extend(encode_option(OPT_GO, &go));
        input.extend(encode_option(OPT_EXPORT_NAME, b""));
        let (out, step) = drive(&mut h, &input);
        assert_eq!(step, Err(ProtocolError::TlsRequired));
        let reqd = REP_ERR_TLS_REQD.to_be_bytes();
        assert_eq!(out.windows(4).filter(|w| *w == reqd).count(), 2, "both options refused");
        // STARTTLS with data is invalid; without, it is acknowledged and the caller upgrades.
        let mut h = Handshake::with_tls(TlsMode::Require);
        let mut input = flags.clone();
        input.extend(encode_option(OPT_STARTTLS, b"x"));
        input.extend(encode_option(OPT_STARTTLS, &[]));
        let (out, step) = drive(&mut h, &input);
        assert_eq!(step, Ok(Step::StartTls));
        assert!(out.windows(4).any(|w| w == REP_ERR_INVALID.to_be_bytes()));
        assert!(out.ends_with(&[0, 0, 0, 1, 0, 0, 0, 0]), "an ACK with no data closes the output");
        h.tls_started();
        assert!(h.tls_active());
        // Over TLS: a second STARTTLS is invalid, and GO works.
        let mut input = encode_option(OPT_STARTTLS, &[]);
        input.extend(encode_option(OPT_GO, &go));
        let (out, step) = drive(&mut h, &input);
        assert!(matches!(step, Ok(Step::Done(_))), "{step:?}");
        assert!(out.windows(4).any(|w| w == REP_ERR_INVALID.to_be_bytes()));
        // What was negotiated in the clear is forgotten.
        let mut h = Handshake::with_tls(TlsMode::On);
        let mut input = flags.clone();
        input.extend(encode_option(OPT_STRUCTURED_REPLY, &[]));
        input.extend(encode_option(OPT_STARTTLS, &[]));
        assert_eq!(drive(&mut h, &input).1, Ok(Step::StartTls));
        h.tls_started();
        let (_, step) = drive(&mut h, &encode_option(OPT_GO, &go));
        let Ok(Step::Done(n)) = step else { panic!("{step:?}") };
        assert!(!n.structured_replies, "structured replies asked for before TLS were kept");
        // Off: STARTTLS is unsupported, and the handshake goes on.
        let mut h = Handshake::new();
        let mut input = flags;
        input.extend(encode_option(OPT_STARTTLS, &[]));
        input.extend(encode_option(OPT_GO, &go));
        let (out, step) = drive(&mut h, &input);
        assert!(matches!(step, Ok(Step::Done(_))));
        assert!(out.windows(4).any(|w| w == REP_ERR_UNSUP.to_be_bytes()));
    }

    #[test]
    fn over_long_option_is_discarded_and_refused() {
        let mut h = Handshake::new();
        let mut input = CLIENT_FLAG_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        input.extend(encode_option(OPT_LIST, &vec![0u8; MAX_OPTION_BYTES as usize + 1]));
        input.extend(encode_option(OPT_ABORT, &[]));
        let (out, step) = drive(&mut h, &input);
        assert_eq!(step, Err(ProtocolError::Aborted));
        assert!(out.windows(4).any(|w| w == REP_ERR_TOO_BIG.to_be_bytes()));
    }

    #[test]
    fn requests_are_validated_like_nbdkit() {
        let n = Negotiated {
            export: One.lookup("").unwrap(),
            structured_replies: false,
            base_allocation: false,
        };
        let req = |kind, flags, offset, length| RawRequest {
            flags,
            kind,
            cookie: 1,
            offset,
            length,
        };
        assert_eq!(
            validate(&req(CMD_READ, 0, 0, 4096), &n),
            Ok(Command::Read {
                offset: 0,
                length: 4096,
                df: false
            })
        );
        assert_eq!(validate(&req(99, 0, 0, 1), &n), Err(EINVAL));
        assert_eq!(validate(&req(CMD_READ, CMD_FLAG_FUA, 0, 1), &n), Err(EINVAL));
        assert_eq!(
            validate(&req(CMD_READ, CMD_FLAG_DF, 0, 1), &n),
            Err(EINVAL),
            "DF needs structured replies"
        );
        assert_eq!(validate(&req(CMD_READ, 0, 0, 0), &n), Err(EINVAL));
        assert_eq!(validate(&req(CMD_READ, 0, u64::MAX, 2), &n), Err(EINVAL));
        assert_eq!(validate(&req(CMD_WRITE, 0, (1 << 20) - 1, 2), &n), Err(ENOSPC));
        assert_eq!(validate(&req(CMD_WRITE, 0, 0, MAX_REQUEST_BYTES + 1), &n), Err(EOVERFLOW));
        assert_eq!(validate(&req(CMD_BLOCK_STATUS, 0, 0, 1), &n), Err(EINVAL), "no meta context");
        assert_eq!(validate(&req(CMD_FLUSH, 0, 0, 0), &n), Ok(Command::Flush));
        let ro = Negotiated {
            export: ExportInfo {
                read_only: true,
                ..n.export.clone()
            },
            ..n
        };
        assert_eq!(validate(&req(CMD_TRIM, 0, 0, 4096), &ro), Err(EPERM));
    }
}
