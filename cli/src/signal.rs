//! SIGINT and SIGTERM: remove what would be left half-written, then exit
//! with 128 + the signal number (130 for Ctrl-C; see `exit.rs`).
//!
//! A watcher thread (signal-hook's self-pipe iterator, so nothing runs in
//! signal context) waits for either signal. Files being written under a
//! temporary name ([`OutputFile`]) register that name here; the watcher
//! removes each one before exiting. The rename that makes a finished file
//! visible takes the same lock, so an interrupt either removes the temporary
//! file or comes after the finished file is in place, never between.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use anyhow::Context;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// Temporary files to remove on a signal.
static PENDING: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn pending() -> MutexGuard<'static, Vec<PathBuf>> {
    PENDING.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What an interruption now leaves behind, said on stderr when it comes
/// (the last one registered).
static LEFT: Mutex<Option<String>> = Mutex::new(None);

/// Say `msg` if SIGINT or SIGTERM ends the process from now on (`None`:
/// nothing to say any more).
pub fn on_interrupt_say(msg: Option<String>) {
    *LEFT.lock().unwrap_or_else(PoisonError::into_inner) = msg;
}

/// What SIGINT and SIGTERM do instead of ending the process.
type Instead = Box<dyn FnMut() + Send>;

/// Set by a command that ends itself on a signal (`backup mount`
/// unmounts, then returns as it does when unmounted from outside).
static INSTEAD: Mutex<Option<Instead>> = Mutex::new(None);

/// Call `f` on SIGINT or SIGTERM, each time one comes, instead of exiting
/// (`None`: exit again).
pub fn on_interrupt_call(f: Option<Instead>) {
    *INSTEAD.lock().unwrap_or_else(PoisonError::into_inner) = f;
}

/// Start the watcher thread. If the signals cannot be caught, they keep
/// their default action (the process dies; a temporary file may be left
/// beside the target, never a partial target).
pub fn install() {
    let Ok(mut signals) = Signals::new([SIGINT, SIGTERM]) else {
        return;
    };
    let spawned = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if let Some(f) = INSTEAD
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .as_mut()
                {
                    f();
                    continue;
                }
                let files = pending();
                for f in files.iter() {
                    let _ = std::fs::remove_file(f);
                }
                if let Some(m) = LEFT.lock().unwrap_or_else(PoisonError::into_inner).take() {
                    eprintln!("btrsend: interrupted: {}", crate::text::printable(&m));
                }
                let code = u8::try_from(sig.saturating_add(128)).unwrap_or(u8::MAX);
                // Keep the lock: no rename can start after the removal.
                std::process::exit(i32::from(code));
            }
        });
    drop(spawned);
}

/// An output file written under a temporary name in the same directory and
/// renamed onto its final name by [`OutputFile::commit`]. Dropped without
/// commit (an error, a panic), or on SIGINT/SIGTERM, the temporary file is
/// removed: the final name never holds a partial file, and a file that was
/// there before stays as it was until the new one is complete.
///
/// A target that exists and is not a regular file (`/dev/null`, a FIFO, a
/// terminal) is written directly: there is nothing to rename over.
#[derive(Debug)]
pub struct OutputFile {
    /// `None` only after [`OutputFile::commit`] took it.
    inner: Option<Inner>,
}

#[derive(Debug)]
enum Inner {
    Temp {
        file: tempfile::NamedTempFile,
        target: PathBuf,
    },
    Direct(File),
}

impl OutputFile {
    /// Create the temporary file beside `target` (or open a non-regular
    /// target directly). The temporary file is `.NAME.XXXXXX.part`, mode
    /// 0600 (as `btrfs send -f` creates its file).
    ///
    /// # Errors
    ///
    /// The directory cannot be written, or the target cannot be opened.
    pub fn create(target: &Path) -> anyhow::Result<OutputFile> {
        if let Ok(meta) = std::fs::metadata(target)
            && !meta.is_file()
        {
            if meta.is_dir() {
                anyhow::bail!("cannot write {}: it is a directory", target.display());
            }
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(target)
                .with_context(|| format!("cannot open {}", target.display()))?;
            return Ok(OutputFile {
                inner: Some(Inner::Direct(f)),
            });
        }
        // Write beside the file a symlink points to, so the rename replaces
        // that file and the link stays.
        let target = match std::fs::canonicalize(target) {
            Ok(real) => real,
            Err(_) => target.to_path_buf(),
        };
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut list = pending();
        let file = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".part")
            .tempfile_in(&dir)
            .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
        list.push(file.path().to_path_buf());
        Ok(OutputFile {
            inner: Some(Inner::Temp { file, target }),
        })
    }

    /// Make the finished file visible under its name (flushed first).
    ///
    /// # Errors
    ///
    /// Flushing or renaming failed (the temporary file is then removed).
    pub fn commit(mut self) -> anyhow::Result<()> {
        match self.inner.take() {
            None => Ok(()),
            Some(Inner::Direct(mut f)) => f.flush().context("cannot write the output"),
            Some(Inner::Temp { mut file, target }) => {
                file.as_file_mut()
                    .flush()
                    .with_context(|| format!("cannot write {}", target.display()))?;
                let mut list = pending();
                let temp = file.path().to_path_buf();
                list.retain(|p| p != &temp);
                file.persist(&target)
                    .map_err(|e| e.error)
                    .with_context(|| {
                        format!("cannot rename {} to {}", temp.display(), target.display())
                    })?;
                Ok(())
            }
        }
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        if let Some(Inner::Temp { file, .. }) = &self.inner {
            // Remove, then forget, under the lock: a signal meanwhile finds
            // the file still listed or already gone. (NamedTempFile's own
            // drop then finds nothing to remove.)
            let mut list = pending();
            let temp = file.path().to_path_buf();
            let _ = std::fs::remove_file(&temp);
            list.retain(|p| p != &temp);
        }
    }
}

impl Write for OutputFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.inner {
            // The File itself: NamedTempFile's own Write appends the
            // temporary name to every error ("… at path …").
            Some(Inner::Temp { file, .. }) => file.as_file_mut().write(buf),
            Some(Inner::Direct(f)) => f.write(buf),
            None => Err(io::Error::other("output already committed")),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.inner {
            Some(Inner::Temp { file, .. }) => file.as_file_mut().flush(),
            Some(Inner::Direct(f)) => f.flush(),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_renames_and_drop_removes() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out.stream");
        std::fs::write(&target, b"old").unwrap();
        let mut f = OutputFile::create(&target).unwrap();
        f.write_all(b"partial").unwrap();
        drop(f);
        assert_eq!(std::fs::read(&target).unwrap(), b"old", "old file kept");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "temp removed"
        );
        let mut f = OutputFile::create(&target).unwrap();
        f.write_all(b"new").unwrap();
        f.commit().unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        assert!(pending().is_empty());
    }

    #[test]
    fn non_regular_targets_are_written_directly() {
        let mut f = OutputFile::create(Path::new("/dev/null")).unwrap();
        f.write_all(b"x").unwrap();
        f.commit().unwrap();
        assert!(Path::new("/dev/null").exists());
    }
}
