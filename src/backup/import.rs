//! `backup import`: existing send-stream files (raw or zstd) stored as
//! entries, parents before their children, whatever the order given.
//!
//! Each file is read whole first (one stream, every command decoded); a
//! file that is not a usable stream is a failure of its own and is never
//! stored.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use stream_format::{Command, ReaderOptions, StreamReader};

use super::catalog::{Catalog, Entry, Kind};
use super::error::BackupError;
use super::file::{FileWriter, StreamIdentity, WriterOptions};
use super::index::IndexTee;
use super::lock::LockKind;
use super::plan;
use super::repository::{Repository, now_rfc3339};
use crate::progress::Progress;

/// How to import.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ImportOptions {
    /// The entries' time (RFC 3339); default: each file's mtime.
    pub time: Option<jiff::Timestamp>,
    /// The origin the entries belong to; default `imported`.
    pub origin: Option<String>,
    /// Wait this long for the lock.
    pub wait_lock: Duration,
    /// The stream files' zstd level (default 3).
    pub level: Option<i32>,
}

/// What an import found in one file.
struct Parsed {
    file: PathBuf,
    name: String,
    uuid: String,
    ctransid: u64,
    parent: Option<(String, u64)>,
    mtime: Option<jiff::Timestamp>,
}

/// Open a stream file given to import: raw, or zstd-compressed.
fn open_input(path: &Path) -> Result<Box<dyn Read>, BackupError> {
    let io_err = |e| BackupError::Io {
        what: format!("cannot read {}", path.display()),
        error: e,
    };
    let mut f = std::fs::File::open(path).map_err(io_err)?;
    let mut magic = [0u8; 4];
    let n = f.read(&mut magic).map_err(io_err)?;
    use std::io::Seek;
    f.rewind().map_err(io_err)?;
    let f = io::BufReader::with_capacity(1 << 20, f);
    if n == 4 && u32::from_le_bytes(magic) == 0xFD2F_B528 {
        Ok(Box::new(
            zstd::stream::read::Decoder::with_buffer(f).map_err(io_err)?,
        ))
    } else {
        Ok(Box::new(f))
    }
}

fn parse_import(path: &Path) -> Result<Parsed, BackupError> {
    let name = path.display().to_string();
    let bad = |what: String| BackupError::Import {
        file: name.clone(),
        what,
    };
    let mut r =
        StreamReader::with_options(open_input(path)?, ReaderOptions::new().with_max_version(3));
    let first = match r.next_command() {
        Ok(Some((
            _,
            Command::Subvol {
                path,
                uuid,
                ctransid,
            },
        ))) => (
            String::from_utf8_lossy(&path).into_owned(),
            uuid,
            ctransid,
            None,
        ),
        Ok(Some((
            _,
            Command::Snapshot {
                path,
                uuid,
                ctransid,
                clone_uuid,
                clone_ctransid,
            },
        ))) => (
            String::from_utf8_lossy(&path).into_owned(),
            uuid,
            ctransid,
            Some((
                uuid::Uuid::from_bytes(clone_uuid).hyphenated().to_string(),
                clone_ctransid,
            )),
        ),
        Ok(Some((info, _))) => {
            return Err(bad(format!(
                "the stream does not start with SUBVOL or SNAPSHOT ({info})"
            )));
        }
        Ok(None) => return Err(bad(String::from("empty stream"))),
        Err(e) => return Err(bad(format!("not a send stream: {e}"))),
    };
    loop {
        match r.next_raw() {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => return Err(bad(format!("damaged send stream: {e}"))),
        }
    }
    if r.streams() != 1 {
        return Err(bad(format!(
            "holds {} concatenated streams; import takes one stream per file",
            r.streams()
        )));
    }
    let mtime = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| jiff::Timestamp::try_from(t).ok());
    Ok(Parsed {
        file: path.to_path_buf(),
        name: first.0,
        uuid: uuid::Uuid::from_bytes(first.1).hyphenated().to_string(),
        ctransid: first.2,
        parent: first.3,
        mtime,
    })
}

/// What an import did.
#[derive(Debug, Default)]
pub struct ImportReport {
    /// Entries stored.
    pub stored: Vec<Entry>,
    /// Why each full stream stored is full, by entry id.
    pub full_reasons: BTreeMap<u64, plan::FullReason>,
    /// Files whose stream was stored already: (file, entry id).
    pub skipped: Vec<(String, u64)>,
    /// Files that failed.
    pub failed: Vec<(String, BackupError)>,
}

