//! Where a GPU sits (`ferrio::topology`, `cuda::device_info`) and pinned memory placed on a
//! NUMA node, against the real driver. Ignored unless asked for (`make gpu-test`).

use ferrio::bounce::{CopyEngine, CudaEngine};
use ferrio::cuda::{self, Context, DeviceBuffer};
use ferrio::{Error, PinnedMemory};

use crate::support::{assert_bytes_eq, random_bytes};

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (make gpu-test)"]
fn device_info_names_a_pci_device_in_sysfs() {
    crate::require_cuda!();
    let info = cuda::device_info(0).expect("device info");
    assert!(!info.name.is_empty());
    let dir = std::path::Path::new("/sys/bus/pci/devices").join(&info.pci_address);
    assert!(dir.is_dir(), "{} is not in sysfs", dir.display());
    assert_eq!(info.pci_address, info.pci_address.to_ascii_lowercase());
    assert!(
        (1 << 30..1 << 40).contains(&info.total_memory),
        "implausible memory size {}",
        info.total_memory
    );
    let gpu = ferrio::topology::gpu(0).expect("topology");
    assert!(gpu.pci.is_some(), "the GPU's PCI device is read from sysfs");
    assert!(!gpu.online_nodes.is_empty());
    let count = cuda::driver_info().expect("driver").device_count;
    let err = cuda::device_info(count).expect_err("past the count");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
}

/// The multi-node path forced on node 0 (which every machine has), in ordinary and in huge pages:
/// memory mapped there, every page on node 0, registered with the driver, carries copies to the
/// device and back byte for byte, and is freed by the engine's ordinary `free_pinned`.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (make gpu-test)"]
fn pinned_memory_placed_on_a_node_carries_copies() {
    crate::require_cuda!();
    for huge in [false, true] {
        placed_memory_carries_copies(huge);
    }
}

fn placed_memory_carries_copies(huge: bool) {
    let engine = CudaEngine::new(Context::primary(0).expect("context")).expect("engine");
    let page = ferrio::sys::page_size();
    let len = (8 << 20) + 3 * page + 123;
    let data = random_bytes(len, 42);
    let dev = DeviceBuffer::new(0, len, false).expect("device memory");
    let _bound = engine.bind().expect("bind");
    let stream = engine.create_stream().expect("stream");
    let up = engine
        .alloc_pinned_on_node(len, 0, huge)
        .expect("placed pinned memory");
    let down = engine
        .alloc_pinned_on_node(len, 0, huge)
        .expect("placed pinned memory");
    for off in (0..len).step_by(page) {
        let node = ferrio::sys::numa::node_of_page(up.as_ptr() as usize + off).expect("node");
        assert_eq!(node, 0, "page at {off}");
    }
    assert_eq!(
        cuda::try_classify(up.as_ptr() as usize).expect("classify"),
        cuda::Memory::Host
    );
    // SAFETY: `up` holds `len` writable bytes, no copy uses it yet.
    unsafe { std::slice::from_raw_parts_mut(up.as_ptr(), len) }.copy_from_slice(&data);
    // SAFETY: `up` is pinned memory of this engine, left untouched until the stream is waited
    // for; `dev` holds `len` bytes of device memory of this context.
    unsafe { engine.copy_to_device(dev.ptr(), up.as_ptr(), len, &stream) }.expect("copy up");
    engine.wait_stream(&stream).expect("wait");
    let mut host = vec![0u8; len];
    dev.copy_to_host(0, &mut host).expect("read back");
    assert_bytes_eq(&host, &data, "device bytes from placed memory");
    // SAFETY: `down` is pinned memory of this engine, read only after the wait.
    unsafe { engine.copy_from_device(down.as_ptr(), dev.ptr(), len, &stream) }.expect("copy");
    engine.wait_stream(&stream).expect("wait");
    // SAFETY: the copy into `down` has completed.
    let back = unsafe { std::slice::from_raw_parts(down.as_ptr(), len) };
    assert_bytes_eq(back, &data, "placed memory from the device");
    // SAFETY: both from this engine's allocator, no copy in flight, freed once.
    unsafe { engine.free_pinned(up, len) }.expect("free");
    // SAFETY: as above.
    unsafe { engine.free_pinned(down, len) }.expect("free");
    engine.destroy_stream(stream).expect("destroy");
}

/// Pinned memory ferrio maps itself (a 2 MiB buffer: huge pages, registered) comes zero-filled
/// and says so, so that buffers are not written again before use; the driver's own
/// (`cuMemHostAlloc`) does not claim to, and gets written.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (make gpu-test)"]
fn mapped_pinned_memory_comes_zeroed_and_the_drivers_is_not_assumed_to() {
    crate::require_cuda!();
    let len = 2 << 20;
    for pinned in [PinnedMemory::Mapped, PinnedMemory::Driver] {
        let context = Context::primary(0).expect("context");
        let engine = CudaEngine::new(context).expect("engine").pinning(pinned);
        let _bound = engine.bind().expect("bind");
        let p = engine.alloc_pinned(len).expect("pinned memory");
        let zeroed = engine.pinned_is_zeroed(p);
        assert_eq!(zeroed, pinned == PinnedMemory::Mapped, "{pinned:?}");
        if zeroed {
            // SAFETY: `p` holds `len` bytes of this engine's memory that nothing else uses.
            let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), len) };
            assert!(
                bytes.iter().all(|&b| b == 0),
                "mapped memory with a non-zero byte"
            );
        }
        // SAFETY: from this engine's allocator, no copy in flight, freed once.
        unsafe { engine.free_pinned(p, len) }.expect("free");
    }
}
