use std::collections::{HashMap, HashSet};

use jiff::civil::date;
use jiff::tz::{Offset, TimeZone};
use jiff::{Timestamp, ToSpan};

use super::*;

fn utc(y: i16, m: i8, d: i8, h: i8) -> Timestamp {
    date(y, m, d)
        .at(h, 0, 0, 0)
        .in_tz("UTC")
        .unwrap()
        .timestamp()
}

/// Entries with ids 1, 2, … in the order given, one origin, no parents.
fn timeline(times: &[Timestamp]) -> Vec<Candidate<u64>> {
    times
        .iter()
        .zip(1..)
        .map(|(&time, id)| Candidate {
            id,
            origin: "o".into(),
            time,
            parent: None,
        })
        .collect()
}

/// A time long after every entry of the tests.
fn far_future() -> Timestamp {
    utc(2100, 1, 1, 0)
}

fn kept(plan: &Plan<u64>) -> Vec<u64> {
    let mut ids: Vec<u64> = plan
        .decisions
        .iter()
        .filter(|d| d.keep)
        .map(|d| d.id)
        .collect();
    ids.sort_unstable();
    ids
}

fn reasons(plan: &Plan<u64>, id: u64) -> Vec<String> {
    let d = plan.decisions.iter().find(|d| d.id == id).unwrap();
    d.reasons.iter().map(ToString::to_string).collect()
}

#[test]
fn restic_twelve_sundays_keep_daily_4() {
    // restic's documentation (doc/060_forget.rst): one backup every Sunday
    // for 12 weeks, 2019-09-01 to 2019-11-17 at 11:00; `--keep-daily 4`
    // keeps the last four Sundays and removes the other eight.
    let times: Vec<Timestamp> = (0..12)
        .map(|w| {
            utc(2019, 9, 1, 11)
                .checked_add((w * 7 * 24).hours())
                .unwrap()
        })
        .collect();
    let entries = timeline(&times);
    let policy = Policy {
        daily: Keep::Count(4),
        ..Policy::default()
    };
    let plan = plan(&entries, &policy, far_future(), &TimeZone::UTC).unwrap();
    assert_eq!(kept(&plan), vec![9, 10, 11, 12]);
    assert_eq!(entries[8].time, utc(2019, 10, 27, 11));
    assert_eq!(reasons(&plan, 12), vec!["daily"]);
    assert_eq!(plan.delete_order.len(), 8);
}

#[test]
fn iso_year_boundary_keep_weekly_2() {
    // 2024-12-30 and 2024-12-31 are in ISO week 1 of 2025, with
    // 2025-01-01; 2024-12-20 is in week 51 of 2024. `--keep-weekly 2` keeps
    // the newest of week 2025-W01 and the newest of 2024-W51.
    let entries = timeline(&[
        utc(2024, 12, 20, 12),
        utc(2024, 12, 30, 12),
        utc(2024, 12, 31, 12),
        utc(2025, 1, 1, 12),
    ]);
    let policy = Policy {
        weekly: Keep::Count(2),
        ..Policy::default()
    };
    let plan = plan(&entries, &policy, far_future(), &TimeZone::UTC).unwrap();
    assert_eq!(kept(&plan), vec![1, 4]);
    // A calendar-year week would split 2024-12-31 from 2025-01-01 instead.
    assert_eq!(plan.delete_order, vec![3, 2]);
}

#[test]
fn oldest_entry_kept_while_a_count_is_left() {
    // Three entries on one day: the newest starts the day; the oldest is
    // kept too while --keep-daily has counts left, and only then.
    let entries = timeline(&[utc(2025, 3, 1, 8), utc(2025, 3, 1, 9), utc(2025, 3, 1, 10)]);
    let daily = |keep| Policy {
        daily: keep,
        ..Policy::default()
    };
    let p = plan(
        &entries,
        &daily(Keep::Count(2)),
        far_future(),
        &TimeZone::UTC,
    )
    .unwrap();
    assert_eq!(kept(&p), vec![1, 3]);
    assert_eq!(reasons(&p, 1), vec!["oldest daily"]);
    let p = plan(
        &entries,
        &daily(Keep::Unlimited),
        far_future(),
        &TimeZone::UTC,
    )
    .unwrap();
    assert_eq!(kept(&p), vec![1, 3]);
    let p = plan(
        &entries,
        &daily(Keep::Count(1)),
        far_future(),
        &TimeZone::UTC,
    )
    .unwrap();
    assert_eq!(kept(&p), vec![3]);
}

