//! The cache policy: `cache=keep` leaves what it read in the page cache, `cache=bypass` leaves
//! a cold file cold and a hot one hot, `auto` keeps a file that fits in memory and does not
//! evict a hot file when it streams one "larger than memory" (assumed through the testing hook).

use std::path::Path;

use ferrio::policy::WriteProbe;
use ferrio::{pagecache, CacheMode, File, Settings};

use super::common::{data, disk_dir, make_file, open_cold_to_fill};

const LEN: usize = 16 << 20;

fn share(p: &Path) -> f64 {
    pagecache::residency(p, 0, None).unwrap().share()
}

fn read_all(f: &File) {
    let mut buf = vec![0u8; f.len().unwrap() as usize];
    let n = f.read_at(&mut buf, 0).unwrap();
    assert_eq!(n, buf.len());
}

fn cold_file(dir: &Path, name: &str, seed: u64) -> std::path::PathBuf {
    let p = make_file(dir, name, &data(LEN, seed));
    let f = std::fs::File::open(&p).unwrap();
    f.sync_all().unwrap();
    pagecache::drop_file(&p).unwrap();
    assert!(share(&p) < 0.02, "not cold: {}", share(&p));
    p
}

fn direct_works(p: &Path) -> bool {
    File::open(p, "r").unwrap().direct_support().is_available()
}

#[test]
fn keep_leaves_the_file_in_the_page_cache() {
    let dir = disk_dir();
    let p = cold_file(dir.path(), "keep", 1);
    let f = File::options()
        .cache(CacheMode::Keep)
        .open(&p, "r")
        .unwrap();
    assert!(f.cache_decision().keeps());
    read_all(&f);
    assert!(share(&p) >= 0.99, "keep: {}", share(&p));
}

#[test]
fn bypass_leaves_a_cold_file_cold_and_a_hot_file_hot() {
    let dir = disk_dir();
    let p = cold_file(dir.path(), "bypass", 2);
    let f = File::options()
        .cache(CacheMode::Bypass)
        .open(&p, "r")
        .unwrap();
    assert!(!f.cache_decision().keeps());
    read_all(&f);
    assert!(share(&p) <= 0.03, "bypass, cold: {}", share(&p));
    let _ = std::fs::read(&p).unwrap();
    read_all(&f);
    assert!(share(&p) >= 0.99, "bypass, hot: {}", share(&p));
}

#[test]
fn bypass_without_direct_io_drops_what_it_read() {
    let dir = disk_dir();
    let p = cold_file(dir.path(), "bypass-off", 3);
    let mut s = Settings::default();
    s.direct_read = ferrio::DirectMode::Off;
    let f = File::options()
        .settings(s)
        .cache(CacheMode::Bypass)
        .open(&p, "r")
        .unwrap();
    read_all(&f);
    assert!(share(&p) <= 0.03, "buffered bypass: {}", share(&p));
}

#[test]
fn auto_keeps_a_file_that_fits_in_memory() {
    let dir = disk_dir();
    let p = cold_file(dir.path(), "auto-small", 4);
    let f = File::open(&p, "r").unwrap();
    assert_eq!(f.cache_decision().asked, CacheMode::Auto);
    assert!(f.cache_decision().keeps(), "{}", f.cache_decision());
    read_all(&f);
    assert!(share(&p) >= 0.99, "auto, small file: {}", share(&p));
}

#[test]
fn auto_streams_a_file_larger_than_memory_without_evicting_a_hot_one() {
    let dir = disk_dir();
    let hot = make_file(dir.path(), "hot", &data(LEN / 4, 5));
    let _ = std::fs::read(&hot).unwrap();
    let big = cold_file(dir.path(), "big", 6);
    if !direct_works(&big) {
        eprintln!("skipped: no O_DIRECT here");
    }
    // "Memory" smaller than the file: auto must bypass.
    let f = File::options()
        .assume_available_memory(LEN as u64)
        .open(&big, "r")
        .unwrap();
    let d = f.cache_decision();
    assert!(!d.keeps(), "{d}");
    assert!(d.to_string().contains("auto → bypass"), "{d}");
    read_all(&f);
    assert!(share(&big) <= 0.03, "stream left cached: {}", share(&big));
    assert!(share(&hot) >= 0.8, "hot file evicted: {}", share(&hot));
}

