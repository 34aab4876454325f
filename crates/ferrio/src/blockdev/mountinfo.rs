//! The mount table: parsing `/proc/self/mountinfo` (`proc(5)`), choosing the mount of a path
//! among a device's mounts, and naming a file system from its `statfs` magic number. Pure
//! functions over text and numbers; reading the table is the resolver's.

use std::path::{Path, PathBuf};

use super::DevId;

/// One line of `/proc/self/mountinfo`, the fields this module uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Mount {
    pub(super) dev: DevId,
    pub(super) mount_point: PathBuf,
    pub(super) fs_type: String,
}

/// Parses mountinfo (`proc(5)`): `ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] -
/// FSTYPE SOURCE SUPER_OPTIONS`. Lines that do not parse are skipped.
pub(super) fn parse_mountinfo(table: &str) -> Vec<Mount> {
    table
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let dev = DevId::parse(fields.get(2)?)?;
            let mount_point = PathBuf::from(unescape_mount(fields.get(4)?));
            let separator = fields.iter().skip(6).position(|f| *f == "-")? + 6;
            let fs_type = fields.get(separator + 1)?.to_string();
            Some(Mount {
                dev,
                mount_point,
                fs_type,
            })
        })
        .collect()
}

/// Undoes mountinfo's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134` `\`).
pub(super) fn unescape_mount(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)))
            .map(|d| d.iter().fold(0u32, |n, b| n * 8 + u32::from(b - b'0')))
            .and_then(|n| u8::try_from(n).ok());
        if let Some(byte) = octal {
            out.push(byte);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Of a device's mounts, the one whose mount point is the longest prefix of `path` made
/// absolute (without following symlinks, to stay cheap), else the first.
pub(super) fn best_mount<'a>(mounts: &'a [Mount], path: &Path) -> Option<&'a Mount> {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    mounts
        .iter()
        .filter(|m| absolute.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.as_os_str().len())
        .or_else(|| mounts.first())
}

/// A file system name for a `statfs` magic number (`linux/magic.h`).
pub(super) fn fs_type_name(magic: u32) -> String {
    let name = match magic {
        0xEF53 => "ext2/3/4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x0102_1994 => "tmpfs",
        0x794C_7630 => "overlay",
        0x6969 => "nfs",
        0xFF53_4D42 => "cifs",
        0x6573_5546 => "fuse",
        0x2FC1_2FC1 => "zfs",
        0xF2F5_2010 => "f2fs",
        0x7371_7368 => "squashfs",
        0x4D44 => "vfat",
        0x5346_544E => "ntfs",
        0x2011_BAB0 => "exfat",
        0x0027_E0EB => "cgroup",
        0x6367_7270 => "cgroup2",
        0x9FA0 => "proc",
        0x6265_6572 => "sysfs",
        0x8584_58F6 => "ramfs",
        _ => return format!("{magic:#x}"),
    };
    name.to_owned()
}
