//! Planning a run: which snapshots it stores, which stream each is stored
//! as (incremental from which parent, or full and why), and whether a
//! subvolume changed since its newest snapshot.
//!
//! Pure functions over what the run found (catalog entries, the source's
//! snapshots, times), with no I/O, so that [`Repository::run`](super::Repository::run) and its
//! progress estimate decide alike and the rules can be tested on made-up
//! chains, as [`retention`](super::retention) is.
//!
//! # Which snapshots ([`glob_match`], [`newer_than_stored`])
//!
//! With `--device`, a SNAPSHOT argument may be a shell-style glob of
//! subvolume paths. Of a `--snapshot` directory, a run stores the
//! snapshots of each subvolume created after the newest of them stored.
//!
//! # Full or incremental ([`choose`])
//!
//! A snapshot's parent is the newest stored entry of its origin (by
//! ctransid, then id) that is not newer than it, whose chain is intact (every
//! stream file present with its size) and whose snapshot is still on the
//! source. Without one the stream is full: [`FullReason::First`] when the
//! origin has no such entry at all, [`FullReason::ParentGone`] when some
//! have their chain intact but none is on the source any more (someone
//! deleted the snapshot the next incremental needed: the run says so, as
//! the full stream costs storage and time nobody planned for),
//! [`FullReason::ChainDamaged`] otherwise. With a parent, the stream is
//! still full when the chain is due for a new full one:
//!
//! * `--full-every N` ([`FullPolicy::every`]): the chain already has N
//!   streams ([`FullReason::FullEvery`]);
//! * `--full-every-days D` ([`FullPolicy::every_days`]): the chain's full
//!   stream is D days older than the snapshot, measured on the entries'
//!   times (the snapshots' creation times, or an import's `--time`), as
//!   retention measures them ([`FullReason::FullEveryDays`]). A nightly
//!   job starts a few seconds later or earlier each night, so "D days"
//!   allows [`DAYS_SLACK`]: the full of a 03:00 job comes on the D-th
//!   night, not the D+1-th. A full stream whose time cannot be read counts
//!   as old: a new full stream is always a correct choice, and ends the
//!   chain whose time is unknown.
//!
//! Within one run, a snapshot whose origin has an earlier snapshot in the
//! same run goes on from that one's planned chain ([`Chain`],
//! [`continues`]), so the run's progress estimate plans what the run then
//! stores.
//!
//! A chain ends only with a new full stream, and `backup forget` keeps every
//! ancestor of a kept entry: without a bound on a chain's age nothing older
//! than the newest full is ever freed. [`DEFAULT_FULL_EVERY_DAYS`] argues
//! the default.

use jiff::{SignedDuration, Timestamp};

/// The default of `--full-every-days`: 30.
///
/// One full stream a month. Retention's coarsest common period is the month
/// (`--keep-monthly`): each month kept holds one chain back to its full
/// stream, so about one full per month kept is the least a monthly policy
/// can cost, and a month-long chain is what `--keep-daily 7 --keep-weekly 4`
/// spans anyway. Shorter (7 days) uploads four or five fulls a month — for
/// an S3 repository of a 1.5 GB subvolume, 6 GB a month more — and frees only
/// incrementals, which are small; longer (90 days) keeps up to three months
/// of incrementals for each month `--keep-monthly` keeps, and a restore
/// replays up to 90 streams, where one damaged file breaks every later
/// entry of its chain. At 30, a restore replays at most about 30 streams
/// and damage costs at most a month of history.
pub const DEFAULT_FULL_EVERY_DAYS: u32 = 30;

/// How early a chain's full stream may be and still count as D days old
/// (see the module docs).
pub const DAYS_SLACK: SignedDuration = SignedDuration::from_hours(12);

/// When a chain gets a new full stream (`0`: never, by that rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FullPolicy {
    /// `--full-every N`: when the chain holds N streams.
    pub every: u32,
    /// `--full-every-days D`: when the chain's full stream is D days old.
    pub every_days: u32,
}

