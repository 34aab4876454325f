//! The cache policy: `cache=keep` leaves what it read in the page cache, `cache=bypass` leaves
//! a cold file cold and a hot one hot, `auto` keeps a file that fits in memory and does not
//! evict a hot file when it streams one "larger than memory" (assumed through the testing hook).

use std::path::Path;

use ferrio::{pagecache, CacheMode, File, Settings};

use super::common::{data, disk_dir, make_file};

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
    let p = dir.path().join("w-keep");
    let f = File::options()
        .cache(CacheMode::Keep)
        .open(&p, "w")
        .unwrap();
    assert_eq!(f.write_at(&bytes, 0).unwrap(), LEN);
    f.sync().unwrap();
    assert!(share(&p) >= 0.99, "w-keep: {}", share(&p));
    assert_eq!(std::fs::read(&p).unwrap(), bytes);
    // auto writes like bypass: buffered writes measured several times slower than direct.
    for (mode, name) in [(CacheMode::Bypass, "w-bypass"), (CacheMode::Auto, "w-auto")] {
        let p = dir.path().join(name);
        let f = File::options().cache(mode).open(&p, "w").unwrap();
        assert_eq!(f.write_at(&bytes, 0).unwrap(), LEN);
        f.sync().unwrap();
        if f.direct_support().is_available() {
            assert!(share(&p) <= 0.03, "{name}: {}", share(&p));
        }
        assert_eq!(std::fs::read(&p).unwrap(), bytes);
    }
}

#[test]
fn a_bad_cache_value_names_the_accepted_forms() {
    let mut s = Settings::default();
    let e = s.set("cache", "sometimes").unwrap_err().to_string();
    assert!(e.contains("auto|keep|bypass"), "{e}");
}
