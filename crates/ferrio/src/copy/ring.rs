//! The windows of a copy thread: page-aligned buffers handed to reads and writes and reused from
//! file to file.
//!
//! It owns memory only; it does no I/O.

use crate::buffer::AlignedBuf;
use crate::buffer::{IoBuf, IoBufMut};
use crate::error::{Error, Result};
use crate::sys;

/// A window of a copy pipeline: an aligned buffer and how much of it a request uses.
pub(super) struct Window {
    buf: AlignedBuf,
    len: usize,
}

impl Window {
    pub(super) fn bytes(&self) -> &[u8] {
        &self.buf.as_slice()[..self.len]
    }
}

// SAFETY: the pointer is the start of the `AlignedBuf`'s heap memory, which holds at least `len`
// bytes (`Ring::take` checks) and does not move when the `Window` moves.
unsafe impl IoBufMut for Window {
    fn io_ptr_mut(&mut self) -> *mut u8 {
        self.buf.as_mut_ptr()
    }
    fn io_len(&self) -> usize {
        self.len
    }
}

// SAFETY: as for `IoBufMut`; the future owns the `Window`, so safe code cannot change it
// meanwhile.
unsafe impl IoBuf for Window {
    fn io_ptr(&self) -> *const u8 {
        self.buf.as_slice().as_ptr()
    }
    fn io_len(&self) -> usize {
        self.len
    }
}

/// One copy thread's windows, reused from file to file.
pub(super) struct Ring {
    spare: Vec<AlignedBuf>,
    window: usize,
}

/// Windows of small files are allocated in steps of this many bytes.
const SMALL_STEP: usize = 64 << 10;

impl Ring {
    pub(super) fn new(window: usize, depth: usize) -> Ring {
        Ring {
            spare: Vec::with_capacity(depth + 1),
            window,
        }
    }

    /// A window of `len` bytes (at most the window size), page-aligned for `O_DIRECT`.
    pub(super) fn take(&mut self, len: usize) -> Result<Window> {
        let buf = match self.spare.pop() {
            Some(b) if b.len() >= len => b,
            _ => {
                let size = if len * 2 > self.window {
                    self.window.max(len)
                } else {
                    len.div_ceil(SMALL_STEP).max(1) * SMALL_STEP
                };
                AlignedBuf::new(size, sys::page_size())
                    .ok_or_else(|| Error::OutOfMemory(format!("a copy window of {size} bytes")))?
            }
        };
        Ok(Window { buf, len })
    }

    pub(super) fn give(&mut self, w: Window) {
        self.spare.push(w.buf);
    }
}
