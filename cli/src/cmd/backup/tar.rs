//! `btrsend backup dump` of a directory: a POSIX pax archive of it on
//! standard output, as `restic dump` writes one.
//!
//! Every entry gets a pax extended header (POSIX.1-2001 `x` records:
//! `path`, `linkpath`, `mtime` with nanoseconds, `uid`, `gid`, `size`,
//! xattrs as `SCHILY.xattr.NAME`, `hdrcharset=BINARY` for names that are
//! not UTF-8) before its ustar header, so no field is cut. Hard links
//! within the directory become link entries to the first path written;
//! sockets cannot be archived and are left out with a notice. Holes are
//! written as zeros (no sparse entries).

use std::collections::HashMap;
use std::io::Write;

use btrsend::backup::index::model::{FileType, Inode};
use btrsend::backup::index::{DataSource, IndexError, Snapshot};

const BLOCK: usize = 512;

fn io_err(e: std::io::Error) -> IndexError {
    IndexError::Store(e.to_string())
}

/// Write `path` (directory `ino`, from the snapshot's root, no leading
/// `/`) and everything below it as a tar archive to `out`.
///
/// # Errors
///
/// A damaged index, data that cannot be read, or a write error.
pub(super) fn write_dir(
    snap: &Snapshot<'_, '_>,
    data: &dyn DataSource,
    ino: u64,
    path: &[u8],
    out: &mut dyn Write,
) -> Result<(), IndexError> {
    let mut links = HashMap::new();
    let inode = snap.inode(ino)?;
    let mut path = path.to_vec();
    entry(snap, data, ino, &inode, &path, &mut links, out)?;
    snap.walk_below(ino, &mut path, &mut |p, i, inode| {
        entry(snap, data, i, inode, p, &mut links, out)
    })?;
    // The end of an archive: two zero blocks.
    out.write_all(&[0u8; 2 * BLOCK]).map_err(io_err)
}

/// A pax record: `LEN KEY=VALUE\n`, LEN counting itself.
fn record(rec: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    let body = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut n = body + 1;
    while n != body + n.to_string().len() {
        n = body + n.to_string().len();
    }
    rec.extend_from_slice(n.to_string().as_bytes());
    rec.push(b' ');
    rec.extend_from_slice(key);
    rec.push(b'=');
    rec.extend_from_slice(value);
    rec.push(b'\n');
}

/// A pax time: seconds and a fraction, negative times included.
fn pax_time(sec: i64, nsec: u32) -> String {
    if sec < 0 && nsec > 0 {
        format!("-{}.{:09}", -(sec + 1), 1_000_000_000 - nsec)
    } else {
        format!("{sec}.{nsec:09}")
    }
}

/// An octal field of `width` bytes (digits then NUL); 0 when the value
/// does not fit (the pax header carries it).
fn octal(field: &mut [u8], v: u64) {
    let width = field.len() - 1;
    let s = format!("{v:0width$o}");
    if s.len() == width {
        field[..width].copy_from_slice(s.as_bytes());
    } else {
        field[..width].fill(b'0');
    }
    field[width] = 0;
}

fn header(name: &[u8], typeflag: u8, mode: u32, i: &Inode, size: u64, link: &[u8]) -> [u8; BLOCK] {
    let mut h = [0u8; BLOCK];
    let cut = |field: &mut [u8], v: &[u8]| {
        let n = v.len().min(field.len());
        field[..n].copy_from_slice(&v[..n]);
    };
    cut(&mut h[0..100], name);
    octal(&mut h[100..108], u64::from(mode));
    octal(&mut h[108..116], u64::from(i.uid));
    octal(&mut h[116..124], u64::from(i.gid));
    octal(&mut h[124..136], size);
    octal(&mut h[136..148], u64::try_from(i.mtime.0).unwrap_or(0));
    h[156] = typeflag;
    cut(&mut h[157..257], link);
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    if matches!(i.kind, FileType::Chr | FileType::Blk) {
        let (major, minor) = i.rdev_parts();
        octal(&mut h[329..337], u64::from(major));
        octal(&mut h[337..345], u64::from(minor));
    }
    h[148..156].fill(b' ');
    let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
    let s = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(s.as_bytes());
    h
}

