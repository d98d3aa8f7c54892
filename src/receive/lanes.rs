//! Parallel application of file data: worker threads, one FIFO queue
//! ("lane") each, that write WRITE and ENCODED_WRITE data and apply the
//! commands that follow on the same file, while the receiver's thread goes on
//! with the stream.
//!
//! The receiver ([`super::apply::Receiver`]) decides what goes to a lane and
//! which lane; the rules that keep the result equal to applying the stream in
//! order are there (see its `lanes` field). This module only runs jobs:
//!
//! * every job names its file by an open fd of a regular file with a single
//!   link, so a job acts on the inode the stream meant when it was queued,
//!   whatever renames and unlinks happen on the receiver's thread meanwhile;
//! * the jobs of one lane run in the order they were queued; lane `w`'s
//!   `k`-th job is done when `done[w] >= k` ([`Pool::wait`]);
//! * the bytes of data queued and not yet written are capped
//!   ([`Pool::submit`] waits): the memory bound of a receive;
//! * a failed job is an [`ApplyError`] naming its command, stream offset
//!   and path, collected for the receiver ([`Pool::take_reports`]); the jobs
//!   after it run (as with `--max-errors 0`). Dropping the pool runs the jobs
//!   still queued (they are commands read before any later error).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use rustix::fs::{FallocateFlags, Mode, Timestamps};
use stream_format::CommandInfo;

use super::{ApplyError, ApplyErrorKind, encoded};
use crate::sys;

/// Default cap of the data bytes queued to the lanes and not yet written.
pub const MAX_IN_FLIGHT: usize = 64 << 20;

/// What a job does to its file.
#[derive(Debug)]
pub enum Op {
    /// WRITE: `buf[start..start + len]` at `offset`.
    Write {
        /// The command's payload buffer.
        buf: Vec<u8>,
        /// Where DATA starts in it.
        start: usize,
        /// DATA's length.
        len: usize,
        /// File offset.
        offset: u64,
    },
    /// ENCODED_WRITE (fields checked already): through the ioctl where the
    /// target takes it, else decoded and written.
    Encoded {
        /// The command's payload buffer.
        buf: Vec<u8>,
        /// Where DATA starts in it.
        start: usize,
        /// DATA's length.
        len: usize,
        /// The command's other fields (`data` empty: it is in `buf`).
        fields: sys::Encoded<'static>,
    },
    /// TRUNCATE.
    Truncate(u64),
    /// FALLOCATE.
    Fallocate {
        /// Mode bits.
        mode: u32,
        /// Offset.
        offset: u64,
        /// Length.
        size: u64,
    },
    /// CHMOD (permission bits).
    Chmod(u32),
    /// CHOWN.
    Chown(u32, u32),
    /// UTIMES (atime, mtime).
    Utimes(Timestamps),
    /// A skimmed WRITE or ENCODED_WRITE (the job's `info`, with this stored
    /// CRC): its payload is read from the input here, checked
    /// ([`stream_format::decode_payload`]) and written, so the data is
    /// copied once, from the input's page cache into this buffer, and its
    /// PATH must be the job's (what the receiver routed it by).
    Stream {
        /// The input (a regular file).
        input: Arc<File>,
        /// The stored CRC.
        crc: u32,
    },
}

impl Op {
    /// The name of its command, for messages.
    fn name(&self) -> &'static str {
        match self {
            Op::Write { .. } => "WRITE",
            Op::Encoded { .. } => "ENCODED_WRITE",
            Op::Truncate(_) => "TRUNCATE",
            Op::Fallocate { .. } => "FALLOCATE",
            Op::Chmod(_) => "CHMOD",
            Op::Chown(..) => "CHOWN",
            Op::Utimes(_) => "UTIMES",
            Op::Stream { .. } => "WRITE",
        }
    }

    /// Bytes of memory the job holds (counted against the cap).
    fn bytes(&self) -> usize {
        match self {
            Op::Write { buf, .. } | Op::Encoded { buf, .. } => buf.capacity(),
            _ => 0,
        }
    }
}

