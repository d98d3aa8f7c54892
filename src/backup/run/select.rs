//! Finding what a run stores: the filesystems (devices, or mounted
//! btrfs), the snapshots the command line names (paths, `id:N`, globs), and
//! those of a `--snapshot` directory newer than the newest of them stored.
//!
//! It reads the sources' subvolume lists and nothing else; which snapshots
//! of a directory are new is decided by [`plan`](crate::backup::plan), and
//! nothing here sends or writes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::backup::catalog::Catalog;
use crate::backup::error::BackupError;
use crate::backup::plan::{self, glob_match};
use crate::fs::subvol::{Subvolume, list_subvolumes};
use crate::send::SendError;
use crate::send::mounted::Source;

use super::RunOptions;

/// A selected snapshot and the filesystem it lives in.
pub(crate) struct Selected {
    pub(crate) fs: usize,
    pub(crate) subvol: Subvolume,
    /// Its path as entries record it.
    pub(crate) path: String,
}

/// The UUID a stream carries for a subvolume: its received UUID if set,
/// else its UUID.
pub(crate) fn stream_uuid(s: &Subvolume) -> String {
    let u = if s.root.received_uuid.is_nil() {
        s.root.uuid
    } else {
        s.root.received_uuid
    };
    uuid::Uuid::from_bytes(u.0).hyphenated().to_string()
}

/// The origin of a snapshot: the subvolume it was taken of, else itself.
pub(crate) fn origin_of(s: &Subvolume) -> String {
    let u = if s.root.parent_uuid.is_nil() {
        s.root.uuid
    } else {
        s.root.parent_uuid
    };
    uuid::Uuid::from_bytes(u.0).hyphenated().to_string()
}

/// The creation time of a snapshot.
pub(crate) fn otime_ts(s: &Subvolume) -> jiff::Timestamp {
    let (sec, nsec) = (s.root.otime.sec, s.root.otime.nsec);
    jiff::Timestamp::new(sec, i32::try_from(nsec).unwrap_or(0))
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
}

/// The creation time of a snapshot, RFC 3339.
pub(crate) fn otime_of(s: &Subvolume) -> String {
    otime_ts(s).to_string()
}

/// The time of the full stream of entry `id`'s chain (`None`: a broken
/// chain or an unreadable time).
pub(super) fn full_time_of(cat: &Catalog, id: u64) -> Option<jiff::Timestamp> {
    cat.chain(id).ok()?.first()?.timestamp()
}

fn has_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// The filesystems and snapshots a run reads.
pub(crate) struct Sources {
    /// The filesystems, each with the policy for a mounted one
    /// ([`send::mounted`]).
    pub(crate) fss: Vec<Source>,
    /// Per filesystem: its subvolumes.
    pub(crate) subvols: Vec<Vec<Subvolume>>,
    pub(crate) selected: Vec<Selected>,
    /// Snapshots that cannot be backed up (path, why); the others go on.
    pub(crate) rejected: Vec<(String, BackupError)>,
    /// How the devices are read ([`RunOptions::degraded`]).
    pub(crate) read: crate::device::readahead::ReadOptions,
}

fn fs_error(what: String) -> impl FnOnce(crate::Error) -> BackupError {
    move |source| BackupError::Fs {
        what,
        error: Box::new(source),
    }
}

fn source_error(what: String) -> impl FnOnce(SendError) -> BackupError {
    move |error| BackupError::Send {
        snapshot: what,
        error: Box::new(error),
    }
}

/// Snapshots of one subvolume found in a snapshot directory (`run
/// --snapshot`): stored when newer than the newest of them stored.
pub(crate) struct Found {
    /// The subvolume roots in the snapshot directory (`DIR/NAME`).
    pub(super) paths: Vec<String>,
    /// The subvolume they are snapshots of.
    pub(super) origin: PathBuf,
    /// Those of `paths` that are snapshots of `origin` (by name in DIR),
    /// as [`select_found`] found them; pruning decides among them.
    pub(super) snaps: Vec<(String, Subvolume)>,
}

