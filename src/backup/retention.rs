//! Retention: which stored streams `btrsend backup forget` keeps.
//!
//! Pure functions over catalog entries and times, with no I/O, so that the
//! policy can be tested on thousands of made-up timelines.
//!
//! # The policy (restic's `forget`)
//!
//! The entries of each origin (the subvolume the snapshots were taken of,
//! or the `--origin` of an import) are considered apart, newest first
//! (equal times: the higher id first). Each `--keep-X N` option has a
//! period (`last`: every entry is its own period; `hourly`, `daily`,
//! `weekly` — ISO 8601 weeks, Monday to Sunday, keyed by ISO year and
//! week —, `monthly`, `yearly`), computed in the given time zone
//! (`TZ`, the local zone), and a count. Going from the newest entry to the
//! oldest, an entry that starts a period not seen yet is kept while the
//! count lasts, and uses one of it: so the newest entry of each of the N
//! most recent periods that hold an entry is kept. While some of a
//! count is left when the oldest entry is reached, that oldest entry is
//! kept too ("oldest daily"): it keeps the longest history the count
//! allows. A count of [`Keep::Unlimited`] (`-1` on the command line) never
//! runs out. `--keep-within 1y2m3d4h` keeps every entry newer than the
//! newest entry's time (ignoring entries newer than now) minus that
//! duration; years, months and days are calendar units in the time zone
//! (a month back from March 31 is the last day of February), hours are
//! exact. An entry is kept when any option keeps it. An empty policy keeps
//! everything and is refused ([`RetentionError::EmptyPolicy`]), as restic
//! refuses to act on one.
//!
//! These are the semantics of restic's `ApplyPolicy`
//! (`internal/restic/snapshot_policy.go`, BSD-2-Clause), read for facts.
//!
//! # btrsend's own rules
//!
//! * Every ancestor of a kept entry — its parent (the base of its
//!   incremental stream), the parent's parent, … down to the full stream
//!   — is kept too, with the reason [`Reason::ParentOf`]: deleting any of
//!   them would make a kept entry unrestorable.
//! * An entry whose time is after `now` (clock skew) is never deleted.
//! * [`Plan::delete_order`] lists the entries to delete children before
//!   parents, so that a crash part-way through never leaves a kept entry's
//!   chain broken, whatever the order the catalog is rewritten in.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::Hash;
use std::str::FromStr;

use jiff::tz::TimeZone;
use jiff::{Span, Timestamp, Zoned};

/// One stored stream, as retention sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate<Id> {
    /// The entry's id in the catalog.
    pub id: Id,
    /// The origin the entry belongs to: the policy is applied to each
    /// origin's entries apart.
    pub origin: String,
    /// The entry's time (the snapshot's creation time, or an import's
    /// `--time`).
    pub time: Timestamp,
    /// The entry whose snapshot this entry's stream is an incremental
    /// from; `None` for a full stream.
    pub parent: Option<Id>,
}

/// How many periods a `--keep-X` option keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Keep {
    /// The option is not given (or is 0).
    #[default]
    Nothing,
    /// The newest entry of each of the N most recent periods.
    Count(u32),
    /// Every period (`-1` or `unlimited`).
    Unlimited,
}

impl Keep {
    fn is_nothing(self) -> bool {
        matches!(self, Keep::Nothing | Keep::Count(0))
    }
}

impl FromStr for Keep {
    type Err = String;

    fn from_str(s: &str) -> Result<Keep, String> {
        match s {
            "-1" | "unlimited" => Ok(Keep::Unlimited),
            _ => match s.parse::<u32>() {
                Ok(0) => Ok(Keep::Nothing),
                Ok(n) => Ok(Keep::Count(n)),
                Err(_) => Err(format!(
                    "invalid count {s:?}: expected a number of periods, or -1 / unlimited for all"
                )),
            },
        }
    }
}

/// A `--keep-within` duration: years, months, days and hours.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Within {
    /// Calendar years.
    pub years: u32,
    /// Calendar months.
    pub months: u32,
    /// Calendar days.
    pub days: u32,
    /// Hours of 3600 seconds.
    pub hours: u32,
}

impl Within {
    fn is_zero(self) -> bool {
        self == Within::default()
    }

