//! Mount table parsing (escapes, optional fields), the choice of a path's mount and the
//! `statfs` magic names.

use super::*;
use crate::blockdev::mountinfo::{
    best_mount, fs_type_name, parse_mountinfo, unescape_mount, Mount,
};

const MOUNTINFO_SAMPLE: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24731708k
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
40 27 254:0 /srv/data /mnt/my\\040data rw,relatime shared:1 master:2 - ext4 /dev/vda rw
41 27 259:3 / /mnt/nvme rw - xfs /dev/nvme0n1p1 rw
garbage line
42 27 0:50 / /mnt/fuse rw,nosuid - fuse.sshfs host:/ rw
";

#[test]
fn mountinfo_lines_are_parsed_with_escapes_and_optional_fields() {
    let mounts = parse_mountinfo(MOUNTINFO_SAMPLE);
    assert_eq!(mounts.len(), 6, "{mounts:?}");
    assert_eq!(
        mounts[3],
        Mount {
            dev: DevId::new(254, 0),
            mount_point: PathBuf::from("/mnt/my data"),
            fs_type: "ext4".to_owned(),
        }
    );
    assert_eq!(mounts[5].fs_type, "fuse.sshfs");
    assert_eq!(mounts[5].dev, DevId::new(0, 50));
    assert_eq!(unescape_mount("a\\011b\\134c\\012"), "a\tb\\c\n");
    assert_eq!(unescape_mount("trailing\\04"), "trailing\\04");
}

#[test]
fn the_longest_matching_mount_point_wins() {
    let mounts: Vec<Mount> = parse_mountinfo(MOUNTINFO_SAMPLE)
        .into_iter()
        .filter(|m| m.dev == DevId::new(254, 0))
        .collect();
    let pick = |p: &str| best_mount(&mounts, Path::new(p)).map(|m| m.mount_point.clone());
    assert_eq!(pick("/mnt/my data/x"), Some(PathBuf::from("/mnt/my data")));
    assert_eq!(pick("/home/x"), Some(PathBuf::from("/")));
    // Path-component prefix, not string prefix.
    assert_eq!(pick("/mnt/my data2/x"), Some(PathBuf::from("/")));
    assert_eq!(best_mount(&[], Path::new("/x")), None);
}

#[test]
fn statfs_magic_names() {
    assert_eq!(fs_type_name(0x0102_1994), "tmpfs");
    assert_eq!(fs_type_name(0x9123_683E), "btrfs");
    assert_eq!(fs_type_name(0x1234), "0x1234");
}
