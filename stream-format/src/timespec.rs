//! `struct btrfs_timespec` as the stream carries it (UTIMES, SUBVOL times):
//! twelve little-endian bytes. It owns the wire form only; what a time
//! means to a filesystem is the receiver's business.

/// `struct btrfs_timespec`: seconds and nanoseconds since the epoch.
///
/// `sec` is stored unsigned on the wire; the receiver treats it as a signed
/// `time_t` (see [`Timespec::sec_signed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Timespec {
    /// Seconds (two's complement for times before 1970).
    pub sec: u64,
    /// Nanoseconds; not range-checked on the wire.
    pub nsec: u32,
}

impl Timespec {
    /// Wire size in bytes.
    pub const SIZE: usize = 12;

    /// Seconds as the receiver's signed `time_t`.
    pub const fn sec_signed(self) -> i64 {
        i64::from_le_bytes(self.sec.to_le_bytes())
    }

    /// The 12 wire bytes.
    pub fn to_bytes(self) -> [u8; 12] {
        let mut b = [0; 12];
        let (s, n) = b.split_at_mut(8);
        s.copy_from_slice(&self.sec.to_le_bytes());
        n.copy_from_slice(&self.nsec.to_le_bytes());
        b
    }

    /// Parse the 12 wire bytes.
    pub fn from_bytes(b: [u8; 12]) -> Timespec {
        let [s0, s1, s2, s3, s4, s5, s6, s7, n0, n1, n2, n3] = b;
        Timespec {
            sec: u64::from_le_bytes([s0, s1, s2, s3, s4, s5, s6, s7]),
            nsec: u32::from_le_bytes([n0, n1, n2, n3]),
        }
    }
}
