//! The far end of a remote repository: `btrsend serve`'s loop, which
//! answers [`proto`](super::proto) requests from stdin on stdout out of a
//! [`LocalStore`].
//!
//! The client is hostile until proven otherwise: its keys are checked as
//! frames are read, its repository path must lie inside one of the
//! `--restrict-to-path` directories once symlinks are resolved, and with
//! `--append-only` nothing stored is deleted, overwritten or cut. An
//! unfinished upload in `tmp/` may still be continued (and cut back to its
//! last resumable point): that is what resuming a dropped run needs, and
//! what it can cost is the client's own unfinished upload, never a
//! completed object. Catalog generations only ever grow: a generation at
//! or below the newest stored one is refused (the server cannot read a
//! sealed catalog, so it checks numbers, not contents).

use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use super::proto::{
    MAX_HEADER, MAX_PAYLOAD, PROTOCOL_VERSION, ProtoError, Reply, Request, printable, read_frame,
    write_frame,
};
use crate::backup::CONFIG_KEY;
use crate::backup::Repository;
use crate::backup::error::BackupError;
use crate::backup::lock::{self, LockKind, RepoLock};
use crate::backup::store::{DIR_MODE, LocalStore, Store, StoreError, Upload};
use crate::progress::NoProgress;
use std::sync::Arc;

/// How `btrsend serve` was started.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// Refuse deletions, overwrites and catalog rollbacks.
    pub append_only: bool,
    /// The directories repositories may lie in (none: anywhere).
    pub restrict_to: Vec<PathBuf>,
}

/// Serve one connection: the handshake, then requests until the client
/// closes its end.
///
/// # Errors
///
/// A broken pipe or a malformed frame (the connection is then dropped:
/// a client that sends garbage gets no more answers).
pub fn serve(
    input: &mut impl Read,
    output: &mut impl Write,
    options: &ServeOptions,
) -> Result<(), ProtoError> {
    let Some(hello) = read_frame::<Request>(input)? else {
        return Ok(());
    };
    let Request::Hello {
        protocol,
        path,
        target,
        ..
    } = hello.message
    else {
        refuse(output, "the first request must be the handshake".into())?;
        return Ok(());
    };
    if protocol != PROTOCOL_VERSION {
        refuse(
            output,
            format!(
                "protocol version {protocol} is not spoken here (version {PROTOCOL_VERSION} is)"
            ),
        )?;
        return Ok(());
    }
    let root = match allowed_path(Path::new(&path), &options.restrict_to) {
        Ok(root) => root,
        Err(why) => {
            refuse(output, why)?;
            return Ok(());
        }
    };
    if target && !root.is_dir() {
        refuse(
            output,
            format!(
                "target directory {} does not exist",
                printable(&root.display().to_string())
            ),
        )?;
        return Ok(());
    }
    write_frame(
        output,
        &Reply::Hello {
            protocol: PROTOCOL_VERSION,
            version: env!("CARGO_PKG_VERSION").into(),
            append_only: options.append_only,
            exists: root.is_dir(),
        },
        &[],
    )?;
    output.flush()?;
    if target {
        let mut session = super::target::TargetSession::new(root, options.append_only);
        while let Some(frame) = read_frame::<Request>(input)? {
            if let Some((reply, payload)) = session.handle(frame.message, frame.payload) {
                send(output, &reply, &payload)?;
                output.flush()?;
            }
        }
        return Ok(());
    }
    let mut session = Session {
        store: LocalStore::new(&root),
        append_only: options.append_only,
        upload: None,
        failed: None,
        lock: None,
    };
    while let Some(frame) = read_frame::<Request>(input)? {
        if let Some((reply, payload)) = session.handle(frame.message, &frame.payload) {
            send(output, &reply, &payload)?;
            output.flush()?;
        }
    }
    Ok(())
}

