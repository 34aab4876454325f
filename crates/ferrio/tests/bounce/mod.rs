//! The bounce ring's conformance suite, run against every [`CopyEngine`]: the emulated device
//! on every `cargo test` (`emulated`), the real driver where there is a GPU (`real`).
//!
//! Every check compares every byte: sources are random, destinations are poisoned with a
//! non-zero pattern first and carry guard bands on both sides that must stay untouched.

mod emulated;
mod real;
mod two_devices;

use std::sync::Arc;

use ferrio::bounce::{BounceRing, CopyEngine, PinnedBudget, RingSet, PINNED_ALIGN};
use ferrio::cuda::DevicePtr;
use ferrio::{Error, Result, Settings};

use crate::support::{assert_bytes_eq, poison, random_bytes};

/// Bytes left around every destination to catch writes out of bounds.
const GUARD: usize = 4096 + 123;

/// Device memory as the suite sees it.
pub trait DeviceMem {
    /// Address of the first byte.
    fn ptr(&self) -> DevicePtr;
    /// Synchronous write.
    fn write(&self, offset: usize, data: &[u8]);
    /// Synchronous read, without waiting for any ring's stream.
    fn read(&self, offset: usize, len: usize) -> Vec<u8>;
}

/// A device to run the suite on.
pub trait Harness {
    /// The engine under test.
    type Engine: CopyEngine + Clone + PartialEq + Send + 'static;
    /// A fresh handle to the engine.
    fn engine(&self) -> Self::Engine;
    /// `len` bytes of device memory, freed on drop.
    fn alloc(&self, len: usize) -> Box<dyn DeviceMem + '_>;
}

/// A file held in memory: what the engine's `pread`/`pwrite` would do, with a log of calls.
struct MemFile {
    data: Vec<u8>,
    calls: Vec<(u64, usize, usize)>,
}

impl MemFile {
    fn new(data: Vec<u8>) -> MemFile {
        MemFile {
            data,
            calls: Vec::new(),
        }
    }

    /// Fills `buf` from `offset` (short at end of file), logging (offset, asked, address).
    fn read(&mut self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.calls.push((offset, buf.len(), buf.as_ptr() as usize));
        let off = (offset as usize).min(self.data.len());
        let n = buf.len().min(self.data.len() - off);
        buf[..n].copy_from_slice(&self.data[off..off + n]);
        Ok(n)
    }

    fn write(&mut self, buf: &[u8], offset: u64) -> Result<()> {
        self.calls.push((offset, buf.len(), buf.as_ptr() as usize));
        let off = offset as usize;
        self.data[off..off + buf.len()].copy_from_slice(buf);
        Ok(())
    }
}

fn ring<H: Harness>(h: &H, buffer_len: usize, depth: usize) -> BounceRing<H::Engine> {
    let budget = Arc::new(PinnedBudget::new(u64::MAX));
    BounceRing::new(h.engine(), buffer_len, depth, budget).expect("ring")
}

/// A poisoned destination of `len` bytes with guard bands; returns the memory and the offset of
/// the destination inside it.
fn poisoned_dst<'h, H: Harness>(h: &'h H, len: usize) -> (Box<dyn DeviceMem + 'h>, usize) {
    let mem = h.alloc(len + 2 * GUARD);
    mem.write(0, &poison(len + 2 * GUARD));
    (mem, GUARD)
}

#[track_caller]
fn assert_guards_intact(mem: &dyn DeviceMem, len: usize) {
    let all = mem.read(0, len + 2 * GUARD);
    let expected = poison(len + 2 * GUARD);
    assert_bytes_eq(&all[..GUARD], &expected[..GUARD], "guard band before");
    assert_bytes_eq(
        &all[GUARD + len..],
        &expected[GUARD + len..],
        "guard band after",
    );
}

/// The chunks a transfer of `len` bytes from `file_offset` must be split into.
fn expected_chunks(len: usize, file_offset: u64, b: usize) -> Vec<(u64, usize)> {
    (0..len.div_ceil(b))
        .map(|c| (file_offset + (c * b) as u64, b.min(len - c * b)))
        .collect()
}

