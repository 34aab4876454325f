//! NUMA and memory syscalls: anonymous memory for pinning, placed on one node and in huge pages
//! where asked (`mmap` + `mbind` + `madvise`, faulted in), the node a page lives on (`get_mempolicy`), and the calling thread's CPU affinity
//! (`sched_getaffinity`/`sched_setaffinity`). Which node to use is decided elsewhere
//! (`crate::topology`); nothing here reads sysfs or knows about GPUs.

use std::io;
use std::ptr::NonNull;

/// `MPOL_PREFERRED`: allocate on the node given, fall back to others when it is full (the
/// bytes must still arrive; a remote page is slower, not wrong).
const MPOL_PREFERRED: libc::c_int = 1;
/// `get_mempolicy` flags: return the node of the page at the address given.
#[cfg(any(test, feature = "testing"))]
const MPOL_F_NODE: libc::c_ulong = 1;
#[cfg(any(test, feature = "testing"))]
const MPOL_F_ADDR: libc::c_ulong = 2;
/// Nodes a mask can name: the kernel's largest `MAX_NUMNODES` (`CONFIG_NODES_SHIFT` = 10).
const MASK_NODES: usize = 1024;

/// Bytes of a transparent huge page (x86-64, and arm64 with 4 KiB pages).
pub const HUGE_PAGE: usize = 2 << 20;

/// Maps `len` bytes (at least 1, rounded up to whole pages) of private anonymous memory for
/// pinning, and touches every page so it is allocated now. Returns the start and the length
/// mapped; free it with [`unmap`].
///
/// - `node`: the pages are taken from this NUMA node where it has room (`MPOL_PREFERRED`).
/// - `huge`: the mapping starts on a [`HUGE_PAGE`] boundary and is advised `MADV_HUGEPAGE`,
///   so the kernel backs it with huge pages where it can: each is one page to fault in, pin and
///   map for the device instead of 512. Where the kernel has none to give, the memory is
///   ordinary pages and works the same.
///
/// # Errors
/// When the mapping fails, or the kernel refuses the node's policy (`EINVAL` for a node that
/// is not online or not allowed to this process, `ENOSYS` on a kernel without NUMA); that error
/// names the node. Nothing stays mapped after an error.
pub fn map_anonymous(
    len: usize,
    node: Option<u32>,
    huge: bool,
) -> io::Result<(NonNull<u8>, usize)> {
    let bad_node = |node: u32, why: &str| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("NUMA node {node}: {why}"),
        )
    };
    let index = match node {
        Some(n) => {
            let i = usize::try_from(n).map_err(|_| bad_node(n, "no such node"))?;
            if i >= MASK_NODES {
                return Err(bad_node(n, "no such node (above the kernel's limit)"));
            }
            Some(i)
        }
        None => None,
    };
    let page = super::page_size();
    let too_large = || io::Error::new(io::ErrorKind::InvalidInput, "mapping too large");
    let len = len.max(1).checked_next_multiple_of(page).ok_or_else(too_large)?;
    // Room to slide the start onto a huge-page boundary; the slack is unmapped below.
    let slack = if huge { HUGE_PAGE } else { 0 };
    let total = len.checked_add(slack).ok_or_else(too_large)?;
    // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches no
    // existing memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let base = p as usize;
    let start = if huge { base.next_multiple_of(HUGE_PAGE) } else { base };
    let end = start + len;
    // The pieces before `start` and after `end` are whole pages (a page-aligned mapping, a
    // huge-page-aligned start, a page-rounded length) that nothing uses.
    if start > base {
        // SAFETY: `base..start` lies inside the mapping just made (see above).
        unsafe { libc::munmap(p, start - base) };
    }
    if base + total > end {
        // SAFETY: `end..base+total` lies inside the mapping just made (see above).
        unsafe { libc::munmap(end as *mut libc::c_void, base + total - end) };
    }
    let p = start as *mut libc::c_void;
    // A forked child does not inherit the mapping. The memory is to be pinned for DMA: were it
    // shared copy-on-write with a child, the parent's next write could move to a fresh page
    // while the device still reads the old one (kernels before 5.9). A child never uses the
    // parent's rings anyway. Advice only: it never fails on a private anonymous mapping.
    // SAFETY: `p..p+len` is the mapping kept above.
    let _ = unsafe { libc::madvise(p, len, libc::MADV_DONTFORK) };
    if huge {
        // Advice only: a kernel without transparent huge pages refuses it, and the memory is
        // then ordinary pages.
        // SAFETY: `p..p+len` is the mapping kept above.
        let _ = unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
    }
    if let (Some(index), Some(node)) = (index, node) {
        let bits = u64::BITS as usize;
        let mut mask = [0u64; MASK_NODES / 64];
        mask[index / bits] |= 1 << (index % bits);
        // SAFETY: `p..p+len` is the mapping kept above; `mask` holds MASK_NODES bits, and the
        // kernel reads `maxnode - 1` of them (hence the + 1).
        let rc = unsafe {
            libc::syscall(
                libc::SYS_mbind,
                p,
                len,
                MPOL_PREFERRED,
                mask.as_ptr(),
                MASK_NODES + 1,
                0u32,
            )
        };
        if rc != 0 {
            let err = io::Error::last_os_error();
            // SAFETY: the mapping kept above, not handed out.
            unsafe { libc::munmap(p, len) };
            return Err(io::Error::new(
                err.kind(),
                format!("NUMA node {node}: mbind refused ({err})"),
            ));
        }
    }
    let base = p.cast::<u8>();
    for off in (0..len).step_by(page) {
        // SAFETY: `off < len`, inside the writable mapping; writing faults the page in (a huge
        // page at the first touch of each huge-page span, where the kernel gives one) under the
        // policy just set (the policy applies to pages allocated after it, hence before).
        unsafe { base.add(off).write_volatile(0) };
    }
    let ptr = NonNull::new(base).ok_or_else(|| io::Error::other("mmap returned a null mapping"))?;
    Ok((ptr, len))
}

