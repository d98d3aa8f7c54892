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
//!
//! Where the policy keeps an entry whose ancestors it would drop, the
//! oldest such kept entry of each chain gets a synthetic full stream
//! ([`super::synthesize`]), made and proven before the catalog changes;
//! the catalog that names it is the one that drops the ancestors, so the
//! same crash rules hold. Without synthesis (`--no-synthesize`, a key
//! that cannot read the streams, an append-only store) those ancestors
//! are kept for the chain, as [`ChainHeld`] reports.

use std::time::Duration;

use jiff::Timestamp;
use jiff::tz::TimeZone;
use serde::Serialize;

use std::collections::{BTreeMap, BTreeSet};

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
    /// Replace the oldest kept entry of a chain whose ancestors the
    /// policy drops by a synthetic full stream, so they can go.
    pub synthesize: bool,
}

impl ForgetOptions {
    /// Now, in the local time zone (`TZ`), deleting, no wait for the lock.
    pub fn new() -> ForgetOptions {
        ForgetOptions {
            dry_run: false,
            wait_lock: Duration::ZERO,
            now: Timestamp::now(),
            tz: TimeZone::system(),
            synthesize: true,
        }
    }

    /// Synthesize full streams (the default) or keep ancestors for their
    /// chains.
    pub fn with_synthesize(mut self, synthesize: bool) -> ForgetOptions {
        self.synthesize = synthesize;
        self
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
    /// Kept, and its incremental stream is (in a dry run: would be)
    /// replaced by a synthetic full stream so its ancestors can go.
    pub synthesize: bool,
}

/// A synthetic full stream `forget` made (or would make).
#[derive(Debug, Clone, Serialize)]
pub struct SynthesizedEntry {
    /// The entry.
    pub id: u64,
    /// The entries whose streams it is made from, full stream first.
    pub from: Vec<u64>,
    /// The stored bytes of the incremental stream it replaces.
    pub replaced_bytes: u64,
    /// The stored bytes of the new full stream (none in a dry run).
    pub stored_bytes: Option<u64>,
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
    /// The synthetic full streams made (or, in a dry run, to make).
    pub synthesized: Vec<SynthesizedEntry>,
    /// Stored bytes of the stream files deleted (or to delete): the
    /// deleted entries' and the incremental streams replaced.
    pub freed_bytes: u64,
    /// Why no synthetic full stream could be made for entries that needed
    /// one (their ancestors are kept), if so.
    pub synthesis_skipped: Vec<String>,
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
    /// there are none); `synthesized` when this forget made (or would
    /// make) the synthetic full streams it needed, so what stays lies
    /// between entries the policy keeps.
    pub fn explain(&self, synthesized: bool) -> String {
        if self.entries == 0 {
            return String::new();
        }
        let (what, are) = if self.entries == 1 {
            ("entry", "is")
        } else {
            ("entries", "are")
        };
        if synthesized {
            return format!(
                "{} {what} ({} bytes) the policy would drop {are} kept because kept incremental entries are based on them and a kept entry below them is too: a synthetic full stream frees them once the policy drops the entries below them",
                self.entries, self.stored_bytes,
            );
        }
        format!(
            "{} {what} ({} bytes) the policy would drop {are} kept because kept incremental entries are based on them: a chain is freed only once a newer full stream starts the next one (backup run --full-every-days D, default {}, or --full-every N), or by synthetic full streams (forget without --no-synthesize, with a key that reads the streams)",
            self.entries,
            self.stored_bytes,
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
        let mut planned = plan(
            &catalog,
            policy,
            opts,
            self.store().name(),
            &BTreeSet::new(),
        )?;
        let mut skipped = Vec::new();
        let mut wanted = if opts.synthesize {
            synthesis_candidates(&catalog, &planned)
        } else {
            Vec::new()
        };
        if !wanted.is_empty()
            && let Some(why) = self.why_no_synthesis()
        {
            skipped.push(why);
            wanted.clear();
        }
        let cut: BTreeSet<u64> = wanted.iter().copied().collect();
        if !cut.is_empty() {
            planned = plan(&catalog, policy, opts, self.store().name(), &cut)?;
        }
        if !opts.dry_run && !planned.delete_order.is_empty() {
            // Deleting by links the streams do not confirm could take the
            // parent of a kept entry.
            self.check_structure(&catalog)?;
        }
        let mut made = BTreeMap::new();
        if !opts.dry_run && !cut.is_empty() {
            for id in &cut {
                match self.synthesize_full(&catalog, *id, progress) {
                    Ok(s) => {
                        made.insert(*id, s);
                    }
                    Err(e) => {
                        let why = format!(
                            "entry {id} keeps its incremental stream and its ancestors: {e}"
                        );
                        progress.warning(&why);
                        skipped.push(why);
                    }
                }
            }
            if made.len() < cut.len() {
                // Ancestors stay for the entries that kept their chains.
                let done: BTreeSet<u64> = made.keys().copied().collect();
                planned = plan(&catalog, policy, opts, self.store().name(), &done)?;
            }
        }
        let synthesized: Vec<SynthesizedEntry> = if opts.dry_run {
            cut.iter()
                .filter_map(|id| catalog.get(*id))
                .map(|e| SynthesizedEntry {
                    id: e.id,
                    from: catalog
                        .chain(e.id)
                        .map(|c| c.iter().map(|x| x.id).collect())
                        .unwrap_or_default(),
                    replaced_bytes: e.stored_bytes,
                    stored_bytes: None,
                })
                .collect()
        } else {
            made.values()
                .map(|s| SynthesizedEntry {
                    id: s.entry.id,
                    from: s.entry.synthesized_from.clone().unwrap_or_default(),
                    replaced_bytes: s.old.stored_bytes,
                    stored_bytes: Some(s.entry.stored_bytes),
                })
                .collect()
        };
        let freed_bytes = planned
            .delete_order
            .iter()
            .filter_map(|id| catalog.get(*id))
            .chain(synthesized.iter().filter_map(|s| catalog.get(s.id)))
            .map(|e| e.stored_bytes)
            .sum();
        let marked: BTreeSet<u64> = synthesized.iter().map(|s| s.id).collect();
        for v in &mut planned.verdicts {
            v.synthesize = marked.contains(&v.entry.id);
        }
        if !opts.dry_run {
            for s in made.values() {
                catalog = catalog.with_synthesized(s);
            }
            // The synthetic full streams and the deletions go in one
            // generation, stored before any file is deleted.
            if !planned.delete_order.is_empty() {
                catalog.remove_entries(&**self.store(), &planned.delete_order)?;
            } else if !made.is_empty() {
                catalog.commit(&**self.store())?;
                super::synthesize::pause("committed");
            }
            for s in made.values() {
                // The incremental stream the new full one replaces.
                let _ = self.store().delete(&s.old.file);
                progress.notice(&format!(
                    "entry {} ({}) is now a synthetic full stream of {} bytes",
                    s.entry.id,
                    crate::manifest::escape(s.entry.path.as_bytes()),
                    s.entry.stored_bytes
                ));
            }
            if !made.is_empty() {
                super::synthesize::pause("replaced");
            }
            // The indexes of the synthesized entries' descendants pointed
            // into the streams just deleted (or an interrupted forget
            // left them so).
            self.refresh_stale_indexes(&catalog, progress)?;
            if !made.is_empty() {
                super::synthesize::pause("reindexed");
            }
            // Stream files of entries that an interrupted forget (or run)
            // had already dropped from the catalog.
            // A run's partial stream files stay for the next run, unless
            // their snapshot is stored.
            self.clean_leftovers(&catalog, &|u, c| catalog.find(u, c).is_none(), progress)?;
            // The indexes of the deleted entries, and the pages only they
            // used.
            if let Some(why) = self
                .sweep_indexes(
                    &catalog,
                    !planned.delete_order.is_empty() || !made.is_empty(),
                )?
                .skipped
            {
                progress.warning(&why);
            }
        }
        let chain_held = planned.verdicts.iter().filter(|v| v.kept_for_chain).fold(
            ChainHeld::default(),
            |h, v| ChainHeld {
                entries: h.entries + 1,
                stored_bytes: h.stored_bytes.saturating_add(v.entry.stored_bytes),
            },
        );
        Ok(ForgetReport {
            chain_held,
            verdicts: planned.verdicts,
            deleted: planned.delete_order,
            dry_run: opts.dry_run,
            synthesized,
            freed_bytes,
            synthesis_skipped: skipped,
        })
    }

    /// Why this forget cannot synthesize full streams, if it cannot.
    fn why_no_synthesis(&self) -> Option<String> {
        self.need_contents("synthesizing a full stream")
            .err()
            .map(|e| e.to_string())
    }
}

/// The entries to give synthetic full streams: each kept entry (by the
/// policy itself) whose ancestors are all kept only for chains, oldest
/// first. A kept entry below another one keeps its incremental stream:
/// that one's synthesis, not a second full stream, frees the chain. One
/// pass in id order (a parent's id is below its child's, as the catalog
/// checks), so a catalog of many entries costs no walk per entry.
fn synthesis_candidates(catalog: &Catalog, planned: &Planned) -> Vec<u64> {
    let by_policy: BTreeSet<u64> = planned
        .verdicts
        .iter()
        .filter(|v| v.keep && !v.kept_for_chain)
        .map(|v| v.entry.id)
        .collect();
    // Entries with an ancestor the policy keeps.
    let mut below_kept: BTreeSet<u64> = BTreeSet::new();
    let mut out = Vec::new();
    for e in &catalog.entries {
        let Some(p) = e.parent_id else { continue };
        if by_policy.contains(&p) || below_kept.contains(&p) {
            below_kept.insert(e.id);
        } else if by_policy.contains(&e.id) {
            out.push(e.id);
        }
    }
    out
}

struct Planned {
    verdicts: Vec<Verdict>,
    delete_order: Vec<u64>,
}

/// [`retention::plan`] over the catalog's entries, those of `cut` taken
/// as full streams (they are to get synthetic ones).
fn plan(
    catalog: &Catalog,
    policy: &Policy,
    opts: &ForgetOptions,
    repo: &str,
    cut: &BTreeSet<u64>,
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
                parent: e.parent_id.filter(|_| !cut.contains(&e.id)),
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
                synthesize: false,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::catalog::tests::entry_in;

    /// Which entries get synthetic full streams when the policy keeps
    /// `kept` (the rest of each kept entry's chain kept for it).
    fn candidates(cat: &Catalog, kept: &[u64]) -> Vec<u64> {
        let mut needed = BTreeSet::new();
        for id in kept {
            for e in cat.chain(*id).unwrap() {
                needed.insert(e.id);
            }
        }
        let verdicts = cat
            .entries
            .iter()
            .map(|e| Verdict {
                entry: e.clone(),
                keep: needed.contains(&e.id),
                reasons: Vec::new(),
                kept_for_chain: needed.contains(&e.id) && !kept.contains(&e.id),
                synthesize: false,
            })
            .collect();
        let planned = Planned {
            verdicts,
            delete_order: Vec::new(),
        };
        synthesis_candidates(cat, &planned)
    }

    #[test]
    fn the_oldest_kept_entry_of_each_chain_is_synthesized() {
        // f <- a <- b <- c, and a branch f <- a <- d; g alone.
        let mut cat = Catalog::empty();
        let f = cat.add(entry_in(&cat, None));
        let a = cat.add(entry_in(&cat, Some(f)));
        let b = cat.add(entry_in(&cat, Some(a)));
        let c = cat.add(entry_in(&cat, Some(b)));
        let d = cat.add(entry_in(&cat, Some(a)));
        let g = cat.add(entry_in(&cat, None));
        // The oldest kept of the chain only: c rides on b.
        assert_eq!(candidates(&cat, &[b, c]), [b]);
        assert_eq!(candidates(&cat, &[c]), [c]);
        // A kept full stream needs nothing; nor what is kept above it.
        assert_eq!(candidates(&cat, &[f, c]), Vec::<u64>::new());
        assert_eq!(candidates(&cat, &[g]), Vec::<u64>::new());
        // Two branches: each one's oldest kept entry.
        assert_eq!(candidates(&cat, &[c, d]), [c, d]);
        // a kept: both branches ride on it.
        assert_eq!(candidates(&cat, &[a, c, d]), [a]);
    }
}
