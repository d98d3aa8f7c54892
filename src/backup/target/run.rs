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
use crate::backup::run::dry::{DryRunReport, PlannedStream, would_take};
use crate::backup::run::select::{Selected, Sources, origin_of, select, stream_uuid};
use crate::backup::run::snapshot_dir::{prune_snapshots, take_snapshots, write_holds};
use crate::backup::run::{Counted, RunOptions, RunReport, RunSend, room_for};
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

/// The subvolume of the target that is `sel`, received completely.
fn received_as<'l>(listed: &'l [Received], sel: &Selected) -> Option<&'l Received> {
    let uuid = stream_uuid(&sel.subvol);
    let ctransid = sel.subvol.root.ctransid.get();
    listed.iter().find(|r| {
        r.complete && r.received_uuid.as_deref() == Some(uuid.as_str()) && r.stransid == ctransid
    })
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
    // A local target needs the sizes for its room check: a full disk found
    // halfway leaves a partial subvolume and wasted hours.
    let free = if opts.space_check {
        target.free_bytes()?
    } else {
        None
    };
    if free.is_some() || progress.wants_total() {
        let sizes: Vec<u64> = plan(&src, &selected, &have)
            .into_iter()
            .flatten()
            .map(|p| p.stream_bytes.unwrap_or(0))
            .collect();
        if let Some(free) = free {
            room_for(target.name(), free, sizes.iter().sum())?;
        }
        if progress.wants_total() {
            progress.plan(sizes.len(), sizes.iter().sum());
        }
    }
    for sel in &selected {
        if let Some(r) = received_as(&listed, sel) {
            report.skipped.push((sel.path.clone(), r.name.clone()));
            continue;
        }
        match receive_one(target, &mut src, sel, &have, &listed, opts, progress) {
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

/// What `run --dry-run --target` finds: the streams a run would send, in
/// order, with their exact sizes, without the lock, the snapshots
/// `--snapshot` would take, or any write; and the refusal a run would meet
/// when a local target's filesystem has no room for the raw streams.
///
/// # Errors
///
/// As [`run`] before any snapshot is tried (the source, the target's
/// listing); a snapshot whose stream cannot be sized is in
/// [`DryRunReport::failed`].
pub fn dry_run(
    target: &mut dyn TargetEnd,
    specs: &[String],
    opts: &RunOptions,
) -> Result<DryRunReport, BackupError> {
    let mut report = DryRunReport::default();
    let mut found = match &opts.snapshots {
        Some(so) => would_take(so, &mut report)?,
        None => Vec::new(),
    };
    let listed = target.list()?;
    let have = present(&listed);
    let mut src = select(opts, specs, &mut found, &|u, c| {
        have.contains(&(u.to_owned(), c))
    })?;
    report.failed = std::mem::take(&mut src.rejected);
    let selected = src.take_oldest_first();
    for (sel, planned) in selected.iter().zip(plan(&src, &selected, &have)) {
        let Some(p) = planned else {
            if let Some(r) = received_as(&listed, sel) {
                report.received.push((sel.path.clone(), r.name.clone()));
            }
            continue;
        };
        match p.stream_bytes {
            Ok(stream_bytes) => report.streams.push(PlannedStream {
                path: sel.path.clone(),
                uuid: stream_uuid(&sel.subvol),
                ctransid: sel.subvol.root.ctransid.get(),
                kind: if p.parent.is_some() {
                    Kind::Incremental
                } else {
                    Kind::Full
                },
                parent: p
                    .parent
                    .map(|s| (String::from_utf8_lossy(&s.path).into_owned(), None)),
                full_reason: None,
                stream_bytes,
            }),
            Err(e) => report.failed.push((sel.path.clone(), e)),
        }
    }
    let needed = if opts.space_check {
        report.stream_bytes()
    } else {
        0
    };
    if let Some(free) = target.free_bytes()? {
        report.free_bytes = Some(free);
        report.no_room = room_for(target.name(), free, needed).err();
    }
    Ok(report)
}

/// The stream a snapshot is planned as in a target run.
struct Planned {
    /// The parent snapshot of an incremental stream.
    parent: Option<Subvolume>,
    /// Its exact raw size.
    stream_bytes: Result<u64, BackupError>,
}

/// The stream each of `selected` (oldest first) would get as the run
/// sends them, `None` for one the target has: the parent of each is the
/// newest older snapshot of its origin that the target has or that the
/// run sends before it.
fn plan(
    src: &Sources,
    selected: &[Selected],
    have: &BTreeSet<(String, u64)>,
) -> Vec<Option<Planned>> {
    let mut have = have.clone();
    let mut out = Vec::with_capacity(selected.len());
    for sel in selected {
        let key = (stream_uuid(&sel.subvol), sel.subvol.root.ctransid.get());
        if have.contains(&key) {
            out.push(None);
            continue;
        }
        let parent = pick_parent(src, sel, &have).cloned();
        let stream_bytes =
            name_of(sel).and_then(|_| RunSend::new(&sel.subvol, parent.as_ref()).size(src, sel));
        if stream_bytes.is_ok() {
            have.insert(key);
        }
        out.push(Some(Planned {
            parent,
            stream_bytes,
        }));
    }
    out
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
    opts: &RunOptions,
    progress: &dyn Progress,
) -> Result<TargetStored, BackupError> {
    let limit = opts
        .target_rate
        .map(|r| std::sync::Arc::new(crate::rate::RateLimit::new(r)));
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
    let limit = limit.as_ref();
    let sent = match send_into(target, source, &req, sel, token.as_ref(), limit, progress) {
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
            send_into(target, source, &req, sel, None, limit, progress)?
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
    limit: Option<&std::sync::Arc<crate::rate::RateLimit>>,
    progress: &dyn Progress,
) -> Result<u64, BackupError> {
    let mut sent = 0;
    target.receive(&mut |w: &mut dyn Write| {
        let mut limited;
        let w: &mut dyn Write = match limit {
            Some(l) => {
                limited = crate::rate::Limited::new(w, std::sync::Arc::clone(l));
                &mut limited
            }
            None => w,
        };
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
