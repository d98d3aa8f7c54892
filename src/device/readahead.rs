//! Readahead: a small pool of reader threads filling a bounded cache.
//!
//! The cache maps a key (for tree blocks: logical address and generation)
//! to a loaded, verified value. Each key is in one of three states:
//! *queued* (a readahead asked for it, no thread has started), *loading*
//! (one thread is reading it) or *ready*. A key is never loaded twice at
//! once: a demand read ([`Cache::get`]) that finds it loading waits for that
//! read; one that finds it merely queued takes the job over and reads it
//! itself, so a demand never queues behind readahead. A failed readahead
//! leaves no trace: the demand read then retries and reports the error.
//!
//! Readahead requests ([`Cache::prefetch`]) go to a FIFO queue that the
//! worker threads (plain `pread` through [`Device`](super::Device), std
//! threads and a condvar; no io_uring) drain in order, so the caller lists
//! the most urgent blocks first; single requests wake an idle worker
//! once 16 are waiting, a request of several at once.
//! Background tasks ([`Cache::spawn`], used
//! for data prefetch) run only when no block is queued.
//!
//! Memory: the bytes of *ready* values ([`Load::weight`]) stay below
//! [`ReadOptions::cache_bytes`]; values a caller still holds (an `Arc`)
//! live on past eviction. Eviction is CLOCK (second chance): an entry hit
//! since the hand last passed survives one more round, so the top of a tree
//! that every search passes through stays while a long walk streams its
//! leaves through. The layer knows nothing of trees or chunks: the volume
//! supplies a [`Load`] implementation.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};

use crate::error::Result;

/// How a volume reads: cache size, readahead on or off, and how far ahead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadOptions {
    /// Run reader threads and follow the walker's hints (default on). Off,
    /// every block is read on demand by the thread that needs it; the cache
    /// still serves repeated reads.
    pub readahead: bool,
    /// Reader threads (default 4). Reads are I/O-bound, so more threads
    /// than cores help on devices with deep queues.
    pub threads: usize,
    /// How many blocks ahead a tree walk asks for at each level (default
    /// 64: with 16 KiB nodes, 1 MiB per level).
    pub window: usize,
    /// Upper bound on the bytes of cached tree blocks (default
    /// [`DEFAULT_CACHE_MIB`] MiB; the environment variable
    /// `BTRSEND_CACHE_MIB` changes the default, clamped to
    /// [`MIN_CACHE_MIB`]..=[`MAX_CACHE_MIB`]). At least a few windows' worth
    /// (`window × nodesize × tree height × 4`, 16 MiB with 16 KiB nodes)
    /// keeps readahead from evicting what it fetched before it is used.
    pub cache_bytes: usize,
    /// Upper bound on data-prefetch bytes queued and not yet read (default
    /// 64 MiB); prefetch requests beyond it are dropped.
    pub data_queue_bytes: u64,
    /// Read a filesystem some of whose devices were not given, from the
    /// remaining copies (default off: opening it fails naming the missing
    /// devices, as the kernel refuses to mount it without `-o degraded`).
    pub degraded: bool,
}

/// Readahead jobs queued one at a time wake an idle worker only once this
/// many wait (see [`Cache::prefetch`]).
const WAKE_BATCH: usize = 16;

/// The default bound of the block cache, in MiB: with it a send's peak
/// memory stays under 128 MiB whatever the tree's size (measured up to 2M
/// files: `benches/memory-scale`); a larger cache did not make sends
/// faster (the walk reads each block once; readahead feeds it).
pub const DEFAULT_CACHE_MIB: usize = 64;
/// The smallest block cache `BTRSEND_CACHE_MIB` and `--cache-size` give.
pub const MIN_CACHE_MIB: usize = 16;
/// The largest.
pub const MAX_CACHE_MIB: usize = 1 << 20;

/// The defaults; for benchmarks (`benches/read-cold-warm`) the environment
/// can change them: `BTRSEND_READAHEAD=off` (no reader threads) and
/// `BTRSEND_DATA_PREFETCH=0` (block readahead only, no data prefetch).
impl Default for ReadOptions {
    fn default() -> ReadOptions {
        let mut o = ReadOptions {
            readahead: true,
            threads: 4,
            window: 64,
            cache_bytes: DEFAULT_CACHE_MIB << 20,
            data_queue_bytes: 64 << 20,
            degraded: false,
        };
        if std::env::var("BTRSEND_READAHEAD").as_deref() == Ok("off") {
            o.readahead = false;
        }
        if std::env::var("BTRSEND_DATA_PREFETCH").as_deref() == Ok("0") {
            o.data_queue_bytes = 0;
        }
        if let Some(mib) = std::env::var("BTRSEND_CACHE_MIB")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
        {
            o = o.with_cache_mib(mib);
        }
        o
    }
}