#[test]
fn writes_keep_or_bypass_as_asked() {
    let dir = disk_dir();
    let bytes = data(LEN, 7);
    for (mode, name) in [(CacheMode::Keep, "w-keep"), (CacheMode::Bypass, "w-bypass")] {
        let p = dir.path().join(name);
        let f = File::options().cache(mode).open(&p, "w").unwrap();
        assert_eq!(f.write_at(&bytes, 0).unwrap(), LEN);
        f.sync().unwrap();
        if mode == CacheMode::Keep {
            assert!(share(&p) >= 0.99, "{name}: {}", share(&p));
        } else if f.direct_support().is_available() {
            assert!(share(&p) <= 0.03, "{name}: {}", share(&p));
        }
        assert_eq!(std::fs::read(&p).unwrap(), bytes);
    }
}

/// A probe that finds buffered writes `buffered` times as fast as direct ones.
fn probe(buffered: f64) -> WriteProbe {
    WriteProbe {
        buffered: buffered * (1u64 << 30) as f64,
        direct: (1u64 << 30) as f64,
    }
}

#[test]
fn an_auto_write_measures_the_device_once_and_leaves_nothing_behind() {
    let dir = disk_dir();
    let bytes = data(LEN, 8);
    let p = dir.path().join("w-auto");
    let f = File::open(&p, "w").unwrap();
    assert_eq!(f.write_at(&bytes, 0).unwrap(), LEN);
    f.sync().unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), bytes);
    if !f.direct_support().is_available() {
        eprintln!("skipped: no O_DIRECT here");
        return;
    }
    // Which way the write went is tested with assumed probes below: other tests of this process
    // write to the same device meanwhile, and their buffered writes refine its verdict.
    let measured = f
        .measured_writes()
        .expect("an auto write measures the device");
    assert!(
        measured.buffered > 0.0 && measured.direct > 0.0,
        "{measured:?}"
    );
    // Remembered for the device: another file there has it without writing.
    let other = File::open(dir.path().join("w-other"), "w").unwrap();
    assert!(other.measured_writes().is_some());
    // The probe's temporary file left nothing behind.
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[test]
fn auto_writes_within_the_limit_go_through_the_page_cache_where_it_is_faster() {
    let dir = disk_dir();
    let bytes = data(LEN, 9);
    for (ratio, cached) in [(4.0, true), (1.1, false)] {
        let p = dir.path().join(format!("w-{ratio}"));
        let f = File::options()
            .assume_write_probe(probe(ratio))
            .open(&p, "w")
            .unwrap();
        if !f.direct_support().is_available() {
            eprintln!("skipped: no O_DIRECT here");
            return;
        }
        assert!(f.cache_decision().write_keep_limit >= LEN as u64);
        assert_eq!(f.write_at(&bytes, 0).unwrap(), LEN);
        f.sync().unwrap();
        let s = share(&p);
        assert!(if cached { s >= 0.99 } else { s <= 0.03 }, "{ratio}: {s}");
        assert_eq!(std::fs::read(&p).unwrap(), bytes);
    }
}