/// Whether the kernel gives transparent huge pages to a mapping advised `MADV_HUGEPAGE`: its
/// mode (`/sys/kernel/mm/transparent_hugepage/enabled`) is `always` or `madvise`. Read once.
pub fn transparent_huge_pages() -> bool {
    static MODE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|mode| huge_pages_in_mode(&mode))
    })
}

/// Whether a `transparent_hugepage/enabled` line (`always [madvise] never`: the mode in use is
/// bracketed) gives huge pages to advised mappings.
fn huge_pages_in_mode(line: &str) -> bool {
    line.split_whitespace()
        .any(|m| m == "[always]" || m == "[madvise]")
}

/// Unmaps memory from [`map_anonymous`].
///
/// # Safety
/// `ptr` and `len` must be those [`map_anonymous`] returned, unmapped once, and nothing may use
/// the memory afterwards.
pub unsafe fn unmap(ptr: NonNull<u8>, len: usize) -> io::Result<()> {
    // SAFETY: the caller's contract: a whole mapping of ours, unmapped once.
    super::cvt(unsafe { libc::munmap(ptr.as_ptr().cast(), len) }).map(|_| ())
}

#[cfg(any(test, feature = "testing"))]
/// The NUMA node holding the page at `addr` (which must be mapped and faulted in); tests check
/// placement with it.
///
/// # Errors
/// When the kernel refuses (`EFAULT` for an unmapped address, `ENOSYS` without NUMA).
pub fn node_of_page(addr: usize) -> io::Result<u32> {
    let mut node: libc::c_int = -1;
    // SAFETY: the out-pointer is a live local; with MPOL_F_ADDR the kernel only looks the
    // address up, it does not dereference it in our name; no mask is asked for.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut node as *mut libc::c_int,
            std::ptr::null_mut::<libc::c_ulong>(),
            0 as libc::c_ulong,
            addr as *const libc::c_void,
            MPOL_F_NODE | MPOL_F_ADDR,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    u32::try_from(node).map_err(|_| io::Error::other(format!("get_mempolicy returned node {node}")))
}