impl ReadOptions {
    /// The defaults with readahead off.
    pub fn no_readahead() -> ReadOptions {
        ReadOptions {
            readahead: false,
            ..ReadOptions::default()
        }
    }

    /// These options with [`degraded`](Self::degraded) set to `on`.
    pub fn with_degraded(mut self, on: bool) -> ReadOptions {
        self.degraded = on;
        self
    }

    /// These options with a block cache of `mib` MiB, clamped to
    /// [`MIN_CACHE_MIB`]..=[`MAX_CACHE_MIB`].
    pub fn with_cache_mib(mut self, mib: usize) -> ReadOptions {
        self.cache_bytes = mib.clamp(MIN_CACHE_MIB, MAX_CACHE_MIB) << 20;
        self
    }
}

/// What the cache loads: supplied by the layer that knows the format.
pub trait Load: Send + Sync + 'static {
    /// Identifies a value.
    type Key: Copy + Eq + Hash + Send + fmt::Debug + 'static;
    /// A request: everything needed to load and verify one value.
    type Job: Send + 'static;
    /// What is cached (cheap to clone: an `Arc` inside).
    type Value: Clone + Send + 'static;

    /// The key of a request.
    fn key(job: &Self::Job) -> Self::Key;

    /// Read and verify.
    ///
    /// # Errors
    ///
    /// Whatever the read or the verification says.
    fn load(&self, job: &Self::Job) -> Result<Self::Value>;

    /// Bytes a value holds, for the memory bound.
    fn weight(value: &Self::Value) -> usize;
}

/// Counters, for benchmarks and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Demand reads served from the cache.
    pub hits: u64,
    /// Demand reads that waited for a read in flight.
    pub waits: u64,
    /// Demand reads that read the device themselves.
    pub misses: u64,
    /// Readahead requests queued.
    pub prefetch_queued: u64,
    /// Readahead requests a worker read.
    pub prefetch_loaded: u64,
    /// Readahead reads that failed (the demand read retries).
    pub prefetch_errors: u64,
    /// Readahead requests dropped because the queue was full.
    pub prefetch_dropped: u64,
    /// Values evicted to stay under the memory bound.
    pub evictions: u64,
    /// Background tasks run.
    pub tasks: u64,
}

enum Slot<V> {
    Queued,
    Loading,
    Ready { value: V, referenced: bool },
}

type Task<L> = Box<dyn FnOnce(&L) + Send>;

struct State<L: Load> {
    /// Hashed with foldhash: every tree lookup goes through this map, and
    /// SipHash was a sixth of a small-file send's instructions.
    map: HashMap<L::Key, Slot<L::Value>, foldhash::fast::RandomState>,
    /// Keys of ready entries, the CLOCK hand at the front.
    clock: VecDeque<L::Key>,
    bytes: usize,
    queue: VecDeque<L::Job>,
    tasks: VecDeque<Task<L>>,
    shutdown: bool,
    /// Demand reads waiting on `settled`, and workers waiting on `work`:
    /// a notify costs a system call, so it is skipped when nobody waits.
    waiting_demands: usize,
    idle_workers: usize,
    stats: CacheStats,
}

struct Shared<L: Load> {
    loader: L,
    limit: usize,
    max_queue: usize,
    state: Mutex<State<L>>,
    /// Signalled when an entry leaves the loading state.
    settled: Condvar,
    /// Signalled when work is queued or on shutdown.
    work: Condvar,
}

impl<L: Load> Shared<L> {
    fn lock(&self) -> MutexGuard<'_, State<L>> {
        // A panic while holding the lock leaves consistent state (every
        // mutation is a single step), so poisoning is ignored.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Store a loaded value (the key is in the loading state) and wake
    /// waiters.
    fn settle(&self, st: &mut State<L>, key: L::Key, value: Option<L::Value>) {
        match value {
            Some(value) => {
                let weight = L::weight(&value);
                if weight > self.limit {
                    st.map.remove(&key);
                } else {
                    evict(st, self.limit.saturating_sub(weight));
                    st.bytes = st.bytes.saturating_add(weight);
                    st.map.insert(
                        key,
                        Slot::Ready {
                            value,
                            referenced: false,
                        },
                    );
                    st.clock.push_back(key);
                }
            }
            None => {
                st.map.remove(&key);
            }
        }
        if st.waiting_demands > 0 {
            self.settled.notify_all();
        }
    }
}

