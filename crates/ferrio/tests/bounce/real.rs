//! The conformance suite on the real driver, one run per visible GPU, plus the thread-local
//! entry points the engine calls. Ignored unless asked for (`make gpu-test`); the ring's
//! throughput is measured by `examples/ring_throughput.rs`, not here.

use ferrio::bounce::{self, CudaEngine, PinnedBudget};
use ferrio::cuda::{self, Context, DeviceBuffer, DevicePtr};
use ferrio::{PinnedMemory, Settings};

use super::{DeviceMem, Harness};
use crate::require_cuda;
use crate::support::{assert_bytes_eq, poison, random_bytes};

impl DeviceMem for DeviceBuffer {
    fn ptr(&self) -> DevicePtr {
        DeviceBuffer::ptr(self)
    }
    fn write(&self, offset: usize, data: &[u8]) {
        self.copy_from_host(offset, data).expect("cuMemcpyHtoD");
    }
    fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        // cuMemcpyDtoH runs on the legacy default stream, which does not wait for the ring's
        // non-blocking stream: reading right after a transfer shows whether it had completed.
        let mut out = vec![0; len];
        self.copy_to_host(offset, &mut out).expect("cuMemcpyDtoH");
        out
    }
}

#[derive(Clone, Copy)]
struct Gpu {
    ordinal: usize,
    context: Context,
    pinned: PinnedMemory,
}

impl Harness for Gpu {
    type Engine = CudaEngine;
    fn engine(&self) -> CudaEngine {
        CudaEngine::new(self.context)
            .expect("engine")
            .pinning(self.pinned)
    }
    fn alloc(&self, len: usize) -> Box<dyn DeviceMem + '_> {
        Box::new(DeviceBuffer::new(self.ordinal, len, false).expect("cuMemAlloc"))
    }
}

fn gpus() -> Vec<Gpu> {
    let info = cuda::driver_info().expect("driver info");
    (0..info.device_count)
        .map(|ordinal| Gpu {
            ordinal,
            context: Context::primary(ordinal).expect("primary context"),
            pinned: PinnedMemory::Mapped,
        })
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (make gpu-test)"]
fn real_driver_conformance() {
    require_cuda!();
    let info = cuda::driver_info().expect("driver info");
    println!(
        "CUDA driver {}, {} device(s)",
        info.version, info.device_count
    );
    for gpu in gpus() {
        for pinned in [PinnedMemory::Mapped, PinnedMemory::Driver] {
            let gpu = Gpu { pinned, ..gpu };
            super::conformance(&gpu);
            println!(
                "device {}: bounce ring conformance passed, pinned memory {pinned}",
                gpu.ordinal
            );
        }
    }
}

/// The entry points the engine's workers call: one ring per thread and context, reused,
/// released when the worker ends; several threads at once.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (make gpu-test)"]
fn real_driver_thread_rings() {
    require_cuda!();
    let mut settings = Settings::default();
    settings.bounce_buffer_size = 64 << 10;
    settings.bounce_buffers = 4;
    let pinned_before = PinnedBudget::global().used();
    for gpu in gpus() {
        let len = (8 << 20) + 123;
        let data = random_bytes(len, 31);
        let mem = DeviceBuffer::new(gpu.ordinal, len, false).expect("alloc");
        mem.copy_from_host(0, &poison(len)).expect("poison");
        std::thread::scope(|s| {
            let parts = 4;
            let part = len.div_ceil(parts);
            for p in 0..parts {
                let (data, mem, settings, context) = (&data, &mem, &settings, gpu.context);
                s.spawn(move || {
                    let start = p * part;
                    let n = part.min(len - start);
                    let dst = mem.ptr().checked_add(start).expect("address");
                    for _ in 0..3 {
                        let got = bounce::read_to_device(
                            context,
                            dst,
                            n,
                            start as u64,
                            settings,
                            &mut |buf, off| {
                                let off = off as usize;
                                let k = buf.len().min(data.len() - off);
                                buf[..k].copy_from_slice(&data[off..off + k]);
                                Ok(k)
                            },
                        )
                        .expect("read");
                        assert_eq!(got, n);
                    }
                    let mut file = poison(n);
                    let put =
                        bounce::write_from_device(context, dst, n, 0, settings, &mut |buf, off| {
                            let off = off as usize;
                            file[off..off + buf.len()].copy_from_slice(buf);
                            Ok(())
                        })
                        .expect("write");
                    assert_eq!(put, n);
                    assert_bytes_eq(&file, &data[start..start + n], "thread ring round trip");
                    let stats = bounce::thread_ring_stats(context).expect("this thread has a ring");
                    assert_eq!(stats.bytes, 4 * n as u64, "one ring served all four calls");
                    bounce::release_thread_rings();
                    assert!(bounce::thread_ring_stats(context).is_none());
                });
            }
        });
        let mut back = vec![0; len];
        mem.copy_to_host(0, &mut back).expect("read back");
        assert_bytes_eq(&back, &data, "thread rings");
    }
    assert_eq!(
        PinnedBudget::global().used(),
        pinned_before,
        "released rings give their pinned memory back"
    );
}
