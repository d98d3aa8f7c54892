//! The wire format of `btrsend serve`: length-prefixed frames, each a
//! JSON message header and an optional binary payload.
//!
//! A frame is `u32` (little-endian) header length, `u32` payload length,
//! the header (a JSON [`Request`] or [`Reply`]), then the payload bytes
//! (object data, never JSON-escaped). Both lengths are capped
//! ([`MAX_HEADER`], [`MAX_PAYLOAD`]) before anything is allocated: the far
//! end is hostile until proven otherwise, so a length it sends only ever
//! selects an error, never an allocation.
//!
//! The client opens with [`Request::Hello`], naming its protocol version,
//! its program version and the repository path (the path travels here and
//! not on the ssh command line, so a forced command in `authorized_keys`
//! still serves any path it allows). The server answers [`Reply::Hello`]
//! with its own versions, or [`Reply::Refused`]. Then each request gets one
//! reply, except the `Write` frames of an upload: the client sends them
//! without waiting, and the server answers only at `Complete` (or with the
//! first error it meets, after which it drops the upload's later writes).
//!
//! Keys in requests and replies are checked with [`check_key`] on the side
//! that receives them, so a key that the directory store would refuse never
//! reaches a filesystem, and a listing of garbage keys fails cleanly.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

use crate::backup::store::check_key;

/// The protocol version this build speaks. Both sides must speak the
/// same one: a frame format change bumps it.
pub const PROTOCOL_VERSION: u32 = 2;

/// The largest header a side accepts (a listing of many keys travels as
/// several replies, each under this).
pub const MAX_HEADER: u32 = 1 << 20;

/// The largest payload a side accepts in one frame: larger objects
/// travel as several frames.
pub const MAX_PAYLOAD: u32 = 8 << 20;

/// What a client asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// The handshake (the first frame of a connection).
    Hello {
        /// The client's [`PROTOCOL_VERSION`].
        protocol: u32,
        /// The client's program version (for messages).
        version: String,
        /// The repository's path on the server (or the target's
        /// directory).
        path: String,
        /// Whether `path` is a received-subvolume target (a directory
        /// the `Target*` requests receive into) rather than a repository.
        #[serde(default)]
        target: bool,
    },
    /// An object, or a range of it.
    Get {
        /// Its key.
        key: String,
        /// The range's start and end, or the whole object.
        range: Option<(u64, u64)>,
    },
    /// Create an object unless it exists; its data is the payload.
    PutIfAbsent {
        /// Its key.
        key: String,
    },
    /// The objects whose keys start with `prefix`.
    List {
        /// The prefix (not a key: it may end in the middle of a name).
        prefix: String,
    },
    /// Remove an object.
    Delete {
        /// Its key.
        key: String,
    },
    /// Start an upload of `key`.
    Multipart {
        /// Its key.
        key: String,
    },
    /// Continue the unfinished upload `tmp` as an upload of `key`,
    /// keeping its first `keep` bytes.
    ContinueUpload {
        /// The unfinished upload's key (in `tmp/`).
        tmp: String,
        /// The key it becomes.
        key: String,
        /// How many of its bytes stay.
        keep: u64,
    },
    /// Bytes of the open upload (the payload); no reply.
    Write,
    /// Finish the open upload.
    Complete,
    /// Drop the open upload.
    Abort,
    /// Make the repository's directory for `init`: created when missing
    /// (its parent must exist), refused when it holds other files.
    InitRoot,
    /// Take the repository's lock for as long as the connection lasts
    /// (or until [`Request::Unlock`]), waiting up to `wait_ms` for a
    /// holder to let go.
    Lock {
        /// Exclusive (writers) or shared (readers).
        exclusive: bool,
        /// How long to wait, in milliseconds.
        wait_ms: u64,
    },
    /// Let go of the lock this connection holds.
    Unlock,
    /// Run `verify --read-data` of the (unencrypted) repository on the
    /// server, waiting up to `wait_ms` for its lock; the answer is the
    /// report's JSON as [`Reply::Data`].
    VerifyRead {
        /// How long to wait for the lock, in milliseconds.
        wait_ms: u64,
    },
    /// The subvolumes of the target directory (complete and partial), as
    /// [`Reply::Data`]: a JSON array of
    /// [`Received`](crate::backup::target::Received).
    TargetList,
    /// The resume token of the partial subvolume `name`, as
    /// [`Reply::Data`], or [`Reply::NotFound`] when it has no resume
    /// point.
    TargetToken {
        /// The subvolume's name in the target directory.
        name: String,
    },
    /// Receive a send stream into the target directory: the stream comes
    /// in `Write` frames with no reply, and `Complete` ends it (the
    /// answer says whether it was received), `Abort` drops it.
    TargetReceive,
    /// Remove what an interrupted receive left of `name` (refused unless
    /// it is incomplete and the receive's own resume directory names it).
    TargetDiscard {
        /// The subvolume's name in the target directory.
        name: String,
    },
    /// Delete the received subvolume `name` (refused by an append-only
    /// server).
    TargetDelete {
        /// The subvolume's name in the target directory.
        name: String,
    },
}

