//! Loading the driver and telling host from device memory.

use ferrio::bounce::{CopyEngine, CudaEngine};
use ferrio::cuda::{self, Context, DeviceBuffer, Memory};
use ferrio::Error;

use crate::require_cuda;

/// Without a driver nothing fails at build or load time: CUDA calls say why they cannot run,
/// and every address is host memory.
#[test]
fn without_a_driver_everything_is_host() {
    if cuda::available().is_ok() {
        println!("skipped: a CUDA driver is present");
        return;
    }
    let Err(Error::CudaUnavailable { reason }) = cuda::available() else {
        panic!("available() must fail with CudaUnavailable");
    };
    assert!(!reason.is_empty());
    println!("CUDA unavailable here: {reason}");
    let heap = Box::new([1u8; 64]);
    let stack = 5u64;
    assert_eq!(cuda::classify(heap.as_ptr() as usize), Memory::Host);
    assert_eq!(cuda::classify(&stack as *const u64 as usize), Memory::Host);
    assert_eq!(cuda::classify(0), Memory::Host);
    assert!(matches!(
        cuda::try_classify(heap.as_ptr() as usize),
        Ok(Memory::Host)
    ));
    for err in [
        cuda::driver_info().map(|_| ()).unwrap_err(),
        Context::primary(0).map(|_| ()).unwrap_err(),
        DeviceBuffer::new(0, 16, false).map(|_| ()).unwrap_err(),
    ] {
        assert!(
            matches!(&err, Error::CudaUnavailable { reason: r } if *r == reason),
            "{err}"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (make gpu-test)"]
fn classify_tells_host_from_device() {
    require_cuda!();
    let info = cuda::driver_info().expect("driver info");
    for ordinal in 0..info.device_count {
        let primary = Context::primary(ordinal).expect("primary context");
        assert_eq!(
            Context::primary(ordinal).expect("again"),
            primary,
            "retained once"
        );
        assert_eq!(primary.device_ordinal().expect("ordinal"), ordinal);

        let heap = Box::new([1u8; 4096]);
        let stack = 5u64;
        assert_eq!(
            cuda::classify(heap.as_ptr() as usize),
            Memory::Host,
            "pageable heap"
        );
        assert_eq!(
            cuda::classify(&stack as *const u64 as usize),
            Memory::Host,
            "stack"
        );
        assert_eq!(cuda::classify(0), Memory::Host, "null");

        let engine = CudaEngine::new(primary).expect("engine");
        let pinned = {
            let _bound = engine.bind().expect("bind");
            engine.alloc_pinned(1 << 20).expect("pinned")
        };
        assert_eq!(
            cuda::try_classify(pinned.as_ptr() as usize).expect("classify"),
            Memory::Host,
            "pinned host memory from cuMemHostAlloc is host memory"
        );
        {
            let _bound = engine.bind().expect("bind");
            // SAFETY: allocated above with this size, no copy used it.
            unsafe { engine.free_pinned(pinned, 1 << 20) }.expect("free pinned");
        }

        let expected = Memory::Device {
            context: primary,
            device_ordinal: ordinal,
        };
        let device = DeviceBuffer::new(ordinal, 1 << 20, false).expect("cuMemAlloc");
        let base = device.ptr().0 as usize;
        assert_eq!(
            cuda::try_classify(base).expect("classify"),
            expected,
            "cuMemAlloc"
        );
        assert_eq!(
            cuda::classify(base + 12345),
            expected,
            "inside a cuMemAlloc block"
        );
        let managed = DeviceBuffer::new(ordinal, 1 << 20, true).expect("cuMemAllocManaged");
        assert_eq!(
            cuda::try_classify(managed.ptr().0 as usize).expect("classify"),
            expected,
            "managed memory goes through the ring"
        );
    }
}

/// A child made by `fork` after the parent used CUDA gets a clear error, not a hang or a crash
/// (CUDA does not survive `fork`); host I/O in the child is unaffected.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (make gpu-test)"]
fn a_forked_child_is_refused_cuda_with_the_reason() {
    require_cuda!();
    let buf = DeviceBuffer::new(0, 4096, false).expect("alloc in the parent");
    // SAFETY: the child reads the driver table's OnceLock (already set, so no lock is taken),
    // builds an error (glibc's malloc is fork-safe) and leaves with _exit; it touches nothing
    // another thread could have held at the fork.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ok = match cuda::available() {
            Err(Error::CudaUnavailable { reason }) => reason.contains("fork"),
            _ => false,
        };
        // SAFETY: _exit ends the child without running the parent's destructors or atexit.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for the child made above; `status` is writable.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child did not get a CudaUnavailable error naming fork (status {status})"
    );
    assert!(cuda::available().is_ok(), "the parent still has CUDA");
    drop(buf);
}
