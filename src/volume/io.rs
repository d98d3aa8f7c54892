//! The I/O half of a [`Volume`](super::Volume): the devices, the chunk
//! map and the block checks, shared with the reader threads. It reads
//! tree blocks and file data uncached, choosing among a chunk's copies
//! (and RAID5/6 rebuilds) and keeping the most telling error; it never
//! caches (the volume's block cache sits in front of it).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::chunk_map::{ChunkInfo, ChunkMap, Profile, StripeLoc};
use crate::device::Device;
use crate::device::raid56;
use crate::device::readahead::Load;
use crate::error::{CorruptKind, Error, Location, Result};
use crate::tree::buf::BlockBuf;
use crate::tree::check::{BlockCheck, BlockExpect};
use crate::tree::node::TreeBlock;
use crate::tree::walk::BlockSource;
use crate::types::{DevId, Generation, Logical, len64};

/// The I/O half of a volume: devices, chunk map and block checks, shared
/// with the reader threads. Reads here are uncached.
#[derive(Debug)]
pub(super) struct Io {
    pub(super) devices: BTreeMap<DevId, Arc<dyn Device>>,
    pub(super) chunk_map: ChunkMap,
    pub(super) check: BlockCheck,
}

thread_local! {
    /// A reader thread's buffer for data prefetch.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Io {
    pub(super) fn lookup(&self, logical: Logical) -> Result<&ChunkInfo> {
        self.chunk_map
            .lookup(logical)
            .ok_or_else(|| unmapped(logical))
    }

    /// Read one device strip.
    pub(super) fn read_strip(
        &self,
        loc: &StripeLoc,
        logical: Logical,
        buf: &mut [u8],
    ) -> Result<()> {
        let dev = self.devices.get(&loc.devid).ok_or(Error::MissingDevice {
            devid: loc.devid,
            uuid: loc.dev_uuid,
            logical,
        })?;
        dev.read_at(buf, loc.physical)
    }

    /// Read copy `copy` of the contiguous piece of `buf` at `pos` in
    /// `chunk`; returns the bytes read (> 0).
    pub(super) fn read_piece(
        &self,
        chunk: &ChunkInfo,
        pos: Logical,
        buf: &mut [u8],
        copy: usize,
    ) -> Result<usize> {
        let mapping = chunk
            .mapping(pos, len64(buf.len()))
            .ok_or_else(|| unmapped(pos))?;
        let n = usize::try_from(mapping.len)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let piece = buf.get_mut(..n).unwrap_or_default();
        match mapping.copy(copy) {
            Some(loc) => self.read_strip(&loc, pos, piece)?,
            None if copy > 0
                && copy < chunk.num_copies()
                && matches!(chunk.profile, Profile::Raid5 | Profile::Raid6) =>
            {
                self.rebuild(chunk, pos, piece, copy)?;
            }
            None => return Err(unmapped(pos)),
        }
        Ok(n)
    }

    /// Rebuild the data at `logical` (within one strip) from the rest of
    /// its RAID5/6 row. Copy 1 uses P, copy 2 Q; copy `3 + k` (RAID6) also
    /// takes the k-th other data strip as bad and uses P and Q. Strips that
    /// cannot be read count as missing too (then P and Q together).
    pub(super) fn rebuild(
        &self,
        chunk: &ChunkInfo,
        logical: Logical,
        buf: &mut [u8],
        copy: usize,
    ) -> Result<()> {
        let row = chunk
            .raid56_row(logical, len64(buf.len()))
            .ok_or_else(|| unmapped(logical))?;
        let len = buf.len();
        // The other data strip taken as bad by copies 3 and up.
        let also_bad = copy
            .checked_sub(3)
            .and_then(|k| (0..row.data.len()).filter(|&i| i != row.col).nth(k));
        let mut first_err = None;
        let mut missing = vec![row.col];
        missing.extend(also_bad);
        let mut cols = Vec::with_capacity(row.data.len());
        for (i, loc) in row.data.iter().enumerate() {
            let mut strip = vec![0u8; len];
            if !missing.contains(&i)
                && let Err(e) = self.read_strip(loc, logical, &mut strip)
            {
                keep_most_telling(&mut first_err, e);
                missing.push(i);
            }
            cols.push(strip);
        }
        let two = missing.len() > 1;
        let mut parity = |which: usize, wanted: bool| -> Option<Vec<u8>> {
            let loc = row.parity.get(which).filter(|_| wanted)?;
            let mut strip = vec![0u8; len];
            match self.read_strip(loc, logical, &mut strip) {
                Ok(()) => Some(strip),
                Err(e) => {
                    keep_most_telling(&mut first_err, e);
                    None
                }
            }
        };
        let p = parity(0, copy != 2 || two);
        let q = parity(1, copy != 1 || two);
        match raid56::rebuild(&mut cols, &missing, p.as_deref(), q.as_deref()) {
            Ok(()) => {
                if let Some(col) = cols.get(row.col) {
                    buf.copy_from_slice(col);
                }
                Ok(())
            }
            // Something was missing, so an error was kept — unless copy 3+
            // of a row with too few strips, which maps nothing.
            Err(_) => Err(first_err.unwrap_or_else(|| unmapped(logical))),
        }
    }

    /// Read one piece (within a stripe) sector by sector verified: the
    /// whole piece from copy 0, then each run of sectors that failed from
    /// the next copy. Returns whether every sector verified.
    pub(super) fn read_verified_piece(
        &self,
        chunk: &ChunkInfo,
        pos: Logical,
        piece: &mut [u8],
        sector: u64,
        mut verify: impl FnMut(usize, &[u8], usize) -> bool,
    ) -> Result<bool> {
        #[derive(Clone, Copy, PartialEq, Eq)]
        enum State {
            Unread,
            Held,
            Verified,
        }
        // Sector units (offset, len) in `piece`, split at logical multiples
        // of the sector size.
        let mut units: Vec<(usize, usize)> = Vec::new();
        let mut at = 0usize;
        while at < piece.len() {
            let l = pos.get().saturating_add(len64(at));
            let to_boundary = sector.saturating_sub(l.checked_rem(sector).unwrap_or(0));
            let len = usize::try_from(to_boundary)
                .unwrap_or(usize::MAX)
                .min(piece.len().saturating_sub(at))
                .max(1);
            units.push((at, len));
            at = at.saturating_add(len);
        }
        let mut state = vec![State::Unread; units.len()];
        let mut first_err = None;
        let mut tmp = Vec::new();
        for copy in 0..chunk.num_copies() {
            let mut i = 0usize;
            while i < units.len() {
                if state.get(i) == Some(&State::Verified) {
                    i = i.saturating_add(1);
                    continue;
                }
                let mut j = i;
                while j < units.len() && state.get(j) != Some(&State::Verified) {
                    j = j.saturating_add(1);
                }
                let (Some(&(start, _)), Some(&(last, last_len))) =
                    (units.get(i), units.get(j.saturating_sub(1)))
                else {
                    break;
                };
                let end = last.saturating_add(last_len);
                let run_pos = pos.checked_add(len64(start)).ok_or_else(|| unmapped(pos))?;
                // Copy 0 reads straight into the piece; later copies into a
                // scratch buffer, so held bytes stay until better ones come.
                let direct = copy == 0;
                let read = if direct {
                    let run = piece.get_mut(start..end).unwrap_or_default();
                    self.read_piece(chunk, run_pos, run, copy)
                } else {
                    tmp.resize(end.saturating_sub(start), 0);
                    self.read_piece(chunk, run_pos, &mut tmp, copy)
                };
                match read {
                    Ok(got) => {
                        for k in i..j {
                            let Some(&(s, l)) = units.get(k) else { break };
                            let rel = s.saturating_sub(start);
                            if rel.saturating_add(l) > got {
                                break;
                            }
                            let ok = {
                                let bytes = if direct {
                                    piece.get(s..s.saturating_add(l))
                                } else {
                                    tmp.get(rel..rel.saturating_add(l))
                                }
                                .unwrap_or_default();
                                verify(s, bytes, copy)
                            };
                            let st = state.get(k).copied().unwrap_or(State::Unread);
                            let keep = ok || st == State::Unread;
                            if keep
                                && !direct
                                && let (Some(dst), Some(src)) = (
                                    piece.get_mut(s..s.saturating_add(l)),
                                    tmp.get(rel..rel.saturating_add(l)),
                                )
                            {
                                dst.copy_from_slice(src);
                            }
                            if let Some(slot) = state.get_mut(k) {
                                if ok {
                                    *slot = State::Verified;
                                } else if keep {
                                    *slot = State::Held;
                                }
                            }
                        }
                    }
                    Err(e) => keep_most_telling(&mut first_err, e),
                }
                i = j;
            }
            if state.iter().all(|s| *s == State::Verified) {
                return Ok(true);
            }
        }
        if state.contains(&State::Unread) {
            return Err(first_err.unwrap_or_else(|| unmapped(pos)));
        }
        Ok(false)
    }

    pub(super) fn read_copy(&self, logical: Logical, buf: &mut [u8], copy: usize) -> Result<()> {
        self.read_pieces(logical, buf, copy, false)
    }

    /// Read `buf` piece by piece (a piece: up to a stripe or chunk
    /// boundary) from copy `copy`; with `fallback`, a piece that copy
    /// cannot give comes from the other copies in order instead.
    pub(super) fn read_pieces(
        &self,
        logical: Logical,
        buf: &mut [u8],
        copy: usize,
        fallback: bool,
    ) -> Result<()> {
        self.each_piece(logical, buf, |chunk, pos, _, rest| {
            match self.read_piece(chunk, pos, rest, copy) {
                Ok(n) => Ok(n),
                Err(e) if fallback => {
                    let mut first_err = Some(e);
                    let others = (0..chunk.num_copies()).filter(|&c| c != copy);
                    for other in others {
                        match self.read_piece(chunk, pos, rest, other) {
                            Ok(n) => return Ok(n),
                            Err(e) => keep_most_telling(&mut first_err, e),
                        }
                    }
                    Err(first_err.unwrap_or_else(|| unmapped(pos)))
                }
                Err(e) => Err(e),
            }
        })
    }

    /// Walk `buf` (the bytes at `logical`) piece by piece: `f(chunk, pos,
    /// done, rest)` handles a piece at `pos` (`done` bytes in) within
    /// `chunk` and returns its length (> 0). Pieces of one chunk reuse it;
    /// only crossing into the next chunk looks up again.
    pub(super) fn each_piece(
        &self,
        logical: Logical,
        buf: &mut [u8],
        mut f: impl FnMut(&ChunkInfo, Logical, usize, &mut [u8]) -> Result<usize>,
    ) -> Result<()> {
        let mut chunk = self.lookup(logical)?;
        let mut done = 0usize;
        while done < buf.len() {
            let pos = logical
                .checked_add(len64(done))
                .ok_or_else(|| unmapped(logical))?;
            if !chunk.contains(pos) {
                chunk = self.lookup(pos)?;
            }
            let rest = buf.get_mut(done..).unwrap_or_default();
            let n = f(chunk, pos, done, rest)?;
            if n == 0 {
                return Err(unmapped(pos));
            }
            done = done.saturating_add(n);
        }
        Ok(())
    }

    /// Every piece from the first copy that can give it.
    pub(super) fn read_logical(&self, logical: Logical, buf: &mut [u8]) -> Result<()> {
        self.read_pieces(logical, buf, 0, true)
    }

    pub(super) fn prefetch_data(&self, logical: Logical, len: u64) {
        SCRATCH.with(|scratch| {
            let mut buf = scratch.borrow_mut();
            buf.resize(usize::try_from(len).unwrap_or(0), 0);
            // Errors are for the demand read to report.
            let _ = self.read_logical(logical, &mut buf);
        });
    }

    /// Read and verify a tree block, trying every copy (uncached).
    pub(super) fn read_block(&self, expect: &BlockExpect) -> Result<TreeBlock> {
        let nodesize = usize::try_from(self.check.nodesize).unwrap_or(usize::MAX);
        let mut failures = Vec::new();
        for copy in 0..self.lookup(expect.logical)?.num_copies() {
            let mut buf = BlockBuf::new(nodesize);
            if let Err(e) = self.read_copy(expect.logical, &mut buf, copy) {
                failures.push(e);
                continue;
            }
            match TreeBlock::new(Arc::new(buf), &self.check, expect) {
                Ok(block) => return Ok(block),
                Err(e) => failures.push(e),
            }
        }
        Err(copies_failed(expect, failures))
    }
}