/// Cases: (depth, buffer bytes, transfer bytes, file offset).
const CASES: &[(usize, usize, usize, u64)] = &[
    (1, 8192, 1, 0),
    (2, 8192, 4095, 3),
    (3, 8192, 8192, 8192),
    (3, 8192, 8193, 5),
    (4, 8192, 10 * 8192 + 517, 12345),
    (2, 3 * 4096, 100_000, 1),
    (1, 4096, 5 * 4096, 0),
    // A size that is not a multiple of the page is rounded up.
    (3, 5000, 40_000, 7),
];

/// Reads land at the right device offsets, every byte, in chunks of the ring's buffer size,
/// from page-aligned buffers, and nothing outside the destination is touched.
pub fn read_lands_every_byte<H: Harness>(h: &H) {
    for (seed, &(depth, b, len, file_offset)) in CASES.iter().enumerate() {
        let case = format!("depth {depth}, buffer {b}, {len} bytes at {file_offset}");
        let mut ring = ring(h, b, depth);
        let b = ring.buffer_len();
        assert_eq!(b % PINNED_ALIGN, 0, "{case}");
        let mut file = MemFile::new(random_bytes(file_offset as usize + len + 999, seed as u64));
        let (mem, at) = poisoned_dst(h, len);
        let dst = mem.ptr().checked_add(at).expect("address");
        let got = ring
            .read_to_device(dst, len, file_offset, &mut |buf, off| file.read(buf, off))
            .expect(&case);
        assert_eq!(got, len, "{case}");
        let f = file_offset as usize;
        assert_bytes_eq(&mem.read(at, len), &file.data[f..f + len], &case);
        assert_guards_intact(&*mem, len);
        let calls: Vec<(u64, usize)> = file.calls.iter().map(|&(o, n, _)| (o, n)).collect();
        assert_eq!(calls, expected_chunks(len, file_offset, b), "{case}");
        for &(_, _, addr) in &file.calls {
            assert_eq!(addr % PINNED_ALIGN, 0, "{case}: buffer not page-aligned");
        }
        assert_eq!(ring.stats().copies as usize, len.div_ceil(b), "{case}");
        assert_eq!(ring.stats().bytes as usize, len, "{case}");
    }
}

/// A short read means end of file: the ring stops, returns the count, and copies no more.
pub fn short_read_stops_at_eof<H: Harness>(h: &H) {
    let b = 8192;
    // (file bytes, request bytes, file offset, expected count, expected callback calls)
    let cases = [
        (3 * b + b / 2, 6 * b, 0u64, 3 * b + b / 2, 4),
        (3 * b, 6 * b, 0, 3 * b, 4), // EOF on a chunk boundary: the 4th call returns 0
        (3 * b, 6 * b, 100, 3 * b - 100, 3),
        (1000, 6 * b, 5000, 0, 1), // starting past the end
    ];
    for (seed, &(file_len, len, file_offset, expected, expected_calls)) in cases.iter().enumerate()
    {
        let case = format!("file {file_len}, {len} bytes at {file_offset}");
        let mut ring = ring(h, b, 3);
        let mut file = MemFile::new(random_bytes(file_len, 100 + seed as u64));
        let (mem, at) = poisoned_dst(h, len);
        let dst = mem.ptr().checked_add(at).expect("address");
        let got = ring
            .read_to_device(dst, len, file_offset, &mut |buf, off| file.read(buf, off))
            .expect(&case);
        assert_eq!(got, expected, "{case}");
        assert_eq!(file.calls.len(), expected_calls, "{case}");
        let f = (file_offset as usize).min(file.data.len());
        assert_bytes_eq(&mem.read(at, got), &file.data[f..f + got], &case);
        assert_bytes_eq(
            &mem.read(at + got, len - got),
            &poison(len + 2 * GUARD)[at + got..at + len],
            &format!("{case}: bytes past EOF must stay untouched"),
        );
        assert_guards_intact(&*mem, len);
    }
}

