//! The conformance suite on the emulated device, plus what only the emulator can observe:
//! overlap, buffer reuse while copies are in flight, completion, injected driver failures.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferrio::bounce::emulated::{EmulatedDevice, SCRIBBLE};
use ferrio::bounce::{BounceRing, CopyEngine, PinnedBudget, RingSet, PINNED_ALIGN};
use ferrio::cuda::DevicePtr;
use ferrio::{Error, Settings};

use super::{DeviceMem, Harness};
use crate::support::{assert_bytes_eq, poison, random_bytes};

/// Emulated device memory, freed on drop.
struct EmuMem {
    device: EmulatedDevice,
    ptr: DevicePtr,
}

impl DeviceMem for EmuMem {
    fn ptr(&self) -> DevicePtr {
        self.ptr
    }
    fn write(&self, offset: usize, data: &[u8]) {
        let at = self.ptr.checked_add(offset).expect("address");
        self.device.write_device(at, data).expect("write device");
    }
    fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        let at = self.ptr.checked_add(offset).expect("address");
        self.device.read_device(at, len).expect("read device")
    }
}

impl Drop for EmuMem {
    fn drop(&mut self) {
        self.device.free_device(self.ptr).expect("free device");
    }
}

struct Emu(EmulatedDevice);

impl Harness for Emu {
    type Engine = EmulatedDevice;
    fn engine(&self) -> EmulatedDevice {
        self.0.clone()
    }
    fn alloc(&self, len: usize) -> Box<dyn DeviceMem + '_> {
        Box::new(EmuMem {
            device: self.0.clone(),
            ptr: self.0.alloc_device(len).expect("alloc device"),
        })
    }
}

/// Runs one conformance check on a fresh emulated device, then checks the emulator saw no
/// buffer reuse while a copy was in flight, and that every resource was given back.
fn check(delay: Duration, case: fn(&Emu)) {
    let device = EmulatedDevice::new(delay);
    case(&Emu(device.clone()));
    assert_eq!(device.violations(), Vec::<String>::new());
    assert_eq!(device.copies_in_flight(), 0);
    assert_eq!(device.pinned_allocations(), 0, "pinned memory leaked");
    assert_eq!(device.live_streams(), 0, "stream leaked");
    assert_eq!(device.live_events(), 0, "event leaked");
}

macro_rules! suite {
    ($delay:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                super::check($delay, super::super::$case::<super::Emu>);
            }
        )*
    };
}

/// Copies that complete at once.
mod instant {
    use std::time::Duration;
    suite!(Duration::ZERO;
        read_lands_every_byte, short_read_stops_at_eof, read_error_stops_and_waits,
        overclaiming_callback_is_an_error, write_sends_every_byte, write_error_stops_and_waits,
        ring_is_reused, reads_in_a_row_land_after_finish, pinned_cap_limits_rings,
        ring_set_reuses_and_remakes);
}

/// Copies that take a while, so the ring must wait for buffers and for completion.
mod slow {
    use std::time::Duration;
    suite!(Duration::from_micros(300);
        read_lands_every_byte, short_read_stops_at_eof, read_error_stops_and_waits,
        write_sends_every_byte, write_error_stops_and_waits, ring_is_reused,
        reads_in_a_row_land_after_finish, pinned_cap_limits_rings);
}

fn new_ring(device: &EmulatedDevice, b: usize, depth: usize) -> BounceRing<EmulatedDevice> {
    BounceRing::new(
        device.clone(),
        b,
        depth,
        Arc::new(PinnedBudget::new(u64::MAX)),
    )
    .expect("ring")
}

