//! `backup forget --target`: the retention policy applied to the received
//! subvolumes of a target, group by group ([`group_of`]), on their times
//! ([`time_of`]).
//!
//! Received subvolumes do not depend on each other (each is a whole
//! tree), so no chain keeps any; but the newest of each group is always
//! kept: it is what the next `run`'s incremental stream is received
//! onto (the newest snapshot both sides have), and losing it would make
//! that stream a full one. Partial receives are left to `run`, and a
//! subvolume whose time cannot be told is kept.

use std::collections::BTreeMap;

use super::{Received, TargetEnd, group_of, time_of};
use crate::backup::error::BackupError;
use crate::backup::forget::ForgetOptions;
use crate::backup::retention::{self, Candidate, Policy};

/// What forget decided for one subvolume of the target.
#[derive(Debug, Clone)]
pub struct TargetVerdict {
    /// The subvolume.
    pub received: Received,
    /// The group its retention counts in.
    pub group: String,
    /// Its time, when known.
    pub time: Option<jiff::Timestamp>,
    /// Kept (else deleted, or to delete in a dry run).
    pub keep: bool,
    /// Why it is kept.
    pub reasons: Vec<String>,
}

/// What forget did.
#[derive(Debug, Default)]
pub struct TargetForget {
    /// One verdict per subvolume: groups in name order, newest first.
    pub verdicts: Vec<TargetVerdict>,
    /// Subvolumes that could not be deleted (name, why).
    pub failed: Vec<(String, BackupError)>,
}

/// Apply `policy` to `target`'s received subvolumes and delete what it
/// does not keep (nothing with [`ForgetOptions::dry_run`]).
///
/// # Errors
///
/// An empty policy, or a listing that cannot be read; deletions that
/// fail are in [`TargetForget::failed`].
pub fn forget(
    target: &mut dyn TargetEnd,
    policy: &Policy,
    opts: &ForgetOptions,
) -> Result<TargetForget, BackupError> {
    if target.append_only() && !opts.dry_run {
        return Err(BackupError::Invalid(format!(
            "{} is served append-only: it refuses deletions; prune on the server (backup forget --target DIR there), or with an unrestricted key",
            target.name()
        )));
    }
    if !opts.dry_run {
        target.lock(opts.wait_lock)?;
    }
    let listed = target.list()?;
    let mut cands = Vec::new();
    let mut verdicts: BTreeMap<String, TargetVerdict> = BTreeMap::new();
    for r in &listed {
        let time = time_of(r);
        let mut v = TargetVerdict {
            received: r.clone(),
            group: group_of(&r.name).to_owned(),
            time,
            keep: true,
            reasons: Vec::new(),
        };
        match (r.complete, time) {
            (false, _) => v
                .reasons
                .push("partial receive: backup run continues it".into()),
            (true, None) => v.reasons.push("its time is unknown".into()),
            (true, Some(t)) => cands.push(Candidate {
                id: r.name.clone(),
                origin: v.group.clone(),
                time: t,
                parent: None,
            }),
        }
        verdicts.insert(r.name.clone(), v);
    }
    let plan = retention::plan(&cands, policy, opts.now, &opts.tz)
        .map_err(|e| BackupError::Invalid(e.to_string()))?;
    for d in &plan.decisions {
        if let Some(v) = verdicts.get_mut(&d.id) {
            v.keep = d.keep;
            v.reasons = d.reasons.iter().map(ToString::to_string).collect();
        }
    }
    // The newest complete subvolume of each group: the next parent.
    let mut newest: BTreeMap<&str, (&jiff::Timestamp, u64, &str)> = BTreeMap::new();
    for c in &cands {
        let stransid = verdicts.get(&c.id).map_or(0, |v| v.received.stransid);
        let e = newest
            .entry(c.origin.as_str())
            .or_insert((&c.time, stransid, &c.id));
        if (&c.time, stransid) > (e.0, e.1) {
            *e = (&c.time, stransid, &c.id);
        }
    }
    let newest: Vec<String> = newest.values().map(|(_, _, n)| (*n).to_owned()).collect();
    for n in newest {
        if let Some(v) = verdicts.get_mut(&n) {
            v.keep = true;
            v.reasons
                .push("newest: the next incremental's parent".into());
        }
    }
    let mut out = TargetForget::default();
    let mut ordered: Vec<TargetVerdict> = verdicts.into_values().collect();
    ordered.sort_by(|a, b| {
        a.group
            .cmp(&b.group)
            .then_with(|| b.time.cmp(&a.time))
            .then_with(|| b.received.stransid.cmp(&a.received.stransid))
    });
    if !opts.dry_run {
        for v in &ordered {
            if v.keep {
                continue;
            }
            if let Err(e) = target.delete(&v.received.name) {
                out.failed.push((v.received.name.clone(), e));
            }
        }
    }
    out.verdicts = ordered;
    Ok(out)
}
