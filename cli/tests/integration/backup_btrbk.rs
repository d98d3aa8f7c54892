//! `btrsend backup config import-btrbk`: btrbk.conf files in the shapes of
//! the set-ups btrbk documents (btrbk.conf(5), btrbk's btrbk.conf.example
//! and README), written here (btrbk's own files are GPL-3 and stay out of
//! this repository). Each test states what btrbk's documentation says its
//! input means and checks that the TOML written says the same, parsed with
//! the `toml` crate; that every line with no equivalent is reported on
//! standard error at its line, with why; and that `backup config check`
//! accepts the file written.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use toml::{Table, Value};

use crate::common::{btrsend, ok, stderr};

/// A btrbk.conf written in a test's directory.
struct Conf {
    _dir: tempfile::TempDir,
    path: PathBuf,
    out: PathBuf,
    text: String,
}

impl Conf {
    fn new(text: &str) -> Conf {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("btrbk.conf");
        fs::write(&path, text).unwrap();
        let out = dir.path().join("btrsend.toml");
        Conf {
            _dir: dir,
            path,
            out,
            text: text.to_owned(),
        }
    }

    /// The number (from 1) of the one line that contains `needle`.
    #[track_caller]
    fn line(&self, needle: &str) -> usize {
        let hits: Vec<usize> = self
            .text
            .lines()
            .enumerate()
            .filter(|(_, l)| l.contains(needle))
            .map(|(i, _)| i + 1)
            .collect();
        assert_eq!(hits.len(), 1, "{needle:?} on lines {hits:?}");
        hits[0]
    }

    /// Import it to `out`; the output, the parsed TOML and the report.
    fn import(&self) -> (Output, Table, String) {
        let o = btrsend()
            .args(["backup", "config", "import-btrbk"])
            .arg(&self.path)
            .arg("-o")
            .arg(&self.out)
            .output()
            .unwrap();
        ok(&o);
        let text = fs::read_to_string(&self.out).unwrap();
        let table: Table = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let report = stderr(&o);
        // What was written is a config file btrsend accepts.
        let check = btrsend()
            .args(["backup", "config", "check", "--config"])
            .arg(&self.out)
            .output()
            .unwrap();
        ok(&check);
        (o, table, report)
    }

    /// The report's lines about line `n`.
    fn reported<'a>(&self, report: &'a str, n: usize) -> Vec<&'a str> {
        let prefix = format!("{}:{n}: ", self.path.display());
        report.lines().filter(|l| l.starts_with(&prefix)).collect()
    }

    /// Line `n` is reported once or more, with a reason containing `why`.
    #[track_caller]
    fn assert_reported(&self, report: &str, needle: &str, why: &str) {
        let n = self.line(needle);
        let lines = self.reported(report, n);
        assert!(
            lines.iter().any(|l| l.contains(why)),
            "line {n} ({needle:?}) not reported with {why:?}:\n{report}"
        );
    }

    /// None of the lines with these needles is reported.
    #[track_caller]
    fn assert_not_reported(&self, report: &str, needles: &[&str]) {
        for needle in needles {
            let n = self.line(needle);
            assert!(
                self.reported(report, n).is_empty(),
                "line {n} ({needle:?}) reported:\n{report}"
            );
        }
    }
}

fn job<'a>(t: &'a Table, name: &str) -> &'a Table {
    t["job"]
        .get(name)
        .and_then(Value::as_table)
        .unwrap_or_else(|| panic!("no job {name}: {t:#?}"))
}

fn jobs(t: &Table) -> Vec<String> {
    t.get("job")
        .and_then(Value::as_table)
        .map(|j| j.keys().cloned().collect())
        .unwrap_or_default()
}

fn dests(j: &Table) -> Vec<&Table> {
    j["destination"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_table().unwrap())
        .collect()
}

fn s<'a>(t: &'a Table, key: &str) -> &'a str {
    t.get(key)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string {key}: {t:#?}"))
}

fn int(t: &Table, key: &str) -> i64 {
    t.get(key)
        .and_then(Value::as_integer)
        .unwrap_or_else(|| panic!("no integer {key}: {t:#?}"))
}

const KEEPS: [&str; 7] = [
    "keep_last",
    "keep_hourly",
    "keep_daily",
    "keep_weekly",
    "keep_monthly",
    "keep_yearly",
    "keep_within",
];

