//! Where a send reads its filesystem from, and the policy for a mounted
//! one: so that a send from the devices of a filesystem the kernel has
//! mounted is never wrong and never a false alarm.
//!
//! A [`Source`] is opened from devices ([`Source::open_devices`]: image
//! files or block devices, `btrsend send --device`) or from a path inside
//! a mounted btrfs ([`Source::open_path`]: `btrsend send /mnt/snaps/x`).
//! Devices that belong to a mounted btrfs — a block device listed in
//! `/sys/fs/btrfs/<fsid>/devices`, or an image file backing a loop device
//! listed there ([`mount::mounted_filesystem_of`]) — get the same policy as
//! a path:
//!
//! * **Flush**: `syncfs` on a mount of the filesystem, so what was written
//!   through it is on the devices.
//! * **Read past stale caches**: the kernel's btrfs writes its blocks with
//!   bios, around the block device's page cache, so pages cached there
//!   earlier (an earlier send, `dd`, `blkid`) can be stale: the page cache
//!   of every block device read is dropped before the filesystem is opened
//!   (and again before every reread). An image file backing a loop device
//!   is written through its own page cache and needs no drop.
//! * **Read-only snapshots only** (as `btrfs send` demands): on a
//!   filesystem mounted read-write, the subvolume, the parent and the
//!   clone sources must be read-only; the data and trees of a read-only
//!   snapshot do not change, except when a balance relocates them.
//! * **Relocation** (read-write mounts): a block that fails to read or
//!   verify may have been moved by a balance. Then the superblock, the
//!   chunk map and the snapshot's roots are read again and, if chunks were
//!   indeed moved, the send is planned again and continues its stream at
//!   the byte where the output stopped, within the same process (the
//!   resume machinery of [`crate::resume`]: the commands before that point
//!   are planned and dropped without reading their file data); at most
//!   [`MAX_RESTARTS`] times. The stream is continuous and receives to the
//!   snapshot's exact tree. It is not always byte for byte the stream an
//!   undisturbed send writes: the stream of `btrfs send` and btrsend
//!   depends on the layout (a CLONE names one of the references to a
//!   shared extent, in the order of its back references, which a
//!   relocation rewrites; a relocation may also split extents), so two
//!   undisturbed sends before and after a balance may differ, and the
//!   kernel's do too. Continuing at a byte offset therefore needs the
//!   commands planned again before that point to be the very ones written
//!   (fstests btrfs/252 once received a garbage command length when they
//!   were not): the data commands of each extent before the point (which
//!   clone source, what is cloned and what written) are made again as
//!   they were, and the commands dropped are checked against an
//!   identity chain of the commands written (each as encoded, without its
//!   file data, which its path, offset and length fix; see `Trail` in
//!   `src/send/pipeline.rs`); if they differ all the same (say a
//!   relocation split an extent written before the point), the send fails
//!   ([`SendError::Replanned`]) rather than continue. (That record, the
//!   trail, is kept only on a read-write mount: elsewhere nothing moves
//!   and a send is never continued; its identity hashing took 1.8 % of
//!   the CPU samples of a warm 500k-small-file send, and it holds at most
//!   ~6 MiB.) A failure with no
//!   chunk moved is an error ([`SendError::Incomplete`]). The stream's last
//!   command (END) is withheld until the send succeeds, so that a receiver
//!   of a failed send's output fails too. After the send, if file data was
//!   read unverified (files without checksums, `--no-verify-data`) and
//!   chunks were removed or moved meanwhile, that data may be stale: the
//!   send fails ([`SendError::LayoutChanged`]). Every other block read was
//!   verified, so a relocation cannot have made it stale.
//!
//! Every tree block is checked (checksum, bytenr, generation against its
//! parent pointer) and, unless [`SendOptions::verify_data`] is off, every
//! data block against its stored checksum, so a stale or relocated block
//! does not pass; the two residual cases — files without data checksums
//! (`nodatasum`, `nodatacow`) and sends without verification — are covered
//! by the flush, the cache drop and the layout check above.
//!
//! A read-only mount keeps the fast path: its page cache is dropped once
//! (pages cached during an earlier read-write mount may be stale), and
//! nothing is held back or checked afterwards, since nothing can move.

