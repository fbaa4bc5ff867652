//! The server against malformed and hostile input, the way nbdkit is tested: every bad request
//! gets the protocol's error code, the server never panics and never damages a volume; and
//! kill -9 during a flushing workload loses nothing that was flushed.

mod common;
use common::*;
use salsa_nbd::proto::*;
use std::io::{Read, Write};

#[test]
fn malformed_requests_get_error_codes_and_damage_nothing() {
    let dir = test_dir("malformed");
    let srv = Server::start(&dir, "48M", &[]);
    let mut c = RawClient::connect(&srv.socket, "default");
    assert!(c.flags & TFLAG_CAN_MULTI_CONN != 0);
    let page = vec![0x5au8; 4096];
    assert_eq!(c.call(0, CMD_WRITE, 0, 4096, &page).0, 0);
    assert_eq!(c.call(0, 99, 0, 4096, &[]).0, EINVAL, "unknown command");
    assert_eq!(c.call(CMD_FLAG_FUA, CMD_READ, 0, 4096, &[]).0, EINVAL, "FUA on a read");
    assert_eq!(
        c.call(1 << 9, CMD_WRITE, 0, 4096, &page).0,
        EINVAL,
        "unknown flag; the payload is still consumed"
    );
    assert_eq!(
        c.call(CMD_FLAG_DF, CMD_READ, 0, 4096, &[]).0,
        EINVAL,
        "DF without structured replies"
    );
    assert_eq!(c.call(0, CMD_READ, 0, 0, &[]).0, EINVAL, "zero length");
    assert_eq!(c.call(0, CMD_READ, c.size - 10, 4096, &[]).0, EINVAL, "read past the end");
    assert_eq!(c.call(0, CMD_WRITE, c.size - 10, 4096, &page).0, ENOSPC, "write past the end");
    assert_eq!(c.call(0, CMD_READ, u64::MAX - 100, 4096, &[]).0, EINVAL, "offset overflow");
    assert_eq!(c.call(0, CMD_READ, 0, MAX_REQUEST_BYTES + 1, &[]).0, EINVAL, "oversized read");
    assert_eq!(c.call(0, CMD_BLOCK_STATUS, 0, 4096, &[]).0, EINVAL, "no meta context negotiated");
    let oversized = vec![0x11u8; MAX_REQUEST_BYTES as usize + 4096];
    assert_eq!(
        c.call(0, CMD_WRITE, 0, oversized.len() as u32, &oversized).0,
        EOVERFLOW,
        "oversized write; its payload is read and dropped"
    );
    assert_eq!(c.call(0, CMD_FLUSH, 0, 0, &[]).0, 0);
    // Still in sync and the data intact.
    let (err, data) = c.call(0, CMD_READ, 0, 4096, &[]);
    assert_eq!((err, data), (0, page.clone()));
    // A client vanishing mid-payload: nothing of it is applied.
    let mut v = RawClient::connect(&srv.socket, "default");
    v.send(0, CMD_WRITE, 1, 0, 8192, &[0xEE; 100]).unwrap();
    drop(v);
    // Bad magic closes the connection.
    let mut b = RawClient::connect(&srv.socket, "default");
    b.s.write_all(&[0u8; 28]).unwrap();
    let mut one = [0u8; 1];
    assert_eq!(b.s.read(&mut one).unwrap_or(0), 0, "server must close on bad magic");
    // Endless option haggling is cut off.
    let mut h = RawClient::greet(&srv.socket);
    let mut closed = false;
    for _ in 0..2000 {
        if h.write_all(&option_bytes(12345, b"x")).is_err() || read_option_reply(&mut h).is_err() {
            closed = true;
            break;
        }
    }
    assert!(closed, "server kept haggling forever");
    // An unknown option gets ERR_UNSUP and the stream continues; an unknown export ERR_UNKNOWN.
    let mut h = RawClient::greet(&srv.socket);
    h.write_all(&option_bytes(12345, b"abc")).unwrap();
    assert_eq!(read_option_reply(&mut h).unwrap().1, REP_ERR_UNSUP);
    let mut go = 4u32.to_be_bytes().to_vec();
    go.extend_from_slice(b"nope");
    go.extend_from_slice(&0u16.to_be_bytes());
    h.write_all(&option_bytes(OPT_GO, &go)).unwrap();
    assert_eq!(read_option_reply(&mut h).unwrap().1, REP_ERR_UNKNOWN);
    let (err, data) = c.call(0, CMD_READ, 0, 8192, &[]);
    assert_eq!(err, 0);
    assert_eq!(&data[..4096], &page[..]);
    assert!(data[4096..].iter().all(|&b| b == 0), "a partial payload was applied");
    let log = srv.log();
    srv.stop();
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn pipelined_requests_are_all_answered_with_their_own_data() {
    let dir = test_dir("pipelined");
    let srv = Server::start(&dir, "48M", &[]);
    let mut c = RawClient::connect(&srv.socket, "default");
    // 200 writes sent without waiting (more than the threads serving a connection), then 200
    // reads of the same pages: every reply carries its request's cookie and the page written
    // there, whatever order the replies come in.
    let page = |i: u64| vec![(i % 251) as u8 + 1; 4096];
    for i in 0..200u64 {
        c.send(0, CMD_WRITE, i, i * 4096, 4096, &page(i)).unwrap();
    }
    let mut answered = std::collections::BTreeSet::new();
    for _ in 0..200 {
        let (cookie, err, _) = c.reply(0).unwrap();
        assert_eq!(err, 0, "write {cookie}");
        assert!(answered.insert(cookie), "write {cookie} answered twice");
    }
    assert_eq!(answered, (0..200).collect());
    for i in 0..200u64 {
        c.send(0, CMD_READ, 1000 + i, i * 4096, 4096, &[]).unwrap();
    }
    for _ in 0..200 {
        // Replies to reads may come in any order; each is checked against its own cookie.
        let (cookie, err, data) = c.reply(4096).unwrap();
        assert_eq!(err, 0);
        assert_eq!(data, page(cookie - 1000), "read {cookie}");
    }
    // Small and large replies mixed (larger than the queue of replies waiting for the sending
    // thread): each still arrives whole, after its own header.
    let len = |cookie: u64| if cookie.is_multiple_of(2) { 3 << 20 } else { 4096 };
    let at = |cookie: u64| (cookie % 7) * 4096;
    for cookie in 2000..2064u64 {
        c.send(0, CMD_READ, cookie, at(cookie), len(cookie) as u32, &[]).unwrap();
    }
    for _ in 0..64 {
        let (cookie, err, data) = c.reply_sized(len).unwrap();
        assert_eq!((err, data.len()), (0, len(cookie)), "read {cookie}");
        let first = at(cookie) / 4096;
        let want: Vec<u8> = (first..first + len(cookie) as u64 / 4096)
            .flat_map(|p| if p < 200 { page(p) } else { vec![0; 4096] })
            .collect();
        assert!(data == want, "read {cookie} returned other data");
    }
}

/// A read answered from memory (by the thread that received it, its reply held to go out with
/// others) is never held back while the server waits for the client: here the client sends
/// the read, then a write's header and half its payload, and sends the rest only once it has
/// the read's reply.
#[test]
fn a_read_answered_from_memory_is_sent_before_the_server_waits_for_the_client() {
    let dir = test_dir("memory-read-reply");
    let srv = Server::start(&dir, "48M", &[]);
    let mut c = RawClient::connect(&srv.socket, "default");
    let page = vec![5u8; 4096];
    assert_eq!(c.call(0, CMD_WRITE, 0, 4096, &page).0, 0); // now in the write buffer
    let payload = vec![9u8; 64 << 10];
    let write = encode_request(0, CMD_WRITE, 2, 1 << 20, payload.len() as u32, &payload);
    let split = REQUEST_HEADER_BYTES + payload.len() / 2;
    let mut burst = encode_request(0, CMD_READ, 1, 0, 4096, &[]);
    burst.extend_from_slice(&write[..split]);
    c.s.write_all(&burst).unwrap();
    let (cookie, err, data) = c.reply(4096).expect("the read's reply, while the write is incomplete");
    assert_eq!((cookie, err), (1, 0));
    assert!(data == page);
    c.s.write_all(&write[split..]).unwrap();
    let (cookie, err, _) = c.reply(0).unwrap();
    assert_eq!((cookie, err), (2, 0));
    assert!(c.call(0, CMD_READ, 1 << 20, payload.len() as u32, &[]).1 == payload);
}

#[test]
fn read_only_export_refuses_writes() {
    let dir = test_dir("readonly");
    drop(Server::start(&dir, "48M", &[])); // create the pool
    let srv = Server::start(&dir, "48M", &["--read-only"]);
    let mut c = RawClient::connect(&srv.socket, "default");
    assert!(c.flags & TFLAG_READ_ONLY != 0);
    assert_eq!(c.call(0, CMD_WRITE, 0, 4096, &[1u8; 4096]).0, EPERM);
    assert_eq!(c.call(0, CMD_TRIM, 0, 4096, &[]).0, EPERM);
    assert_eq!(c.call(0, CMD_WRITE_ZEROES, 0, 4096, &[]).0, EPERM);
    assert_eq!(c.call(0, CMD_READ, 0, 4096, &[]).0, 0);
}

fn block(page: u64, version: u64) -> Vec<u8> {
    let mut v = vec![0u8; 4096];
    for (i, c) in v.chunks_mut(8).enumerate() {
        c.copy_from_slice(&(page << 32 ^ version ^ (i as u64) << 48).to_le_bytes());
    }
    v
}

#[test]
fn kill_9_during_flushing_workload_loses_nothing_flushed() {
    let dir = test_dir("kill9");
    let srv = Server::start(&dir, "64M", &[]);
    let pages = 4000u64;
    let mut flushed = vec![0u64; pages as usize];
    let mut latest = vec![0u64; pages as usize];
    let killer = {
        let pid = srv.child.id();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(1500));
            // SAFETY: sends SIGKILL to our own child.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        })
    };
    let mut c = RawClient::connect(&srv.socket, "default");
    let mut x = 1u64;
    'work: for round in 1..u64::MAX {
        for _ in 0..200 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let p = (x >> 33) % pages;
            // Versions grow with the round (x >> 50 < 2^14), so "later" is "larger".
            let v = round * 100_000 + (x >> 50);
            latest[p as usize] = v;
            if c.send(0, CMD_WRITE, p, p * 4096, 4096, &block(p, v)).is_err() || c.reply(0).map(|r| r.1 != 0).unwrap_or(true) {
                break 'work;
            }
        }
        match c.send(0, CMD_FLUSH, 0, 0, 0, &[]).and_then(|_| c.reply(0)) {
            Ok((_, 0, _)) => flushed.copy_from_slice(&latest),
            _ => break 'work,
        }
    }
    killer.join().unwrap();
    srv.kill();
    let srv = Server::start(&dir, "64M", &[]);
    let mut c = RawClient::connect(&srv.socket, "default");
    let mut checked = 0;
    for p in 0..pages {
        let (err, data) = c.call(0, CMD_READ, p * 4096, 4096, &[]);
        assert_eq!(err, 0);
        if flushed[p as usize] == 0 {
            continue;
        }
        // The flushed version or a later one.
        let ok = data == block(p, flushed[p as usize])
            || (data.len() == 4096 && data[..8] != [0u8; 8] && {
                let w = u64::from_le_bytes(data[..8].try_into().unwrap());
                let v = w ^ p << 32;
                v >= flushed[p as usize] && data == block(p, v)
            });
        assert!(ok, "page {p} lost its flushed version {}", flushed[p as usize]);
        checked += 1;
    }
    assert!(checked > 1000, "only {checked} pages were flushed before the kill");
    srv.stop();
}