impl Sources {
    /// The selected snapshots, taken out, oldest first (by creation
    /// transaction): the order a run stores or receives them in, each
    /// the next one's parent.
    pub(crate) fn take_oldest_first(&mut self) -> Vec<Selected> {
        let mut selected = std::mem::take(&mut self.selected);
        selected.sort_by_key(|s| {
            (
                s.subvol.root.otransid.get(),
                s.subvol.root.ctransid.get(),
                s.subvol.id().get(),
            )
        });
        selected
    }

    fn push(&mut self, fs: usize, s: &Subvolume, path: String) {
        if self
            .selected
            .iter()
            .any(|x| x.fs == fs && x.subvol.id() == s.id())
        {
            return;
        }
        self.selected.push(Selected {
            fs,
            subvol: s.clone(),
            path,
        });
    }

    /// The filesystem mounted where `path` lies (opened once per
    /// filesystem), and `path`'s top-level path in it.
    fn mounted(
        &mut self,
        path: &str,
        by_devices: &mut BTreeMap<Vec<PathBuf>, usize>,
    ) -> Result<(usize, String), BackupError> {
        let m = crate::mount::resolve(Path::new(path))
            .map_err(|e| BackupError::Invalid(format!("{path}: {e}")))?;
        if let Some(&i) = by_devices.get(&m.devices) {
            return Ok((i, m.subvol_path));
        }
        let source = Source::open_path_with(Path::new(path), &self.read)
            .map_err(source_error(path.to_owned()))?;
        let subs = list_subvolumes(source.fs()).map_err(fs_error(format!(
            "cannot list the subvolumes of {}",
            m.mount_point.display()
        )))?;
        self.fss.push(source);
        self.subvols.push(subs);
        by_devices.insert(m.devices.clone(), self.fss.len() - 1);
        Ok((self.fss.len() - 1, m.subvol_path))
    }
}

/// Whether a snapshot (its stream UUID and ctransid) is stored already: in
/// a repository's catalog, or received by a target.
pub(crate) type IsStored<'a> = &'a dyn Fn(&str, u64) -> bool;

/// [`IsStored`] of a repository's catalog.
pub(crate) fn in_catalog(cat: &Catalog) -> impl Fn(&str, u64) -> bool + '_ {
    move |uuid, ctransid| cat.find(uuid, ctransid).is_some()
}

/// The filesystem on `devices` (mounted or not), its subvolumes, and the
/// devices' names as messages give them.
///
/// # Errors
///
/// The devices cannot be opened, or the subvolumes listed.
pub(crate) fn open_devices(
    devices: &[PathBuf],
    read: &crate::device::readahead::ReadOptions,
) -> Result<(Source, Vec<Subvolume>, String), BackupError> {
    let list = devices
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let source = Source::open_devices_with(devices, read).map_err(source_error(list.clone()))?;
    let subs = list_subvolumes(source.fs())
        .map_err(fs_error(format!("cannot list the subvolumes on {list}")))?;
    Ok((source, subs, list))
}