use std::cell::RefCell;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::device::readahead::ReadOptions;
use crate::fs::Filesystem;
use crate::fs::subvol::Subvolume;
use crate::mount::{self, MountedFs};
use crate::volume::Volume;

use super::pipeline::Trail;
use super::{Progress, SendError, SendOptions, SendStats};

/// Restarts of one send after blocks were moved (each continues the
/// stream where it stopped): a balance relocates a block group at a time,
/// so a send meets a few at most.
pub const MAX_RESTARTS: u32 = 64;

/// Bytes withheld at the end of the stream until the layout check passes:
/// an END command (a bare 10-byte command header). Without it the stock
/// `btrfs receive` fails ("unexpected EOF in stream").
const TAIL_BYTES: usize = 10;

/// The subvolumes of one send, as given (paths from the top level or
/// `id:N` with devices; paths in the mounted filesystem without).
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The subvolume to send.
    pub subvol: &'a str,
    /// The parent (incremental send), if any.
    pub parent: Option<&'a str>,
    /// Clone sources (`-c`); without a parent, the parent is chosen among
    /// them as btrfs-progs does.
    pub clone_sources: &'a [String],
}

/// A mounted filesystem being read, and how it was found.
#[derive(Debug, Clone)]
struct Mounted {
    fs: MountedFs,
    /// Subvolumes are named by paths in the mount (not from the top
    /// level).
    by_path: bool,
}

/// The filesystem a send reads, with the policy for a mounted one (see
/// the module doc).
#[derive(Debug)]
pub struct Source {
    fs: Filesystem,
    /// The devices read.
    devices: Vec<PathBuf>,
    mounted: Option<Mounted>,
    /// How the devices are read (kept for rereads).
    read: ReadOptions,
    /// Tests: run after the first failed attempt of a send, before the
    /// filesystem is read again (e.g. a balance).
    #[cfg(feature = "testing")]
    after_failure: Option<Hook>,
}

/// Opens another [`Source`] on the filesystem of one already open (see
/// [`Source::beside`]).
#[derive(Debug, Clone)]
pub struct Beside {
    devices: Vec<PathBuf>,
    mounted: Option<Mounted>,
}

impl Beside {
    /// Open the filesystem with these read options.
    ///
    /// # Errors
    ///
    /// [`SendError::Fs`] or, when mounted, [`SendError::OpenMounted`]: the
    /// filesystem cannot be read.
    pub fn open(self, read: &ReadOptions) -> Result<Source, SendError> {
        let fs = match &self.mounted {
            Some(m) => Volume::open_with(&self.devices, read)
                .map(Filesystem::from_volume)
                .map_err(|source| open_mounted_error(&m.fs, &self.devices, source))?,
            None => Filesystem::open_with(&self.devices, read)?,
        };
        Ok(Source {
            fs,
            devices: self.devices,
            mounted: self.mounted,
            read: read.clone(),
            #[cfg(feature = "testing")]
            after_failure: None,
        })
    }
}

/// Tests: see [`Source::fail_once`].
#[cfg(feature = "testing")]
struct Hook(Box<dyn FnMut()>);

#[cfg(feature = "testing")]
impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hook")
    }
}

impl Source {
    /// Open the filesystem on these devices (image files or block
    /// devices). When they belong to a mounted btrfs, it is synced and the
    /// block devices' page cache dropped first.
    ///
    /// # Errors
    ///
    /// [`SendError::Mount`] (a device cannot be examined, the sync fails),
    /// [`SendError::Fs`] (the filesystem cannot be read).
    pub fn open_devices(devices: &[PathBuf]) -> Result<Source, SendError> {
        Source::open_devices_with(devices, &ReadOptions::default())
    }

    /// [`open_devices`](Self::open_devices) with these read options (e.g.
    /// [`ReadOptions::degraded`]).
    ///
    /// # Errors
    ///
    /// As [`open_devices`](Self::open_devices).
    pub fn open_devices_with(devices: &[PathBuf], read: &ReadOptions) -> Result<Source, SendError> {
        let mut found = None;
        for d in devices {
            if let Some(m) = mount::mounted_filesystem_of(d)? {
                found = Some(m);
                break;
            }
        }
        let mounted = found.map(|fs| Mounted { fs, by_path: false });
        let fs = match &mounted {
            Some(m) => open_mounted(&m.fs, devices, read)?,
            None => Filesystem::open_with(devices, read)?,
        };
        Ok(Source {
            fs,
            devices: devices.to_vec(),
            mounted,
            read: read.clone(),
            #[cfg(feature = "testing")]
            after_failure: None,
        })
    }

