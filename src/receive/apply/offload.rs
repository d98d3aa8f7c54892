//! The lanes' offload: which WRITE and ENCODED_WRITE commands go to a worker
//! lane with their data where it is (the reader's payload buffer, or the
//! input file for a skimmed command), the files that have jobs queued, and
//! waiting for a file's jobs before a command that must not overtake them
//! (the ordering rules are on [`Lanes`](super::Lanes)). The lanes themselves
//! (threads, queues) are `receive::lanes`'; this module must not apply a
//! command itself.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::File;
use std::sync::Arc;

use stream_format::{Attr, Command, CommandInfo, CommandKind};

use super::{LANE_FILES, LANE_MIN, LaneFile, Offload, QueuedSize, Receiver};
use crate::receive::encoded;
use crate::receive::lanes::{Job, Op};
use crate::receive::{ApplyError, ApplyErrorKind};
use crate::sys;

impl Receiver<'_> {
    /// `path` names a file with lane jobs (maybe) queued.
    pub(super) fn queued(&self, path: &[u8]) -> bool {
        self.lanes
            .as_ref()
            .is_some_and(|l| l.files.contains_key(path))
    }

    /// If `path` names a file with lane jobs queued, wait for them; the file
    /// is then the receiver thread's again.
    pub(super) fn settle(&mut self, path: &[u8]) {
        if let Some(l) = &mut self.lanes
            && let Some(f) = l.files.remove(path)
        {
            l.pool.wait(f.lane, f.last);
        }
    }

    /// Queue `op` on the lane of `path`, a file that has jobs there.
    pub(super) fn queue_on_lane(&mut self, path: &[u8], op: Op) -> Result<(), ApplyErrorKind> {
        self.queue_on_lane_to(path, op, None)
    }

    /// [`queue_on_lane`](Self::queue_on_lane), for a skimmed write whose
    /// data ends at `stream_end` in the file, if known.
    pub(super) fn queue_on_lane_to(
        &mut self,
        path: &[u8],
        op: Op,
        stream_end: Option<u64>,
    ) -> Result<(), ApplyErrorKind> {
        let Some(l) = &mut self.lanes else {
            return Err(ApplyErrorKind::Invalid("no lanes".into()));
        };
        let Some(base) = self.cur.as_ref().map(|c| Arc::clone(&c.base)) else {
            return Err(ApplyErrorKind::NoSubvol);
        };
        let Some(f) = l.files.get_mut(path) else {
            return Err(ApplyErrorKind::Invalid("no lane for the file".into()));
        };
        f.size = match &op {
            Op::Write { offset, len, .. } => f.size.wrote(offset.checked_add(*len as u64)),
            Op::Encoded { fields, .. } => f
                .size
                .wrote(fields.offset.checked_add(fields.unencoded_file_len)),
            Op::Stream { .. } => f.size.wrote(stream_end),
            Op::Truncate(to) => f.size.set(Some(*to)),
            Op::Fallocate { .. } | Op::Chmod(_) | Op::Chown(..) | Op::Utimes(_) => f.size.set(None),
        };
        let job = Job {
            info: self.info.ok_or(ApplyErrorKind::NoSubvol)?,
            path: path.to_vec(),
            base,
            file: Arc::clone(&f.file),
            op,
        };
        f.last = l.pool.submit(f.lane, job);
        Ok(())
    }

    /// If `cmd` is a WRITE or ENCODED_WRITE to send to a lane with its data
    /// where it is (in the stream reader's payload buffer), what to send:
    /// the caller then takes the buffer from the reader and calls
    /// [`Receiver::submit`]. `None`: apply it with [`Receiver::apply`]
    /// (also whenever something is wrong: `apply` then reports it).
    pub fn offload(&mut self, info: &CommandInfo, cmd: &Command<'_>) -> Option<Offload> {
        self.lanes.as_ref()?;
        if self.progress.lists_commands() {
            // A listing shows what happens to each command in stream order
            // (the ENCODED_WRITE fallback line of -vv): applied here.
            return None;
        }
        let (path, data, offset, encoded) = match cmd {
            Command::Write {
                path,
                offset,
                data: Cow::Borrowed(data),
            } => (path, *data, *offset, None),
            Command::EncodedWrite {
                path,
                offset,
                data: Cow::Borrowed(data),
                ..
            } => {
                let e = encoded::fields(cmd)?.ok()?;
                let e = sys::Encoded { data: &[], ..e };
                (path, *data, *offset, Some(e))
            }
            _ => return None,
        };
        if !self.queued(path) && encoded.is_none() && data.len() < LANE_MIN {
            return None;
        }
        if self.journaling() {
            let len = encoded
                .as_ref()
                .map_or(data.len() as u64, |e| e.unencoded_file_len);
            self.j_data(path, offset, Some(offset.saturating_add(len)))
                .ok()?;
        }
        self.lane_file(path)?;
        Some(Offload {
            info: *info,
            path: path.to_vec(),
            len: data.len(),
            offset,
            encoded,
        })
    }

    /// Make sure `path` has a lane (it names a regular file with a single
    /// link); `None`: it cannot have one (or cannot be opened: applying the
    /// command here reports why).
    pub(super) fn lane_file(&mut self, path: &[u8]) -> Option<()> {
        if self.queued(path) {
            return Some(());
        }
        let (f, single) = self.file_arc(path).ok()?;
        if !single {
            return None;
        }
        let file = Arc::clone(f);
        let ino = self.wcache.as_ref()?.ino;
        let l = self.lanes.as_mut()?;
        if l.files.len() >= LANE_FILES {
            let done = l.pool.done();
            l.files
                .retain(|_, f| done.get(f.lane).is_some_and(|&d| d < f.last));
        }
        let lane = l.pool.pick();
        l.files.insert(
            path.to_vec(),
            LaneFile {
                file,
                ino,
                lane,
                last: 0,
                size: QueuedSize::Grows(0),
            },
        );
        Some(())
    }

    /// A WRITE or ENCODED_WRITE skimmed by the reader
    /// ([`stream_format::Next::Skimmed`]: its header and the first bytes of
    /// its payload, `prefix`): queue it on its file's lane, which reads the
    /// payload from `input`, checks it and writes it. Returns `false` when it
    /// cannot go to a lane (no lanes, no PATH in `prefix`, a file with
    /// several links, or one that cannot be opened): the caller then reads it
    /// whole and applies it here.
    pub fn skimmed(
        &mut self,
        info: &CommandInfo,
        crc: u32,
        prefix: &[u8],
        input: &Arc<File>,
    ) -> bool {
        if self.lanes.is_none() {
            return false;
        }
        let Some(path) = prefix_path(prefix) else {
            return false;
        };
        // Only its offset is known here: a write that may overwrite data
        // the file held at the checkpoint (data to save) is written
        // through `apply`. An ENCODED_WRITE at or beyond the file's size
        // then (an append: nothing to save but the attributes, journaled
        // here) goes to the lane as in a receive without a journal, where
        // it is decoded, or waits for the ioctl, beside the others; a
        // plain WRITE is written through `apply`: a lane does not make it
        // faster once its file is journaled.
        if self.journaling() && !self.j_new(path) {
            let encoded = info.cmd == CommandKind::EncodedWrite.number();
            let appends = encoded && prefix_offset(prefix).is_some_and(|o| self.j_appends(path, o));
            if !appends {
                return false;
            }
        }
        if self.lane_file(path).is_none() {
            return false;
        }
        self.info = Some(*info);
        let op = Op::Stream {
            input: Arc::clone(input),
            crc,
        };
        // Where an ENCODED_WRITE ends in the file, for the journal. It is
        // a protocol 2 command, where DATA is the last attribute: the
        // prefix holds every other one, and one FILE_OFFSET and one
        // UNENCODED_FILE_LEN there are the ones the lane writes with.
        let end = (info.cmd == CommandKind::EncodedWrite.number())
            .then(|| {
                prefix_offset(prefix)?.checked_add(prefix_u64(prefix, Attr::UnencodedFileLen)?)
            })
            .flatten();
        self.queue_on_lane_to(path, op, end).is_ok()
    }

    /// Send an [`Offload`]ed command to its lane, with `buf`, the payload
    /// buffer its data is in, and `data`, where in `buf` the data is
    /// ([`stream_format::StreamReader::data_range`]).
    ///
    /// # Errors
    ///
    /// `data` is not a range of `buf` of the command's data length (a
    /// caller's mistake), or there is no subvolume.
    pub fn submit(
        &mut self,
        o: Offload,
        buf: Vec<u8>,
        data: Option<std::ops::Range<usize>>,
    ) -> Result<(), Box<ApplyError>> {
        let start = data
            .filter(|r| r.len() == o.len && r.end <= buf.len())
            .map(|r| r.start);
        let (op_name, op) = match (start, o.encoded) {
            (Some(start), None) => (
                "WRITE",
                Op::Write {
                    buf,
                    start,
                    len: o.len,
                    offset: o.offset,
                },
            ),
            (Some(start), Some(fields)) => (
                "ENCODED_WRITE",
                Op::Encoded {
                    buf,
                    start,
                    len: o.len,
                    fields,
                },
            ),
            (None, _) => {
                return Err(Box::new(ApplyError {
                    cmd: Some(o.info),
                    op: "WRITE",
                    path: o.path,
                    target: None,
                    path2: None,
                    kind: ApplyErrorKind::Invalid(
                        "internal: data not in its payload buffer".into(),
                    ),
                }));
            }
        };
        self.info = Some(o.info);
        self.queue_on_lane(&o.path, op).map_err(|kind| {
            Box::new(ApplyError {
                cmd: Some(o.info),
                op: op_name,
                target: self.cur.as_ref().map(|c| c.target.display(&o.path)),
                path: o.path,
                path2: None,
                kind,
            })
        })
    }
}

