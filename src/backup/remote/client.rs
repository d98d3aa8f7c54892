//! The near end of a remote repository: a [`Store`] whose requests travel
//! over a pipe (`ssh … btrsend serve`) to [`server`](super::server).
//!
//! Every reply is checked before it is believed: a get returns exactly the
//! bytes asked for, a listing holds valid keys (checked as it is read),
//! and a reply of the wrong kind, a truncated frame or garbage becomes a
//! [`StoreError`] naming the host, never a panic. Text from the far end
//! reaches messages only without its control characters.

use std::io::{Read, Write};
use std::ops::Range;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::proto::{
    MAX_PAYLOAD, PROTOCOL_VERSION, ProtoError, Reply, Request, check_hello, kind, printable,
    read_frame, write_frame,
};
use crate::backup::error::BackupError;
use crate::backup::store::{HeldLock, HoldError, ObjectInfo, Store, StoreError, Upload};
use crate::backup::target::{Received, TargetEnd, check_listing};

/// Both directions of one connection.
struct Conn {
    input: Box<dyn Read + Send>,
    output: Box<dyn Write + Send>,
    /// Whether a reply failed its checks or the pipe broke: the two
    /// sides are then out of step, and every later request fails
    /// rather than read a stale reply as its own.
    broken: bool,
    /// The process at the other end of the pipes (ssh), reaped when the
    /// connection ends.
    child: Option<Child>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Closing our end tells the far end the connection is over.
        self.output = Box::new(std::io::sink());
        if let Some(child) = self.child.take() {
            reap(child);
        }
    }
}

/// How long a process at the far end gets to exit once its input is
/// closed, before it is killed.
const REAP_WAIT: Duration = Duration::from_secs(10);

/// Wait for `child` to exit (its input closed already), killing it after
/// [`REAP_WAIT`]; its exit status.
fn reap(mut child: Child) -> Option<std::process::ExitStatus> {
    let start = std::time::Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if start.elapsed() < REAP_WAIT => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(None) | Err(_) => {
                let _ = child.kill();
                return child.wait().ok();
            }
        }
    }
}

/// A repository served by `btrsend serve` at the other end of a pipe.
pub struct RemoteStore {
    name: String,
    conn: Arc<Mutex<Conn>>,
    append_only: bool,
    /// Whether the repository's directory exists on the far end.
    exists: AtomicBool,
}

impl std::fmt::Debug for RemoteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteStore")
            .field("name", &self.name)
            .finish()
    }
}

impl RemoteStore {
    /// Shake hands over `input`/`output` for the repository at `path` on
    /// the far end; `name` is the repository as the user named it.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unreachable`]: the pipe failed, the far end speaks
    /// another protocol version or refused the path.
    pub fn connect(
        name: &str,
        path: &str,
        input: Box<dyn Read + Send>,
        output: Box<dyn Write + Send>,
    ) -> Result<RemoteStore, StoreError> {
        Self::connect_as(name, path, false, input, output)
    }

    /// [`RemoteStore::connect`] for a repository, or (`target`) for a
    /// received-subvolume target directory.
    ///
    /// # Errors
    ///
    /// As [`RemoteStore::connect`].
    pub fn connect_as(
        name: &str,
        path: &str,
        target: bool,
        input: Box<dyn Read + Send>,
        output: Box<dyn Write + Send>,
    ) -> Result<RemoteStore, StoreError> {
        let mut conn = Conn {
            input,
            output,
            broken: false,
            child: None,
        };
        let (append_only, exists) = Self::handshake(name, path, target, &mut conn)?;
        Ok(RemoteStore {
            name: name.into(),
            conn: Arc::new(Mutex::new(conn)),
            append_only,
            exists: AtomicBool::new(exists),
        })
    }

