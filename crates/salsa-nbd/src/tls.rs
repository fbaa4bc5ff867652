//! TLS for NBD connections (`NBD_OPT_STARTTLS`), with the credentials nbdkit and qemu-nbd take:
//! X.509 certificates from a directory, or pre-shared keys from a file.
//!
//! Owns: the OpenSSL acceptor built from the credentials ([`TlsServer`]) and the pump thread
//! of every TLS connection. The connection code reads requests on one thread while others
//! write replies to the same socket; a TLS session cannot be split that way. So after the TLS
//! handshake one thread per connection moves bytes between the TLS socket and one end of a
//! Unix socket pair, and the connection code is handed the other end and runs unchanged.
//! Limits: the pump holds at most [`PUMP_BUFFER_BYTES`] in each direction.

use openssl::ssl::{ErrorCode, HandshakeError, SslAcceptor, SslFiletype, SslMethod, SslStream, SslVerifyMode};
use std::io::{self, Read, Write};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Bytes the pump holds in each direction before it waits for the other side.
pub const PUMP_BUFFER_BYTES: usize = 256 << 10;
/// How long a client may take over its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest identity and key in a PSK file.
const MAX_PSK_IDENTITY_BYTES: usize = 255;
const MAX_PSK_KEY_BYTES: usize = 64;

/// Where the server's TLS credentials come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// A directory with `server-cert.pem` and `server-key.pem` (and `ca-cert.pem`, to verify
    /// client certificates when asked), as nbdkit's `--tls-certificates`.
    Certificates { dir: PathBuf, verify_peer: bool },
    /// A file of `identity:hexkey` lines, as GnuTLS's `psktool` writes and nbdkit's
    /// `--tls-psk` reads.
    Psk(PathBuf),
}

/// The server side of TLS: an acceptor built once, shared by every connection.
#[derive(Clone)]
pub struct TlsServer {
    acceptor: Arc<SslAcceptor>,
}

impl std::fmt::Debug for TlsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsServer")
    }
}

fn cred_error(what: &Path, e: impl std::fmt::Display) -> String {
    format!("{}: {e}", what.display())
}

/// Reads a PSK file: `identity:hexkey` per line; blank lines and `#` comments are skipped.
pub fn read_psk_file(path: &Path) -> Result<Vec<(String, Vec<u8>)>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| cred_error(path, e))?;
    let mut keys = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |why: &str| format!("{} line {}: {why} (want identity:hexkey)", path.display(), n + 1);
        let (identity, hex) = line.split_once(':').ok_or_else(|| bad("no ':'"))?;
        if identity.is_empty() || identity.len() > MAX_PSK_IDENTITY_BYTES {
            return Err(bad("identity empty or longer than 255 bytes"));
        }
        if hex.is_empty() || hex.len() % 2 != 0 || hex.len() / 2 > MAX_PSK_KEY_BYTES {
            return Err(bad("key must be 1 to 64 bytes of hexadecimal"));
        }
        let key = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
            .collect::<Result<Vec<u8>, _>>()
            .map_err(|_| bad("key is not hexadecimal"))?;
        keys.push((identity.to_string(), key));
    }
    if keys.is_empty() {
        return Err(format!("{}: no keys", path.display()));
    }
    Ok(keys)
}

impl TlsServer {
    /// Builds the acceptor; any problem with the credentials is reported here, at start-up.
    pub fn new(creds: &Credentials) -> Result<TlsServer, String> {
        let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server()).map_err(|e| format!("TLS: {e}"))?;
        match creds {
            Credentials::Certificates { dir, verify_peer } => {
                let cert = dir.join("server-cert.pem");
                let key = dir.join("server-key.pem");
                b.set_certificate_chain_file(&cert).map_err(|e| cred_error(&cert, e))?;
                b.set_private_key_file(&key, SslFiletype::PEM).map_err(|e| cred_error(&key, e))?;
                b.check_private_key()
                    .map_err(|e| cred_error(&key, format!("does not match the certificate: {e}")))?;
                if *verify_peer {
                    let ca = dir.join("ca-cert.pem");
                    b.set_ca_file(&ca).map_err(|e| cred_error(&ca, e))?;
                    b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
                }
            }
            Credentials::Psk(path) => {
                let keys = read_psk_file(path)?;
                // TLS 1.2 PSK suites (with forward secrecy first); TLS 1.3 takes the key
                // through the same callback.
                b.set_cipher_list("ECDHE-PSK:DHE-PSK:PSK").map_err(|e| cred_error(path, e))?;
                b.set_psk_server_callback(move |_ssl, identity, out| {
                    let Some(identity) = identity.and_then(|i| std::str::from_utf8(i).ok()) else {
                        return Ok(0);
                    };
                    match keys.iter().find(|(id, _)| id == identity) {
                        Some((_, key)) if key.len() <= out.len() => {
                            out[..key.len()].copy_from_slice(key);
                            Ok(key.len())
                        }
                        // Unknown identity: no key, the handshake fails.
                        _ => Ok(0),
                    }
                });
            }
        }
        Ok(TlsServer {
            acceptor: Arc::new(b.build()),
        })
    }

    /// Runs the TLS handshake on `sock` (whose client was just told yes to STARTTLS), then
    /// starts the pump thread and returns the plaintext end for the connection code.
    pub fn upgrade<S>(&self, sock: S) -> io::Result<UnixStream>
    where
        S: Read + Write + AsRawFd + Send + 'static,
    {
        set_timeouts(sock.as_raw_fd(), Some(HANDSHAKE_TIMEOUT))?;
        let tls = self.acceptor.accept(sock).map_err(|e| {
            let why = match e {
                HandshakeError::SetupFailure(e) => e.to_string(),
                HandshakeError::Failure(m) | HandshakeError::WouldBlock(m) => m.error().to_string(),
            };
            io::Error::new(io::ErrorKind::PermissionDenied, format!("TLS handshake failed: {why}"))
        })?;
        let (ours, theirs) = UnixStream::pair()?;
        std::thread::Builder::new().name("salsa-nbd-tls".into()).spawn(move || {
            if let Err(e) = pump(tls, theirs) {
                tracing::debug!("TLS connection ended: {e}");
            }
        })?;
        Ok(ours)
    }
}

