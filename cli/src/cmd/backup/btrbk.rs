//! `btrsend backup config import-btrbk`: a btrbk.conf read as btrbk reads
//! it, written as the btrsend config file that does the same, with every
//! line that cannot be carried over reported and why.
//!
//! The grammar and meanings are btrbk's own, from btrbk.conf(5) (read for
//! facts): one `key value` per line, `#` comments outside quotes; the
//! sections `volume`, `subvolume` and `target [send-receive|raw] URL`
//! nest in that order, and an option applies to the last section opened,
//! a deeper section's value superseding an upper one's. A target given in
//! global or volume context is copied into every subvolume below it (in
//! front of the subvolume's own, unless the subvolume has the same target),
//! and the copy looks options up in itself, then in that subvolume, its
//! volume and the global context.
//!
//! Each subvolume with a target becomes a job that snapshots it
//! (`snapshot`, `snapshot_dir`); each of its targets a destination: a
//! send-receive target a `target`, a raw target (a directory of stream
//! files) a `repo`, whose retention keys come from `target_preserve_min`
//! and `target_preserve`. What btrsend has no equivalent for is reported,
//! never guessed: where a guess could delete backups btrbk would keep,
//! nothing is written instead (a destination without `keep_*` keys is one
//! `forget` leaves alone).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use btrsend::backup::remote::spec::SshSpec;

/// Where btrbk reads its config by default.
pub const DEFAULT_BTRBK_CONF: &str = "/etc/btrbk/btrbk.conf";

/// The largest btrbk.conf read: a config file is a few KiB, and a larger
/// file is more likely the wrong file than a config.
pub const MAX_BYTES: u64 = 1 << 20;

/// A line of the btrbk.conf that was not carried over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unmapped {
    /// The line number, from 1.
    pub line: usize,
    /// The line as written (without its line break).
    pub text: String,
    /// Why it was not carried over.
    pub why: String,
}

/// What the import made of a btrbk.conf.
#[derive(Debug)]
pub struct Imported {
    /// The btrsend config file (TOML).
    pub toml: String,
    /// The number of jobs in it.
    pub jobs: usize,
    /// The lines not carried over, in the file's order.
    pub unmapped: Vec<Unmapped>,
}

/// An option as written: its key (lowercase), value (outer quotes
/// removed) and line.
#[derive(Debug, Clone)]
struct Opt {
    key: String,
    value: String,
    line: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    SendReceive,
    Raw,
}

#[derive(Debug, Clone)]
struct Target {
    kind: Kind,
    url: String,
    line: usize,
    opts: Vec<Opt>,
}

#[derive(Debug, Default)]
struct Subvol {
    name: String,
    line: usize,
    opts: Vec<Opt>,
    targets: Vec<Target>,
}

#[derive(Debug, Default)]
struct Volume {
    /// `None`: no `volume` line (subvolumes given by absolute path).
    url: Option<String>,
    line: usize,
    opts: Vec<Opt>,
    targets: Vec<Target>,
    subvols: Vec<Subvol>,
}

#[derive(Debug, Default)]
struct Conf {
    opts: Vec<Opt>,
    targets: Vec<Target>,
    volumes: Vec<Volume>,
}

/// The section the next option goes to.
#[derive(Debug, Clone, Copy)]
enum Cur {
    Global,
    Volume(usize),
    Subvol(usize, usize),
    GlobalTarget(usize),
    VolumeTarget(usize, usize),
    SubvolTarget(usize, usize, usize),
    /// A target section whose type is unknown: its options go nowhere.
    Dropped(Parent),
}

/// Where a dropped target section was opened.
#[derive(Debug, Clone, Copy)]
enum Parent {
    Global,
    Volume(usize),
    Subvol(usize, usize),
}

