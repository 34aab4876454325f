//! Where a GPU sits in the host: the NUMA node of its PCI device, its PCIe link, the online
//! nodes and their CPUs, all read from sysfs; and what ferrio does with it
//! ([`placement_node`]): on a machine with several NUMA nodes, a GPU's pinned bounce buffers
//! are allocated on the GPU's node and the workers that fill them run on that node's CPUs. On a
//! machine with one node nothing changes. It also counts the host's NVIDIA GPUs
//! ([`host_gpus`]), which picks the default bounce buffer size
//! ([`crate::Settings::bounce_buffer_bytes`]).
//!
//! The readers take the sysfs root (normally [`SYSFS_ROOT`]) so tests use a fake tree. The
//! syscalls (placement, affinity) are `sys/numa.rs`'s; the driver queries `cuda`'s.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::Path;
use std::sync::{Mutex, OnceLock};

use crate::config::PinnedMemory;
use crate::cuda::{self, Context, DeviceInfo};
use crate::error::{Error, Result};
use crate::sys;

/// Where the kernel's sysfs is mounted.
pub const SYSFS_ROOT: &str = "/sys";

/// A PCIe link as sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// Speed per lane as the kernel writes it (`32.0 GT/s PCIe`), `None` when not given.
    pub speed: Option<String>,
    /// Number of lanes, `None` when not given.
    pub width: Option<u32>,
}

/// What sysfs says about one PCI device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciDevice {
    /// The NUMA node the device is attached to; `None` when the kernel does not know (it writes
    /// -1, as on machines with one node) or the file is missing.
    pub numa_node: Option<u32>,
    /// The link as trained now (`current_link_speed`, `current_link_width`).
    pub current_link: Link,
    /// The most the device supports (`max_link_speed`, `max_link_width`).
    pub max_link: Link,
}

/// Reads the PCI device at `address` (`0000:0a:00.0`, lower case) under `sysfs_root`.
///
/// # Errors
/// [`Error::InvalidArgument`] when sysfs has no such device; missing attributes are `None`.
pub fn pci_device(sysfs_root: &Path, address: &str) -> Result<PciDevice> {
    let dir = sysfs_root.join("bus/pci/devices").join(address);
    if address.contains('/') || !dir.is_dir() {
        return Err(Error::InvalidArgument(format!(
            "no PCI device {address} in sysfs ({} is missing)",
            dir.display()
        )));
    }
    let read = |name: &str| {
        fs::read_to_string(dir.join(name))
            .ok()
            .map(|s| s.trim().to_string())
    };
    let link = |speed: &str, width: &str| Link {
        speed: read(speed).filter(|s| !s.is_empty() && s != "Unknown"),
        width: read(width).and_then(|w| w.parse().ok()).filter(|&w| w > 0),
    };
    Ok(PciDevice {
        // -1 (no node) fails to parse as u32, which is the `None` meant.
        numa_node: read("numa_node").and_then(|n| n.parse().ok()),
        current_link: link("current_link_speed", "current_link_width"),
        max_link: link("max_link_speed", "max_link_width"),
    })
}

/// NVIDIA's PCI vendor id, as sysfs writes it.
const NVIDIA_VENDOR: &str = "0x10de";

/// NVIDIA GPUs on the host's PCI bus under `sysfs_root`: devices of NVIDIA's vendor id whose
/// class is a display controller (VGA `0x0300..`, 3D `0x0302..`; NVSwitches and the GPUs' audio
/// functions are other classes). All of the host's, whatever `CUDA_VISIBLE_DEVICES` hides from
/// this process: the processes of one host feed every GPU from the same memory. 0 where sysfs
/// has no PCI devices to read.
pub fn nvidia_gpus(sysfs_root: &Path) -> usize {
    let Ok(devices) = fs::read_dir(sysfs_root.join("bus/pci/devices")) else {
        return 0;
    };
    devices
        .flatten()
        .filter(|device| {
            // Runs on `import ferrio` (the pinned-ahead slab's size): the class is read only
            // for NVIDIA's devices.
            let read =
                |name: &str| fs::read_to_string(device.path().join(name)).unwrap_or_default();
            read("vendor").trim() == NVIDIA_VENDOR && {
                let class = read("class");
                class.starts_with("0x0300") || class.starts_with("0x0302")
            }
        })
        .count()
}