/// What a server answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    /// The handshake's answer.
    Hello {
        /// The server's [`PROTOCOL_VERSION`].
        protocol: u32,
        /// The server's program version.
        version: String,
        /// Whether the server refuses deletions and overwrites.
        append_only: bool,
        /// Whether the repository's directory exists (`init` makes it).
        #[serde(default)]
        exists: bool,
    },
    /// Done, nothing to return.
    Ok,
    /// The data is the payload, `len` bytes in all, in this frame and
    /// the `more` frames that follow.
    Data {
        /// The total length.
        len: u64,
        /// How many payload-only frames follow.
        more: u32,
    },
    /// Whether a put stored the object (false: it existed).
    Stored {
        /// Whether it was stored.
        stored: bool,
    },
    /// Part of a listing; `done` on the last part.
    Listing {
        /// Keys and sizes.
        objects: Vec<(String, u64)>,
        /// Whether this is the last part.
        done: bool,
    },
    /// The object does not exist.
    NotFound,
    /// The object exists already.
    Exists,
    /// The request is refused (append-only, outside the allowed paths, a
    /// bad key); the text says why.
    Refused {
        /// Why, for the user.
        why: String,
    },
    /// The request failed on the server; the text says how.
    Failed {
        /// How, for the user.
        why: String,
    },
    /// The lock is held by another process after the wait.
    LockHeld {
        /// Who holds it, as the lock file says.
        holder: String,
    },
}

/// What is wrong with what the other side sent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProtoError {
    /// The pipe failed or ended.
    #[error("connection: {0}")]
    Io(#[from] io::Error),
    /// The connection ended between frames.
    #[error("connection closed")]
    Closed,
    /// An earlier exchange failed, so replies can no longer be matched
    /// to requests.
    #[error("the connection is out of step after an earlier failure")]
    OutOfStep,
    /// A length over its cap.
    #[error("{what} of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// `header` or `payload`.
        what: &'static str,
        /// The length sent.
        len: u32,
        /// The cap.
        max: u32,
    },
    /// A header that is not one of the messages.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// The two sides speak different protocol versions.
    #[error("protocol version {theirs} on the other side, {ours} here")]
    Version {
        /// The other side's.
        theirs: u32,
        /// Ours.
        ours: u32,
    },
}

/// One frame as read: its header and payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<M> {
    /// The message.
    pub message: M,
    /// The bytes after it (empty for most messages).
    pub payload: Vec<u8>,
}