    /// Open the mounted btrfs that `path` (a subvolume's root directory)
    /// lies in, from its devices (found in sysfs), after syncing it and
    /// dropping the devices' page cache.
    ///
    /// # Errors
    ///
    /// [`SendError::Mount`]: the path is not a subvolume of a mounted
    /// btrfs; [`SendError::OpenMounted`]: its devices cannot be read.
    pub fn open_path(path: &Path) -> Result<Source, SendError> {
        Source::open_path_with(path, &ReadOptions::default())
    }

    /// [`open_path`](Self::open_path) with these read options.
    ///
    /// # Errors
    ///
    /// As [`open_path`](Self::open_path).
    pub fn open_path_with(path: &Path, read: &ReadOptions) -> Result<Source, SendError> {
        let m = mount::resolve(path)?;
        let fs = m.filesystem();
        let devices = m.devices.clone();
        let mounted = Mounted { fs, by_path: true };
        Ok(Source {
            fs: open_mounted(&mounted.fs, &devices, read)?,
            devices,
            mounted: Some(mounted),
            read: read.clone(),
            #[cfg(feature = "testing")]
            after_failure: None,
        })
    }

    /// Open from devices when there are any, else from the mounted path
    /// `subvol` ([`open_devices`](Self::open_devices),
    /// [`open_path`](Self::open_path)).
    ///
    /// # Errors
    ///
    /// As those; [`SendError::NeedsDevice`] for `id:N` without devices.
    pub fn open(devices: &[PathBuf], subvol: &str) -> Result<Source, SendError> {
        Source::open_with(devices, subvol, &ReadOptions::default())
    }

