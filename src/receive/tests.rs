//! The read-ahead thread's blocks and [`discard`](super::discard).

use super::driver::BLOCK;
use super::*;

/// A reader that returns at most `step` bytes per read, then `err` (if
/// any) instead of the end.
struct Choppy {
    data: Vec<u8>,
    pos: usize,
    step: usize,
    err: bool,
}

impl Read for Choppy {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.data.len() - self.pos;
        if left == 0 && self.err {
            return Err(io::Error::other("broken input"));
        }
        let n = buf.len().min(self.step).min(left);
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[test]
fn discard_removes_a_directory_mode_resume_point_with_its_journal_and_trash() {
    let d = tempfile::tempdir().unwrap();
    if subvol_mode_possible(d.path()) {
        return;
    }
    let points = d.path().join(RESUME_DIR).join("s");
    std::fs::create_dir_all(points.join("trash-5/t0/deep")).unwrap();
    std::fs::write(points.join("trash-5/t0/deep/f"), b"x").unwrap();
    std::fs::write(points.join("undo-5"), b"bsundo01").unwrap();
    std::fs::write(points.join("state"), b"token").unwrap();
    std::fs::create_dir_all(d.path().join("s/a")).unwrap();
    discard(d.path(), b"s").unwrap();
    assert!(!d.path().join(RESUME_DIR).exists());
    assert!(!d.path().join("s").exists());
}

fn data(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 4099) as u8).collect()
}

#[test]
fn read_ahead_passes_every_byte_in_order() {
    // Over several blocks, with buffers reused: full-block reads, short
    // (pipe-like) reads, and readers asking for odd sizes.
    let want = data(3 * BLOCK + 12345);
    for (step, ask) in [(usize::MAX, 10), (65536, 131_094), (1000, 3 * BLOCK)] {
        let input = Choppy {
            data: want.clone(),
            pos: 0,
            step,
            err: false,
        };
        let got = with_read_ahead(input, |mut b| {
            let mut got = Vec::new();
            let mut buf = vec![0; ask];
            loop {
                let n = b.read(&mut buf).unwrap();
                if n == 0 {
                    break got;
                }
                got.extend_from_slice(&buf[..n]);
            }
        });
        assert!(got == want, "step {step} ask {ask}: {} bytes", got.len());
    }
}

#[test]
fn read_ahead_passes_errors_and_stops_early() {
    let input = Choppy {
        data: data(BLOCK + 5),
        pos: 0,
        step: usize::MAX,
        err: true,
    };
    let e = with_read_ahead(input, |mut b| {
        let mut v = Vec::new();
        b.read_to_end(&mut v).unwrap_err()
    });
    assert_eq!(e.to_string(), "broken input");
    // The decoder stops after a few bytes of a long input: the reader
    // thread ends (this returns) without reading it all.
    let input = Choppy {
        data: data(64 * BLOCK),
        pos: 0,
        step: usize::MAX,
        err: false,
    };
    let first = with_read_ahead(input, |mut b| {
        let mut x = [0u8; 4];
        b.read_exact(&mut x).unwrap();
        x
    });
    assert_eq!(first.to_vec(), data(4));
}
