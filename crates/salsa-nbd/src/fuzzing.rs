//! Entry points shared by the `cargo fuzz` targets (`fuzz/`) and the property tests: drive the
//! codec with arbitrary client bytes, as a server would, and check its invariants.

use crate::proto::{self, Catalog, ExportInfo, Handshake, Negotiated, Step};

/// A catalog with one export, for driving the codec without a pool.
pub struct OneExport(pub ExportInfo);

impl Catalog for OneExport {
    fn exports(&self) -> Vec<ExportInfo> {
        vec![self.0.clone()]
    }
    fn lookup(&self, name: &str) -> Option<ExportInfo> {
        (name.is_empty() || name == self.0.name).then(|| self.0.clone())
    }
}

pub fn test_export() -> OneExport {
    OneExport(ExportInfo {
        name: "default".into(),
        description: "fuzz".into(),
        size_bytes: 1 << 30,
        read_only: false,
        preferred_block_bytes: 4096,
    })
}

/// Feeds `input` to a handshake in chunks of the given sizes (cycled), then parses and
/// validates requests from whatever follows. Returns the bytes the server would send. Panics
/// only if an invariant breaks (consuming more than given, or stalling with input left).
pub fn drive(input: &[u8], chunks: &[usize]) -> Vec<u8> {
    let catalog = test_export();
    // TLS offered, so that STARTTLS and the options after it are fuzzed too (the bytes after
    // the ACK stand for what the TLS layer decrypts).
    let mut hs = Handshake::with_tls(crate::proto::TlsMode::On);
    let mut out = Vec::new();
    Handshake::greeting(&mut out);
    let mut buf: Vec<u8> = Vec::new();
    let mut fed = 0;
    let mut chunk_iter = chunks.iter().copied().filter(|&c| c > 0).cycle();
    let negotiated: Option<Negotiated> = loop {
        let mut consumed = 0;
        let step = hs.step(&buf, &mut consumed, &mut out, &catalog);
        assert!(consumed <= buf.len(), "handshake consumed more than it was given");
        buf.drain(..consumed);
        match step {
            Ok(Step::Done(n)) => break Some(n),
            Ok(Step::StartTls) => hs.tls_started(),
            Ok(Step::Progress) => {}
            Ok(Step::NeedMore) => {
                if fed >= input.len() {
                    break None;
                }
                let n = chunk_iter.next().unwrap_or(input.len()).min(input.len() - fed);
                buf.extend_from_slice(&input[fed..fed + n]);
                fed += n;
            }
            Err(_) => break None,
        }
    };
    let Some(n) = negotiated else { return out };
    buf.extend_from_slice(&input[fed..]);
    let mut at = 0;
    while let Ok(Some(req)) = proto::parse_request(&buf[at..]) {
        let total = proto::REQUEST_HEADER_BYTES + req.payload_bytes() as usize;
        if buf.len() - at < total {
            break;
        }
        at += total;
        match proto::validate(&req, &n) {
            Ok(cmd) => {
                if let proto::Command::Read { offset, length, .. } | proto::Command::Write { offset, length, .. } = cmd {
                    assert!(offset + length as u64 <= n.export.size_bytes, "validated a range past the end");
                    assert!(length <= proto::MAX_REQUEST_BYTES);
                }
                proto::simple_reply(&mut out, req.cookie, 0, &[]);
            }
            Err(errno) => proto::simple_reply(&mut out, req.cookie, errno, &[]),
        }
    }
    out
}