/// Why a stream is stored full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FullReason {
    /// The origin has no stored entry to be incremental from.
    First,
    /// The chain holds `--full-every` streams.
    FullEvery,
    /// The chain's full stream is `--full-every-days` days old.
    FullEveryDays,
    /// The origin's stored snapshots are gone from the source.
    ParentGone,
    /// The chains of the stored snapshots still on the source are damaged
    /// (a stream file missing or of the wrong size).
    ChainDamaged,
}

impl FullReason {
    /// `first`, `full_every`, `full_every_days`, `parent_gone`,
    /// `chain_damaged`.
    pub fn as_str(self) -> &'static str {
        match self {
            FullReason::First => "first",
            FullReason::FullEvery => "full_every",
            FullReason::FullEveryDays => "full_every_days",
            FullReason::ParentGone => "parent_gone",
            FullReason::ChainDamaged => "chain_damaged",
        }
    }
}

/// A stored entry of the snapshot's origin that is not newer than it, as
/// [`choose`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParentCandidate<Id> {
    /// The entry.
    pub id: Id,
    /// Its ctransid (orders candidates; the id breaks ties).
    pub ctransid: u64,
    /// Whether its snapshot is on the source (an incremental needs it).
    pub on_source: bool,
    /// Whether every stream file of its chain is present with its size.
    pub chain_intact: bool,
    /// Streams in its chain, itself and its full stream included.
    pub depth: usize,
    /// The time of its chain's full stream (`None`: unreadable).
    pub full_time: Option<Timestamp>,
}

/// What [`choose`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice<Id> {
    /// Incremental from this entry.
    Incremental(Id),
    /// A full stream, and why.
    Full(FullReason),
}

/// Whether a chain of `depth` streams whose full stream has the time
/// `full_time` is due for a new full stream for a snapshot of time `time`.
pub fn full_due(
    depth: usize,
    full_time: Option<Timestamp>,
    time: Timestamp,
    policy: FullPolicy,
) -> Option<FullReason> {
    if policy.every > 0 && depth >= policy.every as usize {
        return Some(FullReason::FullEvery);
    }
    if policy.every_days > 0 {
        let Some(full_time) = full_time else {
            return Some(FullReason::FullEveryDays);
        };
        let days = SignedDuration::from_hours(24 * i64::from(policy.every_days));
        if time.duration_since(full_time) >= days - DAYS_SLACK {
            return Some(FullReason::FullEveryDays);
        }
    }
    None
}

/// The stream a snapshot of time `time` is stored as, given the stored
/// entries of its origin that are not newer than it (see the module
/// docs).
pub fn choose<Id: Clone + Ord>(
    candidates: &[ParentCandidate<Id>],
    time: Timestamp,
    policy: FullPolicy,
) -> Choice<Id> {
    let best = candidates
        .iter()
        .filter(|c| c.on_source && c.chain_intact)
        .max_by(|a, b| (a.ctransid, &a.id).cmp(&(b.ctransid, &b.id)));
    let Some(best) = best else {
        return Choice::Full(if candidates.is_empty() {
            FullReason::First
        } else if candidates.iter().any(|c| c.chain_intact) {
            FullReason::ParentGone
        } else {
            FullReason::ChainDamaged
        });
    };
    match full_due(best.depth, best.full_time, time, policy) {
        Some(why) => Choice::Full(why),
        None => Choice::Incremental(best.id.clone()),
    }
}

/// A chain as a run plans it: how many streams it holds and the time of
/// its full stream (`None`: unreadable).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chain {
    /// Streams in the chain, its full stream included.
    pub depth: usize,
    /// The time of its full stream.
    pub full_time: Option<Timestamp>,
}

