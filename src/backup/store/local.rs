//! [`LocalStore`]: a repository in a local directory, reached only through
//! descriptors of its directories (`openat` with `O_NOFOLLOW`), so that
//! nothing in a repository someone else can write leads outside it.
//!
//! It implements [`Store`] and nothing more: it knows keys and bytes, not
//! catalogs or stream files.

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{self as rfs, Mode, OFlags};

use super::{
    DIR_MODE, FILE_MODE, ObjectInfo, Store, StoreError, TMP_DIR, Upload, check_key, check_name,
    quoted, random_u64,
};

/// A repository in a local directory.
///
/// Every object is reached through a descriptor of the repository's
/// directory: each key is checked ([`check_key`]), and each of its at most
/// two components is opened relative to the directory before it with
/// `O_NOFOLLOW`, so no symlink, `..` or absolute name in a repository that
/// someone else can write leads outside it. Objects are read only when
/// they are regular files (a FIFO or device is refused, never waited on),
/// and written only when this process made them or they are regular files
/// with one link (never through a hard link to a file elsewhere).
/// Directories are made with mode 0700 and files with 0600, whatever the
/// umask: a stored stream holds every file of a snapshot.
#[derive(Debug)]
pub struct LocalStore {
    root: PathBuf,
    name: String,
}

/// The directory and name of a checked key.
fn split_key(key: &str) -> (&str, &str) {
    match key.split_once('/') {
        Some((d, n)) => (d, n),
        None => ("", key),
    }
}

impl LocalStore {
    /// The store rooted at `root` (which need not exist yet).
    pub fn new(root: &Path) -> LocalStore {
        LocalStore {
            root: root.to_path_buf(),
            name: root.display().to_string(),
        }
    }