/// The CPUs the calling thread may run on, in increasing order.
///
/// # Errors
/// When `sched_getaffinity` fails.
pub fn thread_affinity() -> io::Result<Vec<usize>> {
    // SAFETY: an all-zero cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is writable and its size is passed.
    super::cvt(unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) })?;
    let max = 8 * std::mem::size_of_val(&set);
    // SAFETY: CPU_ISSET only reads the set; every index is below the set's size in bits.
    Ok((0..max).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect())
}

/// Lets the calling thread run only on `cpus`.
///
/// # Errors
/// [`io::ErrorKind::InvalidInput`] for an empty list or a CPU beyond the set's size; otherwise
/// when `sched_setaffinity` fails (`EINVAL` when none of the CPUs is allowed).
pub fn set_thread_affinity(cpus: &[usize]) -> io::Result<()> {
    // SAFETY: an all-zero cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let max = 8 * std::mem::size_of_val(&set);
    if cpus.is_empty() || cpus.iter().any(|&c| c >= max) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("CPU list {cpus:?} is empty or names a CPU beyond {max}"),
        ));
    }
    for &c in cpus {
        // SAFETY: `c < max` (checked), inside the set.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t and its size is passed; only this thread changes.
    super::cvt(unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) })
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_placed_on_node_0_lives_there_page_by_page() {
        let page = crate::sys::page_size();
        let (p, len) = map_anonymous(5 * page + 17, Some(0), false).expect("map on node 0");
        assert_eq!(len, 6 * page);
        for off in (0..len).step_by(page) {
            let addr = p.as_ptr() as usize + off;
            assert_eq!(node_of_page(addr).expect("get_mempolicy"), 0, "page at {off}");
        }
        // SAFETY: mapped above with this length, unmapped once.
        unsafe { unmap(p, len) }.expect("unmap");
    }

    #[test]
    fn huge_mappings_start_on_a_huge_page_and_keep_their_length() {
        for len in [HUGE_PAGE, 2 * HUGE_PAGE + 5, 4096] {
            let (p, mapped) = map_anonymous(len, None, true).expect("map");
            assert_eq!(p.as_ptr() as usize % HUGE_PAGE, 0, "len {len}");
            assert_eq!(mapped, len.next_multiple_of(crate::sys::page_size()));
            // SAFETY: `p..p+mapped` is the writable mapping just made.
            let bytes = unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), mapped) };
            assert!(bytes.iter().all(|&b| b == 0), "fresh memory reads as zeros");
            bytes.fill(0xa5);
            // SAFETY: mapped above with this length, unmapped once.
            unsafe { unmap(p, mapped) }.expect("unmap");
        }
    }

    #[test]
    fn the_huge_page_mode_is_the_bracketed_one() {
        assert!(huge_pages_in_mode("[always] madvise never\n"));
        assert!(huge_pages_in_mode("always [madvise] never\n"));
        assert!(!huge_pages_in_mode("always madvise [never]\n"));
        assert!(!huge_pages_in_mode(""));
    }

    #[test]
    fn a_node_that_is_not_online_is_a_clear_error() {
        for node in [999, 4096, u32::MAX] {
            let err = map_anonymous(4096, Some(node), false).expect_err("no such node");
            assert!(err.to_string().contains(&format!("NUMA node {node}")), "{err}");
        }
    }

    #[test]
    fn affinity_is_set_and_read_back() {
        // A thread of its own, so no other test's thread changes.
        std::thread::spawn(|| {
            let all = thread_affinity().expect("affinity");
            assert!(!all.is_empty());
            set_thread_affinity(&all[..1]).expect("set one cpu");
            assert_eq!(thread_affinity().expect("affinity"), all[..1].to_vec());
            set_thread_affinity(&all).expect("set back");
            assert_eq!(thread_affinity().expect("affinity"), all);
            assert!(set_thread_affinity(&[]).is_err());
        })
        .join()
        .expect("thread");
    }
}