/// Ask for pipes of 1 MiB on standard input and output, when they are
/// pipes (sshd's): frames then cross in a few writes. Best effort.
pub fn widen_stdio_pipes() {
    const PIPE_BYTES: usize = 1 << 20;
    let _ = rustix::pipe::fcntl_setpipe_size(std::io::stdin(), PIPE_BYTES);
    let _ = rustix::pipe::fcntl_setpipe_size(std::io::stdout(), PIPE_BYTES);
}

/// The JSON bytes a listing part may take, counting each key at its worst
/// (every byte a six-byte escape): half the header cap.
const LISTING_PART: usize = (MAX_HEADER / 2) as usize;

/// Send `reply`, its payload split into frames under [`MAX_PAYLOAD`], a
/// listing in parts under [`MAX_HEADER`].
fn send(output: &mut impl Write, reply: &Reply, payload: &[u8]) -> Result<(), ProtoError> {
    if let Reply::Listing { objects, .. } = reply {
        let mut parts = Vec::new();
        let (mut start, mut bytes) = (0, 0);
        for (i, (key, _)) in objects.iter().enumerate() {
            // A key's worst quoting, its size and the punctuation.
            let cost = key.len() * 6 + 32;
            if i > start && bytes + cost > LISTING_PART {
                parts.push(start..i);
                (start, bytes) = (i, 0);
            }
            bytes += cost;
        }
        parts.push(start..objects.len());
        let last = parts.len() - 1;
        for (n, part) in parts.into_iter().enumerate() {
            let piece = Reply::Listing {
                objects: objects[part].to_vec(),
                done: n == last,
            };
            write_frame(output, &piece, &[])?;
        }
        return Ok(());
    }
    let cap = usize::try_from(MAX_PAYLOAD).unwrap_or(usize::MAX);
    let mut chunks = payload.chunks(cap);
    let first = chunks.next().unwrap_or(&[]);
    write_frame(output, reply, first)?;
    for chunk in chunks {
        write_frame(output, &Reply::Ok, chunk)?;
    }
    Ok(())
}

fn refuse(output: &mut impl Write, why: String) -> Result<(), ProtoError> {
    write_frame(output, &Reply::Refused { why }, &[])?;
    output.flush()?;
    Ok(())
}

/// `path` made absolute and real, if it lies in one of `restrict_to`
/// (also resolved). A repository that does not exist yet (`init`) must
/// have a parent that does.
///
/// # Errors
///
/// Why it is refused, as text for the client.
pub fn allowed_path(path: &Path, restrict_to: &[PathBuf]) -> Result<PathBuf, String> {
    let shown = printable(&path.display().to_string());
    if !path.is_absolute() {
        return Err(format!("repository path {shown} is not absolute"));
    }
    if path
        .components()
        .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
    {
        return Err(format!("repository path {shown} contains . or .."));
    }
    let real = match path.canonicalize() {
        Ok(real) => real,
        Err(_) => {
            let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
                return Err(format!("repository path {shown} has no parent"));
            };
            let parent = parent
                .canonicalize()
                .map_err(|error| format!("repository path {shown}: {error}"))?;
            parent.join(name)
        }
    };
    if restrict_to.is_empty() {
        return Ok(real);
    }
    for dir in restrict_to {
        if let Ok(dir) = dir.canonicalize()
            && real.starts_with(&dir)
        {
            return Ok(real);
        }
    }
    Err(format!(
        "repository path {shown} is outside the directories this server serves"
    ))
}

/// One connection's state after the handshake.
struct Session {
    store: LocalStore,
    append_only: bool,
    /// The open upload, if any.
    upload: Option<Box<dyn Upload>>,
    /// The first error of the open upload's writes, answered at its end.
    failed: Option<String>,
    /// The repository lock the client holds.
    lock: Option<RepoLock>,
}

/// The longest a client may make the server wait for a lock.
const MAX_LOCK_WAIT: Duration = Duration::from_secs(24 * 3600);

