//! A bandwidth limit (`--limit-rate`): at most a given number of bytes per
//! second on average, so that a nightly job leaves room on an uplink.
//!
//! A virtual clock: each byte taken moves the time at which the link is
//! next free by `1 / rate` seconds, and a taker sleeps until then. After
//! an idle spell the clock may lag the real one by [`BURST`] at most, so a
//! writer that was idle sends that much at once and never more. Writers
//! hand their bytes over in pieces of at most [`PIECE`] bytes (see
//! [`Limited`]), which keeps the flow smooth at any rate above a few
//! hundred KB/s: a piece of 64 KiB at 1 MB/s is 65 ms.

use std::io::{self, Write};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How far the virtual clock may lag: the burst after an idle spell.
pub const BURST: Duration = Duration::from_millis(100);
/// The largest piece taken at once.
pub const PIECE: usize = 64 << 10;

/// A limit shared by every writer of one command.
#[derive(Debug)]
pub struct RateLimit {
    rate: u64,
    clock: Mutex<Clock>,
}

/// The virtual clock, in time since the limit was made.
#[derive(Debug)]
struct Clock {
    start: Instant,
    /// When the bytes taken so far have gone, at the rate.
    free_at: Duration,
}

impl Clock {
    /// Take `n` bytes at `now`: how long to wait before they may go.
    fn take(&mut self, rate: u64, now: Duration, n: u64) -> Duration {
        let floor = now.saturating_sub(BURST);
        if self.free_at < floor {
            self.free_at = floor;
        }
        // At most a few PIECEs at a time: no overflow in f64 seconds.
        self.free_at += Duration::from_secs_f64(n as f64 / rate as f64);
        self.free_at.saturating_sub(now)
    }
}

impl RateLimit {
    /// A limit of `rate` bytes per second (at least 1).
    pub fn new(rate: u64) -> RateLimit {
        RateLimit {
            rate: rate.max(1),
            clock: Mutex::new(Clock {
                start: Instant::now(),
                free_at: Duration::ZERO,
            }),
        }
    }

    /// The rate, in bytes per second.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Wait until `n` more bytes may go. Takers share the clock: the
    /// waits of several threads add up to the rate.
    pub fn take(&self, n: usize) {
        let wait = {
            let mut c = self.clock.lock().unwrap_or_else(PoisonError::into_inner);
            let now = c.start.elapsed();
            c.take(self.rate, now, n as u64)
        };
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }

    /// Wait until `n` more bytes may go, taken piece by piece as a writer
    /// of them would (for bytes that went, or go, in one call).
    pub fn take_all(&self, n: usize) {
        let mut left = n;
        while left > 0 {
            let piece = left.min(PIECE);
            self.take(piece);
            left -= piece;
        }
    }

    /// Take `data` piece by piece, calling `each` on every piece once it
    /// may go.
    ///
    /// # Errors
    ///
    /// The first error of `each`.
    pub fn pass<E>(
        &self,
        data: &[u8],
        mut each: impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        for piece in data.chunks(PIECE) {
            self.take(piece.len());
            each(piece)?;
        }
        Ok(())
    }
}

/// A writer whose bytes go at most at a [`RateLimit`].
#[derive(Debug)]
pub struct Limited<W> {
    inner: W,
    limit: Arc<RateLimit>,
}

impl<W: Write> Limited<W> {
    /// `inner`, limited by `limit`.
    pub fn new(inner: W, limit: Arc<RateLimit>) -> Limited<W> {
        Limited { inner, limit }
    }
}

impl<W: Write> Write for Limited<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(PIECE);
        self.limit.take(n);
        self.inner.write_all(&buf[..n])?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Parse a rate as `--limit-rate` takes it: bytes per second, a whole
/// number with an optional suffix `K`, `M`, `G` or `T` (powers of 1024,
/// as curl and rsync read them; lower case too, a trailing `B` or `/s`
/// allowed).
///
/// # Errors
///
/// What is wrong with it.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix("/s").unwrap_or(t);
    let t = t
        .strip_suffix('B')
        .or_else(|| t.strip_suffix('b'))
        .unwrap_or(t);
    let (digits, shift) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 30),
        Some('t' | 'T') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let bad = || format!("invalid rate {s:?}: give bytes per second, e.g. 500K, 10M or 1G");
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let rate = n.checked_mul(1 << shift).ok_or_else(bad)?;
    if rate == 0 {
        return Err(format!("invalid rate {s:?}: it must be more than 0"));
    }
    Ok(rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_as_curl_reads_them() {
        for (s, want) in [
            ("1", 1),
            ("500K", 500 << 10),
            ("10M", 10 << 20),
            ("10m", 10 << 20),
            ("2G", 2 << 30),
            ("1T", 1 << 40),
            ("16MB", 16 << 20),
            ("16M/s", 16 << 20),
        ] {
            assert_eq!(parse_rate(s), Ok(want), "{s}");
        }
        for s in [
            "",
            "0",
            "0M",
            "M",
            "1.5M",
            "-1",
            "10X",
            "99999999999999999999",
            "17000000T",
        ] {
            assert!(parse_rate(s).is_err(), "{s}");
        }
    }

    /// Times are simulated: the clock is driven by hand, nothing sleeps.
    #[test]
    fn the_clock_keeps_the_average_and_bounds_bursts() {
        let rate = 1 << 20;
        let mut c = Clock {
            start: Instant::now(),
            free_at: Duration::ZERO,
        };
        // A writer that always has data: 64 MiB in pieces, each sent when
        // its wait is over, takes 64 s less the initial burst.
        let mut now = Duration::ZERO;
        for _ in 0..1024 {
            now += c.take(rate, now, PIECE as u64);
        }
        let secs = now.as_secs_f64();
        assert!((63.8..64.01).contains(&secs), "{secs}");
        // After 10 s idle, only BURST worth goes without a wait.
        now += Duration::from_secs(10);
        let mut free = 0u64;
        while c.take(rate, now, 1024).is_zero() {
            free += 1024;
        }
        let burst = BURST.as_secs_f64() * rate as f64;
        assert!(
            (free as f64 - burst).abs() <= 1024.0,
            "{free} bytes free after idling, BURST is {burst}"
        );
    }

    #[test]
    fn a_limited_writer_passes_every_byte() {
        let limit = Arc::new(RateLimit::new(1 << 40));
        let mut w = Limited::new(Vec::new(), limit);
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        w.write_all(&data).unwrap();
        w.flush().unwrap();
        assert!(w.inner == data);
    }
}