/// Reading chunk i+1 happens while the copy of chunk i is still running, and up to one copy
/// per buffer runs at once.
#[test]
fn reads_overlap_copies() {
    let device = EmulatedDevice::new(Duration::from_millis(40));
    let b = 4096;
    let chunks = 6;
    let mut ring = new_ring(&device, b, 3);
    let dst = device.alloc_device(chunks * b).expect("alloc");
    let data = random_bytes(chunks * b, 1);
    let mut in_flight_at_read = Vec::new();
    let got = ring
        .read_to_device(dst, chunks * b, 0, &mut |buf, off| {
            in_flight_at_read.push(device.copies_in_flight());
            let off = off as usize;
            buf.copy_from_slice(&data[off..off + buf.len()]);
            Ok(buf.len())
        })
        .expect("read");
    assert_eq!(got, chunks * b);
    assert_bytes_eq(
        &device.read_device(dst, chunks * b).expect("read"),
        &data,
        "overlap",
    );
    assert_eq!(in_flight_at_read[0], 0);
    assert!(
        in_flight_at_read[1..].iter().any(|&n| n >= 1),
        "no read ran while an earlier copy was in flight: {in_flight_at_read:?}"
    );
    assert!(
        device.max_in_flight() >= 2,
        "with 3 buffers, copies should queue up: max in flight {}",
        device.max_in_flight()
    );
    assert!(
        device.max_in_flight() <= 3,
        "never more copies than buffers"
    );
}

/// While the write callback writes chunk i, the copy of chunk i+1 is in flight.
#[test]
fn writes_overlap_copies() {
    let device = EmulatedDevice::new(Duration::from_millis(20));
    let b = 4096;
    let chunks = 6;
    let mut ring = new_ring(&device, b, 2);
    let src = device.alloc_device(chunks * b).expect("alloc");
    let data = random_bytes(chunks * b, 2);
    device.write_device(src, &data).expect("write");
    let mut file = poison(chunks * b);
    let mut in_flight_at_write = Vec::new();
    ring.write_from_device(src, chunks * b, 0, &mut |buf, off| {
        in_flight_at_write.push(device.copies_in_flight());
        let off = off as usize;
        file[off..off + buf.len()].copy_from_slice(buf);
        Ok(())
    })
    .expect("write");
    assert_bytes_eq(&file, &data, "overlapped write");
    assert!(
        in_flight_at_write[..chunks - 1].iter().any(|&n| n >= 1),
        "no write ran while the next copy was in flight: {in_flight_at_write:?}"
    );
    assert_eq!(device.violations(), Vec::<String>::new());
}

/// No buffer is written by the read callback while a copy from it is in flight, nor read by the
/// write callback while a copy into it is: checked at each callback, and by the emulator
/// comparing every copy's source at execution with what it held when issued.
#[test]
fn buffers_are_not_reused_while_in_flight() {
    let device = EmulatedDevice::new(Duration::from_millis(2));
    let b = 4096;
    let len = 16 * b + 5;
    for depth in [1, 2, 4] {
        let mut ring = new_ring(&device, b, depth);
        let dst = device.alloc_device(len).expect("alloc");
        let data = random_bytes(len, depth as u64);
        let mut busy_reads = 0;
        ring.read_to_device(dst, len, 0, &mut |buf, off| {
            if device.host_range_busy(buf.as_ptr(), buf.len()) {
                busy_reads += 1;
            }
            let off = off as usize;
            buf.copy_from_slice(&data[off..off + buf.len()]);
            Ok(buf.len())
        })
        .expect("read");
        assert_eq!(
            busy_reads, 0,
            "depth {depth}: a buffer was refilled mid-copy"
        );
        assert!(
            ring.stats().waits > 0,
            "depth {depth}: with slow copies the ring must have waited for a buffer"
        );
        let mut file = poison(len);
        let mut busy_writes = 0;
        ring.write_from_device(dst, len, 0, &mut |buf, off| {
            if device.host_range_busy(buf.as_ptr(), buf.len()) {
                busy_writes += 1;
            }
            let off = off as usize;
            file[off..off + buf.len()].copy_from_slice(buf);
            Ok(())
        })
        .expect("write");
        assert_eq!(busy_writes, 0, "depth {depth}: a buffer was read mid-copy");
        assert_bytes_eq(&file, &data, "round trip");
        device.free_device(dst).expect("free");
    }
    assert_eq!(device.violations(), Vec::<String>::new());
}