    /// [`RemoteStore::connect`] over the standard input and output of
    /// `child` (ssh, started with both piped), which is reaped when the
    /// store is dropped. When the handshake fails, the error says how the
    /// process ended (what it printed went to our standard error).
    ///
    /// # Errors
    ///
    /// As [`RemoteStore::connect`].
    pub fn connect_process(
        name: &str,
        path: &str,
        target: bool,
        program: &str,
        mut child: Child,
    ) -> Result<RemoteStore, StoreError> {
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            reap(child);
            return Err(StoreError::Unreachable {
                location: name.into(),
                error: "the pipes to the far end were not made".into(),
            });
        };
        let conn = Conn {
            input: Box::new(std::io::BufReader::with_capacity(1 << 20, stdout)),
            output: Box::new(std::io::BufWriter::with_capacity(1 << 20, stdin)),
            broken: false,
            child: Some(child),
        };
        let mut conn = conn;
        match Self::handshake(name, path, target, &mut conn) {
            Ok((append_only, exists)) => Ok(RemoteStore {
                name: name.into(),
                conn: Arc::new(Mutex::new(conn)),
                append_only,
                exists: AtomicBool::new(exists),
            }),
            Err(StoreError::Unreachable { location, error }) => {
                conn.output = Box::new(std::io::sink());
                let how = match conn.child.take().and_then(reap) {
                    Some(status) if !status.success() => {
                        format!(" ({program} ended with {status}; what it said is above)")
                    }
                    _ => String::new(),
                };
                Err(StoreError::Unreachable {
                    location,
                    error: format!("{error}{how}").into(),
                })
            }
            Err(other) => Err(other),
        }
    }

    /// Shake hands over `conn`: whether the far end is append-only, and
    /// whether the repository's directory exists.
    fn handshake(
        name: &str,
        path: &str,
        target: bool,
        conn: &mut Conn,
    ) -> Result<(bool, bool), StoreError> {
        let hello = Request::Hello {
            protocol: PROTOCOL_VERSION,
            version: env!("CARGO_PKG_VERSION").into(),
            path: path.into(),
            target,
        };
        let unreachable = |error: String| StoreError::Unreachable {
            location: name.into(),
            error: error.into(),
        };
        let reply = conn
            .call(&hello, &[])
            .map_err(|error| unreachable(error.to_string()))?;
        match reply {
            Reply::Refused { why } => Err(unreachable(printable(&why))),
            reply => check_hello(&reply).map_err(|error| unreachable(error.to_string())),
        }
    }

    /// Whether the far end refuses deletions and overwrites.
    pub fn append_only(&self) -> bool {
        self.append_only
    }

    fn lock(&self) -> MutexGuard<'_, Conn> {
        // A poisoned lock means a thread panicked mid-request: the
        // connection's state is unknown, but the next reply check fails
        // cleanly if it is out of step.
        self.conn
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    fn location(&self, key: &str) -> String {
        format!("{}/{key}", self.name)
    }

    /// `reply` to an operation on `key` that had no data to give, as an
    /// error unless it is `Ok`.
    fn expect_ok(&self, op: &'static str, key: &str, reply: Reply) -> Result<(), StoreError> {
        match reply {
            Reply::Ok => Ok(()),
            other => Err(reply_error(op, &self.location(key), other)),
        }
    }

    fn call(
        &self,
        op: &'static str,
        key: &str,
        request: &Request,
        payload: &[u8],
    ) -> Result<Reply, StoreError> {
        self.lock()
            .call(request, payload)
            .map_err(|error| proto_error(op, &self.location(key), error))
    }
}

impl Conn {
    fn call(&mut self, request: &Request, payload: &[u8]) -> Result<Reply, ProtoError> {
        self.exchange(|c| {
            write_frame(&mut c.output, request, payload)?;
            c.output.flush()?;
            c.reply()
        })
    }

    /// `f`, one exchange with the far end, unless an earlier one left the
    /// connection out of step; a failed one leaves it so (what the far end
    /// still sends would be taken for the next answers).
    fn exchange<T>(
        &mut self,
        f: impl FnOnce(&mut Conn) -> Result<T, ProtoError>,
    ) -> Result<T, ProtoError> {
        if self.broken {
            return Err(ProtoError::OutOfStep);
        }
        let result = f(self);
        self.broken |= result.is_err();
        result
    }

    fn reply(&mut self) -> Result<Reply, ProtoError> {
        match read_frame::<Reply>(&mut self.input)? {
            Some(frame) => Ok(frame.message),
            None => Err(ProtoError::Closed),
        }
    }

