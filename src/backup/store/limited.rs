//! A store whose traffic goes at most at a [`RateLimit`]: what `backup
//! run --limit-rate` writes to a repository and `backup restore
//! --limit-rate` reads from it. It sits under the encryption, so the
//! bytes counted are the bytes stored. Everything else passes through
//! unchanged.
//!
//! An S3 upload sends whole parts (8 MiB and more, four in flight): the
//! limit holds the writer back, so the parts leave at the rate on average
//! over a part's time, each at the link's speed.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use super::{HeldLock, HoldError, LocalStore, ObjectInfo, Recorded, Store, StoreError, Upload};
use crate::rate::RateLimit;

/// `inner`, its reads and writes limited (see the module docs).
#[derive(Debug)]
pub struct LimitedStore {
    inner: Arc<dyn Store>,
    limit: Arc<RateLimit>,
}

impl LimitedStore {
    /// `inner`, limited by `limit`.
    pub fn new(inner: Arc<dyn Store>, limit: Arc<RateLimit>) -> LimitedStore {
        LimitedStore { inner, limit }
    }

    fn upload(&self, inner: Box<dyn Upload>) -> Box<dyn Upload> {
        Box::new(LimitedUpload {
            inner,
            limit: Arc::clone(&self.limit),
        })
    }
}

impl Store for LimitedStore {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn get(&self, key: &str, range: Option<Range<u64>>) -> Result<Vec<u8>, StoreError> {
        let data = self.inner.get(key, range)?;
        self.limit.take_all(data.len());
        Ok(data)
    }

    fn get_into(&self, key: &str, range: Range<u64>, buf: &mut Vec<u8>) -> Result<(), StoreError> {
        self.inner.get_into(key, range, buf)?;
        self.limit.take_all(buf.len());
        Ok(())
    }

    fn put_if_absent(&self, key: &str, data: &[u8]) -> Result<bool, StoreError> {
        self.limit.take_all(data.len());
        self.inner.put_if_absent(key, data)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        self.inner.list(prefix)
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.inner.delete(key)
    }

    fn multipart(&self, key: &str) -> Result<Box<dyn Upload>, StoreError> {
        Ok(self.upload(self.inner.multipart(key)?))
    }

    fn continue_upload(
        &self,
        tmp: &str,
        keep: u64,
        key: &str,
    ) -> Result<Option<Box<dyn Upload>>, StoreError> {
        Ok(self
            .inner
            .continue_upload(tmp, keep, key)?
            .map(|u| self.upload(u)))
    }

    fn continues_uploads(&self) -> bool {
        self.inner.continues_uploads()
    }

    fn recorded(&self, tmp: &str) -> Result<Option<Recorded>, StoreError> {
        self.inner.recorded(tmp)
    }

    fn completes_as(&self, tmp: &str) -> Option<String> {
        self.inner.completes_as(tmp)
    }

    fn discard_unfinished(&self, key: &str) -> Result<(), StoreError> {
        self.inner.discard_unfinished(key)
    }

    fn plain_len(&self, key: &str, stored: u64) -> Result<u64, StoreError> {
        self.inner.plain_len(key, stored)
    }

    fn write_only(&self) -> bool {
        self.inner.write_only()
    }

    fn check_reachable(&self) -> Result<(), StoreError> {
        self.inner.check_reachable()
    }

    fn reads_back_unfinished(&self) -> bool {
        self.inner.reads_back_unfinished()
    }

    fn append_only(&self) -> bool {
        self.inner.append_only()
    }

    fn init_root(&self) -> Option<Result<(), StoreError>> {
        self.inner.init_root()
    }

    fn hold_lock(
        &self,
        exclusive: bool,
        wait: std::time::Duration,
    ) -> Option<Result<Box<dyn HeldLock>, HoldError>> {
        self.inner.hold_lock(exclusive, wait)
    }

    fn verify_far(&self, wait: std::time::Duration) -> Option<Result<Vec<u8>, HoldError>> {
        self.inner.verify_far(wait)
    }

    fn local_root(&self) -> Option<&Path> {
        self.inner.local_root()
    }

    fn local(&self) -> Option<&LocalStore> {
        self.inner.local()
    }
}

/// An upload whose bytes go at the limit.
struct LimitedUpload {
    inner: Box<dyn Upload>,
    limit: Arc<RateLimit>,
}

impl Upload for LimitedUpload {
    fn write(&mut self, data: &[u8]) -> Result<(), StoreError> {
        let inner = &mut self.inner;
        self.limit.pass(data, |piece| inner.write(piece))
    }

    fn complete(self: Box<Self>) -> Result<(), StoreError> {
        self.inner.complete()
    }

    fn keep_when_dropped(&mut self) {
        self.inner.keep_when_dropped();
    }

    fn records_state(&self) -> bool {
        self.inner.records_state()
    }

    fn write_resumable(
        &mut self,
        data: &[u8],
        state: &mut dyn FnMut() -> Option<String>,
    ) -> Result<(), StoreError> {
        // Whole, with its state: a resumable write ends at a frame.
        self.limit.take_all(data.len());
        self.inner.write_resumable(data, state)
    }

    fn stored_size(&self, plain: u64) -> u64 {
        self.inner.stored_size(plain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every call reaches the store below, continuing an upload too.
    #[test]
    fn everything_passes_through() {
        let dir = tempfile::tempdir().unwrap();
        let local: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()));
        let s = LimitedStore::new(Arc::clone(&local), Arc::new(RateLimit::new(1 << 40)));
        assert_eq!(s.local_root(), Some(dir.path()));
        assert!(s.continues_uploads());
        assert!(s.put_if_absent("config", b"c").unwrap());
        assert_eq!(s.get("config", None).unwrap(), b"c");
        let mut up = s.multipart("streams/a").unwrap();
        up.keep_when_dropped();
        up.write(&vec![7; 200_000]).unwrap();
        drop(up);
        let tmp = s.list("tmp/").unwrap();
        assert_eq!(tmp.len(), 1);
        assert_eq!(tmp[0].size, 200_000, "kept when dropped");
        let mut up = s
            .continue_upload(&tmp[0].key, 100_000, "streams/a")
            .unwrap()
            .unwrap();
        let mut called = false;
        up.write_resumable(b"end", &mut || {
            called = true;
            None
        })
        .unwrap();
        up.complete().unwrap();
        let mut buf = Vec::new();
        s.get_into("streams/a", 99_999..100_003, &mut buf).unwrap();
        assert_eq!(buf, [7, b'e', b'n', b'd']);
        assert!(!called, "a directory records no state");
        s.delete("streams/a").unwrap();
        assert!(local.list("streams/").unwrap().is_empty());
    }
}
