//! Repository locks: exclusive for `run`, `import` and `forget`, shared for
//! `verify --read-data` and `restore` (readers of one catalog generation,
//! `list`, `verify` and `forget --dry-run`, take none).
//!
//! * A local directory: `flock(2)` on the file `lock` in the repository.
//!   The kernel drops the lock of a process that dies, so a lock is never
//!   stale. The exclusive holder writes `PID HOST TIME` over the start of
//!   the file, for the "lock held" message. The file is opened without
//!   following a symlink and used only when it is a regular file with one
//!   link, owned by this user or the repository's owner; it is never cut,
//!   so a repository someone else can write cannot turn the lock into a
//!   write to a file elsewhere.
//! * S3: lock objects `locks/KIND-HOST-PID-RANDOM.json` (`{"kind",
//!   "host", "pid", "time"}`), written with put-if-absent and re-written
//!   every [`REFRESH`] while held. A lock conflicts with every other
//!   exclusive lock, and an exclusive one with every lock. A lock object is
//!   stale, and removed with a notice, when its process is gone (same host,
//!   no such PID) or it was last refreshed more than [`STALE_AFTER`] ago.
//!   Two processes that take conflicting locks at the same moment both
//!   see the other and both back off (and retry while `--retry-lock`
//!   allows).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::BackupError;
use super::store::{HeldLock, HoldError, Store, random_u64};

/// Shared or exclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LockKind {
    /// Readers of stream files: `verify --read-data`, `restore`.
    Shared,
    /// Writers: `run`, `forget`.
    Exclusive,
}

/// How often a lock object is re-written.
pub const REFRESH: Duration = Duration::from_secs(5 * 60);
/// A lock object older than this is stale.
pub const STALE_AFTER: Duration = Duration::from_secs(15 * 60);
/// The local lock file.
pub const LOCK_FILE: &str = "lock";
/// Where lock objects live.
pub const LOCK_DIR: &str = "locks/";

/// A held lock; dropping it releases it.
#[derive(Debug)]
pub struct RepoLock {
    _file: Option<File>,
    _object: Option<ObjectLock>,
    _held: Option<Box<dyn HeldLock>>,
}