    /// [`open`](Self::open) with these read options.
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open).
    pub fn open_with(
        devices: &[PathBuf],
        subvol: &str,
        read: &ReadOptions,
    ) -> Result<Source, SendError> {
        if !devices.is_empty() {
            return Source::open_devices_with(devices, read);
        }
        if subvol.starts_with("id:") {
            return Err(SendError::NeedsDevice(subvol.to_owned()));
        }
        Source::open_path_with(Path::new(subvol), read)
    }

    /// What opens another source on this filesystem, for a pass beside
    /// the send (the progress total's estimate): the same devices, found
    /// the same way, read as they are now. Unlike [`open_with`](Self::open_with)
    /// it neither syncs a mounted filesystem nor drops the devices' page
    /// cache again: this source's opening just did, and a second drop would
    /// throw away what the send has read meanwhile. [`Beside::open`] may run
    /// on another thread.
    pub fn beside(&self) -> Beside {
        Beside {
            devices: self.devices.clone(),
            mounted: self.mounted.clone(),
        }
    }

    /// The filesystem as read now (after a restart, the fresh one).
    pub fn fs(&self) -> &Filesystem {
        &self.fs
    }

    /// The devices read.
    pub fn devices(&self) -> &[PathBuf] {
        &self.devices
    }

    /// The mounted filesystem the devices belong to, if mounted.
    pub fn mounted(&self) -> Option<&MountedFs> {
        self.mounted.as_ref().map(|m| &m.fs)
    }

    /// Whether the full mounted policy applies: the filesystem is mounted
    /// read-write (or its mount is not visible here), so it may change.
    /// Tests: make the next block read of the filesystem fail once (after
    /// `reads` more reads), and run `hook` after the failed attempt
    /// (before the filesystem is read again).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn fail_once(&mut self, reads: u64, hook: Box<dyn FnMut()>) {
        self.fs.volume().fail_read_after(reads);
        self.after_failure = Some(Hook(hook));
    }

    fn may_change(&self) -> bool {
        self.mounted.as_ref().is_some_and(|m| !m.fs.read_only)
    }

    /// Whether subvolumes must be read-only snapshots: given by path (as
    /// `btrfs send` demands), or on a filesystem mounted read-write.
    fn needs_read_only(&self) -> bool {
        self.mounted
            .as_ref()
            .is_some_and(|m| m.by_path || !m.fs.read_only)
    }

    fn describe(&self) -> String {
        self.mounted
            .as_ref()
            .map(|m| m.fs.describe())
            .unwrap_or_else(|| "the filesystem".to_owned())
    }

    /// `given` as [`find_subvolume`](super::find_subvolume) takes it: a
    /// path in the mount becomes the path from the top level.
    fn spec(&self, given: &str) -> Result<String, SendError> {
        let Some(m) = self.mounted.as_ref().filter(|m| m.by_path) else {
            return Ok(given.to_owned());
        };
        if given.starts_with("id:") {
            return Ok(given.to_owned());
        }
        let r = mount::resolve(Path::new(given))?;
        if let (Some(want), Some(got)) = (&m.fs.fsid, &r.fsid)
            && want != got
        {
            return Err(SendError::OtherFilesystem {
                given: given.to_owned(),
                fsid: want.clone(),
            });
        }
        if r.subvol_path.is_empty() {
            return Err(SendError::TopLevel(r.path));
        }
        Ok(r.subvol_path)
    }

    /// The subvolume `given` names (`role`: `""`, `"parent "`, `"clone
    /// source "`), checked to be read-only where the policy demands.
    fn find(&self, given: &str, role: &'static str) -> Result<Subvolume, SendError> {
        let subvol = super::find_subvolume(&self.fs, &self.spec(given)?)?;
        if self.needs_read_only() && !subvol.root.is_readonly() {
            let mount = match &self.mounted {
                Some(m) if m.by_path => "a mounted filesystem".to_owned(),
                _ => format!("{} (read-write)", self.describe()),
            };
            return Err(SendError::NotReadOnly {
                role,
                given: given.to_owned(),
                mount,
            });
        }
        Ok(subvol)
    }

    /// The subvolume to send, as `given` (see [`Request::subvol`]).
    ///
    /// # Errors
    ///
    /// [`SendError::NoSubvolume`], [`SendError::NotReadOnly`],
    /// [`SendError::TopLevel`], read errors.
    pub fn subvolume(&self, given: &str) -> Result<Subvolume, SendError> {
        self.find(given, "")
    }

    /// The subvolume `req` sends, after finding (and checking) its parent
    /// and clone sources too: the errors [`send`](Self::send) would meet
    /// first, before any output is made.
    ///
    /// # Errors
    ///
    /// As [`subvolume`](Self::subvolume), for each of them;
    /// [`SendError::NoGoodParent`].
    pub fn check(&self, req: &Request<'_>) -> Result<Subvolume, SendError> {
        self.roots(req).map(|r| r.subvol)
    }

    /// The subvolume, parent and clone sources of `req`.
    fn roots(&self, req: &Request<'_>) -> Result<Roots, SendError> {
        let subvol = self.subvolume(req.subvol)?;
        let clones = req
            .clone_sources
            .iter()
            .map(|c| self.find(c, "clone source "))
            .collect::<Result<Vec<_>, _>>()?;
        let parent = match req.parent {
            Some(p) => Some(self.find(p, "parent ")?),
            None if !clones.is_empty() => {
                Some(super::find_good_parent(&self.fs, &subvol, &clones)?)
            }
            None => None,
        };
        Ok(Roots {
            subvol,
            parent,
            clones,
        })
    }

    /// Sync again, drop the caches again, and reread the superblock and
    /// chunk map.
    fn reopen(&mut self) -> Result<(), SendError> {
        if let Some(m) = &self.mounted {
            self.fs = open_mounted(&m.fs, &self.devices, &self.read)?;
        }
        Ok(())
    }

    /// After a send: whether chunks were removed or moved meanwhile (`Err`
    /// with the chunk tree generations then and now).
    fn layout_changed(&self) -> Result<Option<(u64, u64)>, SendError> {
        let Some(dev) = self.devices.first() else {
            return Ok(None);
        };
        drop_cache(std::slice::from_ref(dev))?;
        let device = crate::device::FileDevice::open(dev)?;
        let (now, _) = crate::superblock::read_superblock(&device)?;
        let was = self.fs.volume().superblock().chunk_root_generation;
        if now.chunk_root_generation == was {
            return Ok(None);
        }
        // New chunks being allocated is harmless; a chunk gone or changed
        // is not.
        drop_cache(&self.devices)?;
        let fresh = crate::volume::Volume::open_with(&self.devices, &self.read)?;
        let new = fresh.chunk_map().chunks();
        let kept = self
            .fs
            .volume()
            .chunk_map()
            .chunks()
            .iter()
            .all(|c| new.contains(c));
        Ok((!kept).then_some((was.get(), now.chunk_root_generation.get())))
    }

    /// The exact size and commands of the stream [`send`](Self::send)
    /// would write for `req` ([`super::estimate`]).
    ///
    /// # Errors
    ///
    /// As [`super::estimate`]; the subvolumes' errors as
    /// [`subvolume`](Self::subvolume).
    pub fn estimate(&self, req: &Request<'_>, opts: SendOptions) -> Result<SendStats, SendError> {
        let roots = self.roots(req)?;
        super::estimate(
            &self.fs,
            &roots.subvol,
            roots.parent.as_ref(),
            &roots.clones,
            opts,
        )
    }

    /// Write the send stream `req` asks for to `out`, with the mounted
    /// policy when the filesystem is mounted (see the module doc); `out`
    /// is returned after a successful send.
    ///
    /// # Errors
    ///
    /// As [`send_with_clone_sources`](super::send_with_clone_sources);
    /// the subvolumes' errors as [`subvolume`](Self::subvolume); on a
    /// filesystem mounted read-write also [`SendError::Incomplete`],
    /// [`SendError::Replanned`] and [`SendError::LayoutChanged`].
    pub fn send<W: Write>(
        &mut self,
        req: &Request<'_>,
        out: W,
        opts: SendOptions,
        progress: &dyn Progress,
    ) -> Result<(W, SendStats), SendError> {
        self.send_from(req, out, opts, None, progress)
    }

    /// [`send`](Self::send), or with a resume token the rest of the
    /// stream as a continuation stream ([`super::send_resumed`]).
    ///
    /// # Errors
    ///
    /// As [`send`](Self::send); [`SendError::ResumeMismatch`];
    /// [`SendError::Replanned`] when a balance moved blocks and the send
    /// planned again differs before the point its stream stopped at.
    pub fn send_from<W: Write>(
        &mut self,
        req: &Request<'_>,
        out: W,
        opts: SendOptions,
        token: Option<&crate::resume::Token>,
        progress: &dyn Progress,
    ) -> Result<(W, SendStats), SendError> {
        let policy = self.may_change();
        let mut out = if policy {
            Held::new(out, 0, TAIL_BYTES)
        } else {
            Held::new(out, 0, 0)
        };
        // A continuation's header comes before its first command.
        let prefix = token.map_or(0, |t| crate::resume::continuation_header(t).len() as u64);
        // Where the commands written start in the stream.
        let (start, start_index) =
            token.map_or((crate::resume::FIRST_COMMAND, 0), |t| (t.offset, t.index));
        let trail = RefCell::new(Trail::new(start, start_index));
        let mut restarts = 0u32;
        let mut continued_at = 0u64;
        // File data read unverified (a relocation could have made it stale).
        let mut unverified = 0u64;
        loop {
            if out.accepted == 0 {
                // Nothing written: start afresh.
                trail.borrow_mut().rewind();
            }
            let before_reads = self.fs.volume().unverified_bytes();
            let traced = super::Traced {
                trail: &trail,
                // Something of the stream reached the output: continue it.
                resume: out.accepted > 0,
                token,
                // Only a filesystem mounted read-write can move blocks
                // (and only then is the send continued).
                record: policy,
            };
            // The snapshots' roots are read again each time (a relocation
            // rewrites them).
            let res = self.roots(req).and_then(|roots| {
                super::send_traced(
                    &self.fs,
                    &roots.subvol,
                    roots.parent.as_ref(),
                    &roots.clones,
                    &mut out,
                    opts,
                    traced,
                    progress,
                )
            });
            unverified = unverified.saturating_add(
                self.fs
                    .volume()
                    .unverified_bytes()
                    .saturating_sub(before_reads),
            );
            #[cfg(feature = "testing")]
            let res = match res {
                Err(e) if policy && restarts == 0 => {
                    if let Some(hook) = self.after_failure.as_mut() {
                        (hook.0)();
                    }
                    Err(e)
                }
                res => res,
            };
            let stats = match res {
                Ok((_, mut stats)) => {
                    stats.continued = restarts;
                    stats.continued_at = if restarts > 0 { continued_at } else { 0 };
                    stats
                }
                Err(e) if policy && is_read_error(&e) => {
                    // The kernel may have moved blocks (a balance): reread
                    // the superblock, the chunk map and the snapshot's
                    // root, and continue the stream where it stopped if
                    // chunks were indeed moved.
                    let before = self.fs.volume().superblock().generation.get();
                    let old = self.fs.volume().chunk_map().chunks().to_vec();
                    self.reopen()?;
                    let after = self.fs.volume().superblock().generation.get();
                    let now = self.fs.volume().chunk_map().chunks();
                    let moved = !old.iter().all(|c| now.contains(c));
                    // The output stopped after the last command the trail
                    // holds (nothing was written cut).
                    let t = trail.borrow();
                    let stopped = out
                        .accepted
                        .checked_sub(prefix)
                        .map(|n| n.saturating_add(if token.is_some() { start } else { 0 }));
                    let whole = out.accepted == 0 || (!t.broken && stopped == Some(t.pos));
                    if !moved || restarts >= MAX_RESTARTS || !whole {
                        return Err(SendError::Incomplete {
                            mount: self.describe(),
                            before,
                            after,
                            source: Box::new(e),
                        });
                    }
                    restarts += 1;
                    continued_at = t.pos;
                    continue;
                }
                Err(SendError::ResumeMismatch(why)) if restarts > 0 => {
                    // Planned again after the relocation, the stream
                    // differs before the point where it stopped.
                    return Err(SendError::Replanned {
                        mount: self.describe(),
                        at: continued_at,
                        why,
                    });
                }
                Err(e) => return Err(e),
            };
            // Every tree block and checksummed data block read was verified:
            // a relocation could only have made unverified data stale.
            if policy
                && (unverified > 0 || !opts.verify_data)
                && let Some((was, now)) = self.layout_changed()?
            {
                return Err(SendError::LayoutChanged {
                    mount: self.describe(),
                    was,
                    now,
                });
            }
            let offset = stats.stream_bytes;
            let inner = out.finish().map_err(|error| {
                SendError::Output(stream_format::EncodeError::Io { offset, error })
            })?;
            return Ok((inner, stats));
        }
    }
}

