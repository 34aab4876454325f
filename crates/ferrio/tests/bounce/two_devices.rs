//! Two emulated devices in one process, as two GPUs in one host: the emulator refuses work
//! issued under the other device's binding or on its streams, and one [`RingSet`] per thread
//! serves both devices at once, each through a ring of its own, from several threads.

use std::sync::Arc;
use std::time::Duration;

use ferrio::bounce::emulated::EmulatedDevice;
use ferrio::bounce::{CopyEngine, PinnedBudget, RingSet};
use ferrio::{Error, Settings};

use crate::support::{assert_bytes_eq, poison, random_bytes};

/// Work on device A while device B is bound, or on B's stream, is refused and listed as a
/// violation of A, as the driver refuses it with two GPUs; a nested binding gives the outer one
/// back when dropped.
#[test]
fn emulator_refuses_work_under_the_other_devices_binding() {
    let (a, b) = (EmulatedDevice::default(), EmulatedDevice::default());
    let dst = a.alloc_device(4096).expect("alloc");
    let bound_a = a.bind().expect("bind a");
    let stream_a = a.create_stream().expect("stream a");
    let pinned = a.alloc_pinned(4096).expect("pinned");
    let event_a = a.create_event().expect("event a");
    {
        let _bound_b = b.bind().expect("bind b");
        let err = a
            .create_stream()
            .expect_err("a stream of A while B is bound");
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        // SAFETY: valid pinned and device ranges of A; the copy must be refused before it runs.
        let err = unsafe { a.copy_to_device(dst, pinned.as_ptr(), 4096, &stream_a) }
            .expect_err("a copy of A while B is bound");
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        let err = a
            .record(&event_a, &stream_a)
            .expect_err("a record of A while B is bound");
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        let stream_b = b.create_stream().expect("stream b");
        let err = a
            .record(&event_a, &stream_b)
            .expect_err("A's event on B's stream");
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        b.destroy_stream(stream_b).expect("destroy");
    }
    // Dropping B's binding made A current again.
    let stream_b = {
        let _bound_b = b.bind().expect("bind b");
        b.create_stream().expect("stream b")
    };
    // SAFETY: valid pinned and device ranges of A; refused before it runs (B's stream).
    let err = unsafe { a.copy_to_device(dst, pinned.as_ptr(), 4096, &stream_b) }
        .expect_err("A's copy on B's stream");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    // SAFETY: as above, now on A's own stream under A's binding: it runs.
    unsafe { a.copy_to_device(dst, pinned.as_ptr(), 4096, &stream_a) }.expect("copy");
    a.wait_stream(&stream_a).expect("wait");
    assert_eq!(a.copies_issued(), 1, "only the well-formed copy was issued");
    assert_eq!(a.violations().len(), 5, "{:?}", a.violations());
    assert_eq!(b.violations(), Vec::<String>::new());
    // SAFETY: allocated above, no copy in flight.
    unsafe { a.free_pinned(pinned, 4096) }.expect("free");
    a.destroy_event(event_a).expect("destroy");
    a.destroy_stream(stream_a).expect("destroy");
    drop(stream_b);
    drop(bound_a);
    a.free_device(dst).expect("free");
}

/// Several threads, each with one ring set, interleave reads and writes into two devices while
/// the OTHER device is bound on the thread (as a caller's thread may have another GPU current):
/// every byte lands, each device's copies ran under its own binding and on its own streams (no
/// violation, and exactly the expected number of copies per device), and each thread holds one
/// ring per device.
#[test]
fn one_ring_set_serves_two_devices_from_several_threads() {
    let devices = [
        EmulatedDevice::new(Duration::from_micros(150)),
        EmulatedDevice::new(Duration::from_micros(50)),
    ];
    let budget = Arc::new(PinnedBudget::new(u64::MAX));
    let mut settings = Settings::default();
    settings.bounce_buffer_size = 4096;
    settings.bounce_buffers = 3;
    settings.pinned_limit = 1 << 30;
    let threads = 4u64;
    let rounds = 6u64;
    let len_of = |t: u64, r: u64| (3 * 4096 + 517 * t as usize + 1031 * r as usize) % 20_000 + 1;
    std::thread::scope(|s| {
        for t in 0..threads {
            let (devices, budget, settings) = (&devices, budget.clone(), &settings);
            s.spawn(move || {
                let mut set = RingSet::new(budget);
                for r in 0..rounds {
                    // Alternate the device every transfer, starting with a different one per
                    // thread, so both devices are busy at once.
                    let which = ((t + r) % 2) as usize;
                    let (device, other) = (&devices[which], &devices[1 - which]);
                    let len = len_of(t, r);
                    let data = random_bytes(len, t << 16 | r);
                    let dst = device.alloc_device(len).expect("alloc");
                    device.write_device(dst, &poison(len)).expect("poison");
                    let _other_bound = other.bind().expect("bind the other device");
                    let ring = set.ring(device, settings).expect("ring");
                    let got = ring
                        .read_to_device(dst, len, 0, &mut |buf, off| {
                            let off = off as usize;
                            buf.copy_from_slice(&data[off..off + buf.len()]);
                            Ok(buf.len())
                        })
                        .expect("read");
                    assert_eq!(got, len);
                    let what = format!("thread {t}, round {r}, device {which}");
                    assert_bytes_eq(&device.read_device(dst, len).expect("read"), &data, &what);
                    let mut back = poison(len);
                    ring.write_from_device(dst, len, 0, &mut |buf, off| {
                        let off = off as usize;
                        back[off..off + buf.len()].copy_from_slice(buf);
                        Ok(())
                    })
                    .expect("write");
                    assert_bytes_eq(&back, &data, &what);
                    device.free_device(dst).expect("free");
                }
                assert_eq!(set.len(), 2, "thread {t}: one ring per device");
                set.clear();
            });
        }
    });
    for (which, device) in devices.iter().enumerate() {
        assert_eq!(device.violations(), Vec::<String>::new(), "device {which}");
        let copies: u64 = (0..threads)
            .flat_map(|t| (0..rounds).map(move |r| (t, r)))
            .filter(|&(t, r)| ((t + r) % 2) as usize == which)
            .map(|(t, r)| 2 * len_of(t, r).div_ceil(4096) as u64)
            .sum();
        assert_eq!(
            device.copies_issued(),
            copies,
            "device {which}: its own copies only"
        );
        assert_eq!(device.copies_in_flight(), 0);
        assert_eq!(
            device.pinned_allocations(),
            0,
            "device {which}: pinned leaked"
        );
        assert_eq!(device.live_streams(), 0, "device {which}: stream leaked");
    }
    assert_eq!(budget.used(), 0);
}
