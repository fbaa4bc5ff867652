//! Block traces: reading MSR Cambridge CSV, Alibaba / SepBIT CSV, fio iolog (versions 2 and
//! 3), `blkparse`'s text output and the kernel's block tracepoints as tracefs prints them, for
//! replay; and writing what SALSA sent to its devices in the first three formats
//! ([`RecordingDevice`]), so other simulators can be fed with it.
//!
//! Formats, one request per line:
//! - MSR: `Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime`; the timestamp counts
//!   100 ns ticks (Windows filetime), `Type` is `Read` or `Write`.
//! - Alibaba / SepBIT: `volume,W|R,offset,length,timestamp` with the timestamp in microseconds.
//! - fio iolog: a `fio version 2 iolog` (or `3`) header, then `file action [offset length]`
//!   (version 3 puts a nanosecond timestamp first); `trim` replays as a trim, other actions
//!   than read, write and trim are skipped.
//! - blkparse (what `blktrace -d DEV -o - | blkparse -i -` prints by default):
//!   `MAJ,MIN CPU SEQ SECS.NANOS PID ACTION RWBS SECTOR + SECTORS [PROCESS]`. The requests
//!   issued to the driver (action `D`) are replayed, or the queued ones (`Q`) when a trace has
//!   no `D`; `RWBS` with `D` is a discard (a trim), with `W` a write, with `R` a read; other
//!   events (plugs, completions, merges) and the summary blkparse prints at the end are
//!   skipped. Sectors are 512 bytes.
//! - ftrace (the kernel's `block:block_rq_issue` events as `/sys/kernel/tracing/trace` prints
//!   them, what `scripts/record_trace.py` records where blktrace may not run):
//!   `TASK-PID [CPU] FLAGS SECS.MICROS: block_rq_issue: MAJ,MIN RWBS BYTES (CMD) SECTOR + SECTORS ...`.
//!
//! The block-layer formats may hold several devices: `--trace-volume MAJ,MIN` picks one (the
//! default is the first seen), as it picks an Alibaba volume or an MSR disk.
//!
//! Parsing is strict: a malformed line is an error naming the file and line, never a silent skip.

use salsa_core::Device;
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// What a request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    Read,
    Write,
    Trim,
}

/// One request of a trace, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceOp {
    pub kind: OpKind,
    pub offset: u64,
    pub len: u64,
    /// Microseconds since the trace's first request.
    pub at_us: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Msr,
    Alibaba,
    FioLog,
    Blkparse,
    Ftrace,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Format, String> {
        match s {
            "msr" => Ok(Format::Msr),
            "alibaba" | "sepbit" => Ok(Format::Alibaba),
            "fio" | "iolog" => Ok(Format::FioLog),
            "blkparse" | "blktrace" => Ok(Format::Blkparse),
            "ftrace" | "tracefs" => Ok(Format::Ftrace),
            _ => Err(format!("unknown trace format {s:?}; use msr, alibaba, fio, blkparse or ftrace")),
        }
    }
}

/// Whether `s` is a block device number `MAJ,MIN`.
fn is_device_number(s: &str) -> bool {
    s.split_once(',')
        .is_some_and(|(a, b)| !a.is_empty() && !b.is_empty() && a.bytes().chain(b.bytes()).all(|c| c.is_ascii_digit()))
}

/// Guesses a trace's format from its first line.
fn sniff(first: &str) -> Format {
    let fields: Vec<&str> = first.split_whitespace().collect();
    if first.starts_with("fio version") {
        Format::FioLog
    } else if first.starts_with("# tracer:") || first.contains(" block_rq_") {
        Format::Ftrace
    } else if fields.len() >= 7 && is_device_number(fields[0]) {
        Format::Blkparse
    } else if first
        .split(',')
        .nth(1)
        .is_some_and(|f| f == "W" || f == "R" || f == "w" || f == "r")
    {
        Format::Alibaba
    } else {
        Format::Msr
    }
}