/// With structured replies negotiated, a write and a flush that succeed are answered with a
/// simple reply (16 bytes, as nbdkit and qemu-nbd answer them), a read with a structured data
/// chunk, and a failed write with a structured error chunk that carries its message.
#[test]
fn structured_replies_for_reads_and_errors_simple_ones_for_other_successes() {
    let dir = test_dir("structured");
    let srv = Server::start(&dir, "48M", &[]);
    let mut c = RawClient::connect_with(&srv.socket, "default", true);
    let page = vec![0x3cu8; 4096];
    let word = |b: &[u8], at: usize| u32::from_be_bytes(b[at..at + 4].try_into().unwrap());
    let half = |b: &[u8], at: usize| u16::from_be_bytes(b[at..at + 2].try_into().unwrap());
    for (kind, payload) in [(CMD_WRITE, &page[..]), (CMD_FLUSH, &[][..])] {
        let length = payload.len() as u32;
        c.send(0, kind, 11, 0, length, payload).unwrap();
        let (cookie, err, _) = c.reply(0).unwrap();
        assert_eq!((cookie, err), (11, 0), "command {kind}: not a simple success reply");
    }
    c.send(0, CMD_READ, 12, 0, 4096, &[]).unwrap();
    let h = read_exact(&mut c.s, 20).unwrap();
    assert_eq!(word(&h, 0), STRUCTURED_REPLY_MAGIC, "a read answered without a structured chunk");
    assert_eq!((half(&h, 4), half(&h, 6)), (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA));
    assert_eq!(word(&h, 16), 8 + 4096);
    let body = read_exact(&mut c.s, 8 + 4096).unwrap();
    assert_eq!(&body[8..], &page[..]);
    c.send(0, CMD_WRITE, 13, c.size - 10, 4096, &page).unwrap();
    let h = read_exact(&mut c.s, 20).unwrap();
    assert_eq!(word(&h, 0), STRUCTURED_REPLY_MAGIC, "an error answered without a structured chunk");
    assert_eq!(half(&h, 6), REPLY_TYPE_ERROR);
    let body = read_exact(&mut c.s, word(&h, 16) as usize).unwrap();
    assert_eq!(word(&body, 0), ENOSPC);
    let message = String::from_utf8_lossy(&body[6..6 + half(&body, 4) as usize]).to_string();
    assert!(!message.is_empty(), "an error without its message");
    // Still in step: the next request gets its own reply.
    c.send(0, CMD_FLUSH, 14, 0, 0, &[]).unwrap();
    assert_eq!(c.reply(0).unwrap().0, 14);
    drop(c);
    srv.stop();
}