    /// The time `self` before `latest`, in `latest`'s time zone; `None`
    /// when that is before the earliest time there is (so every entry is
    /// within).
    fn before(self, latest: &Zoned) -> Option<Timestamp> {
        let calendar = Span::new()
            .try_years(i64::from(self.years))
            .and_then(|s| s.try_months(i64::from(self.months)))
            .and_then(|s| s.try_days(i64::from(self.days)))
            .ok()?;
        let hours = Span::new().try_hours(i64::from(self.hours)).ok()?;
        let z = latest.checked_sub(calendar).ok()?;
        Some(z.checked_sub(hours).ok()?.timestamp())
    }
}

impl FromStr for Within {
    type Err = String;

    /// `1y2m3d4h`, each unit at most once, any of them left out
    /// (restic's duration syntax).
    fn from_str(s: &str) -> Result<Within, String> {
        let bad = || {
            format!(
                "invalid duration {s:?}: expected numbers of years, months, days and hours, e.g. 1y6m, 30d or 2d12h"
            )
        };
        let mut w = Within::default();
        let mut seen = [false; 4];
        let mut rest = s;
        if rest.is_empty() {
            return Err(bad());
        }
        while !rest.is_empty() {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 {
                return Err(bad());
            }
            let n: u32 = rest[..digits].parse().map_err(|_| bad())?;
            let (slot, field) = match rest[digits..].chars().next() {
                Some('y') => (0, &mut w.years),
                Some('m') => (1, &mut w.months),
                Some('d') => (2, &mut w.days),
                Some('h') => (3, &mut w.hours),
                _ => return Err(bad()),
            };
            if std::mem::replace(&mut seen[slot], true) {
                return Err(bad());
            }
            *field = n;
            rest = &rest[digits + 1..];
        }
        Ok(w)
    }
}

impl fmt::Display for Within {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_zero() {
            return f.write_str("0h");
        }
        for (n, unit) in [
            (self.years, 'y'),
            (self.months, 'm'),
            (self.days, 'd'),
            (self.hours, 'h'),
        ] {
            if n != 0 {
                write!(f, "{n}{unit}")?;
            }
        }
        Ok(())
    }
}

/// The `--keep-*` options of `backup forget`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// `--keep-last`.
    pub last: Keep,
    /// `--keep-hourly`.
    pub hourly: Keep,
    /// `--keep-daily`.
    pub daily: Keep,
    /// `--keep-weekly`.
    pub weekly: Keep,
    /// `--keep-monthly`.
    pub monthly: Keep,
    /// `--keep-yearly`.
    pub yearly: Keep,
    /// `--keep-within`.
    pub within: Option<Within>,
}

impl Policy {
    /// Whether no option keeps anything (such a policy is refused).
    pub fn is_empty(&self) -> bool {
        self.counts().iter().all(|(_, k)| k.is_nothing()) && self.within.is_none_or(Within::is_zero)
    }

    fn counts(&self) -> [(Period, Keep); 6] {
        [
            (Period::Last, self.last),
            (Period::Hourly, self.hourly),
            (Period::Daily, self.daily),
            (Period::Weekly, self.weekly),
            (Period::Monthly, self.monthly),
            (Period::Yearly, self.yearly),
        ]
    }
}

/// The period of a `--keep-X` option.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Period {
    /// `--keep-last`: every entry is a period of its own.
    Last,
    /// `--keep-hourly`.
    Hourly,
    /// `--keep-daily`.
    Daily,
    /// `--keep-weekly` (ISO 8601 weeks).
    Weekly,
    /// `--keep-monthly`.
    Monthly,
    /// `--keep-yearly`.
    Yearly,
}

impl Period {
    /// The period `time` falls in, as a number that differs between
    /// periods; `nr` (the entry's position, newest first) is the period of
    /// [`Period::Last`].
    fn key(self, time: &Zoned, nr: usize) -> i64 {
        let (y, m, d, h) = (
            i64::from(time.year()),
            i64::from(time.month()),
            i64::from(time.day()),
            i64::from(time.hour()),
        );
        match self {
            Period::Last => i64::try_from(nr).unwrap_or(i64::MAX),
            Period::Hourly => ((y * 100 + m) * 100 + d) * 100 + h,
            Period::Daily => (y * 100 + m) * 100 + d,
            Period::Weekly => {
                let iso = time.date().iso_week_date();
                i64::from(iso.year()) * 100 + i64::from(iso.week())
            }
            Period::Monthly => y * 100 + m,
            Period::Yearly => y,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Period::Last => "last",
            Period::Hourly => "hourly",
            Period::Daily => "daily",
            Period::Weekly => "weekly",
            Period::Monthly => "monthly",
            Period::Yearly => "yearly",
        }
    }
}

