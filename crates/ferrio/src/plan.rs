//! Pure task planning: how a byte range is split into tasks, and how a task is split into the
//! parts that can go `O_DIRECT` and the parts that cannot.
//!
//! Nothing here does I/O; everything is a function of numbers, so it is covered by property
//! tests.

use std::ops::Range;

/// One task: a piece of a request, `len` bytes at file offset `offset`, landing at `buf_offset`
/// in the caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Task {
    /// File offset of the first byte.
    pub offset: u64,
    /// Bytes in this task.
    pub len: usize,
    /// Where the first byte sits in the request's buffer.
    pub buf_offset: usize,
}

impl Task {
    /// A task of `len` bytes at file offset `offset` that fills a buffer of its own (a bounce
    /// buffer, say) from its start.
    pub fn at_buffer_start(offset: u64, len: usize) -> Task {
        Task {
            offset,
            len,
            buf_offset: 0,
        }
    }

    /// One past the last file offset.
    pub fn end(&self) -> u64 {
        self.offset + self.len as u64
    }
}

/// Splits `[offset, offset+len)` into tasks of about `task_size` bytes.
///
/// When `task_size >= align`, every task but the first starts at a multiple of `align` and the
/// first one is shortened to make that so: only the first task can have an unaligned head and
/// only the last an unaligned tail. `align` must be a power of two (1 means no alignment).
/// A zero-length range gives no tasks.
pub fn split(offset: u64, len: usize, task_size: u64, align: u64) -> Vec<Task> {
    debug_assert!(align.is_power_of_two());
    let task_size = task_size.max(1);
    let end = offset + len as u64;
    let step = if task_size >= align {
        task_size / align * align
    } else {
        task_size
    };
    let mut tasks = Vec::with_capacity((len as u64 / step + 2) as usize);
    let mut pos = offset;
    // The first boundary: the aligned base of `offset` plus one step, so later ones are aligned.
    // Saturating: a task size near `u64::MAX` (a `Settings` field set directly) plans one task
    // to the end rather than wrapping around to a task of almost 2^64 bytes.
    let mut next = if task_size >= align {
        align_down(offset, align).saturating_add(step)
    } else {
        offset.saturating_add(step)
    };
    while pos < end {
        let stop = next.min(end);
        tasks.push(Task {
            offset: pos,
            len: (stop - pos) as usize,
            buf_offset: (pos - offset) as usize,
        });
        pos = stop;
        next = stop.saturating_add(step);
    }
    tasks
}

/// The parts of a file range for direct I/O: an unaligned head, an aligned middle (start and end
/// multiples of `align`) and an unaligned tail. Any part may be empty; together they are the range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectParts {
    /// Bytes before the first aligned offset (buffered I/O).
    pub head: Range<u64>,
    /// The aligned middle (direct I/O).
    pub middle: Range<u64>,
    /// Bytes after the last aligned offset (buffered I/O).
    pub tail: Range<u64>,
}

/// Splits `[offset, end)` into head, aligned middle and tail for `align` (a power of two).
pub fn direct_parts(offset: u64, end: u64, align: u64) -> DirectParts {
    let a = align_up(offset, align).min(end);
    let b = align_down(end, align).max(a);
    DirectParts {
        head: offset..a,
        middle: a..b,
        tail: b..end,
    }
}

/// The aligned span that covers `[offset, end)` for over-read: start rounded down, end rounded up.
pub fn overread_span(offset: u64, end: u64, align: u64) -> Range<u64> {
    align_down(offset, align)..align_up(end, align)
}

/// Rounds `x` down to a multiple of `align` (a power of two).
pub fn align_down(x: u64, align: u64) -> u64 {
    x & !(align - 1)
}

/// Rounds `x` up to a multiple of `align` (a power of two).
pub fn align_up(x: u64, align: u64) -> u64 {
    (x + align - 1) & !(align - 1)
}

/// Largest task of a transfer between a file and GPU memory.
pub const MAX_DEVICE_TASK: u64 = 128 << 20;