/// The options btrbk has that btrsend has no equivalent for, and why.
const NO_EQUIVALENT: &[(&[&str], &str)] = &[
    (
        &["group"],
        "btrsend has no groups: a job is picked by its name (--job NAME)",
    ),
    (
        &["noauto"],
        "btrsend runs every job of the file unless --job names some",
    ),
    (
        &["timestamp_format"],
        "btrsend names its snapshots NAME.YYYY-MM-DDTHHMMSSZ (UTC), whatever the format",
    ),
    (
        &["preserve_day_of_week", "preserve_hour_of_day"],
        "no equivalent: btrsend's keep_* periods are calendar hours, days, ISO weeks (Monday to Sunday), months and years in local time, each kept by its newest backup",
    ),
    (
        &["lockfile"],
        "btrsend locks each repository and target itself (flock); no global lock file",
    ),
    (
        &["transaction_log", "transaction_syslog"],
        "no transaction log: use --json, --metrics-file ([run] metrics_file) or the hooks after and on_error",
    ),
    (
        &[
            "backend",
            "backend_local",
            "backend_remote",
            "backend_local_user",
        ],
        "btrsend reads and writes btrfs itself, as root; it runs no btrfs-progs backend",
    ),
    (
        &["compat", "compat_local", "compat_remote"],
        "no compatibility options",
    ),
    (
        &["stream_buffer", "stream_buffer_remote"],
        "btrsend buffers the stream itself; it runs no mbuffer",
    ),
    (
        &["rate_limit_remote"],
        "no limit on the far end: rate_limit (limit_rate) limits what this host writes",
    ),
    (
        &[
            "stream_compress",
            "stream_compress_level",
            "stream_compress_long",
            "stream_compress_threads",
            "stream_compress_adapt",
        ],
        "no compression of the stream in transit: a repository stores zstd streams, a target receives the raw stream",
    ),
    (
        &["raw_target_compress_long", "raw_target_compress_threads"],
        "btrsend's zstd takes only a level (compression_level)",
    ),
    (
        &["raw_target_split", "raw_target_block_size"],
        "a repository stores each stream as one file of zstd frames",
    ),
    (
        &[
            "gpg_keyring",
            "gpg_recipient",
            "openssl_ciphername",
            "openssl_iv_size",
            "openssl_keyfile",
            "kdf_backend",
            "kdf_keysize",
            "kdf_keygen",
        ],
        "btrsend encrypts a repository with age, chosen once at backup init (--encryption recipients or passphrase), not with gpg or openssl",
    ),
    (
        &[
            "incremental_prefs",
            "incremental_clones",
            "incremental_resolve",
        ],
        "btrsend picks the parent itself (the newest snapshot of the same origin on both sides) and uses no clone sources",
    ),
    (
        &["btrfs_commit_delete"],
        "no such setting: btrsend deletes snapshots as btrfs subvolume delete does by default",
    ),
    (
        &[
            "snapshot_qgroup_destroy",
            "target_qgroup_destroy",
            "archive_qgroup_destroy",
        ],
        "btrsend leaves qgroups alone",
    ),
    (
        &["send_protocol", "send_compressed_data"],
        "btrsend chooses the send protocol itself",
    ),
    (
        &[
            "archive_preserve",
            "archive_preserve_min",
            "archive_exclude",
        ],
        "btrsend has no archive command (backup copy copies a repository to another)",
    ),
    (&["warn_unknown_targets"], "no such setting"),
    (&["cache_dir"], "btrsend has no extents command"),
];

/// The options the import reads (their lines are reported only when
/// their value cannot be carried over where it applies).
const MAPPED: &[&str] = &[
    "snapshot_dir",
    "snapshot_name",
    "snapshot_create",
    "snapshot_preserve",
    "snapshot_preserve_min",
    "target_preserve",
    "target_preserve_min",
    "incremental",
    "raw_target_compress",
    "raw_target_compress_level",
    "raw_target_encrypt",
    "rate_limit",
    "ssh_user",
    "ssh_identity",
    "ssh_compression",
    "ssh_cipher_spec",
];

/// The reports, by line; a line is reported once per distinct reason.
#[derive(Debug, Default)]
struct Report {
    lines: Vec<String>,
    why: BTreeMap<usize, Vec<String>>,
}

impl Report {
    fn add(&mut self, line: usize, why: impl Into<String>) {
        let why = why.into();
        let v = self.why.entry(line).or_default();
        if !v.contains(&why) {
            v.push(why);
        }
    }

    fn finish(self) -> Vec<Unmapped> {
        let mut out = Vec::new();
        for (line, whys) in self.why {
            let text = line
                .checked_sub(1)
                .and_then(|i| self.lines.get(i))
                .map_or_else(String::new, |l| l.trim().to_owned());
            for why in whys {
                out.push(Unmapped {
                    line,
                    text: text.clone(),
                    why,
                });
            }
        }
        out
    }
}

/// `line` without its comment: a `#` outside quotes starts one.
fn strip_comment(line: &str) -> &str {
    let mut quote = None;
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (None, '#') => return line.get(..i).unwrap_or(line),
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            _ => {}
        }
    }
    line
}

/// `value` without one pair of enclosing quotes, as btrbk strips them.
fn unquote(value: &str) -> &str {
    for q in ['"', '\''] {
        if let Some(inner) = value
            .strip_prefix(q)
            .and_then(|v| v.strip_suffix(q))
            .filter(|_| value.len() >= 2)
        {
            return inner;
        }
    }
    value
}

