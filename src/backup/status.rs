//! `backup status`: per origin, the newest stored snapshot, its age and
//! the health of its chain, from the catalog alone (no stream file is
//! read, so it is cheap enough for a monitoring check every few minutes,
//! and the write key of an encrypted repository suffices).
//!
//! The structural checks are [`Catalog::check`]'s, which every load runs:
//! a loaded catalog has every incremental entry's parent present, earlier,
//! and of the uuid and ctransid it records, and every full entry without
//! one. What this adds is per origin: whether the newest entry's chain
//! resolves down to a full stream ([`Catalog::chain`]), and its age
//! against a limit. A pure function over a catalog and a time, like
//! [`retention`](super::retention).

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use serde::Serialize;

use super::catalog::{Catalog, Entry};
use super::error::BackupError;
use super::repository::Repository;

/// One origin's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OriginStatus {
    /// The origin (see [`Entry::origin`]).
    pub origin: String,
    /// Its stored snapshots.
    pub entries: usize,
    /// What its stream files take in the repository.
    pub stored_bytes: u64,
    /// Its newest stored snapshot: the latest [`Entry::time`] (the highest
    /// id among equal times; an entry whose time does not parse counts as
    /// older than every other).
    pub newest: Entry,
    /// Seconds from the newest snapshot's time to the time of the check
    /// (negative for a time in the future); `None` when its time does not
    /// parse.
    pub age_seconds: Option<i64>,
    /// Streams restoring the newest snapshot (1 for a full stream); `None`
    /// when its chain does not resolve.
    pub chain_length: Option<usize>,
    /// Whether the newest snapshot's chain resolves to a full stream and
    /// its time parses.
    pub healthy: bool,
    /// What is wrong when not [`healthy`](Self::healthy).
    pub problem: Option<String>,
    /// Whether the newest snapshot is at least the limit old (or its age
    /// unknown); always `false` without a limit.
    pub stale: bool,
}

/// What `status` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatusReport {
    /// The catalog generation read.
    pub generation: u64,
    /// Stored snapshots, all origins.
    pub entries: usize,
    /// What every stream file takes: the repository's size as its catalog
    /// counts it.
    pub stored_bytes: u64,
    /// One per origin, by origin name.
    pub origins: Vec<OriginStatus>,
    /// Whether some origin is stale, or, with a limit, there is none.
    pub stale: bool,
}

/// The status of `cat` at `now`: with `max_age`, an origin whose newest
/// snapshot is `max_age` old or older is stale, and so is a catalog
/// without entries.
pub fn status(cat: &Catalog, now: Timestamp, max_age: Option<Duration>) -> StatusReport {
    let mut by_origin: BTreeMap<&str, Vec<&Entry>> = BTreeMap::new();
    for e in &cat.entries {
        by_origin.entry(e.origin.as_str()).or_default().push(e);
    }
    let limit = max_age.map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let mut origins = Vec::with_capacity(by_origin.len());
    for (origin, es) in by_origin {
        // Latest time, then highest id; an unparsable time sorts first.
        let Some(newest) = es.iter().copied().max_by_key(|e| (e.timestamp(), e.id)) else {
            continue;
        };
        let age_seconds = newest
            .timestamp()
            .map(|t| now.as_second().saturating_sub(t.as_second()));
        let chain = cat.chain(newest.id);
        let problem = match (&chain, age_seconds) {
            (Err(missing), _) => Some(format!(
                "the chain of entry {} lacks entry {missing}",
                newest.id
            )),
            (Ok(_), None) => Some(format!(
                "entry {} has no readable time ({:?})",
                newest.id, newest.time
            )),
            (Ok(_), Some(_)) => None,
        };
        let stale = limit.is_some_and(|l| age_seconds.is_none_or(|a| a >= l));
        origins.push(OriginStatus {
            origin: origin.to_owned(),
            entries: es.len(),
            stored_bytes: es.iter().map(|e| e.stored_bytes).sum(),
            newest: newest.clone(),
            age_seconds,
            chain_length: chain.ok().map(|c| c.len()),
            healthy: problem.is_none(),
            problem,
            stale,
        });
    }
    let stale = max_age.is_some() && (origins.is_empty() || origins.iter().any(|o| o.stale));
    StatusReport {
        generation: cat.generation,
        entries: cat.entries.len(),
        stored_bytes: cat.entries.iter().map(|e| e.stored_bytes).sum(),
        origins,
        stale,
    }
}

