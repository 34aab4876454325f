//! Transfers between a [`File`] and GPU memory: checks the pointer, plans guided tasks that each
//! span a bounce ring, and runs every task through the worker's ring ([`crate::bounce`]), reading
//! or writing the file with the host read and write paths. The only CUDA calls made here are
//! [`crate::cuda`]'s questions (is there a driver, what is this pointer); copies are the ring's.
//! A worker starting a task moves to the GPU's NUMA node where there are several
//! ([`crate::topology`]).

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use super::File;
use crate::bounce;
use crate::config::Settings;
use crate::cuda::{self, Context, DevicePtr};
use crate::error::{Error, Op, Result};
use crate::plan::{self, Task};
use crate::pool::{Completion, Direction, Request, Worker};

impl File {
    /// Plans and queues a transfer between the file and device memory.
    ///
    /// # Safety
    /// As [`File::pread_device`] / [`File::pwrite_device`].
    pub(super) unsafe fn start_device(
        &self,
        ptr: DevicePtr,
        len: usize,
        offset: u64,
        direction: Direction,
    ) -> Result<Arc<Completion>> {
        let op = if direction == Direction::Read {
            Op::Read
        } else {
            Op::Write
        };
        self.check_mode(op)?;
        if len == 0 {
            // Nothing to move: an empty GPU array has a null address, which is no device memory,
            // and a machine without CUDA can still do nothing.
            return Ok(Completion::new(offset, 0, 0));
        }
        let context = cuda::device_context(ptr, "use the host-memory calls for it")?;
        if ptr.checked_add(len).is_none() {
            return Err(Error::InvalidArgument("device range wraps around".into()));
        }
        let append = match direction {
            Direction::Write => self.append_slot(),
            Direction::Read => None,
        };
        let offset = append.as_ref().map_or(offset, |a| a.offset);
        self.check_range(offset, len)?;
        let (tasks, fill) = self.device_plan(offset, len, direction);
        let ticket = if direction == Direction::Write {
            Some(self.prepare_write(offset, len, tasks.len())?)
        } else {
            None
        };
        bounce::trace::record("request", bounce::trace::start(), len as u64);
        let file = self.clone();
        let filling = fill.is_some();
        let ring = ring_key(context, &self.inner.settings);
        let run = Box::new(move |w: &mut Worker, t: &Task| {
            // On a machine with several NUMA nodes, fill the GPU's ring from its node's CPUs.
            crate::topology::follow_gpu(context);
            let at = DevicePtr(ptr.0 + t.buf_offset as u64);
            let settings = &file.inner.settings;
            let task_started = bounce::trace::start();
            let result = if direction == Direction::Read {
                // The last copies may still run when the task returns: the worker reads its
                // next task meanwhile, and the request completes once they have finished.
                // The ring waits for a buffer's last copy before it hands the buffer to a
                // chunk, and holds at most `bounce_buffers` buffers: when the chunk of that
                // number comes, every copy started before this task has finished without
                // error, and the tasks that waited for them (of another request, perhaps) are
                // reported.
                let ring_depth = settings.bounce_buffers.max(1);
                let mut chunks = 0;
                let started = bounce::start_read_to_device(
                    context,
                    at,
                    t.len,
                    t.offset,
                    settings,
                    &mut |buf, off| {
                        chunks += 1;
                        if chunks == ring_depth {
                            w.earlier_work_done(ring);
                        }
                        let chunk = Task::at_buffer_start(off, buf.len());
                        // SAFETY: `buf` is the ring's pinned buffer, valid for `buf.len()` bytes.
                        unsafe { file.read_task_of(filling, w, buf.as_mut_ptr(), &chunk) }
                    },
                );
                w.leave_running(
                    ring,
                    Box::new(move || {
                        let started = bounce::trace::start();
                        let finished = bounce::finish_thread_ring(context);
                        bounce::trace::record("settle", started, 0);
                        finished
                    }),
                );
                started
            } else {
                bounce::write_from_device(
                    context,
                    at,
                    t.len,
                    t.offset,
                    settings,
                    &mut |buf, off| {
                        let chunk = Task::at_buffer_start(off, buf.len());
                        // SAFETY: `buf` is the ring's pinned buffer, valid for `buf.len()` bytes.
                        unsafe { file.write_task(w, buf.as_ptr(), &chunk) }.map(|_| ())
                    },
                )
            };
            bounce::trace::record("task", task_started, t.len as u64);
            result
        });
        // Device tasks never run inline: the caller's thread has no bounce ring to spare.
        let mut request = Request {
            inline_ok: false,
            // A read's tasks leave copies on the worker's ring for `context` and say when the
            // copies left before them are done (above).
            leaves_running: (direction == Direction::Read).then_some(ring),
            ..self.request(tasks, offset, len, direction, run)
        };
        if let Some(shape) = fill {
            request.max_active = shape.in_flight;
        }
        let completion = self.queue(request);
        if let Some(ticket) = ticket {
            self.finish_write(&completion, ticket);
        }
        if let Some(append) = append {
            append.queued(&completion, len);
        }
        Ok(completion)
    }