    /// A `Data` reply of exactly `expect` bytes (when known) into `buf`.
    fn data(
        &mut self,
        request: &Request,
        expect: Option<u64>,
        buf: &mut Vec<u8>,
    ) -> Result<Result<(), Reply>, ProtoError> {
        self.exchange(|c| c.data_unchecked(request, expect, buf))
    }

    /// The listing of `prefix`, its parts checked as they come: another
    /// reply is handed back.
    fn list(&mut self, prefix: &str) -> Result<Result<Vec<ObjectInfo>, Reply>, ProtoError> {
        let request = Request::List {
            prefix: prefix.into(),
        };
        self.exchange(|c| {
            write_frame(&mut c.output, &request, &[])?;
            c.output.flush()?;
            let mut objects = Vec::new();
            let mut first = true;
            loop {
                let (part, done) = match c.reply()? {
                    Reply::Listing { objects, done } => (objects, done),
                    // Another answer to the request is the caller's to read.
                    other if first => return Ok(Err(other)),
                    _ => {
                        return Err(ProtoError::Malformed(
                            "a listing broken off by another reply".into(),
                        ));
                    }
                };
                for (key, size) in part {
                    if !key.starts_with(prefix) {
                        return Err(ProtoError::Malformed(
                            "a listed key outside the prefix".into(),
                        ));
                    }
                    objects.push(ObjectInfo { key, size });
                }
                if done {
                    return Ok(Ok(objects));
                }
                first = false;
            }
        })
    }

    fn data_unchecked(
        &mut self,
        request: &Request,
        expect: Option<u64>,
        buf: &mut Vec<u8>,
    ) -> Result<Result<(), Reply>, ProtoError> {
        write_frame(&mut self.output, request, &[])?;
        self.output.flush()?;
        let Some(frame) = read_frame::<Reply>(&mut self.input)? else {
            return Err(ProtoError::Closed);
        };
        let Reply::Data { len, more } = frame.message else {
            return Ok(Err(frame.message));
        };
        if expect.is_some_and(|expect| expect != len) {
            return Err(ProtoError::Malformed(format!(
                "{len} bytes returned, {} asked for",
                expect.unwrap_or_default()
            )));
        }
        let cap = u64::from(MAX_PAYLOAD);
        if u64::from(more) != len.saturating_sub(1) / cap {
            return Err(ProtoError::Malformed(format!(
                "{len} bytes announced in {more} more frames"
            )));
        }
        buf.clear();
        buf.extend_from_slice(&frame.payload);
        for _ in 0..more {
            let Some(frame) = read_frame::<Reply>(&mut self.input)? else {
                return Err(ProtoError::Closed);
            };
            buf.extend_from_slice(&frame.payload);
        }
        if u64::try_from(buf.len()).ok() != Some(len) {
            return Err(ProtoError::Malformed(format!(
                "{} bytes returned, {len} announced",
                buf.len()
            )));
        }
        Ok(Ok(()))
    }
}

fn proto_error(op: &'static str, location: &str, error: ProtoError) -> StoreError {
    StoreError::Other {
        op,
        location: location.into(),
        error: format!("remote repository: {error}").into(),
    }
}

/// A reply that is not what `op` expects, as an error.
fn reply_error(op: &'static str, location: &str, reply: Reply) -> StoreError {
    let error = match reply {
        Reply::NotFound => {
            return StoreError::NotFound {
                location: location.into(),
            };
        }
        Reply::Exists => {
            return StoreError::Exists {
                location: location.into(),
            };
        }
        Reply::Refused { why } => format!("refused by the server: {}", printable(&why)),
        Reply::Failed { why } => format!("failed on the server: {}", printable(&why)),
        other => format!("unexpected {} reply from the server", kind(&other)),
    };
    StoreError::Other {
        op,
        location: location.into(),
        error: error.into(),
    }
}

impl Store for RemoteStore {
    fn name(&self) -> &str {
        &self.name
    }

