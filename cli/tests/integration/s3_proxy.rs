//! A TCP proxy between `btrsend` and the test's S3 server (`s3s-fs`) that
//! records every request it forwards (method, target, headers, and the
//! SHA-256 of the body), and can cut the network for a while: a blip, as a
//! router restart makes it. The real server answers every request; the
//! proxy only watches, and during a blip drops every connection and
//! refuses new ones.
//!
//! It speaks just enough HTTP/1.1 for `object_store`'s requests: bodies
//! are delimited by `Content-Length` (a chunked request is recorded as
//! such and then passed through unparsed).

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// A request as the proxy saw it.
#[derive(Debug, Clone)]
pub struct Request {
    /// `GET`, `PUT`…
    pub method: String,
    /// The path and query.
    pub target: String,
    /// Header names in lowercase, values as sent.
    pub headers: HashMap<String, String>,
    /// The SHA-256 of the body, in base64 (as `x-amz-checksum-sha256`
    /// gives it); `None` for a chunked body.
    pub body_sha256: Option<String>,
    /// The body's length.
    pub body_len: u64,
}

impl Request {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// When to cut the network, and for how long.
struct Blip {
    /// The first request whose method and target contain these starts it
    /// (it is dropped unforwarded).
    method: String,
    target: String,
    length: Duration,
}

#[derive(Default)]
struct Shared {
    requests: Mutex<Vec<Request>>,
    blip: Mutex<Option<Blip>>,
    /// When the blip started and when it ends.
    dark: Mutex<Option<(Instant, Instant)>>,
    /// The open connections (both ends), dropped by a blip.
    conns: Mutex<Vec<(TcpStream, TcpStream)>>,
    /// Requests that came after a blip ended.
    after_blip: Mutex<usize>,
    stop: AtomicBool,
}

/// A running proxy, stopped on drop.
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
    accept: Option<thread::JoinHandle<()>>,
}

impl Proxy {
    /// A proxy on a free port of 127.0.0.1 to `upstream` (a port there).
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared::default());
        let sh = Arc::clone(&shared);
        let accept = thread::spawn(move || accept_loop(listener, port, upstream, &sh));
        Proxy {
            port,
            shared,
            accept: Some(accept),
        }
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Cut the network for `length` when the first request whose method
    /// is `method` and whose target contains `target` comes.
    pub fn blip_at(&self, method: &str, target: &str, length: Duration) {
        *self.shared.blip.lock().unwrap() = Some(Blip {
            method: method.to_owned(),
            target: target.to_owned(),
            length,
        });
    }

    /// When the blip started and ended, if it happened.
    pub fn blipped(&self) -> Option<(Instant, Instant)> {
        *self.shared.dark.lock().unwrap()
    }

    /// How many requests came after the blip ended.
    pub fn requests_after_blip(&self) -> usize {
        *self.shared.after_blip.lock().unwrap()
    }

    /// The requests forwarded so far.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.requests.lock().unwrap().clone()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        cut_all(&self.shared);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn cut_all(sh: &Shared) {
    for (a, b) in sh.conns.lock().unwrap().drain(..) {
        let _ = a.shutdown(Shutdown::Both);
        let _ = b.shutdown(Shutdown::Both);
    }
}

fn accept_loop(listener: TcpListener, port: u16, upstream: u16, sh: &Arc<Shared>) {
    let mut listener = Some(listener);
    while !sh.stop.load(Ordering::SeqCst) {
        let dark_until = sh
            .dark
            .lock()
            .unwrap()
            .map(|(_, end)| end)
            .filter(|end| Instant::now() < *end);
        match (dark_until, &listener) {
            // A blip: nobody listens (connections are refused) until it ends.
            (Some(_), Some(_)) => listener = None,
            (Some(_), None) => {
                thread::sleep(Duration::from_millis(10));
                continue;
            }
            (None, None) => {
                // The same port again (std sets SO_REUSEADDR).
                match TcpListener::bind(("127.0.0.1", port)) {
                    Ok(l) => listener = Some(l),
                    Err(_) => {
                        thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                }
            }
            (None, Some(_)) => {}
        }
        let Some(l) = &listener else { continue };
        l.set_nonblocking(true).unwrap();
        match l.accept() {
            Ok((client, _)) => {
                client.set_nonblocking(false).unwrap();
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                sh.conns
                    .lock()
                    .unwrap()
                    .push((client.try_clone().unwrap(), server.try_clone().unwrap()));
                let sh2 = Arc::clone(sh);
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                thread::spawn(move || {
                    let _ = io::copy(&mut &s2, &mut &c2);
                    let _ = c2.shutdown(Shutdown::Both);
                });
                thread::spawn(move || {
                    let _ = requests(&client, &server, &sh2);
                    let _ = client.shutdown(Shutdown::Both);
                    let _ = server.shutdown(Shutdown::Both);
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_millis(5));
            }
            Err(_) => {}
        }
    }
}

/// Forward the requests of one connection, recording each.
fn requests(client: &TcpStream, server: &TcpStream, sh: &Shared) -> io::Result<()> {
    let mut from = BufReader::new(client);
    let mut to = server;
    loop {
        let mut head = Vec::new();
        loop {
            let n = from.read_until(b'\n', &mut head)?;
            if n == 0 {
                return Ok(());
            }
            if head.ends_with(b"\r\n\r\n") || head == b"\r\n" {
                break;
            }
            if head.len() > 64 << 10 {
                return Err(io::Error::other("request head over 64 KiB"));
            }
        }
        let text = String::from_utf8_lossy(&head).into_owned();
        let mut lines = text.split("\r\n");
        let mut first = lines.next().unwrap_or("").split(' ');
        let method = first.next().unwrap_or("").to_owned();
        let target = first.next().unwrap_or("").to_owned();
        let headers: HashMap<String, String> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        {
            let mut blip = sh.blip.lock().unwrap();
            if blip
                .as_ref()
                .is_some_and(|b| b.method == method && target.contains(&b.target))
            {
                let b = blip.take().unwrap();
                let now = Instant::now();
                *sh.dark.lock().unwrap() = Some((now, now + b.length));
                drop(blip);
                cut_all(sh);
                return Ok(());
            }
        }
        if let Some((_, end)) = *sh.dark.lock().unwrap()
            && Instant::now() >= end
        {
            *sh.after_blip.lock().unwrap() += 1;
        }
        to.write_all(&head)?;
        let chunked = headers
            .get("transfer-encoding")
            .is_some_and(|v| v.contains("chunked"));
        let mut req = Request {
            method,
            target,
            headers,
            body_sha256: None,
            body_len: 0,
        };
        if chunked {
            sh.requests.lock().unwrap().push(req);
            io::copy(&mut from, &mut to)?;
            return Ok(());
        }
        let len: u64 = req
            .header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut hash = Sha256::new();
        let mut left = len;
        let mut buf = vec![0u8; 64 << 10];
        while left > 0 {
            let want = buf.len().min(usize::try_from(left).unwrap());
            let n = from.read(&mut buf[..want])?;
            if n == 0 {
                return Ok(());
            }
            hash.update(&buf[..n]);
            to.write_all(&buf[..n])?;
            left -= n as u64;
        }
        req.body_len = len;
        req.body_sha256 = Some(base64(&hash.finalize()));
        sh.requests.lock().unwrap().push(req);
    }
}

/// Standard base64 with padding.
pub fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ABC[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn base64_matches_rfc_4648() {
    for (raw, enc) in [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg=="),
        ("fooba", "Zm9vYmE="),
        ("foobar", "Zm9vYmFy"),
    ] {
        assert_eq!(base64(raw.as_bytes()), enc);
    }
}