/// [`nvidia_gpus`] of this host, read once.
pub fn host_gpus() -> usize {
    static GPUS: OnceLock<usize> = OnceLock::new();
    *GPUS.get_or_init(|| nvidia_gpus(Path::new(SYSFS_ROOT)))
}

/// Parses a kernel CPU or node list (`0-15,32-47`, `3`, or empty) into increasing numbers.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the list when it is not one.
pub fn parse_list(list: &str) -> Result<Vec<usize>> {
    let bad = || Error::InvalidArgument(format!("{list:?} is not a CPU or node list"));
    let mut out = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?),
            None => {
                let n: usize = part.parse().map_err(|_| bad())?;
                (n, n)
            }
        };
        if first > last || last - first > 1 << 20 {
            return Err(bad());
        }
        out.extend(first..=last);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// The online NUMA nodes (`devices/system/node/online`); `[0]` on a kernel without NUMA
/// support, which has no such file and one node.
///
/// # Errors
/// [`Error::InvalidArgument`] for a file that is not a node list.
pub fn online_nodes(sysfs_root: &Path) -> Result<Vec<u32>> {
    match fs::read_to_string(sysfs_root.join("devices/system/node/online")) {
        Ok(list) => parse_list(&list)?
            .into_iter()
            .map(|n| u32::try_from(n).map_err(|_| Error::InvalidArgument(format!("node {n}"))))
            .collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(vec![0]),
        Err(e) => Err(Error::InvalidArgument(format!(
            "cannot read the online NUMA nodes: {e}"
        ))),
    }
}

/// The CPUs of NUMA node `node` (`devices/system/node/nodeN/cpulist`).
///
/// # Errors
/// [`Error::InvalidArgument`] when the node has no list or it is not one.
pub fn node_cpus(sysfs_root: &Path, node: u32) -> Result<Vec<usize>> {
    let path = sysfs_root.join(format!("devices/system/node/node{node}/cpulist"));
    let list = fs::read_to_string(&path).map_err(|e| {
        Error::InvalidArgument(format!("NUMA node {node}: {}: {e}", path.display()))
    })?;
    parse_list(&list)
}

/// The node ferrio places a GPU's rings and workers on: the GPU's node when the machine has
/// more than one online node and the GPU's node is one of them; `None` (change nothing)
/// otherwise.
pub fn placement_node(online: &[u32], gpu_node: Option<u32>) -> Option<u32> {
    gpu_node.filter(|n| online.len() > 1 && online.contains(n))
}

/// A GPU and where it sits: what [`gpu`] finds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Gpu {
    /// The driver's description of the device.
    pub device: DeviceInfo,
    /// Its PCI device in sysfs; `None` when sysfs has no entry for the address (a container
    /// without the host's sysfs, say).
    pub pci: Option<PciDevice>,
    /// The online NUMA nodes of the machine.
    pub online_nodes: Vec<u32>,
    /// The CPUs of the GPU's node, when the node is known.
    pub node_cpus: Option<Vec<usize>>,
    /// The node ferrio places the GPU's rings and workers on ([`placement_node`]).
    pub placed_on: Option<u32>,
}

/// The GPU of ordinal `ordinal` and where it sits, from the driver and `/sys`.
///
/// # Errors
/// Those of [`cuda::device_info`] (no driver, no such GPU); those of [`online_nodes`].
pub fn gpu(ordinal: usize) -> Result<Gpu> {
    gpu_in(Path::new(SYSFS_ROOT), ordinal)
}

fn gpu_in(sysfs_root: &Path, ordinal: usize) -> Result<Gpu> {
    let device = cuda::device_info(ordinal)?;
    let pci = pci_device(sysfs_root, &device.pci_address).ok();
    let online_nodes = online_nodes(sysfs_root)?;
    let node = pci.as_ref().and_then(|p| p.numa_node);
    let node_cpus = node.and_then(|n| node_cpus(sysfs_root, n).ok());
    Ok(Gpu {
        placed_on: placement_node(&online_nodes, node),
        device,
        pci,
        online_nodes,
        node_cpus,
    })
}

/// How a ring's pinned buffers are made ([`pinning`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pinning {
    /// Mapped by ferrio, in transparent huge pages if `huge`, on `node` if given, and registered
    /// with the driver (`cuMemHostRegister`).
    Mapped {
        /// Advised and aligned for huge pages.
        huge: bool,
        /// The NUMA node the pages are taken from.
        node: Option<u32>,
    },
    /// Allocated by the driver (`cuMemHostAlloc`).
    Driver,
}