    /// The repository's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn location(&self, key: &str) -> String {
        format!("{}/{key}", self.name.trim_end_matches('/'))
    }

    fn err(&self, op: &'static str, key: &str, e: io::Error) -> StoreError {
        if e.kind() == io::ErrorKind::NotFound {
            if !self.root.is_dir() {
                return StoreError::Unreachable {
                    location: self.name.clone(),
                    error: Box::new(io::Error::new(io::ErrorKind::NotFound, "no such directory")),
                };
            }
            return StoreError::NotFound {
                location: self.location(key),
            };
        }
        // ELOOP from O_NOFOLLOW: a symlink where an object or directory
        // belongs.
        // ENOTDIR from O_DIRECTORY | O_NOFOLLOW: the same where a
        // directory belongs.
        let e = match e.raw_os_error() {
            Some(n) if n == rustix::io::Errno::LOOP.raw_os_error() => {
                io::Error::other("a symbolic link, which btrsend never follows in a repository")
            }
            Some(n) if n == rustix::io::Errno::NOTDIR.raw_os_error() => io::Error::other(
                "not a directory where the repository has one (a symbolic link is never followed)",
            ),
            _ => e,
        };
        StoreError::Other {
            op,
            location: self.location(key),
            error: Box::new(e),
        }
    }

    fn bad_key(&self, why: String) -> StoreError {
        StoreError::Other {
            op: "check",
            location: self.name.clone(),
            error: why.into(),
        }
    }

    /// The checked key split into directory and name.
    fn checked<'k>(&self, key: &'k str) -> Result<(&'k str, &'k str), StoreError> {
        check_key(key).map_err(|why| self.bad_key(why))?;
        Ok(split_key(key))
    }

    /// The repository's directory, opened (following a symlink there: the
    /// user named it).
    fn open_root(&self) -> io::Result<OwnedFd> {
        Ok(rfs::open(
            &self.root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?)
    }

    /// The directory `dir` of the repository ("" for the root itself),
    /// made (mode 0700) when `create` and missing.
    fn open_dir(&self, dir: &str, create: bool) -> io::Result<OwnedFd> {
        let root = self.open_root()?;
        if dir.is_empty() {
            return Ok(root);
        }
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        match rfs::openat(&root, dir, flags, Mode::empty()) {
            Ok(fd) => Ok(fd),
            Err(rustix::io::Errno::NOENT) if create => {
                match rfs::mkdirat(&root, dir, Mode::from_raw_mode(DIR_MODE)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                let fd = rfs::openat(&root, dir, flags, Mode::empty())?;
                rfs::fchmod(&fd, Mode::from_raw_mode(DIR_MODE))?;
                rfs::fsync(&root)?;
                Ok(fd)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Open the object `key` for reading: a regular file, never a symlink,
    /// and never waited on (a FIFO or device is refused).
    fn open_object(&self, key: &str) -> Result<File, StoreError> {
        self.open_existing(key, OFlags::RDONLY, |fd| {
            let st = rfs::fstat(fd)?;
            if rfs::FileType::from_raw_mode(st.st_mode) != rfs::FileType::RegularFile {
                return Err(io::Error::other("not a regular file"));
            }
            Ok(())
        })
    }

    /// Open the existing object `key` for writing: a regular file with one
    /// link (a hard link would let a write reach a file outside).
    fn open_for_write(&self, key: &str) -> Result<File, StoreError> {
        self.open_existing(key, OFlags::RDWR, |fd| check_own_file(fd).map(drop))
    }

    /// Open the existing object `key` with `access`, beneath the
    /// repository and without following a symlink or waiting on a FIFO,
    /// and accept it only when `check` passes.
    fn open_existing(
        &self,
        key: &str,
        access: OFlags,
        check: impl Fn(&OwnedFd) -> io::Result<()>,
    ) -> Result<File, StoreError> {
        let (dir, name) = self.checked(key)?;
        let open = || -> io::Result<File> {
            let d = self.open_dir(dir, false)?;
            let flags = access | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
            let fd = rfs::openat(&d, name, flags, Mode::empty())?;
            check(&fd)?;
            Ok(File::from(fd))
        };
        open().map_err(|e| self.err("open", key, e))
    }

    /// A new temporary file in `tmp/` (made with the directory), and its
    /// name there.
    fn temp_file(&self, key: &str) -> Result<(File, String), StoreError> {
        let dir = self
            .open_dir(TMP_DIR, true)
            .map_err(|e| self.err("create", TMP_DIR, e))?;
        let base = key.rsplit('/').next().unwrap_or(key);
        for _ in 0..16 {
            let name = format!("{base}.{}.{:016x}", std::process::id(), random_u64());
            match rfs::openat(
                &dir,
                name.as_str(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(FILE_MODE),
            ) {
                Ok(fd) => {
                    // The umask may have taken bits away, never added any;
                    // set the mode exactly.
                    rfs::fchmod(&fd, Mode::from_raw_mode(FILE_MODE))
                        .map_err(|e| self.err("create", TMP_DIR, e.into()))?;
                    return Ok((File::from(fd), name));
                }
                Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(self.err("create", TMP_DIR, e.into())),
            }
        }
        Err(self.err(
            "create",
            TMP_DIR,
            io::Error::new(io::ErrorKind::AlreadyExists, "no free temporary name"),
        ))
    }

    /// Flush `file` (`tmp/TMP`), give it the name `key` unless that exists,
    /// and flush the directory: the object is then durable.
    fn publish(&self, file: File, tmp: &str, key: &str) -> Result<bool, StoreError> {
        let (dir, name) = self.checked(key)?;
        file.sync_all().map_err(|e| self.err("sync", key, e))?;
        drop(file);
        let tmp_dir = self
            .open_dir(TMP_DIR, false)
            .map_err(|e| self.err("open", TMP_DIR, e))?;
        let dst = match self.open_dir(dir, true) {
            Ok(d) => d,
            Err(e) => {
                let _ = rfs::unlinkat(&tmp_dir, tmp, rfs::AtFlags::empty());
                return Err(self.err("create", key, e));
            }
        };
        // link() refuses an existing name: put-if-absent.
        let res = rfs::linkat(&tmp_dir, tmp, &dst, name, rfs::AtFlags::empty());
        let _ = rfs::unlinkat(&tmp_dir, tmp, rfs::AtFlags::empty());
        match res {
            Ok(()) => {}
            Err(rustix::io::Errno::EXIST) => return Ok(false),
            Err(e) => return Err(self.err("link", key, e.into())),
        }
        rfs::fsync(&dst).map_err(|e| self.err("sync", key, e.into()))?;
        Ok(true)
    }

    /// The lock file `name` of the repository, opened for `flock`: made
    /// (mode 0600) when missing and `create`; else a regular file with one
    /// link, owned by this user or the repository directory's owner, and
    /// never a symlink. Read-only when `write` is false.
    ///
    /// # Errors
    ///
    /// I/O errors, and a lock file that is none of that.
    pub fn open_lock(&self, name: &str, write: bool) -> io::Result<File> {
        check_name(name).map_err(io::Error::other)?;
        let root = self.open_root()?;
        let base = OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let access = if write { OFlags::RDWR } else { OFlags::RDONLY };
        let fd = match rfs::openat(
            &root,
            name,
            access | base | OFlags::CREATE | OFlags::EXCL,
            Mode::from_raw_mode(FILE_MODE),
        ) {
            Ok(fd) => {
                rfs::fchmod(&fd, Mode::from_raw_mode(FILE_MODE))?;
                fd
            }
            Err(rustix::io::Errno::EXIST) => {
                let fd = rfs::openat(&root, name, access | base, Mode::empty()).map_err(
                    |e| -> io::Error {
                        if e == rustix::io::Errno::LOOP {
                            io::Error::other(
                                "it is a symbolic link, which btrsend never follows in a repository",
                            )
                        } else {
                            e.into()
                        }
                    },
                )?;
                let st = check_own_file(&fd)?;
                let owner = rfs::fstat(&root)?.st_uid;
                let me = rustix::process::geteuid().as_raw();
                if st.st_uid != me && st.st_uid != owner {
                    return Err(io::Error::other(format!(
                        "it belongs to user {}, neither this user ({me}) nor the repository's owner ({owner})",
                        st.st_uid
                    )));
                }
                fd
            }
            Err(rustix::io::Errno::ACCESS | rustix::io::Errno::ROFS) if !write => {
                rfs::openat(&root, name, access | base, Mode::empty())?
            }
            Err(e) => return Err(e.into()),
        };
        Ok(File::from(fd))
    }
}

/// Check that an open object is a regular file with one link (so writing
/// or cutting it touches nothing outside the repository); its status.
fn check_own_file(fd: &OwnedFd) -> io::Result<rfs::Stat> {
    let st = rfs::fstat(fd)?;
    if rfs::FileType::from_raw_mode(st.st_mode) != rfs::FileType::RegularFile {
        return Err(io::Error::other("not a regular file"));
    }
    if st.st_nlink != 1 {
        return Err(io::Error::other(format!(
            "it has {} hard links (a file btrsend writes has one)",
            st.st_nlink
        )));
    }
    Ok(st)
}

/// "the object ends before byte END" for a short read.
fn short_read(e: io::Error, end: u64) -> io::Error {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the object ends before byte {end}"),
        )
    } else {
        e
    }
}

impl Store for LocalStore {
    fn name(&self) -> &str {
        &self.name
    }

    fn get(&self, key: &str, range: Option<Range<u64>>) -> Result<Vec<u8>, StoreError> {
        let mut f = self.open_object(key)?;
        match range {
            None => {
                let mut buf = Vec::new();
                f.read_to_end(&mut buf)
                    .map_err(|e| self.err("read", key, e))?;
                Ok(buf)
            }
            Some(r) => {
                let mut buf = Vec::new();
                self.read_range(&f, key, r, &mut buf)?;
                Ok(buf)
            }
        }
    }

    fn get_into(&self, key: &str, range: Range<u64>, buf: &mut Vec<u8>) -> Result<(), StoreError> {
        let f = self.open_object(key)?;
        self.read_range(&f, key, range, buf)
    }

    fn put_if_absent(&self, key: &str, data: &[u8]) -> Result<bool, StoreError> {
        let (dir, name) = self.checked(key)?;
        // Any entry there, a symlink too, makes the name taken.
        if let Ok(d) = self.open_dir(dir, false)
            && rfs::statat(&d, name, rfs::AtFlags::SYMLINK_NOFOLLOW).is_ok()
        {
            return Ok(false);
        }
        let (mut f, tmp) = self.temp_file(key)?;
        if let Err(e) = f.write_all(data) {
            self.remove_tmp(&tmp);
            return Err(self.err("write", key, e));
        }
        self.publish(f, &tmp, key)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        // Keys are DIR/NAME at most one level deep below the prefix's
        // directory.
        let (dir, name_prefix) = match prefix.rfind('/') {
            Some(i) => (&prefix[..i], &prefix[i + 1..]),
            None => ("", prefix),
        };
        if !dir.is_empty() {
            check_name(dir)
                .map_err(|why| self.bad_key(format!("invalid prefix {}: {why}", quoted(prefix))))?;
        }
        let d = match self.open_dir(dir, false) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound && self.root.is_dir() => {
                return Ok(Vec::new());
            }
            Err(e) => return Err(self.err("list", dir, e)),
        };
        let entries = rfs::Dir::read_from(&d).map_err(|e| self.err("list", dir, e.into()))?;
        let mut out = Vec::new();
        for ent in entries {
            let ent = ent.map_err(|e| self.err("list", dir, e.into()))?;
            // Names that are no key (dot files, odd bytes) are not objects.
            let Some(name) = ent.file_name().to_str().ok().map(str::to_owned) else {
                continue;
            };
            if !name.starts_with(name_prefix) || check_name(&name).is_err() {
                continue;
            }
            let st = match rfs::statat(&d, name.as_str(), rfs::AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                // Removed meanwhile.
                Err(rustix::io::Errno::NOENT) => continue,
                Err(e) => return Err(self.err("stat", &name, e.into())),
            };
            if rfs::FileType::from_raw_mode(st.st_mode) != rfs::FileType::RegularFile {
                continue;
            }
            let key = if dir.is_empty() {
                name
            } else {
                format!("{dir}/{name}")
            };
            out.push(ObjectInfo {
                key,
                size: u64::try_from(st.st_size).unwrap_or(0),
            });
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        let (dir, name) = self.checked(key)?;
        let d = match self.open_dir(dir, false) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(self.err("delete", key, e)),
        };
        match rfs::unlinkat(&d, name, rfs::AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(self.err("delete", key, e.into())),
        }
    }

    fn multipart(&self, key: &str) -> Result<Box<dyn Upload>, StoreError> {
        self.checked(key)?;
        let (file, tmp) = self.temp_file(key)?;
        Ok(Box::new(LocalUpload {
            store: LocalStore::new(&self.root),
            key: key.to_owned(),
            file: Some(io::BufWriter::with_capacity(1 << 20, file)),
            tmp,
            keep: false,
        }))
    }

    fn continue_upload(
        &self,
        tmp: &str,
        keep: u64,
        key: &str,
    ) -> Result<Option<Box<dyn Upload>>, StoreError> {
        self.checked(key)?;
        let (dir, name) = self.checked(tmp)?;
        if dir != TMP_DIR {
            return Err(self.bad_key(format!("{tmp}: not an unfinished upload in {TMP_DIR}/")));
        }
        let mut file = self.open_for_write(tmp)?;
        file.set_len(keep)
            .and_then(|()| file.seek(SeekFrom::Start(keep)))
            .map_err(|e| self.err("truncate", tmp, e))?;
        Ok(Some(Box::new(LocalUpload {
            store: LocalStore::new(&self.root),
            key: key.to_owned(),
            file: Some(io::BufWriter::with_capacity(1 << 20, file)),
            tmp: name.to_owned(),
            keep: false,
        })))
    }

    fn continues_uploads(&self) -> bool {
        true
    }

    fn check_reachable(&self) -> Result<(), StoreError> {
        match fs::metadata(&self.root) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err(StoreError::Unreachable {
                location: self.name.clone(),
                error: Box::new(io::Error::other("not a directory")),
            }),
            Err(e) => Err(StoreError::Unreachable {
                location: self.name.clone(),
                error: Box::new(e),
            }),
        }
    }

    fn local_root(&self) -> Option<&Path> {
        Some(&self.root)
    }

    fn local(&self) -> Option<&LocalStore> {
        Some(self)
    }
}

impl LocalStore {
    /// Read `range` of the open object `key` into `buf`.
    fn read_range(
        &self,
        f: &File,
        key: &str,
        range: Range<u64>,
        buf: &mut Vec<u8>,
    ) -> Result<(), StoreError> {
        use std::os::unix::fs::FileExt;
        let len = range
            .end
            .checked_sub(range.start)
            .and_then(|l| usize::try_from(l).ok())
            .ok_or_else(|| self.err("read", key, io::Error::other("invalid byte range")))?;
        // A reused buffer: only growth is zeroed.
        buf.resize(len, 0);
        f.read_exact_at(buf, range.start)
            .map_err(|e| self.err("read", key, short_read(e, range.end)))
    }

    /// When others than the owner can read the repository: its directory
    /// or one of the directories in it grants group or other access.
    /// Directories btrsend makes are 0700; this is for one made by hand
    /// or before that.
    pub fn readable_by_others(&self) -> Option<String> {
        use std::os::unix::fs::PermissionsExt;
        let mut open = Vec::new();
        let root = fs::metadata(&self.root).ok()?;
        let dirs = ["catalog", "streams", TMP_DIR, "locks"];
        let mode = |m: &fs::Metadata| m.permissions().mode() & 0o777;
        if mode(&root) & 0o077 != 0 {
            open.push(format!("{} (mode {:04o})", self.name, mode(&root)));
        }
        for d in dirs {
            if let Ok(m) = fs::symlink_metadata(self.root.join(d))
                && m.is_dir()
                && mode(&m) & 0o077 != 0
            {
                open.push(format!("{d}/ (mode {:04o})", mode(&m)));
            }
        }
        if open.is_empty() {
            return None;
        }
        Some(format!(
            "others than its owner may read the repository: {}; its streams hold every file of the snapshots (chmod 700 the repository's directory)",
            open.join(", ")
        ))
    }

    /// Remove the temporary file `tmp/NAME` (best effort).
    fn remove_tmp(&self, name: &str) {
        if let Ok(d) = self.open_dir(TMP_DIR, false) {
            let _ = rfs::unlinkat(&d, name, rfs::AtFlags::empty());
        }
    }
}

/// A local upload: a temporary file, linked into place at the end.
struct LocalUpload {
    store: LocalStore,
    key: String,
    file: Option<io::BufWriter<File>>,
    /// Its name in `tmp/`.
    tmp: String,
    /// Leave the temporary file when dropped unfinished.
    keep: bool,
}

impl LocalUpload {
    /// A failed write, naming the file that is really written (the
    /// temporary one) and the byte of it where the write stopped.
    fn write_error(&mut self, e: io::Error) -> StoreError {
        use std::io::Seek;
        let at = self
            .file
            .as_mut()
            .and_then(|f| f.get_mut().stream_position().ok());
        let tmp = self.store.location(&format!("{TMP_DIR}/{}", self.tmp));
        let location = match at {
            Some(at) => format!(
                "{tmp} at byte {at} (the stream file {} being written)",
                self.key
            ),
            None => format!("{tmp} (the stream file {} being written)", self.key),
        };
        StoreError::Other {
            op: "write",
            location,
            error: Box::new(e),
        }
    }
}

impl Upload for LocalUpload {
    fn write(&mut self, data: &[u8]) -> Result<(), StoreError> {
        let Some(f) = self.file.as_mut() else {
            return Ok(());
        };
        f.write_all(data).map_err(|e| self.write_error(e))
    }

    fn complete(mut self: Box<Self>) -> Result<(), StoreError> {
        let Some(f) = self.file.take() else {
            return Ok(());
        };
        let f = match f.into_inner() {
            Ok(f) => f,
            Err(e) => {
                let (e, w) = e.into_parts();
                self.file = Some(w);
                return Err(self.write_error(e));
            }
        };
        if self.store.publish(f, &self.tmp, &self.key)? {
            Ok(())
        } else {
            Err(StoreError::Exists {
                location: self.store.location(&self.key),
            })
        }
    }

    fn keep_when_dropped(&mut self) {
        self.keep = true;
    }
}

impl Drop for LocalUpload {
    fn drop(&mut self) {
        if let Some(mut f) = self.file.take() {
            if self.keep {
                // What was written stays for the next run (a failed flush
                // leaves a shorter file, which is cut at its last whole
                // frame then).
                let _ = f.flush();
            } else {
                drop(f);
                self.store.remove_tmp(&self.tmp);
            }
        }
    }
}