impl Repository {
    /// Store existing send-stream files (raw or zstd) as entries; parents
    /// come from the streams' SNAPSHOT commands (in the repository, or
    /// among the files, in any order).
    ///
    /// # Errors
    ///
    /// Lock and catalog errors; per-file failures are in the report.
    pub fn import(
        &self,
        files: &[PathBuf],
        opts: &ImportOptions,
        progress: &dyn Progress,
    ) -> Result<ImportReport, BackupError> {
        let _lock = self.lock(LockKind::Exclusive, opts.wait_lock, progress)?;
        let mut cat = self.catalog()?;
        // A run's partial stream files stay for the next run, unless their
        // snapshot is stored.
        self.clean_leftovers(&cat, &|u, c| cat.find(u, c).is_none(), progress)?;
        let mut report = ImportReport::default();
        let mut todo = Vec::new();
        for f in files {
            match parse_import(f) {
                Ok(p) => todo.push(p),
                Err(e) => {
                    progress.failed(&f.display().to_string(), &e);
                    report.failed.push((f.display().to_string(), e));
                }
            }
        }
        // Parents first: repeat while something could be placed.
        while !todo.is_empty() {
            let before = todo.len();
            let mut rest = Vec::new();
            for p in todo {
                let fname = p.file.display().to_string();
                if let Some(e) = cat.find(&p.uuid, p.ctransid) {
                    progress.skipped(&fname, e);
                    report.skipped.push((fname, e.id));
                    continue;
                }
                let parent = match &p.parent {
                    None => None,
                    Some((u, c)) => match cat.find(u, *c) {
                        Some(e) => Some(e.clone()),
                        None => {
                            rest.push(p);
                            continue;
                        }
                    },
                };
                match self.import_one(&mut cat, &p, parent.as_ref(), opts, &|w| {
                    progress.warning(w)
                }) {
                    Ok(e) => {
                        progress.stored(&e);
                        report.stored.push(e);
                    }
                    Err(e) => {
                        progress.failed(&fname, &e);
                        report.failed.push((fname, e));
                    }
                }
            }
            if rest.len() == before {
                for p in rest {
                    let (u, c) = p.parent.clone().unwrap_or_default();
                    let e = BackupError::Import {
                        file: p.file.display().to_string(),
                        what: format!(
                            "an incremental stream whose parent (uuid {u} ctransid {c}) is neither in the repository nor among the files"
                        ),
                    };
                    progress.failed(&p.file.display().to_string(), &e);
                    report.failed.push((p.file.display().to_string(), e));
                }
                break;
            }
            todo = rest;
        }
        Ok(report)
    }

    fn import_one(
        &self,
        cat: &mut Catalog,
        p: &Parsed,
        parent: Option<&Entry>,
        opts: &ImportOptions,
        warn: &dyn Fn(&str),
    ) -> Result<Entry, BackupError> {
        let key = super::new_stream_key(&p.uuid, p.ctransid);
        let upload = self.store.multipart(&key)?;
        let wopts = WriterOptions::new().with_level(opts.level.unwrap_or(3));
        let mut index = self.inline_index(cat, &key, parent);
        let mut writer = IndexTee {
            inner: FileWriter::new(upload, wopts),
            index: index.as_mut(),
        };
        let mut input = open_input(&p.file)?;
        io::copy(&mut input, &mut writer).map_err(|e| BackupError::Io {
            what: format!("cannot import {}", p.file.display()),
            error: e,
        })?;
        let writer = writer.inner;
        let (trailer, size) = writer.finish(StreamIdentity {
            uuid: p.uuid.clone(),
            ctransid: p.ctransid,
            parent: p.parent.clone(),
        })?;
        let time = opts
            .time
            .or(p.mtime)
            .unwrap_or_else(jiff::Timestamp::now)
            .to_string();
        let entry = Entry {
            id: 0,
            path: p.name.clone(),
            uuid: p.uuid.clone(),
            ctransid: p.ctransid,
            parent_uuid: p.parent.as_ref().map(|x| x.0.clone()),
            parent_ctransid: p.parent.as_ref().map(|x| x.1),
            parent_id: parent.map(|e| e.id),
            kind: if p.parent.is_some() {
                Kind::Incremental
            } else {
                Kind::Full
            },
            time,
            origin: opts
                .origin
                .clone()
                .unwrap_or_else(|| String::from("imported")),
            file: key,
            stream_bytes: trailer.stream_bytes,
            stored_bytes: size,
            stream_blake3: trailer.stream_blake3,
            commands: trailer.commands,
            proto: trailer.proto,
            stored_at: now_rfc3339(),
            synthesized_from: None,
        };
        self.record_inline_index(&entry, index, warn);
        let mut next = cat.clone();
        let id = next.add(entry);
        next.commit(&*self.store)?;
        *cat = next;
        cat.get(id)
            .cloned()
            .ok_or_else(|| BackupError::Invalid(String::from("entry vanished")))
    }
}