/// The emulator's checks have teeth: overwriting a buffer whose copy is in flight is reported,
/// and a device-to-host destination holds the scribble until its copy completes.
#[test]
fn emulator_catches_misuse() {
    let device = EmulatedDevice::new(Duration::from_millis(30));
    let dst = device.alloc_device(4096).expect("alloc");
    {
        let _bound = device.bind().expect("bind");
        let stream = device.create_stream().expect("stream");
        let pinned = device.alloc_pinned(4096).expect("pinned");
        // SAFETY: `pinned` is a fresh 4096-byte allocation of this device.
        unsafe { std::ptr::write_bytes(pinned.as_ptr(), 7, 4096) };
        // SAFETY: valid pinned and device ranges; the overwrite below breaks the contract on
        // purpose, against emulated memory.
        unsafe { device.copy_to_device(dst, pinned.as_ptr(), 4096, &stream) }.expect("copy");
        assert!(device.host_range_busy(pinned.as_ptr(), 1));
        // SAFETY: see above: a deliberate contract violation the emulator must report.
        unsafe { std::ptr::write_bytes(pinned.as_ptr(), 9, 4096) };
        device.wait_stream(&stream).expect("wait");
        assert_eq!(device.violations().len(), 1, "{:?}", device.violations());

        // SAFETY: valid pinned and device ranges; the buffer is only read after the wait.
        unsafe { device.copy_from_device(pinned.as_ptr(), dst, 4096, &stream) }.expect("copy");
        // SAFETY: reading the destination early is the misuse being demonstrated.
        let early = unsafe { std::ptr::read_volatile(pinned.as_ptr()) };
        assert_eq!(early, SCRIBBLE, "an early reader sees the scribble");
        device.wait_stream(&stream).expect("wait");
        // SAFETY: the copy has completed.
        let late = unsafe { std::ptr::read_volatile(pinned.as_ptr()) };
        assert_eq!(late, 7, "the device held the bytes of the first copy");
        // SAFETY: allocated above, no copy in flight.
        unsafe { device.free_pinned(pinned, 4096) }.expect("free");
        device.destroy_stream(stream).expect("destroy");
    }
    // Copies without a binding are refused, like driver calls without a current context.
    let err = device.create_stream().expect_err("unbound");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    device.free_device(dst).expect("free");
}

/// A read returns only when all its copies have completed, however slow they are.
#[test]
fn read_returns_after_every_copy_completed() {
    let device = EmulatedDevice::new(Duration::from_millis(5));
    let len = 9 * 4096 + 1;
    for depth in [1, 3, 8] {
        let mut ring = new_ring(&device, 4096, depth);
        let dst = device.alloc_device(len).expect("alloc");
        let data = random_bytes(len, 40 + depth as u64);
        let before = device.copies_issued();
        ring.read_to_device(dst, len, 0, &mut |buf, off| {
            let off = off as usize;
            buf.copy_from_slice(&data[off..off + buf.len()]);
            Ok(buf.len())
        })
        .expect("read");
        assert_eq!(
            device.copies_in_flight(),
            0,
            "depth {depth}: copies still running"
        );
        assert_eq!(device.copies_issued() - before, 10);
        assert_eq!(device.copies_completed(), device.copies_issued());
        // Read back without waiting for anything, as a kernel launched now would.
        assert_bytes_eq(
            &device.read_device(dst, len).expect("read"),
            &data,
            "completion",
        );
        device.free_device(dst).expect("free");
    }
}

/// `start_read_to_device` returns with copies still running, and the next range's first chunk
/// is read while they run: a worker moving from one task to the next never waits for the copy
/// engine. `finish` then waits for all of them.
#[test]
fn reads_in_a_row_keep_copies_running_until_finish() {
    let device = EmulatedDevice::new(Duration::from_millis(30));
    let b = 4096;
    let mut ring = new_ring(&device, b, 2);
    let dst = device.alloc_device(6 * b).expect("alloc");
    let data = random_bytes(6 * b, 9);
    let mut in_flight_at_read = Vec::new();
    for range in 0..3 {
        let at = range * 2 * b;
        ring.start_read_to_device(
            DevicePtr(dst.0 + at as u64),
            2 * b,
            at as u64,
            &mut |buf, off| {
                in_flight_at_read.push(device.copies_in_flight());
                let off = off as usize;
                buf.copy_from_slice(&data[off..off + buf.len()]);
                Ok(buf.len())
            },
        )
        .expect("start read");
        assert!(
            device.copies_in_flight() >= 1,
            "range {range}: the call waited for its copies"
        );
    }
    // The first chunk of ranges 2 and 3 was read while the previous range's copies ran.
    assert!(
        in_flight_at_read[2] >= 1 && in_flight_at_read[4] >= 1,
        "{in_flight_at_read:?}"
    );
    ring.finish().expect("finish");
    assert_eq!(
        device.copies_in_flight(),
        0,
        "finish returned before the copies"
    );
    assert_bytes_eq(
        &device.read_device(dst, 6 * b).expect("read"),
        &data,
        "three ranges",
    );
    assert_eq!(device.violations(), Vec::<String>::new());
    device.free_device(dst).expect("free");
}

