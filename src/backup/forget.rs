//! `backup forget`: apply a retention policy ([`retention`]) to the
//! catalog and delete what it does not keep.
//!
//! Under the exclusive lock: the catalog is read, [`retention::plan`]
//! decides, and [`Catalog::remove_entries`] stores the catalog without the
//! deleted entries in one atomic replace before their stream files are
//! deleted, children before parents. A crash at any point leaves either the
//! old catalog (nothing deleted) or the new one (with at most stream files
//! no entry names, which `verify` reports and the next `run` removes):
//! never a kept entry whose chain is broken.

use std::time::Duration;

use jiff::Timestamp;
use jiff::tz::TimeZone;
use serde::Serialize;

use super::retention::{self, Candidate, Policy, RetentionError};
use super::{BackupError, Catalog, Entry, LockKind, Repository};
use crate::progress::Progress;

/// How `forget` runs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ForgetOptions {
    /// Decide and report, delete nothing.
    pub dry_run: bool,
    /// How long to wait for a held lock.
    pub wait_lock: Duration,
    /// The present: entries after it are never deleted.
    pub now: Timestamp,
    /// The time zone of the periods (hours, days, weeks, …).
    pub tz: TimeZone,
}

impl ForgetOptions {
    /// Now, in the local time zone (`TZ`), deleting, no wait for the lock.
    pub fn new() -> ForgetOptions {
        ForgetOptions {
            dry_run: false,
            wait_lock: Duration::ZERO,
            now: Timestamp::now(),
            tz: TimeZone::system(),
        }
    }

    /// Decide and report only.
    pub fn with_dry_run(mut self, dry_run: bool) -> ForgetOptions {
        self.dry_run = dry_run;
        self
    }

    /// Wait up to `wait` for a held lock.
    pub fn with_wait_lock(mut self, wait: Duration) -> ForgetOptions {
        self.wait_lock = wait;
        self
    }
}

impl Default for ForgetOptions {
    fn default() -> ForgetOptions {
        ForgetOptions::new()
    }
}

/// What `forget` decided for one entry.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// The entry (as it was in the catalog).
    pub entry: Entry,
    /// Kept, or deleted (or to delete, in a dry run).
    pub keep: bool,
    /// Why it is kept: `last`, `daily`, `oldest weekly`, `within 7d`,
    /// `newer than now`, `parent of 12`, …
    pub reasons: Vec<String>,
    /// Kept only because kept entries' chains need it (every reason is
    /// `parent of …`): the policy alone would delete it.
    pub kept_for_chain: bool,
}

/// The outcome of `forget`.
#[derive(Debug, Clone, Serialize)]
pub struct ForgetReport {
    /// One verdict per entry: origins in name order, each newest first.
    pub verdicts: Vec<Verdict>,
    /// The deleted entries' ids, in the order they went (children before
    /// parents); in a dry run, the order they would go in.
    pub deleted: Vec<u64>,
    /// Whether this was a dry run (nothing deleted).
    pub dry_run: bool,
    /// The entries kept only for kept entries' chains
    /// ([`Verdict::kept_for_chain`]): how many, and their stream files'
    /// bytes, which this policy could not free.
    pub chain_held: ChainHeld,
}

/// What the policy would drop but the chains of kept entries need.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ChainHeld {
    /// Entries.
    pub entries: usize,
    /// The sum of their `stored_bytes`.
    pub stored_bytes: u64,
}

impl ChainHeld {
    /// Why these entries stay and what frees them, for people (empty when
    /// there are none).
    pub fn explain(&self) -> String {
        if self.entries == 0 {
            return String::new();
        }
        format!(
            "{} {} ({} bytes) the policy would drop {} kept because kept incremental entries are based on them: a chain is freed only once a newer full stream starts the next one (backup run --full-every-days D, default {}, or --full-every N)",
            self.entries,
            if self.entries == 1 {
                "entry"
            } else {
                "entries"
            },
            self.stored_bytes,
            if self.entries == 1 { "is" } else { "are" },
            super::plan::DEFAULT_FULL_EVERY_DAYS,
        )
    }
}