/// `SECS.FRACTION` (nanoseconds in blkparse, microseconds in ftrace) as microseconds.
fn seconds_to_us(s: &str) -> Option<u64> {
    let (secs, frac) = s.split_once('.').unwrap_or((s, "0"));
    if frac.is_empty() || frac.len() > 9 || !frac.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let nanos: u64 = format!("{frac:0<9}").parse().ok()?;
    secs.parse::<u64>().ok()?.checked_mul(1_000_000)?.checked_add(nanos / 1000)
}

/// What a block-layer `RWBS` field makes of a request: `None` for requests that move no data
/// (flushes).
fn rwbs_kind(rwbs: &str) -> Option<OpKind> {
    if rwbs.contains('D') {
        Some(OpKind::Trim)
    } else if rwbs.contains('W') {
        Some(OpKind::Write)
    } else if rwbs.contains('R') {
        Some(OpKind::Read)
    } else {
        None
    }
}

/// One request of a block-layer trace line: (device, replay class, kind, sector, sectors, at).
/// The replay class is the blkparse action (`D` or `Q`); ftrace lines are all issues (`D`).
type BlockEvent<'a> = (&'a str, char, OpKind, u64, u64, u64);

/// Parses a blkparse or ftrace line; `Ok(None)` for lines that carry no replayable request.
fn block_event(line: &str, format: Format) -> Result<Option<BlockEvent<'_>>, String> {
    let f: Vec<&str> = line.split_whitespace().collect();
    // Where `SECTOR + SECTORS` starts: blkparse prints it after RWBS, ftrace after the command.
    let (dev, class, rwbs, at_us, sector_at) = match format {
        Format::Blkparse => {
            // The summary at the end ("CPU0 (8,0):", "Total (8,0):", " Reads Queued: ...").
            if !f.first().is_some_and(|d| is_device_number(d)) {
                return Ok(None);
            }
            if f.len() < 7 {
                return Err("blkparse lines have at least 7 fields".into());
            }
            let class = match f[5] {
                "D" => 'D',
                "Q" => 'Q',
                _ => return Ok(None), // completions, merges, plugs, remaps, messages
            };
            let at = seconds_to_us(f[3]).ok_or("the time is not SECONDS.NANOSECONDS")?;
            (f[0], class, f[6], at, 7)
        }
        _ => {
            let Some(ev) = f.iter().position(|t| *t == "block_rq_issue:") else {
                return Ok(None); // other events
            };
            if ev == 0 || f.len() < ev + 3 {
                return Err("block_rq_issue lines have a time, a device and RWBS".into());
            }
            let at = f[ev - 1]
                .strip_suffix(':')
                .and_then(seconds_to_us)
                .ok_or("the time before the event is not SECONDS.MICROSECONDS:")?;
            let Some(plus) = f.iter().skip(ev).position(|t| *t == "+") else {
                // A request with no sectors (a flush).
                return Ok(None);
            };
            (f[ev + 1], 'D', f[ev + 2], at, ev + plus - 1)
        }
    };
    if !is_device_number(dev) {
        return Err(format!("{dev:?} is not a device number MAJOR,MINOR"));
    }
    let Some(kind) = rwbs_kind(rwbs) else { return Ok(None) };
    let (Some(sector), Some(&"+"), Some(sectors)) = (f.get(sector_at), f.get(sector_at + 1), f.get(sector_at + 2)) else {
        return Err("a request carries SECTOR + SECTORS".into());
    };
    let num = |s: &str, what: &str| s.parse::<u64>().map_err(|_| format!("{what} is not a number"));
    Ok(Some((
        dev,
        class,
        kind,
        num(sector, "sector")?,
        num(sectors, "sector count")?,
        at_us,
    )))
}

/// A request parsed from one trace line: kind, offset and length in bytes, time in
/// microseconds, and whether blkparse printed it as queued (not issued).
type ParsedLine = (OpKind, u64, u64, u64, bool);

/// Parses a trace's lines in order, keeping what a line carries over to the next: the volume
/// chosen (the first one seen unless named) and a fio iolog's version.
struct LineParser {
    format: Format,
    chosen: Option<String>,
    fio_version: u32,
}

