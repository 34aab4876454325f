//! Bad input: a clear error or a short count, never a panic or a hang.

use std::io::ErrorKind;

use ferrio::{Error, File};

use super::common::{data, disk_dir, make_file};

#[test]
fn missing_file_names_path_and_kind() {
    let dir = disk_dir();
    let p = dir.path().join("nope");
    let e = File::open(&p, "r").unwrap_err();
    assert_eq!(e.os_error().unwrap().kind(), ErrorKind::NotFound);
    assert!(e.to_string().contains("nope"), "{e}");
    assert_eq!(e.path(), Some(p.as_path()));
}

#[test]
fn directory_is_refused() {
    let dir = disk_dir();
    let e = File::open(dir.path(), "r").unwrap_err();
    assert_eq!(
        e.os_error().unwrap().raw_os_error(),
        Some(libc::EISDIR),
        "{e}"
    );
}

#[test]
fn no_permission_is_permission_denied() {
    let dir = disk_dir();
    let p = make_file(dir.path(), "secret", b"x");
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o000)).unwrap();
    if ferrio::sys::is_root() {
        // Root reads anything; check as an unprivileged user through a child process instead.
        let status = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "cat"])
            .arg(&p)
            .status();
        match status {
            Ok(s) => assert!(!s.success(), "an unprivileged user can read a 000 file?"),
            Err(e) => eprintln!("skipped: running as root and setpriv is unavailable ({e})"),
        }
        return;
    }
    let e = File::open(&p, "r").unwrap_err();
    assert_eq!(e.os_error().unwrap().kind(), ErrorKind::PermissionDenied);
}

#[test]
fn bad_mode_and_overflowing_ranges() {
    let dir = disk_dir();
    let p = make_file(dir.path(), "f", &data(10, 1));
    assert!(matches!(
        File::open(&p, "z").unwrap_err(),
        Error::InvalidArgument(_)
    ));
    let f = File::open(&p, "r").unwrap();
    let e = f.read_at(&mut [0u8; 16], u64::MAX - 4).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
}

#[test]
fn file_truncated_while_being_read_gives_a_short_count() {
    let dir = disk_dir();
    let content = data(64 << 20, 2);
    let p = make_file(dir.path(), "f", &content);
    let f = File::options().task_size(256 << 10).open(&p, "r").unwrap();
    for _ in 0..3 {
        let trunc = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        let mut buf = vec![0u8; 64 << 20];
        let n = std::thread::scope(|s| {
            s.spawn(|| trunc.set_len(1 << 20).unwrap());
            f.read_at(&mut buf, 0).unwrap()
        });
        assert!(n <= 64 << 20);
        assert_eq!(&buf[..n.min(1 << 20)], &content[..n.min(1 << 20)]);
        // Restore for the next round.
        std::fs::write(&p, &content).unwrap();
    }
}

#[test]
fn errors_convert_to_io_errors_with_their_kind() {
    let dir = disk_dir();
    let e = File::open(dir.path().join("missing"), "r").unwrap_err();
    let io: std::io::Error = e.into();
    assert_eq!(io.kind(), ErrorKind::NotFound);
}