/// The subvolumes of a send.
struct Roots {
    subvol: Subvolume,
    parent: Option<Subvolume>,
    clones: Vec<Subvolume>,
}

/// Whether a send error is a failed read of the filesystem (which, on a
/// mounted one, a concurrent balance may explain).
fn is_read_error(e: &SendError) -> bool {
    matches!(e, SendError::Fs { .. } | SendError::Corrupt { .. })
}

/// Drop the page cache of those `devices` that are block devices.
fn drop_cache(devices: &[PathBuf]) -> Result<(), SendError> {
    let block: Vec<PathBuf> = devices
        .iter()
        .filter(|d| mount::is_block_device(d))
        .cloned()
        .collect();
    mount::drop_page_cache(&block)?;
    Ok(())
}

/// Sync the mounted filesystem `m` (when it may change), drop the page
/// cache of the block devices among `devices`, and open them.
fn open_mounted(
    m: &MountedFs,
    devices: &[PathBuf],
    read: &ReadOptions,
) -> Result<Filesystem, SendError> {
    if !m.read_only {
        m.sync()?;
    }
    drop_cache(devices)?;
    // The kernel checked at mount what `Filesystem::open` checks; checking
    // it again while the filesystem changes would race with its writes.
    Volume::open_with(devices, read)
        .map(Filesystem::from_volume)
        .map_err(|source| open_mounted_error(m, devices, source))
}