/// A failing read stops the loop: the first error comes back, no later chunk is read, copies
/// already started have completed on return, and the ring works again afterwards.
pub fn read_error_stops_and_waits<H: Harness>(h: &H) {
    let b = 8192;
    let len = 10 * b;
    let mut ring = ring(h, b, 3);
    let mut file = MemFile::new(random_bytes(len, 7));
    let (mem, at) = poisoned_dst(h, len);
    let dst = mem.ptr().checked_add(at).expect("address");
    let fail_at = (4 * b) as u64;
    let err = ring
        .read_to_device(dst, len, 0, &mut |buf, off| {
            if off == fail_at {
                return Err(Error::InvalidArgument(format!(
                    "injected read failure at {off}"
                )));
            }
            if off > fail_at {
                return Err(Error::InvalidArgument("read after the failure".to_string()));
            }
            file.read(buf, off)
        })
        .expect_err("the read must fail");
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m == "injected read failure at 32768"),
        "{err}"
    );
    // The chunks before the failure were copied, and completely: read back at once.
    assert_bytes_eq(
        &mem.read(at, 4 * b),
        &file.data[..4 * b],
        "chunks before the error",
    );
    assert_bytes_eq(
        &mem.read(at + 4 * b, len - 4 * b),
        &poison(len + 2 * GUARD)[at + 4 * b..at + len],
        "chunks from the error on must not be copied",
    );
    assert!(!ring.is_poisoned());
    // The ring is usable again.
    let mut file2 = MemFile::new(random_bytes(len, 8));
    let got = ring
        .read_to_device(dst, len, 0, &mut |buf, off| file2.read(buf, off))
        .expect("read after an error");
    assert_eq!(got, len);
    assert_bytes_eq(&mem.read(at, len), &file2.data, "read after an error");
}

/// A callback that claims more bytes than the buffer holds is an error, not a wild copy.
pub fn overclaiming_callback_is_an_error<H: Harness>(h: &H) {
    let mut ring = ring(h, 4096, 2);
    let (mem, at) = poisoned_dst(h, 8192);
    let dst = mem.ptr().checked_add(at).expect("address");
    let err = ring
        .read_to_device(dst, 8192, 0, &mut |buf, _| Ok(buf.len() + 1))
        .expect_err("overclaim");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert_guards_intact(&*mem, 8192);
    let zero = ring.read_to_device(dst, 0, 0, &mut |_, _| panic!("no call for 0 bytes"));
    assert_eq!(zero.ok(), Some(0), "a zero-byte read reads nothing");
}

/// Writes send every device byte to the right file offset, in order, and nothing else.
pub fn write_sends_every_byte<H: Harness>(h: &H) {
    for (seed, &(depth, b, len, file_offset)) in CASES.iter().enumerate() {
        let case = format!("depth {depth}, buffer {b}, {len} bytes at {file_offset}");
        let mut ring = ring(h, b, depth);
        let b = ring.buffer_len();
        let source = random_bytes(len, 1000 + seed as u64);
        let (mem, at) = poisoned_dst(h, len);
        mem.write(at, &source);
        let src = mem.ptr().checked_add(at).expect("address");
        let f = file_offset as usize;
        let file_len = f + len + GUARD;
        let mut file = MemFile::new(poison(file_len));
        let got = ring
            .write_from_device(src, len, file_offset, &mut |buf, off| file.write(buf, off))
            .expect(&case);
        assert_eq!(got, len, "{case}");
        assert_bytes_eq(&file.data[f..f + len], &source, &case);
        let untouched = poison(file_len);
        assert_bytes_eq(&file.data[..f], &untouched[..f], "file before the range");
        assert_bytes_eq(
            &file.data[f + len..],
            &untouched[f + len..],
            "file after the range",
        );
        let calls: Vec<(u64, usize)> = file.calls.iter().map(|&(o, n, _)| (o, n)).collect();
        assert_eq!(calls, expected_chunks(len, file_offset, b), "{case}");
        for &(_, _, addr) in &file.calls {
            assert_eq!(addr % PINNED_ALIGN, 0, "{case}: buffer not page-aligned");
        }
        // The device source is unchanged.
        assert_bytes_eq(&mem.read(at, len), &source, "device source after a write");
    }
}