impl Session {
    /// The reply to `request` (none for a write).
    fn handle(&mut self, request: Request, payload: &[u8]) -> Option<(Reply, Vec<u8>)> {
        let reply = match request {
            Request::Write => {
                if self.failed.is_none() {
                    match self.upload.as_mut() {
                        Some(upload) => {
                            if let Err(error) = upload.write(payload) {
                                self.failed = Some(error.to_string());
                                self.upload = None;
                            }
                        }
                        None => self.failed = Some("a write without an open upload".into()),
                    }
                }
                return None;
            }
            Request::Complete => match (self.failed.take(), self.upload.take()) {
                (Some(why), _) => Reply::Failed { why },
                (None, Some(upload)) => result(upload.complete().map(|()| Reply::Ok)),
                (None, None) => Reply::Failed {
                    why: "no open upload".into(),
                },
            },
            Request::Abort => {
                self.upload = None;
                self.failed = None;
                Reply::Ok
            }
            Request::Get { key, range } => {
                let range = range.map(|(start, end)| start..end);
                return Some(match self.store.get(&key, range) {
                    Ok(data) => (
                        Reply::Data {
                            len: u64::try_from(data.len()).unwrap_or(u64::MAX),
                            more: more_frames(data.len()),
                        },
                        data,
                    ),
                    Err(error) => (error_reply(error), Vec::new()),
                });
            }
            Request::PutIfAbsent { key } => match self.check_catalog(&key, Some(payload)) {
                Err(why) => Reply::Refused { why },
                Ok(()) => result(
                    self.store
                        .put_if_absent(&key, payload)
                        .map(|stored| Reply::Stored { stored }),
                ),
            },
            Request::List { prefix } => {
                result(self.store.list(&prefix).map(|objects| Reply::Listing {
                    objects: objects.into_iter().map(|o| (o.key, o.size)).collect(),
                    done: true,
                }))
            }
            Request::Delete { key } if self.append_only && !key.starts_with("tmp/") => {
                Reply::Refused {
                    why: format!(
                        "deleting {key} is refused: this server is append-only \
                     (prune on the server, or with an unrestricted key)"
                    ),
                }
            }
            Request::Delete { key } => result(self.store.delete(&key).map(|()| Reply::Ok)),
            Request::Multipart { key } => match self.check_catalog(&key, None) {
                Err(why) => Reply::Refused { why },
                Ok(()) => self.open(self.store.multipart(&key).map(Some)),
            },
            Request::ContinueUpload { tmp, key, keep } => match self.check_catalog(&key, None) {
                Err(why) => Reply::Refused { why },
                Ok(()) => self.open(self.store.continue_upload(&tmp, keep, &key)),
            },
            Request::Hello { .. } => Reply::Refused {
                why: "a second handshake".into(),
            },
            Request::TargetList
            | Request::TargetToken { .. }
            | Request::TargetReceive
            | Request::TargetDiscard { .. }
            | Request::TargetDelete { .. } => Reply::Refused {
                why: "a target request on a repository connection".into(),
            },
            Request::InitRoot => self.init_root(),
            Request::Lock { exclusive, wait_ms } => {
                // One lock per connection: a new request replaces it.
                self.lock = None;
                let kind = if exclusive {
                    LockKind::Exclusive
                } else {
                    LockKind::Shared
                };
                let wait = Duration::from_millis(wait_ms).min(MAX_LOCK_WAIT);
                match lock::lock_file(&self.store, kind, wait) {
                    Ok(held) => {
                        self.lock = Some(held);
                        Reply::Ok
                    }
                    Err(BackupError::LockHeld { holder, .. }) => Reply::LockHeld { holder },
                    Err(error) => Reply::Failed {
                        why: error.to_string(),
                    },
                }
            }
            Request::Unlock => {
                self.lock = None;
                Reply::Ok
            }
            Request::VerifyRead { wait_ms } => {
                let wait = Duration::from_millis(wait_ms).min(MAX_LOCK_WAIT);
                return Some(match self.verify_read(wait) {
                    Ok(report) => (
                        Reply::Data {
                            len: u64::try_from(report.len()).unwrap_or(u64::MAX),
                            more: more_frames(report.len()),
                        },
                        report,
                    ),
                    Err(reply) => (reply, Vec::new()),
                });
            }
        };
        Some((reply, Vec::new()))
    }

