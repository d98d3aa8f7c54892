//! A scratch btrfs on a loop device, and the stock `btrfs receive` run into
//! it.
//!
//! Every [`LiveBtrfs`] has its own temporary directory (sparse image file and
//! mount point) and its own loop device, so tests may run in parallel
//! threads. Dropping it always cleans up, also while a failing test unwinds:
//! `umount` (falling back to `umount -l`), detach every loop device still
//! backing the image (`losetup -j`), remove the directory.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use super::HarnessError;
use crate::manifest::{self, Options};

type Result<T, E = HarnessError> = std::result::Result<T, E>;

/// Default size of the sparse image: plenty for every fixture, costs only
/// what is written.
const DEFAULT_SIZE: u64 = 4 << 30;

/// A freshly made, loop-mounted btrfs (see the module doc).
#[derive(Debug)]
pub struct LiveBtrfs {
    image: PathBuf,
    mnt: PathBuf,
    mounted: bool,
    /// The `-o` options of the mount (for [`remount`](Self::remount)).
    opts: String,
    // Declared last: dropped (removed) after `Drop::drop` has unmounted.
    dir: tempfile::TempDir,
}

/// Say loudly when the host's disk under the temporary directory has less
/// room than this image may take: a sparse image that cannot grow turns into
/// I/O errors and a read-only filesystem inside the test, far from the cause.
fn warn_if_disk_is_short(dir: &Path, size: u64) {
    let Ok(st) = rustix::fs::statvfs(dir) else {
        return;
    };
    let free = st.f_bavail.saturating_mul(st.f_frsize);
    if free < size.saturating_add(1 << 30) {
        eprintln!(
            "\n*** disk nearly full: {} MiB free under {}, and this scratch btrfs may grow \
             to {} MiB; I/O errors or a read-only filesystem in this test come from that ***\n",
            free >> 20,
            dir.display(),
            size >> 20
        );
    }
}

impl LiveBtrfs {
    /// `mkfs.btrfs -q` defaults on a 4 GiB sparse image, mounted with `-o loop`.
    ///
    /// # Errors
    ///
    /// mkfs or mount failed (what is already set up is cleaned up).
    pub fn new() -> Result<Self> {
        Self::with_options(DEFAULT_SIZE, &[], "")
    }

    /// Like [`new`](Self::new) with an image of `size` bytes, extra
    /// `mkfs.btrfs` arguments (e.g. `["-O", "^no-holes"]`) and extra mount
    /// options (comma-separated, e.g. `"compress=zstd"`; empty for none).
    ///
    /// # Errors
    ///
    /// mkfs or mount failed (what is already set up is cleaned up).
    pub fn with_options(size: u64, mkfs_args: &[&str], mount_opts: &str) -> Result<Self> {
        let dir = super::temp_dir("btrsend-live.")?;
        warn_if_disk_is_short(dir.path(), size);
        let image = dir.path().join("fs.img");
        let mnt = dir.path().join("mnt");
        let mut fs = LiveBtrfs {
            image,
            mnt,
            mounted: false,
            opts: String::new(),
            dir,
        };
        File::create(&fs.image)
            .and_then(|f| f.set_len(size))
            .map_err(io_err("create", &fs.image))?;
        fs::create_dir(&fs.mnt).map_err(io_err("mkdir", &fs.mnt))?;
        run(Command::new("mkfs.btrfs")
            .arg("-q")
            .args(mkfs_args)
            .arg(&fs.image))?;
        let mut opts = "loop".to_owned();
        if !mount_opts.is_empty() {
            opts.push(',');
            opts.push_str(mount_opts);
        }
        fs.opts = opts;
        fs.mount()?;
        Ok(fs)
    }

    fn mount(&mut self) -> Result<()> {
        run(Command::new("mount")
            .arg("-o")
            .arg(&self.opts)
            .arg(&self.image)
            .arg(&self.mnt))?;
        self.mounted = true;
        Ok(())
    }

