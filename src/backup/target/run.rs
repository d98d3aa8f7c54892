//! `backup run --target`: receive each selected snapshot that the target
//! does not have yet, oldest first, incremental from the newest snapshot
//! of its origin present on both sides.
//!
//! The snapshots are found as for a repository ([`select`]), with "stored"
//! meaning "received completely by the target"; `--snapshot` takes and
//! prunes source snapshots the same way, its holds naming what the
//! target's next incremental needs.

use std::collections::BTreeSet;
use std::io::Write;

use super::{Received, TargetEnd, check_name};
use crate::backup::catalog::Kind;
use crate::backup::error::BackupError;
use crate::backup::run::select::{Selected, Sources, origin_of, select, stream_uuid};
use crate::backup::run::snapshot_dir::{prune_snapshots, take_snapshots, write_holds};
use crate::backup::run::{Counted, RunOptions, RunReport};
use crate::fs::subvol::Subvolume;
use crate::progress::Progress;
use crate::send::mounted::Request;
use crate::send::{SendError, SendOptions};

/// A snapshot the target received in this run.
#[derive(Debug, Clone)]
pub struct TargetStored {
    /// The snapshot's path (as the source names it).
    pub path: String,
    /// Its name in the target directory.
    pub name: String,
    /// Its UUID (the received UUID it has on the target).
    pub uuid: String,
    /// Its ctransid.
    pub ctransid: u64,
    /// Full or incremental.
    pub kind: Kind,
    /// The parent's path on the source, for an incremental stream.
    pub parent: Option<String>,
    /// Bytes of stream sent by this run.
    pub sent_bytes: u64,
    /// Where this run continued an interrupted receive: the offset in the
    /// stream its resume point was at (`None`: the whole stream sent).
    pub resumed_from: Option<u64>,
}

/// What a run into a target did.
#[derive(Debug, Default)]
pub struct TargetReport {
    /// Snapshots received.
    pub received: Vec<TargetStored>,
    /// Snapshots the target had already (path, name there).
    pub skipped: Vec<(String, String)>,
    /// Snapshots that failed.
    pub failed: Vec<(String, BackupError)>,
    /// What `--snapshot` did on the source: taken, unchanged, pruned,
    /// failed (the other fields stay empty).
    pub source: RunReport,
}

/// The snapshots a target has received completely, by (UUID, ctransid).
fn present(list: &[Received]) -> BTreeSet<(String, u64)> {
    list.iter()
        .filter(|r| r.complete)
        .filter_map(|r| Some((r.received_uuid.clone()?, r.stransid)))
        .collect()
}

/// The name a snapshot gets in the target directory: its own.
fn name_of(sel: &Selected) -> Result<String, BackupError> {
    let name = sel.path.rsplit('/').find(|c| !c.is_empty()).unwrap_or("");
    check_name(name)
        .map_err(|why| BackupError::Invalid(format!("{}: {why} for the target", sel.path)))?;
    Ok(name.to_owned())
}

/// Receive the snapshots `specs` (and `--snapshot`'s) into `target`.
/// `holder` names the target in the snapshot directory's holds (an id
/// and the target as the user named it).
///
/// # Errors
///
/// Errors before any snapshot is tried (the source, the target's
/// listing); per-snapshot failures are in [`TargetReport::failed`].
pub fn run(
    target: &mut dyn TargetEnd,
    holder: (&str, &str),
    specs: &[String],
    opts: &RunOptions,
    progress: &dyn Progress,
) -> Result<TargetReport, BackupError> {
    target.lock(opts.wait_lock)?;
    let mut report = TargetReport::default();
    let mut found = match &opts.snapshots {
        Some(so) => take_snapshots(so, &mut report.source, progress)?,
        None => Vec::new(),
    };
    let mut listed = target.list()?;
    let mut have = present(&listed);
    let is_there =
        |have: &BTreeSet<(String, u64)>, u: &str, c: u64| have.contains(&(u.to_owned(), c));
    let mut src = select(opts, specs, &mut found, &|u, c| is_there(&have, u, c))?;
    for (path, err) in std::mem::take(&mut src.rejected) {
        progress.failed(&path, &err);
        report.failed.push((path, err));
    }
    let selected = src.take_oldest_first();
    for sel in &selected {
        let uuid = stream_uuid(&sel.subvol);
        let ctransid = sel.subvol.root.ctransid.get();
        if let Some(r) = listed.iter().find(|r| {
            r.complete
                && r.received_uuid.as_deref() == Some(uuid.as_str())
                && r.stransid == ctransid
        }) {
            report.skipped.push((sel.path.clone(), r.name.clone()));
            continue;
        }
        match receive_one(target, &mut src, sel, &have, &listed, progress) {
            Ok(done) => {
                have.insert((done.uuid.clone(), done.ctransid));
                report.received.push(done);
            }
            Err(err) => {
                progress.failed(&sel.path, &err);
                report.failed.push((sel.path.clone(), err));
            }
        }
        // What the target has now (a failure may have left a partial).
        match target.list() {
            Ok(l) => listed = l,
            Err(e) => {
                // Without the listing the next snapshots cannot be placed.
                progress.failed(target.name(), &e);
                report.failed.push((target.name().to_owned(), e));
                return Ok(report);
            }
        }
    }
    if let Some(so) = &opts.snapshots {
        let stored = |u: &str, c: u64| is_there(&have, u, c);
        write_holds(holder, so, &found, &stored, progress);
        if let Some(keep) = so.keep {
            prune_snapshots(so, keep, &found, &stored, &mut report.source, progress);
        }
    }
    Ok(report)
}

