//! [`Resolver`] end to end: a real file, a fake sysfs holding its device number and a fake
//! mount table, so the whole `resolve(path)` path and its cache run against fakes.

use super::*;

use std::os::unix::fs::MetadataExt;
use std::sync::Barrier;

/// A fake sysfs and mountinfo describing the real device of a real file, so the whole
/// `resolve(path)` path runs against fakes. `None` (with the reason printed) when the temporary
/// directory has no block device.
struct FakeMachine {
    sys: FakeSysfs,
    file: PathBuf,
    dev: DevId,
    resolver: Resolver,
}

fn fake_machine() -> Option<FakeMachine> {
    let sys = FakeSysfs::new();
    let file = sys.root().join("data/file");
    fs::create_dir_all(sys.root().join("data")).expect("mkdir data");
    fs::write(&file, b"x").expect("write file");
    let dev = DevId::from_st_dev(fs::metadata(&file).expect("stat").dev());
    if !dev.is_block_device() {
        eprintln!("skipped: the temp dir is on a file system without a block device ({dev})");
        return None;
    }
    let disk = format!("{}/nvme7n1", nvme_ctrl(7));
    sys.disk(&disk, dev, 0, 512, 512);
    let data = sys.root().join("data");
    let mountinfo = sys.root().join("mountinfo");
    fs::write(
        &mountinfo,
        format!(
            "27 1 {dev} / / rw - ext4 /dev/fake rw\n\
             28 27 {dev} /x {} rw - xfs /dev/fake rw\n\
             29 27 0:23 / /dev/shm rw - tmpfs tmpfs rw\n",
            data.display()
        ),
    )
    .expect("write mountinfo");
    let resolver = Resolver::new(sys.root(), &mountinfo);
    Some(FakeMachine {
        sys,
        file,
        dev,
        resolver,
    })
}

#[test]
fn resolve_reads_fake_sysfs_and_mountinfo_and_caches_per_device() {
    let Some(m) = fake_machine() else { return };
    let first = m.resolver.resolve(&m.file).expect("resolve");
    assert_eq!(first.dev(), m.dev);
    assert_eq!(first.pool().to_string(), "nvme7");
    assert_eq!(
        first.fs_type, "xfs",
        "the bind mount at data/ is the longest prefix"
    );
    assert_eq!(
        first.mount_point.as_deref(),
        Some(&*m.sys.root().join("data"))
    );
    assert_eq!(m.resolver.cached_len(), 1);

    // A second file of the same device: served from the cache, sharing the stack.
    let other = m.sys.root().join("other");
    fs::write(&other, b"y").expect("write");
    let second = m.resolver.resolve(&other).expect("resolve");
    assert!(Arc::ptr_eq(&first.device, &second.device));
    assert_eq!(second.mount_point.as_deref(), Some(Path::new("/")));
    assert_eq!(second.fs_type, "ext4");
    assert_eq!(second.path, other);

    // Uncached: a fresh walk, equal content, not the cached allocation, cache untouched.
    let fresh = m.resolver.resolve_uncached(&m.file).expect("resolve");
    assert!(!Arc::ptr_eq(&first.device, &fresh.device));
    assert_eq!(first, fresh);

    // The cache really is used: with sysfs gone, cached answers still come, fresh ones fail.
    fs::remove_dir_all(m.sys.root().join("dev")).expect("remove dev/");
    assert!(m.resolver.resolve(&m.file).is_ok());
    let err = m.resolver.resolve_uncached(&m.file).unwrap_err();
    assert_eq!(err.path(), Some(&*m.file), "errors name the user's file");
    assert!(err.to_string().contains("not in sysfs"), "{err}");
    m.resolver.clear_cache();
    assert_eq!(m.resolver.cached_len(), 0);
    assert!(m.resolver.resolve(&m.file).is_err());
}

#[test]
fn resolve_of_a_missing_file_is_a_stat_error() {
    let err = resolve(Path::new("/nonexistent/ferrio/file")).unwrap_err();
    assert!(matches!(err, Error::Io { op: Op::Stat, .. }), "{err:?}");
}

#[test]
fn concurrent_resolutions_share_one_cached_stack() {
    let Some(m) = fake_machine() else { return };
    const THREADS: usize = 8;
    let barrier = Barrier::new(THREADS);
    let stacks: Vec<Vec<Arc<DeviceStack>>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    (0..200)
                        .map(|_| m.resolver.device(m.dev).expect("resolve"))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker panicked"))
            .collect()
    });
    let first = &stacks[0][0];
    assert!(stacks.iter().flatten().all(|s| Arc::ptr_eq(s, first)));
    assert_eq!(m.resolver.cached_len(), 1);
}

#[test]
fn concurrent_resolutions_and_cache_clears_agree() {
    let Some(m) = fake_machine() else { return };
    let expected = m.resolver.resolve_uncached(&m.file).expect("resolve");
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..200 {
                m.resolver.clear_cache();
                std::thread::yield_now();
            }
        });
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..200 {
                    let chain = m.resolver.resolve(&m.file).expect("resolve");
                    assert_eq!(chain, expected);
                }
            });
        }
    });
}
