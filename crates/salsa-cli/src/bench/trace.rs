//! Block traces: reading MSR Cambridge CSV, Alibaba / SepBIT CSV and fio iolog (versions 2 and
//! 3) for replay, and writing what SALSA sent to its devices in the same formats
//! ([`RecordingDevice`]), so other simulators can be fed with it.
//!
//! Formats, one request per line:
//! - MSR: `Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime`; the timestamp counts
//!   100 ns ticks (Windows filetime), `Type` is `Read` or `Write`.
//! - Alibaba / SepBIT: `volume,W|R,offset,length,timestamp` with the timestamp in microseconds.
//! - fio iolog: a `fio version 2 iolog` (or `3`) header, then `file action [offset length]`
//!   (version 3 puts a nanosecond timestamp first); actions other than read and write are
//!   skipped.
//!
//! Parsing is strict: a malformed line is an error naming the file and line, never a silent skip.

use salsa_core::Device;
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// One request of a trace, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceOp {
    pub write: bool,
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
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Format, String> {
        match s {
            "msr" => Ok(Format::Msr),
            "alibaba" | "sepbit" => Ok(Format::Alibaba),
            "fio" | "iolog" => Ok(Format::FioLog),
            _ => Err(format!("unknown trace format {s:?}; use msr, alibaba or fio")),
        }
    }
}

/// Guesses a trace's format from its first line.
fn sniff(first: &str) -> Format {
    if first.starts_with("fio version") {
        Format::FioLog
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

/// Reads a trace. `volume` picks one volume of an Alibaba trace (default: the first one seen),
/// or one disk number of an MSR trace.
pub fn read(path: &Path, format: Option<Format>, volume: Option<&str>) -> Result<Vec<TraceOp>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut lines = std::io::BufReader::new(file).lines().enumerate().peekable();
    let first = match lines.peek() {
        Some((_, Ok(l))) => l.clone(),
        Some((_, Err(e))) => return Err(format!("{}: {e}", path.display())),
        None => return Err(format!("{}: empty trace", path.display())),
    };
    let format = format.unwrap_or_else(|| sniff(&first));
    let mut ops = Vec::new();
    let mut t0: Option<u64> = None;
    let mut chosen: Option<String> = volume.map(str::to_string);
    let mut fio_version = 0;
    for (i, line) in lines {
        let line = line.map_err(|e| format!("{}: {e}", path.display()))?;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |why: &str| format!("{}:{}: {why}: {line:?}", path.display(), i + 1);
        let num = |s: &str, what: &str| s.trim().parse::<u64>().map_err(|_| bad(&format!("{what} is not a number")));
        let (write, offset, len, ts) = match format {
            Format::Msr => {
                let f: Vec<&str> = line.split(',').collect();
                if f.len() < 6 {
                    return Err(bad("MSR lines have 7 fields"));
                }
                if let Some(v) = &chosen {
                    if f[2].trim() != v {
                        continue;
                    }
                }
                let write = match f[3].trim().to_ascii_lowercase().as_str() {
                    "write" => true,
                    "read" => false,
                    _ => return Err(bad("type must be Read or Write")),
                };
                (write, num(f[4], "offset")?, num(f[5], "size")?, num(f[0], "timestamp")? / 10)
            }
            Format::Alibaba => {
                let f: Vec<&str> = line.split(',').collect();
                if f.len() < 5 {
                    return Err(bad("Alibaba lines have 5 fields"));
                }
                match &chosen {
                    Some(v) if f[0].trim() != v => continue,
                    Some(_) => {}
                    None => chosen = Some(f[0].trim().to_string()),
                }
                let write = match f[1].trim() {
                    "W" | "w" => true,
                    "R" | "r" => false,
                    _ => return Err(bad("opcode must be W or R")),
                };
                (write, num(f[2], "offset")?, num(f[3], "length")?, num(f[4], "timestamp")?)
            }
            Format::FioLog => {
                if let Some(v) = line.strip_prefix("fio version ") {
                    fio_version = v
                        .split_whitespace()
                        .next()
                        .and_then(|v| v.parse::<u32>().ok())
                        .filter(|v| *v == 2 || *v == 3)
                        .ok_or_else(|| bad("only fio iolog versions 2 and 3 are supported"))?;
                    continue;
                }
                if fio_version == 0 {
                    return Err(bad("a fio iolog starts with \"fio version 2 iolog\""));
                }
                let mut f = line.split_whitespace();
                let ts = if fio_version == 3 {
                    num(f.next().unwrap_or(""), "timestamp")? / 1000
                } else {
                    0
                };
                let _file = f.next().ok_or_else(|| bad("missing file name"))?;
                let write = match f.next() {
                    Some("write") => true,
                    Some("read") => false,
                    Some(_) => continue, // add, open, close, sync, trim, wait
                    None => return Err(bad("missing action")),
                };
                let offset = num(f.next().unwrap_or(""), "offset")?;
                let len = num(f.next().unwrap_or(""), "length")?;
                (write, offset, len, ts)
            }
        };
        if len == 0 {
            continue;
        }
        offset.checked_add(len).ok_or_else(|| bad("offset + length overflows"))?;
        let base = *t0.get_or_insert(ts);
        ops.push(TraceOp {
            write,
            offset,
            len,
            at_us: ts.saturating_sub(base),
        });
    }
    if ops.is_empty() {
        return Err(format!("{}: no read or write requests in the trace", path.display()));
    }
    Ok(ops)
}

/// The bytes a trace touches: one past its highest byte.
pub fn extent(ops: &[TraceOp]) -> u64 {
    ops.iter().map(|o| o.offset + o.len).max().unwrap_or(0)
}

/// Writes device requests in one of the trace formats.
pub struct TraceWriter {
    out: parking_lot::Mutex<std::io::BufWriter<std::fs::File>>,
    format: Format,
    start: Instant,
}

impl TraceWriter {
    pub fn create(path: &Path, format: Format, device_names: &[String]) -> Result<Arc<TraceWriter>, String> {
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

    fn write_tmp(name: &str, text: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("salsa-trace-{}-{name}", std::process::id()));
        std::fs::write(&p, text).unwrap();
        p
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
                write: true,
                offset: 3154321408,
                len: 4096,
                at_us: 0
            }
        );
        assert_eq!(ops[1].at_us, 1000);
        assert!(!ops[1].write);

        let ali = write_tmp("ali.csv", "7,W,4096,8192,1000\n8,W,0,4096,1001\n7,R,0,4096,1500\n");
        let ops = read(&ali, None, None).unwrap();
        assert_eq!(ops.len(), 2, "only volume 7, the first seen");
        assert_eq!(
            ops[1],
            TraceOp {
                write: false,
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
        assert!(ops[0].write && !ops[1].write);
        for p in [msr, ali, fio] {
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
            let p = std::env::temp_dir().join(format!("salsa-trace-{}-out-{format:?}", std::process::id()));
            let names = vec!["dev0".to_string()];
            let w = TraceWriter::create(&p, format, &names).unwrap();
            w.record(0, "dev0", true, 1 << 20, 65536, 3);
            w.record(0, "dev0", false, 4096, 4096, 2);
            w.finish(&names).unwrap();
            let ops = read(&p, Some(format), None).unwrap();
            assert_eq!(ops.len(), 2, "{format:?}");
            assert_eq!((ops[0].write, ops[0].offset, ops[0].len), (true, 1 << 20, 65536));
            assert_eq!((ops[1].write, ops[1].offset, ops[1].len), (false, 4096, 4096));
            let _ = std::fs::remove_file(p);
        }
    }
}