    /// Unmount and mount again (same options): the kernel forgets its
    /// in-memory state of every tree, e.g. the next free inode number of a
    /// subvolume, which is then recomputed from the highest inode on disk
    /// (so freed numbers get reused).
    ///
    /// # Errors
    ///
    /// umount or mount failed.
    pub fn remount(&mut self) -> Result<()> {
        // Something else may hold the filesystem for a moment (a run of
        // the suite once found it busy right after the workload's last
        // write): a busy unmount is tried again for a second before it
        // fails.
        let mut tries = 0;
        loop {
            match run(Command::new("umount").arg(&self.mnt)) {
                Ok(_) => break,
                Err(HarnessError::Command { stderr, .. })
                    if stderr.contains("busy") && tries < 20 =>
                {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(e) => return Err(e),
            }
        }
        self.mounted = false;
        self.mount()
    }

    /// The image file (the filesystem's only device, readable while
    /// mounted: what btrsend reads after a `sync`).
    pub fn image(&self) -> &Path {
        &self.image
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.mnt
    }

    /// The temporary directory holding the image and the mount point; tests
    /// may put their own scratch files there (removed on drop).
    pub fn scratch_dir(&self) -> &Path {
        self.dir.path()
    }

    /// The loop device(s) backing the image, from `losetup -j`.
    ///
    /// # Errors
    ///
    /// losetup failed.
    pub fn loop_devices(&self) -> Result<Vec<PathBuf>> {
        loop_devices_of(&self.image)
    }

    /// Run `btrfs receive` for `stream` into `dest` (relative to the mount
    /// point; created if missing), with `extra_args` before the destination
    /// (e.g. `["-E", "0"]`). A `.zst` stream is decompressed into the
    /// receiver's standard input; others are passed with `-f`.
    ///
    /// Returns the output whatever the exit status: for tests that expect
    /// the receiver to reject a stream. See [`receive`](Self::receive).
    ///
    /// # Errors
    ///
    /// The receiver could not be started, or the stream not read.
    pub fn receive_output(&self, dest: &str, stream: &Path, extra_args: &[&str]) -> Result<Output> {
        let dest = self.mnt.join(dest);
        fs::create_dir_all(&dest).map_err(io_err("mkdir", &dest))?;
        let mut cmd = Command::new("btrfs");
        cmd.arg("receive").args(extra_args);
        let compressed = stream.extension().is_some_and(|e| e == "zst");
        if !compressed {
            cmd.arg("-f").arg(stream);
        }
        cmd.arg(&dest);
        let shown = show(&cmd);
        // Open (and check) a compressed stream before starting the receiver.
        let reader = compressed.then(|| open_stream(stream)).transpose()?;
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd.stdin(if compressed {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        let mut child = cmd.spawn().map_err(|source| HarnessError::Spawn {
            cmd: shown.clone(),
            source,
        })?;
        let feeder = child
            .stdin
            .take()
            .zip(reader)
            .map(|(mut stdin, mut reader)| {
                std::thread::spawn(move || -> Result<(), io::Error> {
                    match io::copy(&mut reader, &mut stdin) {
                        // The receiver stopped reading (it failed, or stops at
                        // END): its exit status tells.
                        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
                        Err(e) => Err(e),
                        Ok(_) => stdin.flush(),
                    }
                })
            });
        let out = child
            .wait_with_output()
            .map_err(|source| HarnessError::Spawn {
                cmd: shown.clone(),
                source,
            })?;
        if let Some(feeder) = feeder {
            // OK to unwrap: the feeder does not panic (io::copy does not).
            feeder
                .join()
                .expect("stream feeder thread panicked")
                .map_err(io_err("decompress", stream))?;
        }
        Ok(out)
    }

    /// Run `btrfs receive` for each stream in order into `dest` (relative to
    /// the mount point) and require success.
    ///
    /// # Errors
    ///
    /// The first stream the receiver rejected, with its stderr.
    pub fn receive(&self, dest: &str, streams: &[&Path]) -> Result<()> {
        for stream in streams {
            let out = self.receive_output(dest, stream, &[])?;
            if !out.status.success() {
                return Err(HarnessError::Command {
                    cmd: format!(
                        "btrfs receive {} into {}",
                        stream.display(),
                        self.mnt.join(dest).display()
                    ),
                    status: out.status,
                    stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
                });
            }
        }
        Ok(())
    }

    /// The manifest of `rel` (relative to the mount point, e.g. the name of a
    /// received subvolume).
    ///
    /// # Errors
    ///
    /// See [`manifest::manifest`].
    pub fn manifest(&self, rel: &str, opts: Options) -> Result<String> {
        Ok(manifest::manifest(&self.mnt.join(rel), opts)?)
    }

    fn cleanup(&mut self) {
        if self.mounted {
            let clean = Command::new("umount")
                .arg(&self.mnt)
                .stderr(Stdio::piped())
                .output();
            match clean {
                Ok(o) if o.status.success() => {}
                other => {
                    eprintln!(
                        "btrsend testing: umount {} failed ({:?}); lazy unmount",
                        self.mnt.display(),
                        other.map(|o| String::from_utf8_lossy(&o.stderr).trim().to_owned())
                    );
                    let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
                }
            }
            self.mounted = false;
        }
        // `mount -o loop` sets autoclear, so the device is normally gone;
        // detach whatever is left (a lazy unmount, a failed mount).
        match loop_devices_of(&self.image) {
            Ok(devs) => {
                for dev in devs {
                    let _ = Command::new("losetup").arg("-d").arg(&dev).status();
                }
            }
            Err(e) => eprintln!("btrsend testing: {e}"),
        }
    }
}

impl Drop for LiveBtrfs {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// Open a send stream, decompressing it if its name ends in `.zst`.
///
/// # Errors
///
/// The file cannot be opened or is not zstd.
pub fn open_stream(path: &Path) -> Result<Box<dyn Read + Send>> {
    let file = File::open(path).map_err(io_err("open", path))?;
    if path.extension().is_some_and(|e| e == "zst") {
        let mut dec = zstd::stream::read::Decoder::new(file).map_err(io_err("zstd", path))?;
        // The fixture generator compresses with --long=27; allow any window.
        dec.window_log_max(31).map_err(io_err("zstd", path))?;
        Ok(Box::new(dec))
    } else {
        Ok(Box::new(io::BufReader::new(file)))
    }
}

fn loop_devices_of(image: &Path) -> Result<Vec<PathBuf>> {
    let out = run(Command::new("losetup").arg("-j").arg(image))?;
    // Lines look like `/dev/loop3: [2049]:1234 (/tmp/…/fs.img)`.
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(':').map(|(dev, _)| PathBuf::from(dev)))
        .collect())
}

/// Run a command, capturing its output; a non-zero exit is an error with
/// its stderr.
///
/// # Errors
///
/// The command could not be started or failed.
pub fn run(cmd: &mut Command) -> Result<Output> {
    let shown = show(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| HarnessError::Spawn {
            cmd: shown.clone(),
            source,
        })?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(HarnessError::Command {
            cmd: shown,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> HarnessError + 'a {
    move |source| HarnessError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}