/// Evict (CLOCK) until the ready bytes are at most `target`.
fn evict<L: Load>(st: &mut State<L>, target: usize) {
    // Every pass either evicts or clears a reference bit, so two rounds of
    // the ring suffice.
    let mut budget = st.clock.len().saturating_mul(2);
    while st.bytes > target && budget > 0 {
        budget = budget.saturating_sub(1);
        let Some(key) = st.clock.pop_front() else {
            break;
        };
        let weight = match st.map.get_mut(&key) {
            Some(Slot::Ready { referenced, .. }) if *referenced => {
                *referenced = false;
                st.clock.push_back(key);
                continue;
            }
            Some(Slot::Ready { value, .. }) => L::weight(value),
            // Not ready (removed and re-queued since): not ours to evict.
            _ => continue,
        };
        st.bytes = st.bytes.saturating_sub(weight);
        st.map.remove(&key);
        st.stats.evictions = st.stats.evictions.saturating_add(1);
    }
}

/// A bounded cache with an optional pool of reader threads.
pub struct Cache<L: Load> {
    shared: Arc<Shared<L>>,
    workers: Vec<JoinHandle<()>>,
}

impl<L: Load> fmt::Debug for Cache<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("limit", &self.shared.limit)
            .field("workers", &self.workers.len())
            .field("stats", &self.stats())
            .finish()
    }
}

impl<L: Load> Cache<L> {
    /// A cache of at most `options.cache_bytes`, with `options.threads`
    /// reader threads when `options.readahead` is on.
    pub fn new(loader: L, options: &ReadOptions) -> Cache<L> {
        let shared = Arc::new(Shared {
            loader,
            limit: options.cache_bytes,
            // Several windows of every level of a deep tree.
            max_queue: options.window.saturating_mul(16).max(1024),
            state: Mutex::new(State {
                map: HashMap::default(),
                clock: VecDeque::new(),
                bytes: 0,
                queue: VecDeque::new(),
                tasks: VecDeque::new(),
                shutdown: false,
                waiting_demands: 0,
                idle_workers: 0,
                stats: CacheStats::default(),
            }),
            settled: Condvar::new(),
            work: Condvar::new(),
        });
        let threads = if options.readahead {
            options.threads
        } else {
            0
        };
        let workers = (0..threads)
            .filter_map(|i| {
                let shared = Arc::clone(&shared);
                thread::Builder::new()
                    .name(format!("btrsend-read-{i}"))
                    .spawn(move || worker(&shared))
                    // Without threads the cache still works on demand.
                    .ok()
            })
            .collect();
        Cache { shared, workers }
    }

    /// Whether reader threads run.
    pub fn readahead(&self) -> bool {
        !self.workers.is_empty()
    }

    /// The loader.
    pub fn loader(&self) -> &L {
        &self.shared.loader
    }

    /// The value for `job`: from the cache, from a read in flight, or read
    /// now by this thread.
    ///
    /// # Errors
    ///
    /// The load's error (a failed readahead of the same key is retried
    /// here, not reported).
    pub fn get(&self, job: &L::Job) -> Result<L::Value> {
        let key = L::key(job);
        let sh = &*self.shared;
        let mut st = sh.lock();
        loop {
            let state = &mut *st;
            match state.map.get_mut(&key) {
                Some(Slot::Ready { value, referenced }) => {
                    *referenced = true;
                    let value = value.clone();
                    state.stats.hits = state.stats.hits.saturating_add(1);
                    return Ok(value);
                }
                Some(Slot::Loading) => {
                    state.stats.waits = state.stats.waits.saturating_add(1);
                }
                Some(slot) => {
                    // Queued: take the job over; the worker skips it. The
                    // readahead is behind: wake a worker for the rest.
                    *slot = Slot::Loading;
                    if !state.queue.is_empty() && state.idle_workers > 0 {
                        sh.work.notify_one();
                    }
                    break;
                }
                None => {
                    state.map.insert(key, Slot::Loading);
                    break;
                }
            }
            st.waiting_demands = st.waiting_demands.saturating_add(1);
            st = sh.settled.wait(st).unwrap_or_else(PoisonError::into_inner);
            st.waiting_demands = st.waiting_demands.saturating_sub(1);
        }
        st.stats.misses = st.stats.misses.saturating_add(1);
        drop(st);
        let loaded = sh.loader.load(job);
        let mut st = sh.lock();
        match loaded {
            Ok(value) => {
                sh.settle(&mut st, key, Some(value.clone()));
                Ok(value)
            }
            Err(e) => {
                sh.settle(&mut st, key, None);
                Err(e)
            }
        }
    }

