//! Verifying a copy: reading source and copy back in windows and naming the first byte that
//! differs.
//!
//! It only reads; flushing the copy and dropping its cached pages first is the caller's step.

use std::io;

use super::data::shrank;
use super::ring::Ring;
use super::{Copier, CopyProgress};
use crate::error::{Error, Op, Result};
use crate::file::File;

impl Copier<'_> {
    /// Reads `a` and `b` back in windows and compares every byte.
    pub(super) fn verify_same(&self, a: &File, b: &File, size: u64, ring: &mut Ring) -> Result<()> {
        verify_files(a, b, size, self.window, ring, &self.progress)
    }
}

/// Compares `a` and `b` over `[0, size)`, two windows at a time (one of each, read at once).
fn verify_files(
    a: &File,
    b: &File,
    size: u64,
    window: usize,
    ring: &mut Ring,
    progress: &CopyProgress,
) -> Result<()> {
    let mut off = 0u64;
    while off < size {
        if progress.is_cancelled() {
            return Err(Error::Cancelled);
        }
        let len = (size - off).min(window as u64) as usize;
        let (wa, wb) = (ring.take(len)?, ring.take(len)?);
        let (fa, fb) = (a.pread(wa, off), b.pread(wb, off));
        let ((ra, wa), (rb, wb)) = (fa.into_buffer(), fb.into_buffer());
        let outcome = match (ra, rb) {
            (Err(e), _) | (_, Err(e)) => Err(e),
            (Ok(na), Ok(nb)) => match first_difference(&wa.bytes()[..na], &wb.bytes()[..nb]) {
                None if na == len => Ok(()),
                None => Err(shrank(a.path(), off + na as u64)),
                Some(i) => Err(Error::io(
                    Op::Copy,
                    b.path(),
                    off + i as u64,
                    1,
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("the copy differs from {}", a.path().display()),
                    ),
                )),
            },
        };
        ring.give(wa);
        ring.give(wb);
        outcome?;
        off += len as u64;
    }
    Ok(())
}

/// The first index where `a` and `b` differ (a length difference counts at the shorter end).
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    const CHUNK: usize = 4096;
    let n = a.len().min(b.len());
    let mut i = 0;
    while i < n {
        let end = (i + CHUNK).min(n);
        if a[i..end] != b[i..end] {
            return a[i..end]
                .iter()
                .zip(&b[i..end])
                .position(|(x, y)| x != y)
                .map(|p| i + p);
        }
        i = end;
    }
    (a.len() != b.len()).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn first_difference_finds_the_offset() {
        let a = vec![7u8; 10_000];
        let mut b = a.clone();
        assert_eq!(first_difference(&a, &b), None);
        b[9_001] = 0;
        assert_eq!(first_difference(&a, &b), Some(9_001));
        assert_eq!(first_difference(&a, &a[..5_000]), Some(5_000));
    }

    #[test]
    fn verify_reports_where_files_differ() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        let mut bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        fs::write(&a, &bytes).unwrap();
        fs::write(&b, &bytes).unwrap();
        let (fa, fb) = (File::open(&a, "r").unwrap(), File::open(&b, "r").unwrap());
        let mut ring = Ring::new(1 << 20, 2);
        let progress = CopyProgress::default();
        verify_files(&fa, &fb, 3_000_000, 1 << 20, &mut ring, &progress).unwrap();
        bytes[2_345_678] ^= 1;
        fs::write(&b, &bytes).unwrap();
        let e = verify_files(&fa, &fb, 3_000_000, 1 << 20, &mut ring, &progress).unwrap_err();
        match &e {
            Error::Io { offset, path, .. } => {
                assert_eq!(*offset, 2_345_678);
                assert_eq!(path, &b);
            }
            other => panic!("{other}"),
        }
        assert!(e.to_string().contains("differs"), "{e}");
    }
}