impl LineParser {
    /// The request on `line`; `None` for a line of another volume or one that is no request;
    /// an error says why the line is malformed.
    fn parse(&mut self, line: &str) -> Result<Option<ParsedLine>, String> {
        let why = |w: &str| w.to_string();
        let num = |s: &str, what: &str| s.trim().parse::<u64>().map_err(|_| format!("{what} is not a number"));
        let parsed = match self.format {
            Format::Msr => {
                let f: Vec<&str> = line.split(',').collect();
                if f.len() < 6 {
                    return Err(why("MSR lines have 7 fields"));
                }
                if let Some(v) = &self.chosen {
                    if f[2].trim() != v {
                        return Ok(None);
                    }
                }
                let kind = match f[3].trim().to_ascii_lowercase().as_str() {
                    "write" => OpKind::Write,
                    "read" => OpKind::Read,
                    _ => return Err(why("type must be Read or Write")),
                };
                (kind, num(f[4], "offset")?, num(f[5], "size")?, num(f[0], "timestamp")? / 10, false)
            }
            Format::Alibaba => {
                let f: Vec<&str> = line.split(',').collect();
                if f.len() < 5 {
                    return Err(why("Alibaba lines have 5 fields"));
                }
                match &self.chosen {
                    Some(v) if f[0].trim() != v => return Ok(None),
                    Some(_) => {}
                    None => self.chosen = Some(f[0].trim().to_string()),
                }
                let kind = match f[1].trim() {
                    "W" | "w" => OpKind::Write,
                    "R" | "r" => OpKind::Read,
                    _ => return Err(why("opcode must be W or R")),
                };
                (kind, num(f[2], "offset")?, num(f[3], "length")?, num(f[4], "timestamp")?, false)
            }
            Format::FioLog => {
                if let Some(v) = line.strip_prefix("fio version ") {
                    self.fio_version = v
                        .split_whitespace()
                        .next()
                        .and_then(|v| v.parse::<u32>().ok())
                        .filter(|v| *v == 2 || *v == 3)
                        .ok_or_else(|| why("only fio iolog versions 2 and 3 are supported"))?;
                    return Ok(None);
                }
                if self.fio_version == 0 {
                    return Err(why("a fio iolog starts with \"fio version 2 iolog\""));
                }
                let mut f = line.split_whitespace();
                let ts = if self.fio_version == 3 {
                    num(f.next().unwrap_or(""), "timestamp")? / 1000
                } else {
                    0
                };
                let _file = f.next().ok_or_else(|| why("missing file name"))?;
                let kind = match f.next() {
                    Some("write") => OpKind::Write,
                    Some("read") => OpKind::Read,
                    Some("trim") => OpKind::Trim,
                    Some(_) => return Ok(None), // add, open, close, sync, datasync, wait
                    None => return Err(why("missing action")),
                };
                let offset = num(f.next().unwrap_or(""), "offset")?;
                let len = num(f.next().unwrap_or(""), "length")?;
                (kind, offset, len, ts, false)
            }
            Format::Blkparse | Format::Ftrace => {
                let Some((dev, class, kind, sector, sectors, at)) = block_event(line, self.format)? else {
                    return Ok(None);
                };
                match &self.chosen {
                    Some(v) if dev != v => return Ok(None),
                    Some(_) => {}
                    None => self.chosen = Some(dev.to_string()),
                }
                let offset = sector.checked_mul(512).ok_or_else(|| why("sector overflows"))?;
                let len = sectors.checked_mul(512).ok_or_else(|| why("sector count overflows"))?;
                (kind, offset, len, at, class == 'Q')
            }
        };
        Ok(Some(parsed))
    }
}