fn pad(out: &mut dyn Write, len: u64) -> Result<(), IndexError> {
    let rem = (len % BLOCK as u64) as usize;
    if rem != 0 {
        out.write_all(&[0u8; BLOCK][..BLOCK - rem])
            .map_err(io_err)?;
    }
    Ok(())
}

fn entry(
    snap: &Snapshot<'_, '_>,
    data: &dyn DataSource,
    ino: u64,
    i: &Inode,
    path: &[u8],
    links: &mut HashMap<u64, Vec<u8>>,
    out: &mut dyn Write,
) -> Result<(), IndexError> {
    let mut name = if path.is_empty() {
        b".".to_vec()
    } else {
        path.to_vec()
    };
    let mut link: Vec<u8> = Vec::new();
    let mut size = 0;
    let typeflag = match i.kind {
        FileType::Dir => {
            name.push(b'/');
            b'5'
        }
        FileType::Sock => {
            eprintln!(
                "btrsend: notice: {}: a socket, left out of the archive",
                String::from_utf8_lossy(&crate::text::printable_bytes(path))
            );
            return Ok(());
        }
        _ if i.nlink > 1 && links.contains_key(&ino) => {
            link = links[&ino].clone();
            b'1'
        }
        FileType::File => {
            size = i.size;
            b'0'
        }
        FileType::Symlink => {
            link = i.target.clone();
            b'2'
        }
        FileType::Chr => b'3',
        FileType::Blk => b'4',
        FileType::Fifo => b'6',
    };
    if i.kind != FileType::Dir && i.nlink > 1 && typeflag != b'1' {
        links.insert(ino, name.clone());
    }
    let mut pax = Vec::new();
    if std::str::from_utf8(&name).is_err() || std::str::from_utf8(&link).is_err() {
        record(&mut pax, b"hdrcharset", b"BINARY");
    }
    record(&mut pax, b"path", &name);
    if !link.is_empty() {
        record(&mut pax, b"linkpath", &link);
    }
    record(
        &mut pax,
        b"mtime",
        pax_time(i.mtime.0, i.mtime.1).as_bytes(),
    );
    record(&mut pax, b"uid", i.uid.to_string().as_bytes());
    record(&mut pax, b"gid", i.gid.to_string().as_bytes());
    if size >= 1 << 33 {
        record(&mut pax, b"size", size.to_string().as_bytes());
    }
    if typeflag != b'1' {
        for (k, v) in snap.xattrs(ino)? {
            let mut key = b"SCHILY.xattr.".to_vec();
            key.extend_from_slice(&k);
            record(&mut pax, &key, &v);
        }
    }
    let mut xname = b"PaxHeaders/".to_vec();
    xname.extend_from_slice(
        name.rsplit(|&b| b == b'/')
            .find(|c| !c.is_empty())
            .unwrap_or(b"."),
    );
    let xh = header(&xname, b'x', 0o644, i, pax.len() as u64, b"");
    out.write_all(&xh).map_err(io_err)?;
    out.write_all(&pax).map_err(io_err)?;
    pad(out, pax.len() as u64)?;
    let h = header(&name, typeflag, i.mode & 0o7777, i, size, &link);
    out.write_all(&h).map_err(io_err)?;
    if typeflag == b'0' {
        let mut buf = vec![0u8; 1 << 20];
        let mut at = 0u64;
        while at < size {
            let n = snap.read(ino, i, at, &mut buf, data)?;
            if n == 0 {
                break;
            }
            out.write_all(&buf[..n]).map_err(io_err)?;
            at += n as u64;
        }
        if at < size {
            return Err(IndexError::Data {
                path: String::from_utf8_lossy(path).into_owned(),
                reason: format!("{at} bytes of {size} read"),
            });
        }
        pad(out, size)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_records_count_their_own_length() {
        let mut r = Vec::new();
        record(&mut r, b"path", b"a");
        assert_eq!(r, b"9 path=a\n");
        let mut r = Vec::new();
        record(&mut r, b"path", &[b'x'; 93]);
        assert_eq!(r.len(), 103);
        assert!(r.starts_with(b"103 path="));
    }

    #[test]
    fn times_before_1970_keep_their_fraction() {
        assert_eq!(pax_time(1, 5), "1.000000005");
        assert_eq!(pax_time(-2, 500_000_000), "-1.500000000");
        assert_eq!(pax_time(-2, 0), "-2.000000000");
    }
}