/// Write one frame: `message` and `payload`.
///
/// # Errors
///
/// [`ProtoError::TooLarge`] for a payload over [`MAX_PAYLOAD`] (split it
/// first) or a header over [`MAX_HEADER`]; I/O errors.
pub fn write_frame<M: Serialize>(
    out: &mut impl Write,
    message: &M,
    payload: &[u8],
) -> Result<(), ProtoError> {
    let header =
        serde_json::to_vec(message).map_err(|error| ProtoError::Malformed(error.to_string()))?;
    let header_len = capped("header", header.len(), MAX_HEADER)?;
    let payload_len = capped("payload", payload.len(), MAX_PAYLOAD)?;
    out.write_all(&header_len.to_le_bytes())?;
    out.write_all(&payload_len.to_le_bytes())?;
    out.write_all(&header)?;
    out.write_all(payload)?;
    Ok(())
}

/// A length as a `u32` within `max`.
fn capped(what: &'static str, len: usize, max: u32) -> Result<u32, ProtoError> {
    match u32::try_from(len) {
        Ok(len) if len <= max => Ok(len),
        _ => Err(ProtoError::TooLarge {
            what,
            len: u32::try_from(len).unwrap_or(u32::MAX),
            max,
        }),
    }
}

/// Read one frame, or `None` at a clean end of the stream (between
/// frames). The lengths are checked before anything is allocated; the
/// header must parse as an `M` and its keys pass [`check_key`].
///
/// # Errors
///
/// [`ProtoError::TooLarge`], [`ProtoError::Malformed`], a stream that ends
/// inside a frame ([`ProtoError::Io`] with `UnexpectedEof`), I/O errors.
pub fn read_frame<M: for<'de> Deserialize<'de> + Checked>(
    input: &mut impl Read,
) -> Result<Option<Frame<M>>, ProtoError> {
    let mut lengths = [0u8; 8];
    let first = read_some(input, &mut lengths)?;
    if first == 0 {
        return Ok(None);
    }
    input.read_exact(&mut lengths[first..])?;
    let (header_len, payload_len) = lengths.split_at(4);
    // OK to unwrap: split_at(4) of eight bytes gives two halves of four.
    let header_len = u32::from_le_bytes(header_len.try_into().unwrap());
    let payload_len = u32::from_le_bytes(payload_len.try_into().unwrap());
    for (what, len, max) in [
        ("header", header_len, MAX_HEADER),
        ("payload", payload_len, MAX_PAYLOAD),
    ] {
        if len > max {
            return Err(ProtoError::TooLarge { what, len, max });
        }
    }
    let mut header = vec![0; usize::try_from(header_len).unwrap_or(usize::MAX)];
    input.read_exact(&mut header)?;
    let mut payload = vec![0; usize::try_from(payload_len).unwrap_or(usize::MAX)];
    input.read_exact(&mut payload)?;
    let message: M = serde_json::from_slice(&header)
        .map_err(|error| ProtoError::Malformed(error.to_string()))?;
    message.check().map_err(ProtoError::Malformed)?;
    Ok(Some(Frame { message, payload }))
}

/// Read into `buf` until it is full or the stream ends at its start;
/// returns how many bytes were read (0: a clean end).
fn read_some(input: &mut impl Read, buf: &mut [u8]) -> Result<usize, ProtoError> {
    loop {
        match input.read(buf) {
            Ok(n) => return Ok(n),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error.into()),
        }
    }
}

/// A message whose contents can be checked beyond their shape.
pub trait Checked {
    /// Whether every key in it is a valid key.
    ///
    /// # Errors
    ///
    /// What is wrong, as text.
    fn check(&self) -> Result<(), String>;
}