impl Repository {
    /// Apply `policy` (see [`retention`]) and, unless a dry run, delete
    /// the entries it does not keep.
    ///
    /// # Errors
    ///
    /// [`BackupError::Invalid`] for an empty policy or a catalog retention
    /// cannot plan for (an unreadable time, parent links in a cycle); lock,
    /// catalog and store errors.
    pub fn forget(
        &self,
        policy: &Policy,
        opts: &ForgetOptions,
        progress: &dyn Progress,
    ) -> Result<ForgetReport, BackupError> {
        if policy.is_empty() {
            return Err(BackupError::Invalid(
                RetentionError::<u64>::EmptyPolicy.to_string(),
            ));
        }
        if !opts.dry_run && self.store().append_only() {
            return Err(BackupError::Invalid(format!(
                "{} is served append-only: nothing stored there can be deleted from \
                 here; prune on the server (btrsend backup forget --repo PATH, from \
                 its own cron) or through an unrestricted key (--dry-run shows the plan)",
                self.store().name()
            )));
        }
        // A dry run deletes nothing and reads one catalog generation, which
        // is replaced atomically: it takes no lock, so it never waits for a
        // run.
        let _lock = if opts.dry_run {
            None
        } else {
            Some(self.lock(LockKind::Exclusive, opts.wait_lock, progress)?)
        };
        let mut catalog = self.catalog()?;
        let plan = plan(&catalog, policy, opts, self.store().name())?;
        if !opts.dry_run && !plan.delete_order.is_empty() {
            // Deleting by links the streams do not confirm could take the
            // parent of a kept entry.
            self.check_structure(&catalog)?;
        }
        if !opts.dry_run {
            if !plan.delete_order.is_empty() {
                catalog.remove_entries(&**self.store(), &plan.delete_order)?;
            }
            // Stream files of entries that an interrupted forget (or run)
            // had already dropped from the catalog.
            // A run's partial stream files stay for the next run, unless
            // their snapshot is stored.
            self.clean_leftovers(&catalog, &|u, c| catalog.find(u, c).is_none(), progress)?;
            // The indexes of the deleted entries, and the pages only they
            // used.
            if let Some(why) = self
                .sweep_indexes(&catalog, !plan.delete_order.is_empty())?
                .skipped
            {
                progress.warning(&why);
            }
        }
        let chain_held =
            plan.verdicts
                .iter()
                .filter(|v| v.kept_for_chain)
                .fold(ChainHeld::default(), |h, v| ChainHeld {
                    entries: h.entries + 1,
                    stored_bytes: h.stored_bytes.saturating_add(v.entry.stored_bytes),
                });
        Ok(ForgetReport {
            chain_held,
            verdicts: plan.verdicts,
            deleted: plan.delete_order,
            dry_run: opts.dry_run,
        })
    }
}

struct Planned {
    verdicts: Vec<Verdict>,
    delete_order: Vec<u64>,
}

/// [`retention::plan`] over the catalog's entries.
fn plan(
    catalog: &Catalog,
    policy: &Policy,
    opts: &ForgetOptions,
    repo: &str,
) -> Result<Planned, BackupError> {
    let invalid = |what: String| BackupError::Invalid(format!("{repo}: {what}"));
    let candidates = catalog
        .entries
        .iter()
        .map(|e| {
            let time = e.timestamp().ok_or_else(|| {
                invalid(format!(
                    "catalog entry {} has an unreadable time {:?}",
                    e.id, e.time
                ))
            })?;
            Ok(Candidate {
                id: e.id,
                origin: e.origin.clone(),
                time,
                parent: e.parent_id,
            })
        })
        .collect::<Result<Vec<_>, BackupError>>()?;
    let plan = retention::plan(&candidates, policy, opts.now, &opts.tz)
        .map_err(|e| invalid(e.to_string()))?;
    let verdicts = plan
        .decisions
        .into_iter()
        .filter_map(|d| {
            let entry = catalog.get(d.id)?.clone();
            Some(Verdict {
                entry,
                kept_for_chain: d.kept_only_for_chain(),
                keep: d.keep,
                reasons: d.reasons.iter().map(ToString::to_string).collect(),
            })
        })
        .collect();
    Ok(Planned {
        verdicts,
        delete_order: plan.delete_order,
    })
}