/// Why an entry is kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason<Id> {
    /// The newest entry of one of the periods a `--keep-X` option keeps.
    Period(Period),
    /// The oldest entry, kept because the option's count was not used up.
    Oldest(Period),
    /// Newer than the newest entry's time minus `--keep-within`.
    Within(Within),
    /// Its time is after now (clock skew): never deleted.
    InFuture,
    /// The base of the incremental stream of this kept entry.
    ParentOf(Id),
}

impl<Id: fmt::Display> fmt::Display for Reason<Id> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Period(p) => write!(f, "{}", p.name()),
            Reason::Oldest(p) => write!(f, "oldest {}", p.name()),
            Reason::Within(w) => write!(f, "within {w}"),
            Reason::InFuture => f.write_str("newer than now"),
            Reason::ParentOf(id) => write!(f, "parent of {id}"),
        }
    }
}

/// What retention decided for one entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision<Id> {
    /// The entry.
    pub id: Id,
    /// Kept (true) or to delete.
    pub keep: bool,
    /// Why it is kept (empty for an entry to delete).
    pub reasons: Vec<Reason<Id>>,
}

impl<Id> Decision<Id> {
    /// Kept only as an ancestor of kept entries: the policy alone would
    /// delete it, their chains need it. Space that a new full stream
    /// (`backup run --full-every-days`) would let the next `forget` free.
    pub fn kept_only_for_chain(&self) -> bool {
        self.keep
            && self
                .reasons
                .iter()
                .all(|r| matches!(r, Reason::ParentOf(_)))
    }
}

/// The outcome of [`plan`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan<Id> {
    /// One decision per entry: origins in name order, each newest first.
    pub decisions: Vec<Decision<Id>>,
    /// The entries to delete, children before parents.
    pub delete_order: Vec<Id>,
}

/// A catalog retention cannot plan for.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RetentionError<Id: fmt::Display + fmt::Debug> {
    /// No option keeps anything.
    #[error(
        "refusing an empty policy, which would delete every backup: give at least one --keep-* option"
    )]
    EmptyPolicy,
    /// Two entries have the same id.
    #[error("catalog entry {0} is listed twice")]
    DuplicateId(Id),
    /// Following parents from an entry comes back to it.
    #[error("catalog entry {0} is its own ancestor (parent links form a cycle)")]
    ParentCycle(Id),
}

/// Decide which of `entries` to keep under `policy`, with periods in
/// `tz` and `now` the present (see the module docs).
///
/// # Errors
///
/// An empty policy, an id listed twice, or parent links that form a
/// cycle.
pub fn plan<Id>(
    entries: &[Candidate<Id>],
    policy: &Policy,
    now: Timestamp,
    tz: &TimeZone,
) -> Result<Plan<Id>, RetentionError<Id>>
where
    Id: Clone + Eq + Hash + Ord + fmt::Display + fmt::Debug,
{
    if policy.is_empty() {
        return Err(RetentionError::EmptyPolicy);
    }
    let mut index: HashMap<&Id, usize> = HashMap::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        if index.insert(&e.id, i).is_some() {
            return Err(RetentionError::DuplicateId(e.id.clone()));
        }
    }

    let mut reasons: Vec<Vec<Reason<Id>>> = vec![Vec::new(); entries.len()];
    let mut order: Vec<usize> = Vec::with_capacity(entries.len());
    let mut by_origin: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, e) in entries.iter().enumerate() {
        by_origin.entry(&e.origin).or_default().push(i);
    }
    for group in by_origin.into_values() {
        let group = newest_first(entries, group);
        apply_policy(entries, &group, policy, now, tz, &mut reasons);
        order.extend(group);
    }

    // Ancestors of kept entries: each kept entry gives its parent a
    // reason; a parent kept only now passes it on to its own parent.
    let mut work: Vec<usize> = (0..entries.len())
        .filter(|&i| !reasons[i].is_empty())
        .collect();
    while let Some(child) = work.pop() {
        let Some(parent) = entries[child].parent.as_ref().and_then(|p| index.get(p)) else {
            continue;
        };
        let was_kept = !reasons[*parent].is_empty();
        reasons[*parent].push(Reason::ParentOf(entries[child].id.clone()));
        if !was_kept {
            work.push(*parent);
        }
    }

    let delete_order = delete_order(entries, &index, &order, &reasons)?;
    let decisions = order
        .into_iter()
        .map(|i| Decision {
            id: entries[i].id.clone(),
            keep: !reasons[i].is_empty(),
            reasons: std::mem::take(&mut reasons[i]),
        })
        .collect();
    Ok(Plan {
        decisions,
        delete_order,
    })
}