/// Read the sections and options, reporting lines that are not options.
fn parse(text: &str, report: &mut Report) -> Conf {
    let mut conf = Conf::default();
    let mut cur = Cur::Global;
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let l = strip_comment(raw).trim();
        if l.is_empty() {
            continue;
        }
        let (key, value) = match l.split_once(|c: char| c.is_ascii_whitespace()) {
            Some((k, v)) => (k, v.trim()),
            None => (l, ""),
        };
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphabetic() || c == '_') {
            report.add(
                line,
                "not an option line (btrbk reads KEY VALUE, the key in letters and _): btrbk itself stops here",
            );
            continue;
        }
        let key = key.to_ascii_lowercase();
        let value = unquote(value).to_owned();
        match key.as_str() {
            "volume" => {
                conf.volumes.push(Volume {
                    url: Some(value),
                    line,
                    ..Volume::default()
                });
                cur = Cur::Volume(conf.volumes.len() - 1);
            }
            "subvolume" => {
                let v = match cur {
                    Cur::Volume(v)
                    | Cur::Subvol(v, _)
                    | Cur::VolumeTarget(v, _)
                    | Cur::SubvolTarget(v, _, _)
                    | Cur::Dropped(Parent::Volume(v) | Parent::Subvol(v, _)) => v,
                    Cur::Global | Cur::GlobalTarget(_) | Cur::Dropped(Parent::Global) => {
                        // btrbk adds a volume with no directory: the
                        // subvolumes that follow are absolute paths.
                        conf.volumes.push(Volume {
                            url: None,
                            line,
                            ..Volume::default()
                        });
                        conf.volumes.len() - 1
                    }
                };
                let Some(vol) = conf.volumes.get_mut(v) else {
                    continue;
                };
                vol.subvols.push(Subvol {
                    name: value,
                    line,
                    ..Subvol::default()
                });
                cur = Cur::Subvol(v, vol.subvols.len() - 1);
            }
            "target" => {
                let parent = match cur {
                    Cur::Global | Cur::GlobalTarget(_) | Cur::Dropped(Parent::Global) => {
                        Parent::Global
                    }
                    Cur::Volume(v) | Cur::VolumeTarget(v, _) | Cur::Dropped(Parent::Volume(v)) => {
                        Parent::Volume(v)
                    }
                    Cur::Subvol(v, s)
                    | Cur::SubvolTarget(v, s, _)
                    | Cur::Dropped(Parent::Subvol(v, s)) => Parent::Subvol(v, s),
                };
                let (kind, url) = match value.split_once(|c: char| c.is_ascii_whitespace()) {
                    Some((t, rest))
                        if t.chars()
                            .all(|c| c.is_ascii_alphabetic() || c == '_' || c == '-') =>
                    {
                        match t.to_ascii_lowercase().as_str() {
                            "send-receive" => (Some(Kind::SendReceive), rest.trim()),
                            "raw" => (Some(Kind::Raw), rest.trim()),
                            _ => (None, rest.trim()),
                        }
                    }
                    _ => (Some(Kind::SendReceive), value.as_str()),
                };
                let Some(kind) = kind else {
                    report.add(
                        line,
                        "unknown target type (btrbk has send-receive and raw): the section is left out",
                    );
                    cur = Cur::Dropped(parent);
                    continue;
                };
                let t = Target {
                    kind,
                    url: unquote(url).to_owned(),
                    line,
                    opts: Vec::new(),
                };
                cur = match parent {
                    Parent::Global => {
                        conf.targets.push(t);
                        Cur::GlobalTarget(conf.targets.len() - 1)
                    }
                    Parent::Volume(v) => match conf.volumes.get_mut(v) {
                        Some(vol) => {
                            vol.targets.push(t);
                            Cur::VolumeTarget(v, vol.targets.len() - 1)
                        }
                        None => Cur::Dropped(parent),
                    },
                    Parent::Subvol(v, s) => {
                        match conf
                            .volumes
                            .get_mut(v)
                            .and_then(|vol| vol.subvols.get_mut(s))
                        {
                            Some(sub) => {
                                sub.targets.push(t);
                                Cur::SubvolTarget(v, s, sub.targets.len() - 1)
                            }
                            None => Cur::Dropped(parent),
                        }
                    }
                };
            }
            _ => {
                if let Some((_, why)) = NO_EQUIVALENT
                    .iter()
                    .find(|(keys, _)| keys.contains(&key.as_str()))
                {
                    report.add(line, *why);
                } else if !MAPPED.contains(&key.as_str()) {
                    report.add(line, "not a btrbk option this import knows: left out");
                }
                let opt = Opt { key, value, line };
                let opts = match cur {
                    Cur::Global => Some(&mut conf.opts),
                    Cur::Volume(v) => conf.volumes.get_mut(v).map(|v| &mut v.opts),
                    Cur::Subvol(v, s) => conf
                        .volumes
                        .get_mut(v)
                        .and_then(|v| v.subvols.get_mut(s))
                        .map(|s| &mut s.opts),
                    Cur::GlobalTarget(t) => conf.targets.get_mut(t).map(|t| &mut t.opts),
                    Cur::VolumeTarget(v, t) => conf
                        .volumes
                        .get_mut(v)
                        .and_then(|v| v.targets.get_mut(t))
                        .map(|t| &mut t.opts),
                    Cur::SubvolTarget(v, s, t) => conf
                        .volumes
                        .get_mut(v)
                        .and_then(|v| v.subvols.get_mut(s))
                        .and_then(|s| s.targets.get_mut(t))
                        .map(|t| &mut t.opts),
                    Cur::Dropped(_) => None,
                };
                if let Some(opts) = opts {
                    opts.push(opt);
                }
            }
        }
    }
    conf
}

