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
    let _bound = engine.bind().expect("bind");
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
    carries_copies(&engine, up, down, len);
}

/// Copies `len` random bytes from pinned `up` to the device and back into pinned `down`, and
/// frees both (this engine's pinned memory, unused).
fn carries_copies(
    engine: &CudaEngine,
    up: std::ptr::NonNull<u8>,
    down: std::ptr::NonNull<u8>,
    len: usize,
) {
    let data = random_bytes(len, 42);
    let dev = DeviceBuffer::new(0, len, false).expect("device memory");
    let stream = engine.create_stream().expect("stream");
    // SAFETY: `up` holds `len` writable bytes, no copy uses it yet.
    unsafe { std::slice::from_raw_parts_mut(up.as_ptr(), len) }.copy_from_slice(&data);
    // SAFETY: `up` is pinned memory of this engine, left untouched until the stream is waited
    // for; `dev` holds `len` bytes of device memory of this context.
    unsafe { engine.copy_to_device(dev.ptr(), up.as_ptr(), len, &stream) }.expect("copy up");
    engine.wait_stream(&stream).expect("wait");
    let mut host = vec![0u8; len];
    dev.copy_to_host(0, &mut host).expect("read back");
    assert_bytes_eq(&host, &data, "device bytes from pinned memory");
    // SAFETY: `down` is pinned memory of this engine, read only after the wait.
    unsafe { engine.copy_from_device(down.as_ptr(), dev.ptr(), len, &stream) }.expect("copy");
    engine.wait_stream(&stream).expect("wait");
    // SAFETY: the copy into `down` has completed.
    let back = unsafe { std::slice::from_raw_parts(down.as_ptr(), len) };
    assert_bytes_eq(back, &data, "pinned memory from the device");
    // SAFETY: both from this engine's allocator, no copy in flight, freed once.
    unsafe { engine.free_pinned(up, len) }.expect("free");
    // SAFETY: as above.
    unsafe { engine.free_pinned(down, len) }.expect("free");
    engine.destroy_stream(stream).expect("destroy");
}

/// Ring memory made ahead (`prepare_pinned_soon`'s slab) is what the engine hands out next for
/// a buffer of that size, the whole slab pinned at the first: zero-filled, and it carries copies
/// both ways; a buffer freed goes back to the slab and comes out again. A buffer of another size
/// is mapped fresh.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (make gpu-test)"]
fn ring_memory_made_ahead_is_pinned_when_taken() {
    crate::require_cuda!();
    if ferrio::topology::online_nodes(std::path::Path::new("/sys")).map_or(0, |n| n.len()) > 1 {
        eprintln!("skipped: several NUMA nodes (rings go on the GPU's node, not made ahead)");
        return;
    }
    let len = 6 << 20; // no other test asks for buffers of this size
    assert!(ferrio::bounce::make_ahead_now(len, 3));
    let (start, total, free) = ferrio::bounce::made_ahead().expect("a slab");
    assert_eq!((total, free), (3 * len, 3));
    let in_slab =
        |p: std::ptr::NonNull<u8>| (start..start + total).contains(&(p.as_ptr() as usize));
    let engine = CudaEngine::new(Context::primary(0).expect("context")).expect("engine");
    let _bound = engine.bind().expect("bind");
    let up = engine.alloc_pinned(len).expect("pinned memory");
    let down = engine.alloc_pinned(len).expect("pinned memory");
    for p in [up, down] {
        assert!(in_slab(p), "not made ahead");
        assert!(engine.pinned_is_zeroed(p));
        // SAFETY: `p` holds `len` bytes of this engine's memory that nothing else uses.
        let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), len) };
        assert!(
            bytes.iter().all(|&b| b == 0),
            "made ahead with a non-zero byte"
        );
    }
    assert_eq!(ferrio::bounce::made_ahead().map(|m| m.2), Some(1));
    let other = engine.alloc_pinned(len / 2).expect("pinned memory");
    assert!(!in_slab(other));
    // SAFETY: from this engine's allocator, no copy in flight, freed once.
    unsafe { engine.free_pinned(other, len / 2) }.expect("free");
    carries_copies(&engine, up, down, len);
    assert_eq!(
        ferrio::bounce::made_ahead().map(|m| m.2),
        Some(3),
        "freed buffers go back to the slab"
    );
    let again = engine.alloc_pinned(len).expect("pinned memory");
    assert!(in_slab(again));
    assert!(
        !engine.pinned_is_zeroed(again),
        "a buffer used before is not zero"
    );
    let third = engine.alloc_pinned(len).expect("pinned memory");
    assert!(in_slab(third) && third != again);
    carries_copies(&engine, again, third, len);
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

