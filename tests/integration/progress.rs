//! The core's one progress interface (issue 16), as a send reports it: one
//! `subvol_start` with the snapshot's path first, one `subvol_done`
//! (complete) last, and `data` adding up to the file data of the kernel's
//! own stream of that snapshot (the sum of its WRITE lengths: fixture
//! 001-basic has no clones or encoded writes in v1).

use std::sync::Mutex;

use btrsend::fs::Filesystem;
use btrsend::progress::Progress;
use btrsend::send::{self, SendOptions};
use btrsend::stream_format::{Command, StreamReader};

use crate::reader::fixtures;
use crate::send::read_zst;

#[derive(Default)]
struct Log {
    events: Mutex<Vec<String>>,
    data: Mutex<u64>,
}

impl Progress for Log {
    fn subvol_start(&self, name: &[u8], incremental: bool) {
        let name = String::from_utf8_lossy(name);
        self.events
            .lock()
            .unwrap()
            .push(format!("start {name} {incremental}"));
    }
    fn subvol_done(&self, name: &[u8], complete: bool) {
        let name = String::from_utf8_lossy(name);
        self.events
            .lock()
            .unwrap()
            .push(format!("done {name} {complete}"));
    }
    fn data(&self, bytes: u64) {
        *self.data.lock().unwrap() += bytes;
    }
}

#[test]
fn send_reports_subvolume_and_the_kernels_data_bytes() {
    let Some(fx) = fixtures().into_iter().find(|f| f.name() == "001-basic") else {
        panic!("fixture 001-basic missing");
    };
    let kernel = read_zst(&fx.dir.join("basic.full.v1.stream.zst"));
    let mut reader = StreamReader::new(kernel.as_slice());
    let mut written = 0u64;
    while let Some((_, cmd)) = reader.next_command().unwrap() {
        if let Command::Write { data, .. } = cmd {
            written += data.len() as u64;
        }
    }
    assert!(written > 0);
    let fs = Filesystem::open(&fx.devices).unwrap();
    let sv = send::find_subvolume(&fs, "snaps/basic").unwrap();
    let log = Log::default();
    send::send_full(&fs, &sv, Vec::new(), SendOptions::new(1), &log).unwrap();
    assert_eq!(
        *log.events.lock().unwrap(),
        ["start snaps/basic false", "done snaps/basic true"]
    );
    assert_eq!(*log.data.lock().unwrap(), written);
}