    /// The cached value for `key`, if ready; never reads or waits.
    pub fn peek(&self, key: &L::Key) -> Option<L::Value> {
        let mut st = self.shared.lock();
        match st.map.get_mut(key) {
            Some(Slot::Ready { value, referenced }) => {
                *referenced = true;
                Some(value.clone())
            }
            _ => None,
        }
    }

    /// Queue readahead of these jobs, most urgent first. Jobs whose key is
    /// cached or in flight are skipped; without reader threads this does
    /// nothing.
    pub fn prefetch(&self, jobs: impl IntoIterator<Item = L::Job>) {
        if self.workers.is_empty() {
            return;
        }
        let sh = &*self.shared;
        let mut st = sh.lock();
        let mut queued = 0usize;
        for job in jobs {
            let key = L::key(&job);
            if st.map.contains_key(&key) {
                continue;
            }
            if st.queue.len() >= sh.max_queue {
                st.stats.prefetch_dropped = st.stats.prefetch_dropped.saturating_add(1);
                continue;
            }
            st.map.insert(key, Slot::Queued);
            st.queue.push_back(job);
            st.stats.prefetch_queued = st.stats.prefetch_queued.saturating_add(1);
            queued = queued.saturating_add(1);
        }
        // Wake idle workers for a batch of jobs, not for each one: a walk
        // in its stride asks for one block per leaf, far ahead of need,
        // and a wake per block (a futex call here, a sleep and a wake-up
        // on the worker) cost a fifth of a warm send's CPU time. A
        // request of several blocks (a walk starting, a window ramping up)
        // is urgent and wakes workers at once.
        let wake = if queued >= 2 {
            queued
        } else if st.queue.len() >= WAKE_BATCH {
            st.queue.len().div_ceil(WAKE_BATCH)
        } else {
            0
        };
        for _ in 0..wake.min(st.idle_workers) {
            sh.work.notify_one();
        }
    }

    /// Run `task` (given the loader) on a reader thread when no block
    /// readahead is waiting. Returns `false` (and drops the task) without
    /// reader threads.
    pub fn spawn(&self, task: impl FnOnce(&L) + Send + 'static) -> bool {
        if self.workers.is_empty() {
            return false;
        }
        let sh = &*self.shared;
        let mut st = sh.lock();
        st.tasks.push_back(Box::new(task));
        if st.idle_workers > 0 {
            sh.work.notify_one();
        }
        true
    }

    /// Counters so far.
    pub fn stats(&self) -> CacheStats {
        self.shared.lock().stats
    }

    /// Bytes of ready values held now.
    pub fn cached_bytes(&self) -> usize {
        self.shared.lock().bytes
    }

    /// Drop every ready value (in-flight reads finish normally).
    pub fn clear(&self) {
        let mut st = self.shared.lock();
        st.map.retain(|_, slot| !matches!(slot, Slot::Ready { .. }));
        st.clock.clear();
        st.bytes = 0;
    }
}

fn worker<L: Load>(sh: &Shared<L>) {
    let mut st = sh.lock();
    loop {
        if st.shutdown {
            return;
        }
        if let Some(job) = st.queue.pop_front() {
            let key = L::key(&job);
            match st.map.get_mut(&key) {
                Some(slot) if matches!(slot, Slot::Queued) => *slot = Slot::Loading,
                // Taken over by a demand read.
                _ => continue,
            }
            drop(st);
            let loaded = sh.loader.load(&job).ok();
            st = sh.lock();
            if loaded.is_some() {
                st.stats.prefetch_loaded = st.stats.prefetch_loaded.saturating_add(1);
            } else {
                st.stats.prefetch_errors = st.stats.prefetch_errors.saturating_add(1);
            }
            sh.settle(&mut st, key, loaded);
        } else if let Some(task) = st.tasks.pop_front() {
            st.stats.tasks = st.stats.tasks.saturating_add(1);
            drop(st);
            task(&sh.loader);
            st = sh.lock();
        } else {
            st.idle_workers = st.idle_workers.saturating_add(1);
            st = sh.work.wait(st).unwrap_or_else(PoisonError::into_inner);
            st.idle_workers = st.idle_workers.saturating_sub(1);
        }
    }
}