    fn get(&self, key: &str, range: Option<Range<u64>>) -> Result<Vec<u8>, StoreError> {
        let mut buf = Vec::new();
        let expect = range.as_ref().map(|r| r.end.saturating_sub(r.start));
        let request = Request::Get {
            key: key.into(),
            range: range.map(|r| (r.start, r.end)),
        };
        match self.lock().data(&request, expect, &mut buf) {
            Ok(Ok(())) => Ok(buf),
            Ok(Err(reply)) => Err(reply_error("read", &self.location(key), reply)),
            Err(error) => Err(proto_error("read", &self.location(key), error)),
        }
    }

    fn put_if_absent(&self, key: &str, data: &[u8]) -> Result<bool, StoreError> {
        if data.len() > usize::try_from(MAX_PAYLOAD).unwrap_or(usize::MAX) {
            let mut upload = self.multipart(key)?;
            upload.write(data)?;
            return match upload.complete() {
                Ok(()) => Ok(true),
                Err(StoreError::Exists { .. }) => Ok(false),
                Err(error) => Err(error),
            };
        }
        let request = Request::PutIfAbsent { key: key.into() };
        match self.call("write", key, &request, data)? {
            Reply::Stored { stored } => Ok(stored),
            other => Err(reply_error("write", &self.location(key), other)),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        let location = || self.location(prefix);
        let mut objects = self
            .lock()
            .list(prefix)
            .map_err(|error| proto_error("list", &location(), error))?
            .map_err(|reply| reply_error("list", &location(), reply))?;
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(objects)
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        let request = Request::Delete { key: key.into() };
        let reply = self.call("delete", key, &request, &[])?;
        self.expect_ok("delete", key, reply)
    }

    fn multipart(&self, key: &str) -> Result<Box<dyn Upload>, StoreError> {
        let request = Request::Multipart { key: key.into() };
        let reply = self.call("write", key, &request, &[])?;
        self.expect_ok("write", key, reply)?;
        Ok(Box::new(RemoteUpload {
            conn: Arc::clone(&self.conn),
            location: self.location(key),
            done: false,
        }))
    }

    fn continue_upload(
        &self,
        tmp: &str,
        keep: u64,
        key: &str,
    ) -> Result<Option<Box<dyn Upload>>, StoreError> {
        let request = Request::ContinueUpload {
            tmp: tmp.into(),
            key: key.into(),
            keep,
        };
        let reply = self.call("write", key, &request, &[])?;
        self.expect_ok("write", key, reply)?;
        Ok(Some(Box::new(RemoteUpload {
            conn: Arc::clone(&self.conn),
            location: self.location(key),
            done: false,
        })))
    }

    fn continues_uploads(&self) -> bool {
        true
    }

    fn reads_back_unfinished(&self) -> bool {
        true
    }

    fn verify_far(&self, wait: Duration) -> Option<Result<Vec<u8>, HoldError>> {
        let request = Request::VerifyRead {
            wait_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        };
        let mut report = Vec::new();
        Some(match self.lock().data(&request, None, &mut report) {
            Ok(Ok(())) => Ok(report),
            Ok(Err(Reply::LockHeld { holder })) => Err(HoldError::Held(printable(&holder))),
            Ok(Err(reply)) => Err(HoldError::Store(reply_error("verify", &self.name, reply))),
            Err(error) => Err(HoldError::Store(proto_error("verify", &self.name, error))),
        })
    }

    fn append_only(&self) -> bool {
        self.append_only
    }

    fn init_root(&self) -> Option<Result<(), StoreError>> {
        let made = self
            .call("create", "", &Request::InitRoot, &[])
            .and_then(|reply| self.expect_ok("create", "", reply));
        if made.is_ok() {
            self.exists.store(true, Ordering::Relaxed);
        }
        Some(made)
    }

    fn hold_lock(
        &self,
        exclusive: bool,
        wait: Duration,
    ) -> Option<Result<Box<dyn HeldLock>, HoldError>> {
        let request = Request::Lock {
            exclusive,
            wait_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        };
        let held = match self.call("lock", "lock", &request, &[]) {
            Ok(Reply::Ok) => Ok(Box::new(RemoteLock {
                conn: Arc::clone(&self.conn),
            }) as Box<dyn HeldLock>),
            Ok(Reply::LockHeld { holder }) => Err(HoldError::Held(printable(&holder))),
            Ok(other) => Err(HoldError::Store(reply_error(
                "lock",
                &self.location("lock"),
                other,
            ))),
            Err(error) => Err(HoldError::Store(error)),
        };
        Some(held)
    }

    fn check_reachable(&self) -> Result<(), StoreError> {
        // The handshake reached the host and said whether the directory
        // is there.
        if self.exists.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err(StoreError::Unreachable {
                location: self.name.clone(),
                error: "no such directory on the far end".into(),
            })
        }
    }
}

