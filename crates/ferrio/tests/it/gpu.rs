//! Reads into and writes from GPU memory through `File`. The GPU tests are ignored unless asked
//! for and run for real on the GPU machine (`make gpu-test`); the no-driver test runs everywhere
//! else.

use ferrio::cuda::{self, DeviceBuffer};
use ferrio::{DirectMode, File};

use super::common::{data, disk_dir, make_file, open_cold_to_fill, settings, POISON};

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (make gpu-test)"]
fn file_to_gpu_and_back_at_random_offsets() {
    crate::require_cuda!();
    let dir = disk_dir();
    let len = (40 << 20) + 4099;
    let content = data(len, 21);
    let path = make_file(dir.path(), "f", &content);
    for (policy, overread) in [
        (DirectMode::Off, false),
        (DirectMode::On, false),
        (DirectMode::Auto, true),
    ] {
        let f = File::options()
            .settings(settings(policy, overread, 1 << 20))
            .open(&path, "r+")
            .unwrap();
        let dev = DeviceBuffer::new(0, len + 8192, false).unwrap();
        let mut seed = 7u64;
        for round in 0..12 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let offset = (seed >> 20) % len as u64;
            let size = ((seed >> 8) as usize % (len - offset as usize + 5000)).max(1);
            let dev_off = (seed as usize >> 3) % 4096;
            dev.copy_from_host(0, &vec![POISON; len + 8192]).unwrap();
            // SAFETY: `dev` outlives the waited-on future and nothing else touches it.
            let fut =
                unsafe { f.pread_device(dev.ptr().checked_add(dev_off).unwrap(), size, offset) };
            let n = fut.wait().unwrap();
            let want = &content[offset as usize..(offset as usize + size).min(len)];
            assert_eq!(n, want.len(), "{policy} round {round}");
            let mut host = vec![0u8; len + 8192];
            dev.copy_to_host(0, &mut host).unwrap();
            assert!(
                host[dev_off..dev_off + n] == *want,
                "{policy} round {round}: wrong bytes"
            );
            assert!(
                host[..dev_off].iter().all(|&b| b == POISON),
                "wrote before the range"
            );
            assert!(
                host[dev_off + n..].iter().all(|&b| b == POISON),
                "wrote past the range"
            );
        }
        // Device -> file: write a patch from GPU memory, compare the whole file.
        let patch = data(9 << 20, 22);
        dev.copy_from_host(100, &patch).unwrap();
        // SAFETY: `dev` outlives the waited-on future and is not written meanwhile.
        let fut =
            unsafe { f.pwrite_device(dev.ptr().checked_add(100).unwrap(), patch.len(), 12345) };
        assert_eq!(fut.wait().unwrap(), patch.len());
        let on_disk = std::fs::read(&path).unwrap();
        assert!(
            on_disk[12345..12345 + patch.len()] == patch[..],
            "{policy}: device write"
        );
        assert!(on_disk[..12345] == content[..12345]);
        std::fs::write(&path, &content).unwrap();
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (make gpu-test)"]
fn host_memory_is_refused_by_the_device_calls() {
    crate::require_cuda!();
    let dir = disk_dir();
    let path = make_file(dir.path(), "f", &data(4096, 1));
    let f = File::open(&path, "r").unwrap();
    let host = vec![0u8; 4096];
    // SAFETY: the call fails before touching the memory (it is not device memory).
    let e = unsafe { f.pread_device(cuda::DevicePtr(host.as_ptr() as u64), 4096, 0) }
        .wait()
        .unwrap_err();
    assert!(e.to_string().contains("not GPU memory"), "{e}");
}

#[test]
fn without_a_driver_device_calls_say_why() {
    if cuda::available().is_ok() {
        eprintln!("skipped: a CUDA driver is present");
        return;
    }
    let dir = disk_dir();
    let path = make_file(dir.path(), "f", &data(4096, 1));
    let f = File::open(&path, "r").unwrap();
    // SAFETY: the call fails before touching any memory (no driver).
    let e = unsafe { f.pread_device(cuda::DevicePtr(0x1000), 4096, 0) }
        .wait()
        .unwrap_err();
    assert!(matches!(e, ferrio::Error::CudaUnavailable { .. }), "{e}");
    assert!(e.to_string().contains("CUDA is not available"), "{e}");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (make gpu-test)"]
fn a_cold_kept_file_fills_the_page_cache_on_its_way_to_the_gpu() {
    use ferrio::{pagecache, FillReads};
    crate::require_cuda!();
    let dir = disk_dir();
    // Larger than a fill task (64 MiB), not a whole number of 2 MiB blocks.
    let len = (80 << 20) + 12_345;
    let content = data(len, 23);
    let path = make_file(dir.path(), "fill", &content);
    std::fs::File::open(&path).unwrap().sync_all().unwrap();
    for reads in [FillReads::Populate, FillReads::Readahead] {
        let Some(f) = open_cold_to_fill(&path, reads) else {
            return;
        };
        let at = 4096 + 8;
        let size = len - at;
        let dev = DeviceBuffer::new(0, size, false).unwrap();
        dev.copy_from_host(0, &vec![POISON; size]).unwrap();
        // SAFETY: `dev` outlives the waited-on future and nothing else touches it.
        let n = unsafe { f.pread_device(dev.ptr(), size, at as u64) }
            .wait()
            .unwrap();
        assert_eq!(n, size, "{reads}");
        let mut host = vec![0u8; size];
        dev.copy_to_host(0, &mut host).unwrap();
        assert!(host == content[at..], "{reads}: wrong bytes");
        let share = pagecache::residency(&path, 0, None).unwrap().share();
        assert!(share >= 0.99, "{reads}: {share}");
    }
}

/// Several files read at once into one device buffer, as the shards of a checkpoint are: the
/// workers move between the requests (their copies left running on one ring per worker), and
/// every request completes with its bytes in place, nothing written around them.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (make gpu-test)"]
fn several_files_read_at_once_into_one_device_buffer() {
    crate::require_cuda!();
    let dir = disk_dir();
    let lens = [(24 << 20) + 77, 9 << 20, (31 << 20) + 4096, (3 << 20) + 1];
    let files: Vec<_> = lens
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let content = data(len, 40 + i as u64);
            let path = make_file(dir.path(), &format!("shard{i}"), &content);
            let f = File::options()
                .settings(settings(DirectMode::Auto, false, 4 << 20))
                .open(&path, "r")
                .unwrap();
            (f, content)
        })
        .collect();
    // Each file's bytes at an odd place after the one before, 8 bytes of poison between.
    let mut at = Vec::new();
    let mut end = 3;
    for &len in &lens {
        at.push(end);
        end += len + 8;
    }
    let dev = DeviceBuffer::new(0, end, false).unwrap();
    for round in 0..3 {
        dev.copy_from_host(0, &vec![POISON; end]).unwrap();
        let futures: Vec<_> = files
            .iter()
            .zip(&at)
            .map(|((f, content), &at)| {
                // SAFETY: `dev` outlives the futures, waited on below; the ranges are disjoint.
                unsafe { f.pread_device(dev.ptr().checked_add(at).unwrap(), content.len(), 0) }
            })
            .collect();
        for (i, fut) in futures.into_iter().enumerate() {
            assert_eq!(fut.wait().unwrap(), lens[i], "round {round}, file {i}");
        }
        let mut host = vec![0u8; end];
        dev.copy_to_host(0, &mut host).unwrap();
        let mut from = 0;
        for (i, ((_, content), &at)) in files.iter().zip(&at).enumerate() {
            assert!(
                host[from..at].iter().all(|&b| b == POISON),
                "round {round}: before file {i}"
            );
            assert!(
                host[at..at + content.len()] == content[..],
                "round {round}: file {i}"
            );
            from = at + content.len();
        }
        assert!(
            host[from..].iter().all(|&b| b == POISON),
            "round {round}: after the last"
        );
    }
}

