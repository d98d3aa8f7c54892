//! [`S3Upload`]: a stream file as an S3 multipart upload, with its marker
//! object in `tmp/` and the recorder task that writes the state a
//! continuation needs into the marker as parts are acknowledged (see the
//! parent module's docs).
//!
//! Async code stays here and in the parent module: the upload blocks on
//! the store's runtime, so the writer that feeds it is synchronous.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use object_store::aws::AmazonS3;
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{MultipartId, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::task::JoinHandle;

use super::S3Store;
use crate::backup::store::{Store, StoreError, Upload};

/// The smallest part (S3 needs 5 MiB for all parts but the last).
pub(super) const PART_BYTES: usize = 8 << 20;
/// Parts uploaded at the same time.
pub(super) const IN_FLIGHT: usize = 4;
/// How a marker of an unfinished upload ends.
pub(super) const MARKER_SUFFIX: &str = ".upload";

/// A marker object: which upload to abort if it is found unfinished, and
/// what a continuation needs (the parts stored, in order, and the state
/// given with the last of them).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Marker {
    pub(super) key: String,
    pub(super) upload_id: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) parts: Vec<StoredPart>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) state: Option<String>,
}

/// A part stored: its ETag and length.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct StoredPart {
    pub(super) etag: String,
    pub(super) size: u64,
}

/// A part the server acknowledged, for the recorder.
struct Acked {
    index: usize,
    etag: String,
    size: u64,
    state: Option<String>,
}

/// A multipart upload in progress.
pub(super) struct S3Upload {
    store: S3Store,
    key: String,
    path: Path,
    /// The upload's id, until it is completed or aborted.
    id: Option<MultipartId>,
    /// The marker object naming the upload.
    marker: String,
    buf: Vec<u8>,
    /// The parts uploaded, in order.
    parts: Vec<PartId>,
    in_flight: VecDeque<JoinHandle<object_store::Result<PartId>>>,
    /// Where the part tasks report what the server acknowledged, and the
    /// task that records it in the marker (until the upload ends).
    acked: Option<UnboundedSender<Acked>>,
    recorder: Option<JoinHandle<()>>,
    /// Leave the upload and its marker for a later run when dropped
    /// unfinished.
    keep: bool,
}

impl S3Upload {
    /// The upload `m` names (its parts stored already, if it continues
    /// one), with its marker `marker`.
    pub(super) fn start(store: S3Store, m: Marker, marker: String) -> S3Upload {
        // Both keys were checked by the caller (multipart, continue_upload).
        let path = store.path_unchecked(&m.key);
        let parts = m
            .parts
            .iter()
            .map(|p| PartId {
                content_id: p.etag.clone(),
            })
            .collect();
        let (tx, rx) = unbounded_channel();
        let recorder = store.rt.spawn(record(
            Arc::clone(&store.s3),
            store.path_unchecked(&marker),
            m.clone(),
            rx,
        ));
        S3Upload {
            key: m.key,
            path,
            id: Some(m.upload_id),
            marker,
            buf: Vec::new(),
            parts,
            in_flight: VecDeque::new(),
            acked: Some(tx),
            recorder: Some(recorder),
            keep: false,
            store,
        }
    }

    fn part_bytes(&self) -> usize {
        PART_BYTES.saturating_mul(1 + (self.parts.len() + self.in_flight.len()) / 1000)
    }

    fn err(&self, op: &'static str, e: object_store::Error) -> StoreError {
        self.store.err(op, &self.key, e)
    }

    /// Wait for the oldest part in flight.
    fn wait_one(&mut self) -> Result<(), StoreError> {
        let Some(h) = self.in_flight.pop_front() else {
            return Ok(());
        };
        match self.store.rt.block_on(h) {
            Ok(Ok(part)) => {
                self.parts.push(part);
                Ok(())
            }
            Ok(Err(e)) => Err(self.err("upload part of", e)),
            Err(e) => Err(StoreError::Other {
                op: "upload part of",
                location: self.store.location(&self.key),
                error: Box::new(e),
            }),
        }
    }

    /// Upload `part` as the next part; `state` is what a continuation
    /// needs at its end, recorded once it and the parts before it are
    /// stored.
    fn send_part(&mut self, part: Vec<u8>, state: Option<String>) -> Result<(), StoreError> {
        let Some(id) = self.id.clone() else {
            return Ok(());
        };
        let idx = self.parts.len() + self.in_flight.len();
        let s3 = Arc::clone(&self.store.s3);
        let path = self.path.clone();
        let size = part.len() as u64;
        let payload = PutPayload::from(part);
        let acked = self.acked.clone();
        let h = self.store.rt.spawn(async move {
            let res = s3.put_part(&path, &id, idx, payload).await;
            if let (Ok(p), Some(tx)) = (&res, acked) {
                let _ = tx.send(Acked {
                    index: idx,
                    etag: p.content_id.clone(),
                    size,
                    state,
                });
            }
            res
        });
        self.in_flight.push_back(h);
        while self.in_flight.len() > IN_FLIGHT {
            self.wait_one()?;
        }
        Ok(())
    }