/// The retention keys of a destination, as (key, value as written).
fn keeps(d: &Table) -> Vec<(String, String)> {
    KEEPS
        .iter()
        .filter_map(|k| {
            let v = match d.get(*k)? {
                Value::Integer(i) => i.to_string(),
                Value::String(s) => format!("{s:?}"),
                v => panic!("{k} = {v:?}"),
            };
            Some(((*k).to_owned(), v))
        })
        .collect()
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// btrbk.conf.example, "Simple setup" with its "Example retention
/// policy" (the README's "Example: Backups to USB Disk" has the same
/// policy): no volume section, so the subvolumes and snapshot_dir are
/// absolute paths; one target in global context for both. btrbk.conf(5):
/// target_preserve_min no means only target_preserve applies;
/// target_preserve "20d 10w *m" keeps daily backups 20 days back, weekly
/// ones 10 weeks back and every monthly one (`*` is "all").
/// snapshot_preserve_min 2d and snapshot_preserve 14d are a time span and
/// a schedule, which btrsend's keep_snapshots (a count) cannot say. The
/// other global options of the example have no equivalent.
#[test]
fn simple_setup_with_global_retention() {
    let c = Conf::new(
        "\
# global options
transaction_log            /var/log/btrbk.log
stream_buffer              256m
lockfile                   /var/lock/btrbk.lock
snapshot_preserve_min   2d
snapshot_preserve       14d
target_preserve_min     no
target_preserve         20d 10w *m

snapshot_dir /snaps
target       /mnt/backup_disk
subvolume    /
subvolume    /home
",
    );
    let (o, t, report) = c.import();
    assert!(o.stdout.is_empty(), "-o writes the file, not stdout");
    assert_eq!(jobs(&t), ["ROOT", "home"]);
    for (name, src) in [("ROOT", "/"), ("home", "/home")] {
        let j = job(&t, name);
        assert_eq!(s(j, "snapshot"), src);
        assert_eq!(s(j, "snapshot_dir"), "/snaps");
        assert!(j.get("keep_snapshots").is_none(), "snapshots all kept");
        let d = dests(j);
        assert_eq!(d.len(), 1);
        assert_eq!(s(d[0], "target"), "/mnt/backup_disk");
        assert_eq!(
            keeps(d[0]),
            pairs(&[
                ("keep_daily", "20"),
                ("keep_weekly", "10"),
                ("keep_monthly", "\"unlimited\"")
            ])
        );
    }
    c.assert_reported(&report, "transaction_log", "no transaction log");
    c.assert_reported(&report, "stream_buffer", "mbuffer");
    c.assert_reported(&report, "lockfile", "locks each repository");
    c.assert_reported(&report, "snapshot_preserve_min", "keep_snapshots");
    c.assert_reported(&report, "snapshot_preserve  ", "keep_snapshots");
    c.assert_not_reported(
        &report,
        &[
            "target_preserve_min",
            "target_preserve  ",
            "snapshot_dir",
            "target ",
            "subvolume    /home",
        ],
    );
    assert!(
        report.contains("2 jobs written, 5 lines not carried over"),
        "{report}"
    );
}

/// btrbk.conf.example, "Complex setup": a volume section (the top level
/// mounted), a relative snapshot_dir and target given per volume, so both
/// apply to every subvolume below; one subvolume overrides the global
/// retention ("Use different retention policy for kvm backups":
/// target_preserve 7d 4w, daily 7 days back and weekly 4 weeks back), the
/// others inherit it. With target_preserve_min left at its default, all,
/// btrbk.conf(5) says every backup is kept and target_preserve has no
/// effect: the second volume's subvolume has no retention key then.
#[test]
fn complex_setup_volume_inheritance_and_override() {
    let c = Conf::new(
        "\
volume /mnt/pool
  snapshot_dir snaps
  target_preserve_min no
  target_preserve     20d 10w *m
  target /mnt/backup
  subvolume root
  subvolume home
  subvolume kvm
    target_preserve 7d 4w

volume /mnt/data
  target /mnt/backup/data
  target_preserve 14d
  subvolume \"media\"
",
    );
    let (_, t, report) = c.import();
    assert_eq!(jobs(&t), ["home", "kvm", "media", "root"]);
    for name in ["root", "home", "kvm"] {
        let j = job(&t, name);
        assert_eq!(s(j, "snapshot"), format!("/mnt/pool/{name}"));
        assert_eq!(s(j, "snapshot_dir"), "/mnt/pool/snaps");
        let d = dests(j);
        assert_eq!(d.len(), 1);
        assert_eq!(s(d[0], "target"), "/mnt/backup");
        let want = if name == "kvm" {
            pairs(&[("keep_daily", "7"), ("keep_weekly", "4")])
        } else {
            pairs(&[
                ("keep_daily", "20"),
                ("keep_weekly", "10"),
                ("keep_monthly", "\"unlimited\""),
            ])
        };
        assert_eq!(keeps(d[0]), want, "{name}");
    }
    let media = job(&t, "media");
    assert_eq!(s(media, "snapshot"), "/mnt/data/media");
    // No snapshot_dir: btrbk snapshots into the volume's directory.
    assert_eq!(s(media, "snapshot_dir"), "/mnt/data");
    let d = dests(media);
    assert_eq!(s(d[0], "target"), "/mnt/backup/data");
    assert!(keeps(d[0]).is_empty(), "target_preserve_min all keeps all");
    assert!(
        report.contains("4 jobs written, 0 lines not carried over"),
        "{report}"
    );
}

/// btrbk.conf.example, "Backup data to external disk as well as remote
/// host", and the README's "Example: Host-initiated Backup on
/// Fileserver": one subvolume, four targets: a local disk,
/// ssh://HOST/DIR, HOST:DIR (btrbk's short form of ssh://HOST/DIR) and
/// an IPv6 host with a port. btrbk.conf(5): ssh_user defaults to root,
/// ssh_identity is ssh's -i, ssh_compression yes its compression (-C),
/// ssh_cipher_spec its -c; options given in a target section apply to
/// that target only (here the third target's user, compression and
/// retention).
#[test]
fn multiple_targets_local_and_ssh() {
    let c = Conf::new(
        "\
ssh_identity   /etc/btrbk/ssh/id_ed25519
ssh_cipher_spec aes256-gcm@openssh.com
target_preserve_min latest
target_preserve 30d
volume /mnt/data
  snapshot_create always
  subvolume data
    target /mnt/backup
    target send-receive ssh://backup.example.org/mnt/backup
    target nas.example.org:/srv/backup
      ssh_user btrbk
      ssh_compression yes
      target_preserve_min 2w
      target_preserve no
    target ssh://[2001:db8::7]:2222/mnt/v6
",
    );
    let (_, t, report) = c.import();
    let j = job(&t, "data");
    assert_eq!(s(j, "snapshot"), "/mnt/data/data");
    let d = dests(j);
    assert_eq!(d.len(), 4);
    assert_eq!(s(d[0], "target"), "/mnt/backup");
    assert!(
        d[0].get("ssh_command").is_none(),
        "a local target uses no ssh"
    );
    assert_eq!(
        s(d[1], "target"),
        "ssh://root@backup.example.org/mnt/backup"
    );
    assert_eq!(
        s(d[1], "ssh_command"),
        "ssh -i /etc/btrbk/ssh/id_ed25519 -c aes256-gcm@openssh.com"
    );
    assert_eq!(s(d[2], "target"), "ssh://btrbk@nas.example.org/srv/backup");
    assert_eq!(
        s(d[2], "ssh_command"),
        "ssh -i /etc/btrbk/ssh/id_ed25519 -c aes256-gcm@openssh.com -C"
    );
    assert_eq!(s(d[3], "target"), "ssh://root@[2001:db8::7]:2222/mnt/v6");
    // latest: the newest kept; 30d: daily backups 30 days back.
    for i in [0, 1, 3] {
        assert_eq!(
            keeps(d[i]),
            pairs(&[("keep_last", "1"), ("keep_daily", "30")]),
            "{i}"
        );
    }
    // 2w: every backup of the last two weeks, 14 days.
    assert_eq!(keeps(d[2]), pairs(&[("keep_within", "\"14d\"")]));
    c.assert_reported(&report, "snapshot_create always", "onchange");
    c.assert_not_reported(
        &report,
        &[
            "ssh_identity",
            "ssh_cipher_spec",
            "ssh_user",
            "ssh_compression",
        ],
    );
}

/// The README's "Example: Encrypted Backup to non-btrfs Target" shape: a raw target over ssh
/// with xz compression and gpg encryption, ssh_user in the target section,
/// and a raw target of our own with zstd at level 9, incremental no
/// (btrbk.conf(5): no incremental backups, every one full), rate_limit 10m
/// (bytes per second, m = 1024², per btrbk.conf(5)) and two sets of
/// retention options. A raw target (btrbk.conf(5) TARGET TYPES: files of
/// the btrfs send stream) is what btrsend's repository is: it becomes
/// `repo`, with a comment saying it must be made with `backup init`.
#[test]
fn raw_targets_compression_encryption_rate() {
    let c = Conf::new(
        "\
raw_target_compress   xz
raw_target_encrypt    gpg
gpg_keyring           /etc/btrbk/gpg/pubring.gpg
gpg_recipient         btrbk@example.org
volume /mnt/pool
  subvolume home
    target raw ssh://cloud.example.com/backup
      ssh_user  btrbk
  subvolume vm
    target raw /mnt/raw
      raw_target_compress zstd
      raw_target_compress_level 9
      raw_target_encrypt no
      incremental no
      rate_limit 10m
      target_preserve_min no
      target_preserve 6h 2y
",
    );
    let (_, t, report) = c.import();
    let text = fs::read_to_string(&c.out).unwrap();
    let home = dests(job(&t, "home"));
    assert_eq!(s(home[0], "repo"), "ssh://btrbk@cloud.example.com/backup");
    assert!(home[0].get("compression_level").is_none());
    assert!(keeps(home[0]).is_empty(), "btrbk's default keeps all");
    let vm = dests(job(&t, "vm"));
    assert_eq!(s(vm[0], "repo"), "/mnt/raw");
    assert_eq!(int(vm[0], "compression_level"), 9);
    assert_eq!(int(vm[0], "full_every"), 1, "incremental no: all full");
    assert_eq!(int(vm[0], "limit_rate"), 10 * 1024 * 1024);
    assert_eq!(
        keeps(vm[0]),
        pairs(&[("keep_hourly", "6"), ("keep_yearly", "2")])
    );
    assert!(
        text.contains("btrsend backup init --repo /mnt/raw")
            && text.contains("btrsend backup init --repo ssh://btrbk@cloud.example.com/backup"),
        "{text}"
    );
    c.assert_reported(&report, "raw_target_compress   xz", "zstd");
    c.assert_reported(&report, "raw_target_encrypt    gpg", "age");
    c.assert_reported(&report, "gpg_keyring", "age");
    c.assert_reported(&report, "gpg_recipient", "age");
    c.assert_not_reported(
        &report,
        &[
            "raw_target_compress zstd",
            "raw_target_compress_level",
            "incremental no",
            "rate_limit",
            "ssh_user",
        ],
    );
}

/// What has no equivalent is left out and reported, never guessed:
/// btrbk.conf(5) allows wildcards in subvolume names ("Accepts wildcard
/// character *"); btrbk.conf.example's "Backup from remote host, with
/// different naming" has a volume on another host and a snapshot_name of
/// its own, and its "Resume backups from remote host which runs its own
/// btrbk instance" (the README's "Example: Multiple Btrbk Instances")
/// snapshot_create no; a subvolume without a target is
/// only snapshotted; preserve_day_of_week, group, noauto, timestamp_format
/// and backend have no equivalent; incremental strict is not ours; rate_limit
/// into a send-receive target is limit_rate, both counting the raw stream
/// (btrbk.conf(5): 5m is 5 MiB per second); a schedule token that is not
/// <number>{h,d,w,m,y} makes btrbk refuse the file and leaves this
/// destination without a policy. Unknown options and lines that are no
/// options are reported with their line, control characters escaped.
#[test]
fn unmapped_lines_reported() {
    let c = Conf::new(
        "\
timestamp_format long-iso
preserve_day_of_week monday
group nightly
bogus_option 1\u{1b}[2J
this-is-not-an-option
volume ssh://remote.example.org/mnt/pool
  subvolume far
    target /mnt/backup/far
volume /mnt/pool
  backend btrfs-progs-sudo
  noauto yes
  subvolume vm-*
    target /mnt/backup
  subvolume alone
  subvolume fetched
    snapshot_create no
    target /mnt/backup
  subvolume named
    snapshot_name other
    incremental strict
    rate_limit 5m
    target /mnt/backup
      target_preserve_min no
      target_preserve 7x
",
    );
    let (_, t, report) = c.import();
    assert_eq!(jobs(&t), ["named"]);
    let named = dests(job(&t, "named"));
    assert!(keeps(named[0]).is_empty(), "a bad schedule keeps all");
    assert_eq!(int(named[0], "limit_rate"), 5 * 1024 * 1024);
    c.assert_reported(&report, "timestamp_format", "NAME.YYYY-MM-DDTHHMMSSZ");
    c.assert_reported(&report, "preserve_day_of_week", "no equivalent");
    c.assert_reported(&report, "group", "no groups");
    c.assert_reported(&report, "bogus_option", "not a btrbk option");
    c.assert_reported(&report, "this-is-not", "not an option line");
    c.assert_reported(&report, "volume ssh://", "another host");
    c.assert_reported(&report, "backend", "backend");
    c.assert_reported(&report, "noauto", "--job");
    c.assert_reported(&report, "vm-*", "wildcards");
    c.assert_reported(&report, "alone", "no target");
    c.assert_reported(&report, "snapshot_create no", "left out");
    c.assert_reported(&report, "snapshot_name", "after the subvolume");
    c.assert_reported(&report, "incremental strict", "no strict mode");
    c.assert_reported(&report, "7x", "\"7x\"");
    // The escape is shown escaped, never written to the terminal.
    assert!(!report.contains('\u{1b}'), "{report:?}");
    assert!(report.contains("`bogus_option 1\\x1b[2J`"), "{report}");
}

/// keep_snapshots (the README's "Example: Backup from non-btrfs Source"
/// keeps the latest snapshot): btrbk.conf(5) snapshot_preserve_min latest with
/// snapshot_preserve no keeps the latest snapshot only, which is
/// keep_snapshots = 1; all (the default) keeps every one, no key. Job
/// names: two subvolumes of one name on two volumes get the volume's name
/// in front.
#[test]
fn snapshot_retention_and_job_names() {
    let c = Conf::new(
        "\
volume /mnt/a
  snapshot_dir .snaps
  snapshot_preserve_min latest
  target /mnt/backup/a
  subvolume home
volume /mnt/b
  target /mnt/backup/b
  subvolume home
  subvolume .
",
    );
    let (_, t, _) = c.import();
    assert_eq!(jobs(&t), ["b", "b-home", "home"]);
    assert_eq!(int(job(&t, "home"), "keep_snapshots"), 1);
    assert_eq!(s(job(&t, "home"), "snapshot_dir"), "/mnt/a/.snaps");
    assert!(job(&t, "b-home").get("keep_snapshots").is_none());
    assert_eq!(s(job(&t, "b-home"), "snapshot"), "/mnt/b/home");
    assert_eq!(s(job(&t, "b"), "snapshot"), "/mnt/b");
}

/// Output to stdout by default; an existing -o file is refused without
/// --force; a file that is not UTF-8, too large, or maps to no job is a
/// clear error (exit status 1).
#[test]
fn output_and_errors() {
    let c = Conf::new("snapshot_dir /s\ntarget /mnt/b\nsubvolume /home\n");
    let o = btrsend()
        .args(["backup", "config", "import-btrbk"])
        .arg(&c.path)
        .output()
        .unwrap();
    let t: Table = toml::from_str(&ok(&o)).unwrap();
    assert_eq!(s(job(&t, "home"), "snapshot"), "/home");
    fs::write(&c.out, "keep me").unwrap();
    let run = |args: &[&str], conf: &Path| {
        btrsend()
            .args(["backup", "config", "import-btrbk"])
            .arg(conf)
            .args(args)
            .output()
            .unwrap()
    };
    let out = c.out.to_str().unwrap();
    let o = run(&["-o", out], &c.path);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("exists: give --force"),
        "{}",
        stderr(&o)
    );
    assert_eq!(fs::read_to_string(&c.out).unwrap(), "keep me");
    ok(&run(&["-o", out, "--force"], &c.path));
    assert!(fs::read_to_string(&c.out).unwrap().contains("[job.home]"));

    let dir = c.path.parent().unwrap();
    let bin = dir.join("bin.conf");
    fs::write(&bin, b"volume /a\n\xff\xfe\n").unwrap();
    let o = run(&[], &bin);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("bin.conf:2: not UTF-8"),
        "{}",
        stderr(&o)
    );
    let huge = dir.join("huge.conf");
    fs::write(&huge, "# x\n".repeat(300_000)).unwrap();
    let o = run(&[], &huge);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("larger than 1 MiB"), "{}", stderr(&o));
    let empty = dir.join("empty.conf");
    fs::write(&empty, "subvolume /x\n").unwrap();
    let o = run(&[], &empty);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("no job could be made"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("empty.conf:1: "), "{}", stderr(&o));
    let o = run(&[], &dir.join("missing.conf"));
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("cannot read the btrbk config"));
}