impl<L: Load> Drop for Cache<L> {
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.shutdown = true;
            st.queue.clear();
            st.tasks.clear();
        }
        self.shared.work.notify_all();
        for w in self.workers.drain(..) {
            // A worker that panicked has nothing left to clean up.
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::types::Physical;
    use std::io;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    /// Loads `k` as `[k; 100]`, counting loads; odd keys above 1000 fail;
    /// keys above 2000 sleep first.
    #[derive(Default)]
    struct Counting {
        loads: AtomicU64,
    }

    impl Load for Counting {
        type Key = u64;
        type Job = u64;
        type Value = Arc<[u8]>;

        fn key(job: &u64) -> u64 {
            *job
        }

        fn load(&self, job: &u64) -> Result<Arc<[u8]>> {
            self.loads.fetch_add(1, Ordering::SeqCst);
            if *job > 2000 {
                thread::sleep(Duration::from_millis(50));
            }
            if *job > 1000 && job % 2 == 1 {
                return Err(Error::Io {
                    device: "test".into(),
                    offset: Physical(*job),
                    error: io::Error::other("boom"),
                });
            }
            Ok(Arc::from(vec![u8::try_from(job % 256).unwrap(); 100]))
        }

        fn weight(v: &Arc<[u8]>) -> usize {
            v.len()
        }
    }

    fn opts(readahead: bool, cache_bytes: usize) -> ReadOptions {
        ReadOptions {
            readahead,
            threads: 2,
            window: 8,
            cache_bytes,
            data_queue_bytes: 0,
            degraded: false,
        }
    }

    #[test]
    fn demand_reads_are_cached_and_bounded() {
        let c = Cache::new(Counting::default(), &opts(false, 1000));
        assert!(!c.readahead());
        assert_eq!(c.get(&7).unwrap()[0], 7);
        assert_eq!(c.get(&7).unwrap()[0], 7);
        assert_eq!(c.loader().loads.load(Ordering::SeqCst), 1);
        for k in 0..50 {
            c.get(&k).unwrap();
            assert!(c.cached_bytes() <= 1000);
        }
        let s = c.stats();
        assert_eq!((s.hits, s.misses), (2, 50));
        assert_eq!(s.evictions, 40);
        // Without threads, prefetch and spawn do nothing.
        c.prefetch([100, 101]);
        assert!(!c.spawn(|_| {}));
        assert_eq!(c.stats().prefetch_queued, 0);
    }

    #[test]
    fn clock_keeps_referenced_entries() {
        let c = Cache::new(Counting::default(), &opts(false, 500));
        for k in 0..5 {
            c.get(&k).unwrap();
        }
        // 0 is hit again, then 5 pushes one entry out: not 0.
        c.get(&0).unwrap();
        c.get(&5).unwrap();
        assert!(c.peek(&0).is_some());
        assert!(c.peek(&1).is_none());
        // A value larger than the whole cache is returned, not kept.
        let big = Cache::new(Counting::default(), &opts(false, 10));
        big.get(&3).unwrap();
        assert_eq!(big.cached_bytes(), 0);
    }

    #[test]
    fn prefetch_fills_cache_once_and_failures_are_retried_on_demand() {
        let c = Cache::new(Counting::default(), &opts(true, 1 << 20));
        assert!(c.readahead());
        c.prefetch(0..20);
        // The same keys again are skipped while queued, loading or ready.
        c.prefetch(0..20);
        for k in 0..20 {
            assert_eq!(c.get(&k).unwrap()[0], u8::try_from(k).unwrap());
        }
        assert_eq!(c.loader().loads.load(Ordering::SeqCst), 20);
        // A failing readahead: the demand read retries and reports.
        c.prefetch([1001]);
        let e = c.get(&1001).unwrap_err();
        assert!(e.to_string().contains("boom"), "{e}");
        let s = c.stats();
        assert_eq!(s.prefetch_queued, 21);
        assert!(s.hits + s.misses + s.waits >= 21);
    }

    #[test]
    fn demand_waits_for_a_read_in_flight() {
        let c = Arc::new(Cache::new(Counting::default(), &opts(true, 1 << 20)));
        c.prefetch([2002]);
        // Let a worker start the slow read.
        thread::sleep(Duration::from_millis(10));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let c = Arc::clone(&c);
                thread::spawn(move || c.get(&2002).unwrap()[0])
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), 0xd2); // 2002 % 256
        }
        assert_eq!(c.loader().loads.load(Ordering::SeqCst), 1);
        assert!(c.stats().waits >= 1);
        let ran = Arc::new(AtomicU64::new(0));
        let r = Arc::clone(&ran);
        assert!(c.spawn(move |_| {
            r.store(1, Ordering::SeqCst);
        }));
        for _ in 0..200 {
            if ran.load(Ordering::SeqCst) == 1 {
                break;
            }
            thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        c.clear();
        assert_eq!(c.cached_bytes(), 0);
    }
}
