//! An oracle built from `btrfs receive --dump` text (btrfs-progs v6.2, `TZ=UTC`):
//! replays the names and metadata commands of a kernel stream into a model of
//! the tree it describes, and checks a received manifest against it.
//!
//! The model tracks paths → inodes and, per inode, type, mode, uid, gid,
//! mtime seconds (the dump drops nanoseconds), size, symlink target, rdev and
//! xattr names (the dump prints values raw and cut at NUL, so values are not
//! compared). Everything comes from the kernel's stream as progs prints it,
//! nothing from our own code; the manifest lines are only parsed.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// One inode of the model.
#[derive(Debug, Clone, Default)]
pub struct Inode {
    pub kind: &'static str,
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mtime: Option<i64>,
    pub size: u64,
    pub target: Option<Vec<u8>>,
    pub rdev: Option<(u32, u32)>,
    pub xattrs: BTreeSet<Vec<u8>>,
}

/// The model of one subvolume.
#[derive(Debug, Clone, Default)]
pub struct Subvol {
    /// Relative path (raw bytes, empty for the root) → inode index.
    pub paths: BTreeMap<Vec<u8>, usize>,
    pub inodes: Vec<Inode>,
}

/// Unescape a path as progs prints it (`\ `, `\\`, `\n`…, `\NNN` octal).
pub fn unescape_dump(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 1 < b.len() {
            let c = b[i + 1];
            let simple = match c {
                b'a' => Some(7),
                b'b' => Some(8),
                b'e' => Some(0x1b),
                b'f' => Some(0x0c),
                b'n' => Some(b'\n'),
                b'r' => Some(b'\r'),
                b't' => Some(b'\t'),
                b'v' => Some(0x0b),
                b' ' => Some(b' '),
                b'\\' => Some(b'\\'),
                _ => None,
            };
            if let Some(v) = simple {
                out.push(v);
                i += 2;
                continue;
            }
            if i + 3 < b.len() && b[i + 1..i + 4].iter().all(|d| (b'0'..=b'7').contains(d)) {
                let v = b[i + 1..i + 4]
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                out.push(u8::try_from(v).expect("octal escape fits a byte"));
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// Unescape a manifest field (`\xHH`).
pub fn unescape_manifest(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && b.get(i + 1) == Some(&b'x') && i + 3 < b.len() + 1 {
            let hex = std::str::from_utf8(&b[i + 2..i + 4]).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// Split at spaces not escaped by a backslash.
fn tokens(s: &str) -> Vec<&str> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut start = None;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => {
                start.get_or_insert(i);
                i += 2;
                continue;
            }
            b' ' => {
                if let Some(st) = start.take() {
                    out.push(&s[st..i]);
                }
            }
            _ => {
                start.get_or_insert(i);
            }
        }
        i += 1;
    }
    if let Some(st) = start {
        out.push(&s[st..]);
    }
    out
}

/// Seconds since the epoch of `YYYY-MM-DDTHH:MM:SS+0000` (days-from-civil).
fn parse_time(t: &str) -> i64 {
    assert!(t.ends_with("+0000"), "dump must be made with TZ=UTC: {t}");
    let n = |r: std::ops::Range<usize>| t[r].parse::<i64>().unwrap();
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    let (hh, mm, ss) = (n(11..13), n(14..16), n(17..19));
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    days * 86400 + hh * 3600 + mm * 60 + ss
}

/// The models of all subvolumes after replaying `dumps` in order (a chain:
/// a `snapshot` starts from the model of the subvolume it names as parent,
/// matched by the uuid of an earlier `subvol`/`snapshot`).
pub fn replay(dumps: &[&str]) -> BTreeMap<String, Subvol> {
    let mut by_uuid: HashMap<String, String> = HashMap::new();
    let mut subvols: BTreeMap<String, Subvol> = BTreeMap::new();
    for dump in dumps {
        let mut cur: Option<String> = None;
        for line in dump.lines() {
            if line.len() < 17 {
                continue;
            }
            let title = line[..16].trim_end();
            let toks = tokens(&line[16..]);
            let Some(&path_tok) = toks.first() else {
                continue;
            };
            let args: HashMap<&str, &str> = toks[1..]
                .iter()
                .filter_map(|t| t.trim_end_matches(',').split_once('='))
                .collect();
            if title == "subvol" || title == "snapshot" {
                let name =
                    String::from_utf8(unescape_dump(path_tok.trim_start_matches("./"))).unwrap();
                let mut sv = Subvol::default();
                if title == "snapshot" {
                    let parent = &by_uuid[args["parent_uuid"]];
                    sv = subvols[parent].clone();
                } else {
                    sv.inodes.push(Inode {
                        kind: "dir",
                        ..Default::default()
                    });
                    sv.paths.insert(Vec::new(), 0);
                }
                by_uuid.insert(args["uuid"].to_owned(), name.clone());
                subvols.insert(name.clone(), sv);
                cur = Some(name);
                continue;
            }
            let Some(name) = cur.as_ref() else { continue };
            let sv = subvols.get_mut(name).unwrap();
            let prefix = format!("./{name}");
            let rel = |p: &str| -> Vec<u8> {
                let raw = unescape_dump(p);
                let rest = raw
                    .strip_prefix(prefix.as_bytes())
                    .unwrap_or_else(|| panic!("path outside subvol: {line}"));
                rest.strip_prefix(b"/").unwrap_or(rest).to_vec()
            };
            let path = rel(path_tok);
            let mut create = |kind: &'static str, inode: Inode| {
                sv.inodes.push(Inode { kind, ..inode });
                let ino = sv.inodes.len() - 1;
                sv.paths.insert(path.clone(), ino);
            };
            match title {
                "mkfile" => create("file", Inode::default()),
                "mkdir" => create("dir", Inode::default()),
                "mkfifo" => create("fifo", Inode::default()),
                "mksock" => create("sock", Inode::default()),
                "symlink" => {
                    let target = unescape_dump(args["dest"]);
                    create(
                        "symlink",
                        Inode {
                            size: target.len() as u64,
                            target: Some(target),
                            ..Default::default()
                        },
                    );
                }
                "mknod" => {
                    let mode = u32::from_str_radix(args["mode"], 8).unwrap();
                    let dev =
                        u64::from_str_radix(args["dev"].trim_start_matches("0x"), 16).unwrap();
                    // new_encode_dev() layout.
                    let major = ((dev & 0xfff00) >> 8) as u32;
                    let minor = ((dev & 0xff) | ((dev >> 12) & 0xfff00)) as u32;
                    let kind = match mode & 0o170000 {
                        0o020000 => "chr",
                        0o060000 => "blk",
                        0o010000 => "fifo",
                        0o140000 => "sock",
                        other => panic!("mknod of type {other:o}: {line}"),
                    };
                    create(
                        kind,
                        Inode {
                            rdev: matches!(kind, "chr" | "blk").then_some((major, minor)),
                            ..Default::default()
                        },
                    );
                }
                "rename" => {
                    let to = rel(args["dest"]);
                    let moved: Vec<(Vec<u8>, usize)> = sv
                        .paths
                        .iter()
                        .filter(|(p, _)| {
                            **p == path
                                || (p.starts_with(&path) && p.get(path.len()) == Some(&b'/'))
                        })
                        .map(|(p, &i)| (p.clone(), i))
                        .collect();
                    assert!(!moved.is_empty(), "rename of unknown path: {line}");
                    for (p, _) in &moved {
                        sv.paths.remove(p);
                    }
                    for (p, i) in moved {
                        let mut np = to.clone();
                        np.extend_from_slice(&p[path.len()..]);
                        sv.paths.insert(np, i);
                    }
                }
                "link" => {
                    // LINK prints the existing name as dest=, relative and
                    // without the subvolume prefix.
                    let existing = unescape_dump(args["dest"]);
                    let ino = *sv
                        .paths
                        .get(&existing)
                        .unwrap_or_else(|| panic!("link to unknown path: {line}"));
                    sv.paths.insert(path, ino);
                }
                "unlink" | "rmdir" => {
                    sv.paths
                        .remove(&path)
                        .unwrap_or_else(|| panic!("removal of unknown path: {line}"));
                }
                _ => {
                    let Some(&ino) = sv.paths.get(&path) else {
                        panic!("{title} on unknown path: {line}");
                    };
                    let inode = &mut sv.inodes[ino];
                    let num = |k: &str| args[k].parse::<u64>().unwrap();
                    match title {
                        "chmod" => inode.mode = Some(u32::from_str_radix(args["mode"], 8).unwrap()),
                        "chown" => {
                            inode.uid = Some(num("uid") as u32);
                            inode.gid = Some(num("gid") as u32);
                        }
                        "utimes" => inode.mtime = Some(parse_time(args["mtime"])),
                        "truncate" => inode.size = num("size"),
                        "write" | "clone" => {
                            inode.size = inode.size.max(num("offset") + num("len"));
                        }
                        "encoded_write" => {
                            inode.size = inode.size.max(num("offset") + num("unencoded_file_len"));
                        }
                        "fallocate" => {
                            // Mode 0 may extend the size; KEEP_SIZE (1) and
                            // punch holes (3) do not.
                            if num("mode") == 0 {
                                inode.size = inode.size.max(num("offset") + num("len"));
                            }
                        }
                        "set_xattr" => {
                            inode.xattrs.insert(args["name"].as_bytes().to_vec());
                        }
                        "remove_xattr" => {
                            inode.xattrs.remove(args["name"].as_bytes());
                        }
                        "update_extent" | "fileattr" | "enable_verity" => {}
                        other => panic!("unknown dump command {other}: {line}"),
                    }
                }
            }
        }
    }
    subvols
}

/// Check a manifest (with or without `data=`) against the model; returns the
/// list of mismatches (empty if none) and the number of paths checked.
pub fn check(model: &Subvol, manifest: &str) -> (Vec<String>, usize) {
    let mut errs = Vec::new();
    let mut lines: BTreeMap<Vec<u8>, HashMap<String, String>> = BTreeMap::new();
    let mut kinds: BTreeMap<Vec<u8>, String> = BTreeMap::new();
    for line in manifest.lines().skip(1) {
        let mut f = line.split(' ');
        let p = f.next().unwrap();
        let raw = if p == "." {
            Vec::new()
        } else {
            unescape_manifest(p)
        };
        kinds.insert(raw.clone(), f.next().unwrap().to_owned());
        let mut fields = HashMap::new();
        for fld in f {
            let (k, v) = fld.split_once('=').unwrap();
            if let Some(name) = k.strip_prefix("xattr:") {
                fields
                    .entry("xattrs".to_owned())
                    .and_modify(|s: &mut String| {
                        s.push(' ');
                        s.push_str(name);
                    })
                    .or_insert_with(|| name.to_owned());
            } else {
                fields.insert(k.to_owned(), v.to_owned());
            }
        }
        lines.insert(raw, fields);
    }
    let show = |p: &[u8]| String::from_utf8_lossy(p).into_owned();
    let model_paths: BTreeSet<&Vec<u8>> = model.paths.keys().collect();
    let got_paths: BTreeSet<&Vec<u8>> = lines.keys().collect();
    for p in model_paths.difference(&got_paths) {
        errs.push(format!("missing {:?}", show(p)));
    }
    for p in got_paths.difference(&model_paths) {
        errs.push(format!("unexpected {:?}", show(p)));
    }
    // Hard-link groups: same inode in the model <=> same link= value.
    let mut members: HashMap<usize, Vec<&Vec<u8>>> = HashMap::new();
    for (p, &i) in &model.paths {
        members.entry(i).or_default().push(p);
    }
    for (p, &ino) in &model.paths {
        let Some(fields) = lines.get(p) else { continue };
        let inode = &model.inodes[ino];
        let want = |k: &str, v: Option<String>| -> Option<String> {
            let got = fields.get(k);
            (got != v.as_ref()).then(|| format!("{:?}: {k} expected {v:?}, got {got:?}", show(p)))
        };
        if kinds[p] != inode.kind {
            errs.push(format!(
                "{:?}: type {} expected {}",
                show(p),
                kinds[p],
                inode.kind
            ));
            continue;
        }
        // A symlink's mode is always 0777 and the kernel sends no chmod.
        let mode = if inode.kind == "symlink" {
            Some(0o777)
        } else {
            inode.mode
        };
        errs.extend(want("mode", mode.map(|m| format!("{:04o}", m & 0o7777))));
        errs.extend(want("uid", inode.uid.map(|u| u.to_string())));
        errs.extend(want("gid", inode.gid.map(|g| g.to_string())));
        if let (Some(m), Some(got)) = (inode.mtime, fields.get("mtime")) {
            let sec = got.split_once('.').unwrap().0;
            if sec != m.to_string() {
                errs.push(format!("{:?}: mtime {got}, expected second {m}", show(p)));
            }
        }
        if matches!(inode.kind, "file" | "symlink") {
            errs.extend(want("size", Some(inode.size.to_string())));
        }
        errs.extend(want(
            "target",
            inode.target.as_ref().map(|t| btrsend::manifest::escape(t)),
        ));
        errs.extend(want("rdev", inode.rdev.map(|(a, b)| format!("{a}:{b}"))));
        let names: Vec<String> = inode
            .xattrs
            .iter()
            .map(|n| String::from_utf8(n.clone()).unwrap())
            .collect();
        errs.extend(want("xattrs", (!names.is_empty()).then(|| names.join(" "))));
        let group = &members[&ino];
        let link = fields.get("link");
        if group.len() > 1 {
            let first = btrsend::manifest::escape(group.iter().min().unwrap());
            if link != Some(&first) {
                errs.push(format!("{:?}: link {link:?}, expected {first}", show(p)));
            }
        } else if link.is_some() {
            errs.push(format!("{:?}: unexpected link {link:?}", show(p)));
        }
    }
    (errs, model.paths.len())
}