    /// The tasks of a transfer between `[offset, offset+len)` of the file and device memory,
    /// and the fill's shape where it is a cold read that fills the page cache.
    ///
    /// A cold read that fills the page cache goes in a few large sequential tasks (see
    /// `policy::fill_shape`). A read whose cold ranges go direct goes in tasks of `task_size`
    /// taken in file order, as a host read does: the requests in flight stay within a few tasks
    /// of each other, the shape fastsafetensors' reads reach a disk in (benchmarks/RESULTS.md,
    /// Checkpoints, session 31), and `task_size` sets their size. Anything else goes in guided
    /// tasks of a bounce ring at least, so that inside a task the read of one buffer overlaps
    /// the copy of the one before, and of several rings where the transfer is large enough.
    /// Every task runs through its worker's ring, which keeps running across its tasks.
    fn device_plan(
        &self,
        offset: u64,
        len: usize,
        direction: Direction,
    ) -> (Vec<Task>, Option<crate::policy::FillShape>) {
        let align = self.plan_align();
        if direction == Direction::Read {
            if let Some(shape) = self.fill_shape(offset, len) {
                return (plan::split(offset, len, shape.task_bytes, align), Some(shape));
            }
            if self.reads_go_direct_when_cold() {
                return (plan::split(offset, len, self.choices.task_size, align), None);
            }
        }
        let settings = &self.inner.settings;
        let ring_bytes = settings.bounce_buffer_bytes() * settings.bounce_buffers as u64;
        let min_task = self.choices.task_size.max(ring_bytes);
        let tasks = plan::split_guided(
            offset,
            len,
            min_task,
            plan::MAX_DEVICE_TASK.max(min_task),
            2 * self.pool().width() as u64,
            align,
        );
        (tasks, None)
    }
}

/// The key under which a device read's tasks leave copies on the worker's ring for `context`
/// ([`Worker::leave_running`]): the context and the ring's shape. A read whose settings give
/// the ring another buffer size or depth replaces the ring (its copies then finish in the old
/// ring's drop, where an error would go unseen), so it never counts as on the same ring, and
/// the worker settles before it as before another job.
fn ring_key(context: Context, settings: &Settings) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (context.id(), settings.bounce_buffer_bytes(), settings.bounce_buffers).hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CacheMode, DirectMode};

    /// A 64 MiB file in the system's temporary directory (a disk file system where it is one).
    fn file_of_64_mib() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir_in("/var/tmp")
            .or_else(|_| tempfile::tempdir())
            .unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 64 << 20]).unwrap();
        (dir, path)
    }

    fn in_order_of(tasks: &[Task], size: u64) -> bool {
        tasks.windows(2).all(|w| w[0].offset + w[0].len as u64 == w[1].offset)
            && tasks[..tasks.len() - 1].iter().all(|t| t.len as u64 == size)
    }

    #[test]
    fn a_read_that_goes_direct_is_planned_in_tasks_of_task_size_in_file_order() {
        let (_dir, path) = file_of_64_mib();
        let bypassed = File::options()
            .cache(CacheMode::Bypass)
            .task_size(512 << 10)
            .open(&path, "r")
            .unwrap();
        if !bypassed.direct_may_work() {
            eprintln!("skipped: no O_DIRECT in the temporary directory");
            return;
        }
        let (tasks, fill) = bypassed.device_plan(0, 64 << 20, Direction::Read);
        assert!(fill.is_none());
        assert_eq!(tasks.len(), 128, "512 KiB tasks, not one ring's worth or more");
        assert!(in_order_of(&tasks, 512 << 10));
        // Without direct reads (`direct_read=off`) the same file reads through the page cache
        // and drops it: guided tasks of one ring at least, as before.
        let buffered = File::options()
            .cache(CacheMode::Bypass)
            .direct_read(DirectMode::Off)
            .task_size(512 << 10)
            .open(&path, "r")
            .unwrap();
        let (tasks, fill) = buffered.device_plan(0, 64 << 20, Direction::Read);
        assert!(fill.is_none());
        assert!(tasks[0].len > 512 << 10, "{:?}", &tasks[..2]);
        // Writes are never planned in the read's order.
        let (tasks, _) = File::options()
            .cache(CacheMode::Bypass)
            .task_size(512 << 10)
            .open(&path, "r+")
            .unwrap()
            .device_plan(0, 64 << 20, Direction::Write);
        assert!(tasks[0].len > 512 << 10, "{:?}", &tasks[..2]);
    }

    #[test]
    fn a_kept_file_reads_warm_ranges_in_guided_tasks_and_fills_cold_ones() {
        let (_dir, path) = file_of_64_mib();
        let kept = File::options()
            .cache(CacheMode::Keep)
            .open(&path, "r")
            .unwrap();
        // Just written: in the page cache.
        let (tasks, fill) = kept.device_plan(0, 64 << 20, Direction::Read);
        assert!(fill.is_none());
        assert!(tasks[0].len as u64 > kept.task_size(), "{:?}", &tasks[..2]);
        crate::pagecache::drop_file(&path).unwrap();
        let (_, fill) = kept.device_plan(0, 64 << 20, Direction::Read);
        assert!(fill.is_some(), "a cold kept read fills the page cache");
    }
}