/// A failing write stops the loop: the first error comes back, nothing is written after it,
/// copies in flight have completed on return, and the ring works again afterwards.
pub fn write_error_stops_and_waits<H: Harness>(h: &H) {
    let b = 8192;
    let len = 9 * b + 100;
    let mut ring = ring(h, b, 3);
    let source = random_bytes(len, 77);
    let mem = h.alloc(len);
    mem.write(0, &source);
    let mut file = MemFile::new(poison(len));
    let fail_at = (2 * b) as u64;
    let mut calls_after = 0;
    let err = ring
        .write_from_device(mem.ptr(), len, 0, &mut |buf, off| {
            if off == fail_at {
                return Err(Error::InvalidArgument(format!(
                    "injected write failure at {off}"
                )));
            }
            if off > fail_at {
                calls_after += 1;
            }
            file.write(buf, off)
        })
        .expect_err("the write must fail");
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m == "injected write failure at 16384"),
        "{err}"
    );
    assert_eq!(calls_after, 0, "nothing is written after the error");
    assert_bytes_eq(
        &file.data[..2 * b],
        &source[..2 * b],
        "chunks before the error",
    );
    assert_bytes_eq(
        &file.data[2 * b..],
        &poison(len)[2 * b..],
        "chunks from the error on",
    );
    assert!(!ring.is_poisoned());
    let mut file2 = MemFile::new(poison(len));
    let got = ring
        .write_from_device(mem.ptr(), len, 0, &mut |buf, off| file2.write(buf, off))
        .expect("write after an error");
    assert_eq!(got, len);
    assert_bytes_eq(&file2.data, &source, "write after an error");
}

/// One ring serves many calls with the same buffers: nothing is allocated per call.
pub fn ring_is_reused<H: Harness>(h: &H) {
    let b = 4096;
    let mut ring = ring(h, b, 3);
    let mut seen = std::collections::BTreeSet::new();
    let mem = h.alloc(7 * b);
    for round in 0..20u64 {
        let len = (round as usize % 7 + 1) * b - round as usize;
        let mut file = MemFile::new(random_bytes(len, 500 + round));
        let got = ring
            .read_to_device(mem.ptr(), len, 0, &mut |buf, off| file.read(buf, off))
            .expect("read");
        assert_eq!(got, len);
        assert_bytes_eq(&mem.read(0, len), &file.data, "reused ring");
        seen.extend(file.calls.iter().map(|&(_, _, addr)| addr));
        let mut out = MemFile::new(poison(len));
        ring.write_from_device(mem.ptr(), len, 0, &mut |buf, off| out.write(buf, off))
            .expect("write");
        assert_bytes_eq(&out.data, &file.data, "reused ring, write");
        seen.extend(out.calls.iter().map(|&(_, _, addr)| addr));
    }
    assert_eq!(ring.buffers(), 3);
    assert_eq!(
        seen.len(),
        3,
        "every call uses the ring's own three buffers"
    );
}

/// Reads started one after the other without waiting (`start_read_to_device`), as a worker
/// does for the tasks of one request, land every byte once `finish` returns, each chunk in a
/// buffer whose previous copy is over; a write on the same ring afterwards finds its buffers
/// free.
pub fn reads_in_a_row_land_after_finish<H: Harness>(h: &H) {
    let b = 4096;
    let mut ring = ring(h, b, 3);
    // Ranges of 2, 1 (short of a buffer), 5, 1 and 4 buffers, laid end to end.
    let lens = [2 * b, b - 100, 5 * b + 17, 1, 4 * b];
    let total: usize = lens.iter().sum();
    let mut file = MemFile::new(random_bytes(total, 77));
    let (mem, at) = poisoned_dst(h, total);
    let mut pos = 0;
    for &len in &lens {
        let dst = mem.ptr().checked_add(at + pos).expect("address");
        let got = ring
            .start_read_to_device(dst, len, pos as u64, &mut |buf, off| file.read(buf, off))
            .expect("start read");
        assert_eq!(got, len);
        pos += len;
    }
    ring.finish().expect("finish");
    assert_bytes_eq(&mem.read(at, total), &file.data, "reads in a row");
    assert_guards_intact(&*mem, total);
    // Chunks go round the ring in one order across calls: consecutive chunks never share a
    // buffer, so a chunk never waits for the copy just started.
    for w in file.calls.windows(2) {
        assert_ne!(w[0].2, w[1].2, "two chunks in a row in one buffer");
    }
    let mut out = MemFile::new(poison(total));
    ring.write_from_device(
        mem.ptr().checked_add(at).expect("address"),
        total,
        0,
        &mut |buf, off| out.write(buf, off),
    )
    .expect("write after reads in a row");
    assert_bytes_eq(&out.data, &file.data, "write after reads in a row");
}

