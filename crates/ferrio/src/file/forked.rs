//! [`PerProcess`]: a value of an open file that every process forked from the opener makes for
//! itself, kept in a list that only ever grows by atomic pushes. No lock guards it, so a fork can
//! never leave one held by a thread the new process does not have; a value that a thread of
//! another process was still making at the fork is simply never used here. A `OnceLock` shared by
//! all forked processes would block a grandchild forked while its parent was making the value.

use std::marker::PhantomData;
use std::ptr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, Ordering};

/// One value per process, made at its first use there.
pub(super) struct PerProcess<T> {
    /// The newest slot; each points to the one pushed before it.
    head: AtomicPtr<Slot<T>>,
    /// The slots are owned (boxed) by the list.
    _owns: PhantomData<Box<Slot<T>>>,
}

struct Slot<T> {
    /// The process the slot is for.
    pid: u32,
    value: OnceLock<T>,
    next: *mut Slot<T>,
}

// SAFETY: the list owns its values as a `Vec<OnceLock<T>>` would: moving it to another thread
// moves the values, and sharing it shares `&T` (made once, under `OnceLock`) between threads;
// the raw pointers are never handed out and only ever point to slots of this list.
unsafe impl<T: Send> Send for PerProcess<T> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync> Sync for PerProcess<T> {}

impl<T> Default for PerProcess<T> {
    fn default() -> Self {
        PerProcess {
            head: AtomicPtr::new(ptr::null_mut()),
            _owns: PhantomData,
        }
    }
}

impl<T> PerProcess<T> {
    /// Process `pid`'s value, made by `make` if it has none yet (another thread of `pid` that is
    /// making it is waited for, as with `OnceLock`).
    pub(super) fn get_or_init(&self, pid: u32, make: impl FnOnce() -> T) -> &T {
        self.slot(pid).value.get_or_init(make)
    }

    /// A value made to the end in this process or in one it was forked from, the newest first.
    pub(super) fn any_made(&self) -> Option<&T> {
        slots_from(self.head.load(Ordering::Acquire)).find_map(|slot| slot.value.get())
    }

    /// Process `pid`'s slot, pushed if it has none; two threads of one process asking at once
    /// get the same one.
    fn slot(&self, pid: u32) -> &Slot<T> {
        let mut spare: Option<Box<Slot<T>>> = None;
        loop {
            let head = self.head.load(Ordering::Acquire);
            if let Some(slot) = slots_from(head).find(|slot| slot.pid == pid) {
                return slot;
            }
            let mut slot = spare.take().unwrap_or_else(|| {
                Box::new(Slot {
                    pid,
                    value: OnceLock::new(),
                    next: ptr::null_mut(),
                })
            });
            slot.next = head;
            let raw = Box::into_raw(slot);
            // Pushed only if no slot came in since `head` was read: a thread of this process
            // that pushed one meanwhile is found by the next pass.
            match self
                .head
                .compare_exchange(head, raw, Ordering::AcqRel, Ordering::Acquire)
            {
                // SAFETY: published, so it lives as long as the list (slots are freed only
                // when it drops).
                Ok(_) => return unsafe { &*raw },
                // SAFETY: not published, so still ours alone: taken back for the next pass.
                Err(_) => spare = Some(unsafe { Box::from_raw(raw) }),
            }
        }
    }
}

/// The slots from `head` on, newest first.
fn slots_from<'a, T: 'a>(mut at: *mut Slot<T>) -> impl Iterator<Item = &'a Slot<T>> {
    std::iter::from_fn(move || {
        // SAFETY: `at` is null or a slot of the list, published whole by the release half of the
        // push that made it the head (read back with acquire), and never freed before the list
        // drops; the caller's borrow of the list outlives the references.
        let slot = unsafe { at.as_ref() }?;
        at = slot.next;
        Some(slot)
    })
}

impl<T> Drop for PerProcess<T> {
    fn drop(&mut self) {
        let mut at = *self.head.get_mut();
        while !at.is_null() {
            // SAFETY: every slot was made by `Box::into_raw` in `slot` and is freed once, here.
            // A slot whose value another process was still making when this one was forked is
            // freed without dropping a value (a `OnceLock` that never finished holds none).
            let slot = unsafe { Box::from_raw(at) };
            at = slot.next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn each_process_gets_its_own_value_and_keeps_it() {
        let values = PerProcess::default();
        assert!(values.any_made().is_none());
        assert_eq!(*values.get_or_init(7, || 70), 70);
        assert_eq!(*values.get_or_init(8, || 80), 80);
        assert_eq!(*values.get_or_init(7, || 71), 70, "made once per process");
        assert_eq!(values.any_made(), Some(&80), "the newest first");
    }

    #[test]
    fn threads_of_one_process_asking_at_once_share_one_value() {
        let values = Arc::new(PerProcess::default());
        let made = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (values, made) = (values.clone(), made.clone());
                std::thread::spawn(move || {
                    let v = values.get_or_init(42, || made.fetch_add(1, Ordering::SeqCst));
                    v as *const usize as usize
                })
            })
            .collect();
        let addrs: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(made.load(Ordering::SeqCst), 1, "made by one thread only");
        assert!(addrs.windows(2).all(|w| w[0] == w[1]), "one slot for the process");
    }

    #[test]
    fn a_value_left_half_made_is_skipped_and_freed_without_a_drop() {
        // What a process forked while another process's thread was making its value sees: a
        // slot whose `OnceLock` never finishes. Made here by a `make` that panics midway.
        let drops = Arc::new(AtomicUsize::new(0));
        struct Counted(Arc<AtomicUsize>);
        impl Drop for Counted {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let values = PerProcess::default();
        let half = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            values.get_or_init(1, || -> Counted { panic!("half made") });
        }));
        assert!(half.is_err());
        assert!(values.any_made().is_none(), "a value never finished is not used");
        values.get_or_init(2, || Counted(drops.clone()));
        assert!(values.any_made().is_some());
        drop(values);
        assert_eq!(drops.load(Ordering::SeqCst), 1, "the one value made is dropped once");
    }
}