/// The indices of `group` sorted newest first (equal times: higher id
/// first).
fn newest_first<Id: Ord>(entries: &[Candidate<Id>], mut group: Vec<usize>) -> Vec<usize> {
    group.sort_by(|&a, &b| {
        let (a, b) = (&entries[a], &entries[b]);
        b.time.cmp(&a.time).then_with(|| b.id.cmp(&a.id))
    });
    group
}

/// restic's `ApplyPolicy` on one origin's entries, `group` newest first:
/// adds the policy's reasons to `reasons`.
fn apply_policy<Id: Clone>(
    entries: &[Candidate<Id>],
    group: &[usize],
    policy: &Policy,
    now: Timestamp,
    tz: &TimeZone,
    reasons: &mut [Vec<Reason<Id>>],
) {
    // The newest entry that is not in the future anchors --keep-within.
    let within = policy.within.filter(|w| !w.is_zero()).map(|w| {
        let latest = group
            .iter()
            .map(|&i| entries[i].time)
            .find(|t| *t <= now)
            .map(|t| t.to_zoned(tz.clone()));
        (w, latest.and_then(|l| w.before(&l)))
    });
    let mut counts: Vec<(Period, Keep, Option<i64>)> = policy
        .counts()
        .into_iter()
        .filter(|(_, k)| !k.is_nothing())
        .map(|(p, k)| (p, k, None))
        .collect();
    for (nr, &i) in group.iter().enumerate() {
        let e = &entries[i];
        let zoned = e.time.to_zoned(tz.clone());
        let oldest = nr + 1 == group.len();
        if e.time > now {
            reasons[i].push(Reason::InFuture);
        }
        if let Some((w, threshold)) = within
            && threshold.is_none_or(|t| e.time > t)
        {
            reasons[i].push(Reason::Within(w));
        }
        for (period, keep, last) in &mut counts {
            if matches!(keep, Keep::Count(0) | Keep::Nothing) {
                continue;
            }
            let key = period.key(&zoned, nr);
            let new_period = *last != Some(key);
            if new_period || oldest {
                reasons[i].push(if new_period {
                    Reason::Period(*period)
                } else {
                    Reason::Oldest(*period)
                });
                *last = Some(key);
                if let Keep::Count(n) = keep {
                    *n -= 1;
                }
            }
        }
    }
}

/// The entries without reasons, children before parents: an entry comes
/// once every entry to delete whose parent it is has come (Kahn's
/// algorithm over the parent links; `order` breaks ties).
fn delete_order<Id>(
    entries: &[Candidate<Id>],
    index: &HashMap<&Id, usize>,
    order: &[usize],
    reasons: &[Vec<Reason<Id>>],
) -> Result<Vec<Id>, RetentionError<Id>>
where
    Id: Clone + Eq + Hash + fmt::Display + fmt::Debug,
{
    let doomed = |i: usize| reasons[i].is_empty();
    let parent_of = |i: usize| {
        entries[i]
            .parent
            .as_ref()
            .and_then(|p| index.get(p).copied())
    };
    // The number of doomed children each doomed entry waits for.
    let mut waiting = vec![0usize; entries.len()];
    for &i in order {
        if doomed(i)
            && let Some(p) = parent_of(i)
        {
            waiting[p] += 1;
        }
    }
    let mut out = Vec::new();
    let mut done = vec![false; entries.len()];
    let mut ready: Vec<usize> = order
        .iter()
        .rev()
        .copied()
        .filter(|&i| doomed(i) && waiting[i] == 0)
        .collect();
    while let Some(i) = ready.pop() {
        done[i] = true;
        out.push(entries[i].id.clone());
        if let Some(p) = parent_of(i)
            && doomed(p)
        {
            waiting[p] -= 1;
            if waiting[p] == 0 {
                ready.push(p);
            }
        }
    }
    match order.iter().find(|&&i| doomed(i) && !done[i]) {
        Some(&i) => Err(RetentionError::ParentCycle(entries[i].id.clone())),
        None => Ok(out),
    }
}

#[cfg(test)]
mod tests;