impl Job {
    /// The work the job is, in bytes of data (to balance the lanes).
    fn load(&self) -> usize {
        match self.op {
            Op::Stream { .. } => usize::try_from(self.info.len).unwrap_or(usize::MAX),
            _ => self.op.bytes(),
        }
    }
}

/// One command for a lane.
#[derive(Debug)]
pub struct Job {
    /// The command (for error messages).
    pub info: CommandInfo,
    /// Its stream path.
    pub path: Vec<u8>,
    /// The filesystem path of the subvolume root (for error messages).
    pub base: Arc<PathBuf>,
    /// The file, open for reading and writing.
    pub file: Arc<File>,
    /// What to do.
    pub op: Op,
}

/// State shared by the receiver's thread and the workers.
#[derive(Debug, Default)]
struct State {
    /// Jobs finished per lane.
    done: Vec<u64>,
    /// Bytes of data queued per lane (see [`Job::load`]).
    queued: Vec<usize>,
    /// Bytes queued in all lanes.
    in_flight: usize,
    errors: Vec<ApplyError>,
    notes: Vec<(&'static str, String)>,
    /// The receiver's thread waits on the condition variable (workers
    /// signal only then: a wake-up is a system call).
    waiting: bool,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Signalled when a job finishes (only the receiver's thread waits).
    cv: Condvar,
    /// Try `BTRFS_IOC_ENCODED_WRITE` (shared with the receiver).
    encoded_ioctl: Arc<AtomicBool>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A worker never panics while holding the lock; if one did, the
        // state is still consistent enough to stop with.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Lock, then wait (flagging `waiting`, so workers signal) while
    /// `busy` holds.
    fn wait_while(&self, mut busy: impl FnMut(&State) -> bool) -> MutexGuard<'_, State> {
        let mut st = self.lock();
        while busy(&st) {
            st.waiting = true;
            st = self
                .cv
                .wait(st)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        st.waiting = false;
        st
    }
}

/// The worker threads and their queues.
#[derive(Debug)]
pub struct Pool {
    senders: Vec<mpsc::Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
    shared: Arc<Shared>,
    /// Jobs queued per lane (the `k` of the last one).
    queued: Vec<u64>,
    /// Emptied payload buffers coming back from the workers.
    free: mpsc::Receiver<Vec<u8>>,
    pool: Vec<Vec<u8>>,
    /// Bytes in `pool`.
    pooled: usize,
    cap: usize,
    next: usize,
}

impl Pool {
    /// Start `lanes` workers (at least 1); at most `cap` bytes of data
    /// queued at once.
    ///
    /// # Errors
    ///
    /// A thread cannot be started.
    pub fn new(lanes: usize, cap: usize, encoded_ioctl: Arc<AtomicBool>) -> io::Result<Pool> {
        let lanes = lanes.max(1);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                done: vec![0; lanes],
                queued: vec![0; lanes],
                ..State::default()
            }),
            cv: Condvar::new(),
            encoded_ioctl,
        });
        let (free_tx, free) = mpsc::channel();
        let mut pool = Pool {
            senders: Vec::new(),
            threads: Vec::new(),
            shared,
            queued: vec![0; lanes],
            free,
            pool: Vec::new(),
            pooled: 0,
            cap,
            next: 0,
        };
        for w in 0..lanes {
            let (tx, rx) = mpsc::channel::<Job>();
            let shared = Arc::clone(&pool.shared);
            let free_tx = free_tx.clone();
            let t = std::thread::Builder::new()
                .name(format!("receive-lane-{w}"))
                .spawn(move || work(w, &rx, &shared, &free_tx))?;
            pool.senders.push(tx);
            pool.threads.push(t);
        }
        Ok(pool)
    }

    /// The lane with the fewest bytes queued (ties: round robin), for a
    /// file that has no jobs queued.
    pub fn pick(&mut self) -> usize {
        let st = self.shared.lock();
        let n = st.queued.len();
        let start = self.next;
        self.next = (self.next + 1) % n;
        (0..n)
            .map(|i| (start + i) % n)
            .min_by_key(|&w| st.queued.get(w).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    /// Queue `job` on lane `w` (waiting while the cap is reached); returns
    /// its number `k` in the lane.
    pub fn submit(&mut self, w: usize, job: Job) -> u64 {
        let bytes = job.op.bytes();
        let load = job.load();
        {
            // A job bigger than the cap waits for an empty queue.
            let cap = self.cap;
            let mut st = self
                .shared
                .wait_while(|st| st.in_flight > 0 && st.in_flight + bytes > cap);
            st.in_flight += bytes;
            if let Some(q) = st.queued.get_mut(w) {
                *q = q.saturating_add(load);
            }
        }
        let (Some(tx), Some(k)) = (self.senders.get(w), self.queued.get_mut(w)) else {
            return 0;
        };
        *k += 1;
        let k = *k;
        if tx.send(job).is_err() {
            // The worker is gone (it cannot be, short of a panic): count the
            // job as done so nobody waits for it.
            let mut st = self.shared.lock();
            if let Some(d) = st.done.get_mut(w) {
                *d += 1;
            }
            st.in_flight = st.in_flight.saturating_sub(bytes);
            if let Some(q) = st.queued.get_mut(w) {
                *q = q.saturating_sub(load);
            }
        }
        k
    }

    /// Wait until lane `w` has run its first `k` jobs.
    pub fn wait(&self, w: usize, k: u64) {
        drop(
            self.shared
                .wait_while(|st| st.done.get(w).is_some_and(|&d| d < k)),
        );
    }

    /// The number of jobs queued so far in each lane: a mark that
    /// [`Pool::reached`] and [`Pool::wait_marks`] compare with.
    pub fn marks(&self) -> Vec<u64> {
        self.queued.clone()
    }

    /// Whether every lane has run the jobs counted in `marks`.
    pub fn reached(&self, marks: &[u64]) -> bool {
        let st = self.shared.lock();
        marks
            .iter()
            .enumerate()
            .all(|(w, &k)| st.done.get(w).is_none_or(|&d| d >= k))
    }

    /// Wait until every lane has run the jobs counted in `marks`.
    pub fn wait_marks(&self, marks: &[u64]) {
        for (w, &k) in marks.iter().enumerate() {
            self.wait(w, k);
        }
    }

    /// Wait until every queued job has run.
    pub fn wait_all(&self) {
        self.wait_marks(&self.queued);
    }

    /// The errors (in the order they happened) and notes of the jobs run
    /// since the last call.
    pub fn take_reports(&self) -> (Vec<ApplyError>, Vec<(&'static str, String)>) {
        let mut st = self.shared.lock();
        if st.errors.is_empty() && st.notes.is_empty() {
            return (Vec::new(), Vec::new());
        }
        (
            std::mem::take(&mut st.errors),
            std::mem::take(&mut st.notes),
        )
    }

    /// How many jobs each lane has run.
    pub fn done(&self) -> Vec<u64> {
        self.shared.lock().done.clone()
    }

    /// An empty payload buffer to read the next command into (reused).
    pub fn buffer(&mut self) -> Vec<u8> {
        while let Ok(b) = self.free.try_recv() {
            // Kept up to the cap (so, with the queued ones, at most twice
            // the cap exist): reused, not allocated and faulted in again.
            if self.pooled + b.capacity() <= self.cap {
                self.pooled += b.capacity();
                self.pool.push(b);
            }
        }
        let b = self.pool.pop().unwrap_or_default();
        self.pooled -= b.capacity();
        b
    }
}

impl Drop for Pool {
    /// Close the queues: the workers run the jobs still queued, then end.
    fn drop(&mut self) {
        self.senders.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A worker: run lane `w`'s jobs in order until its queue is closed.
fn work(w: usize, rx: &mpsc::Receiver<Job>, shared: &Shared, free: &mpsc::Sender<Vec<u8>>) {
    let mut scratch = Scratch::default();
    while let Ok(job) = rx.recv() {
        let bytes = job.op.bytes();
        let load = job.load();
        let mut note = None;
        let res = run(&job, shared, &mut note, &mut scratch);
        let Job {
            info,
            path,
            base,
            op,
            ..
        } = job;
        let name = match op {
            Op::Stream { .. } => stream_format::CommandKind::from_u16(info.cmd)
                .map_or("WRITE", stream_format::CommandKind::name),
            _ => op.name(),
        };
        if let Op::Write { buf, .. } | Op::Encoded { buf, .. } = op {
            let _ = free.send(buf);
        }
        let mut st = shared.lock();
        if let Err(kind) = res {
            let target = Some(super::target::display_under(&base, &path));
            st.errors.push(ApplyError {
                cmd: Some(info),
                op: name,
                path,
                target,
                path2: None,
                kind,
            });
        }
        if let Some(n) = note {
            st.notes.push(n);
        }
        if let Some(d) = st.done.get_mut(w) {
            *d += 1;
        }
        if let Some(q) = st.queued.get_mut(w) {
            *q = q.saturating_sub(load);
        }
        st.in_flight = st.in_flight.saturating_sub(bytes);
        let wake = st.waiting;
        drop(st);
        if wake {
            shared.cv.notify_all();
        }
    }
}

/// A worker's buffers for [`Op::Stream`] jobs, reused.
#[derive(Default)]
struct Scratch {
    payload: Vec<u8>,
    attrs: Vec<stream_format::RawAttr>,
}

/// Write an ENCODED_WRITE (fields checked): through the ioctl where the
/// target takes it, else decoded.
fn encoded_write(f: &File, e: &sys::Encoded<'_>, shared: &Shared) -> Result<(), ApplyErrorKind> {
    if shared.encoded_ioctl.load(Ordering::Relaxed) && e.compression != 0 {
        match sys::encoded_write(f, e) {
            Ok(()) => return Ok(()),
            Err(err) => match sys::refusal(err) {
                sys::Refusal::Never => shared.encoded_ioctl.store(false, Ordering::Relaxed),
                sys::Refusal::ThisOne => {}
                sys::Refusal::Fail => return Err(err.into()),
            },
        }
    }
    let bytes = encoded::decode(
        e.compression,
        e.encryption,
        e.data,
        e.unencoded_len,
        e.unencoded_offset,
        e.unencoded_file_len,
    )?;
    f.write_all_at(&bytes, e.offset)?;
    Ok(())
}

/// Read a skimmed command's payload from the input, check it, and write
/// its data.
fn run_stream(
    job: &Job,
    input: &File,
    crc: u32,
    shared: &Shared,
    scratch: &mut Scratch,
) -> Result<(), ApplyErrorKind> {
    use stream_format::Command;
    let info = &job.info;
    let buf = &mut scratch.payload;
    read_payload_into(input, info, buf)?;
    let cmd = stream_format::decode_payload(info, crc, buf, &mut scratch.attrs)
        .map_err(|e| ApplyErrorKind::Invalid(e.to_string()))?;
    let f = &*job.file;
    let moved = || {
        ApplyErrorKind::Invalid(
            "the command's PATH is not the one it was routed by (a PATH attribute after DATA)"
                .into(),
        )
    };
    match &cmd {
        Command::Write { path, offset, data } => {
            if **path != job.path[..] {
                return Err(moved());
            }
            f.write_all_at(data, *offset)?;
        }
        Command::EncodedWrite { path, .. } => {
            if **path != job.path[..] {
                return Err(moved());
            }
            let e = encoded::fields(&cmd).ok_or_else(encoded::not_encoded)??;
            encoded_write(f, &e, shared)?;
        }
        _ => {
            return Err(ApplyErrorKind::Invalid(
                "not a WRITE or ENCODED_WRITE".into(),
            ));
        }
    }
    Ok(())
}

/// Run one job.
fn run(
    job: &Job,
    shared: &Shared,
    note: &mut Option<(&'static str, String)>,
    scratch: &mut Scratch,
) -> Result<(), ApplyErrorKind> {
    let f = &*job.file;
    match &job.op {
        Op::Stream { input, crc } => run_stream(job, input, *crc, shared, scratch)?,
        Op::Write {
            buf,
            start,
            len,
            offset,
        } => {
            f.write_all_at(data_of(buf, *start, *len)?, *offset)?;
        }
        Op::Encoded {
            buf,
            start,
            len,
            fields,
        } => {
            let data = data_of(buf, *start, *len)?;
            encoded_write(f, &sys::Encoded { data, ..*fields }, shared)?;
        }
        Op::Truncate(size) => f.set_len(*size)?,
        Op::Fallocate { mode, offset, size } => {
            rustix::fs::fallocate(f, FallocateFlags::from_bits_retain(*mode), *offset, *size)?;
        }
        Op::Chmod(mode) => rustix::fs::fchmod(f, Mode::from_raw_mode(*mode))?,
        Op::Chown(uid, gid) => {
            let r = rustix::fs::fchown(
                f,
                Some(rustix::fs::Uid::from_raw_unchecked(*uid)),
                Some(rustix::fs::Gid::from_raw_unchecked(*gid)),
            );
            match r {
                Ok(()) => {}
                // As `copy::set_owner`: an ordinary user cannot give files away.
                Err(rustix::io::Errno::PERM) if !rustix::process::geteuid().is_root() => {
                    *note = Some((
                        "chown",
                        "not running as root: file owners (uid/gid) were not set, files belong to the receiving user".into(),
                    ));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Op::Utimes(t) => rustix::fs::futimens(f, t)?,
    }
    Ok(())
}

/// `buf[start..start + len]`, checked.
fn data_of(buf: &[u8], start: usize, len: usize) -> Result<&[u8], ApplyErrorKind> {
    start
        .checked_add(len)
        .and_then(|end| buf.get(start..end))
        .ok_or_else(|| ApplyErrorKind::Invalid("data outside its command buffer".into()))
}

/// [`read_payload`] into `buf` (reused): as much of the payload as there
/// is, so a short one (the input shrank) is the decoder's "truncated
/// command" error.
pub(crate) fn read_payload_into(
    input: &std::fs::File,
    info: &CommandInfo,
    buf: &mut Vec<u8>,
) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let len = usize::try_from(info.len).unwrap_or(usize::MAX);
    buf.resize(len, 0);
    let at = info
        .offset
        .saturating_add(stream_format::CMD_HEADER_SIZE as u64);
    let mut got = 0;
    while let Some(rest) = buf.get_mut(got..).filter(|r| !r.is_empty()) {
        match input.read_at(rest, at.saturating_add(got as u64)) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(got);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(index: u64) -> CommandInfo {
        CommandInfo {
            offset: 100 + index,
            index,
            cmd: stream_format::CommandKind::Write.number(),
            len: 0,
            stream: 0,
            version: 2,
        }
    }

    fn job(file: &Arc<File>, index: u64, op: Op) -> Job {
        Job {
            info: info(index),
            path: b"f".to_vec(),
            base: Arc::new(PathBuf::from("/x/s")),
            file: Arc::clone(file),
            op,
        }
    }

    fn write(data: &[u8], offset: u64) -> Op {
        // The data sits at an offset within its buffer, as in a payload.
        let mut buf = b"HEAD".to_vec();
        buf.extend_from_slice(data);
        Op::Write {
            buf,
            start: 4,
            len: data.len(),
            offset,
        }
    }

    fn scratch_file() -> (tempfile::TempDir, Arc<File>) {
        let d = tempfile::tempdir().unwrap();
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(d.path().join("f"))
            .unwrap();
        (d, Arc::new(f))
    }

    #[test]
    fn a_lane_runs_its_jobs_in_order() {
        let (d, f) = scratch_file();
        let mut pool = Pool::new(2, 1 << 20, Arc::new(AtomicBool::new(false))).unwrap();
        let w = pool.pick();
        // Each job depends on the one before: write, overwrite, truncate,
        // extend, chmod.
        pool.submit(w, job(&f, 1, write(b"aaaa", 0)));
        pool.submit(w, job(&f, 2, write(b"bb", 1)));
        pool.submit(w, job(&f, 3, Op::Truncate(3)));
        pool.submit(w, job(&f, 4, write(b"c", 4)));
        let k = pool.submit(w, job(&f, 5, Op::Chmod(0o640)));
        assert_eq!(k, 5);
        pool.wait(w, k);
        assert!(pool.done()[w] >= 5);
        assert_eq!(std::fs::read(d.path().join("f")).unwrap(), b"abb\0c");
        let m = std::fs::metadata(d.path().join("f")).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777,
            0o640
        );
        let (errs, notes) = pool.take_reports();
        assert!(errs.is_empty() && notes.is_empty());
    }

    #[test]
    fn lanes_are_balanced_by_queued_bytes() {
        let (_d, f) = scratch_file();
        let mut pool = Pool::new(3, 1 << 20, Arc::new(AtomicBool::new(false))).unwrap();
        let picks: Vec<usize> = (0..3).map(|_| pool.pick()).collect();
        // Nothing queued: round robin over the three.
        let mut sorted = picks.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, [0, 1, 2]);
        pool.wait_all();
        drop(f);
    }

    #[test]
    fn a_failed_job_is_reported_with_its_command_and_the_next_ones_run() {
        let (d, f) = scratch_file();
        let mut pool = Pool::new(1, 1 << 20, Arc::new(AtomicBool::new(false))).unwrap();
        // Data outside its buffer: an error naming command 7 and its path.
        let bad = Op::Write {
            buf: vec![0; 4],
            start: 2,
            len: 10,
            offset: 0,
        };
        pool.submit(0, job(&f, 7, bad));
        let k = pool.submit(0, job(&f, 8, write(b"ok", 0)));
        pool.wait(0, k);
        let (errs, _) = pool.take_reports();
        assert_eq!(errs.len(), 1);
        let e = &errs[0];
        assert_eq!(e.cmd.map(|c| c.index), Some(7));
        assert_eq!(e.op, "WRITE");
        assert_eq!(e.path, b"f");
        assert_eq!(e.target.as_deref(), Some(std::path::Path::new("/x/s/f")));
        assert!(
            e.to_string().contains("data outside its command buffer"),
            "{e}"
        );
        assert_eq!(std::fs::read(d.path().join("f")).unwrap(), b"ok");
        // Taken once.
        assert!(pool.take_reports().0.is_empty());
    }

    #[test]
    fn the_cap_bounds_queued_data_and_buffers_come_back() {
        let (d, f) = scratch_file();
        // A cap smaller than two jobs: the second waits for the first.
        let mut pool = Pool::new(2, 6000, Arc::new(AtomicBool::new(false))).unwrap();
        for i in 0..20u64 {
            let w = pool.pick();
            pool.submit(w, job(&f, i, write(&[b'x'; 4000], i * 4000)));
            assert!(pool.shared.lock().in_flight <= 6000 + 4100);
        }
        pool.wait_all();
        assert_eq!(pool.shared.lock().in_flight, 0);
        assert_eq!(std::fs::metadata(d.path().join("f")).unwrap().len(), 80_000);
        // Emptied buffers are reused.
        let b = pool.buffer();
        assert!(b.capacity() >= 4000, "{}", b.capacity());
    }

    #[test]
    fn a_mark_is_reached_when_the_jobs_before_it_ran() {
        let (d, f) = scratch_file();
        let mut pool = Pool::new(2, 1 << 20, Arc::new(AtomicBool::new(false))).unwrap();
        for i in 0..40u64 {
            pool.submit((i % 2) as usize, job(&f, i, write(b"m", i)));
        }
        let mark = pool.marks();
        assert_eq!(mark, vec![20, 20]);
        // Jobs queued after the mark do not hold it back.
        for i in 40..60u64 {
            pool.submit(0, job(&f, i, write(b"n", i)));
        }
        pool.wait_marks(&mark);
        assert!(pool.reached(&mark));
        assert!(pool.done().iter().zip(&mark).all(|(d, m)| d >= m));
        let data = std::fs::read(d.path().join("f")).unwrap();
        assert!(data.len() >= 40 && data[..40].iter().all(|&b| b == b'm'));
        pool.wait_all();
        assert!(pool.reached(&pool.marks()));
    }

    #[test]
    fn dropping_the_pool_runs_the_queued_jobs() {
        let (d, f) = scratch_file();
        let mut pool = Pool::new(2, 1 << 20, Arc::new(AtomicBool::new(false))).unwrap();
        for i in 0..50u64 {
            pool.submit(0, job(&f, i, write(b"z", i)));
        }
        drop(pool);
        assert_eq!(std::fs::read(d.path().join("f")).unwrap(), vec![b'z'; 50]);
    }
}
