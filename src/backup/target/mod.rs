//! Received-subvolume targets: `backup run --target DIR|ssh://HOST/DIR`
//! receives each snapshot into DIR on the backup host's btrfs, as
//! btrbk's send-receive does, and `backup forget --target` prunes them.
//!
//! A target holds no catalog: what it has is what is in DIR. Each
//! snapshot becomes `DIR/NAME` (NAME: the snapshot's own name), received
//! by [`receive`](crate::receive) (on btrfs as root a read-only subvolume
//! with its received UUID, elsewhere a directory with its record), locally
//! or by `btrsend serve` on the far end. A source snapshot is on the
//! target when a complete subvolume there carries its UUID as received
//! UUID and its ctransid as stransid (as btrbk matches them), so the
//! parent of each incremental stream is the newest snapshot of the same
//! origin present on both sides. An interrupted receive leaves a partial
//! `DIR/NAME` with a resume point; the next run sends only the rest (the
//! far end's resume token), or, when the partial cannot be continued,
//! removes it ([`TargetEnd::discard`]) and sends the whole stream again.
//!
//! The parts: [`local`] (a directory on this host: the listing and the
//! receive), the far end's side of the protocol in
//! [`remote`](crate::backup::remote) (the same `Target*` requests), the
//! run in `run`, the pruning in [`mod@forget`] and `status`'s view in
//! [`mod@status`].

pub mod forget;
pub mod local;
mod run;
pub mod status;

use std::io::Write;

use serde::{Deserialize, Serialize};

pub use forget::{TargetForget, TargetVerdict, forget};
pub use run::{TargetReport, TargetStored, dry_run, run};
pub use status::{GroupStatus, TargetStatus, status};

use super::error::BackupError;
use super::remote::spec::SshSpec;
use super::remote::ssh::SshOptions;

/// A subvolume in a target directory, as [`TargetEnd::list`] describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Received {
    /// Its name in the directory ([`check_name`]).
    pub name: String,
    /// The UUID of the snapshot it was received from (its received UUID;
    /// a directory's record), hyphenated lowercase; `None` while it is
    /// incomplete.
    pub received_uuid: Option<String>,
    /// That snapshot's ctransid (the stransid).
    pub stransid: u64,
    /// Received completely: a read-only subvolume with its received UUID,
    /// or a directory whose record says complete.
    pub complete: bool,
    /// A btrfs subvolume (else a plain directory).
    pub subvolume: bool,
    /// An interrupted receive's resume directory names it.
    pub partial: bool,
    /// When it was made on the target (a subvolume's otime), RFC 3339.
    pub made: Option<String>,
}

/// The longest subvolume name (a directory entry's).
const NAME_MAX: usize = 255;

/// Check a subvolume name from the far end or a stream: one component,
/// not `.` or `..`, no NUL or control characters, not one of receive's
/// own (`.btrsend…`), at most 255 bytes.
///
/// # Errors
///
/// What is wrong, as text (the name made printable).
pub fn check_name(name: &str) -> Result<(), String> {
    let bad = name.is_empty()
        || name.len() > NAME_MAX
        || name == "."
        || name == ".."
        || name.starts_with(".btrsend")
        || name.contains('/')
        || name.chars().any(char::is_control);
    if bad {
        return Err(format!(
            "invalid subvolume name {:?}",
            super::remote::proto::printable(name)
        ));
    }
    Ok(())
}

/// Check a listing from a target (the far end's, or a directory someone
/// else can write): names valid and unique, UUIDs well formed.
///
/// # Errors
///
/// What is wrong, as text.
pub fn check_listing(list: &[Received]) -> Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    for r in list {
        check_name(&r.name)?;
        if !seen.insert(r.name.as_str()) {
            return Err(format!("subvolume {} is listed twice", r.name));
        }
        if let Some(u) = &r.received_uuid
            && uuid::Uuid::try_parse(u).map(|p| p.hyphenated().to_string()) != Ok(u.clone())
        {
            return Err(format!("subvolume {}: invalid received UUID", r.name));
        }
        if r.complete && r.received_uuid.is_none() {
            return Err(format!(
                "subvolume {}: complete without a received UUID",
                r.name
            ));
        }
        if let Some(t) = &r.made
            && t.parse::<jiff::Timestamp>().is_err()
        {
            return Err(format!("subvolume {}: invalid time", r.name));
        }
    }
    Ok(())
}