/// The repository lock the far end holds for this connection.
#[derive(Debug)]
struct RemoteLock {
    conn: Arc<Mutex<Conn>>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("broken", &self.broken)
            .finish()
    }
}

impl HeldLock for RemoteLock {}

impl Drop for RemoteLock {
    fn drop(&mut self) {
        // The far end lets go when the connection ends too; a failed
        // unlock is only an early end.
        let mut conn = self
            .conn
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let _ = conn.call(&Request::Unlock, &[]);
    }
}

/// An upload on the far end: writes go without waiting for an answer,
/// the server answers at the end.
struct RemoteUpload {
    conn: Arc<Mutex<Conn>>,
    location: String,
    done: bool,
}

impl Upload for RemoteUpload {
    fn write(&mut self, data: &[u8]) -> Result<(), StoreError> {
        let mut conn = self
            .conn
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let cap = usize::try_from(MAX_PAYLOAD).unwrap_or(usize::MAX);
        for chunk in data.chunks(cap) {
            write_frame(&mut conn.output, &Request::Write, chunk)
                .map_err(|error| proto_error("write", &self.location, error))?;
        }
        Ok(())
    }

    fn complete(mut self: Box<Self>) -> Result<(), StoreError> {
        self.done = true;
        let mut conn = self
            .conn
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        match conn.call(&Request::Complete, &[]) {
            Ok(Reply::Ok) => Ok(()),
            Ok(other) => Err(reply_error("write", &self.location, other)),
            Err(error) => Err(proto_error("write", &self.location, error)),
        }
    }
}

impl Drop for RemoteUpload {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // The server keeps the unfinished upload in `tmp/` for the next
        // writer; the answer only says it let go of it.
        let mut conn = self
            .conn
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let _ = conn.call(&Request::Abort, &[]);
    }
}

/// A received-subvolume target served by `btrsend serve` at the other
/// end of a pipe: the `Target*` requests over a [`RemoteStore`]'s
/// connection. What the far end answers is checked as a repository's
/// replies are: a listing must pass
/// [`check_listing`], a resume
/// token its own hash, and its words reach messages made printable.
#[derive(Debug)]
pub struct RemoteTarget {
    store: RemoteStore,
}

impl RemoteTarget {
    /// The target on the connection `store` shook hands on (as a target).
    pub fn new(store: RemoteStore) -> RemoteTarget {
        RemoteTarget { store }
    }

    fn far(&self, op: &'static str, error: ProtoError) -> BackupError {
        BackupError::Store(proto_error(op, &self.store.name, error))
    }

    fn wrong(&self, op: &'static str, reply: Reply) -> BackupError {
        BackupError::Store(reply_error(op, &self.store.name, reply))
    }

    /// A `Data` answer to `request`, or `None` for `NotFound`.
    fn data(&self, op: &'static str, request: &Request) -> Result<Option<Vec<u8>>, BackupError> {
        let mut buf = Vec::new();
        match self.store.lock().data(request, None, &mut buf) {
            Ok(Ok(())) => Ok(Some(buf)),
            Ok(Err(Reply::NotFound)) => Ok(None),
            Ok(Err(other)) => Err(self.wrong(op, other)),
            Err(error) => Err(self.far(op, error)),
        }
    }

    fn expect_ok(&self, op: &'static str, request: &Request) -> Result<(), BackupError> {
        match self.store.lock().call(request, &[]) {
            Ok(Reply::Ok) => Ok(()),
            Ok(other) => Err(self.wrong(op, other)),
            Err(error) => Err(self.far(op, error)),
        }
    }
}