impl std::fmt::Display for Pinning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pinning::Mapped { huge, node } => {
                f.write_str("mapped")?;
                if *huge {
                    f.write_str(" in huge pages")?;
                }
                if let Some(n) = node {
                    write!(f, " on node {n}")?;
                }
                f.write_str(", registered with the driver")
            }
            Pinning::Driver => f.write_str("allocated by the driver (cuMemHostAlloc)"),
        }
    }
}

/// How pinned buffers of `buffer_len` bytes are made under `pinned` for a GPU whose rings are
/// placed on `node` ([`Gpu::placed_on`]). Mapping pays where the kernel gives transparent huge
/// pages and the buffer fills at least one (the driver pins a huge page as one: 2.3× faster
/// than `cuMemHostAlloc` on the H200, while 4 KiB pages register slower than it), and on a
/// machine of several nodes for the placement alone.
pub fn pinning(pinned: PinnedMemory, buffer_len: usize, node: Option<u32>) -> Pinning {
    let huge = buffer_len >= sys::numa::HUGE_PAGE && sys::numa::transparent_huge_pages();
    match pinned {
        PinnedMemory::Mapped if huge || node.is_some() => Pinning::Mapped { huge, node },
        _ => Pinning::Driver,
    }
}

/// The node to place `context`'s rings and workers on, found once per context and remembered
/// (workers ask at every task, so the answer costs one lookup); `None` (place nothing) when it
/// cannot be found out.
pub(crate) fn context_node(context: Context) -> Option<u32> {
    static NODES: OnceLock<Mutex<HashMap<u64, Option<u32>>>> = OnceLock::new();
    let nodes = NODES.get_or_init(Mutex::default);
    if let Some(&node) = nodes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&context.id())
    {
        return node;
    }
    // Asked outside the lock: sysfs reads and driver queries, a few per context per process.
    let node = context
        .device_ordinal()
        .ok()
        .and_then(|ordinal| gpu(ordinal).ok())
        .and_then(|g| g.placed_on);
    nodes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(context.id(), node);
    node
}

