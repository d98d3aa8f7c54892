//! The snapshot directory of `backup run --snapshot`: taking a read-only
//! snapshot of each subvolume (unless it has not changed), recording what
//! this repository's next incremental streams need ([`holds`]), and pruning
//! the snapshots btrsend took beyond `--keep-snapshots`.
//!
//! Which snapshot to delete is decided by
//! [`snapshots::prune_plan`](crate::backup::snapshots::prune_plan); this
//! module applies it and reports. It must never delete a snapshot it did
//! not take, nor one a hold record names.

use std::collections::BTreeSet;

use crate::backup::error::BackupError;
use crate::backup::{holds, snapshots};
use crate::progress::Progress;

use super::select::{Found, IsStored, stream_uuid};
use super::{RunReport, SnapshotOptions};

/// Take a read-only snapshot of each subvolume (`--snapshot`), then find
/// the snapshots of each in the snapshot directory. A snapshot that cannot
/// be taken is a failure of its own; the others proceed.
pub(crate) fn take_snapshots(
    so: &SnapshotOptions,
    report: &mut RunReport,
    progress: &dyn Progress,
) -> Result<Vec<Found>, BackupError> {
    let now = jiff::Timestamp::now();
    for subvol in &so.subvols {
        match snapshots::newest_taken(subvol, &so.dir) {
            Ok(Some(name)) => {
                let snap = so.dir.join(name);
                progress.unchanged(subvol, &snap);
                report.unchanged.push((subvol.clone(), snap));
                continue;
            }
            Ok(None) => {}
            Err(e) => {
                progress.failed(&subvol.display().to_string(), &e);
                report.snapshot_failed.push((subvol.clone(), e));
                continue;
            }
        }
        match snapshots::take(subvol, &so.dir, now) {
            Ok(path) => {
                progress.notice(&format!("took the snapshot {}", path.display()));
                report.taken.push(path);
            }
            Err(e) => {
                progress.failed(&subvol.display().to_string(), &e);
                report.snapshot_failed.push((subvol.clone(), e));
            }
        }
    }
    // The directory once, with every new snapshot in it.
    let paths: Vec<String> = snapshots::subvolumes_in(&so.dir)?
        .into_iter()
        .map(|n| so.dir.join(n).display().to_string())
        .collect();
    Ok(so
        .subvols
        .iter()
        .map(|subvol| Found {
            paths: paths.clone(),
            origin: subvol.clone(),
            snaps: Vec::new(),
        })
        .collect())
}

/// Record, for the other repositories storing from the snapshot
/// directory, the snapshots this one's next incremental streams need: per
/// subvolume, the newest of its snapshots in the directory that is stored
/// (see [`holds`]); the record's time is renewed in any case. A record that cannot be written is a warning: the run
/// stored what it should, but another repository's pruning may now delete
/// this one's next parent.
pub(crate) fn write_holds(
    holder: (&str, &str),
    so: &SnapshotOptions,
    found: &[Found],
    stored: IsStored<'_>,
    progress: &dyn Progress,
) {
    let mut subvols = BTreeSet::new();
    let mut held = Vec::new();
    for f in found {
        let base = snapshots::base_name(&f.origin);
        let newest = f
            .snaps
            .iter()
            .filter(|(_, s)| stored(&stream_uuid(s), s.root.ctransid.get()))
            .max_by_key(|(name, s)| (s.root.otransid.get(), name.clone()));
        // Without one (nothing stored yet, or the source could not be
        // read this time) the record keeps what it held for the subvolume.
        if let Some((name, _)) = newest {
            held.push(holds::Held {
                subvolume: base.clone(),
                snapshot: name.clone(),
            });
            subvols.insert(base);
        }
    }
    if let Err(e) = holds::write(&so.dir, holder.0, holder.1, &subvols, &held) {
        progress.warning(&format!(
            "{e}: another repository's --keep-snapshots may delete the snapshot this one's next incremental stream needs"
        ));
    }
}

/// Delete the source snapshots btrsend took beyond the newest `keep`
/// (see [`snapshots::prune_plan`]), but none a hold record names.
pub(crate) fn prune_snapshots(
    so: &SnapshotOptions,
    keep: usize,
    found: &[Found],
    stored: IsStored<'_>,
    report: &mut RunReport,
    progress: &dyn Progress,
) {
    let records = match holds::read_all(&so.dir) {
        Ok((records, warnings)) => {
            for w in warnings {
                progress.warning(&w);
            }
            records
        }
        Err(e) => {
            // Without the records nothing is known to be free: prune
            // nothing this time.
            progress.failed(&so.dir.display().to_string(), &e);
            report.snapshot_failed.push((so.dir.clone(), e));
            return;
        }
    };
    let held = holds::held_names(&records);
    let now = jiff::Timestamp::now();
    for f in found {
        let base = snapshots::base_name(&f.origin);
        let cands: Vec<snapshots::Candidate> = f
            .snaps
            .iter()
            .map(|(name, s)| snapshots::Candidate {
                taken: snapshots::parse_snapshot_seq(&base, name),
                name: name.clone(),
                otransid: s.root.otransid.get(),
                stored: stored(&stream_uuid(s), s.root.ctransid.get()),
                held: held.contains(name),
            })
            .collect();
        for (c, v) in cands.iter().zip(snapshots::prune_plan(&cands, keep)) {
            if v == snapshots::PruneVerdict::KeepHeld {
                // A record nobody updates holds its snapshot forever.
                for r in &records {
                    let days = r.record.age_days(now);
                    if days >= holds::STALE_DAYS
                        && r.record.snapshots.iter().any(|h| h.snapshot == c.name)
                    {
                        progress.warning(&format!(
                            "{} is kept for repository {} ({}), whose hold record {} was last updated {days} days ago: delete that file if the repository no longer stores from here",
                            so.dir.join(&c.name).display(),
                            r.record.repo,
                            r.file,
                            so.dir.join(holds::HOLDS_DIR).join(&r.file).display(),
                        ));
                    }
                }
            }
            if v != snapshots::PruneVerdict::Delete {
                continue;
            }
            let path = so.dir.join(&c.name);
            match snapshots::destroy(&so.dir, &c.name) {
                Ok(()) => {
                    progress.notice(&format!("deleted the snapshot {}", path.display()));
                    report.pruned.push(path);
                }
                Err(e) => {
                    progress.failed(&path.display().to_string(), &e);
                    report.snapshot_failed.push((path, e));
                }
            }
        }
    }
}