impl Load for Io {
    type Key = (Logical, Generation);
    type Job = BlockExpect;
    type Value = TreeBlock;

    fn key(job: &BlockExpect) -> (Logical, Generation) {
        (job.logical, job.generation)
    }

    fn load(&self, job: &BlockExpect) -> Result<TreeBlock> {
        self.read_block(job)
    }

    fn weight(block: &TreeBlock) -> usize {
        block.bytes().len()
    }
}

/// The uncached reads (chunk tree bootstrap).
impl BlockSource for Io {
    fn read_block(&self, expect: &BlockExpect) -> Result<TreeBlock> {
        Io::read_block(self, expect)
    }
}

/// Whether a block cached for one expectation also meets `expect` (same
/// address and generation by the cache key): a block shared by snapshots
/// can be reached from another tree.
pub(super) fn fits(block: &TreeBlock, expect: &BlockExpect) -> bool {
    let node = block.node();
    block.tree() == expect.tree
        && node.level() == expect.level
        && expect.first_key.is_none_or(|k| node.key(0) == Some(k))
}

/// The error of a tree block no copy could give: the one failure, or each
/// copy's (a copy on a missing device says which device) — but when every
/// copy is on a missing device, the first of them: giving the devices is
/// what helps.
pub(super) fn copies_failed(expect: &BlockExpect, mut failures: Vec<Error>) -> Error {
    if failures.len() > 1
        && failures
            .iter()
            .all(|e| matches!(e, Error::MissingDevice { .. }))
    {
        failures.truncate(1);
    }
    match failures.len() {
        0 => unmapped(expect.logical),
        1 => failures.swap_remove(0),
        _ => Error::TreeBlockCopies {
            logical: expect.logical,
            tree: expect.tree,
            failures,
        },
    }
}

/// Keep the first error, but prefer any error over "missing device" (a
/// corrupt or unreadable copy says more).
pub(super) fn keep_most_telling(slot: &mut Option<Error>, e: Error) {
    match slot {
        None => *slot = Some(e),
        Some(Error::MissingDevice { .. }) if !matches!(e, Error::MissingDevice { .. }) => {
            *slot = Some(e)
        }
        Some(_) => {}
    }
}

/// The error for a logical address no chunk maps.
pub(super) fn unmapped(logical: Logical) -> Error {
    Error::corrupt(
        Location::Logical(logical),
        CorruptKind::Unmapped { logical },
    )
}