    /// Keep `upload` as the open one. One upload at a time: the writes
    /// that follow name no upload, so a second one would mix their bytes.
    fn open(&mut self, upload: Result<Option<Box<dyn Upload>>, StoreError>) -> Reply {
        if self.upload.is_some() || self.failed.is_some() {
            return Reply::Refused {
                why: "an upload is open already (one at a time per connection)".into(),
            };
        }
        match upload {
            Ok(Some(mut upload)) => {
                upload.keep_when_dropped();
                self.upload = Some(upload);
                self.failed = None;
                Reply::Ok
            }
            Ok(None) => Reply::Failed {
                why: "this store cannot continue uploads".into(),
            },
            Err(error) => error_reply(error),
        }
    }

    /// `verify --read-data` of the repository here: its report's JSON.
    fn verify_read(&self, wait: Duration) -> Result<Vec<u8>, Reply> {
        let failed = |e: BackupError| match e {
            BackupError::LockHeld { holder, .. } => Reply::LockHeld { holder },
            e => Reply::Failed { why: e.to_string() },
        };
        let store: Arc<dyn Store> = Arc::new(LocalStore::new(self.store.root()));
        let repo = Repository::open_in(store).map_err(failed)?;
        let report = repo.verify(true, wait, &NoProgress).map_err(failed)?;
        serde_json::to_vec(&report).map_err(|e| Reply::Failed { why: e.to_string() })
    }

    /// `init`'s directory: made when missing (mode 0700; its parent
    /// exists, as the handshake checked), refused when it holds files
    /// but no repository.
    fn init_root(&self) -> Reply {
        use std::os::unix::fs::DirBuilderExt;
        let root = self.store.root();
        match std::fs::DirBuilder::new().mode(DIR_MODE).create(root) {
            Ok(()) => return Reply::Ok,
            Err(error) if error.kind() != std::io::ErrorKind::AlreadyExists => {
                return Reply::Failed {
                    why: format!("cannot create {}: {error}", root.display()),
                };
            }
            Err(_) => {}
        }
        let mut names = match std::fs::read_dir(root) {
            Ok(names) => names,
            Err(error) => {
                return Reply::Failed {
                    why: format!("cannot read {}: {error}", root.display()),
                };
            }
        };
        if names.next().is_some() && !root.join(CONFIG_KEY).exists() {
            return Reply::Refused {
                why: format!(
                    "{}: the directory is not empty and holds no repository: \
                     init needs a new or empty directory",
                    root.display()
                ),
            };
        }
        Reply::Ok
    }

    /// With append-only, a catalog generation must be newer than every
    /// stored one, and one written in the clear (`payload`, when the
    /// whole object is at hand) must keep every entry of the newest
    /// stored one as it was (a sealed catalog the server cannot read: its
    /// generation number is checked).
    fn check_catalog(&self, key: &str, payload: Option<&[u8]>) -> Result<(), String> {
        let Some(generation) = catalog_generation(key) else {
            return Ok(());
        };
        if !self.append_only {
            return Ok(());
        }
        let stored = self.store.list("catalog/").map_err(|e| e.to_string())?;
        let Some((newest, newest_key)) = stored
            .iter()
            .filter_map(|o| Some((catalog_generation(&o.key)?, &o.key)))
            .max()
        else {
            return Ok(());
        };
        if generation <= newest {
            return Err(format!(
                "catalog generation {generation} is refused: this server is append-only \
                 and holds generation {newest}"
            ));
        }
        let Some(payload) = payload else {
            return Ok(());
        };
        let old = self
            .store
            .get(newest_key, None)
            .map_err(|e| e.to_string())?;
        let Some(old) = plain_entries(&old) else {
            return Ok(());
        };
        let Some(new) = plain_entries(payload) else {
            return Err(format!(
                "{key} is refused: this server is append-only and {newest_key} is a \
                 catalog in the clear, which a catalog it cannot read may not replace"
            ));
        };
        match old.iter().find(|entry| !new.contains(entry)) {
            None => Ok(()),
            Some(lost) => Err(format!(
                "{key} is refused: this server is append-only and it drops or changes \
                 entry {} of {newest_key} (prune on the server, or with an unrestricted key)",
                lost.get("id")
                    .map_or_else(|| "?".into(), ToString::to_string),
            )),
        }
    }
}