impl Chain {
    /// The chain a snapshot of time `time` ends when it is stored
    /// incremental onto `parent`'s chain, or full (`None`: it starts a new
    /// chain of one, whose full stream is itself).
    pub fn after(parent: Option<Chain>, time: Timestamp) -> Chain {
        match parent {
            Some(c) => Chain {
                depth: c.depth.saturating_add(1),
                full_time: c.full_time,
            },
            None => Chain {
                depth: 1,
                full_time: Some(time),
            },
        }
    }
}

/// Whether the next snapshot of an origin, of time `time`, is planned
/// incremental from the snapshot before it in the same run, whose stream
/// ends `chain` ([`full_due`] says no new full stream is due).
pub fn continues(chain: Chain, time: Timestamp, policy: FullPolicy) -> bool {
    full_due(chain.depth, chain.full_time, time, policy).is_none()
}

/// Which snapshots of a subvolume in a `--snapshot` directory a run
/// stores, given each one's otransid and whether it is stored: those
/// created after the newest of them stored, or all when none is. By
/// creation (otransid), not ctransid: a snapshot taken when nothing
/// changed has the ctransid of the one before, and is new all the same.
/// An older one never stored stays unstored: its chain would branch off
/// behind the newest.
pub fn newer_than_stored(snaps: &[(u64, bool)]) -> Vec<bool> {
    let newest = snaps.iter().filter(|s| s.1).map(|s| s.0).max();
    snaps
        .iter()
        .map(|&(otransid, _)| newest.is_none_or(|n| otransid > n))
        .collect()
}

/// A subvolume or snapshot as [`unchanged_since`] compares them (`btrfs
/// subvolume show`, or `BTRFS_IOC_GET_SUBVOL_INFO`, after a sync).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transids {
    /// The root item's generation: the transaction that last wrote the
    /// subvolume's tree root.
    pub generation: u64,
    /// The transaction of the last change of an inode in it.
    pub ctransid: u64,
    /// The transaction that created it.
    pub otransid: u64,
}

/// Whether `subvol` has not changed since `snapshot` was taken of it.
///
/// Taking a snapshot in transaction T copies the subvolume's root item
/// (its ctransid with it) and writes the subvolume's root node in T too
/// (the snapshot shares everything below it), so right after it the
/// subvolume's generation is T, the snapshot's otransid. A later change
/// rewrites the root node in a later transaction (its generation grows) and
/// a change of an inode sets its ctransid. Both must still match: the
/// generation alone also sees changes that leave ctransid alone (data
/// written into an existing file), ctransid alone would not need a sync. A
/// false "changed" (an atime update, a balance) only costs a snapshot; a
/// false "unchanged" would lose a night, so the caller syncs the filesystem
/// first (the root item's generation is written at commit).
pub fn unchanged_since(subvol: Transids, snapshot: Transids) -> bool {
    subvol.ctransid == snapshot.ctransid && subvol.generation <= snapshot.otransid
}