impl Checked for Request {
    fn check(&self) -> Result<(), String> {
        match self {
            Request::Get { key, range } => {
                check_key(key)?;
                match range {
                    Some((start, end)) if start > end => {
                        Err(format!("range {start}..{end} of {key} is reversed"))
                    }
                    _ => Ok(()),
                }
            }
            Request::PutIfAbsent { key } | Request::Delete { key } | Request::Multipart { key } => {
                check_key(key)
            }
            Request::ContinueUpload { tmp, key, .. } => {
                check_key(tmp)?;
                if !tmp.starts_with("tmp/") {
                    return Err(format!("{tmp} is not an unfinished upload"));
                }
                check_key(key)
            }
            Request::List { prefix } => check_prefix(prefix),
            Request::Hello { path, .. } if path.is_empty() || path.contains('\0') => {
                Err("an empty repository path or one with a NUL".into())
            }
            Request::TargetToken { name }
            | Request::TargetDiscard { name }
            | Request::TargetDelete { name } => crate::backup::target::check_name(name),
            Request::Hello { .. }
            | Request::TargetList
            | Request::TargetReceive
            | Request::Write
            | Request::Complete
            | Request::Abort
            | Request::InitRoot
            | Request::Lock { .. }
            | Request::Unlock
            | Request::VerifyRead { .. } => Ok(()),
        }
    }
}

impl Checked for Reply {
    fn check(&self) -> Result<(), String> {
        match self {
            Reply::Listing { objects, .. } => {
                objects.iter().try_for_each(|(key, _)| check_key(key))
            }
            _ => Ok(()),
        }
    }
}

/// A listing prefix: empty, or a key's first characters (what a valid key
/// could start with).
fn check_prefix(prefix: &str) -> Result<(), String> {
    if prefix.is_empty() {
        return Ok(());
    }
    // A prefix ending in `/` or inside a name is a key's beginning: check
    // it with a placeholder completing the name.
    let probe = format!("{prefix}x");
    check_key(&probe).map_err(|_| format!("invalid listing prefix {prefix:?}"))
}

/// Check the server's handshake answer against ours: whether the far
/// end is append-only, and whether the repository's directory exists.
///
/// # Errors
///
/// [`ProtoError::Version`] for another protocol version.
pub fn check_hello(reply: &Reply) -> Result<(bool, bool), ProtoError> {
    match reply {
        Reply::Hello {
            protocol,
            append_only,
            exists,
            ..
        } if *protocol == PROTOCOL_VERSION => Ok((*append_only, *exists)),
        Reply::Hello { protocol, .. } => Err(ProtoError::Version {
            theirs: *protocol,
            ours: PROTOCOL_VERSION,
        }),
        other => Err(ProtoError::Malformed(format!(
            "expected the handshake, got {}",
            kind(other)
        ))),
    }
}

/// A reply's kind, for messages (never its text: that came from the far
/// end).
pub fn kind(reply: &Reply) -> &'static str {
    match reply {
        Reply::Hello { .. } => "hello",
        Reply::Ok => "ok",
        Reply::Data { .. } => "data",
        Reply::Stored { .. } => "stored",
        Reply::Listing { .. } => "listing",
        Reply::NotFound => "not found",
        Reply::Exists => "exists",
        Reply::Refused { .. } => "refused",
        Reply::Failed { .. } => "failed",
        Reply::LockHeld { .. } => "lock held",
    }
}