/// Sets the receive and send timeouts of a socket (`None`: none).
fn set_timeouts(fd: i32, t: Option<Duration>) -> io::Result<()> {
    let tv = t.map_or(libc::timeval { tv_sec: 0, tv_usec: 0 }, |t| libc::timeval {
        tv_sec: t.as_secs() as libc::time_t,
        tv_usec: t.subsec_micros() as libc::suseconds_t,
    });
    for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: setsockopt reads `size_of::<timeval>()` bytes from a live local; `fd` is a
        // socket its owner keeps open for the call.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn set_nonblocking(fd: i32) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor its owner keeps open; only the status flags change.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn would_block(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted)
}

/// Moves bytes between the TLS socket and the connection code's socket until either side
/// ends. One thread, non-blocking sockets, `poll` when nothing moved; a write to the TLS
/// session is retried with the same bytes until it goes through (OpenSSL requires it).
fn pump<S: Read + Write + AsRawFd>(mut tls: SslStream<S>, mut plain: UnixStream) -> io::Result<()> {
    let (tls_fd, plain_fd) = (tls.get_ref().as_raw_fd(), plain.as_raw_fd());
    set_timeouts(tls_fd, None)?;
    set_nonblocking(tls_fd)?;
    plain.set_nonblocking(true)?;
    let mut from_client: Vec<u8> = Vec::with_capacity(PUMP_BUFFER_BYTES);
    let mut to_client: Vec<u8> = Vec::with_capacity(PUMP_BUFFER_BYTES);
    let mut buf = vec![0u8; 64 << 10];
    let mut client_done = false;
    let mut server_done = false;
    loop {
        let mut moved = false;
        // Client -> connection code.
        if !client_done && from_client.len() < PUMP_BUFFER_BYTES {
            let room = (PUMP_BUFFER_BYTES - from_client.len()).min(buf.len());
            match tls.ssl_read(&mut buf[..room]) {
                Ok(0) => client_done = true,
                Ok(n) => {
                    from_client.extend_from_slice(&buf[..n]);
                    moved = true;
                }
                Err(e) if matches!(e.code(), ErrorCode::WANT_READ | ErrorCode::WANT_WRITE) => {}
                Err(e) if e.code() == ErrorCode::ZERO_RETURN => client_done = true,
                Err(e) => return Err(io::Error::other(format!("TLS read: {e}"))),
            }
        }
        if !from_client.is_empty() {
            match plain.write(&from_client) {
                Ok(n) => {
                    from_client.drain(..n);
                    moved |= n > 0;
                }
                Err(e) if would_block(&e) => {}
                Err(e) => return Err(e),
            }
        } else if client_done {
            // The client is gone: tell the connection code, and stop.
            let _ = plain.shutdown(std::net::Shutdown::Both);
            return Ok(());
        }
        // Connection code -> client (new bytes only once the last ones went out).
        if to_client.is_empty() && !server_done {
            match plain.read(&mut buf) {
                Ok(0) => server_done = true,
                Ok(n) => {
                    to_client.extend_from_slice(&buf[..n]);
                    moved = true;
                }
                Err(e) if would_block(&e) => {}
                Err(e) => return Err(e),
            }
        }
        if !to_client.is_empty() {
            match tls.ssl_write(&to_client) {
                Ok(n) => {
                    to_client.drain(..n);
                    moved |= n > 0;
                }
                Err(e) if matches!(e.code(), ErrorCode::WANT_READ | ErrorCode::WANT_WRITE) => {}
                Err(e) => return Err(io::Error::other(format!("TLS write: {e}"))),
            }
        } else if server_done {
            let _ = tls.shutdown();
            return Ok(());
        }
        if !moved {
            let mut fds = [
                libc::pollfd {
                    fd: tls_fd,
                    events: libc::POLLIN | if to_client.is_empty() { 0 } else { libc::POLLOUT },
                    revents: 0,
                },
                libc::pollfd {
                    fd: plain_fd,
                    events: (if to_client.is_empty() && !server_done { libc::POLLIN } else { 0 })
                        | if from_client.is_empty() { 0 } else { libc::POLLOUT },
                    revents: 0,
                },
            ];
            // A bounded wait: OpenSSL may hold decrypted bytes that no poll reports.
            // SAFETY: `fds` is a live array of two pollfd for the call.
            unsafe { libc::poll(fds.as_mut_ptr(), 2, 50) };
        }
    }
}