/// Reads a trace, plain or gzip-compressed (told by its first two bytes, whatever its name).
/// `volume` picks one volume of an Alibaba trace (default: the first one seen), one disk
/// number of an MSR trace, or one device `MAJ,MIN` of a block-layer trace.
pub fn read(path: &Path, format: Option<Format>, volume: Option<&str>) -> Result<Vec<TraceOp>, String> {
    let failed = |e: std::io::Error| format!("{}: {e}", path.display());
    let mut file = std::io::BufReader::new(std::fs::File::open(path).map_err(failed)?);
    let gzip = file.fill_buf().map_err(failed)?.starts_with(&[0x1f, 0x8b]);
    let text: Box<dyn BufRead> = if gzip {
        // A corrupt or truncated stream surfaces as a read error on the line it cuts.
        Box::new(std::io::BufReader::new(flate2::bufread::MultiGzDecoder::new(file)))
    } else {
        Box::new(file)
    };
    let mut lines = text.lines().enumerate().peekable();
    let first = match lines.peek() {
        Some((_, Ok(l))) => l.clone(),
        Some((_, Err(e))) => return Err(format!("{}: {e}", path.display())),
        None => return Err(format!("{}: empty trace", path.display())),
    };
    let format = format.unwrap_or_else(|| sniff(&first));
    // Times are absolute until the end, where they become relative to the first request.
    let mut ops = Vec::new();
    // Requests blkparse printed as queued, replayed when the trace has no issued ones.
    let mut queued = Vec::new();
    let mut parser = LineParser {
        format,
        chosen: volume.map(str::to_string),
        fio_version: 0,
    };
    for (i, line) in lines {
        let line = line.map_err(failed)?;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |why: &str| format!("{}:{}: {why}: {line:?}", path.display(), i + 1);
        let Some((kind, offset, len, ts, is_queued)) = parser.parse(line).map_err(|why| bad(&why))? else {
            continue;
        };
        if len == 0 {
            continue;
        }
        offset.checked_add(len).ok_or_else(|| bad("offset + length overflows"))?;
        let op = TraceOp {
            kind,
            offset,
            len,
            at_us: ts,
        };
        if is_queued {
            queued.push(op);
        } else {
            ops.push(op);
        }
    }
    if ops.is_empty() {
        ops = queued;
    }
    let Some(base) = ops.first().map(|o| o.at_us) else {
        return Err(format!("{}: no read, write or trim requests in the trace", path.display()));
    };
    for op in &mut ops {
        op.at_us = op.at_us.saturating_sub(base);
    }
    Ok(ops)
}

/// The bytes a trace touches: one past its highest byte.
pub fn extent(ops: &[TraceOp]) -> u64 {
    ops.iter().map(|o| o.offset + o.len).max().unwrap_or(0)
}

/// Most requests a repeated trace may hold in memory.
pub const MAX_REPEATED_OPS: usize = 100_000_000;

/// The trace `times` times in a row, each pass starting where the previous one ended (its
/// requests' times shifted by the trace's duration plus a millisecond).
pub fn repeat(ops: Vec<TraceOp>, times: u32) -> Result<Vec<TraceOp>, String> {
    if times == 0 {
        return Err("--trace-repeat must be at least 1".into());
    }
    let total = ops.len().checked_mul(times as usize).filter(|n| *n <= MAX_REPEATED_OPS);
    let Some(total) = total else {
        return Err(format!(
            "{} requests repeated {times} times is more than the {MAX_REPEATED_OPS} a replay holds",
            ops.len()
        ));
    };
    let pass_us = ops.last().map_or(0, |o| o.at_us) + 1000;
    let mut out = Vec::with_capacity(total);
    for pass in 0..times as u64 {
        out.extend(ops.iter().map(|o| TraceOp {
            at_us: o.at_us + pass * pass_us,
            ..*o
        }));
    }
    Ok(out)
}

/// Writes device requests in one of the trace formats.
pub struct TraceWriter {
    out: parking_lot::Mutex<std::io::BufWriter<std::fs::File>>,
    format: Format,
    start: Instant,
}