#[test]
fn keep_last_and_unlimited() {
    let entries = timeline(&[utc(2025, 1, 1, 0), utc(2025, 1, 2, 0), utc(2025, 1, 3, 0)]);
    let last = |keep| Policy {
        last: keep,
        ..Policy::default()
    };
    let p = plan(
        &entries,
        &last(Keep::Count(2)),
        far_future(),
        &TimeZone::UTC,
    )
    .unwrap();
    assert_eq!(kept(&p), vec![2, 3]);
    let p = plan(
        &entries,
        &last(Keep::Unlimited),
        far_future(),
        &TimeZone::UTC,
    )
    .unwrap();
    assert_eq!(kept(&p), vec![1, 2, 3]);
}

#[test]
fn periods_follow_the_time_zone() {
    // 2025-06-01 12:00 and 15:00 UTC are one day in UTC, two days at +10:00
    // (22:00 on the 1st and 01:00 on the 2nd).
    let entries = timeline(&[utc(2025, 6, 1, 12), utc(2025, 6, 1, 15)]);
    let policy = Policy {
        daily: Keep::Count(1),
        ..Policy::default()
    };
    let p = plan(&entries, &policy, far_future(), &TimeZone::UTC).unwrap();
    assert_eq!(kept(&p), vec![2]);
    let plus10 = TimeZone::fixed(Offset::constant(10));
    let policy = Policy {
        daily: Keep::Count(2),
        ..Policy::default()
    };
    let p = plan(&entries, &policy, far_future(), &plus10).unwrap();
    assert_eq!(kept(&p), vec![1, 2]);
    assert_eq!(reasons(&p, 1), vec!["daily"]);
}

#[test]
fn keep_within_counts_back_from_the_newest_entry() {
    // Daily entries 2025-01-01 .. 2025-01-10 at noon; --keep-within 3d keeps
    // those strictly after 2025-01-07 12:00.
    let times: Vec<Timestamp> = (1..=10).map(|d| utc(2025, 1, d, 12)).collect();
    let entries = timeline(&times);
    let policy = Policy {
        within: Some("3d".parse().unwrap()),
        ..Policy::default()
    };
    let p = plan(&entries, &policy, far_future(), &TimeZone::UTC).unwrap();
    assert_eq!(kept(&p), vec![8, 9, 10]);
    assert_eq!(reasons(&p, 8), vec!["within 3d"]);
    // Hours are exact: 3d1h reaches 2025-01-07 11:00, keeping the 7th.
    let policy = Policy {
        within: Some("3d1h".parse().unwrap()),
        ..Policy::default()
    };
    let p = plan(&entries, &policy, far_future(), &TimeZone::UTC).unwrap();
    assert_eq!(kept(&p), vec![7, 8, 9, 10]);
    // Months are calendar months, clamped: 1m back from 2025-03-31 is
    // 2025-02-28, so an entry on 2025-02-28 at 13:00 is within.
    let entries = timeline(&[
        utc(2025, 2, 28, 11),
        utc(2025, 2, 28, 13),
        utc(2025, 3, 31, 12),
    ]);
    let policy = Policy {
        within: Some("1m".parse().unwrap()),
        ..Policy::default()
    };
    let p = plan(&entries, &policy, far_future(), &TimeZone::UTC).unwrap();
    assert_eq!(kept(&p), vec![2, 3]);
}

#[test]
fn entries_in_the_future_are_never_deleted_nor_anchor_keep_within() {
    let now = utc(2025, 5, 10, 0);
    let entries = timeline(&[
        utc(2025, 5, 1, 0),
        utc(2025, 5, 8, 0),
        utc(2025, 5, 9, 0),
        utc(2025, 5, 20, 0),
    ]);
    let policy = Policy {
        within: Some("1d12h".parse().unwrap()),
        ..Policy::default()
    };
    let p = plan(&entries, &policy, now, &TimeZone::UTC).unwrap();
    // Anchored at 2025-05-09 (the newest not after now): the 8th and 9th
    // are within; the 20th is kept as newer than now (and is within too).
    assert_eq!(kept(&p), vec![2, 3, 4]);
    assert_eq!(reasons(&p, 4), vec!["newer than now", "within 1d12h"]);
    // Only the future entry would be kept by an anchor at the 20th.
    let policy = Policy {
        last: Keep::Count(1),
        ..Policy::default()
    };
    let p = plan(&entries, &policy, now, &TimeZone::UTC).unwrap();
    assert_eq!(kept(&p), vec![4]);
}

