//! `ferrio::copy`: trees, names, large and sparse files, symlinks, permissions, a full disk and
//! a cancel; every copy is compared byte for byte, and no temporary file may be left behind.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferrio::copy::{copy, CopyMethod, CopyOptions, CopyProgress};
use ferrio::{Error, Settings};

use super::common::{data, disk_dir, make_file, LoopFs};

/// Settings with small tasks so that tens of MiB make many tasks and windows.
fn small_tasks() -> Settings {
    let mut s = Settings::default();
    s.task_size = 1 << 20;
    s
}

/// Asserts that `b` is a copy of `a`: same kinds, same symlink targets, same bytes, same names.
fn assert_same_tree(a: &Path, b: &Path) {
    let (ma, mb) = (
        fs::symlink_metadata(a).unwrap(),
        fs::symlink_metadata(b).unwrap_or_else(|e| panic!("{}: {e}", b.display())),
    );
    let (ta, tb) = (ma.file_type(), mb.file_type());
    assert_eq!(
        (ta.is_dir(), ta.is_file(), ta.is_symlink()),
        (tb.is_dir(), tb.is_file(), tb.is_symlink()),
        "{} vs {}",
        a.display(),
        b.display()
    );
    if ta.is_symlink() {
        assert_eq!(fs::read_link(a).unwrap(), fs::read_link(b).unwrap());
    } else if ta.is_file() {
        assert_eq!(ma.len(), mb.len(), "{}", b.display());
        assert!(
            fs::read(a).unwrap() == fs::read(b).unwrap(),
            "{} differs from {}",
            b.display(),
            a.display()
        );
    } else {
        let names = |d: &Path| {
            let mut v: Vec<_> = fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            v.sort();
            v
        };
        let (na, nb) = (names(a), names(b));
        assert_eq!(na, nb, "{} vs {}", a.display(), b.display());
        for n in na {
            assert_same_tree(&a.join(&n), &b.join(&n));
        }
    }
}

/// Every path under `dir` whose name marks a ferrio temporary file.
fn temp_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir(dir) else {
        return out;
    };
    for e in rd {
        let e = e.unwrap();
        let p = e.path();
        if e.file_name().to_string_lossy().contains(".ferrio-") {
            out.push(p.clone());
        }
        if e.file_type().unwrap().is_dir() {
            out.extend(temp_files(&p));
        }
    }
    out
}