    /// Stop recording: wait until the recorder wrote what it was told.
    fn stop_recording(&mut self) {
        self.acked = None;
        if let Some(r) = self.recorder.take() {
            let _ = self.store.rt.block_on(r);
        }
    }
}

/// The recorder of an upload: as the server acknowledges parts (in any
/// order), it rewrites the marker `m` (at `marker`) with the parts stored
/// in order and the state given with the last of them that has one, so
/// that a later run can continue from there.
async fn record(s3: Arc<AmazonS3>, marker: Path, mut m: Marker, mut rx: UnboundedReceiver<Acked>) {
    let mut pending: BTreeMap<usize, Acked> = BTreeMap::new();
    // Parts stored in order (those of the marker first).
    let mut stored = m.parts.clone();
    while let Some(a) = rx.recv().await {
        pending.insert(a.index, a);
        let mut advanced = false;
        while let Some(a) = pending.remove(&stored.len()) {
            stored.push(StoredPart {
                etag: a.etag,
                size: a.size,
            });
            if let Some(state) = a.state {
                m.parts = stored.clone();
                m.state = Some(state);
                advanced = true;
            }
        }
        if advanced && let Ok(body) = serde_json::to_vec(&m) {
            // A failed write leaves the previous state, still true.
            let _ = s3.put(&marker, PutPayload::from(body)).await;
        }
    }
}

impl Upload for S3Upload {
    fn write(&mut self, data: &[u8]) -> Result<(), StoreError> {
        self.buf.extend_from_slice(data);
        while self.buf.len() >= self.part_bytes() {
            let rest = self.buf.split_off(self.part_bytes());
            let part = std::mem::replace(&mut self.buf, rest);
            self.send_part(part, None)?;
        }
        Ok(())
    }

    fn records_state(&self) -> bool {
        true
    }

    fn write_resumable(
        &mut self,
        data: &[u8],
        state: &mut dyn FnMut() -> Option<String>,
    ) -> Result<(), StoreError> {
        // A part ends only where the writer can be continued: at the end of
        // the write that fills it.
        self.buf.extend_from_slice(data);
        if self.buf.len() >= self.part_bytes() {
            let part = std::mem::take(&mut self.buf);
            self.send_part(part, state())?;
        }
        Ok(())
    }

    fn complete(mut self: Box<Self>) -> Result<(), StoreError> {
        if !self.buf.is_empty() || self.parts.is_empty() && self.in_flight.is_empty() {
            let part = std::mem::take(&mut self.buf);
            self.send_part(part, None)?;
        }
        while !self.in_flight.is_empty() {
            self.wait_one()?;
        }
        if self.store.exists(&self.key)? {
            return Err(StoreError::Exists {
                location: self.store.location(&self.key),
            });
        }
        let Some(id) = self.id.clone() else {
            return Ok(());
        };
        self.stop_recording();
        let parts = std::mem::take(&mut self.parts);
        self.store
            .rt
            .block_on(self.store.s3.complete_multipart(&self.path, &id, parts))
            .map_err(|e| self.err("complete upload of", e))?;
        self.id = None;
        // The object is complete; a marker left behind only costs the next
        // run an abort that finds nothing.
        let _ = self.store.delete(&self.marker);
        Ok(())
    }

    fn keep_when_dropped(&mut self) {
        self.keep = true;
    }
}

impl Drop for S3Upload {
    fn drop(&mut self) {
        if self.keep && self.id.is_some() {
            // Kept for the next run: let the parts in flight be stored and
            // recorded (an error of one only ends what is recorded).
            for h in self.in_flight.drain(..) {
                let _ = self.store.rt.block_on(h);
            }
            self.stop_recording();
            return;
        }
        for h in self.in_flight.drain(..) {
            h.abort();
        }
        self.stop_recording();
        if let Some(id) = self.id.take() {
            // Not completed: abort, so that no part stays behind; the marker
            // goes only when the abort worked (else the next run retries).
            let aborted = self
                .store
                .rt
                .block_on(self.store.s3.abort_multipart(&self.path, &id));
            if aborted.is_ok() {
                let _ = self.store.delete(&self.marker);
            }
        }
    }
}