/// The parent for `sel`: the newest snapshot of the same origin, older
/// than `sel`, that the target has.
fn pick_parent<'s>(
    src: &'s Sources,
    sel: &Selected,
    have: &BTreeSet<(String, u64)>,
) -> Option<&'s Subvolume> {
    let origin = origin_of(&sel.subvol);
    src.subvols[sel.fs]
        .iter()
        .filter(|s| s.id() != sel.subvol.id())
        .filter(|s| origin_of(s) == origin)
        .filter(|s| {
            (s.root.otransid.get(), s.root.ctransid.get())
                < (
                    sel.subvol.root.otransid.get(),
                    sel.subvol.root.ctransid.get(),
                )
        })
        .filter(|s| have.contains(&(stream_uuid(s), s.root.ctransid.get())))
        .max_by_key(|s| (s.root.otransid.get(), s.root.ctransid.get(), s.id().get()))
}

fn receive_one(
    target: &mut dyn TargetEnd,
    src: &mut Sources,
    sel: &Selected,
    have: &BTreeSet<(String, u64)>,
    listed: &[Received],
    progress: &dyn Progress,
) -> Result<TargetStored, BackupError> {
    let name = name_of(sel)?;
    let uuid = stream_uuid(&sel.subvol);
    let ctransid = sel.subvol.root.ctransid.get();
    let parent = pick_parent(src, sel, have).cloned();
    let kind = if parent.is_some() {
        Kind::Incremental
    } else {
        Kind::Full
    };
    // A partial of this name: continue it, or remove it and start over.
    let mut token = None;
    if let Some(r) = listed.iter().find(|r| r.name == name) {
        if r.complete {
            return Err(BackupError::Invalid(format!(
                "{}/{name} exists on the target and is another snapshot (received UUID {}, stransid {}): rename or delete it",
                target.name(),
                r.received_uuid.as_deref().unwrap_or("-"),
                r.stransid
            )));
        }
        token = target.resume_token(&name)?;
        if token.is_none() {
            progress.notice(&format!(
                "{}/{name}: an interrupted receive with no resume point; receiving it again",
                target.name()
            ));
            target.discard(&name)?;
        }
    }
    let subvol = format!("id:{}", sel.subvol.id().get());
    let parent_spec = parent.as_ref().map(|p| format!("id:{}", p.id().get()));
    let req = Request {
        subvol: &subvol,
        parent: parent_spec.as_deref(),
        clone_sources: &[],
    };
    progress.start(&sel.path, kind, 0);
    let source = &mut src.fss[sel.fs];
    let sent = match send_into(target, source, &req, sel, token.as_ref(), progress) {
        Err(BackupError::Send { error, .. })
            if token.is_some() && matches!(*error, SendError::ResumeMismatch(_)) =>
        {
            // The partial is of another send (parent, options): start over.
            progress.notice(&format!(
                "{}/{name}: the interrupted receive cannot be continued by this send ({error}); receiving it again",
                target.name()
            ));
            target.discard(&name)?;
            token = None;
            send_into(target, source, &req, sel, None, progress)?
        }
        other => other?,
    };
    Ok(TargetStored {
        path: sel.path.clone(),
        name,
        uuid,
        ctransid,
        kind,
        parent: parent.map(|p| String::from_utf8_lossy(&p.path).into_owned()),
        sent_bytes: sent,
        resumed_from: token.map(|t| t.offset),
    })
}

/// Send `req` (from `token`'s point, when given) into `target`; the
/// bytes sent.
fn send_into(
    target: &mut dyn TargetEnd,
    source: &mut crate::send::mounted::Source,
    req: &Request<'_>,
    sel: &Selected,
    token: Option<&crate::resume::Token>,
    progress: &dyn Progress,
) -> Result<u64, BackupError> {
    let mut sent = 0;
    target.receive(&mut |w: &mut dyn Write| {
        let counted = Counted {
            inner: CountBytes { inner: w, n: 0 },
            progress,
        };
        let (out, _stats) = source
            .send_from(req, counted, SendOptions::new(1), token, progress)
            .map_err(|error| BackupError::Send {
                snapshot: sel.path.clone(),
                error: Box::new(error),
            })?;
        sent = out.inner.n;
        Ok(())
    })?;
    Ok(sent)
}

/// A writer that counts what it passes on.
struct CountBytes<'w> {
    inner: &'w mut dyn Write,
    n: u64,
}

impl Write for CountBytes<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