fn assert_no_temp_files(dir: &Path) {
    let left = temp_files(dir);
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

/// A tree of nested directories, empty files and directories, many small files and names with
/// spaces, unicode, newlines and a leading dash.
fn build_tree(root: &Path) {
    fs::create_dir_all(root.join("a/b/c")).unwrap();
    fs::create_dir_all(root.join("empty dir")).unwrap();
    make_file(root, "empty", b"");
    make_file(&root.join("a/b/c"), "deep.bin", &data(100_000, 1));
    for name in [
        "with space",
        "ünïcödé ✓",
        "new\nline",
        "-dash",
        ".hidden",
        "tab\there",
    ] {
        make_file(root, name, name.as_bytes());
    }
    for i in 0..120u64 {
        let dir = root.join(format!("a/many{}", i % 3));
        fs::create_dir_all(&dir).unwrap();
        let len = (i * 977 % 20_000) as usize;
        make_file(&dir, &format!("f{i}"), &data(len, i + 10));
    }
}

#[test]
fn tree_is_copied_exactly() {
    let d = disk_dir();
    let src = d.path().join("src");
    build_tree(&src);
    let dst = d.path().join("dst");
    let opts = CopyOptions::new().recursive(true).settings(small_tasks());
    let r = copy([&src], &dst, &opts).unwrap();
    assert!(r.is_ok(), "{:?}", r.errors);
    r.check().unwrap();
    assert_same_tree(&src, &dst);
    assert_no_temp_files(&dst);
    assert_eq!(r.files, 1 + 1 + 6 + 120, "{r:?}");
    assert_eq!(
        r.dirs,
        1 + 3 + 1 + 3,
        "src, a, a/b, a/b/c, empty dir, a/many0..2: {r:?}"
    );
    let names: u64 = [
        "with space",
        "ünïcödé ✓",
        "new\nline",
        "-dash",
        ".hidden",
        "tab\there",
    ]
    .iter()
    .map(|n| n.len() as u64)
    .sum();
    let many: u64 = (0..120u64).map(|i| i * 977 % 20_000).sum();
    let expected = 100_000 + names + many;
    assert_eq!(r.bytes, expected);
    assert!(r.seconds > 0.0);
    let read: u64 = r.devices.iter().map(|d| d.bytes_read).sum();
    let written: u64 = r.devices.iter().map(|d| d.bytes_written).sum();
    assert_eq!((read, written), (r.bytes, r.bytes), "{:?}", r.devices);

    // Copying again into the now existing directory merges into dst/src.
    let r = copy([&src], &dst, &opts).unwrap();
    assert!(r.is_ok(), "{:?}", r.errors);
    assert_same_tree(&src, &dst.join("src"));
}

#[test]
fn destination_rules_follow_cp() {
    let d = disk_dir();
    let f1 = make_file(d.path(), "f1", &data(5000, 2));
    let f2 = make_file(d.path(), "f2", &data(7000, 3));
    let dir = d.path().join("dir");
    fs::create_dir(&dir).unwrap();
    let o = CopyOptions::new();

    // A file into an existing directory goes inside it; to a new name, becomes that name.
    copy([&f1], &dir, &o).unwrap().check().unwrap();
    assert_eq!(fs::read(dir.join("f1")).unwrap(), fs::read(&f1).unwrap());
    copy([&f1], d.path().join("renamed"), &o)
        .unwrap()
        .check()
        .unwrap();
    assert_eq!(fs::read(d.path().join("renamed")).unwrap(), data(5000, 2));

    // Several sources need a directory.
    copy([&f1, &f2], &dir, &o).unwrap().check().unwrap();
    assert_eq!(fs::read(dir.join("f2")).unwrap(), data(7000, 3));
    let e = copy([&f1, &f2], d.path().join("renamed"), &o).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert!(e.to_string().contains("directory"), "{e}");

    // A directory needs recursive, and cannot go into itself.
    let e = copy([&dir], d.path().join("dir2"), &o).unwrap_err();
    assert!(e.to_string().contains("recursive"), "{e}");
    assert_eq!(
        e.os_error().and_then(|e| e.raw_os_error()),
        Some(libc::EISDIR)
    );
    assert_eq!(e.path(), Some(dir.as_path()));
    assert!(!d.path().join("dir2").exists());
    let r = CopyOptions::new().recursive(true);
    let e = copy([&dir], dir.join("sub"), &r).unwrap_err();
    assert!(e.to_string().contains("into itself"), "{e}");
    let e = copy([&dir], &dir, &r).unwrap_err();
    assert!(e.to_string().contains("into itself"), "{e}");
    assert!(!dir.join("sub").exists() && !dir.join("dir").exists());

    // A missing source fails before anything is copied, naming it.
    let e = copy([d.path().join("nope"), f1.clone()], &dir, &o).unwrap_err();
    assert_eq!(
        e.os_error().map(|e| e.kind()),
        Some(std::io::ErrorKind::NotFound)
    );
    assert!(e.to_string().contains("nope"), "{e}");

    // A file onto itself is refused and left alone.
    let rep = copy([&f1], &f1, &o).unwrap();
    assert_eq!(rep.errors.len(), 1);
    let e = rep.check().unwrap_err();
    assert!(matches!(e, Error::SameFile { .. }), "{e:?}");
    assert!(e.to_string().contains("same file"), "{e}");
    assert_eq!(fs::read(&f1).unwrap(), data(5000, 2));
    assert_no_temp_files(d.path());
}

#[test]
fn dot_source_merges_into_an_existing_directory() {
    // `cp -r src/. dst` with `dst` existing: the contents of src go into dst, not dst/src.
    let d = disk_dir();
    let src = d.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    make_file(&src, "a", &data(3000, 7));
    make_file(&src.join("sub"), "b", &data(4000, 8));
    let dst = d.path().join("dst");
    fs::create_dir(&dst).unwrap();
    make_file(&dst, "kept", b"already here");
    let r = CopyOptions::new().recursive(true);
    let mut dotted = src.clone().into_os_string();
    dotted.push("/.");
    copy([PathBuf::from(&dotted)], &dst, &r)
        .unwrap()
        .check()
        .unwrap();
    assert_eq!(fs::read(dst.join("a")).unwrap(), data(3000, 7));
    assert_eq!(fs::read(dst.join("sub").join("b")).unwrap(), data(4000, 8));
    assert_eq!(fs::read(dst.join("kept")).unwrap(), b"already here");
    assert!(!dst.join("src").exists() && !dst.join(".").join("src").exists());
    // To a new name it is a plain copy of the directory.
    let fresh = d.path().join("fresh");
    copy([PathBuf::from(&dotted)], &fresh, &r)
        .unwrap()
        .check()
        .unwrap();
    assert_same_tree(&src, &fresh);
    assert_no_temp_files(d.path());
}

#[test]
fn a_symlink_destination_is_written_through_and_a_dangling_one_refused() {
    let d = disk_dir();
    let src = make_file(d.path(), "src", &data(100_000, 9));
    let target = make_file(d.path(), "target", &data(5000, 10));
    fs::set_permissions(&target, fs::Permissions::from_mode(0o751)).unwrap();
    let link = d.path().join("link");
    std::os::unix::fs::symlink("target", &link).unwrap();
    copy([&src], &link, &CopyOptions::new())
        .unwrap()
        .check()
        .unwrap();
    // The file replaced keeps its mode, as when it is named directly (and as cp does).
    assert_eq!(
        fs::metadata(&target).unwrap().permissions().mode() & 0o7777,
        0o751
    );
    assert!(
        fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link stays"
    );
    assert_eq!(
        fs::read(&target).unwrap(),
        data(100_000, 9),
        "the target has the new bytes"
    );

    let dangling = d.path().join("dangling");
    std::os::unix::fs::symlink("nowhere/file", &dangling).unwrap();
    let rep = copy([&src], &dangling, &CopyOptions::new()).unwrap();
    let e = rep.check().unwrap_err();
    assert!(e.to_string().contains("dangling"), "{e}");
    assert!(fs::symlink_metadata(&dangling)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(!d.path().join("nowhere").exists());
    assert_no_temp_files(d.path());
}

#[test]
fn existing_destination_is_replaced_whole_and_keeps_its_mode() {
    let d = disk_dir();
    let src = make_file(d.path(), "src", &data(3 << 20, 4));
    let dst = make_file(d.path(), "dst", &data(9 << 20, 5));
    fs::set_permissions(&src, fs::Permissions::from_mode(0o644)).unwrap();
    fs::set_permissions(&dst, fs::Permissions::from_mode(0o600)).unwrap();
    let r = copy([&src], &dst, &CopyOptions::new().settings(small_tasks())).unwrap();
    r.check().unwrap();
    assert_eq!(
        fs::read(&dst).unwrap(),
        data(3 << 20, 4),
        "no tail of the old file"
    );
    assert_eq!(fs::metadata(&dst).unwrap().mode() & 0o7777, 0o600);
    assert_no_temp_files(d.path());
}

#[test]
fn large_files_by_every_method() {
    let d = disk_dir();
    let size = 40 << 20 | 12345; // many windows, an unaligned tail
    let src = make_file(d.path(), "big", &data(size, 6));
    for method in [
        CopyMethod::Auto,
        CopyMethod::ReadWrite,
        CopyMethod::CopyFileRange,
    ] {
        let dst = d.path().join(format!("copy-{method}"));
        let o = CopyOptions::new()
            .method(method)
            .settings(small_tasks())
            .window_bytes(2 << 20)
            .verify(true);
        let r = copy([&src], &dst, &o).unwrap();
        r.check().unwrap();
        assert_eq!(r.bytes, size as u64, "{method}");
        assert_eq!(r.verified, 1, "{method}");
        assert!(fs::read(&dst).unwrap() == data(size, 6), "{method}");
        match method {
            CopyMethod::ReadWrite => assert_eq!(r.bytes_copy_file_range, 0),
            // The kernel may refuse copy_file_range (then read + write is used): either way
            // every byte is counted once.
            _ => assert!(r.bytes_copy_file_range == 0 || r.bytes_copy_file_range == r.bytes),
        }
        let read: u64 = r.devices.iter().map(|t| t.bytes_read).sum();
        assert_eq!(read, size as u64, "{:?}", r.devices);
    }
    assert_no_temp_files(d.path());
}

#[test]
fn a_big_file_is_copied_in_parallel_segments() {
    // 160 MiB of data: copy_file_range copies it as two sequential segments at once.
    let d = disk_dir();
    let size = (160 << 20) + 4097;
    let src = make_file(d.path(), "big", &data(size, 12));
    for method in [CopyMethod::CopyFileRange, CopyMethod::ReadWrite] {
        let dst = d.path().join(format!("copy-{method}"));
        let r = copy([&src], &dst, &CopyOptions::new().method(method)).unwrap();
        r.check().unwrap();
        assert_eq!(r.bytes, size as u64);
        if method == CopyMethod::CopyFileRange {
            assert!(r.bytes_copy_file_range == r.bytes || r.bytes_copy_file_range == 0);
        }
        assert!(fs::read(&dst).unwrap() == data(size, 12), "{method}");
    }
}

#[test]
fn sparse_files_stay_sparse() {
    let d = disk_dir();
    let src = d.path().join("sparse");
    {
        let f = fs::File::create(&src).unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(&data(1 << 20, 7), 0).unwrap();
        f.write_all_at(&data(1 << 20, 8), 40 << 20).unwrap();
        f.set_len(64 << 20).unwrap();
        f.sync_all().unwrap();
    }
    let allocated = |p: &Path| fs::metadata(p).unwrap().blocks() * 512;
    if allocated(&src) > 8 << 20 {
        eprintln!("skipped: this file system does not keep holes");
        return;
    }
    for method in [CopyMethod::ReadWrite, CopyMethod::CopyFileRange] {
        let dst = d.path().join(format!("copy-{method}"));
        let r = copy([&src], &dst, &CopyOptions::new().method(method)).unwrap();
        r.check().unwrap();
        assert_eq!(r.bytes, 2 << 20, "only data is moved ({method})");
        assert_eq!(fs::metadata(&dst).unwrap().len(), 64 << 20);
        fs::File::open(&dst).unwrap().sync_all().unwrap();
        assert!(
            allocated(&dst) <= 4 << 20,
            "{method}: {} bytes allocated",
            allocated(&dst)
        );
        assert!(
            fs::read(&dst).unwrap() == fs::read(&src).unwrap(),
            "{method}"
        );
    }
    // All hole: nothing to move, the length is kept.
    let holes = d.path().join("holes");
    fs::File::create(&holes).unwrap().set_len(10 << 20).unwrap();
    let r = copy([&holes], d.path().join("holes2"), &CopyOptions::new()).unwrap();
    r.check().unwrap();
    assert_eq!(r.bytes, 0);
    let m = fs::metadata(d.path().join("holes2")).unwrap();
    assert_eq!((m.len(), m.blocks()), (10 << 20, 0));
}

#[test]
fn symlinks_are_copied_as_links_unless_followed() {
    let d = disk_dir();
    let outside = make_file(d.path(), "outside.txt", b"outside");
    let src = d.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    make_file(&src.join("sub"), "file", b"inside");
    let links: [(&str, PathBuf); 5] = [
        ("rel", "sub/file".into()),
        ("abs", outside.clone()),
        ("up", "../outside.txt".into()),
        ("dangling", "no/such/thing".into()),
        ("dirlink", "sub".into()),
    ];
    for (name, target) in &links {
        std::os::unix::fs::symlink(target, src.join(name)).unwrap();
    }
    let dst = d.path().join("dst");
    let r = copy([&src], &dst, &CopyOptions::new().recursive(true)).unwrap();
    r.check().unwrap();
    assert_eq!((r.files, r.symlinks), (1, 5));
    for (name, target) in &links {
        let p = dst.join(name);
        assert!(fs::symlink_metadata(&p).unwrap().file_type().is_symlink());
        assert_eq!(&fs::read_link(&p).unwrap(), target);
    }
    assert_same_tree(&src, &dst);
    assert_eq!(fs::read(&outside).unwrap(), b"outside", "untouched");

    // Following: the links' targets are copied; a dangling link cannot be followed and is an
    // error naming it, as in `cp -rL` (it was copied as a link, silently).
    let dst2 = d.path().join("dst2");
    let o = CopyOptions::new().recursive(true).follow_symlinks(true);
    let r = copy([&src], &dst2, &o).unwrap();
    assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
    assert_eq!(r.errors[0].path, src.join("dangling"));
    assert!(
        r.errors[0].error.to_string().contains("No such file"),
        "{}",
        r.errors[0].error
    );
    assert!(fs::symlink_metadata(dst2.join("dangling")).is_err());
    assert_eq!(fs::read(dst2.join("rel")).unwrap(), b"inside");
    assert_eq!(fs::read(dst2.join("abs")).unwrap(), b"outside");
    assert_eq!(fs::read(dst2.join("up")).unwrap(), b"outside");
    assert!(fs::symlink_metadata(dst2.join("dirlink")).unwrap().is_dir());
    assert_eq!(fs::read(dst2.join("dirlink/file")).unwrap(), b"inside");

    // A symlink named as the source: followed without recursive, copied as a link with it.
    let r = copy([src.join("rel")], d.path().join("one"), &CopyOptions::new()).unwrap();
    r.check().unwrap();
    assert!(fs::symlink_metadata(d.path().join("one"))
        .unwrap()
        .is_file());
    let r = copy(
        [src.join("rel")],
        d.path().join("two"),
        &CopyOptions::new().recursive(true),
    )
    .unwrap();
    r.check().unwrap();
    assert_eq!(
        fs::read_link(d.path().join("two")).unwrap(),
        PathBuf::from("sub/file")
    );
    // A symlink replacing an existing file.
    let r = copy(
        [src.join("rel")],
        d.path().join("one"),
        &CopyOptions::new().recursive(true),
    )
    .unwrap();
    r.check().unwrap();
    assert!(fs::symlink_metadata(d.path().join("one"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_no_temp_files(d.path());
}

#[test]
fn a_link_loop_is_an_error_not_a_hang() {
    let d = disk_dir();
    let src = d.path().join("src");
    fs::create_dir_all(src.join("a")).unwrap();
    std::os::unix::fs::symlink("..", src.join("a/up")).unwrap();
    let o = CopyOptions::new().recursive(true).follow_symlinks(true);
    let r = copy([&src], d.path().join("dst"), &o).unwrap();
    assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
    assert!(r.errors[0].to_string().contains("loop"), "{}", r.errors[0]);
}

#[test]
fn preserve_keeps_mode_and_times() {
    let d = disk_dir();
    let src = d.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    let f = make_file(&src.join("sub"), "f", &data(10_000, 9));
    std::os::unix::fs::symlink("f", src.join("sub/link")).unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o640)).unwrap();
    fs::set_permissions(src.join("sub"), fs::Permissions::from_mode(0o750)).unwrap();
    let t = ferrio::sys::Timestamp {
        secs: 1_000_000_000,
        nanos: 123_456_789,
    };
    let t2 = ferrio::sys::Timestamp {
        secs: 1_100_000_000,
        nanos: 5,
    };
    ferrio::sys::lutimens(&f, t, t).unwrap();
    ferrio::sys::lutimens(&src.join("sub/link"), t2, t2).unwrap();
    ferrio::sys::lutimens(&src.join("sub"), t2, t2).unwrap();

    let dst = d.path().join("dst");
    let o = CopyOptions::new().recursive(true).preserve(true);
    copy([&src], &dst, &o).unwrap().check().unwrap();
    let m = fs::metadata(dst.join("sub/f")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o640);
    assert_eq!((m.mtime(), m.mtime_nsec()), (t.secs, t.nanos));
    assert_eq!((m.atime(), m.atime_nsec()), (t.secs, t.nanos));
    let m = fs::symlink_metadata(dst.join("sub/link")).unwrap();
    assert_eq!((m.mtime(), m.mtime_nsec()), (t2.secs, t2.nanos));
    let m = fs::metadata(dst.join("sub")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o750);
    assert_eq!((m.mtime(), m.mtime_nsec()), (t2.secs, t2.nanos));

    // Without preserve: mode less the umask, fresh times.
    let dst = d.path().join("plain");
    copy([&src], &dst, &CopyOptions::new().recursive(true))
        .unwrap()
        .check()
        .unwrap();
    let umask = ferrio::sys::umask();
    let m = fs::metadata(dst.join("sub/f")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o640 & !umask);
    assert!(m.mtime() > t2.secs);
    assert_eq!(
        fs::metadata(dst.join("sub")).unwrap().mode() & 0o7777,
        0o750 & !umask
    );
}

#[test]
fn cancel_mid_copy_leaves_no_partial_file() {
    let d = disk_dir();
    let src = make_file(d.path(), "big", &data(96 << 20, 10));
    let keep = make_file(d.path(), "keep", b"old content");
    let progress = CopyProgress::new();
    let o = CopyOptions::new()
        .settings(small_tasks())
        .window_bytes(1 << 20)
        .windows_in_flight(1)
        .progress(Arc::clone(&progress));
    let report = std::thread::scope(|s| {
        let watcher = Arc::clone(&progress);
        s.spawn(move || {
            while watcher.bytes_done() < 4 << 20 && watcher.files_done() == 0 {
                std::thread::yield_now();
            }
            watcher.cancel();
        });
        copy([&src], &keep, &o).unwrap()
    });
    assert!(report.cancelled);
    assert!(!report.is_ok());
    assert!(matches!(report.check(), Err(Error::Cancelled)));
    assert!(report.errors.is_empty(), "a cancel is not a file error");
    let now = fs::read(&keep).unwrap();
    assert!(
        now == b"old content" || now == data(96 << 20, 10),
        "the destination is the old file or the whole new one"
    );
    assert_eq!(now, b"old content", "the cancel came after 4 of 96 MiB");
    assert_no_temp_files(d.path());

    // Cancelled before it starts: nothing at all is made.
    let progress = CopyProgress::new();
    progress.cancel();
    let tree = d.path().join("tree");
    build_tree(&tree);
    let o = CopyOptions::new()
        .recursive(true)
        .progress(Arc::clone(&progress));
    let r = copy([&tree], d.path().join("never"), &o).unwrap();
    assert!(r.cancelled && r.files == 0);
    assert!(!d.path().join("never").exists());
}

#[test]
fn progress_counts_reach_the_totals() {
    let d = disk_dir();
    let src = d.path().join("src");
    build_tree(&src);
    let progress = CopyProgress::new();
    let o = CopyOptions::new()
        .recursive(true)
        .progress(Arc::clone(&progress));
    let r = copy([&src], d.path().join("dst"), &o).unwrap();
    r.check().unwrap();
    assert_eq!(progress.files_total(), r.files + r.symlinks);
    assert_eq!(progress.files_done(), progress.files_total());
    assert_eq!(progress.bytes_done(), progress.bytes_total());
    assert_eq!(progress.bytes_total(), r.bytes);
    assert_eq!(progress.errors(), 0);
}

#[test]
fn a_full_disk_is_a_clear_error_and_leaves_nothing_behind() {
    let lfs = match LoopFs::new(48) {
        Ok(l) => l,
        Err(why) => {
            eprintln!("skipped: a loop file system: {why}");
            return;
        }
    };
    let mnt = lfs.mount_point();
    let keep = make_file(&mnt, "keep", b"old content");
    lfs.fill_up_to(2 << 20);

    let d = disk_dir();
    let src = make_file(d.path(), "big", &data(16 << 20, 11));
    let small = make_file(d.path(), "small", b"fits");
    for method in [CopyMethod::Auto, CopyMethod::ReadWrite] {
        let o = CopyOptions::new().method(method).settings(small_tasks());
        let r = copy([&src], &keep, &o).unwrap();
        assert_eq!(r.errors.len(), 1, "{method}: {:?}", r.errors);
        let e = &r.errors[0].error;
        assert_eq!(
            e.os_error().and_then(|e| e.raw_os_error()),
            Some(libc::ENOSPC),
            "{method}: {e}"
        );
        assert_eq!(
            e.path(),
            Some(keep.as_path()),
            "{method}: names the destination: {e}"
        );
        assert!(e.to_string().contains("No space left"), "{e}");
        assert_eq!(fs::read(&keep).unwrap(), b"old content", "{method}");
        assert_no_temp_files(&mnt);
    }
    // A new file too: no partial file appears; the other file of the copy still arrives.
    // One file at a time, so that the small file is not racing the big one for the space.
    let r = copy([&src, &small], &mnt, &CopyOptions::new().parallel_files(1)).unwrap();
    assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
    assert_eq!(r.files, 1);
    assert!(!mnt.join("big").exists());
    assert_eq!(fs::read(mnt.join("small")).unwrap(), b"fits");
    assert_no_temp_files(&mnt);
    drop(lfs);
    // Dropping the guard unmounted the file system.
    assert!(!mnt.exists() || fs::read_dir(&mnt).is_ok_and(|mut d| d.next().is_none()));
}

#[test]
fn many_files_on_many_threads_are_all_compared() {
    let d = disk_dir();
    let src = d.path().join("src");
    for i in 0..40u64 {
        let dir = src.join(format!("d{}", i % 5));
        fs::create_dir_all(&dir).unwrap();
        let len = if i % 10 == 0 {
            (3 << 20) + i as usize
        } else {
            (i * 4099) as usize
        };
        make_file(&dir, &format!("f{i}"), &data(len, 100 + i));
    }
    let o = CopyOptions::new()
        .recursive(true)
        .parallel_files(8)
        .settings(small_tasks())
        .window_bytes(1 << 20)
        .method(CopyMethod::ReadWrite);
    let dst = d.path().join("dst");
    let r = copy([&src], &dst, &o).unwrap();
    r.check().unwrap();
    assert_eq!(r.files, 40);
    assert_same_tree(&src, &dst);
    assert_no_temp_files(&dst);
}

#[test]
fn two_files_named_alike_into_one_directory_are_refused_before_copying() {
    let d = disk_dir();
    fs::create_dir_all(d.path().join("s1")).unwrap();
    fs::create_dir_all(d.path().join("s2")).unwrap();
    let a = make_file(&d.path().join("s1"), "n", &data(10, 1));
    let b = make_file(&d.path().join("s2"), "n", &data(20, 2));
    let out = d.path().join("out");
    fs::create_dir(&out).unwrap();
    let e = copy([&a, &b], &out, &CopyOptions::new()).unwrap_err();
    assert!(e.to_string().contains("would both be copied to"), "{e}");
    assert!(
        !out.join("n").exists(),
        "refused before anything was copied"
    );
    // The same file given twice is copied once.
    let rep = copy([&a, &a], &out, &CopyOptions::new()).unwrap();
    rep.check().unwrap();
    assert_eq!(rep.files, 1);
    assert_eq!(fs::read(out.join("n")).unwrap(), data(10, 1));
}

#[test]
fn a_block_device_named_as_a_source_is_copied_into_a_file() {
    let lfs = match LoopFs::new(20) {
        Ok(l) => l,
        Err(why) => {
            eprintln!("skipped: a loop device: {why}");
            return;
        }
    };
    make_file(&lfs.mount_point(), "inside", &data(3 << 20, 61));
    let dev = Path::new(lfs.device());
    ferrio::sys::sync();
    let d = disk_dir();
    for method in [CopyMethod::Auto, CopyMethod::CopyFileRange] {
        // It was refused ("not a regular file, directory or symlink"), as inside a tree.
        let img = d.path().join(format!("disk-{method}.img"));
        let progress = Arc::new(CopyProgress::default());
        let o = CopyOptions::new()
            .method(method)
            .verify(true)
            .progress(progress.clone());
        let r = copy([dev], &img, &o).unwrap();
        assert!(r.is_ok(), "{:?}", r.errors);
        assert_eq!((r.files, r.bytes, r.verified), (1, 20 << 20, 1));
        assert_eq!(
            progress.bytes_total(),
            20 << 20,
            "the total counts the device"
        );
        assert_eq!(fs::read(&img).unwrap(), fs::read(dev).unwrap());
    }
    // Met inside a tree it is still not copied (cp -r would make a device node).
    let tree = d.path().join("tree");
    fs::create_dir(&tree).unwrap();
    std::os::unix::fs::symlink(dev, tree.join("dev")).unwrap();
    let o = CopyOptions::new().recursive(true).follow_symlinks(true);
    let r = copy([&tree], d.path().join("out"), &o).unwrap();
    assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
    assert!(
        r.errors[0].error.to_string().contains("named as a source"),
        "{}",
        r.errors[0].error
    );
}
