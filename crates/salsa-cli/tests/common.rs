//! Helpers for the end-to-end tests: a `salsa serve` child process and a minimal raw NBD client.
#![allow(dead_code)]

use salsa_nbd::proto::*;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `salsa serve`.
pub struct Server {
    pub child: Child,
    pub port: u16,
    pub socket: PathBuf,
    pub dir: PathBuf,
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A fresh directory for one test, removed with all it holds when dropped: when the test
/// passes and when it fails (a failed assertion unwinds through the drop), so the suite leaves
/// nothing in the temporary directory. Declared first in a test, it is dropped last, after the
/// servers and mounts that use it.
pub struct TestDir(tempfile::TempDir);

impl std::ops::Deref for TestDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        self.0.path()
    }
}

impl AsRef<Path> for TestDir {
    fn as_ref(&self) -> &Path {
        self.0.path()
    }
}

/// A fresh directory for one test (see [`TestDir`]).
pub fn test_dir(name: &str) -> TestDir {
    let dir = tempfile::Builder::new()
        .prefix(&format!("salsa-e2e-{name}-"))
        .tempdir()
        .expect("create a test directory");
    TestDir(dir)
}

/// Fails the test with a clear message when a client tool is missing (scripts/test.sh installs
/// them; the tests must not pass silently without them).
pub fn require(tool: &str) {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "{tool} is not installed; run scripts/install-deps.sh");
}

impl Server {
    /// Starts `salsa serve` on `dir/pool.img` (created at `size` if missing) with extra args.
    pub fn start(dir: &Path, size: &str, extra: &[&str]) -> Server {
        let device = format!("{}:{size}", dir.join("pool.img").display());
        let mut args = vec!["--segment-size", "1M"];
        args.extend_from_slice(extra);
        Server::start_on(dir, &[device], &args)
    }

    /// Starts `salsa serve` on the device specs `devices` with extra args.
    pub fn start_on(dir: &Path, devices: &[String], extra: &[&str]) -> Server {
        let port = free_port();
        let socket = dir.join("nbd.sock");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("serve.log"))
            .unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_salsa"));
        cmd.arg("serve");
        for d in devices {
            cmd.args(["--device", d]);
        }
        let child = cmd
            .args(["--listen", &format!("127.0.0.1:{port}"), "--unix"])
            .arg(&socket)
            .args(extra)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start salsa serve");
        let mut s = Server {
            child,
            port,
            socket,
            dir: dir.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while UnixStream::connect(&s.socket).is_err() {
            if let Ok(Some(status)) = s.child.try_wait() {
                panic!("server exited with {status}: {}", s.log());
            }
            assert!(Instant::now() < deadline, "server did not start: {}", s.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        s
    }

    pub fn uri(&self) -> String {
        format!("nbd://127.0.0.1:{}/default", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default()
    }

    /// SIGTERM, then waits for the exit; fails the test, with the exit status and the server's
    /// log, unless the server exited cleanly.
    pub fn stop(mut self) {
        // SAFETY: kill only sends a signal to our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the server did not stop cleanly ({status}): {}", self.log());
        std::mem::forget(self);
    }

    /// kill -9.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::mem::forget(self);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a command, returns (success, stdout + stderr).
pub fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// A minimal NBD client over a Unix socket: fixed newstyle, GO, simple replies.
pub struct RawClient {
    pub s: UnixStream,
    pub size: u64,
    pub flags: u16,
}

pub fn read_exact(s: &mut UnixStream, n: usize) -> std::io::Result<Vec<u8>> {
    let mut b = vec![0u8; n];
    s.read_exact(&mut b)?;
    Ok(b)
}

pub fn option_bytes(option: u32, data: &[u8]) -> Vec<u8> {
    encode_option(option, data)
}

/// Reads one option reply: (option, type, data).
pub fn read_option_reply(s: &mut UnixStream) -> std::io::Result<(u32, u32, Vec<u8>)> {
    let h = read_exact(s, 20)?;
    let opt = u32::from_be_bytes(h[8..12].try_into().unwrap());
    let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
    Ok((opt, kind, read_exact(s, len as usize)?))
}

impl RawClient {
    /// Connects and reads the greeting, sends client flags; stops before any option.
    pub fn greet(path: &Path) -> UnixStream {
        let mut s = UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let g = read_exact(&mut s, 18).unwrap();
        assert_eq!(&g[..8], &NBDMAGIC.to_be_bytes());
        s.write_all(&(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES).to_be_bytes())
            .unwrap();
        s
    }

    pub fn connect(path: &Path, export: &str) -> RawClient {
        Self::connect_with(path, export, false)
    }

    /// [`RawClient::connect`], first negotiating structured replies when `structured`.
    pub fn connect_with(path: &Path, export: &str, structured: bool) -> RawClient {
        let mut s = Self::greet(path);
        if structured {
            s.write_all(&option_bytes(OPT_STRUCTURED_REPLY, &[])).unwrap();
            assert_eq!(read_option_reply(&mut s).unwrap().1, REP_ACK, "structured replies refused");
        }
        let mut go = (export.len() as u32).to_be_bytes().to_vec();
        go.extend_from_slice(export.as_bytes());
        go.extend_from_slice(&0u16.to_be_bytes());
        s.write_all(&option_bytes(OPT_GO, &go)).unwrap();
        let (mut size, mut flags) = (0, 0);
        loop {
            let (_, kind, data) = read_option_reply(&mut s).unwrap();
            match kind {
                REP_INFO if u16::from_be_bytes([data[0], data[1]]) == INFO_EXPORT => {
                    size = u64::from_be_bytes(data[2..10].try_into().unwrap());
                    flags = u16::from_be_bytes([data[10], data[11]]);
                }
                REP_ACK => break,
                REP_INFO => {}
                other => panic!("GO failed with reply {other:#x}"),
            }
        }
        RawClient { s, size, flags }
    }

    pub fn send(&mut self, flags: u16, kind: u16, cookie: u64, offset: u64, length: u32, payload: &[u8]) -> std::io::Result<()> {
        self.s.write_all(&encode_request(flags, kind, cookie, offset, length, payload))
    }

    /// Reads a simple reply: (cookie, error, data for reads of `read_len`).
    pub fn reply(&mut self, read_len: usize) -> std::io::Result<(u64, u32, Vec<u8>)> {
        self.reply_sized(|_| read_len)
    }

    /// The next simple reply, whose data length (for a read) `read_len` gives by cookie.
    pub fn reply_sized(&mut self, read_len: impl Fn(u64) -> usize) -> std::io::Result<(u64, u32, Vec<u8>)> {
        let h = read_exact(&mut self.s, 16)?;
        assert_eq!(u32::from_be_bytes(h[..4].try_into().unwrap()), SIMPLE_REPLY_MAGIC);
        let err = u32::from_be_bytes(h[4..8].try_into().unwrap());
        let cookie = u64::from_be_bytes(h[8..16].try_into().unwrap());
        let read_len = read_len(cookie);
        let data = if err == 0 && read_len > 0 {
            read_exact(&mut self.s, read_len)?
        } else {
            Vec::new()
        };
        Ok((cookie, err, data))
    }

    /// One request, one reply.
    pub fn call(&mut self, flags: u16, kind: u16, offset: u64, length: u32, payload: &[u8]) -> (u32, Vec<u8>) {
        self.send(flags, kind, 7, offset, length, payload).unwrap();
        let read_len = if kind == CMD_READ { length as usize } else { 0 };
        let (cookie, err, data) = self.reply(read_len).unwrap();
        assert_eq!(cookie, 7);
        (err, data)
    }
}