#[test]
fn auto_writes_past_the_limit_bypass_where_buffered_writes_are_faster() {
    let dir = disk_dir();
    let bytes = data(LEN, 10);
    let p = dir.path().join("w-stream");
    // "Memory" of 8 files: the limit is the smaller of half of it and the kernel's dirty limit.
    let f = File::options()
        .assume_available_memory(8 * LEN as u64)
        .assume_write_probe(probe(4.0))
        .open(&p, "w")
        .unwrap();
    if !f.direct_support().is_available() {
        eprintln!("skipped: no O_DIRECT here");
        return;
    }
    let limit = f.cache_decision().write_keep_limit;
    assert!(limit > 0 && limit <= 4 * LEN as u64, "{limit}");
    // A write that ends past the limit goes direct: nothing of it stays cached.
    let past = limit.next_multiple_of(1 << 20);
    assert_eq!(f.write_at(&bytes, past).unwrap(), LEN);
    f.sync().unwrap();
    let after = pagecache::residency(&p, past, Some(LEN as u64)).unwrap();
    assert!(after.share() <= 0.03, "past the limit: {}", after.share());
    // One that ends within it is kept.
    let head = &bytes[..(limit as usize).min(LEN) / 2];
    assert_eq!(f.write_at(head, 0).unwrap(), head.len());
    let within = pagecache::residency(&p, 0, Some(head.len() as u64)).unwrap();
    assert!(
        within.share() >= 0.99,
        "within the limit: {}",
        within.share()
    );
    let back = std::fs::read(&p).unwrap();
    assert_eq!(&back[past as usize..], &bytes[..]);
    assert_eq!(&back[..head.len()], head);
}

#[test]
fn a_bad_cache_value_names_the_accepted_forms() {
    let mut s = Settings::default();
    let e = s.set("cache", "sometimes").unwrap_err().to_string();
    assert!(e.contains("auto|keep|bypass"), "{e}");
}

#[test]
fn a_kept_cold_read_filled_block_by_block_is_whole_and_cached() {
    use ferrio::FillReads;
    let dir = disk_dir();
    // Larger than a fill task (64 MiB), and not a whole number of 2 MiB blocks.
    let len = (80 << 20) + 12_345;
    let bytes = data(len, 11);
    let p = make_file(dir.path(), "fill", &bytes);
    std::fs::File::open(&p).unwrap().sync_all().unwrap();
    for reads in [FillReads::Populate, FillReads::Readahead] {
        let Some(f) = open_cold_to_fill(&p, reads) else {
            return;
        };
        // From an offset that is no block's start, as a checkpoint's data section is.
        let at = 4096 + 8;
        let mut buf = vec![0u8; len - at];
        assert_eq!(
            f.read_at(&mut buf, at as u64).unwrap(),
            buf.len(),
            "{reads}"
        );
        assert!(buf == bytes[at..], "{reads}: wrong bytes");
        assert!(share(&p) >= 0.99, "{reads}: {}", share(&p));
    }
    // The default is populate, wherever the kernel can map the file for it.
    let f = File::options()
        .cache(CacheMode::Keep)
        .open(&p, "r")
        .unwrap();
    assert_eq!(Settings::default().fill_reads, FillReads::Auto);
    assert_eq!(f.fill_reads(), Some(FillReads::Populate));
}

#[test]
fn fills_on_a_file_system_without_a_block_device_go_through_readahead() {
    use ferrio::FillReads;
    let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
        eprintln!("skipped: no /dev/shm");
        return;
    };
    let p = make_file(dir.path(), "f", &data(1 << 20, 12));
    let kept = |reads: FillReads, cache: CacheMode| {
        let mut s = Settings::default();
        s.fill_reads = reads;
        File::options()
            .settings(s)
            .cache(cache)
            .open(&p, "r")
            .unwrap()
            .fill_reads()
    };
    // tmpfs has no disk to keep busy: populate is for block devices only.
    assert_eq!(
        kept(FillReads::Populate, CacheMode::Keep),
        Some(FillReads::Readahead)
    );
    assert_eq!(
        kept(FillReads::Readahead, CacheMode::Keep),
        Some(FillReads::Readahead)
    );
    assert_eq!(
        kept(FillReads::Auto, CacheMode::Keep),
        Some(FillReads::Readahead)
    );
    // A file that bypasses the cache is never filled.
    assert_eq!(kept(FillReads::Populate, CacheMode::Bypass), None);
}