/// [`SendError::OpenMounted`]: the devices of mounted `m` cannot be read.
fn open_mounted_error(m: &MountedFs, devices: &[PathBuf], source: crate::Error) -> SendError {
    SendError::OpenMounted {
        mount: m.describe(),
        devices: devices
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        source,
    }
}

/// The output: holds back the first `hold` bytes (until more come) and
/// always the last `tail` bytes (until [`finish`](Held::finish)); counts
/// what reached the inner writer.
struct Held<W> {
    inner: W,
    /// Bytes held at the start (while `hold` is not 0).
    head: Vec<u8>,
    hold: usize,
    /// The last bytes written, withheld.
    tail: Vec<u8>,
    keep: usize,
    /// Bytes that reached `inner`.
    written: u64,
    /// Bytes written to it (held or passed on).
    accepted: u64,
}

impl<W: Write> Held<W> {
    fn new(inner: W, hold: usize, keep: usize) -> Held<W> {
        Held {
            inner,
            head: Vec::new(),
            hold,
            tail: Vec::with_capacity(keep),
            keep,
            written: 0,
            accepted: 0,
        }
    }

    /// Pass `buf` on, except the last `keep` bytes of everything so far.
    fn pass(&mut self, buf: &[u8]) -> std::io::Result<()> {
        if buf.len() >= self.keep {
            let (out, keep) = buf.split_at(buf.len().saturating_sub(self.keep));
            if !self.tail.is_empty() {
                self.inner.write_all(&self.tail)?;
                self.written = self.written.saturating_add(self.tail.len() as u64);
            }
            self.inner.write_all(out)?;
            self.written = self.written.saturating_add(out.len() as u64);
            self.tail.clear();
            self.tail.extend_from_slice(keep);
        } else {
            self.tail.extend_from_slice(buf);
            let excess = self.tail.len().saturating_sub(self.keep);
            if excess > 0 {
                self.inner
                    .write_all(self.tail.get(..excess).unwrap_or_default())?;
                self.written = self.written.saturating_add(excess as u64);
                self.tail.drain(..excess);
            }
        }
        Ok(())
    }

