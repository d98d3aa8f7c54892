//! Records of received subvolumes: what `btrfs receive` keeps in the root
//! item (received UUID, stransid, read-only flag), kept here in a small text
//! file beside each received subvolume, because DIR may be on any filesystem.
//!
//! # Format, version 1
//!
//! Every subvolume `DIR/<name>` made by `btrsend receive` has a record
//! `DIR/.btrsend/<name>.subvol` (the name's raw bytes, then `.subvol`; the
//! subvolume name `.btrsend` is refused). It is a text file of `key=value`
//! lines, in this order:
//!
//! ```text
//! # btrsend received subvolume v1
//! uuid=e690ca2d-c5e4-7c45-a7c4-07550d5a5f09
//! ctransid=7
//! parent_uuid=-
//! parent_ctransid=0
//! state=complete
//! ```
//!
//! * `uuid` and `ctransid`: the SUBVOL / SNAPSHOT command's UUID and CTRANSID
//!   (the sent subvolume's received UUID, or its UUID, and its ctransid): the
//!   values a later SNAPSHOT's `CLONE_UUID` / `CLONE_CTRANSID`, or a CLONE's,
//!   name when they mean this subvolume. UUIDs are lowercase `8-4-4-4-12`.
//! * `parent_uuid` / `parent_ctransid`: the parent of an incremental stream
//!   (its CLONE_UUID / CLONE_CTRANSID); `-` and `0` for a full stream.
//!   Informational.
//! * `state`: `incomplete` from the moment the subvolume is created, until its
//!   END (or the next SUBVOL / SNAPSHOT, or the end of the input) is reached
//!   with no error applying any of its commands; then `complete`. An
//!   incomplete subvolume is never used as a parent or a clone source.
//!
//! Unknown keys are ignored (so later versions can add some); a missing key
//! makes the record unreadable, and so unusable as a parent. Records are
//! replaced atomically: written to `<name>.tmp` in the same directory, then
//! renamed over `<name>.subvol`.

use std::ffi::OsStr;
use std::io::{self, Write as _};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use rustix::fs::{Mode, OFlags};

use super::target::{RESERVED_NAME, ReceiveDir};
use crate::types::Uuid;

/// First line of every record.
pub const HEADER: &str = "# btrsend received subvolume v1";

/// Suffix of a record's file name.
const SUFFIX: &[u8] = b".subvol";

/// Whether a received subvolume is a faithful copy yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Being received, or stopped by an error.
    Incomplete,
    /// Every command up to its END applied without error.
    Complete,
}

/// One record (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Subvolume name in DIR.
    pub name: Vec<u8>,
    /// Received UUID.
    pub uuid: Uuid,
    /// Its ctransid.
    pub ctransid: u64,
    /// Parent of an incremental stream.
    pub parent: Option<(Uuid, u64)>,
    /// Completeness.
    pub state: State,
}

impl Record {
    /// The record's text.
    pub fn to_text(&self) -> String {
        let (pu, pc) = match self.parent {
            Some((u, c)) => (u.to_string(), c),
            None => ("-".to_string(), 0),
        };
        let state = match self.state {
            State::Incomplete => "incomplete",
            State::Complete => "complete",
        };
        format!(
            "{HEADER}\nuuid={}\nctransid={}\nparent_uuid={pu}\nparent_ctransid={pc}\nstate={state}\n",
            self.uuid, self.ctransid
        )
    }

    /// Parse a record's text; `None` if it is not a valid version 1 record.
    pub fn parse(name: &[u8], text: &str) -> Option<Record> {
        let mut lines = text.lines();
        if lines.next()? != HEADER {
            return None;
        }
        let (mut uuid, mut ctransid, mut pu, mut pc, mut state) = (None, None, None, None, None);
        for l in lines {
            let (k, v) = l.split_once('=')?;
            match k {
                "uuid" => uuid = Some(Uuid::parse(v)?),
                "ctransid" => ctransid = Some(v.parse().ok()?),
                "parent_uuid" => {
                    pu = Some(if v == "-" {
                        None
                    } else {
                        Some(Uuid::parse(v)?)
                    })
                }
                "parent_ctransid" => pc = Some(v.parse::<u64>().ok()?),
                "state" => {
                    state = Some(match v {
                        "complete" => State::Complete,
                        "incomplete" => State::Incomplete,
                        _ => return None,
                    })
                }
                _ => {}
            }
        }
        Some(Record {
            name: name.to_vec(),
            uuid: uuid?,
            ctransid: ctransid?,
            parent: pu?.map(|u| (u, pc.unwrap_or(0))),
            state: state?,
        })
    }
}