impl TargetEnd for RemoteTarget {
    fn name(&self) -> &str {
        &self.store.name
    }

    fn append_only(&self) -> bool {
        self.store.append_only
    }

    fn lock(&mut self, wait: Duration) -> Result<(), BackupError> {
        let request = Request::Lock {
            exclusive: true,
            wait_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        };
        match self.store.lock().call(&request, &[]) {
            Ok(Reply::Ok) => Ok(()),
            Ok(Reply::LockHeld { holder }) => Err(BackupError::LockHeld {
                repo: self.store.name.clone(),
                holder: printable(&holder),
            }),
            Ok(other) => Err(self.wrong("lock", other)),
            Err(error) => Err(self.far("lock", error)),
        }
    }

    fn list(&mut self) -> Result<Vec<Received>, BackupError> {
        let json = self.data("list", &Request::TargetList)?.unwrap_or_default();
        let list: Vec<Received> = serde_json::from_slice(&json).map_err(|e| {
            self.far(
                "list",
                ProtoError::Malformed(format!("a listing that is not one: {e}")),
            )
        })?;
        check_listing(&list).map_err(|why| self.far("list", ProtoError::Malformed(why)))?;
        Ok(list)
    }

    fn resume_token(&mut self, name: &str) -> Result<Option<crate::resume::Token>, BackupError> {
        let Some(text) = self.data(
            "resume",
            &Request::TargetToken {
                name: name.to_owned(),
            },
        )?
        else {
            return Ok(None);
        };
        let token = std::str::from_utf8(&text)
            .ok()
            .and_then(|t| crate::resume::Token::parse(t).ok())
            .ok_or_else(|| {
                self.far(
                    "resume",
                    ProtoError::Malformed("an invalid resume token".into()),
                )
            })?;
        Ok(Some(token))
    }

    fn receive(
        &mut self,
        send: &mut dyn FnMut(&mut dyn Write) -> Result<(), BackupError>,
    ) -> Result<(), BackupError> {
        self.expect_ok("receive", &Request::TargetReceive)?;
        let mut conn = self.store.lock();
        let mut frames = Frames {
            conn: &mut conn,
            buf: Vec::with_capacity(FRAME_BYTES),
        };
        let sent = send(&mut frames).and_then(|()| {
            frames
                .flush()
                .map_err(|error| self.far("receive", ProtoError::Io(error)))
        });
        drop(frames);
        let end = if sent.is_ok() {
            Request::Complete
        } else {
            Request::Abort
        };
        let answer = conn.call(&end, &[]);
        drop(conn);
        sent?;
        match answer {
            Ok(Reply::Ok) => Ok(()),
            Ok(Reply::Failed { why }) => Err(BackupError::TargetReceive {
                target: self.store.name.clone(),
                error: printable(&why),
            }),
            Ok(other) => Err(self.wrong("receive", other)),
            Err(error) => Err(self.far("receive", error)),
        }
    }

    fn discard(&mut self, name: &str) -> Result<(), BackupError> {
        self.expect_ok(
            "discard",
            &Request::TargetDiscard {
                name: name.to_owned(),
            },
        )
    }

    fn delete(&mut self, name: &str) -> Result<(), BackupError> {
        self.expect_ok(
            "delete",
            &Request::TargetDelete {
                name: name.to_owned(),
            },
        )
    }
}

/// The bytes of a stream in a frame: enough that the frames cost
/// nothing, well under [`MAX_PAYLOAD`].
const FRAME_BYTES: usize = 1 << 20;

/// A stream sent as `Write` frames of [`FRAME_BYTES`], with no reply.
struct Frames<'c> {
    conn: &'c mut Conn,
    buf: Vec<u8>,
}

impl Frames<'_> {
    fn frame(&mut self, data: &[u8]) -> std::io::Result<()> {
        if self.conn.broken {
            return Err(std::io::Error::other(ProtoError::OutOfStep));
        }
        let r = write_frame(&mut self.conn.output, &Request::Write, data);
        self.conn.broken |= r.is_err();
        r.map_err(|e| match e {
            ProtoError::Io(e) => e,
            other => std::io::Error::other(other),
        })
    }
}

