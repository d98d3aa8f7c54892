//! A target directory on this host: what is in it, and receiving into it.
//!
//! The same functions serve `btrsend serve` for a target on its host, so
//! the far end lists, receives, discards and deletes exactly as a local
//! target does. The directory is opened once, without following a
//! symlink in its place, and every name in it is looked at relative to
//! that descriptor and never followed.

use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

use super::{Received, TargetEnd, check_name};
use crate::backup::error::BackupError;
use crate::receive::meta::{Records, State};
use crate::receive::target::ReceiveDir;
use crate::receive::{self, RESUME_DIR, ReceiveOptions};

/// A target directory on this host.
#[derive(Debug)]
pub struct LocalTarget {
    dir: PathBuf,
    name: String,
    lock: Option<TargetLock>,
}

fn io_error(what: String) -> impl FnOnce(std::io::Error) -> BackupError {
    move |error| BackupError::Io { what, error }
}

/// `BTRFS_ROOT_SUBVOL_RDONLY`, the read-only flag of a root item.
const ROOT_SUBVOL_RDONLY: u64 = 1;

/// The inode number of a subvolume's root directory on btrfs.
const SUBVOL_ROOT_INO: u64 = 256;

impl LocalTarget {
    /// The target directory `dir`, which must exist.
    ///
    /// # Errors
    ///
    /// [`BackupError::Io`]: it cannot be opened as a directory.
    pub fn open(dir: &Path) -> Result<LocalTarget, BackupError> {
        ReceiveDir::open(dir).map_err(io_error(format!(
            "cannot open the target directory {}",
            dir.display()
        )))?;
        Ok(LocalTarget {
            dir: dir.to_path_buf(),
            name: dir.display().to_string(),
            lock: None,
        })
    }
}

/// The lock of a target directory: `flock(2)` on the directory itself,
/// exclusive, held until dropped. `run` and `forget` take it (here, or
/// `btrsend serve` for a client), so that two of them never receive or
/// delete in one directory at once; `list` takes none.
#[derive(Debug)]
pub struct TargetLock {
    _fd: std::os::fd::OwnedFd,
}

/// Take the lock of the target directory `dir`, waiting up to `wait` for
/// its holder.
///
/// # Errors
///
/// [`BackupError::LockHeld`] after the wait; [`BackupError::Io`] when the
/// directory cannot be opened.
pub fn lock(dir: &Path, wait: std::time::Duration) -> Result<TargetLock, BackupError> {
    use rustix::fs::FlockOperation;
    let fd = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        io_error(format!(
            "cannot open the target directory {}",
            dir.display()
        ))(e.into())
    })?;
    let deadline = std::time::Instant::now() + wait;
    loop {
        match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(TargetLock { _fd: fd }),
            Err(rustix::io::Errno::WOULDBLOCK) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(BackupError::LockHeld {
                    repo: dir.display().to_string(),
                    holder: String::from("another backup run or forget of this target"),
                });
            }
            Err(e) => {
                return Err(io_error(format!(
                    "cannot lock the target directory {}",
                    dir.display()
                ))(e.into()));
            }
        }
    }
}

