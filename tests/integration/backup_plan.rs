//! The progress plan of `backup run` (the bar over the whole run): before
//! storing anything it announces how many snapshots it stores and the size
//! of all their streams, which must be the size of the kernel's streams of
//! the same chain (`btrfs send` of s1, then `-p s1 s2`, then `-p s2 s3`,
//! stored in the fixture), and the stream bytes it then reports must add up
//! to exactly that.

use std::sync::Mutex;

use btrsend::backup::{self, Entry, Kind, Repository, RunOptions};

use crate::reader::fixtures;
use crate::send::read_zst;

#[derive(Default)]
struct Recorder {
    plan: Mutex<Vec<(usize, u64)>>,
    starts: Mutex<Vec<(String, Kind, u64)>>,
    stream: Mutex<u64>,
}

impl backup::Progress for Recorder {
    fn plan(&self, snapshots: usize, stream_bytes: u64) {
        self.plan.lock().unwrap().push((snapshots, stream_bytes));
    }
    fn start(&self, path: &str, kind: Kind, stream_total: u64) {
        self.starts
            .lock()
            .unwrap()
            .push((path.to_owned(), kind, stream_total));
    }
    fn stream(&self, bytes: u64) {
        *self.stream.lock().unwrap() += bytes;
    }
    fn wants_total(&self) -> bool {
        true
    }
}

#[test]
fn run_plan_is_the_size_of_the_kernels_streams() {
    let Some(fx) = fixtures()
        .into_iter()
        .find(|f| f.name() == "014-incremental")
    else {
        btrsend::testing::skip_or_fail(
            "run_plan_is_the_size_of_the_kernels_streams",
            "fixture 014-incremental not unpacked",
        );
        return;
    };
    let kernel = |name: &str| read_zst(&fx.dir.join(format!("{name}.v1.stream.zst"))).len() as u64;
    let sizes = [
        kernel("s1.full"),
        kernel("s1--s2.inc"),
        kernel("s2--s3.inc"),
    ];
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("repo").display().to_string();
    let repo = Repository::init(&spec).unwrap();
    let opts = RunOptions::new().with_devices(fx.devices.clone());
    let rec = Recorder::default();
    let report = repo.run(&[String::from("snaps/s*")], &opts, &rec).unwrap();
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    let stored: Vec<&Entry> = report.stored.iter().collect();
    assert_eq!(stored.len(), 3);
    assert_eq!(
        *rec.plan.lock().unwrap(),
        vec![(3, sizes.iter().sum::<u64>())],
        "the plan: three streams as large as the kernel's"
    );
    let starts = rec.starts.lock().unwrap().clone();
    let per: Vec<u64> = starts.iter().map(|s| s.2).collect();
    assert_eq!(per, sizes, "each snapshot's estimate");
    assert_eq!(
        starts.iter().map(|s| s.1).collect::<Vec<_>>(),
        vec![Kind::Full, Kind::Incremental, Kind::Incremental]
    );
    assert_eq!(*rec.stream.lock().unwrap(), sizes.iter().sum::<u64>());
    assert_eq!(
        stored.iter().map(|e| e.stream_bytes).collect::<Vec<_>>(),
        sizes
    );
    // A second run stores nothing and plans nothing to store.
    let rec = Recorder::default();
    let report = repo.run(&[String::from("snaps/s*")], &opts, &rec).unwrap();
    assert!(report.stored.is_empty());
    assert_eq!(*rec.plan.lock().unwrap(), vec![(0, 0)]);
    // --full-every 2 on a new repository: s1 full, s2 incremental, s3 full
    // again (its chain would be three long), and the plan knows it.
    let spec2 = dir.path().join("repo2").display().to_string();
    let repo2 = Repository::init(&spec2).unwrap();
    let rec = Recorder::default();
    let opts2 = opts.clone().with_full_every(2);
    repo2
        .run(&[String::from("snaps/s*")], &opts2, &rec)
        .unwrap();
    let s3_full = kernel("s3.full");
    assert_eq!(
        *rec.plan.lock().unwrap(),
        vec![(3, sizes[0] + sizes[1] + s3_full)]
    );
    assert_eq!(*rec.stream.lock().unwrap(), sizes[0] + sizes[1] + s3_full);
}