/// A cancel that says it took effect ends a device read cancelled, one that comes too late
/// changes nothing, and either way no copy into the destination lands after `wait` returns
/// (the buffer, poisoned right after, stays poisoned); the next read lands every byte.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (make gpu-test)"]
fn a_cancelled_device_read_ends_cancelled_and_nothing_lands_after_it() {
    crate::require_cuda!();
    let dir = disk_dir();
    let len = (24 << 20) + 4099;
    let content = data(len, 24);
    let path = make_file(dir.path(), "cancel", &content);
    let f = File::options()
        .settings(settings(DirectMode::Auto, false, 1 << 20))
        .open(&path, "r")
        .unwrap();
    let dev = DeviceBuffer::new(0, len, false).unwrap();
    let poison = vec![POISON; len];
    let mut host = vec![0u8; len];
    let (mut cancelled, mut finished) = (0, 0);
    for round in 0..24u64 {
        // SAFETY: `dev` outlives the waited-on future and nothing else touches it meanwhile.
        let fut = unsafe { f.pread_device(dev.ptr(), len, 0) };
        // From at once to well into the read, so cancels land before, during and after.
        std::thread::sleep(std::time::Duration::from_micros(round * round * 40));
        let asked = fut.cancel();
        match fut.wait() {
            Err(ferrio::Error::Cancelled) if asked => cancelled += 1,
            Ok(n) if !asked => {
                assert_eq!(n, len, "round {round}");
                finished += 1;
            }
            other => panic!("round {round}: cancel said {asked}, the read ended {other:?}"),
        }
        dev.copy_from_host(0, &poison).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        dev.copy_to_host(0, &mut host).unwrap();
        assert!(
            host.iter().all(|&b| b == POISON),
            "round {round}: a copy landed after the read's wait returned"
        );
        // SAFETY: as above.
        let n = unsafe { f.pread_device(dev.ptr(), len, 0) }.wait().unwrap();
        assert_eq!(n, len, "round {round}: the read after");
        dev.copy_to_host(0, &mut host).unwrap();
        assert!(
            host == content,
            "round {round}: wrong bytes in the read after"
        );
    }
    println!("cancelled {cancelled}, finished before the cancel {finished}");
    assert!(cancelled > 0, "no cancel took effect in 24 rounds");
}
