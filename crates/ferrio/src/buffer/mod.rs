//! Buffers an [`IoFuture`](crate::IoFuture) can own while its tasks run.
//!
//! A future's tasks write into (or read from) the buffer on worker threads. Borrowing a `&mut
//! [u8]` into a future would be unsound (a future can be leaked with `mem::forget`, ending the
//! borrow while workers still write), so the future takes the buffer by value and gives it back
//! from [`IoFuture::into_buffer`](crate::IoFuture::into_buffer). Blocking calls
//! ([`File::read_at`](crate::File::read_at)) take plain slices.

mod aligned;

pub use aligned::AlignedBuf;


/// Memory a read may fill.
///
/// # Safety
/// `io_ptr_mut` must return a pointer valid for writes of `io_len` bytes, and the memory must
/// stay valid and not move while the value lives, even when the value itself is moved (heap
/// memory, not inline arrays).
pub unsafe trait IoBufMut: Send + 'static {
    /// Start of the memory.
    fn io_ptr_mut(&mut self) -> *mut u8;
    /// Length in bytes.
    fn io_len(&self) -> usize;
}

/// Memory a write may read.
///
/// # Safety
/// `io_ptr` must return a pointer valid for reads of `io_len` bytes, and the memory must stay
/// valid, unchanged by safe code, and not move while the value lives, even when it is moved.
pub unsafe trait IoBuf: Send + 'static {
    /// Start of the memory.
    fn io_ptr(&self) -> *const u8;
    /// Length in bytes.
    fn io_len(&self) -> usize;
}

// SAFETY: a Vec's heap memory does not move when the Vec is moved, and only `&mut self` access
// (which the future holds exclusively) could reallocate it.
unsafe impl IoBufMut for Vec<u8> {
    fn io_ptr_mut(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn io_len(&self) -> usize {
        self.len()
    }
}

// SAFETY: as for `IoBufMut`; the future holds the Vec, so safe code cannot change it meanwhile.
unsafe impl IoBuf for Vec<u8> {
    fn io_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn io_len(&self) -> usize {
        self.len()
    }
}

// SAFETY: boxed memory does not move when the box is moved.
unsafe impl IoBufMut for Box<[u8]> {
    fn io_ptr_mut(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn io_len(&self) -> usize {
        self.len()
    }
}

// SAFETY: boxed memory does not move when the box is moved.
unsafe impl IoBuf for Box<[u8]> {
    fn io_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn io_len(&self) -> usize {
        self.len()
    }
}

// SAFETY: an `AlignedBuf` owns heap memory that does not move with it.
unsafe impl IoBufMut for AlignedBuf {
    fn io_ptr_mut(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn io_len(&self) -> usize {
        self.len()
    }
}

// SAFETY: an `AlignedBuf` owns heap memory that does not move with it.
unsafe impl IoBuf for AlignedBuf {
    fn io_ptr(&self) -> *const u8 {
        self.as_slice().as_ptr()
    }
    fn io_len(&self) -> usize {
        self.len()
    }
}

// SAFETY: `Bytes`-like shared immutable data: an `Arc<[u8]>` never moves or changes its bytes.
unsafe impl IoBuf for std::sync::Arc<[u8]> {
    fn io_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn io_len(&self) -> usize {
        self.len()
    }
}