/// `upper`'s targets copied in front of `own`, but for those `own`
/// already has (same type and URL), as btrbk propagates them.
fn propagate(upper: &[Target], own: &[Target]) -> Vec<Target> {
    let mut out: Vec<Target> = upper
        .iter()
        .filter(|t| !own.iter().any(|o| o.kind == t.kind && o.url == t.url))
        .cloned()
        .collect();
    out.extend(own.iter().cloned());
    out
}

/// The option `key` as seen from a section: the last one given in the
/// first of `levels` (deepest first) that gives it.
fn lookup<'a>(levels: &[&'a [Opt]], key: &str) -> Option<&'a Opt> {
    levels
        .iter()
        .find_map(|opts| opts.iter().rev().find(|o| o.key == key))
}

/// A TOML basic string.
fn toml_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A comment line's text: one line, control characters escaped.
fn comment(s: &str) -> String {
    crate::text::printable(s).into_owned()
}

/// Whether a btrbk URL names another host (`ssh://…` or `host:/dir`).
fn is_remote(url: &str) -> bool {
    url.starts_with("ssh://") || url.split_once(':').is_some_and(|(h, _)| !h.contains('/'))
}

/// `base/rel`, or `rel` when it is absolute; `.` is `base` itself.
fn join(base: &str, rel: &str) -> String {
    if rel.starts_with('/') {
        let t = rel.trim_end_matches('/');
        return if t.is_empty() {
            String::from("/")
        } else {
            t.to_owned()
        };
    }
    let rel = rel.trim_start_matches("./").trim_end_matches('/');
    let base = base.trim_end_matches('/');
    if rel == "." || rel.is_empty() {
        if base.is_empty() {
            String::from("/")
        } else {
            base.to_owned()
        }
    } else {
        format!("{base}/{rel}")
    }
}

/// A job name made of the characters a bare TOML key and a shell word
/// take without quoting.
fn sanitize(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    let out = out.trim_end_matches('-').to_owned();
    if out.is_empty() {
        // btrbk names the snapshots of the volume's root "ROOT".
        String::from("ROOT")
    } else {
        out
    }
}