/// Shell-style match of `pat` against `text`: `*` and `?` do not match
/// `/`; `[abc]`, `[a-z]` and `[!a]` are classes; `\` quotes.
pub fn glob_match(pat: &str, text: &str) -> bool {
    fn class(p: &[char], c: char) -> Option<(bool, usize)> {
        // Returns (matched, chars consumed incl. brackets).
        let mut i = 1;
        let neg = matches!(p.get(i), Some('!' | '^'));
        if neg {
            i += 1;
        }
        let mut hit = false;
        let start = i;
        while let Some(&ch) = p.get(i) {
            if ch == ']' && i > start {
                return Some((hit != neg, i + 1));
            }
            if p.get(i + 1) == Some(&'-') && p.get(i + 2).is_some_and(|&e| e != ']') {
                let hi = p[i + 2];
                if ch <= c && c <= hi {
                    hit = true;
                }
                i += 3;
            } else {
                if ch == c {
                    hit = true;
                }
                i += 1;
            }
        }
        None
    }
    fn go(p: &[char], t: &[char]) -> bool {
        match p.first() {
            None => t.is_empty(),
            Some('*') => (0..=t.len())
                .take_while(|&k| k == 0 || t[k - 1] != '/')
                .any(|k| go(&p[1..], &t[k..])),
            Some('?') => t.first().is_some_and(|&c| c != '/') && go(&p[1..], &t[1..]),
            Some('[') => match (t.first(), class(p, t.first().copied().unwrap_or('\0'))) {
                (Some(&c), Some((true, n))) if c != '/' => go(&p[n..], &t[1..]),
                (_, Some(_)) => false,
                (Some(&c), None) => c == '[' && go(&p[1..], &t[1..]),
                (None, None) => false,
            },
            Some('\\') if p.len() > 1 => t.first() == Some(&p[1]) && go(&p[2..], &t[1..]),
            Some(&c) => t.first() == Some(&c) && go(&p[1..], &t[1..]),
        }
    }
    let p: Vec<char> = pat.chars().collect();
    let t: Vec<char> = text.chars().collect();
    go(&p, &t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn cand(id: u64, ctransid: u64, depth: usize, full: &str) -> ParentCandidate<u64> {
        ParentCandidate {
            id,
            ctransid,
            on_source: true,
            chain_intact: true,
            depth,
            full_time: Some(t(full)),
        }
    }

    const NEVER: FullPolicy = FullPolicy {
        every: 0,
        every_days: 0,
    };

    #[test]
    fn the_newest_usable_entry_is_the_parent() {
        let mut cs = vec![
            cand(1, 10, 1, "2026-01-01T03:00:00Z"),
            cand(2, 20, 2, "2026-01-01T03:00:00Z"),
            cand(3, 30, 3, "2026-01-01T03:00:00Z"),
        ];
        let now = t("2026-01-04T03:00:00Z");
        assert_eq!(choose(&cs, now, NEVER), Choice::Incremental(3));
        // The newest gone from the source: the one before it.
        cs[2].on_source = false;
        assert_eq!(choose(&cs, now, NEVER), Choice::Incremental(2));
        // Damaged chain: skipped too.
        cs[1].chain_intact = false;
        assert_eq!(choose(&cs, now, NEVER), Choice::Incremental(1));
        // Equal ctransid (an import and a run of one snapshot): the higher id.
        let tie = [
            cand(7, 10, 1, "2026-01-01T03:00:00Z"),
            cand(4, 10, 1, "2026-01-01T03:00:00Z"),
        ];
        assert_eq!(choose(&tie, now, NEVER), Choice::Incremental(7));
    }

    #[test]
    fn no_parent_says_why() {
        let now = t("2026-01-04T03:00:00Z");
        assert_eq!(
            choose::<u64>(&[], now, NEVER),
            Choice::Full(FullReason::First)
        );
        let mut gone = cand(1, 10, 1, "2026-01-01T03:00:00Z");
        gone.on_source = false;
        let mut damaged = cand(2, 20, 2, "2026-01-01T03:00:00Z");
        damaged.chain_intact = false;
        // The intact one is gone: what a deleted snapshot costs.
        assert_eq!(
            choose(&[gone.clone(), damaged.clone()], now, NEVER),
            Choice::Full(FullReason::ParentGone)
        );
        // Only a damaged one is left on the source.
        gone.chain_intact = false;
        assert_eq!(
            choose(&[gone, damaged], now, NEVER),
            Choice::Full(FullReason::ChainDamaged)
        );
    }

    #[test]
    fn full_every_counts_the_chain() {
        let p = FullPolicy {
            every: 3,
            every_days: 0,
        };
        let now = t("2026-01-04T03:00:00Z");
        let c = |depth| [cand(1, 10, depth, "2026-01-01T03:00:00Z")];
        assert_eq!(choose(&c(1), now, p), Choice::Incremental(1));
        assert_eq!(choose(&c(2), now, p), Choice::Incremental(1));
        assert_eq!(choose(&c(3), now, p), Choice::Full(FullReason::FullEvery));
    }

    #[test]
    fn full_every_days_measures_the_chains_full_on_entry_times() {
        let p = FullPolicy {
            every: 0,
            every_days: 30,
        };
        let full = "2026-01-01T03:00:05Z";
        let c = [cand(1, 10, 29, full)];
        // 29 nights later: incremental; the 30th night a few seconds early
        // (cron's start time drifts): full; 12 hours early is still early.
        assert_eq!(
            choose(&c, t("2026-01-30T03:00:05Z"), p),
            Choice::Incremental(1)
        );
        assert_eq!(
            choose(&c, t("2026-01-31T03:00:01Z"), p),
            Choice::Full(FullReason::FullEveryDays)
        );
        assert_eq!(
            choose(&c, t("2026-01-30T15:00:05Z"), p),
            Choice::Full(FullReason::FullEveryDays)
        );
        assert_eq!(
            choose(&c, t("2026-01-30T15:00:04Z"), p),
            Choice::Incremental(1)
        );
        // A snapshot older than the full (a clock set back): incremental.
        assert_eq!(
            choose(&c, t("2025-12-01T00:00:00Z"), p),
            Choice::Incremental(1)
        );
        // An unreadable time: a new full ends that chain.
        let mut unknown = c[0].clone();
        unknown.full_time = None;
        assert_eq!(
            choose(&[unknown.clone()], t("2026-01-02T03:00:00Z"), p),
            Choice::Full(FullReason::FullEveryDays)
        );
        // 0 disables the rule.
        assert_eq!(
            choose(&[unknown], t("2027-01-02T03:00:00Z"), NEVER),
            Choice::Incremental(1)
        );
    }

    #[test]
    fn both_rules_apply_together() {
        let p = FullPolicy {
            every: 7,
            every_days: 30,
        };
        let full = "2026-01-01T03:00:00Z";
        let day = |d: i64| {
            t(full)
                .checked_add(SignedDuration::from_hours(24 * d))
                .unwrap()
        };
        assert_eq!(
            full_due(7, Some(t(full)), day(3), p),
            Some(FullReason::FullEvery)
        );
        assert_eq!(
            full_due(3, Some(t(full)), day(30), p),
            Some(FullReason::FullEveryDays)
        );
        assert_eq!(full_due(6, Some(t(full)), day(29), p), None);
    }

    /// A nightly job over a year: the chain's full comes back every 30
    /// nights, never later, so no chain holds more than 30 streams.
    #[test]
    fn a_year_of_nights_gives_a_full_every_thirty() {
        let p = FullPolicy {
            every: 0,
            every_days: DEFAULT_FULL_EVERY_DAYS,
        };
        let start = t("2026-01-01T03:00:00Z");
        let mut full_at = None;
        let mut depth = 0;
        let mut fulls = Vec::new();
        for night in 0..365i64 {
            // Start times drift by up to ±40 s.
            let time = start
                .checked_add(SignedDuration::from_secs(
                    night * 86_400 + (night * 37) % 81 - 40,
                ))
                .unwrap();
            let cands: Vec<ParentCandidate<u64>> = full_at
                .map(|f| ParentCandidate {
                    id: 1,
                    ctransid: 1,
                    on_source: true,
                    chain_intact: true,
                    depth,
                    full_time: Some(f),
                })
                .into_iter()
                .collect();
            match choose(&cands, time, p) {
                Choice::Full(_) => {
                    full_at = Some(time);
                    depth = 1;
                    fulls.push(night);
                }
                Choice::Incremental(_) => depth += 1,
            }
            assert!(depth <= 30, "night {night}: chain of {depth}");
        }
        let gaps: Vec<i64> = fulls.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.iter().all(|&g| g == 30), "{fulls:?}");
    }

    #[test]
    fn unchanged_needs_both_transids() {
        let snap = Transids {
            generation: 50,
            ctransid: 40,
            otransid: 50,
        };
        // Right after the snapshot.
        let same = Transids {
            generation: 50,
            ctransid: 40,
            otransid: 7,
        };
        assert!(unchanged_since(same, snap));
        // A file created: both grow.
        assert!(!unchanged_since(
            Transids {
                generation: 52,
                ctransid: 52,
                ..same
            },
            snap
        ));
        // Data written into a file: the tree changes, ctransid may not.
        assert!(!unchanged_since(
            Transids {
                generation: 53,
                ..same
            },
            snap
        ));
        // ctransid moved on (not committed yet, in memory).
        assert!(!unchanged_since(
            Transids {
                ctransid: 55,
                ..same
            },
            snap
        ));
    }

    #[test]
    fn globs_match_as_the_shell_does() {
        assert!(glob_match("snaps/home.*", "snaps/home.2026-11-20"));
        assert!(!glob_match("snaps/home.*", "snaps/home.x/nested"));
        assert!(!glob_match("snaps/*", "snaps"));
        assert!(glob_match("snaps/?", "snaps/a"));
        assert!(!glob_match("snaps/?", "snaps/ab"));
        assert!(glob_match("s[a-c]x", "sbx"));
        assert!(!glob_match("s[!a-c]x", "sbx"));
        assert!(glob_match("s[!a-c]x", "sdx"));
        assert!(glob_match(r"a\*", "a*"));
        assert!(!glob_match(r"a\*", "ab"));
        assert!(glob_match("*", "x"));
        assert!(glob_match("a*b*c", "aXbYc"));
    }

    #[test]
    fn a_chain_grows_by_one_and_keeps_its_full_streams_time() {
        let full = t("2026-01-01T03:00:00Z");
        let now = t("2026-01-05T03:00:00Z");
        // A full stream starts a chain of one whose full stream is itself.
        assert_eq!(
            Chain::after(None, now),
            Chain {
                depth: 1,
                full_time: Some(now)
            }
        );
        let c = Chain {
            depth: 4,
            full_time: Some(full),
        };
        assert_eq!(
            Chain::after(Some(c), now),
            Chain {
                depth: 5,
                full_time: Some(full)
            }
        );
        // A broken chain (depth unknown: usize::MAX) does not wrap.
        let broken = Chain {
            depth: usize::MAX,
            full_time: None,
        };
        assert_eq!(Chain::after(Some(broken), now).depth, usize::MAX);
    }

    #[test]
    fn a_run_continues_its_own_chain_until_a_full_is_due() {
        let p = FullPolicy {
            every: 3,
            every_days: 30,
        };
        let full = t("2026-01-01T03:00:00Z");
        // Planned in this run: a full stream, then one incremental (2).
        let two = Chain::after(Some(Chain::after(None, full)), full);
        assert_eq!(two.depth, 2);
        assert!(continues(two, t("2026-01-02T03:00:00Z"), p));
        // The third would make a chain of 3 = --full-every: full.
        let three = Chain::after(Some(two), full);
        assert!(!continues(three, t("2026-01-03T03:00:00Z"), p));
        // 30 days after the chain's full stream: full, whatever the depth.
        assert!(!continues(two, t("2026-01-31T03:00:00Z"), p));
        // No policy: always continued.
        assert!(continues(three, t("2027-01-01T00:00:00Z"), NEVER));
    }

    #[test]
    fn only_snapshots_newer_than_the_newest_stored_are_new() {
        // Nothing stored: every snapshot is new.
        assert_eq!(newer_than_stored(&[(10, false), (20, false)]), [true, true]);
        // 20 is stored: 30 and 40 are new, 10 (older, never stored) and 20
        // itself are not.
        assert_eq!(
            newer_than_stored(&[(10, false), (20, true), (30, false), (40, false)]),
            [false, false, true, true]
        );
        // The newest stored counts, in any order given.
        assert_eq!(
            newer_than_stored(&[(50, true), (30, false), (20, true), (60, false)]),
            [false, false, false, true]
        );
        assert!(newer_than_stored(&[]).is_empty());
    }
}
