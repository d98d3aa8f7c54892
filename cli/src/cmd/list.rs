//! `btrsend list`: the subvolumes of a filesystem read straight from its devices.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

use btrsend::device::readahead::ReadOptions;
use btrsend::fs::Filesystem;
use btrsend::fs::items::Timespec;
use btrsend::fs::subvol::{Subvolume, list_subvolumes};
use btrsend::types::Uuid;
use clap::{Args, ValueHint};
use serde_json::{Value, json};

/// Arguments of `btrsend list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// A device or image file of the filesystem (repeat for multi-device filesystems).
    #[arg(short = 'd', long = "device", value_name = "PATH", required = true, value_hint = ValueHint::FilePath)]
    pub devices: Vec<PathBuf>,
    /// Print JSON instead of a table: an array with one object per
    /// subvolume, with the keys id, parent_id, path, generation, uuid,
    /// parent_uuid, received_uuid (null when nil), readonly, ctransid,
    /// otransid, stransid, rtransid, and the times otime (created), ctime
    /// (last changed), stime (sent) and rtime (received) as RFC 3339 in UTC
    /// with nanoseconds, null where not set (e.g. stime and rtime of a
    /// subvolume that was not received).
    #[arg(long)]
    pub json: bool,
    /// Read a filesystem some of whose devices are missing from the
    /// remaining copies (RAID1, RAID10, DUP on the others; RAID5/6 from
    /// parity), as `mount -o degraded` does. Without it, a device the
    /// filesystem lists that is not given is an error naming its devid and
    /// uuid.
    #[arg(long)]
    pub degraded: bool,
}

/// List the subvolumes.
pub fn run(args: &ListArgs) -> anyhow::Result<()> {
    let read = ReadOptions::default().with_degraded(args.degraded);
    let fs = Filesystem::open_with(&args.devices, &read)?;
    for notice in fs.volume().notices() {
        eprintln!("btrsend: warning: {notice}");
    }
    let subvols = list_subvolumes(&fs)?;
    let text = if args.json {
        json(&subvols)
    } else {
        table(&subvols)
    };
    crate::exit::stdout().write_all(text.as_bytes())?;
    Ok(())
}

fn uuid_or_dash(u: &Uuid) -> String {
    if u.is_nil() {
        "-".to_owned()
    } else {
        u.to_string()
    }
}

/// Path bytes for the terminal: UTF-8 as is, other bytes as `\xNN`.
fn display_path(path: &[u8]) -> String {
    let mut out = String::new();
    for chunk in path.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// One row per subvolume, like `btrfs subvolume list -p -u -q -R` plus a
/// read-only column; the path is relative to the top-level subvolume.
pub fn table(subvols: &[Subvolume]) -> String {
    let mut out = format!(
        "{:>6} {:>8} {:>6} {:3} {:36} {:36} {:36} PATH\n",
        "ID", "GEN", "PARENT", "RO", "UUID", "PARENT UUID", "RECEIVED UUID"
    );
    for s in subvols {
        let _ = writeln!(
            out,
            "{:>6} {:>8} {:>6} {:3} {:36} {:36} {:36} {}",
            s.id().to_string(),
            s.root.generation.to_string(),
            s.parent.to_string(),
            if s.root.is_readonly() { "yes" } else { "no" },
            uuid_or_dash(&s.root.uuid),
            uuid_or_dash(&s.root.parent_uuid),
            uuid_or_dash(&s.root.received_uuid),
            display_path(&s.path),
        );
    }
    out
}

/// `null` for the nil UUID, else its text.
fn json_uuid(u: &Uuid) -> Value {
    if u.is_nil() {
        Value::Null
    } else {
        Value::String(u.to_string())
    }
}

/// A root item time as RFC 3339 in UTC with nanoseconds
/// (`2026-11-24T00:23:38.123456789Z`), or `null` when it is not set (zero)
/// or not a valid time.
fn json_time(t: &Timespec) -> Value {
    if t.sec == 0 && t.nsec == 0 {
        return Value::Null;
    }
    let nsec = i32::try_from(t.nsec).unwrap_or(i32::MAX);
    match jiff::Timestamp::new(t.sec, nsec) {
        Ok(ts) => Value::String(ts.to_string()),
        Err(_) => Value::Null,
    }
}

/// A JSON array with one object per subvolume (the keys are listed in
/// `--help`). Paths that are not UTF-8 show their odd bytes as `\xNN` text.
pub fn json(subvols: &[Subvolume]) -> String {
    let rows: Vec<Value> = subvols
        .iter()
        .map(|s| {
            let r = &s.root;
            json!({
                "id": s.id().0,
                "generation": r.generation.get(),
                "parent_id": s.parent.0,
                "path": display_path(&s.path),
                "uuid": json_uuid(&r.uuid),
                "parent_uuid": json_uuid(&r.parent_uuid),
                "received_uuid": json_uuid(&r.received_uuid),
                "readonly": r.is_readonly(),
                "ctransid": r.ctransid.get(),
                "otransid": r.otransid.get(),
                "stransid": r.stransid.get(),
                "rtransid": r.rtransid.get(),
                "otime": json_time(&r.otime),
                "ctime": json_time(&r.ctime),
                "stime": json_time(&r.stime),
                "rtime": json_time(&r.rtime),
            })
        })
        .collect();
    // OK to unwrap: a Value made of strings, numbers and bools always serializes.
    let mut out = serde_json::to_string_pretty(&Value::Array(rows)).unwrap_or_default();
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_path_bytes_are_escaped() {
        assert_eq!(display_path(b"a/\xff\xfeb/\xc3\xa9"), "a/\\xff\\xfeb/é");
    }

    #[test]
    fn times_are_rfc3339_utc_or_null() {
        let t = |sec, nsec| json_time(&Timespec { sec, nsec });
        assert_eq!(t(0, 0), Value::Null);
        assert_eq!(t(1_764_000_000, 5), "2025-11-24T16:00:00.000000005Z");
        assert_eq!(t(-1, 0), "1969-12-31T23:59:59Z");
        assert_eq!(t(i64::MAX, 0), Value::Null);
    }

    #[test]
    fn empty_list() {
        assert_eq!(json(&[]), "[]\n");
        assert_eq!(table(&[]).lines().count(), 1);
    }
}