pub(crate) fn select(
    opts: &RunOptions,
    specs: &[String],
    found: &mut [Found],
    stored: IsStored<'_>,
) -> Result<Sources, BackupError> {
    let mut src = Sources {
        fss: Vec::new(),
        subvols: Vec::new(),
        selected: Vec::new(),
        rejected: Vec::new(),
        read: opts.read_options(),
    };
    if specs.is_empty() && found.is_empty() && opts.snapshots.is_none() {
        return Err(BackupError::Invalid(String::from("no snapshot given")));
    }
    if !opts.devices.is_empty() {
        let (source, subs, list) = open_devices(&opts.devices, &src.read)?;
        let mut chosen = Vec::new();
        for spec in specs {
            let matched: Vec<&Subvolume> = if let Some(id) = spec.strip_prefix("id:") {
                let id: u64 = id
                    .parse()
                    .map_err(|_| BackupError::Invalid(format!("bad snapshot id {spec}")))?;
                subs.iter().filter(|s| s.id().get() == id).collect()
            } else if has_glob(spec) {
                let pat = spec.trim_matches('/');
                subs.iter()
                    .filter(|s| glob_match(pat, &String::from_utf8_lossy(&s.path)))
                    .collect()
            } else {
                let want = spec.trim_matches('/').as_bytes();
                subs.iter().filter(|s| s.path == want).collect()
            };
            if matched.is_empty() {
                return Err(BackupError::Invalid(format!(
                    "no subvolume on {list} matches {spec}"
                )));
            }
            chosen.extend(matched.into_iter().cloned());
        }
        for s in chosen {
            let path = String::from_utf8_lossy(&s.path).into_owned();
            // On a filesystem mounted read-write only read-only snapshots
            // may be sent (the source's policy).
            match source.subvolume(&format!("id:{}", s.id().get())) {
                Ok(_) => src.push(0, &s, path),
                Err(e) => src.rejected.push((path.clone(), source_error(path)(e))),
            }
        }
        src.fss.push(source);
        src.subvols.push(subs);
        return Ok(src);
    }
    // Paths of read-only snapshots in mounted filesystems.
    let mut by_devices: BTreeMap<Vec<PathBuf>, usize> = BTreeMap::new();
    for spec in specs {
        if spec.starts_with("id:") || has_glob(spec) {
            return Err(BackupError::Invalid(format!(
                "{spec} needs --device: without it each SNAPSHOT is the path of a read-only snapshot in a mounted btrfs"
            )));
        }
        let (fs, subvol_path) = src.mounted(spec, &mut by_devices)?;
        if subvol_path.is_empty() {
            return Err(BackupError::Invalid(format!(
                "{spec} is the top level of its filesystem, not a read-only snapshot"
            )));
        }
        let s = src.fss[fs]
            .subvolume(spec)
            .map_err(source_error(spec.clone()))?;
        src.push(fs, &s, subvol_path);
    }
    // Snapshots found in a snapshot directory: those of the origin, read-
    // only, newer than the newest of them stored.
    for f in found.iter_mut() {
        // A subvolume that cannot be read is its own failure: the others
        // proceed.
        if let Err(e) = select_found(&mut src, f, stored, &mut by_devices) {
            src.rejected.push((f.origin.display().to_string(), e));
        }
    }
    Ok(src)
}

/// The snapshots of `f.origin` among `f.paths` that are newer than the
/// newest of them stored (see [`snapshots`]).
fn select_found(
    src: &mut Sources,
    f: &mut Found,
    stored: IsStored<'_>,
    by_devices: &mut BTreeMap<Vec<PathBuf>, usize>,
) -> Result<(), BackupError> {
    let origin = f.origin.display().to_string();
    let (fs, origin_path) = src.mounted(&origin, by_devices)?;
    let Some(origin_uuid) = src.subvols[fs]
        .iter()
        .find(|s| s.path == origin_path.as_bytes())
        .map(|o| o.root.uuid)
    else {
        return Err(BackupError::Invalid(format!(
            "{origin}: subvolume {origin_path} not found on the devices"
        )));
    };
    let mut snaps = Vec::new();
    for p in &f.paths {
        let (pfs, top) = src.mounted(p, by_devices)?;
        if pfs != fs {
            continue;
        }
        let subs = &src.subvols[fs];
        if let Some(s) = subs
            .iter()
            .find(|s| s.path == top.as_bytes() && s.root.parent_uuid == origin_uuid)
        {
            let name = Path::new(p)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            f.snaps.push((name, s.clone()));
            if s.root.is_readonly() {
                snaps.push((top, s.clone()));
            }
        }
    }
    let seen: Vec<(u64, bool)> = snaps
        .iter()
        .map(|(_, s)| {
            (
                s.root.otransid.get(),
                stored(&stream_uuid(s), s.root.ctransid.get()),
            )
        })
        .collect();
    for ((top, s), new) in snaps.into_iter().zip(plan::newer_than_stored(&seen)) {
        if new {
            src.push(fs, &s, top);
        }
    }
    Ok(())
}