/// The subvolumes (and received directories) in `dir`.
///
/// # Errors
///
/// [`BackupError::Io`]: `dir` cannot be read.
pub fn list(dir: &Path) -> Result<Vec<Received>, BackupError> {
    let what = || format!("cannot read the target directory {}", dir.display());
    let rdir = ReceiveDir::open(dir).map_err(io_error(what()))?;
    let records_dir = Records::open(&rdir).map_err(io_error(what()))?;
    let records = records_dir.list().map_err(io_error(what()))?;
    let partial = resume_names(&rdir);
    let fd = crate::receive::subvol::reopen_dir(rdir.fd()).map_err(io_error(what()))?;
    let entries = rustix::fs::Dir::read_from(&fd).map_err(|e| io_error(what())(e.into()))?;
    let mut out = Vec::new();
    for e in entries {
        let e = e.map_err(|e| io_error(what())(e.into()))?;
        let Ok(name) = std::str::from_utf8(e.file_name().to_bytes()) else {
            continue;
        };
        if check_name(name).is_err() {
            continue;
        }
        let Ok(sub) = rustix::fs::openat(
            &fd,
            e.file_name(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            continue;
        };
        let Ok(st) = rustix::fs::fstat(&sub) else {
            continue;
        };
        let is_partial = partial.iter().any(|p| p == name);
        if st.st_ino == SUBVOL_ROOT_INO
            && let Ok(info) = crate::sys::subvol_info(sub.as_fd())
        {
            let received = info.received_uuid != [0; 16];
            // BTRFS_ROOT_SUBVOL_RDONLY in the root item's flags (not the
            // ioctl's BTRFS_SUBVOL_RDONLY).
            let read_only = info.flags & ROOT_SUBVOL_RDONLY != 0;
            let made = i64::try_from(info.otime.0)
                .ok()
                .and_then(|s| timestamp(s, info.otime.1));
            out.push(Received {
                name: name.to_owned(),
                received_uuid: received.then(|| hyphenated(info.received_uuid)),
                stransid: info.stransid,
                complete: received && read_only,
                subvolume: true,
                partial: is_partial,
                made,
            });
            continue;
        }
        // A directory counts only with its record (receive made it).
        if let Some(r) = records.iter().find(|r| r.name == name.as_bytes()) {
            let complete = r.state == State::Complete;
            out.push(Received {
                name: name.to_owned(),
                received_uuid: complete.then(|| hyphenated(r.uuid.0)),
                stransid: r.ctransid,
                complete,
                subvolume: false,
                partial: is_partial,
                // A directory has no otime: its record's time, written
                // when it was received completely.
                made: records_dir
                    .written(name.as_bytes())
                    .and_then(|(s, ns)| timestamp(s, ns)),
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn timestamp(sec: i64, nsec: u32) -> Option<String> {
    let t = jiff::Timestamp::new(sec, i32::try_from(nsec).ok()?).ok()?;
    Some(t.to_string())
}

fn hyphenated(u: [u8; 16]) -> String {
    uuid::Uuid::from_bytes(u).hyphenated().to_string()
}

/// The names that have a resume directory (`DIR/.btrsend-resume/NAME`).
fn resume_names(rdir: &ReceiveDir) -> Vec<String> {
    let Ok(top) = rustix::fs::openat(
        rdir.fd(),
        RESUME_DIR,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return Vec::new();
    };
    let Ok(it) = rustix::fs::Dir::read_from(&top) else {
        return Vec::new();
    };
    it.flatten()
        .filter_map(|e| {
            std::str::from_utf8(e.file_name().to_bytes())
                .ok()
                .map(str::to_owned)
        })
        .filter(|n| n != "." && n != "..")
        .collect()
}

/// The resume token of `dir/name`, `None` when it has none.
pub fn resume_token(dir: &Path, name: &str) -> Option<crate::resume::Token> {
    check_name(name).ok()?;
    receive::resume_token(&dir.join(name)).ok()
}

/// Receive what `send` writes into `dir`: the receive runs on a thread of
/// its own, reading a pipe the send writes into.
///
/// # Errors
///
/// The receive's error when it failed (a send that then could not write
/// fails because of it), else the send's.
pub fn receive_into(
    dir: &Path,
    send: &mut dyn FnMut(&mut dyn Write) -> Result<(), BackupError>,
) -> Result<(), BackupError> {
    let (reader, writer) = std::io::pipe().map_err(io_error("cannot make a pipe".into()))?;
    // 1 MiB of pipe: the send goes on while the receive applies.
    let _ = rustix::pipe::fcntl_setpipe_size(&writer, 1 << 20);
    std::thread::scope(|s| {
        let rx = s.spawn(move || {
            let opts = ReceiveOptions::new();
            receive::receive(reader, dir, &opts, &mut crate::progress::NoProgress)
        });
        let mut writer = std::io::BufWriter::with_capacity(1 << 20, writer);
        let sent = send(&mut writer).and_then(|()| {
            writer
                .flush()
                .map_err(io_error("cannot write the stream to the receive".into()))
        });
        drop(writer);
        let received = rx
            .join()
            .map_err(|_| String::from("the receive stopped unexpectedly"))
            .and_then(|r| r.map_err(|e| e.to_string()));
        match (sent, received) {
            (_, Err(error)) => Err(BackupError::TargetReceive {
                target: dir.display().to_string(),
                error,
            }),
            (Err(e), Ok(_)) => Err(e),
            (Ok(()), Ok(_)) => Ok(()),
        }
    })
}

/// Remove what an interrupted receive left of `dir/name`: only an
/// incomplete subvolume or directory that receive's own resume directory
/// names.
///
/// # Errors
///
/// [`BackupError::Invalid`] when it is not such a partial; the OS error.
pub fn discard(dir: &Path, name: &str) -> Result<(), BackupError> {
    check_name(name).map_err(BackupError::Invalid)?;
    let listed = list(dir)?;
    match listed.iter().find(|r| r.name == name) {
        Some(r) if !r.complete && r.partial => {}
        Some(r) if r.complete => {
            return Err(BackupError::Invalid(format!(
                "{}: received completely, not a partial receive",
                dir.join(name).display()
            )));
        }
        _ => {
            return Err(BackupError::Invalid(format!(
                "{}: not a partial receive btrsend can remove (no resume point names it); delete it by hand if it is not needed",
                dir.join(name).display()
            )));
        }
    }
    receive::discard(dir, name.as_bytes()).map_err(io_error(format!(
        "cannot remove the partial receive {}",
        dir.join(name).display()
    )))
}

/// Delete the received subvolume `dir/name`: only a complete one.
///
/// # Errors
///
/// [`BackupError::Invalid`] when it is not a complete received subvolume;
/// the OS error.
pub fn delete(dir: &Path, name: &str) -> Result<(), BackupError> {
    check_name(name).map_err(BackupError::Invalid)?;
    let listed = list(dir)?;
    if !listed.iter().any(|r| r.name == name && r.complete) {
        return Err(BackupError::Invalid(format!(
            "{}: not a subvolume received completely",
            dir.join(name).display()
        )));
    }
    receive::discard(dir, name.as_bytes()).map_err(io_error(format!(
        "cannot delete {}",
        dir.join(name).display()
    )))
}

impl TargetEnd for LocalTarget {
    fn name(&self) -> &str {
        &self.name
    }

    fn free_bytes(&mut self) -> Result<Option<u64>, BackupError> {
        crate::backup::run::free_bytes_at(&self.dir).map(Some)
    }

    fn lock(&mut self, wait: std::time::Duration) -> Result<(), BackupError> {
        self.lock = Some(lock(&self.dir, wait)?);
        Ok(())
    }

    fn list(&mut self) -> Result<Vec<Received>, BackupError> {
        list(&self.dir)
    }

    fn resume_token(&mut self, name: &str) -> Result<Option<crate::resume::Token>, BackupError> {
        Ok(resume_token(&self.dir, name))
    }

    fn receive(
        &mut self,
        send: &mut dyn FnMut(&mut dyn Write) -> Result<(), BackupError>,
    ) -> Result<(), BackupError> {
        receive_into(&self.dir, send)
    }

    fn discard(&mut self, name: &str) -> Result<(), BackupError> {
        discard(&self.dir, name)
    }

    fn delete(&mut self, name: &str) -> Result<(), BackupError> {
        delete(&self.dir, name)
    }
}
