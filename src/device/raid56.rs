//! RAID5/6 parity arithmetic: rebuild missing data strips of one row.
//!
//! Facts from Linux `fs/btrfs/raid56.c` (btrfs follows the Linux md RAID-6
//! convention): `P = D0 ⊕ D1 ⊕ … ⊕ D(nd−1)`, `Q = Σ g^i · D_i` over
//! GF(2^8) with generator `g = 2` and reduction polynomial `0x11d`, `i` the
//! data column in logical order. With P one missing column is the XOR of the
//! others; with Q alone, `D_x = (Q ⊕ Q_x) · g^−x` where `Q_x` is Q over the
//! columns present; with P and Q two missing columns `x < y` solve
//! `A = D_x ⊕ D_y`, `B = g^x·D_x ⊕ g^y·D_y`:
//! `D_x = (B ⊕ g^y·A) / (g^x ⊕ g^y)`, `D_y = A ⊕ D_x` (textbook
//! Reed–Solomon; no upstream code is used). Only the rare path of a failed
//! read runs this, so it favours clarity over SIMD.

/// GF(2^8) exponentials (twice over, so a sum of two logarithms needs no
/// reduction) and logarithms for generator 2, polynomial 0x11d.
const TABLES: ([u8; 512], [u8; 256]) = {
    let mut exp = [0u8; 512];
    let mut log = [0u8; 256];
    let mut x: u16 = 1;
    let mut i = 0;
    while i < 255 {
        // Both fit in a byte: x < 256 after each reduction, i < 255.
        exp[i] = x as u8;
        exp[i + 255] = x as u8;
        log[x as usize] = i as u8;
        x <<= 1;
        if x & 0x100 != 0 {
            x ^= 0x11d;
        }
        i += 1;
    }
    (exp, log)
};

fn exp(i: usize) -> u8 {
    TABLES.0[i % 255]
}

fn log(a: u8) -> usize {
    usize::from(TABLES.1[usize::from(a)])
}

/// `a · b` in GF(2^8).
pub fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        0
    } else {
        exp(log(a) + log(b))
    }
}

/// `a^−1` in GF(2^8) (`a ≠ 0`; 0 maps to 0).
pub fn inv(a: u8) -> u8 {
    if a == 0 { 0 } else { exp(255 - log(a)) }
}

/// `g^i`.
pub fn pow2(i: usize) -> u8 {
    exp(i)
}

/// `dst ^= c · src`, bytewise.
fn mul_acc(dst: &mut [u8], src: &[u8], c: u8) {
    let table: [u8; 256] = std::array::from_fn(|b| mul(c, u8::try_from(b).unwrap_or(0)));
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= table[usize::from(*s)];
    }
}

fn xor_into(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= s;
    }
}

/// P and Q of these data columns (all the same length).
pub fn parity(data: &[&[u8]]) -> (Vec<u8>, Vec<u8>) {
    let len = data.first().map_or(0, |d| d.len());
    let mut p = vec![0u8; len];
    let mut q = vec![0u8; len];
    for (i, d) in data.iter().enumerate() {
        xor_into(&mut p, d);
        mul_acc(&mut q, d, pow2(i));
    }
    (p, q)
}

/// Why a rebuild cannot proceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RebuildError {
    /// More columns are missing than the parity given can restore.
    TooManyMissing,
    /// A column or parity buffer has the wrong length.
    Length,
}

