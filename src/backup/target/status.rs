//! `backup status --target`: per group of received subvolumes (see
//! [`group_of`]), the newest one received completely, its age and whether
//! it is older than `--max-age`. Only the listing is read.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Received, group_of, time_of};

/// One group's state.
#[derive(Debug, Clone)]
pub struct GroupStatus {
    /// The group.
    pub group: String,
    /// Subvolumes received completely.
    pub complete: usize,
    /// Partial or incomplete receives.
    pub partial: usize,
    /// The newest subvolume received completely (by time, then stransid).
    pub newest: Option<Received>,
    /// Its time.
    pub time: Option<jiff::Timestamp>,
    /// Seconds from its time to now (`None`: no time, or none complete).
    pub age_seconds: Option<i64>,
    /// Older than the maximum age, or with nothing complete.
    pub stale: bool,
}

/// A target's state.
#[derive(Debug, Clone, Default)]
pub struct TargetStatus {
    /// By group name.
    pub groups: Vec<GroupStatus>,
    /// Some group stale, or (with a maximum age) no subvolume at all.
    pub stale: bool,
}

/// The state of the subvolumes `list` at `now`; with `max_age`, a group
/// whose newest complete subvolume is that old or older (or has no time,
/// or none) is stale, and so is an empty target.
pub fn status(list: &[Received], now: jiff::Timestamp, max_age: Option<Duration>) -> TargetStatus {
    let mut by: BTreeMap<&str, Vec<&Received>> = BTreeMap::new();
    for r in list {
        by.entry(group_of(&r.name)).or_default().push(r);
    }
    let mut out = TargetStatus::default();
    for (group, rs) in by {
        let newest = rs
            .iter()
            .filter(|r| r.complete)
            .max_by_key(|r| (time_of(r), r.stransid))
            .copied();
        let time = newest.and_then(time_of);
        let age_seconds = time.map(|t| now.as_second() - t.as_second());
        let stale = max_age.is_some_and(|max| {
            age_seconds.is_none_or(|a| a >= i64::try_from(max.as_secs()).unwrap_or(i64::MAX))
        });
        out.stale |= stale;
        out.groups.push(GroupStatus {
            group: group.to_owned(),
            complete: rs.iter().filter(|r| r.complete).count(),
            partial: rs.iter().filter(|r| !r.complete).count(),
            newest: newest.cloned(),
            time,
            age_seconds,
            stale,
        });
    }
    if max_age.is_some() && out.groups.is_empty() {
        out.stale = true;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(name: &str, complete: bool, made: &str) -> Received {
        Received {
            name: name.into(),
            received_uuid: complete.then(|| "0c4e6a0e-7c1d-4a5e-9a55-2f7b3c0e9d11".into()),
            stransid: 1,
            complete,
            subvolume: true,
            partial: !complete,
            made: Some(made.into()),
        }
    }

    #[test]
    fn newest_per_group_and_staleness() {
        let now: jiff::Timestamp = "2026-11-29T12:00:00Z".parse().unwrap();
        let list = [
            r("home.2026-11-28T030000Z", true, "2026-11-28T03:01:00Z"),
            r("home.2026-11-29T030000Z", false, "2026-11-29T03:01:00Z"),
            r("root.1", true, "2026-11-20T00:00:00Z"),
        ];
        let s = status(&list, now, Some(Duration::from_secs(26 * 3600)));
        assert_eq!(s.groups.len(), 2);
        let home = &s.groups[0];
        assert_eq!(home.group, "home");
        assert_eq!(
            home.newest.as_ref().unwrap().name,
            "home.2026-11-28T030000Z"
        );
        assert_eq!(home.age_seconds, Some(33 * 3600));
        assert_eq!((home.complete, home.partial), (1, 1));
        assert!(home.stale);
        assert!(s.stale);
        let s = status(&list, now, Some(Duration::from_secs(34 * 3600)));
        assert!(!s.groups[0].stale && s.groups[1].stale);
        assert!(!status(&list, now, None).stale);
        assert!(status(&[], now, Some(Duration::from_secs(1))).stale);
        assert!(!status(&[], now, None).stale);
    }
}