/// A copy that cannot be issued stops the transfer with the driver's error; the copies issued
/// before it complete, and the ring stays usable.
#[test]
fn failure_to_issue_a_copy_is_returned() {
    let device = EmulatedDevice::new(Duration::from_millis(3));
    let b = 4096;
    let mut ring = new_ring(&device, b, 2);
    let dst = device.alloc_device(8 * b).expect("alloc");
    let data = random_bytes(8 * b, 5);
    let mut fill = |buf: &mut [u8], off: u64| {
        let off = off as usize;
        buf.copy_from_slice(&data[off..off + buf.len()]);
        Ok(buf.len())
    };
    device.fail_copy_issue(3);
    let before = device.copies_issued();
    let err = ring
        .read_to_device(dst, 8 * b, 0, &mut fill)
        .expect_err("injected");
    assert!(
        matches!(&err, Error::Cuda { message, .. } if message.contains("injected")),
        "{err}"
    );
    assert_eq!(
        device.copies_issued() - before,
        3,
        "nothing issued after the failure"
    );
    assert_eq!(
        device.copies_in_flight(),
        0,
        "issued copies were waited for"
    );
    assert_bytes_eq(
        &device.read_device(dst, 3 * b).expect("read"),
        &data[..3 * b],
        "chunks before the failure",
    );
    assert!(!ring.is_poisoned());
    assert_eq!(
        ring.read_to_device(dst, 8 * b, 0, &mut fill).ok(),
        Some(8 * b)
    );

    device.fail_copy_issue(1);
    let mut file = poison(8 * b);
    let err = ring
        .write_from_device(dst, 8 * b, 0, &mut |buf, off| {
            let off = off as usize;
            file[off..off + buf.len()].copy_from_slice(buf);
            Ok(())
        })
        .expect_err("injected");
    assert!(matches!(err, Error::Cuda { .. }), "{err}");
    assert_eq!(device.copies_in_flight(), 0);
    assert_bytes_eq(
        &file,
        &poison(8 * b),
        "nothing written after a failed issue",
    );
    device.free_device(dst).expect("free");
}

/// A copy that fails while running (a sticky context error with the driver) is reported by the
/// wait; the ring is poisoned and refuses work, and a ring set replaces it.
#[test]
fn failure_while_copying_poisons_the_ring() {
    let device = EmulatedDevice::new(Duration::from_millis(1));
    let b = 4096;
    let budget = Arc::new(PinnedBudget::new(u64::MAX));
    let mut set = RingSet::new(budget.clone());
    let mut settings = Settings::default();
    settings.bounce_buffer_size = b as u64;
    settings.bounce_buffers = 2;
    let dst = device.alloc_device(6 * b).expect("alloc");
    let data = random_bytes(6 * b, 6);
    let mut fill = |buf: &mut [u8], off: u64| {
        let off = off as usize;
        buf.copy_from_slice(&data[off..off + buf.len()]);
        Ok(buf.len())
    };
    device.fail_copy_run(1);
    let ring = set.ring(&device, &settings).expect("ring");
    let err = ring
        .read_to_device(dst, 6 * b, 0, &mut fill)
        .expect_err("injected");
    assert!(
        matches!(&err, Error::Cuda { message, .. } if message.contains("injected")),
        "{err}"
    );
    assert!(ring.is_poisoned());
    assert_eq!(device.copies_in_flight(), 0);
    let err = ring
        .read_to_device(dst, b, 0, &mut fill)
        .expect_err("poisoned ring");
    assert!(
        matches!(
            err,
            Error::Cuda {
                call: "bounce ring",
                ..
            }
        ),
        "{err}"
    );
    device.clear_fault();
    let used_by_poisoned = budget.used();
    let fresh = set.ring(&device, &settings).expect("replacement ring");
    assert!(!fresh.is_poisoned());
    assert_eq!(
        fresh.read_to_device(dst, 6 * b, 0, &mut fill).ok(),
        Some(6 * b)
    );
    assert_bytes_eq(
        &device.read_device(dst, 6 * b).expect("read"),
        &data,
        "after poison",
    );
    // The poisoned ring's buffers were leaked, not freed: still counted.
    assert_eq!(budget.used(), used_by_poisoned + 2 * b as u64);
    assert_eq!(device.pinned_allocations(), 4);
    set.clear();
    assert_eq!(
        device.pinned_allocations(),
        2,
        "only the leaked ring's buffers remain"
    );
}