/// A retention policy's keys, from `*_preserve_min` and `*_preserve`.
struct Policy {
    keys: Vec<(&'static str, String)>,
    notes: Vec<String>,
}

/// A `<number>{h,d,w,m,y}` duration as a `keep_within` value (weeks as
/// seven days); `None` when malformed. Zero is `Some("")`.
fn within(v: &str) -> Option<String> {
    let unit = v.chars().last()?;
    let n: u32 = v.get(..v.len().checked_sub(1)?)?.parse().ok()?;
    let (n, u) = match unit {
        'h' => (n, 'h'),
        'd' => (n, 'd'),
        'w' => (n.checked_mul(7)?, 'd'),
        'm' => (n, 'm'),
        'y' => (n, 'y'),
        _ => return None,
    };
    Some(if n == 0 {
        String::new()
    } else {
        format!("{n}{u}")
    })
}

/// btrbk's retention for backups (`target_preserve_min`,
/// `target_preserve`) as `keep_*` keys; what cannot be carried over is
/// reported and then nothing is written, so that nothing btrbk keeps is
/// deleted.
fn policy(min: Option<&Opt>, sched: Option<&Opt>, report: &mut Report) -> Policy {
    let mut keys = Vec::new();
    let mut notes = Vec::new();
    let none = Policy {
        keys: Vec::new(),
        notes: Vec::new(),
    };
    // btrbk's default minimum is "all": every backup kept, the schedule
    // without effect.
    let min_value = min.map_or("all", |o| o.value.as_str());
    match min_value {
        "all" => return none,
        "latest" => keys.push(("keep_last", String::from("1"))),
        "no" => {}
        v => match within(v) {
            Some(w) if w.is_empty() => {}
            Some(w) => {
                keys.push(("keep_within", toml_str(&w)));
                notes.push(String::from(
                    "keep_within counts back from the newest backup, where btrbk's *_preserve_min counts back from now: it keeps as much or more",
                ));
            }
            None => {
                if let Some(o) = min {
                    report.add(
                        o.line,
                        "not all, latest, no or <number>{h,d,w,m,y}: no retention policy written (every backup kept)",
                    );
                }
                return none;
            }
        },
    }
    let sched_value = sched.map_or("no", |o| o.value.as_str());
    if sched_value != "no" {
        let mut seen = Vec::new();
        for tok in sched_value.split_ascii_whitespace() {
            let at = tok.char_indices().last().map_or(0, |(i, _)| i);
            let (n, unit) = tok.split_at(at);
            let key = match unit {
                "h" => "keep_hourly",
                "d" => "keep_daily",
                "w" => "keep_weekly",
                "m" => "keep_monthly",
                "y" => "keep_yearly",
                _ => "",
            };
            let value = if n == "*" {
                Some(toml_str("unlimited"))
            } else {
                n.parse::<u32>().ok().map(|n| n.to_string())
            };
            match value {
                Some(v) if !key.is_empty() && !seen.contains(&key) => {
                    seen.push(key);
                    if v != "0" {
                        keys.push((key, v));
                    }
                }
                _ => {
                    if let Some(o) = sched {
                        report.add(
                            o.line,
                            format!("{tok:?} is not <number>{{h,d,w,m,y}} or *{{h,d,w,m,y}}, once per unit: no retention policy written (every backup kept)"),
                        );
                    }
                    return none;
                }
            }
        }
        if !seen.is_empty() {
            notes.push(String::from(
                "btrbk keeps the first backup of each hour, day, week, month and year for N of them back from now; keep_* keep the newest backup of each of the N most recent such periods that hold one",
            ));
        }
    }
    if keys.is_empty() {
        // btrbk keeps only the latest backup then; btrsend refuses an
        // empty policy, and one it could write deletes nothing more.
        let line = sched.or(min).map_or(0, |o| o.line);
        report.add(
            line,
            "keeps only the newest backup: btrsend refuses an empty policy; none written (every backup kept; keep_last = 1 would keep the newest)",
        );
        return none;
    }
    Policy { keys, notes }
}

/// What the import writes for one destination.
struct Dest {
    comment: Vec<String>,
    keys: Vec<(&'static str, String)>,
}

/// The btrsend form of a target's URL: a local absolute path as is,
/// `ssh://[USER@]HOST[:PORT]/PATH` for another host; `None` (reported)
/// when it cannot be written.
fn dest_url(
    t: &Target,
    levels: &[&[Opt]],
    report: &mut Report,
) -> Option<(String, Option<String>)> {
    if !is_remote(&t.url) {
        if !t.url.starts_with('/') {
            report.add(
                t.line,
                "the target's directory must be an absolute path: left out",
            );
            return None;
        }
        return Some((t.url.trim_end_matches('/').to_owned(), None));
    }
    let (host_port, path) = if let Some(rest) = t.url.strip_prefix("ssh://") {
        match rest.find('/') {
            Some(i) => (rest.get(..i)?, rest.get(i..)?),
            None => {
                report.add(t.line, "an ssh:// URL without a directory: left out");
                return None;
            }
        }
    } else {
        // btrbk's short form HOST:DIR.
        t.url.split_once(':')?
    };
    let user = match lookup(levels, "ssh_user").map(|o| o.value.as_str()) {
        // btrbk logs in as root unless told otherwise.
        None => Some("root"),
        Some("no") => None,
        Some(u) => Some(u),
    };
    let url = match user {
        Some(u) => format!("ssh://{u}@{host_port}{path}"),
        None => format!("ssh://{host_port}{path}"),
    };
    if let Some(Err(e)) = SshSpec::parse(&url) {
        report.add(t.line, format!("{e}: left out"));
        return None;
    }
    let mut ssh = vec![String::from("ssh")];
    // ssh_command is split on blanks, so a value with one cannot go in.
    for (key, off, flag) in [
        ("ssh_identity", "no", "-i"),
        ("ssh_cipher_spec", "default", "-c"),
    ] {
        if let Some(o) = lookup(levels, key).filter(|o| o.value != off) {
            if o.value.is_empty() || o.value.contains(char::is_whitespace) {
                report.add(
                    o.line,
                    "a value with blanks cannot be given in ssh_command: set it in ~/.ssh/config",
                );
            } else {
                ssh.push(flag.to_owned());
                ssh.push(o.value.clone());
            }
        }
    }
    if let Some(o) = lookup(levels, "ssh_compression") {
        match o.value.as_str() {
            "yes" => ssh.push(String::from("-C")),
            "no" => {}
            _ => report.add(o.line, "not yes or no"),
        }
    }
    let command = (ssh.len() > 1).then(|| ssh.join(" "));
    Some((url, command))
}

fn destination(t: &Target, levels: &[&[Opt]], report: &mut Report) -> Option<Dest> {
    let (url, ssh_command) = dest_url(t, levels, report)?;
    let mut d = Dest {
        comment: Vec::new(),
        keys: Vec::new(),
    };
    let remote = url.starts_with("ssh://");
    match t.kind {
        Kind::SendReceive => {
            d.comment.push(format!(
                "btrbk's send-receive target {}: subvolumes received into {}{}",
                t.url,
                url,
                if remote {
                    " (btrsend serve on the far end receives them: see TARGETS in btrsend-backup-run(1))"
                } else {
                    ""
                }
            ));
            d.keys.push(("target", toml_str(&url)));
        }
        Kind::Raw => {
            d.comment.push(format!(
                "btrbk's raw target {}: a directory of stream files, which btrsend keeps as a repository.",
                t.url
            ));
            d.comment.push(format!(
                "Make it first: btrsend backup init --repo {url} --encryption none|recipients|passphrase"
            ));
            if remote {
                d.comment.push(String::from(
                    "(the far end runs btrsend serve; see \"Backing up to another host\" in btrsend-backup(1))",
                ));
            }
            d.keys.push(("repo", toml_str(&url)));
        }
    }
    if let Some(c) = ssh_command {
        d.keys.push(("ssh_command", toml_str(&c)));
    }
    if let Some(o) = lookup(levels, "incremental") {
        match (o.value.as_str(), t.kind) {
            ("yes", _) => {}
            ("no", Kind::Raw) => d.keys.push(("full_every", String::from("1"))),
            ("no", Kind::SendReceive) => report.add(
                o.line,
                "a target receives an incremental stream whenever both sides share a parent; it cannot be made to receive only full ones",
            ),
            ("strict", _) => report.add(
                o.line,
                "no strict mode: btrsend sends a full stream when no parent is found",
            ),
            _ => report.add(o.line, "not yes, no or strict"),
        }
    }
    if t.kind == Kind::Raw {
        raw_options(levels, &mut d, report);
    }
    if let Some(o) = lookup(levels, "rate_limit").filter(|o| o.value != "no") {
        match (btrsend::rate::parse_rate(&o.value), t.kind) {
            (Ok(rate), Kind::Raw) => {
                d.keys.push(("limit_rate", rate.to_string()));
                d.comment.push(String::from(
                    "limit_rate limits the stored (zstd) bytes per second, where btrbk's rate_limit limits the raw stream",
                ));
            }
            // Into a target, limit_rate counts the raw stream, as btrbk's
            // rate_limit does.
            (Ok(rate), Kind::SendReceive) => d.keys.push(("limit_rate", rate.to_string())),
            (Err(e), _) => report.add(o.line, e),
        }
    }
    let min = lookup(levels, "target_preserve_min");
    let sched = lookup(levels, "target_preserve");
    let p = policy(min, sched, report);
    d.comment.extend(p.notes);
    d.keys.extend(p.keys);
    Some(d)
}

/// The compression and encryption options of a raw target.
fn raw_options(levels: &[&[Opt]], d: &mut Dest, report: &mut Report) {
    match lookup(levels, "raw_target_compress") {
        Some(o) if o.value == "zstd" => {
            if let Some(l) = lookup(levels, "raw_target_compress_level")
                .filter(|l| l.value != "default")
            {
                match l.value.parse::<i32>() {
                    Ok(n) if (1..=19).contains(&n) => {
                        d.keys.push(("compression_level", n.to_string()));
                    }
                    _ => report.add(
                        l.line,
                        "btrsend's compression_level is a zstd level from 1 to 19: left at its default (3)",
                    ),
                }
            }
        }
        Some(o) if o.value == "no" => report.add(
            o.line,
            "a repository always stores zstd streams (compression_level 1 is the fastest)",
        ),
        Some(o) => report.add(
            o.line,
            "a repository stores zstd streams, not this compressor's: compression_level left at zstd's default (3)",
        ),
        None => {}
    }
    if let Some(o) = lookup(levels, "raw_target_encrypt").filter(|o| o.value != "no") {
        report.add(
            o.line,
            "btrsend encrypts a repository with age, chosen once: backup init --encryption recipients --recipient AGE_PUBKEY (or passphrase), then write_key (or password_file) here",
        );
        d.comment.push(String::from(
            "btrbk encrypted this target: init it with --encryption recipients (or passphrase) to do the same",
        ));
    }
}

/// Convert `text`, the contents of a btrbk.conf, named `name` in the
/// comments of the output.
pub fn convert(name: &str, text: &str) -> Imported {
    let mut report = Report {
        lines: text.lines().map(str::to_owned).collect(),
        ..Report::default()
    };
    let conf = parse(text, &mut report);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Made by `btrsend backup config import-btrbk` from {}.\n# Check it with `btrsend backup config check --config FILE`; see\n# btrsend-backup-config(1). Lines of the btrbk.conf it could not carry\n# over were reported when it was made.",
        comment(name)
    );
    let mut names: Vec<String> = Vec::new();
    for vol in &conf.volumes {
        if let Some(url) = &vol.url
            && is_remote(url)
        {
            report.add(
                vol.line,
                "a volume on another host: btrsend backs up the subvolumes of this host only (run it there); its subvolumes are left out",
            );
            continue;
        }
        for sub in &vol.subvols {
            let sub_levels: [&[Opt]; 3] = [&sub.opts, &vol.opts, &conf.opts];
            if sub.name.contains('*') {
                report.add(
                    sub.line,
                    "btrsend's snapshot takes subvolume paths, not wildcards: give each subvolume (snapshot = [...]); left out",
                );
                continue;
            }
            let source = match &vol.url {
                Some(v) => join(v, &sub.name),
                None if sub.name.starts_with('/') => join("/", &sub.name),
                None => {
                    report.add(
                        sub.line,
                        "a relative subvolume without a volume section (btrbk refuses it too): left out",
                    );
                    continue;
                }
            };
            let targets = propagate(&propagate(&conf.targets, &vol.targets), &sub.targets);
            if targets.is_empty() {
                report.add(
                    sub.line,
                    "no target: btrbk only snapshots it, and a btrsend job needs a destination; left out",
                );
                continue;
            }
            if let Some(o) = lookup(&sub_levels, "snapshot_create") {
                match o.value.as_str() {
                    "no" => {
                        report.add(
                            o.line,
                            "btrsend stores the snapshots it takes (snapshot) or that are named one by one: this subvolume's job is left out",
                        );
                        continue;
                    }
                    "onchange" => {}
                    "always" => report.add(
                        o.line,
                        "btrsend takes no snapshot of a subvolume unchanged since its newest one (btrbk's onchange)",
                    ),
                    "ondemand" => report.add(
                        o.line,
                        "btrsend takes the snapshot whether or not a destination is reachable (btrbk's always, or onchange)",
                    ),
                    _ => report.add(o.line, "not always, onchange, ondemand or no"),
                }
            }
            let base = source.rsplit('/').next().unwrap_or("");
            let snapshot_dir = match (lookup(&sub_levels, "snapshot_dir"), &vol.url) {
                (Some(o), _) if o.value.starts_with('/') => join("/", &o.value),
                (Some(o), Some(v)) => join(v, &o.value),
                // btrbk snapshots into the volume's directory by default.
                (None, Some(v)) => join(v, "."),
                (Some(o), None) => {
                    report.add(
                        o.line,
                        "a relative snapshot_dir without a volume section: this subvolume's job is left out",
                    );
                    continue;
                }
                (None, None) => {
                    report.add(
                        sub.line,
                        "no snapshot_dir and no volume section: btrbk has nowhere to snapshot it; left out",
                    );
                    continue;
                }
            };
            if let Some(o) = lookup(&sub_levels, "snapshot_name")
                && o.value != base
            {
                report.add(
                    o.line,
                    format!(
                        "btrsend names snapshots after the subvolume ({}.YYYY-MM-DDTHHMMSSZ)",
                        comment(if base.is_empty() { "ROOT" } else { base })
                    ),
                );
            }
            let keep_snapshots = snapshot_keep(&sub_levels, &mut report);
            let mut dests = Vec::new();
            for t in &targets {
                let levels: [&[Opt]; 4] = [&t.opts, &sub.opts, &vol.opts, &conf.opts];
                if let Some(d) = destination(t, &levels, &mut report) {
                    dests.push(d);
                }
            }
            if dests.is_empty() {
                report.add(sub.line, "none of its targets could be written: left out");
                continue;
            }
            let stem = sanitize(if base.is_empty() { "ROOT" } else { base });
            let vol_stem = vol
                .url
                .as_deref()
                .map(|v| sanitize(v.trim_end_matches('/').rsplit('/').next().unwrap_or("")));
            let mut name = stem.clone();
            if names.contains(&name)
                && let Some(v) = &vol_stem
            {
                name = format!("{v}-{stem}");
            }
            let mut n = 2;
            let first = name.clone();
            while names.contains(&name) {
                name = format!("{first}-{n}");
                n += 1;
            }
            names.push(name.clone());
            let _ = writeln!(
                out,
                "\n# btrbk line {}: {}subvolume {}",
                sub.line,
                vol.url
                    .as_deref()
                    .map(|v| format!("volume {}, ", comment(v)))
                    .unwrap_or_default(),
                comment(&sub.name)
            );
            let _ = writeln!(out, "[job.{name}]");
            let _ = writeln!(out, "snapshot = {}", toml_str(&source));
            let _ = writeln!(out, "snapshot_dir = {}", toml_str(&snapshot_dir));
            if let Some(k) = keep_snapshots {
                let _ = writeln!(out, "keep_snapshots = {k}");
            }
            for (d, t) in dests.iter().zip(&targets) {
                let _ = writeln!(out);
                let _ = writeln!(out, "# btrbk line {}", t.line);
                for c in &d.comment {
                    let _ = writeln!(out, "# {}", comment(c));
                }
                let _ = writeln!(out, "[[job.{name}.destination]]");
                for (k, v) in &d.keys {
                    let _ = writeln!(out, "{k} = {v}");
                }
            }
        }
    }
    Imported {
        toml: out,
        jobs: names.len(),
        unmapped: report.finish(),
    }
}

/// `keep_snapshots` from `snapshot_preserve_min` and `snapshot_preserve`:
/// btrsend keeps a count of snapshots, so only btrbk's "all" (keep all:
/// no key) and "latest" with no schedule (one) carry over.
fn snapshot_keep(levels: &[&[Opt]], report: &mut Report) -> Option<usize> {
    let min = lookup(levels, "snapshot_preserve_min");
    let sched = lookup(levels, "snapshot_preserve");
    match (
        min.map_or("all", |o| o.value.as_str()),
        sched.map_or("no", |o| o.value.as_str()),
    ) {
        ("all", _) => None,
        ("latest", "no") => Some(1),
        _ => {
            for o in [min, sched].into_iter().flatten() {
                report.add(
                    o.line,
                    "btrsend keeps a number of snapshots (keep_snapshots), not a time span or schedule: none set, every snapshot is kept",
                );
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_quotes_and_names() {
        assert_eq!(strip_comment("a b # c"), "a b ");
        assert_eq!(strip_comment("a \"b # c\" # d"), "a \"b # c\" ");
        assert_eq!(unquote("\"x y\""), "x y");
        assert_eq!(unquote("'x'"), "x");
        assert_eq!(unquote("\""), "\"");
        assert_eq!(sanitize("@home"), "home");
        assert_eq!(sanitize("/"), "ROOT");
        assert_eq!(sanitize("a.b c"), "a-b-c");
        assert_eq!(within("2w"), Some(String::from("14d")));
        assert_eq!(within("0d"), Some(String::new()));
        assert_eq!(within("d"), None);
        assert_eq!(within("3x"), None);
        assert_eq!(toml_str("a\"b\\\n"), "\"a\\\"b\\\\\\u000A\"");
        assert_eq!(join("/", "/"), "/");
        assert_eq!(join("/mnt/p/", "./a/"), "/mnt/p/a");
        assert_eq!(join("/mnt/p", "."), "/mnt/p");
        assert!(is_remote("ssh://h/x") && is_remote("host:/x") && !is_remote("/a:b"));
    }

    /// Every mix of sections, options and odd values (a few thousand
    /// files) converts without a panic, to TOML the config parser reads
    /// whenever a job comes out.
    #[test]
    fn any_mix_never_panics() {
        let lines = [
            "volume /v",
            "volume ssh://h:22/v",
            "volume h:/v",
            "subvolume a",
            "subvolume /abs/é",
            "subvolume *",
            "subvolume .",
            "target /t",
            "target raw ssh://[::1]:2/r",
            "target send-receive x:/y",
            "target odd /z",
            "snapshot_dir s",
            "snapshot_dir /s",
            "snapshot_create no",
            "snapshot_preserve_min latest",
            "target_preserve_min no",
            "target_preserve 1h *d 0w 3m 2y",
            "target_preserve 2é",
            "target_preserve_min 9999999999999d",
            "raw_target_compress zstd",
            "raw_target_compress_level 99",
            "rate_limit 1t",
            "rate_limit 99999999999999t",
            "ssh_identity \"/a b\"",
            "ssh_user \"u\\\"q\"",
            "incremental maybe",
            "# comment",
            "\u{1b}[2J",
        ];
        let mut seed = 35_u64;
        let mut made = 0;
        for _ in 0..3000 {
            let mut text = String::new();
            for _ in 0..8 {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let i = usize::try_from(seed >> 33).unwrap_or(0) % lines.len();
                text.push_str(lines[i]);
                text.push('\n');
            }
            let out = convert("t", &text);
            if out.jobs > 0 {
                made += 1;
                crate::cmd::backup::config::Config::parse(
                    std::path::Path::new("o.toml"),
                    out.toml.clone(),
                )
                .unwrap_or_else(|e| panic!("{e}\n{text}\n{}", out.toml));
            }
        }
        assert!(made > 100, "{made} files made a job");
    }

    #[test]
    fn bad_lines_never_panic() {
        for text in [
            "",
            "target",
            "subvolume",
            "volume",
            "target raw",
            "target bogus /x\nsnapshot_dir y\nsubvolume /a",
            "= x\n\u{7}bell\n",
            "subvolume a\ntarget_preserve ** ",
            "target_preserve_min \nsubvolume /x\ntarget /y",
            "target ssh://\nsubvolume /a\nsnapshot_dir /s",
            "target ssh://h:99999/x\nsubvolume /a\nsnapshot_dir /s",
            "target h:\nsubvolume /a\nsnapshot_dir /s",
        ] {
            let _ = convert("t", text);
        }
    }
}