impl Repository {
    /// [`status`] of the newest catalog at `now`. Takes no lock and reads
    /// no stream file.
    ///
    /// # Errors
    ///
    /// Catalog errors (one that fails [`Catalog::check`] included) and
    /// store errors.
    pub fn status(
        &self,
        now: Timestamp,
        max_age: Option<Duration>,
    ) -> Result<StatusReport, BackupError> {
        Ok(status(&self.catalog()?, now, max_age))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::Kind;

    fn entry(id: u64, origin: &str, time: &str, parent: Option<u64>) -> Entry {
        Entry {
            id,
            path: format!("p{id}"),
            uuid: String::from("00000000-0000-0000-0000-000000000000"),
            ctransid: id,
            parent_uuid: None,
            parent_ctransid: None,
            parent_id: parent,
            kind: if parent.is_some() {
                Kind::Incremental
            } else {
                Kind::Full
            },
            time: time.to_owned(),
            origin: origin.to_owned(),
            file: format!("streams/{id}.btrs.zst"),
            stream_bytes: 10 * id,
            stored_bytes: id,
            stream_blake3: String::new(),
            commands: 1,
            proto: 1,
            stored_at: time.to_owned(),
            synthesized_from: None,
        }
    }

    fn cat(entries: Vec<Entry>) -> Catalog {
        Catalog {
            entries,
            ..Catalog::empty()
        }
    }

    const NOW: &str = "2026-11-28T12:00:00Z";
    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn newest_per_origin_and_its_age() {
        let c = cat(vec![
            entry(1, "a", "2026-11-28T09:00:00Z", None),
            entry(2, "a", "2026-11-28T11:30:00Z", Some(1)),
            entry(3, "b", "2026-11-27T12:00:00Z", None),
            // Imported later, but older: not the newest.
            entry(4, "a", "2026-11-01T00:00:00Z", None),
        ]);
        let r = status(&c, NOW.parse().unwrap(), Some(2 * HOUR));
        assert_eq!(r.entries, 4);
        assert_eq!(r.stored_bytes, 10);
        let [a, b] = r.origins.as_slice() else {
            panic!("{r:?}")
        };
        assert_eq!((a.origin.as_str(), a.newest.id, a.entries), ("a", 2, 3));
        assert_eq!(a.age_seconds, Some(1800));
        assert_eq!(a.chain_length, Some(2));
        assert!(a.healthy && !a.stale);
        assert_eq!((b.newest.id, b.age_seconds), (3, Some(86400)));
        assert!(b.stale && r.stale);
        // Without a limit nothing is stale.
        assert!(!status(&c, NOW.parse().unwrap(), None).stale);
    }

    #[test]
    fn empty_is_stale_only_with_a_limit() {
        let now = NOW.parse().unwrap();
        assert!(status(&cat(vec![]), now, Some(HOUR)).stale);
        assert!(!status(&cat(vec![]), now, None).stale);
    }

    #[test]
    fn broken_chain_and_unreadable_time() {
        // Not a catalog `check` accepts; status must still not panic.
        let c = cat(vec![
            entry(2, "a", "2026-11-28T11:00:00Z", Some(1)),
            entry(3, "b", "yesterday", None),
        ]);
        let r = status(&c, NOW.parse().unwrap(), Some(HOUR * 2));
        let [a, b] = r.origins.as_slice() else {
            panic!("{r:?}")
        };
        assert!(!a.healthy && a.chain_length.is_none() && !a.stale);
        assert!(a.problem.as_deref().unwrap().contains("lacks entry 1"));
        assert!(!b.healthy && b.age_seconds.is_none() && b.stale);
    }
}