/// The pinned cap: rings take the buffers that fit, always at least one, give them back when
/// dropped, and grow again when room appears.
pub fn pinned_cap_limits_rings<H: Harness>(h: &H) {
    let b = 8192usize;
    let budget = Arc::new(PinnedBudget::new((2 * b + b / 2) as u64));
    let mut a = BounceRing::new(h.engine(), b, 4, budget.clone()).expect("ring a");
    assert_eq!(a.buffers(), 2, "two buffers fit under 2.5 buffers");
    let mut c = BounceRing::new(h.engine(), b, 4, budget.clone()).expect("ring c");
    assert_eq!(
        c.buffers(),
        1,
        "a ring always gets one buffer, past the cap"
    );
    assert_eq!(budget.used(), 3 * b as u64);
    let len = 5 * b + 3;
    for (ring, seed) in [(&mut a, 1u64), (&mut c, 2)] {
        let mut file = MemFile::new(random_bytes(len, 900 + seed));
        let (mem, at) = poisoned_dst(h, len);
        let dst = mem.ptr().checked_add(at).expect("address");
        let got = ring
            .read_to_device(dst, len, 0, &mut |buf, off| file.read(buf, off))
            .expect("read under the cap");
        assert_eq!(got, len);
        assert_bytes_eq(&mem.read(at, len), &file.data, "read under the cap");
        assert_guards_intact(&*mem, len);
    }
    drop(a);
    assert_eq!(
        budget.used(),
        b as u64,
        "a dropped ring gives its buffers back"
    );
    let mem = h.alloc(b);
    let mut file = MemFile::new(random_bytes(b, 3));
    c.read_to_device(mem.ptr(), b, 0, &mut |buf, off| file.read(buf, off))
        .expect("read");
    assert_eq!(
        c.buffers(),
        2,
        "the ring grows into the room freed (1.5 buffers left)"
    );
    assert_eq!(budget.used(), 2 * b as u64);
    drop(c);
    assert_eq!(budget.used(), 0);
}

/// A ring set hands out one ring per engine, reuses it, and remakes it when the settings
/// change; its rings share the set's budget, whose cap follows the settings.
pub fn ring_set_reuses_and_remakes<H: Harness>(h: &H) {
    let budget = Arc::new(PinnedBudget::new(u64::MAX));
    let mut set = RingSet::new(budget.clone());
    let engine = h.engine();
    let mut settings = Settings::default();
    settings.bounce_buffer_size = 8192;
    settings.bounce_buffers = 3;
    settings.pinned_limit = 1 << 30;
    let mem = h.alloc(4 * 8192);
    let mut file = MemFile::new(random_bytes(4 * 8192, 11));
    let ring = set.ring(&engine, &settings).expect("ring");
    assert_eq!((ring.buffer_len(), ring.buffers()), (8192, 3));
    ring.read_to_device(mem.ptr(), 4 * 8192, 0, &mut |buf, off| file.read(buf, off))
        .expect("read");
    assert_eq!(budget.limit(), 1 << 30);
    let again = set.ring(&engine, &settings).expect("ring");
    assert_eq!(again.stats().copies, 4, "the same ring is handed out again");
    assert_eq!(set.len(), 1);
    settings.bounce_buffers = 2;
    let remade = set.ring(&engine, &settings).expect("ring");
    assert_eq!((remade.buffers(), remade.stats().copies), (2, 0));
    settings.bounce_buffer_size = 4096;
    let remade = set.ring(&engine, &settings).expect("ring");
    assert_eq!((remade.buffer_len(), remade.buffers()), (4096, 2));
    assert_eq!(set.len(), 1);
    assert_eq!(budget.used(), 2 * 4096);
    set.clear();
    assert!(set.is_empty());
    assert_eq!(budget.used(), 0);
}

/// Runs the whole suite on `h`.
pub fn conformance<H: Harness>(h: &H) {
    read_lands_every_byte(h);
    short_read_stops_at_eof(h);
    read_error_stops_and_waits(h);
    overclaiming_callback_is_an_error(h);
    write_sends_every_byte(h);
    write_error_stops_and_waits(h);
    ring_is_reused(h);
    reads_in_a_row_land_after_finish(h);
    pinned_cap_limits_rings(h);
    ring_set_reuses_and_remakes(h);
}