/// The streams and events the engine hands to rings, made at once with the first stream of a
/// context, are each their own: each stream carries copies, and each event, recorded after one,
/// is complete once waited for, with the copy's bytes in place.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (make gpu-test)"]
fn ring_streams_and_events_are_distinct_and_order_copies() {
    crate::require_cuda!();
    let engine = CudaEngine::new(Context::primary(0).expect("context")).expect("engine");
    let _bound = engine.bind().expect("bind");
    let len = 64 << 10;
    let data = random_bytes(len, 7);
    let up = engine.alloc_pinned(len).expect("pinned memory");
    // SAFETY: `up` holds `len` writable bytes, no copy uses it yet.
    unsafe { std::slice::from_raw_parts_mut(up.as_ptr(), len) }.copy_from_slice(&data);
    // More than one context's first pass makes (a stream per worker of a pool, at most 32, and
    // an event per buffer of each).
    let streams: Vec<_> = (0..40)
        .map(|_| engine.create_stream().expect("stream"))
        .collect();
    let events: Vec<_> = (0..2 * streams.len() + 8)
        .map(|_| engine.create_event().expect("event"))
        .collect();
    let distinct = |mut names: Vec<String>| {
        let n = names.len();
        names.sort();
        names.dedup();
        names.len() == n
    };
    let names = streams.iter().map(|s| format!("{s:?}")).collect();
    assert!(distinct(names), "a stream handed out twice");
    let names = events.iter().map(|e| format!("{e:?}")).collect();
    assert!(distinct(names), "an event handed out twice");
    for (i, (stream, event)) in streams.iter().zip(events.chunks(2)).enumerate() {
        let dev = DeviceBuffer::new(0, len, false).expect("device memory");
        // SAFETY: `up` is this engine's pinned memory, not written while copies run (each is
        // waited for below); `dev` holds `len` bytes of this context's device memory.
        unsafe { engine.copy_to_device(dev.ptr(), up.as_ptr(), len, stream) }.expect("copy");
        let event = &event[i % 2];
        engine.record(event, stream).expect("record");
        engine.wait_event(event).expect("wait");
        assert!(
            engine.is_complete(event).expect("query"),
            "event {i} waited for"
        );
        let mut back = vec![0u8; len];
        dev.copy_to_host(0, &mut back).expect("read back");
        assert_bytes_eq(&back, &data, &format!("copy on stream {i}"));
    }
    for event in events {
        engine.destroy_event(event).expect("destroy");
    }
    for stream in streams {
        engine.destroy_stream(stream).expect("destroy");
    }
    // SAFETY: from this engine's allocator, no copy in flight, freed once.
    unsafe { engine.free_pinned(up, len) }.expect("free");
}

/// A process holding a device's primary context counts as having started CUDA (so ferrio makes
/// no ring memory ahead in it: its reads may come at once).
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (make gpu-test)"]
fn a_primary_context_held_counts_as_cuda_started() {
    crate::require_cuda!();
    let engine = CudaEngine::new(Context::primary(0).expect("context")).expect("engine");
    let _bound = engine.bind().expect("bind");
    assert!(cuda::primary_context_active());
}