#[test]
fn ancestors_of_kept_entries_are_kept() {
    // full 1 <- 2 <- 3 <- 4, then a new full 5 <- 6 (as --full-every 4
    // makes): keeping the newest keeps 5; keeping 2 entries keeps 4 and
    // its whole chain.
    let mut entries = timeline(&[
        utc(2025, 1, 1, 0),
        utc(2025, 1, 2, 0),
        utc(2025, 1, 3, 0),
        utc(2025, 1, 4, 0),
        utc(2025, 1, 5, 0),
        utc(2025, 1, 6, 0),
    ]);
    for (child, parent) in [(2, 1), (3, 2), (4, 3), (6, 5)] {
        entries[child - 1].parent = Some(parent as u64);
    }
    let last = |n| Policy {
        last: Keep::Count(n),
        ..Policy::default()
    };
    let p = plan(&entries, &last(1), far_future(), &TimeZone::UTC).unwrap();
    assert_eq!(kept(&p), vec![5, 6]);
    assert_eq!(reasons(&p, 5), vec!["parent of 6"]);
    // Children before parents.
    assert_eq!(p.delete_order, vec![4, 3, 2, 1]);

    let p = plan(&entries, &last(3), far_future(), &TimeZone::UTC).unwrap();
    assert_eq!(kept(&p), vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(reasons(&p, 4), vec!["last"]);
    assert_eq!(reasons(&p, 3), vec!["parent of 4"]);
    assert_eq!(reasons(&p, 1), vec!["parent of 2"]);
    assert!(p.delete_order.is_empty());
}

#[test]
fn origins_are_apart() {
    let mut entries = timeline(&[utc(2025, 1, 1, 0), utc(2025, 1, 2, 0), utc(2025, 1, 3, 0)]);
    entries[0].origin = "other".into();
    let policy = Policy {
        last: Keep::Count(1),
        ..Policy::default()
    };
    let p = plan(&entries, &policy, far_future(), &TimeZone::UTC).unwrap();
    assert_eq!(kept(&p), vec![1, 3]);
}

#[test]
fn refused_inputs() {
    let entries = timeline(&[utc(2025, 1, 1, 0)]);
    let empty = Policy {
        last: Keep::Count(0),
        within: Some(Within::default()),
        ..Policy::default()
    };
    let err = plan(&entries, &empty, far_future(), &TimeZone::UTC).unwrap_err();
    assert_eq!(err, RetentionError::EmptyPolicy);
    assert!(err.to_string().starts_with("refusing an empty policy"));

    let policy = Policy {
        last: Keep::Count(1),
        ..Policy::default()
    };
    let mut twice = timeline(&[utc(2025, 1, 1, 0), utc(2025, 1, 2, 0)]);
    twice[1].id = 1;
    let err = plan(&twice, &policy, far_future(), &TimeZone::UTC).unwrap_err();
    assert_eq!(err.to_string(), "catalog entry 1 is listed twice");

    // 1 <- 2 <- 1, both older than the kept 3: never an endless loop.
    let mut cycle = timeline(&[utc(2025, 1, 1, 0), utc(2025, 1, 2, 0), utc(2025, 1, 3, 0)]);
    cycle[0].parent = Some(2);
    cycle[1].parent = Some(1);
    let err = plan(&cycle, &policy, far_future(), &TimeZone::UTC).unwrap_err();
    assert!(matches!(err, RetentionError::ParentCycle(_)), "{err}");
    // The same cycle under a kept entry is kept whole (no loop either).
    cycle[2].parent = Some(1);
    let p = plan(&cycle, &policy, far_future(), &TimeZone::UTC).unwrap();
    assert_eq!(kept(&p), vec![1, 2, 3]);
}

#[test]
fn parsing() {
    assert_eq!(
        "1y2m3d4h".parse::<Within>().unwrap(),
        Within {
            years: 1,
            months: 2,
            days: 3,
            hours: 4
        }
    );
    assert_eq!("4h1y".parse::<Within>().unwrap().to_string(), "1y4h");
    for bad in ["", "1", "d", "1w", "1d1d", "-1d", "1.5d", "1d "] {
        let err = bad.parse::<Within>().unwrap_err();
        assert!(err.starts_with("invalid duration"), "{bad:?}: {err}");
    }
    assert_eq!("-1".parse::<Keep>(), Ok(Keep::Unlimited));
    assert_eq!("unlimited".parse::<Keep>(), Ok(Keep::Unlimited));
    assert_eq!("0".parse::<Keep>(), Ok(Keep::Nothing));
    assert_eq!("7".parse::<Keep>(), Ok(Keep::Count(7)));
    assert!("-2".parse::<Keep>().is_err());
}

/// splitmix64: a small seeded generator for the property test.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The policy part written the straightforward way, from the option
/// descriptions: for each option, the distinct periods newest first; the
/// newest entry of each of the first N is kept; if the periods run out
/// before the count does (or the count is unlimited), the oldest entry is
/// kept too. --keep-within and future entries as documented.
fn reference_policy(
    entries: &[Candidate<u64>],
    policy: &Policy,
    now: Timestamp,
    tz: &TimeZone,
) -> HashSet<u64> {
    let mut keep = HashSet::new();
    let mut origins: Vec<&str> = entries.iter().map(|e| e.origin.as_str()).collect();
    origins.sort_unstable();
    origins.dedup();
    for origin in origins {
        let mut group: Vec<&Candidate<u64>> =
            entries.iter().filter(|e| e.origin == origin).collect();
        group.sort_by(|a, b| b.time.cmp(&a.time).then(b.id.cmp(&a.id)));
        for e in &group {
            if e.time > now {
                keep.insert(e.id);
            }
        }
        if let Some(w) = policy.within.filter(|w| *w != Within::default())
            && let Some(latest) = group.iter().map(|e| e.time).find(|t| *t <= now)
        {
            let z = latest.to_zoned(tz.clone());
            let back = z
                .checked_sub(Span::new().years(w.years).months(w.months).days(w.days))
                .unwrap()
                .checked_sub(Span::new().hours(w.hours))
                .unwrap()
                .timestamp();
            keep.extend(group.iter().filter(|e| e.time > back).map(|e| e.id));
        }
        for (period, count) in policy.counts() {
            let n = match count {
                Keep::Nothing | Keep::Count(0) => continue,
                Keep::Count(n) => Some(n as usize),
                Keep::Unlimited => None,
            };
            let mut periods: Vec<(i64, u64)> = Vec::new(); // (key, newest id)
            for (nr, e) in group.iter().enumerate() {
                let key = period.key(&e.time.to_zoned(tz.clone()), nr);
                if !periods.iter().any(|(k, _)| *k == key) {
                    periods.push((key, e.id));
                }
            }
            let take = n.map_or(periods.len(), |n| n.min(periods.len()));
            keep.extend(periods[..take].iter().map(|(_, id)| *id));
            if n.is_none_or(|n| n > periods.len()) {
                keep.insert(group.last().unwrap().id);
            }
        }
    }
    keep
}

fn random_keep(rng: &mut Rng) -> Keep {
    match rng.below(6) {
        0 | 1 => Keep::Nothing,
        2 => Keep::Unlimited,
        _ => Keep::Count(rng.below(8) as u32 + 1),
    }
}

#[test]
fn random_timelines_and_policies() {
    let zones = [
        TimeZone::UTC,
        TimeZone::fixed(Offset::constant(-7)),
        TimeZone::fixed(Offset::constant(13)),
    ];
    let start = utc(2020, 12, 20, 0);
    let mut checked = 0;
    for seed in 0..3000u64 {
        let mut rng = Rng(seed);
        let tz = &zones[(seed % 3) as usize];
        // Up to 60 entries over up to ~3 years, some bunched into hours,
        // some with equal times; 1-3 origins; parents older entries of the
        // same origin (or none: a full stream).
        let n = rng.below(60) as usize;
        let spread_hours = [48, 24 * 40, 24 * 400, 24 * 1100][rng.below(4) as usize];
        let mut entries: Vec<Candidate<u64>> = Vec::new();
        for id in 1..=n as u64 {
            let time = start
                .checked_add((rng.below(spread_hours) as i64).hours())
                .unwrap()
                .checked_add((rng.below(4) as i64 * 15).minutes())
                .unwrap();
            let origin = format!("o{}", rng.below(3).min(rng.below(3)));
            let older: Vec<u64> = entries
                .iter()
                .filter(|e| e.origin == origin && e.time <= time)
                .map(|e| e.id)
                .collect();
            let parent = if older.is_empty() || rng.below(4) == 0 {
                None
            } else {
                Some(older[rng.below(older.len() as u64) as usize])
            };
            entries.push(Candidate {
                id,
                origin,
                time,
                parent,
            });
        }
        let policy = Policy {
            last: random_keep(&mut rng),
            hourly: random_keep(&mut rng),
            daily: random_keep(&mut rng),
            weekly: random_keep(&mut rng),
            monthly: random_keep(&mut rng),
            yearly: random_keep(&mut rng),
            within: (rng.below(3) == 0).then(|| Within {
                years: rng.below(2) as u32,
                months: rng.below(3) as u32,
                days: rng.below(20) as u32,
                hours: rng.below(30) as u32,
            }),
        };
        // "now" is sometimes before the newest entries (clock skew).
        let now = start
            .checked_add((rng.below(spread_hours + 48) as i64).hours())
            .unwrap();
        let result = plan(&entries, &policy, now, tz);
        if policy.is_empty() {
            assert_eq!(result, Err(RetentionError::EmptyPolicy), "seed {seed}");
            continue;
        }
        let p = result.unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        checked += 1;
        assert_eq!(p.decisions.len(), entries.len(), "seed {seed}");

        let by_id: HashMap<u64, &Decision<u64>> = p.decisions.iter().map(|d| (d.id, d)).collect();
        let kept: HashSet<u64> = p
            .decisions
            .iter()
            .filter(|d| d.keep)
            .map(|d| d.id)
            .collect();
        // The policy part equals the straightforward implementation.
        let by_policy: HashSet<u64> = p
            .decisions
            .iter()
            .filter(|d| d.reasons.iter().any(|r| !matches!(r, Reason::ParentOf(_))))
            .map(|d| d.id)
            .collect();
        let reference = reference_policy(&entries, &policy, now, tz);
        assert_eq!(by_policy, reference, "seed {seed}: {policy:?}");
        // No kept entry lacks an ancestor; every parent-only keep is needed.
        let parent_of: HashMap<u64, Option<u64>> =
            entries.iter().map(|e| (e.id, e.parent)).collect();
        let mut needed = by_policy.clone();
        for &id in &by_policy {
            let mut cur = parent_of[&id];
            while let Some(p) = cur {
                assert!(
                    kept.contains(&p),
                    "seed {seed}: {p}, ancestor of kept {id}, deleted"
                );
                needed.insert(p);
                cur = parent_of[&p];
            }
        }
        assert_eq!(
            kept, needed,
            "seed {seed}: kept more than policy + ancestors"
        );
        // Future entries are kept; reasons only on kept entries.
        for e in &entries {
            let d = by_id[&e.id];
            assert_eq!(d.keep, !d.reasons.is_empty());
            if e.time > now {
                assert!(d.keep, "seed {seed}: future entry {} deleted", e.id);
            }
        }
        // Deletion: exactly the others, children before parents.
        let mut position = HashMap::new();
        for (i, id) in p.delete_order.iter().enumerate() {
            assert!(position.insert(*id, i).is_none());
            assert!(!kept.contains(id));
        }
        assert_eq!(position.len() + kept.len(), entries.len(), "seed {seed}");
        for e in &entries {
            if let (Some(pe), Some(&ce)) = (e.parent, position.get(&e.id))
                && let Some(&pp) = position.get(&pe)
            {
                assert!(pp > ce, "seed {seed}: parent {pe} deleted before {}", e.id);
            }
        }
    }
    assert!(checked > 2000, "only {checked} non-empty policies");
}

#[test]
fn entries_kept_only_for_a_chain_are_told_apart() {
    // 1 (full) <- 2 <- 3, then 4 (full) <- 5; --keep-last 1 per origin
    // keeps 5, its parent 4 only for the chain. --keep-last 2 keeps 4 for
    // itself too.
    let mut es = timeline(&[
        utc(2026, 1, 1, 3),
        utc(2026, 1, 2, 3),
        utc(2026, 1, 3, 3),
        utc(2026, 1, 4, 3),
        utc(2026, 1, 5, 3),
    ]);
    for (child, parent) in [(1, 1), (2, 2), (4, 4)] {
        es[child].parent = Some(parent);
    }
    let policy = |n| Policy {
        last: Keep::Count(n),
        ..Policy::default()
    };
    let only = |p: &Plan<u64>| -> Vec<u64> {
        let mut v: Vec<u64> = p
            .decisions
            .iter()
            .filter(|d| d.kept_only_for_chain())
            .map(|d| d.id)
            .collect();
        v.sort_unstable();
        v
    };
    let p = plan(&es, &policy(1), far_future(), &TimeZone::UTC).unwrap();
    assert_eq!(kept(&p), [4, 5]);
    assert_eq!(only(&p), [4]);
    // --keep-last 3: 3, 4, 5 by the policy; 1 and 2 for 3's chain.
    let p = plan(&es, &policy(3), far_future(), &TimeZone::UTC).unwrap();
    assert_eq!(kept(&p), [1, 2, 3, 4, 5]);
    assert_eq!(only(&p), [1, 2]);
    // A deleted entry is not "kept for a chain".
    let p = plan(&es, &policy(2), far_future(), &TimeZone::UTC).unwrap();
    assert_eq!(kept(&p), [4, 5]);
    assert_eq!(only(&p), Vec::<u64>::new());
}