#[derive(Debug)]
struct ObjectLock {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for ObjectLock {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The content of a lock object.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct LockInfo {
    kind: LockKind,
    host: String,
    pid: u32,
    /// Seconds since the epoch of the last refresh.
    time: i64,
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| String::from("unknown"))
}

fn now_secs() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// Take the repository's lock, waiting up to `wait`; `notice` hears about
/// stale locks taken over.
///
/// # Errors
///
/// [`BackupError::LockHeld`] when it is still held after `wait`; store
/// errors.
pub fn lock(
    store: &Arc<dyn Store>,
    kind: LockKind,
    wait: Duration,
    notice: &mut dyn FnMut(&str),
) -> Result<RepoLock, BackupError> {
    if let Some(held) = store.hold_lock(kind == LockKind::Exclusive, wait) {
        return match held {
            Ok(held) => Ok(RepoLock {
                _file: None,
                _object: None,
                _held: Some(held),
            }),
            Err(HoldError::Held(holder)) => Err(BackupError::LockHeld {
                repo: store.name().to_owned(),
                holder,
            }),
            Err(HoldError::Store(error)) => Err(error.into()),
        };
    }
    match store.local() {
        Some(local) => lock_file(local, kind, wait),
        None => lock_object(store, kind, wait, notice),
    }
}

/// How many bytes of the lock file the holder's line fills (padded with
/// spaces): the file is overwritten in place, never cut, so a lock file
/// that is not btrsend's loses at most these bytes, and only after the
/// checks of [`LocalStore::open_lock`].
const HOLDER_BYTES: usize = 128;

/// The lock of the directory `store`: `flock` on its lock file (also
/// what `btrsend serve` takes for a client).
pub(crate) fn lock_file(
    store: &super::store::LocalStore,
    kind: LockKind,
    wait: Duration,
) -> Result<RepoLock, BackupError> {
    let repo = store.name();
    let path = store.root().join(LOCK_FILE);
    let io_err = |e: std::io::Error| BackupError::Io {
        what: format!("cannot use the lock file {}", path.display()),
        error: e,
    };
    let file = match store.open_lock(LOCK_FILE, true) {
        Ok(f) => f,
        // A read-only repository can still be read under a shared lock.
        Err(e)
            if kind == LockKind::Shared
                && matches!(
                    e.kind(),
                    std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
                ) =>
        {
            store.open_lock(LOCK_FILE, false).map_err(io_err)?
        }
        Err(e) => return Err(io_err(e)),
    };
    let deadline = Instant::now() + wait;
    loop {
        let res = match kind {
            LockKind::Shared => file.try_lock_shared(),
            LockKind::Exclusive => file.try_lock(),
        };
        match res {
            Ok(()) => break,
            Err(std::fs::TryLockError::WouldBlock) => {
                if Instant::now() >= deadline {
                    let mut buf = [0u8; HOLDER_BYTES];
                    let n = file.read_at(&mut buf, 0).unwrap_or(0);
                    let holder = String::from_utf8_lossy(&buf[..n]);
                    let holder: String = holder
                        .trim()
                        .chars()
                        .map(|c| if c.is_control() { '?' } else { c })
                        .collect();
                    return Err(BackupError::LockHeld {
                        repo: repo.to_owned(),
                        holder: if holder.is_empty() {
                            String::from("readers (a list, verify or restore)")
                        } else {
                            format!("process {holder} (or readers after it)")
                        },
                    });
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io_err(e)),
        }
    }
    if kind == LockKind::Exclusive {
        let line = format!(
            "{} on {} since {}",
            std::process::id(),
            hostname(),
            jiff::Timestamp::now()
        );
        let mut rec = [b' '; HOLDER_BYTES];
        let n = line.len().min(HOLDER_BYTES - 1);
        rec[..n].copy_from_slice(&line.as_bytes()[..n]);
        rec[HOLDER_BYTES - 1] = b'\n';
        let _ = file.write_all_at(&rec, 0);
    }
    Ok(RepoLock {
        _file: Some(file),
        _object: None,
        _held: None,
    })
}

/// A new lock object's key: `locks/KIND-HOST-PID-RANDOM.json`.
fn object_key(info: &LockInfo) -> String {
    let kind = match info.kind {
        LockKind::Shared => "shared",
        LockKind::Exclusive => "exclusive",
    };
    // The host name goes into a key: only the characters a key may hold.
    let host: String = info
        .host
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!(
        "{LOCK_DIR}{kind}-{host}-{}-{:016x}.json",
        info.pid,
        random_u64()
    )
}

/// Whether a lock object is stale.
fn stale(info: &LockInfo, host: &str) -> bool {
    let age = now_secs().saturating_sub(info.time);
    if age > i64::try_from(STALE_AFTER.as_secs()).unwrap_or(i64::MAX) {
        return true;
    }
    info.host == host && !std::path::Path::new(&format!("/proc/{}", info.pid)).exists()
}

fn lock_object(
    store: &Arc<dyn Store>,
    kind: LockKind,
    wait: Duration,
    notice: &mut dyn FnMut(&str),
) -> Result<RepoLock, BackupError> {
    let host = hostname();
    let pid = std::process::id();
    let deadline = Instant::now() + wait;
    loop {
        let info = LockInfo {
            kind,
            host: host.clone(),
            pid,
            time: now_secs(),
        };
        let key = object_key(&info);
        let body = serde_json::to_vec(&info).unwrap_or_default();
        store.put_if_absent(&key, &body)?;
        let mut holder = None;
        for o in store.list(LOCK_DIR)? {
            if o.key == key {
                continue;
            }
            let other: Option<LockInfo> = store
                .get(&o.key, None)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
            let Some(other) = other else {
                // Gone meanwhile, or unreadable: a damaged lock object is
                // stale.
                if store.get(&o.key, None).is_ok() {
                    notice(&format!("removing unreadable lock object {}", o.key));
                    store.delete(&o.key)?;
                }
                continue;
            };
            if stale(&other, &host) {
                notice(&format!(
                    "taking over the stale {} lock of process {} on {} ({})",
                    match other.kind {
                        LockKind::Shared => "shared",
                        LockKind::Exclusive => "exclusive",
                    },
                    other.pid,
                    other.host,
                    o.key
                ));
                store.delete(&o.key)?;
                continue;
            }
            if kind == LockKind::Exclusive || other.kind == LockKind::Exclusive {
                holder = Some(format!(
                    "process {} on {} ({})",
                    other.pid, other.host, o.key
                ));
                break;
            }
        }
        let Some(holder) = holder else {
            return Ok(RepoLock {
                _file: None,
                _object: Some(refresher(Arc::clone(store), key, info)),
                _held: None,
            });
        };
        store.delete(&key)?;
        if Instant::now() >= deadline {
            return Err(BackupError::LockHeld {
                repo: store.name().to_owned(),
                holder,
            });
        }
        // Back off a random while, so two contenders do not meet again.
        let ms = 200 + random_u64() % 800;
        std::thread::sleep(Duration::from_millis(ms));
    }
}

/// A thread that re-writes the lock object every [`REFRESH`] and removes
/// it at the end.
fn refresher(store: Arc<dyn Store>, mut key: String, mut info: LockInfo) -> ObjectLock {
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let thread = std::thread::Builder::new()
        .name(String::from("btrsend-lock"))
        .spawn(move || {
            let mut last = Instant::now();
            while !stop2.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(100));
                if last.elapsed() >= REFRESH {
                    info.time = now_secs();
                    let body = serde_json::to_vec(&info).unwrap_or_default();
                    // Replace (the store has no overwrite): a new lock
                    // object first, then the old one goes, so that a
                    // contender listing the locks meanwhile always sees
                    // one of ours.
                    let fresh = object_key(&info);
                    if store.put_if_absent(&fresh, &body).is_ok() {
                        let _ = store.delete(&key);
                        key = fresh;
                    }
                    last = Instant::now();
                }
            }
            let _ = store.delete(&key);
        })
        .ok();
    ObjectLock { stop, thread }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::store::LocalStore;