/// One end that receives: a directory here, or one served over ssh.
pub trait TargetEnd {
    /// The target as the user named it (for messages).
    fn name(&self) -> &str;
    /// Whether it refuses deletions (an append-only far end).
    fn append_only(&self) -> bool {
        false
    }
    /// Take the target directory's lock (see [`local::lock`]) for as long
    /// as this end lives, waiting up to `wait` for its holder.
    ///
    /// # Errors
    ///
    /// [`BackupError::LockHeld`] after the wait, or the far end's error.
    fn lock(&mut self, wait: std::time::Duration) -> Result<(), BackupError>;
    /// The subvolumes in the directory, checked ([`check_listing`]).
    ///
    /// # Errors
    ///
    /// The directory cannot be read, or the far end's answer is wrong.
    fn list(&mut self) -> Result<Vec<Received>, BackupError>;
    /// The resume token of the partial subvolume `name` (`None`: it has
    /// no resume point).
    ///
    /// # Errors
    ///
    /// The far end failed or answered wrongly.
    fn resume_token(&mut self, name: &str) -> Result<Option<crate::resume::Token>, BackupError>;
    /// Receive the stream `send` writes (the whole stream, or a
    /// continuation of a partial).
    ///
    /// # Errors
    ///
    /// The send's error, or the receive's (named as the far end said it).
    fn receive(
        &mut self,
        send: &mut dyn FnMut(&mut dyn Write) -> Result<(), BackupError>,
    ) -> Result<(), BackupError>;
    /// Remove what an interrupted receive left of `name`.
    ///
    /// # Errors
    ///
    /// Refused (not a partial the receive made) or failed.
    fn discard(&mut self, name: &str) -> Result<(), BackupError>;
    /// The bytes free on the target's filesystem (`None`: a far end,
    /// which is not asked).
    ///
    /// # Errors
    ///
    /// The filesystem cannot be asked.
    fn free_bytes(&mut self) -> Result<Option<u64>, BackupError> {
        Ok(None)
    }
    /// Delete the received subvolume `name`.
    ///
    /// # Errors
    ///
    /// Refused (append-only, not a complete received subvolume) or failed.
    fn delete(&mut self, name: &str) -> Result<(), BackupError>;
}

/// Open the target `spec` names: `ssh://[USER@]HOST[:PORT]/DIR` or a
/// local directory (which must exist).
///
/// # Errors
///
/// A malformed address, a missing directory, an unreachable host.
pub fn open(spec: &str, ssh: &SshOptions) -> Result<Box<dyn TargetEnd>, BackupError> {
    if let Some(parsed) = SshSpec::parse(spec) {
        let parsed = parsed.map_err(BackupError::Invalid)?;
        let end = super::remote::ssh::open_target(spec, &parsed, ssh)?;
        return Ok(Box::new(end));
    }
    if spec.contains("://") {
        return Err(BackupError::Invalid(format!(
            "target {spec:?}: a target is a directory or ssh://[USER@]HOST[:PORT]/DIR"
        )));
    }
    Ok(Box::new(local::LocalTarget::open(std::path::Path::new(
        spec,
    ))?))
}

/// The id a target's hold record in a snapshot directory has (see
/// [`holds`](crate::backup::holds)): a hash of the target as named, so
/// the same target keeps the same record.
pub fn hold_id(target: &str) -> String {
    let h = blake3::hash(format!("btrsend target {target}").as_bytes());
    h.to_hex()[..32].to_owned()
}