/// The records directory of DIR (`DIR/.btrsend`).
#[derive(Debug)]
pub struct Records {
    fd: Option<OwnedFd>,
    path: PathBuf,
}

fn record_file(name: &[u8], suffix: &[u8]) -> Vec<u8> {
    let mut f = name.to_vec();
    f.extend_from_slice(suffix);
    f
}

impl Records {
    /// Open `DIR/.btrsend` if it exists (it is created by the first write).
    ///
    /// # Errors
    ///
    /// The OS error (other than "not found"), e.g. `.btrsend` being a symlink.
    pub fn open(dir: &ReceiveDir) -> io::Result<Records> {
        let path = dir.display_path(RESERVED_NAME);
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(
            dir.fd(),
            OsStr::from_bytes(RESERVED_NAME),
            flags,
            Mode::empty(),
        ) {
            Ok(fd) => Some(fd),
            Err(rustix::io::Errno::NOENT) => None,
            Err(e) => return Err(with_path(e.into(), &path)),
        };
        Ok(Records { fd, path })
    }

    /// When `name`'s record was last written (for a complete one: when
    /// it was received completely), as seconds and nanoseconds since the
    /// epoch; `None` without one.
    pub fn written(&self, name: &[u8]) -> Option<(i64, u32)> {
        let fd = self.fd.as_ref()?;
        let st = rustix::fs::statat(
            fd,
            OsStr::from_bytes(&record_file(name, SUFFIX)),
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )
        .ok()?;
        Some((st.st_mtime, u32::try_from(st.st_mtime_nsec).ok()?))
    }

    /// The path of `name`'s record, for messages.
    pub fn path_of(&self, name: &[u8]) -> PathBuf {
        self.path
            .join(OsStr::from_bytes(&record_file(name, SUFFIX)))
    }