impl TraceWriter {
    pub fn create(path: &Path, format: Format, device_names: &[String]) -> Result<Arc<TraceWriter>, String> {
        if matches!(format, Format::Blkparse | Format::Ftrace) {
            return Err(format!(
                "{format:?} traces are printed by the kernel's tools and can only be read; record device requests as msr, alibaba or fio"
            ));
        }
        let f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut out = std::io::BufWriter::new(f);
        if format == Format::FioLog {
            let mut head = String::from("fio version 2 iolog\n");
            for n in device_names {
                head.push_str(&format!("{n} add\n"));
            }
            for n in device_names {
                head.push_str(&format!("{n} open\n"));
            }
            out.write_all(head.as_bytes()).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        Ok(Arc::new(TraceWriter {
            out: parking_lot::Mutex::new(out),
            format,
            start: Instant::now(),
        }))
    }

    fn record(&self, device_index: usize, name: &str, write: bool, offset: u64, len: usize, latency_us: u64) {
        let at_us = self.start.elapsed().as_micros() as u64;
        let line = match self.format {
            Format::Msr => format!(
                "{},salsa,{device_index},{},{offset},{len},{}\n",
                at_us * 10,
                if write { "Write" } else { "Read" },
                latency_us * 10
            ),
            Format::Alibaba => format!("{device_index},{},{offset},{len},{at_us}\n", if write { "W" } else { "R" }),
            Format::FioLog => format!("{name} {} {offset} {len}\n", if write { "write" } else { "read" }),
            Format::Blkparse | Format::Ftrace => return, // refused by `create`
        };
        // A trace is a by-product: a full disk must not fail the benchmark's I/O.
        let _ = self.out.lock().write_all(line.as_bytes());
    }

    /// Closes the files of a fio log and flushes.
    pub fn finish(&self, device_names: &[String]) -> Result<(), String> {
        let mut out = self.out.lock();
        if self.format == Format::FioLog {
            for n in device_names {
                out.write_all(format!("{n} close\n").as_bytes()).map_err(|e| e.to_string())?;
            }
        }
        out.flush().map_err(|e| e.to_string())
    }
}

/// A device that passes everything through and records each read and write in a trace.
pub struct RecordingDevice {
    inner: Arc<dyn Device>,
    index: usize,
    trace: Arc<TraceWriter>,
}

impl RecordingDevice {
    pub fn new(inner: Arc<dyn Device>, index: usize, trace: Arc<TraceWriter>) -> RecordingDevice {
        RecordingDevice { inner, index, trace }
    }