/// The PATH attribute among the attributes in `prefix` (the start of a
/// WRITE or ENCODED_WRITE payload) before DATA, if it is there whole (the
/// lane checks it against the whole, checked, command).
pub(super) fn prefix_path(prefix: &[u8]) -> Option<&[u8]> {
    prefix_attr(prefix, Attr::Path.number())?.0
}

/// The FILE_OFFSET attribute among the attributes in `prefix` (as
/// [`prefix_path`]), if it is there once, whole and 8 bytes long; `None`
/// also when it appears twice (the caller then reads the command whole).
pub(super) fn prefix_offset(prefix: &[u8]) -> Option<u64> {
    prefix_u64(prefix, Attr::FileOffset)
}

/// The u64 attribute `ty` among the attributes in `prefix` (as
/// [`prefix_offset`]).
fn prefix_u64(prefix: &[u8], ty: Attr) -> Option<u64> {
    match prefix_attr(prefix, ty.number())? {
        (Some(value), 1) => Some(u64::from_le_bytes(value.try_into().ok()?)),
        _ => None,
    }
}

/// Attribute `ty` among the attributes in `prefix` before DATA: its last
/// value and how many times it appears; `None` when the attributes before
/// DATA are not all there whole.
pub(super) fn prefix_attr(prefix: &[u8], ty: u16) -> Option<(Option<&[u8]>, usize)> {
    let data_ty = Attr::Data.number();
    let mut pos = 0usize;
    let mut found = (None, 0usize);
    loop {
        let h = prefix.get(pos..pos.checked_add(4)?)?;
        let t = u16::from_le_bytes([*h.first()?, *h.get(1)?]);
        if t == data_ty {
            return Some(found);
        }
        let len = usize::from(u16::from_le_bytes([*h.get(2)?, *h.get(3)?]));
        let start = pos.checked_add(4)?;
        let end = start.checked_add(len)?;
        let value = prefix.get(start..end)?;
        if t == ty {
            found = (Some(value), found.1.saturating_add(1));
        }
        pos = end;
    }
}

/// Remove the entries at or under `path` from `files`; returns them.
pub(super) fn remove_under(
    files: &mut BTreeMap<Vec<u8>, LaneFile>,
    path: &[u8],
) -> Vec<(Vec<u8>, LaneFile)> {
    let mut out = Vec::new();
    if let Some(f) = files.remove(path) {
        out.push((path.to_vec(), f));
    }
    // Entries under `path/` sort between `path/` and `path0` ('0' follows '/').
    let mut lo = path.to_vec();
    lo.push(b'/');
    let mut hi = path.to_vec();
    hi.push(b'0');
    let keys: Vec<Vec<u8>> = files.range(lo..hi).map(|(k, _)| k.clone()).collect();
    for k in keys {
        if let Some(f) = files.remove(&k) {
            out.push((k, f));
        }
    }
    out
}