    #[test]
    fn flock_exclusive_and_shared() {
        let dir = tempfile::tempdir().unwrap();
        let s: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()));
        let mut n = |_: &str| {};
        let a = lock(&s, LockKind::Shared, Duration::ZERO, &mut n).unwrap();
        let b = lock(&s, LockKind::Shared, Duration::ZERO, &mut n).unwrap();
        let e = lock(&s, LockKind::Exclusive, Duration::ZERO, &mut n).unwrap_err();
        assert!(matches!(e, BackupError::LockHeld { .. }), "{e}");
        drop((a, b));
        let x = lock(&s, LockKind::Exclusive, Duration::ZERO, &mut n).unwrap();
        let e = lock(&s, LockKind::Shared, Duration::from_millis(250), &mut n).unwrap_err();
        assert!(
            e.to_string()
                .contains(&format!("process {}", std::process::id())),
            "{e}"
        );
        drop(x);
        lock(&s, LockKind::Shared, Duration::ZERO, &mut n).unwrap();
    }

    #[test]
    fn lock_objects_conflict_and_stale_ones_are_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let s: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()));
        let mut notes = Vec::new();
        let mut n = |m: &str| notes.push(m.to_owned());
        let a = lock_object(&s, LockKind::Shared, Duration::ZERO, &mut n).unwrap();
        let b = lock_object(&s, LockKind::Shared, Duration::ZERO, &mut n).unwrap();
        let e = lock_object(&s, LockKind::Exclusive, Duration::ZERO, &mut n).unwrap_err();
        assert!(matches!(e, BackupError::LockHeld { .. }), "{e}");
        assert_eq!(
            s.list(LOCK_DIR).unwrap().len(),
            2,
            "the loser removed its object"
        );
        drop((a, b));
        assert!(s.list(LOCK_DIR).unwrap().is_empty());
        // A dead process's lock (same host, no such pid) and an old one.
        let dead = LockInfo {
            kind: LockKind::Exclusive,
            host: hostname(),
            pid: u32::MAX - 1,
            time: now_secs(),
        };
        s.put_if_absent(
            "locks/exclusive-dead.json",
            &serde_json::to_vec(&dead).unwrap(),
        )
        .unwrap();
        let old = LockInfo {
            kind: LockKind::Exclusive,
            host: String::from("elsewhere"),
            pid: 1,
            time: now_secs() - 3600,
        };
        s.put_if_absent(
            "locks/exclusive-old.json",
            &serde_json::to_vec(&old).unwrap(),
        )
        .unwrap();
        let live = LockInfo {
            kind: LockKind::Exclusive,
            host: String::from("elsewhere"),
            pid: 1,
            time: now_secs(),
        };
        let x = lock_object(&s, LockKind::Exclusive, Duration::ZERO, &mut n).unwrap();
        drop(x);
        s.put_if_absent(
            "locks/exclusive-live.json",
            &serde_json::to_vec(&live).unwrap(),
        )
        .unwrap();
        let e = lock_object(&s, LockKind::Shared, Duration::ZERO, &mut n).unwrap_err();
        assert!(e.to_string().contains("process 1 on elsewhere"), "{e}");
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(
            notes
                .iter()
                .any(|m| m.contains(&format!("process {}", u32::MAX - 1)))
        );
        assert!(notes.iter().any(|m| m.contains("exclusive-old")));
    }
}