/// The entries of a catalog in the clear, `None` for one that is not
/// (sealed, or not a catalog at all).
fn plain_entries(bytes: &[u8]) -> Option<Vec<serde_json::Value>> {
    let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    match value.get("entries")? {
        serde_json::Value::Array(entries) => Some(entries.clone()),
        _ => None,
    }
}

/// The generation of a catalog key (`catalog/00000007.json`).
fn catalog_generation(key: &str) -> Option<u64> {
    let name = key.strip_prefix("catalog/")?;
    let digits = name.split('.').next()?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A [`Reply::Data`] announcing `len` bytes.
pub(super) fn data_reply(len: usize) -> Reply {
    Reply::Data {
        len: u64::try_from(len).unwrap_or(u64::MAX),
        more: more_frames(len),
    }
}

fn more_frames(len: usize) -> u32 {
    let cap = usize::try_from(MAX_PAYLOAD).unwrap_or(usize::MAX);
    u32::try_from(len.saturating_sub(1) / cap).unwrap_or(u32::MAX)
}

fn result(reply: Result<Reply, StoreError>) -> Reply {
    reply.unwrap_or_else(error_reply)
}

fn error_reply(error: StoreError) -> Reply {
    match error {
        StoreError::NotFound { .. } => Reply::NotFound,
        StoreError::Exists { .. } => Reply::Exists,
        other => Reply::Failed {
            why: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::remote::proto::Frame;

    fn exchange(root: &Path, options: &ServeOptions, requests: &[(Request, &[u8])]) -> Vec<Reply> {
        exchange_as(root, false, options, requests)
    }

    fn exchange_as(
        root: &Path,
        target: bool,
        options: &ServeOptions,
        requests: &[(Request, &[u8])],
    ) -> Vec<Reply> {
        let mut wire = Vec::new();
        let hello = Request::Hello {
            protocol: PROTOCOL_VERSION,
            version: "test".into(),
            path: root.display().to_string(),
            target,
        };
        write_frame(&mut wire, &hello, &[]).unwrap();
        for (request, payload) in requests {
            write_frame(&mut wire, request, payload).unwrap();
        }
        let mut out = Vec::new();
        serve(&mut wire.as_slice(), &mut out, options).unwrap();
        let mut replies = Vec::new();
        let mut out = out.as_slice();
        while let Some(Frame { message, .. }) = read_frame::<Reply>(&mut out).unwrap() {
            replies.push(message);
        }
        replies
    }

    #[test]
    fn a_target_connection_serves_only_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("target");
        std::fs::create_dir(&root).unwrap();
        // Not receive's: a directory without a record, a subvolume-less
        // name that no resume point names.
        std::fs::create_dir(root.join("mine")).unwrap();
        let options = ServeOptions {
            append_only: true,
            restrict_to: vec![dir.path().to_path_buf()],
        };
        let name = |n: &str| n.to_owned();
        let replies = exchange_as(
            &root,
            true,
            &options,
            &[
                (Request::TargetList, b""),
                (Request::TargetDelete { name: name("mine") }, b""),
                (Request::TargetDiscard { name: name("mine") }, b""),
                (Request::TargetToken { name: name("mine") }, b""),
                (
                    Request::Get {
                        key: "config".into(),
                        range: None,
                    },
                    b"",
                ),
                (Request::Complete, b""),
                (Request::TargetReceive, b""),
                (Request::Write, b"not a stream"),
                (Request::Complete, b""),
            ],
        );
        assert!(matches!(replies[0], Reply::Hello { .. }), "{replies:?}");
        // The listing: `mine` is not receive's, so it is not listed.
        assert_eq!(replies[1], Reply::Data { len: 2, more: 0 });
        assert!(
            matches!(&replies[2], Reply::Refused { why } if why.contains("append-only")),
            "{replies:?}"
        );
        assert!(matches!(replies[3], Reply::Failed { .. }), "{replies:?}");
        assert_eq!(replies[4], Reply::NotFound);
        assert!(matches!(replies[5], Reply::Refused { .. }), "{replies:?}");
        assert!(matches!(replies[6], Reply::Failed { .. }), "{replies:?}");
        assert_eq!(replies[7], Reply::Ok);
        assert!(
            matches!(&replies[8], Reply::Failed { why } if why.contains("stream")),
            "{replies:?}"
        );
        assert!(root.join("mine").is_dir());
        // A missing target directory is refused at the handshake, and a
        // name that reaches outside is refused as the frame is read.
        let replies = exchange_as(&dir.path().join("absent"), true, &options, &[]);
        assert!(matches!(replies[0], Reply::Refused { .. }), "{replies:?}");
        let mut wire = Vec::new();
        write_frame(
            &mut wire,
            &Request::Hello {
                protocol: PROTOCOL_VERSION,
                version: "test".into(),
                path: root.display().to_string(),
                target: true,
            },
            &[],
        )
        .unwrap();
        write_frame(
            &mut wire,
            &Request::TargetDelete { name: name("../x") },
            &[],
        )
        .unwrap();
        let mut out = Vec::new();
        assert!(serve(&mut wire.as_slice(), &mut out, &options).is_err());
    }

    #[test]
    fn append_only_refuses_delete_overwrite_and_rollback() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("repo");
        std::fs::create_dir(&root).unwrap();
        let options = ServeOptions {
            append_only: true,
            restrict_to: vec![dir.path().to_path_buf()],
        };
        let put = |key: &str| Request::PutIfAbsent { key: key.into() };
        let replies = exchange(
            &root,
            &options,
            &[
                (put("config"), b"one"),
                (put("catalog/00000002.json"), b"{}"),
                (put("config"), b"two"),
                (
                    Request::Delete {
                        key: "config".into(),
                    },
                    b"",
                ),
                (put("catalog/00000001.json"), b"{}"),
                (
                    Request::Multipart {
                        key: "catalog/00000002.json".into(),
                    },
                    b"",
                ),
                (
                    Request::Multipart {
                        key: "config".into(),
                    },
                    b"",
                ),
                (Request::Write, b"three"),
                (Request::Complete, b""),
            ],
        );
        assert!(matches!(
            replies[0],
            Reply::Hello {
                append_only: true,
                ..
            }
        ));
        assert_eq!(replies[1], Reply::Stored { stored: true });
        assert_eq!(replies[2], Reply::Stored { stored: true });
        assert_eq!(replies[3], Reply::Stored { stored: false });
        assert!(matches!(replies[4], Reply::Refused { .. }));
        assert!(matches!(replies[5], Reply::Refused { .. }));
        assert!(matches!(replies[6], Reply::Refused { .. }));
        assert_eq!(replies[7], Reply::Ok);
        assert!(matches!(replies[8], Reply::Exists | Reply::Failed { .. }));
        assert_eq!(std::fs::read(root.join("config")).unwrap(), b"one");
    }

    #[test]
    fn paths_outside_the_allowed_directories_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let allowed = dir.path().join("allowed");
        std::fs::create_dir(&allowed).unwrap();
        std::os::unix::fs::symlink(dir.path(), allowed.join("escape")).unwrap();
        let restrict = [allowed.clone()];
        allowed_path(&allowed.join("repo"), &restrict).unwrap();
        for bad in [
            dir.path().join("repo"),
            allowed.join("escape/repo"),
            allowed.join("../repo"),
            PathBuf::from("relative"),
        ] {
            assert!(allowed_path(&bad, &restrict).is_err(), "{}", bad.display());
        }
        let replies = exchange(
            &dir.path().join("repo"),
            &ServeOptions {
                append_only: false,
                restrict_to: restrict.to_vec(),
            },
            &[],
        );
        assert!(matches!(replies[..], [Reply::Refused { .. }]));
    }

    #[test]
    fn uploads_and_reads_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("repo");
        std::fs::create_dir(&root).unwrap();
        let replies = exchange(
            &root,
            &ServeOptions::default(),
            &[
                (
                    Request::Multipart {
                        key: "streams/a".into(),
                    },
                    b"",
                ),
                (Request::Write, b"hello "),
                (Request::Write, b"world"),
                (Request::Complete, b""),
                (
                    Request::Get {
                        key: "streams/a".into(),
                        range: Some((6, 11)),
                    },
                    b"",
                ),
                (
                    Request::List {
                        prefix: "streams/".into(),
                    },
                    b"",
                ),
                (
                    Request::Delete {
                        key: "streams/a".into(),
                    },
                    b"",
                ),
                (
                    Request::Get {
                        key: "streams/a".into(),
                        range: None,
                    },
                    b"",
                ),
            ],
        );
        assert_eq!(replies[1], Reply::Ok);
        assert_eq!(replies[2], Reply::Ok);
        assert_eq!(replies[3], Reply::Data { len: 5, more: 0 });
        assert_eq!(
            replies[4],
            Reply::Listing {
                objects: vec![("streams/a".into(), 11)],
                done: true
            }
        );
        assert_eq!(replies[5], Reply::Ok);
        assert_eq!(replies[6], Reply::NotFound);
    }

    #[test]
    fn a_long_listing_comes_in_parts_under_the_header_cap() {
        // 12,000 keys of 120 bytes: 1.4 MB of names, past the 1 MiB cap
        // of one header.
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("repo");
        std::fs::create_dir_all(root.join("streams")).unwrap();
        let name = |i: usize| format!("{i:0>110}.btrs.zst");
        for i in 0..12_000 {
            std::fs::write(root.join("streams").join(name(i)), b"").unwrap();
        }
        let list = Request::List {
            prefix: "streams/".into(),
        };
        let replies = exchange(&root, &ServeOptions::default(), &[(list, b"")]);
        let mut keys = Vec::new();
        for (i, r) in replies[1..].iter().enumerate() {
            let Reply::Listing { objects, done } = r else {
                panic!("{r:?}")
            };
            assert_eq!(*done, i == replies.len() - 2);
            keys.extend(objects.iter().map(|(k, _)| k.clone()));
        }
        assert!(replies.len() > 3, "{} parts", replies.len() - 1);
        let want: Vec<String> = (0..12_000)
            .map(|i| format!("streams/{}", name(i)))
            .collect();
        assert_eq!(keys, want);
    }

    #[test]
    fn one_upload_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("repo");
        std::fs::create_dir(&root).unwrap();
        let multipart = |key: &str| Request::Multipart { key: key.into() };
        let replies = exchange(
            &root,
            &ServeOptions::default(),
            &[
                (multipart("streams/b"), b""),
                (multipart("streams/c"), b""),
                (Request::Abort, b""),
                (multipart("streams/c"), b""),
            ],
        );
        assert_eq!(replies[1], Reply::Ok);
        assert!(matches!(replies[2], Reply::Refused { .. }));
        assert_eq!(replies[3], Reply::Ok);
        assert_eq!(replies[4], Reply::Ok);
    }

    #[test]
    fn catalog_generations() {
        assert_eq!(catalog_generation("catalog/00000007.json"), Some(7));
        assert_eq!(catalog_generation("catalog/x.json"), None);
        assert_eq!(catalog_generation("streams/00000007.json"), None);
    }
}