/// Restore the data columns whose index is in `missing` (their buffers'
/// contents are ignored and overwritten) from the other columns and the
/// parity given: one column from P or from Q, two from P and Q.
///
/// # Errors
///
/// [`RebuildError::TooManyMissing`] when the parity given cannot restore
/// that many columns, [`RebuildError::Length`] on mismatched buffers.
pub fn rebuild(
    cols: &mut [Vec<u8>],
    missing: &[usize],
    p: Option<&[u8]>,
    q: Option<&[u8]>,
) -> Result<(), RebuildError> {
    let len = cols.first().map_or(0, Vec::len);
    if cols.iter().any(|c| c.len() != len)
        || p.is_some_and(|p| p.len() != len)
        || q.is_some_and(|q| q.len() != len)
        || missing.iter().any(|&m| m >= cols.len())
    {
        return Err(RebuildError::Length);
    }
    let present = |i: usize| !missing.contains(&i);
    // P and Q over the columns present.
    let partial_p = || {
        let mut a = p.map(<[u8]>::to_vec)?;
        for (_, c) in cols.iter().enumerate().filter(|(i, _)| present(*i)) {
            xor_into(&mut a, c);
        }
        Some(a)
    };
    let partial_q = || {
        let mut b = q.map(<[u8]>::to_vec)?;
        for (i, c) in cols.iter().enumerate().filter(|(i, _)| present(*i)) {
            mul_acc(&mut b, c, pow2(i));
        }
        Some(b)
    };
    match *missing {
        [] => Ok(()),
        [x] => {
            if let Some(a) = partial_p() {
                cols[x] = a;
            } else if let Some(b) = partial_q() {
                // b = g^x · D_x.
                let mut d = vec![0u8; len];
                mul_acc(&mut d, &b, inv(pow2(x)));
                cols[x] = d;
            } else {
                return Err(RebuildError::TooManyMissing);
            }
            Ok(())
        }
        [m1, m2] if m1 != m2 => {
            let (x, y) = (m1.min(m2), m1.max(m2));
            let (Some(a), Some(b)) = (partial_p(), partial_q()) else {
                return Err(RebuildError::TooManyMissing);
            };
            // D_x = (B ⊕ g^y·A) / (g^x ⊕ g^y); g^x ≠ g^y for x ≠ y < 255.
            let mut t = b;
            mul_acc(&mut t, &a, pow2(y));
            let mut dx = vec![0u8; len];
            mul_acc(&mut dx, &t, inv(pow2(x) ^ pow2(y)));
            let mut dy = a;
            xor_into(&mut dy, &dx);
            cols[x] = dx;
            cols[y] = dy;
            Ok(())
        }
        _ => Err(RebuildError::TooManyMissing),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic byte stream (xorshift).
    fn bytes(seed: u64, len: usize) -> Vec<u8> {
        let mut s = seed | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s.to_le_bytes()[3]
            })
            .collect()
    }

    #[test]
    fn field_arithmetic() {
        // Known values of the md RAID-6 field (0x11d).
        assert_eq!(mul(2, 0x80), 0x1d);
        assert_eq!(mul(3, 7), 9);
        assert_eq!(pow2(8), 0x1d);
        assert_eq!(pow2(255), 1);
        for a in 1..=255u8 {
            assert_eq!(mul(a, inv(a)), 1, "{a}");
            assert_eq!(mul(a, 1), a);
            assert_eq!(mul(a, 0), 0);
        }
        let all: std::collections::BTreeSet<u8> = (0..255).map(pow2).collect();
        assert_eq!(all.len(), 255, "2 generates the multiplicative group");
    }

    #[test]
    fn rebuild_every_one_and_two_column_loss() {
        for nd in [1usize, 2, 3, 5] {
            let data: Vec<Vec<u8>> = (0..nd).map(|i| bytes(i as u64 + 7, 333)).collect();
            let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            let (p, q) = parity(&refs);
            if nd == 1 {
                // One data column: P is a copy.
                assert_eq!(p, data[0]);
            }
            for x in 0..nd {
                for (pp, qq) in [(Some(&p[..]), None), (None, Some(&q[..]))] {
                    let mut cols = data.clone();
                    cols[x] = vec![0xaa; 333];
                    rebuild(&mut cols, &[x], pp, qq).unwrap();
                    assert_eq!(cols, data, "nd {nd} x {x}");
                }
                for y in x + 1..nd {
                    let mut cols = data.clone();
                    cols[x].fill(1);
                    cols[y].fill(2);
                    rebuild(&mut cols, &[y, x], Some(&p), Some(&q)).unwrap();
                    assert_eq!(cols, data, "nd {nd} x {x} y {y}");
                    assert_eq!(
                        rebuild(&mut cols, &[x, y], Some(&p), None),
                        Err(RebuildError::TooManyMissing)
                    );
                }
            }
        }
        let mut cols = vec![vec![0u8; 4]; 3];
        assert_eq!(
            rebuild(&mut cols, &[0], None, None),
            Err(RebuildError::TooManyMissing)
        );
        assert_eq!(
            rebuild(&mut cols, &[0, 1, 2], Some(&[0; 4]), Some(&[0; 4])),
            Err(RebuildError::TooManyMissing)
        );
        assert_eq!(
            rebuild(&mut cols, &[0], Some(&[0; 3]), None),
            Err(RebuildError::Length)
        );
        assert_eq!(
            rebuild(&mut cols, &[5], Some(&[0; 4]), None),
            Err(RebuildError::Length)
        );
    }
}