thread_local! {
    /// The node whose CPUs this thread was last bound to by [`follow_gpu`].
    static FOLLOWING: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

/// Runs the calling worker on the CPUs of the node of `context`'s GPU (intersected with the
/// CPUs the process was allowed at first call), when ferrio places on that node; does nothing
/// on one-node machines, and makes the syscall only when the node differs from the last one
/// this thread followed. Best effort: a failure leaves the affinity as it was.
pub(crate) fn follow_gpu(context: Context) {
    let Some(node) = context_node(context) else {
        return;
    };
    if FOLLOWING.with(|f| f.get()) == Some(node) {
        return;
    }
    if let Some(cpus) = node_cpus_allowed(node) {
        if sys::numa::set_thread_affinity(&cpus).is_ok() {
            FOLLOWING.with(|f| f.set(Some(node)));
        }
    }
}

/// Gives the calling worker back the CPUs the process was allowed (see [`ORIGINAL`]) if
/// [`follow_gpu`] narrowed them, so a host task after a device task runs wherever the scheduler
/// puts it. Only a thread-local check when nothing was narrowed; best effort.
pub(crate) fn leave_gpu() {
    if FOLLOWING.with(|f| f.get()).is_none() {
        return;
    }
    if let Some(Some(original)) = ORIGINAL.get() {
        if sys::numa::set_thread_affinity(original).is_ok() {
            FOLLOWING.with(|f| f.set(None));
        }
    }
}

/// The CPUs the process was allowed: the affinity of the first thread that followed a GPU,
/// read before ferrio narrowed any (`None` inside if it could not be read).
static ORIGINAL: OnceLock<Option<Vec<usize>>> = OnceLock::new();

/// The CPUs of `node` that the process may use: node `node`'s list intersected with
/// [`ORIGINAL`], `None` if that is empty.
fn node_cpus_allowed(node: u32) -> Option<Vec<usize>> {
    let original = ORIGINAL
        .get_or_init(|| sys::numa::thread_affinity().ok())
        .as_ref()?;
    let cpus = node_cpus(Path::new(SYSFS_ROOT), node).ok()?;
    let allowed: Vec<usize> = cpus.into_iter().filter(|c| original.contains(c)).collect();
    (!allowed.is_empty()).then_some(allowed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_mapped_where_it_pays() {
        let big = 2 << 20;
        let thp = sys::numa::transparent_huge_pages();
        assert_eq!(pinning(PinnedMemory::Driver, big, Some(1)), Pinning::Driver);
        // Below a huge page, mapping pays only for the placement.
        assert_eq!(
            pinning(PinnedMemory::Mapped, 64 << 10, None),
            Pinning::Driver
        );
        assert_eq!(
            pinning(PinnedMemory::Mapped, 64 << 10, Some(1)),
            Pinning::Mapped {
                huge: false,
                node: Some(1)
            }
        );
        let want = if thp {
            Pinning::Mapped {
                huge: true,
                node: None,
            }
        } else {
            Pinning::Driver
        };
        assert_eq!(pinning(PinnedMemory::Mapped, big, None), want);
        assert_eq!(
            pinning(PinnedMemory::Mapped, big, Some(0)),
            Pinning::Mapped {
                huge: thp,
                node: Some(0)
            }
        );
        assert_eq!(
            Pinning::Mapped {
                huge: true,
                node: Some(1)
            }
            .to_string(),
            "mapped in huge pages on node 1, registered with the driver"
        );
    }

    #[test]
    fn a_worker_that_followed_a_gpu_gets_its_cpus_back_for_host_tasks() {
        // On a thread of its own: the test narrows that thread's affinity.
        std::thread::spawn(|| {
            let original = ORIGINAL
                .get_or_init(|| sys::numa::thread_affinity().ok())
                .clone()
                .expect("this thread's affinity");
            // Nothing followed: nothing changes.
            leave_gpu();
            assert_eq!(sys::numa::thread_affinity().unwrap(), original);
            // As `follow_gpu` leaves a worker: on fewer CPUs, remembering the node.
            sys::numa::set_thread_affinity(&original[..1]).unwrap();
            FOLLOWING.with(|f| f.set(Some(0)));
            leave_gpu();
            assert_eq!(sys::numa::thread_affinity().unwrap(), original);
            assert_eq!(FOLLOWING.with(|f| f.get()), None);
        })
        .join()
        .unwrap();
    }

    /// A fake sysfs tree under a temporary directory.
    struct Tree(tempfile::TempDir);

    impl Tree {
        fn new() -> Tree {
            Tree(tempfile::tempdir().expect("tempdir"))
        }
        fn put(&self, path: &str, text: &str) -> &Tree {
            let p = self.0.path().join(path);
            fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            fs::write(p, text).expect("write");
            self
        }
        fn root(&self) -> &Path {
            self.0.path()
        }
    }

    const GPU: &str = "bus/pci/devices/0000:0a:00.0";

    #[test]
    fn lists_parse() {
        assert_eq!(
            parse_list("0-3,8,10-11\n").expect("list"),
            [0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(
            parse_list("0-15,32-47").expect("list"),
            (0..16).chain(32..48).collect::<Vec<_>>()
        );
        assert_eq!(parse_list("").expect("empty"), Vec::<usize>::new());
        assert_eq!(parse_list("5").expect("one"), [5]);
        for bad in ["a", "3-1", "1-", "-2", "1,,x", "0-99999999999"] {
            assert!(parse_list(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn nvidia_gpus_are_counted_by_vendor_and_class() {
        let t = Tree::new();
        assert_eq!(nvidia_gpus(t.root()), 0, "no PCI devices at all");
        let dev = |addr: &str, vendor: &str, class: &str| {
            t.put(&format!("bus/pci/devices/{addr}/vendor"), vendor)
                .put(&format!("bus/pci/devices/{addr}/class"), class);
        };
        dev("0000:0a:00.0", "0x10de\n", "0x030200\n"); // a 3D controller (H100, H200)
        dev("0000:0b:00.0", "0x10de\n", "0x030000\n"); // a VGA controller (a desktop GPU)
        dev("0000:0b:00.1", "0x10de\n", "0x040300\n"); // that GPU's audio function
        dev("0000:0c:00.0", "0x10de\n", "0x068000\n"); // an NVSwitch
        dev("0000:0d:00.0", "0x1af4\n", "0x030000\n"); // another vendor's display (virtio)
        dev("0000:0e:00.0", "0x8086\n", "0x020000\n"); // a network card
        assert_eq!(nvidia_gpus(t.root()), 2);
    }

    #[test]
    fn gpu_node_and_links_are_read() {
        let t = Tree::new();
        t.put(&format!("{GPU}/numa_node"), "1\n")
            .put(&format!("{GPU}/current_link_speed"), "16.0 GT/s PCIe\n")
            .put(&format!("{GPU}/current_link_width"), "8\n")
            .put(&format!("{GPU}/max_link_speed"), "32.0 GT/s PCIe\n")
            .put(&format!("{GPU}/max_link_width"), "16\n");
        let pci = pci_device(t.root(), "0000:0a:00.0").expect("pci");
        assert_eq!(pci.numa_node, Some(1));
        assert_eq!(pci.current_link.speed.as_deref(), Some("16.0 GT/s PCIe"));
        assert_eq!(pci.current_link.width, Some(8));
        assert_eq!(pci.max_link.speed.as_deref(), Some("32.0 GT/s PCIe"));
        assert_eq!(pci.max_link.width, Some(16));
    }

    #[test]
    fn no_node_and_missing_files_are_none() {
        let t = Tree::new();
        t.put(&format!("{GPU}/numa_node"), "-1\n")
            .put(&format!("{GPU}/current_link_speed"), "Unknown\n");
        let pci = pci_device(t.root(), "0000:0a:00.0").expect("pci");
        assert_eq!(pci.numa_node, None);
        assert_eq!(
            pci.current_link,
            Link {
                speed: None,
                width: None
            }
        );
        assert_eq!(
            pci.max_link,
            Link {
                speed: None,
                width: None
            }
        );
        let err = pci_device(t.root(), "0000:0b:00.0").expect_err("no such device");
        assert!(
            err.to_string().contains("no PCI device 0000:0b:00.0"),
            "{err}"
        );
        assert!(pci_device(t.root(), "../../etc").is_err());
    }

    #[test]
    fn nodes_and_their_cpus_are_read() {
        let t = Tree::new();
        assert_eq!(online_nodes(t.root()).expect("no NUMA: one node"), [0]);
        t.put("devices/system/node/online", "0-1\n")
            .put("devices/system/node/node0/cpulist", "0-15,32-47\n")
            .put("devices/system/node/node1/cpulist", "16-31,48-63\n");
        assert_eq!(online_nodes(t.root()).expect("nodes"), [0, 1]);
        assert_eq!(
            node_cpus(t.root(), 1).expect("cpus"),
            (16..32).chain(48..64).collect::<Vec<_>>()
        );
        let err = node_cpus(t.root(), 2).expect_err("no node 2");
        assert!(err.to_string().contains("NUMA node 2"), "{err}");
        t.put("devices/system/node/online", "zero\n");
        assert!(online_nodes(t.root()).is_err());
    }

    #[test]
    fn placement_only_on_several_nodes_with_a_known_gpu_node() {
        assert_eq!(
            placement_node(&[0], Some(0)),
            None,
            "one node: nothing changes"
        );
        assert_eq!(placement_node(&[0, 1], None), None, "node unknown");
        assert_eq!(placement_node(&[0, 1], Some(1)), Some(1));
        assert_eq!(placement_node(&[0, 1], Some(0)), Some(0));
        assert_eq!(placement_node(&[0, 1], Some(3)), None, "node not online");
        assert_eq!(placement_node(&[0, 2, 3], Some(2)), Some(2));
    }

    #[test]
    fn node_0_cpus_are_allowed_here() {
        // This machine's own node 0: its CPUs, intersected with the process's, are not empty.
        if !Path::new("/sys/devices/system/node/node0/cpulist").exists() {
            eprintln!("skipped: this kernel shows no NUMA nodes in /sys");
            return;
        }
        let cpus = node_cpus_allowed(0).expect("node 0 has CPUs this process may use");
        let mine = sys::numa::thread_affinity().expect("affinity");
        assert!(
            cpus.iter().all(|c| mine.contains(c)),
            "{cpus:?} within {mine:?}"
        );
        // A worker bound to them runs on exactly them (on a thread of its own).
        std::thread::spawn(move || {
            sys::numa::set_thread_affinity(&cpus).expect("bind to node 0");
            assert_eq!(sys::numa::thread_affinity().expect("affinity"), cpus);
        })
        .join()
        .expect("thread");
    }
}