/// Write-behind over NBD: a client that flushes after every write at queue depth 1 (what a
/// database's commits look like) gets each write's record written right after its reply, so
/// that the flush only syncs; `salsa stats` counts those records. When the client stops
/// flushing, at most two more are written early. Every page reads back. Both with the write
/// buffer (writes answered from it) and without (writes executed by the thread that received
/// them, which then writes the record behind before it reads the socket again).
#[test]
fn a_client_that_flushes_after_every_write_gets_its_records_written_behind() {
    for (name, args) in [("write-behind", &[][..]), ("write-behind-unbuffered", &["--write-buffer", "0"][..])] {
        flushing_client_gets_its_records_written_behind(name, args);
    }
}

fn flushing_client_gets_its_records_written_behind(name: &str, serve_args: &[&str]) {
    let dir = test_dir(name);
    let srv = Server::start(&dir, "48M", serve_args);
    let device = dir.join("pool.img");
    let written_ahead = || -> u64 {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_salsa"));
        let (ok, out) = run(cmd.args(["stats", "--json", "--device"]).arg(&device));
        assert!(ok, "{out}");
        let stats: serde_json::Value = serde_json::from_str(out.lines().last().unwrap_or("")).unwrap();
        stats["records_written_ahead"].as_u64().unwrap_or_else(|| panic!("no count: {out}"))
    };
    let page = |i: u64| vec![(i % 251) as u8 + 1; 4096];
    let mut c = RawClient::connect(&srv.socket, "default");
    assert_eq!(c.call(0, CMD_WRITE, 0, 4096, &page(0)).0, 0);
    assert_eq!(written_ahead(), 0, "written ahead before the client was seen flushing");
    for i in 0..32u64 {
        assert_eq!(c.call(0, CMD_WRITE, i * 4096, 4096, &page(i)).0, 0);
        assert_eq!(c.call(0, CMD_FLUSH, 0, 0, &[]).0, 0);
    }
    let flushing = written_ahead();
    assert!(flushing >= 20, "{name}: only {flushing} of 32 flushed writes were written behind");
    for i in 32..64u64 {
        assert_eq!(c.call(0, CMD_WRITE, i * 4096, 4096, &page(i)).0, 0);
    }
    let (err, _) = c.call(0, CMD_READ, 0, 4096, &[]);
    assert_eq!(err, 0);
    let after = written_ahead();
    assert!(
        after - flushing <= 2,
        "{name}: {} records written ahead for a client that stopped flushing",
        after - flushing
    );
    for i in 0..64u64 {
        let (err, data) = c.call(0, CMD_READ, i * 4096, 4096, &[]);
        assert_eq!((err, data == page(i)), (0, true), "page {i}");
    }
    drop(c);
    srv.stop();
}