    fn ensure(&mut self, dir: &ReceiveDir) -> io::Result<&OwnedFd> {
        if self.fd.is_none() {
            match rustix::fs::mkdirat(
                dir.fd(),
                OsStr::from_bytes(RESERVED_NAME),
                Mode::from_raw_mode(0o700),
            ) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(with_path(e.into(), &self.path)),
            }
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            let fd = rustix::fs::openat(
                dir.fd(),
                OsStr::from_bytes(RESERVED_NAME),
                flags,
                Mode::empty(),
            )
            .map_err(|e| with_path(e.into(), &self.path))?;
            self.fd = Some(fd);
        }
        // OK to unwrap: set just above.
        Ok(self.fd.as_ref().expect("records dir open"))
    }

    /// Write (atomically replace) a record; a complete one is synced to
    /// disk first.
    ///
    /// # Errors
    ///
    /// The OS error, naming the record's path.
    pub fn write(&mut self, dir: &ReceiveDir, rec: &Record) -> io::Result<()> {
        let path = self.path_of(&rec.name);
        let fd = self.ensure(dir)?;
        let tmp = record_file(&rec.name, b".tmp");
        let res = (|| -> io::Result<()> {
            let flags = OFlags::WRONLY
                | OFlags::CREATE
                | OFlags::TRUNC
                | OFlags::NOFOLLOW
                | OFlags::CLOEXEC;
            let f = rustix::fs::openat(
                fd,
                OsStr::from_bytes(&tmp),
                flags,
                Mode::from_raw_mode(0o644),
            )?;
            let mut f = std::fs::File::from(f);
            f.write_all(rec.to_text().as_bytes())?;
            // A complete record replaces the incomplete one: its bytes must
            // be on disk before the rename, or a crash could leave a
            // complete subvolume with an empty (unusable) record. The first,
            // incomplete, record is not synced: lost or empty after a
            // crash, it says the same (not usable as a parent), and the
            // sync costs a log commit per subvolume.
            if rec.state == State::Complete {
                f.sync_data()?;
            }
            rustix::fs::renameat(
                fd,
                OsStr::from_bytes(&tmp),
                fd,
                OsStr::from_bytes(&record_file(&rec.name, SUFFIX)),
            )?;
            Ok(())
        })();
        if res.is_err() {
            // No temporary record left behind (e.g. 0 bytes on a full disk).
            let _ = rustix::fs::unlinkat(fd, OsStr::from_bytes(&tmp), rustix::fs::AtFlags::empty());
        }
        res.map_err(|e| with_path(e, &path))
    }

    /// Every readable record (unreadable ones are skipped: they can never be
    /// a parent).
    ///
    /// # Errors
    ///
    /// The OS error of reading the directory.
    pub fn list(&self) -> io::Result<Vec<Record>> {
        let Some(fd) = &self.fd else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        let dup = rustix::fs::openat(
            fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| with_path(e.into(), &self.path))?;
        let mut d = rustix::fs::Dir::new(dup).map_err(|e| with_path(e.into(), &self.path))?;
        while let Some(ent) = d.read() {
            let ent = ent.map_err(|e| with_path(e.into(), &self.path))?;
            let file = ent.file_name().to_bytes();
            let Some(name) = file.strip_suffix(SUFFIX) else {
                continue;
            };
            if name.is_empty() {
                continue;
            }
            let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
            let Ok(f) = rustix::fs::openat(fd, OsStr::from_bytes(file), flags, Mode::empty())
            else {
                continue;
            };
            let mut text = String::new();
            if io::Read::read_to_string(&mut std::fs::File::from(f), &mut text).is_err() {
                continue;
            }
            if let Some(r) = Record::parse(name, &text) {
                out.push(r);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

/// Prefix an I/O error with the path it is about.
pub(crate) fn with_path(e: io::Error, path: &std::path::Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trip() {
        let r = Record {
            name: b"s 1".to_vec(),
            uuid: Uuid([
                0xe6, 0x90, 0xca, 0x2d, 0xc5, 0xe4, 0x7c, 0x45, 0xa7, 0xc4, 0x07, 0x55, 0x0d, 0x5a,
                0x5f, 0x09,
            ]),
            ctransid: 7,
            parent: Some((Uuid([1; 16]), 5)),
            state: State::Complete,
        };
        let t = r.to_text();
        assert!(
            t.contains("uuid=e690ca2d-c5e4-7c45-a7c4-07550d5a5f09\n"),
            "{t}"
        );
        assert_eq!(Record::parse(b"s 1", &t), Some(r.clone()));
        let full = Record {
            parent: None,
            state: State::Incomplete,
            ..r
        };
        let t = full.to_text();
        assert!(
            t.contains("parent_uuid=-\n") && t.contains("state=incomplete\n"),
            "{t}"
        );
        assert_eq!(Record::parse(b"s 1", &t), Some(full));
        assert_eq!(Record::parse(b"x", "# other\nuuid=1"), None);
        assert_eq!(
            Record::parse(b"x", &t.replace("state=incomplete\n", "")),
            None
        );
    }

    #[test]
    fn records_dir_write_list() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ReceiveDir::open(tmp.path()).unwrap();
        let mut recs = Records::open(&dir).unwrap();
        assert!(recs.list().unwrap().is_empty());
        let mut r = Record {
            name: b"a".to_vec(),
            uuid: Uuid([2; 16]),
            ctransid: 9,
            parent: None,
            state: State::Incomplete,
        };
        recs.write(&dir, &r).unwrap();
        r.state = State::Complete;
        recs.write(&dir, &r).unwrap();
        let recs = Records::open(&dir).unwrap();
        assert_eq!(recs.list().unwrap(), vec![r]);
        let text = std::fs::read_to_string(tmp.path().join(".btrsend/a.subvol")).unwrap();
        assert!(text.ends_with("state=complete\n"));
    }
}