/// `text` from the far end with control characters replaced, for a
/// terminal.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<M>(message: &M, payload: &[u8]) -> Frame<M>
    where
        M: Serialize + for<'de> Deserialize<'de> + Checked,
    {
        let mut wire = Vec::new();
        write_frame(&mut wire, message, payload).unwrap();
        read_frame(&mut wire.as_slice()).unwrap().unwrap()
    }

    #[test]
    fn frames_round_trip() {
        let request = Request::Get {
            key: "streams/a.btrs".into(),
            range: Some((3, 9)),
        };
        let frame = round_trip(&request, b"");
        assert_eq!(frame.message, request);
        let frame = round_trip(&Request::Write, &[0, 1, 2, 255]);
        assert_eq!(frame.payload, [0, 1, 2, 255]);
        let reply = Reply::Listing {
            objects: vec![("catalog/00000001.json".into(), 12)],
            done: true,
        };
        assert_eq!(round_trip(&reply, b"").message, reply);
    }

    #[test]
    fn clean_end_between_frames_only() {
        assert!(read_frame::<Request>(&mut &b""[..]).unwrap().is_none());
        let mut wire = Vec::new();
        write_frame(&mut wire, &Request::Write, b"abcdef").unwrap();
        wire.truncate(wire.len() - 2);
        match read_frame::<Request>(&mut wire.as_slice()) {
            Err(ProtoError::Io(error)) => assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof),
            other => panic!("{other:?}"),
        }
        match read_frame::<Request>(&mut &[1u8, 0, 0][..]) {
            Err(ProtoError::Io(error)) => assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn lengths_over_the_cap_are_refused_before_allocating() {
        let mut wire = Vec::new();
        wire.extend_from_slice(&u32::MAX.to_le_bytes());
        wire.extend_from_slice(&0u32.to_le_bytes());
        assert!(matches!(
            read_frame::<Request>(&mut wire.as_slice()),
            Err(ProtoError::TooLarge { what: "header", .. })
        ));
        let mut wire = Vec::new();
        wire.extend_from_slice(&2u32.to_le_bytes());
        wire.extend_from_slice(&(MAX_PAYLOAD + 1).to_le_bytes());
        assert!(matches!(
            read_frame::<Request>(&mut wire.as_slice()),
            Err(ProtoError::TooLarge {
                what: "payload",
                ..
            })
        ));
        let big = vec![0; usize::try_from(MAX_PAYLOAD).unwrap() + 1];
        assert!(matches!(
            write_frame(&mut Vec::new(), &Request::Write, &big),
            Err(ProtoError::TooLarge { .. })
        ));
    }

    fn raw(header: &str) -> Vec<u8> {
        let mut wire = Vec::new();
        wire.extend_from_slice(&u32::try_from(header.len()).unwrap().to_le_bytes());
        wire.extend_from_slice(&0u32.to_le_bytes());
        wire.extend_from_slice(header.as_bytes());
        wire
    }

    #[test]
    fn garbage_and_bad_keys_are_malformed() {
        for header in [
            "not json",
            r#"{"op":"launch"}"#,
            r#"{"op":"get","key":"../etc/passwd","range":null}"#,
            r#"{"op":"get","key":"/abs","range":null}"#,
            r#"{"op":"delete","key":"a/b/c"}"#,
            r#"{"op":"get","key":"config","range":[9,3]}"#,
            r#"{"op":"continue_upload","tmp":"streams/x","key":"streams/x","keep":0}"#,
            r#"{"op":"list","prefix":"../"}"#,
            r#"{"op":"hello","protocol":1,"version":"x","path":""}"#,
        ] {
            let result = read_frame::<Request>(&mut raw(header).as_slice());
            assert!(
                matches!(result, Err(ProtoError::Malformed(_))),
                "{header}: {result:?}"
            );
        }
        let listing = r#"{"reply":"listing","objects":[["tmp/../x",1]],"done":true}"#;
        assert!(matches!(
            read_frame::<Reply>(&mut raw(listing).as_slice()),
            Err(ProtoError::Malformed(_))
        ));
    }

    #[test]
    fn prefixes() {
        for ok in ["", "catalog/", "streams/ab", "tmp"] {
            check_prefix(ok).unwrap();
        }
        for bad in ["/", "..", "a/b/", "a\0"] {
            assert!(check_prefix(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn handshake_versions() {
        let hello = |protocol| Reply::Hello {
            protocol,
            version: "0".into(),
            append_only: true,
            exists: true,
        };
        assert_eq!(check_hello(&hello(PROTOCOL_VERSION)).unwrap(), (true, true));
        assert!(matches!(
            check_hello(&hello(PROTOCOL_VERSION + 1)),
            Err(ProtoError::Version { .. })
        ));
        assert!(matches!(
            check_hello(&Reply::Ok),
            Err(ProtoError::Malformed(_))
        ));
    }

    #[test]
    fn remote_text_loses_control_characters() {
        assert_eq!(printable("a\x1b[2Jb\n"), "a?[2Jb?");
    }
}