/// `salsa serve --metrics`: Prometheus text at /metrics with the pool's, the volume's and the
/// read cache's figures, moving as clients write; other paths get 404; a metrics port in use
/// stops the start before anything is created.
#[test]
fn the_server_exports_prometheus_metrics() {
    let dir = test_dir("metrics");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let server = Server::start(&dir, "64M", &["--metrics", &addr]);
    let get = |path: &str| -> String {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    let before = get("/metrics");
    assert!(before.starts_with("HTTP/1.0 200"), "{before}");
    assert!(before.contains("text/plain; version=0.0.4"), "{before}");
    assert!(before.contains("# TYPE salsa_user_written_bytes_total counter"), "{before}");
    assert!(
        before.contains("salsa_volume_size_bytes{volume=\"default\",controller=\"lsa\"}"),
        "{before}"
    );
    assert!(before.contains("salsa_read_cache_capacity_bytes"), "{before}");
    // A client writes 64 KiB: the counter moves by that much.
    let mut c = RawClient::connect(&server.socket, "default");
    let (err, _) = c.call(0, CMD_WRITE, 0, 65536, &vec![7u8; 65536]);
    assert_eq!(err, 0);
    let value = |text: &str, name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing"))
    };
    let after = get("/metrics");
    assert_eq!(
        value(&after, "salsa_user_written_bytes_total") - value(&before, "salsa_user_written_bytes_total"),
        65536.0
    );
    // A flush writes the buffered pages down; their buffers are kept for the next writes.
    let (err, _) = c.call(0, CMD_FLUSH, 0, 0, &[]);
    assert_eq!(err, 0);
    let flushed = get("/metrics");
    assert_eq!(value(&flushed, "salsa_write_buffer_dirty_bytes"), 0.0);
    assert_eq!(value(&flushed, "salsa_write_buffer_spare_bytes"), 16.0 * (4096.0 + 64.0));
    assert!(get("/other").starts_with("HTTP/1.0 404"));
    drop(c);
    server.stop();
    // The metrics port is taken: refused, and no pool file is made.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = busy.local_addr().unwrap().to_string();
    let fresh = test_dir("metrics-busy");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_salsa"))
        .args(["serve", "--no-tcp", "--unix"])
        .arg(fresh.join("s.sock"))
        .arg("--device")
        .arg(format!("{}:64M", fresh.join("pool.img").display()))
        .args(["--metrics", &taken])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && text.contains("cannot serve metrics"), "{text}");
    assert!(!fresh.join("pool.img").exists(), "a pool was created");
}