impl Write for Frames<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.is_empty() && data.len() >= FRAME_BYTES {
            let n = data.len().min(FRAME_BYTES);
            self.frame(&data[..n])?;
            return Ok(n);
        }
        let n = data.len().min(FRAME_BYTES - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == FRAME_BYTES {
            let buf = std::mem::take(&mut self.buf);
            self.frame(&buf)?;
            self.buf = buf;
            self.buf.clear();
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            let buf = std::mem::take(&mut self.buf);
            self.frame(&buf)?;
        }
        self.conn.output.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::remote::server::{ServeOptions, serve};

    /// A client connected to a server thread over two pipes, and the
    /// thread.
    fn connect(root: &std::path::Path, options: ServeOptions) -> RemoteStore {
        let (client_in, mut server_out) = std::io::pipe().unwrap();
        let (mut server_in, client_out) = std::io::pipe().unwrap();
        std::thread::spawn(move || {
            let _ = serve(&mut server_in, &mut server_out, &options);
        });
        RemoteStore::connect(
            "ssh://test/repo",
            &root.display().to_string(),
            Box::new(client_in),
            Box::new(client_out),
        )
        .unwrap()
    }

    #[test]
    fn a_store_over_a_pipe() {
        let dir = tempfile::tempdir().unwrap();
        let store = connect(dir.path(), ServeOptions::default());
        assert!(store.put_if_absent("config", b"abc").unwrap());
        assert!(!store.put_if_absent("config", b"xyz").unwrap());
        assert_eq!(store.get("config", Some(1..3)).unwrap(), b"bc");
        let mut upload = store.multipart("streams/s").unwrap();
        upload.write(b"hello ").unwrap();
        upload.write(b"world").unwrap();
        upload.complete().unwrap();
        assert_eq!(store.get("streams/s", None).unwrap(), b"hello world");
        let keys: Vec<_> = store
            .list("streams/")
            .unwrap()
            .into_iter()
            .map(|o| o.key)
            .collect();
        assert_eq!(keys, ["streams/s"]);
        store.delete("streams/s").unwrap();
        assert!(store.get("streams/s", None).unwrap_err().is_not_found());
        assert!(store.get("config", Some(1..9)).is_err());
    }

    #[test]
    fn append_only_refusals_reach_the_client() {
        let dir = tempfile::tempdir().unwrap();
        let store = connect(
            dir.path(),
            ServeOptions {
                append_only: true,
                restrict_to: Vec::new(),
            },
        );
        assert!(store.append_only());
        store.put_if_absent("config", b"abc").unwrap();
        let error = store.delete("config").unwrap_err().to_string();
        assert!(error.contains("append-only"), "{error}");
        assert_eq!(store.get("config", None).unwrap(), b"abc");
    }

    #[test]
    fn a_hostile_target_gives_clean_errors() {
        use crate::backup::target::TargetEnd;
        let far = |wire: Vec<u8>| {
            let mut hello = Vec::new();
            let reply = Reply::Hello {
                protocol: PROTOCOL_VERSION,
                version: "x".into(),
                append_only: false,
                exists: true,
            };
            write_frame(&mut hello, &reply, &[]).unwrap();
            hello.extend_from_slice(&wire);
            RemoteTarget::new(
                RemoteStore::connect_as(
                    "ssh://evil/t",
                    "/t",
                    true,
                    Box::new(std::io::Cursor::new(hello)),
                    Box::new(std::io::sink()),
                )
                .unwrap(),
            )
        };
        let data = |payload: &[u8]| {
            let mut wire = Vec::new();
            let reply = Reply::Data {
                len: payload.len() as u64,
                more: 0,
            };
            write_frame(&mut wire, &reply, payload).unwrap();
            wire
        };
        // A name that reaches outside, a bad UUID, not JSON at all.
        for listing in [
            &br#"[{"name":"../etc","received_uuid":null,"stransid":0,"complete":false,"subvolume":true,"partial":true,"made":null}]"#[..],
            br#"[{"name":"a","received_uuid":"nope","stransid":0,"complete":true,"subvolume":true,"partial":false,"made":null}]"#,
            b"\x1b[2J",
        ] {
            let e = far(data(listing)).list().unwrap_err().to_string();
            assert!(!e.contains('\u{1b}'), "{e}");
        }
        // A token that is not one.
        assert!(far(data(b"btrsend-resume-1-00")).resume_token("a").is_err());
        // A receive answered with another kind of reply, or nothing.
        let mut wire = Vec::new();
        write_frame(&mut wire, &Reply::Stored { stored: true }, &[]).unwrap();
        let mut t = far(wire);
        assert!(t.receive(&mut |_| Ok(())).is_err());
        let mut t = far(Vec::new());
        assert!(t.receive(&mut |_| Ok(())).is_err());
        // The far end's words reach the message without control codes.
        let mut wire = Vec::new();
        write_frame(&mut wire, &Reply::Ok, &[]).unwrap();
        let failed = Reply::Failed {
            why: "disk full\u{1b}[2J".into(),
        };
        write_frame(&mut wire, &failed, &[]).unwrap();
        let e = far(wire).receive(&mut |_| Ok(())).unwrap_err().to_string();
        assert!(e.contains("disk full") && !e.contains('\u{1b}'), "{e}");
    }

    #[test]
    fn a_hostile_server_gives_clean_errors() {
        let garbage = |wire: Vec<u8>| {
            let mut hello = Vec::new();
            write_frame(
                &mut hello,
                &Reply::Hello {
                    protocol: PROTOCOL_VERSION,
                    version: "x".into(),
                    append_only: false,
                    exists: true,
                },
                &[],
            )
            .unwrap();
            hello.extend_from_slice(&wire);
            RemoteStore::connect(
                "ssh://evil/repo",
                "/repo",
                Box::new(std::io::Cursor::new(hello)),
                Box::new(std::io::sink()),
            )
            .unwrap()
        };
        // A short range, and nothing believed after it.
        let mut wire = Vec::new();
        write_frame(&mut wire, &Reply::Data { len: 2, more: 0 }, b"ab").unwrap();
        write_frame(&mut wire, &Reply::Ok, &[]).unwrap();
        let store = garbage(wire);
        assert!(store.get("config", Some(0..3)).is_err());
        assert!(store.delete("config").is_err());
        // A length that the payload does not match.
        let mut wire = Vec::new();
        write_frame(&mut wire, &Reply::Data { len: 5, more: 0 }, b"ab").unwrap();
        assert!(garbage(wire).get("config", None).is_err());
        // A listing outside the prefix, an invalid key, garbage, nothing.
        let mut wire = Vec::new();
        let listing = Reply::Listing {
            objects: vec![("config".into(), 1)],
            done: true,
        };
        write_frame(&mut wire, &listing, &[]).unwrap();
        assert!(garbage(wire).list("catalog/").is_err());
        // A listing part outside the prefix, with more parts to come:
        // nothing after it is taken for an answer (the `Ok` here would
        // otherwise pass for the delete's).
        let mut wire = Vec::new();
        let part = Reply::Listing {
            objects: vec![("streams/x".into(), 1)],
            done: false,
        };
        write_frame(&mut wire, &part, &[]).unwrap();
        write_frame(&mut wire, &Reply::Ok, &[]).unwrap();
        let store = garbage(wire);
        assert!(store.list("catalog/").is_err());
        assert!(store.delete("config").is_err());
        assert!(
            garbage(b"\x05\0\0\0\0\0\0\0{oops".to_vec())
                .list("")
                .is_err()
        );
        let error = garbage(Vec::new())
            .delete("config")
            .unwrap_err()
            .to_string();
        assert!(error.contains("ssh://evil/repo"), "{error}");
        // A refusal's text loses its control characters.
        let mut wire = Vec::new();
        let refused = Reply::Refused {
            why: "no\x1b[2J".into(),
        };
        write_frame(&mut wire, &refused, &[]).unwrap();
        let error = garbage(wire).delete("config").unwrap_err().to_string();
        assert!(!error.contains('\x1b'), "{error}");
    }
}