    /// Forget what is held (before starting again).
    #[cfg(test)]
    fn discard(&mut self) {
        self.head.clear();
        self.tail.clear();
    }

    /// Pass everything held on, flush, and return the inner writer.
    fn finish(mut self) -> std::io::Result<W> {
        let head = std::mem::take(&mut self.head);
        self.hold = 0;
        self.keep = 0;
        self.pass(&head)?;
        let tail = std::mem::take(&mut self.tail);
        self.inner.write_all(&tail)?;
        self.inner.flush()?;
        Ok(self.inner)
    }
}

impl<W: Write> Write for Held<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.hold_or_pass(buf)?;
        self.accepted = self.accepted.saturating_add(n as u64);
        Ok(n)
    }

    /// Flushes the inner writer; what is held stays held.
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl<W: Write> Held<W> {
    fn hold_or_pass(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.hold > 0 {
            if self.head.len().saturating_add(buf.len()) <= self.hold {
                self.head.extend_from_slice(buf);
                return Ok(buf.len());
            }
            self.hold = 0;
            let head = std::mem::take(&mut self.head);
            self.pass(&head)?;
        }
        self.pass(buf)?;
        Ok(buf.len())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::Held;

    #[test]
    fn held_output_passes_on_only_past_the_hold_and_withholds_the_tail() {
        let mut h = Held::new(Vec::new(), 8, 2);
        h.write_all(b"abcd").unwrap();
        assert_eq!((h.written, h.inner.len()), (0, 0));
        h.discard();
        h.write_all(b"efgh").unwrap();
        h.flush().unwrap();
        assert_eq!(h.written, 0, "flush does not release");
        h.write_all(b"ijklm").unwrap();
        assert_eq!(h.inner, b"efghijk", "the last 2 bytes withheld");
        assert_eq!(h.written, 7);
        h.write_all(b"n").unwrap();
        assert_eq!(h.inner, b"efghijkl", "holds no more head once released");
        h.write_all(b"opqrst").unwrap();
        assert_eq!(h.inner, b"efghijklmnopqr");
        assert_eq!(h.finish().unwrap(), b"efghijklmnopqrst");
        let mut h = Held::new(Vec::new(), 8, 10);
        h.write_all(b"xy").unwrap();
        assert_eq!(h.finish().unwrap(), b"xy");
        let mut h = Held::new(Vec::new(), 0, 0);
        h.write_all(b"xy").unwrap();
        assert_eq!((h.inner.as_slice(), h.written), (&b"xy"[..], 2));
    }
}