/// `--pace-writes` on a pool whose GC cannot keep up: the server writes a paced write at once
/// and holds its reply until the write's turn (no thread sleeps per write). A client keeping 32
/// writes in flight for two seconds gets every one answered, once, without error; the server
/// paced writes; a disconnect with writes in flight gets every reply before the connection
/// closes; and every page reads back its last write.
#[test]
fn paced_writes_are_answered_at_their_turn_each_once_and_read_back() {
    use rand::{Rng, SeedableRng};
    let dir = test_dir("paced-replies");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let srv = Server::start(&dir, "48M", &["--pace-writes", "--write-buffer-expire-ms", "1", "--metrics", &addr]);
    let paced_writes = || -> f64 {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out.lines()
            .find_map(|l| l.strip_prefix("salsa_paced_writes_total "))
            .and_then(|v| v.parse().ok())
            .expect("salsa_paced_writes_total")
    };
    let mut c = RawClient::connect(&srv.socket, "default");
    let pages = c.size / 4096 * 85 / 100;
    let mut version = vec![0u64; pages as usize];
    for p in 0..pages {
        c.send(0, CMD_WRITE, p, p * 4096, 4096, &block(p, 0)).unwrap();
        assert_eq!(c.reply(0).unwrap().1, 0);
    }
    // 32 writes in flight, never two to one page (their order would be the server's to pick).
    let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
    let mut in_flight = std::collections::HashMap::new(); // cookie -> page
    let mut cookie = 1u64 << 32;
    let mut send_one = |c: &mut RawClient, in_flight: &mut std::collections::HashMap<u64, u64>, version: &mut Vec<u64>| loop {
        let p = rng.gen_range(0..pages);
        if in_flight.values().all(|&q| q != p) {
            cookie += 1;
            version[p as usize] += 1;
            c.send(0, CMD_WRITE, cookie, p * 4096, 4096, &block(p, version[p as usize]))
                .unwrap();
            in_flight.insert(cookie, p);
            return;
        }
    };
    for _ in 0..32 {
        send_one(&mut c, &mut in_flight, &mut version);
    }
    let started = std::time::Instant::now();
    let mut answered = 0u64;
    while started.elapsed() < std::time::Duration::from_secs(2) {
        let (got, err, _) = c.reply(0).unwrap();
        assert_eq!(err, 0, "write {got}");
        assert!(in_flight.remove(&got).is_some(), "reply {got} to no write in flight");
        answered += 1;
        send_one(&mut c, &mut in_flight, &mut version);
    }
    while !in_flight.is_empty() {
        let (got, err, _) = c.reply(0).unwrap();
        assert_eq!(err, 0, "write {got}");
        assert!(in_flight.remove(&got).is_some(), "reply {got} to no write in flight");
    }
    assert!(paced_writes() > 0.0, "{answered} writes answered, none paced: {}", srv.log());
    // A disconnect with 32 writes in flight, their replies held: each is answered before the
    // server closes the connection.
    for _ in 0..32 {
        send_one(&mut c, &mut in_flight, &mut version);
    }
    c.send(0, CMD_DISC, 0, 0, 0, &[]).unwrap();
    while !in_flight.is_empty() {
        let (got, err, _) = c.reply(0).unwrap();
        assert_eq!(err, 0, "write {got}");
        assert!(in_flight.remove(&got).is_some(), "reply {got} to no write in flight");
    }
    assert_eq!(c.s.read(&mut [0u8; 1]).unwrap(), 0, "the server closes after the last reply");
    drop(c);
    // A clean stop completes every request read; the pool is closed and opened again.
    srv.stop();
    let srv = Server::start(&dir, "48M", &[]);
    let mut c = RawClient::connect(&srv.socket, "default");
    for p in 0..pages {
        c.send(0, CMD_READ, p, p * 4096, 4096, &[]).unwrap();
        let (_, err, data) = c.reply(4096).unwrap();
        assert_eq!(err, 0);
        assert!(data == block(p, version[p as usize]), "page {p} lost its last write");
    }
    drop(c);
    srv.stop();
}