    /// Runs one device request and records it with its latency.
    fn timed(&self, write: bool, offset: u64, len: usize, io: impl FnOnce() -> std::io::Result<()>) -> std::io::Result<()> {
        let t = Instant::now();
        let r = io();
        let us = t.elapsed().as_micros() as u64;
        self.trace.record(self.index, self.inner.name(), write, offset, len, us);
        r
    }
}

impl Device for RecordingDevice {
    fn name(&self) -> &str {
        self.inner.name()
    }
    salsa_core::forward_device_properties!(inner);
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let len = buf.len();
        self.timed(false, offset, len, || self.inner.read_at(buf, offset))
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.timed(true, offset, buf.len(), || self.inner.write_at(buf, offset))
    }
    fn sync(&self) -> std::io::Result<()> {
        self.inner.sync()
    }
    fn discard(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.inner.discard(offset, len)
    }
    fn counters(&self) -> Vec<(String, u64)> {
        self.inner.counters()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `text` in a new temporary file whose name ends in `name` (its extension tells formats),
    /// removed when the returned path is dropped (pass or fail).
    fn write_tmp(name: &str, text: &str) -> tempfile::TempPath {
        let file = tempfile::Builder::new().prefix("salsa-trace-").suffix(name).tempfile().unwrap();
        std::fs::write(file.path(), text).unwrap();
        file.into_temp_path()
    }

    #[test]
    fn reads_all_three_formats() {
        let msr = write_tmp(
            "msr.csv",
            "128166372003061629,hm,0,Write,3154321408,4096,1331\n128166372003071629,hm,0,Read,8192,512,100\n128166372003081629,hm,1,Write,0,4096,1\n",
        );
        let ops = read(&msr, None, Some("0")).unwrap();
        assert_eq!(ops.len(), 2);
        assert_eq!(
            ops[0],
            TraceOp {
                kind: OpKind::Write,
                offset: 3154321408,
                len: 4096,
                at_us: 0
            }
        );
        assert_eq!(ops[1].at_us, 1000);
        assert_eq!(ops[1].kind, OpKind::Read);

        let ali = write_tmp("ali.csv", "7,W,4096,8192,1000\n8,W,0,4096,1001\n7,R,0,4096,1500\n");
        let ops = read(&ali, None, None).unwrap();
        assert_eq!(ops.len(), 2, "only volume 7, the first seen");
        assert_eq!(
            ops[1],
            TraceOp {
                kind: OpKind::Read,
                offset: 0,
                len: 4096,
                at_us: 500
            }
        );
        assert_eq!(extent(&ops), 12288);

        let fio = write_tmp(
            "fio.log",
            "fio version 2 iolog\n/dev/x add\n/dev/x open\n/dev/x write 0 4096\n/dev/x read 4096 4096\n/dev/x close\n",
        );
        let ops = read(&fio, None, None).unwrap();
        assert_eq!(ops.len(), 2);
        assert_eq!((ops[0].kind, ops[1].kind), (OpKind::Write, OpKind::Read));
        for p in [msr, ali, fio] {
            let _ = std::fs::remove_file(p);
        }
    }

    #[test]
    fn reads_blkparse_output_issued_requests_of_one_device() {
        let text = "  8,0    3        1     0.000000000   697  A  WS 3417048 + 8 <- (8,1) 3415000
  8,0    3        2     0.000001080   697  Q  WS 3417048 + 8 [jbd2/sda1-8]
  8,0    3        3     0.000004190   697  G  WS 3417048 + 8 [jbd2/sda1-8]
  8,0    3        4     0.000005000   697  P   N [jbd2/sda1-8]
  8,0    3        5     0.000010000   697  I  WS 3417048 + 8 [jbd2/sda1-8]
  8,0    3        6     0.000020000   697  D  WS 3417048 + 8 [jbd2/sda1-8]
  8,0    3        7     0.000300000     0  C  WS 3417048 + 8 [0]
  8,0    0        1     0.001000000   800  D   R 2048 + 16 [cat]
  8,0    0        2     0.002000000   800  D   D 4096 + 2048 [fstrim]
  8,0    0        3     0.002500000   800  D  FN [kworker/0:1H]
  8,16   0        1     0.003000000   801  D   W 0 + 8 [dd]
CPU0 (8,0):
 Reads Queued:           0,        0KiB\t Writes Queued:           1,        4KiB
Total (8,0):
Throughput (R/W): 0KiB/s / 0KiB/s
";
        let p = write_tmp("blkparse.txt", text);
        let ops = read(&p, None, None).unwrap();
        let want = [
            (OpKind::Write, 3417048 * 512, 4096, 0),
            (OpKind::Read, 2048 * 512, 8192, 980),
            (OpKind::Trim, 4096 * 512, 1 << 20, 1980),
        ];
        let got: Vec<(OpKind, u64, u64, u64)> = ops.iter().map(|o| (o.kind, o.offset, o.len, o.at_us)).collect();
        assert_eq!(got, want, "the issued requests of 8,0, the first device seen");
        let other = read(&p, Some(Format::Blkparse), Some("8,16")).unwrap();
        assert_eq!((other.len(), other[0].kind, other[0].len), (1, OpKind::Write, 4096));
        // A trace of queued requests only (blktrace -a queue) replays those.
        let q = write_tmp("blkparse-q.txt", "  8,0    3        2     0.000001080   697  Q  WS 8 + 8 [x]\n");
        assert_eq!(read(&q, None, None).unwrap()[0].offset, 4096);
        let bad = write_tmp(
            "blkparse-bad.txt",
            "  8,0    3        6     0.000020000   697  D  WS 3417048 - 8 [x]\n",
        );
        let e = read(&bad, None, None).unwrap_err();
        assert!(e.contains(":1:") && e.contains("SECTOR + SECTORS"), "{e}");
        for p in [p, q, bad] {
            let _ = std::fs::remove_file(p);
        }
    }

    #[test]
    fn reads_block_rq_issue_events_from_tracefs() {
        let text = "# tracer: nop
#
#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION
#              | |         |   |||||     |         |
              mv-19928   [001] ..... 15126.966372: block_rq_issue: 254,0 RA 4096 () 12653320 + 8 be,0,4 [mv]
    kworker/1:1H-44      [001] ..... 15126.979701: block_rq_issue: 254,0 FF 0 () 0 + 0 be,0,4 [kworker/1:1H]
            bash-29087   [000] ..... 15126.980567: block_rq_issue: 254,0 W 8192 () 241186240 + 16 be,0,4 [bash]
          fstrim-1       [000] ..... 15126.990000: block_rq_issue: 254,0 DS 1048576 () 0 + 2048 be,0,4 [fstrim]
            bash-29087   [000] ..... 15126.991000: block_rq_complete: 254,0 W () 241186240 + 16 be,0,4 [0]
              dd-7       [000] ..... 15126.992000: block_rq_issue: 7,0 W 4096 () 0 + 8 be,0,4 [dd]
";
        let p = write_tmp("ftrace.txt", text);
        let ops = read(&p, None, None).unwrap();
        let got: Vec<(OpKind, u64, u64, u64)> = ops.iter().map(|o| (o.kind, o.offset, o.len, o.at_us)).collect();
        assert_eq!(
            got,
            [
                (OpKind::Read, 12653320 * 512, 4096, 0),
                (OpKind::Write, 241186240 * 512, 8192, 14195),
                (OpKind::Trim, 0, 1 << 20, 23628),
            ]
        );
        assert_eq!(read(&p, Some(Format::Ftrace), Some("7,0")).unwrap().len(), 1);
        // The same text gzip-compressed reads the same; cut short, it is an error.
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(text.as_bytes()).unwrap();
        let gz = gz.finish().unwrap();
        let z = write_tmp("ftrace.txt.gz", "");
        std::fs::write(&z, &gz).unwrap();
        let again: Vec<(OpKind, u64, u64, u64)> = read(&z, None, None)
            .unwrap()
            .iter()
            .map(|o| (o.kind, o.offset, o.len, o.at_us))
            .collect();
        assert_eq!(again, got);
        std::fs::write(&z, &gz[..gz.len() / 2]).unwrap();
        let e = read(&z, None, None).unwrap_err();
        assert!(e.contains("ftrace.txt.gz"), "{e}");
        let _ = std::fs::remove_file(z);
        let bad = write_tmp(
            "ftrace-bad.txt",
            "  bash-1 [000] ..... 5.000001: block_rq_issue: 254,0 W 8192 () xyz + 16 be,0,4 [bash]\n",
        );
        let e = read(&bad, None, None).unwrap_err();
        assert!(e.contains(":1:") && e.contains("sector is not a number"), "{e}");
        assert!(
            TraceWriter::create(&bad, Format::Ftrace, &[]).is_err(),
            "the kernel's formats are read only"
        );
        for p in [p, bad] {
            let _ = std::fs::remove_file(p);
        }
    }

    #[test]
    fn malformed_lines_are_errors_with_their_line_number() {
        let p = write_tmp("bad.csv", "1,W,0,4096,5\n1,X,0,4096,6\n");
        let e = read(&p, None, None).unwrap_err();
        assert!(e.contains(":2:") && e.contains("opcode"), "{e}");
        let p2 = write_tmp("bad2.csv", "1,W,18446744073709551615,4096,5\n");
        assert!(read(&p2, None, None).unwrap_err().contains("overflows"));
        let p3 = write_tmp("bad3.log", "/dev/x write 0 4096\n");
        assert!(read(&p3, Some(Format::FioLog), None).is_err());
        for p in [p, p2, p3] {
            let _ = std::fs::remove_file(p);
        }
    }

    #[test]
    fn a_written_trace_reads_back() {
        for format in [Format::Msr, Format::Alibaba, Format::FioLog] {
            let scratch = tempfile::tempdir().unwrap();
            let p = scratch.path().join(format!("out-{format:?}"));
            let names = vec!["dev0".to_string()];
            let w = TraceWriter::create(&p, format, &names).unwrap();
            w.record(0, "dev0", true, 1 << 20, 65536, 3);
            w.record(0, "dev0", false, 4096, 4096, 2);
            w.finish(&names).unwrap();
            let ops = read(&p, Some(format), None).unwrap();
            assert_eq!(ops.len(), 2, "{format:?}");
            assert_eq!((ops[0].kind, ops[0].offset, ops[0].len), (OpKind::Write, 1 << 20, 65536));
            assert_eq!((ops[1].kind, ops[1].offset, ops[1].len), (OpKind::Read, 4096, 4096));
            let _ = std::fs::remove_file(p);
        }
    }
}
