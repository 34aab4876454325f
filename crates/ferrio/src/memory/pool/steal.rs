//! Cross-stream hand-over: stealing one block from another stream's list, gathering every
//! list into one before reporting out of memory, ordering the taker after the giver's event,
//! and pruning detached lists that ran empty. Holds one list lock at a time (see "Lock order"
//! in the [module docs](crate::memory)); it never calls the upstream.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::super::blocks::FreeBlock;
use super::super::order::{StreamId, StreamOrder};
use super::super::stream_list::{bump, ListState, StreamList};
use super::super::upstream::Upstream;
use super::{read, write, PoolResource, SAFE_FOR_ALL};
use crate::error::Result;

/// How many best-fit candidates a steal looks at for one that is already safe to hand over.
const SAFE_FIT_PROBES: usize = 16;

impl<U: Upstream, S: StreamOrder> PoolResource<U, S> {
    /// Takes one block of at least `bytes` from another stream's list, ordering `stream` after
    /// it. Prefers blocks that are already safe for every stream (their stream's last event
    /// has completed), then, if `may_wait`, any block, recording the other stream's event if
    /// needed.
    pub(super) fn steal(
        &self,
        own: &Arc<StreamList<S>>,
        stream: &S::Stream,
        bytes: usize,
        may_wait: bool,
    ) -> Result<Option<FreeBlock>> {
        let mut others = self.other_lists(own.id);
        // The fresh list first: its memory costs no driver call and no device wait.
        let (mut order, rest): (Vec<_>, Vec<_>) =
            others.drain(..).partition(|l| l.id == StreamId::FRESH);
        // Thieves start at different victims, so they do not all queue on the same list.
        let start = (own.id.get() as usize) % rest.len().max(1);
        order.extend(rest[start..].iter().chain(&rest[..start]).cloned());
        let others: Vec<_> = order.iter().collect();
        // Pass 1: a block safe for every stream (never used, or its free is covered by a
        // completed event): no device wait, and what is left of it stays safe for everyone.
        // Fresh memory needs no driver call; the event is queried only if it would help.
        for &victim in &others {
            let mut st = victim.lock();
            if st.removed || st.free.largest() < bytes {
                continue;
            }
            let mut at = st
                .free
                .find_fit_before(bytes, SAFE_FOR_ALL, SAFE_FIT_PROBES);
            if at.is_none() && st.covered_seq > SAFE_FOR_ALL {
                let covered = st.covered_seq;
                let candidate = st.free.find_fit_before(bytes, covered, SAFE_FIT_PROBES);
                if candidate.is_some() && st.covered_complete(&self.order, victim)? {
                    at = candidate;
                }
            }
            // Only `bytes` of it: the rest stays where it is, safe as it was, instead of
            // moving with the thief (where its frees would merge into it and make it unsafe).
            let Some(mut b) = at.and_then(|addr| st.free.carve(addr, bytes)) else {
                continue;
            };
            b.seq = SAFE_FOR_ALL;
            bump(&victim.counters.stolen);
            let prune = st.stream.is_none() && st.free.is_empty();
            drop(st);
            if prune {
                self.prune(victim);
            }
            return Ok(Some(b));
        }
        if !may_wait {
            return Ok(None);
        }
        // Pass 2: any block, with `stream` waiting on the victim's event on the device.
        for &victim in &others {
            let mut st = victim.lock();
            if st.removed {
                continue;
            }
            let Some(b) = st.free.carve_best_fit(bytes) else {
                continue;
            };
            if let Err(e) = self.order_after(&mut st, victim, own, stream, b.seq) {
                let back = st.free.insert(b);
                debug_assert!(back.is_ok());
                return Err(e);
            }
            bump(&victim.counters.stolen);
            let prune = st.stream.is_none() && st.free.is_empty();
            drop(st);
            if prune {
                self.prune(victim);
            }
            return Ok(Some(b));
        }
        Ok(None)
    }

    /// Makes `stream` (whose list is `own`) ordered after every free on `victim` up to `seq`:
    /// records `victim`'s event if its last record is older than `seq`, then waits on it on
    /// the device unless it has completed. Called under `victim`'s lock (`st`): `record`,
    /// `is_complete` and `wait` only enqueue or inspect, and holding the lock keeps a
    /// concurrent record from making the event stand for less than we checked.
    pub(super) fn order_after(
        &self,
        st: &mut ListState<S>,
        victim: &StreamList<S>,
        own: &StreamList<S>,
        stream: &S::Stream,
        seq: u64,
    ) -> Result<()> {
        if seq == SAFE_FOR_ALL {
            return Ok(());
        }
        if seq > st.covered_seq {
            st.record(&self.order, victim)?;
        }
        if !st.covered_complete(&self.order, victim)? {
            self.order.wait(stream, victim.event(&self.order)?)?;
            bump(&own.counters.waits);
        }
        Ok(())
    }

    /// Moves every thread's cached blocks to their lists, then every other list's blocks into
    /// `own`, ordering `stream` after each list.
    pub(super) fn gather(&self, own: &Arc<StreamList<S>>, stream: &S::Stream) -> Result<()> {
        self.retire_caches(|_| true);
        for victim in self.other_lists(own.id) {
            let mut st = victim.lock();
            if st.removed || st.free.is_empty() {
                continue;
            }
            let newest = st.free.newest_seq();
            self.order_after(&mut st, &victim, own, stream, newest)?;
            let blocks = st.free.drain();
            victim
                .counters
                .stolen
                .fetch_add(blocks.len() as u64, Ordering::Relaxed);
            let prune = st.stream.is_none();
            drop(st);
            if prune {
                self.prune(&victim);
            }
            let mut own_st = own.lock();
            let seq = own_st.next_seq();
            for mut b in blocks {
                if b.seq != SAFE_FOR_ALL {
                    b.seq = seq;
                }
                let moved = own_st.free.insert(b);
                debug_assert!(moved.is_ok(), "gathered block overlaps: {moved:?}");
            }
        }
        Ok(())
    }

    /// Every list but `id`'s (a snapshot: the map lock is released before any list lock).
    pub(super) fn other_lists(&self, id: StreamId) -> Vec<Arc<StreamList<S>>> {
        read(&self.streams)
            .iter()
            .filter(|(k, _)| **k != id)
            .map(|(_, v)| Arc::clone(v))
            .collect()
    }

    /// Drops a detached list that ran empty from the map (map lock, then list lock).
    pub(super) fn prune(&self, list: &Arc<StreamList<S>>) {
        let mut map = write(&self.streams);
        let mut st = list.lock();
        let same = map.get(&list.id).is_some_and(|l| Arc::ptr_eq(l, list));
        if same && !st.removed && st.stream.is_none() && st.free.is_empty() && st.cache_entries == 0
        {
            st.removed = true;
            self.flush(&mut st);
            self.in_use_retired
                .fetch_add(std::mem::take(&mut st.in_use), Ordering::Relaxed);
            map.remove(&list.id);
        }
    }
}