/// Splits `[offset, offset+len)` into tasks that shrink as the range is used up: each is about
/// `1/parts` of what is left, within `min_task..=max_task` (guided scheduling), and the last
/// takes the rest rather than leave less than `min_task`. Early tasks are long; the last ones
/// are short, so threads finish together. Boundaries are aligned as in
/// [`split`] when `min_task >= align`.
///
/// Used for transfers between a file and GPU memory: long tasks keep a worker's reads and
/// copies overlapping with little per-task overhead, and the short last ones let the threads
/// finish together (measured against fixed sizes on the H200: benchmarks/RESULTS.md).
pub fn split_guided(
    offset: u64,
    len: usize,
    min_task: u64,
    max_task: u64,
    parts: u64,
    align: u64,
) -> Vec<Task> {
    debug_assert!(align.is_power_of_two());
    let min_task = min_task.max(1);
    let max_task = max_task.max(min_task);
    let end = offset + len as u64;
    let mut tasks = Vec::new();
    let mut pos = offset;
    while pos < end {
        let size = (end - pos).div_ceil(parts.max(1)).clamp(min_task, max_task);
        let mut stop = if size >= align {
            // At least one alignment unit past `pos`, since `size >= align`.
            align_down(pos.saturating_add(size), align)
        } else {
            pos.saturating_add(size)
        }
        .min(end);
        if end - stop < min_task && end - pos <= max_task {
            // No task shorter than `min_task` after this one: it takes the rest.
            stop = end;
        }
        tasks.push(Task {
            offset: pos,
            len: (stop - pos) as usize,
            buf_offset: (pos - offset) as usize,
        });
        pos = stop;
    }
    tasks
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_task_size_near_the_largest_number_plans_one_task_to_the_end() {
        for task_size in [u64::MAX, u64::MAX - 4095, 1 << 63] {
            for offset in [0, 4096, 16 << 20] {
                let tasks = super::split(offset, 100, task_size, 4096);
                assert_eq!(tasks.len(), 1, "{task_size} at {offset}");
                assert_eq!((tasks[0].offset, tasks[0].len), (offset, 100));
            }
            let guided = super::split_guided(4096, 100, task_size, task_size, 4, 4096);
            assert_eq!(guided.len(), 1);
            assert_eq!(guided[0].len, 100);
        }
    }

    #[test]
    fn guided_tasks_shrink_to_the_floor_and_start_at_the_cap() {
        const MIB: u64 = 1 << 20;
        let tasks = super::split_guided(0, 8 << 30, 8 * MIB, 128 * MIB, 32, 4096);
        assert_eq!(tasks[0].len as u64, 128 * MIB, "long tasks first");
        let last = tasks.last().unwrap().len as u64;
        assert!(
            (8 * MIB..16 * MIB).contains(&last),
            "short ones last: {last}"
        );
        let but_last = &tasks[..tasks.len() - 1];
        assert!(
            but_last.windows(2).all(|w| w[1].len <= w[0].len),
            "never growing, but for the last, which takes the rest"
        );
        // A transfer smaller than `min_task` is one task.
        assert_eq!(
            super::split_guided(5, 1000, 8 * MIB, 128 * MIB, 32, 4096).len(),
            1
        );
    }

    use super::*;
    use proptest::prelude::*;

    fn aligns() -> impl Strategy<Value = u64> {
        prop::sample::select(vec![1u64, 512, 4096])
    }

    proptest! {
        #[test]
        fn tasks_cover_the_range_exactly_once(
            offset in 0u64..1 << 40, len in 0usize..64 << 20, task in 1u64..16 << 20, align in aligns()
        ) {
            let tasks = split(offset, len, task, align);
            let mut pos = offset;
            for t in &tasks {
                prop_assert_eq!(t.offset, pos, "contiguous, no overlap, no gap");
                prop_assert!(t.len > 0);
                prop_assert_eq!(t.buf_offset as u64, t.offset - offset);
                prop_assert!(t.len as u64 <= task, "task {} > task size {}", t.len, task);
                pos = t.end();
            }
            prop_assert_eq!(pos, offset + len as u64);
            if len == 0 { prop_assert!(tasks.is_empty()); }
        }

        #[test]
        fn every_task_but_the_first_starts_aligned(
            offset in 0u64..1 << 40, len in 1usize..64 << 20, task in 1u64..16 << 20, align in aligns()
        ) {
            prop_assume!(task >= align);
            let tasks = split(offset, len, task, align);
            for t in tasks.iter().skip(1) {
                prop_assert_eq!(t.offset % align, 0);
            }
            // Only the first task is shortened: all the middle ones are full steps.
            let step = task / align * align;
            if tasks.len() > 2 {
                for t in &tasks[1..tasks.len() - 1] {
                    prop_assert_eq!(t.len as u64, step);
                }
            }
        }

        #[test]
        fn guided_tasks_cover_the_range_exactly_once_with_aligned_boundaries(
            offset in 0u64..1 << 40,
            len in 0usize..1 << 26,
            min_task in 1u64..1 << 22,
            extra in 0u64..1 << 24,
            parts in 0u64..64,
            align in aligns(),
        ) {
            let max_task = min_task + extra;
            let tasks = super::split_guided(offset, len, min_task, max_task, parts, align);
            let mut pos = offset;
            for (i, t) in tasks.iter().enumerate() {
                prop_assert_eq!(t.offset, pos, "contiguous, no overlap, no gap");
                prop_assert!(t.len > 0);
                prop_assert_eq!(t.buf_offset as u64, t.offset - offset);
                prop_assert!(t.len as u64 <= max_task, "task {} > max {}", t.len, max_task);
                if min_task >= align && i > 0 {
                    prop_assert_eq!(t.offset % align, 0, "only the first task starts unaligned");
                }
                pos += t.len as u64;
            }
            prop_assert_eq!(pos, offset + len as u64);
            if len == 0 { prop_assert!(tasks.is_empty()); }
        }

        #[test]
        fn direct_parts_partition_the_range(offset in 0u64..1 << 40, len in 0u64..1 << 24, align in aligns()) {
            let end = offset + len;
            let p = direct_parts(offset, end, align);
            prop_assert_eq!(p.head.start, offset);
            prop_assert_eq!(p.head.end, p.middle.start);
            prop_assert_eq!(p.middle.end, p.tail.start);
            prop_assert_eq!(p.tail.end, end);
            // The middle holds every whole aligned block of the range, and only those. A range
            // with no multiple of `align` inside has no aligned point for an empty middle to sit
            // at: it is all head.
            let blocks = align_down(end, align).saturating_sub(align_up(offset, align));
            prop_assert_eq!(p.middle.end - p.middle.start, blocks);
            if blocks > 0 {
                prop_assert_eq!(p.middle.start % align, 0);
                prop_assert_eq!(p.middle.end % align, 0);
            }
            prop_assert!(p.head.end - p.head.start < align);
            prop_assert!(p.tail.end - p.tail.start < align);
        }

        #[test]
        fn overread_span_is_aligned_and_covers(offset in 0u64..1 << 40, len in 0u64..1 << 24, align in aligns()) {
            let s = overread_span(offset, offset + len, align);
            prop_assert!(s.start <= offset && s.end >= offset + len);
            prop_assert_eq!(s.start % align, 0);
            prop_assert_eq!(s.end % align, 0);
            prop_assert!(offset - s.start < align && s.end - (offset + len) < align);
        }
    }

    #[test]
    fn first_task_is_shortened() {
        let t = split(100, 10_000, 4096, 4096);
        assert_eq!(
            t[0],
            Task {
                offset: 100,
                len: 3996,
                buf_offset: 0
            }
        );
        assert_eq!(t[1].offset, 4096);
        assert_eq!(t.last().unwrap().end(), 10_100);
    }
}