/// The driver does not promise page-aligned pinned memory; the ring aligns by itself, and frees
/// what it allocated.
#[test]
fn ring_aligns_misaligned_pinned_memory() {
    let device = EmulatedDevice::new(Duration::ZERO);
    device.set_misaligned_pinned(true);
    let b = 8192;
    let mut ring = new_ring(&device, b, 3);
    let dst = device.alloc_device(5 * b).expect("alloc");
    let data = random_bytes(5 * b, 8);
    ring.read_to_device(dst, 5 * b, 0, &mut |buf, off| {
        assert_eq!(
            buf.as_ptr() as usize % PINNED_ALIGN,
            0,
            "buffer not page-aligned"
        );
        let off = off as usize;
        buf.copy_from_slice(&data[off..off + buf.len()]);
        Ok(buf.len())
    })
    .expect("read");
    assert_bytes_eq(
        &device.read_device(dst, 5 * b).expect("read"),
        &data,
        "misaligned",
    );
    assert_eq!(device.pinned_allocations(), 3);
    drop(ring);
    assert_eq!(device.pinned_allocations(), 0);
    assert_eq!((device.live_streams(), device.live_events()), (0, 0));
    device.free_device(dst).expect("free");
}

/// Many threads make rings against one small budget at once: the cap is exceeded by at most
/// one buffer per ring, every transfer is right, and all pinned memory comes back.
#[test]
fn pinned_cap_holds_under_concurrency() {
    let device = EmulatedDevice::new(Duration::from_micros(200));
    let b = 4096usize;
    let threads = 8;
    let limit = 6 * b as u64;
    let budget = Arc::new(PinnedBudget::new(limit));
    let peak = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (device, budget, peak) = (device.clone(), budget.clone(), &peak);
            s.spawn(move || {
                for round in 0..5u64 {
                    let mut ring =
                        BounceRing::new(device.clone(), b, 4, budget.clone()).expect("ring");
                    peak.fetch_max(budget.used(), Ordering::Relaxed);
                    let len = 7 * b + t;
                    let dst = device.alloc_device(len).expect("alloc");
                    let data = random_bytes(len, (t as u64) << 8 | round);
                    let got = ring
                        .read_to_device(dst, len, 0, &mut |buf, off| {
                            let off = off as usize;
                            buf.copy_from_slice(&data[off..off + buf.len()]);
                            Ok(buf.len())
                        })
                        .expect("read");
                    assert_eq!(got, len);
                    assert_bytes_eq(&device.read_device(dst, len).expect("read"), &data, "cap");
                    device.free_device(dst).expect("free");
                }
            });
        }
    });
    let peak = peak.load(Ordering::Relaxed);
    assert!(
        peak <= limit + (threads * b) as u64,
        "pinned peak {peak} above cap {limit} + one buffer per ring"
    );
    assert_eq!(budget.used(), 0);
    assert_eq!(device.pinned_allocations(), 0);
    assert_eq!(device.violations(), Vec::<String>::new());
}