/// The group a received subvolume's retention counts in: its name without
/// the time or number at its end, that is, without the longest tail that
/// starts with a digit (after one optional `.`, `-` or `_`) and holds only
/// digits and `T`, `Z`, `:`, `+`, `-`, `_`, `.`: snapshot names as
/// `backup run --snapshot` and btrbk make them (`home.2026-11-20T030000Z`,
/// `home.2026-11-20T030000Z_2`, `home.20261120T0300`) and numbered ones
/// (`home.7`, `home7`) are all in group `home`. A name that is all such a
/// tail, or has none, is its own group.
pub fn group_of(name: &str) -> &str {
    let b = name.as_bytes();
    let tail = |c: u8| c.is_ascii_digit() || b"TZ:+-_.".contains(&c);
    // The longest run of tail characters at the end.
    let mut i = b.len();
    while i > 0 && tail(b[i - 1]) {
        i -= 1;
    }
    // It must start with a digit, or a separator and then a digit.
    while i < b.len() && !b[i].is_ascii_digit() {
        let sep = b"._-".contains(&b[i]) && b.get(i + 1).is_some_and(u8::is_ascii_digit);
        if sep {
            break;
        }
        i += 1;
    }
    match name.get(..i) {
        Some(base) if !base.is_empty() && i < b.len() => base,
        _ => name,
    }
}

/// The time retention gives a received subvolume: the time in its name
/// when `backup run --snapshot` named it, else when it was made on the
/// target (its otime: when it was received).
pub fn time_of(r: &Received) -> Option<jiff::Timestamp> {
    let base = group_of(&r.name);
    if base != r.name
        && let Some((t, _)) = super::snapshots::parse_snapshot_seq(base, &r.name)
    {
        return Some(t);
    }
    r.made.as_deref()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(check_name("home.2026-11-20T030000Z").is_ok());
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "../x",
            ".btrsend",
            ".btrsend-resume",
            "a\nb",
            "a\u{1b}[2J",
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_name(&"x".repeat(256)).is_err());
    }

    #[test]
    fn groups_and_times() {
        assert_eq!(group_of("home.2026-11-20T030000Z"), "home");
        assert_eq!(group_of("home.2026-11-20T030000Z_2"), "home");
        assert_eq!(group_of("home.20261120T0300"), "home");
        assert_eq!(group_of("home.20261120T030000+0100"), "home");
        assert_eq!(group_of("home.7"), "home");
        assert_eq!(group_of("day1"), "day");
        assert_eq!(group_of("backup-2024-01"), "backup");
        assert_eq!(group_of("a.b"), "a.b");
        assert_eq!(group_of("DATAZ"), "DATAZ");
        assert_eq!(group_of("x1y"), "x1y");
        assert_eq!(group_of(".7"), ".7");
        assert_eq!(group_of("2026"), "2026");
        assert_eq!(group_of("v.T1"), "v.T");
        let r = Received {
            name: "home.2026-11-20T030000Z".into(),
            received_uuid: None,
            stransid: 0,
            complete: false,
            subvolume: true,
            partial: false,
            made: Some("2026-11-29T00:00:00Z".into()),
        };
        assert_eq!(time_of(&r).unwrap().to_string(), "2026-11-20T03:00:00Z");
        let r = Received {
            name: "day1".into(),
            ..r
        };
        assert_eq!(time_of(&r).unwrap().to_string(), "2026-11-29T00:00:00Z");
    }

    #[test]
    fn listings_from_the_far_end_are_checked() {
        let ok = Received {
            name: "day1".into(),
            received_uuid: Some("0c4e6a0e-7c1d-4a5e-9a55-2f7b3c0e9d11".into()),
            stransid: 7,
            complete: true,
            subvolume: true,
            partial: false,
            made: None,
        };
        assert!(check_listing(std::slice::from_ref(&ok)).is_ok());
        assert!(check_listing(&[ok.clone(), ok.clone()]).is_err());
        let mut bad = ok.clone();
        bad.name = "../etc".into();
        assert!(check_listing(&[bad]).is_err());
        let mut bad = ok.clone();
        bad.received_uuid = Some("0C4E6A0E-7C1D-4A5E-9A55-2F7B3C0E9D11".into());
        assert!(check_listing(&[bad]).is_err());
        let mut bad = ok;
        bad.received_uuid = None;
        assert!(check_listing(&[bad]).is_err());
    }
}
