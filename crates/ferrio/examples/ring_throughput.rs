//! The bounce ring's own rate on each visible GPU: 256 MiB from host memory to the device and
//! back through `read_to_device`/`write_from_device`, one thread, `memcpy` standing in for the
//! file, every byte compared. Run in a release build on a GPU machine:
//! `cargo run --release --example ring_throughput` (or the carried binary; `make gpu-test`).

use std::time::Instant;

use ferrio::bounce;
use ferrio::cuda::{self, Context, DeviceBuffer};
use ferrio::Settings;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let info = cuda::driver_info()?;
    let len = 256usize << 20;
    let data: Vec<u8> = (0..len)
        .map(|i| (i ^ (i >> 8) ^ (i >> 16)) as u8 | 1)
        .collect();
    for ordinal in 0..info.device_count {
        let context = Context::primary(ordinal)?;
        let mem = DeviceBuffer::new(ordinal, len, false)?;
        for (buffer, depth) in [(1usize << 20, 4usize), (4 << 20, 4), (8 << 20, 2)] {
            let mut settings = Settings::default();
            settings.bounce_buffer_size = buffer as u64;
            settings.bounce_buffers = depth;
            mem.copy_from_host(0, &vec![0x5A; len])?;
            let t = Instant::now();
            let got =
                bounce::read_to_device(context, mem.ptr(), len, 0, &settings, &mut |buf, off| {
                    let off = off as usize;
                    buf.copy_from_slice(&data[off..off + buf.len()]);
                    Ok(buf.len())
                })?;
            let read_s = t.elapsed().as_secs_f64();
            let mut back = vec![0u8; len];
            mem.copy_to_host(0, &mut back)?;
            if got != len || back != data {
                return Err(format!("device {ordinal}: the bytes read back differ").into());
            }
            // Touched before timing, so page faults of a fresh allocation are not measured.
            let mut file = vec![0x5Au8; len];
            let t = Instant::now();
            bounce::write_from_device(context, mem.ptr(), len, 0, &settings, &mut |buf, off| {
                let off = off as usize;
                file[off..off + buf.len()].copy_from_slice(buf);
                Ok(())
            })?;
            let write_s = t.elapsed().as_secs_f64();
            if file != data {
                return Err(format!("device {ordinal}: the bytes written back differ").into());
            }
            println!(
                "device {ordinal}: ring {depth} x {} KiB: host->device {:.2} GB/s, \
                 device->host {:.2} GB/s (one thread, memcpy as the 'file')",
                buffer >> 10,
                len as f64 / read_s / 1e9,
                len as f64 / write_s / 1e9
            );
        }
        bounce::release_thread_rings();
    }
    Ok(())
}
