//! `btrsend list`: the subvolumes of a filesystem read straight from its devices.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

use btrsend::fs::Filesystem;
use btrsend::fs::subvol::{Subvolume, list_subvolumes};
use btrsend::types::Uuid;
use clap::Args;

/// Arguments of `btrsend list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// A device or image file of the filesystem (repeat for multi-device filesystems).
    #[arg(short = 'd', long = "device", value_name = "PATH", required = true)]
    pub devices: Vec<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// List the subvolumes.
pub fn run(args: &ListArgs) -> anyhow::Result<()> {
    let fs = Filesystem::open(&args.devices)?;
    for notice in fs.volume().notices() {
        eprintln!("btrsend: warning: {notice}");
    }
    let subvols = list_subvolumes(&fs)?;
    let text = if args.json {
        json(&subvols)
    } else {
        table(&subvols)
    };
    std::io::stdout().lock().write_all(text.as_bytes())?;
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

fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn json_uuid(out: &mut String, u: &Uuid) {
    if u.is_nil() {
        out.push_str("null");
    } else {
        json_string(out, &u.to_string());
    }
}

/// A JSON array with one object per subvolume. Paths that are not UTF-8
/// show their odd bytes as `\xNN` text.
pub fn json(subvols: &[Subvolume]) -> String {
    let mut out = String::from("[");
    for (i, s) in subvols.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            "\n  {{\"id\": {}, \"generation\": {}, \"parent_id\": {}, \"path\": ",
            s.id(),
            s.root.generation,
            s.parent
        );
        json_string(&mut out, &display_path(&s.path));
        out.push_str(", \"uuid\": ");
        json_uuid(&mut out, &s.root.uuid);
        out.push_str(", \"parent_uuid\": ");
        json_uuid(&mut out, &s.root.parent_uuid);
        out.push_str(", \"received_uuid\": ");
        json_uuid(&mut out, &s.root.received_uuid);
        let _ = write!(out, ", \"readonly\": {}}}", s.root.is_readonly());
    }
    out.push_str(if subvols.is_empty() { "]\n" } else { "\n]\n" });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_path_bytes_are_escaped() {
        assert_eq!(display_path(b"a/\xff\xfeb/\xc3\xa9"), "a/\\xff\\xfeb/é");
        let mut s = String::new();
        json_string(&mut s, "q\"\\\n");
        assert_eq!(s, "\"q\\\"\\\\\\u000a\"");
    }

    #[test]
    fn empty_list() {
        assert_eq!(json(&[]), "[]\n");
        assert_eq!(table(&[]).lines().count(), 1);
    }
}
