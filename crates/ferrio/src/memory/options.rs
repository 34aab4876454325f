//! How a [`PoolResource`](super::PoolResource) is configured: [`PoolOptions`] (sizes,
//! alignment, limit) and [`EventPolicy`] (when cross-stream events are recorded), with the
//! options' validation. Plain values; the pool reads them and this file touches nothing else.

use std::num::NonZeroU32;

use crate::error::{Error, Result};

/// When the pool records the per-stream event that lets other streams reuse a freed block.
///
/// See "Events" in the [module docs](crate::memory) for the measurements behind the default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum EventPolicy {
    /// Record only when another stream is about to take one of the stream's blocks and the
    /// last record does not cover it yet. Frees make no driver call at all.
    #[default]
    OnSteal,
    /// Record after every free (what RMM's pool does): steals find blocks already covered,
    /// at the price of one `cuEventRecord` per free.
    EveryFree,
    /// Record after every n-th free on a stream; blocks freed since are recorded on steal.
    EveryNthFree(NonZeroU32),
}

/// How a [`PoolResource`](super::PoolResource) is sized and aligned. Build with
/// [`PoolOptions::default`] and the setters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolOptions {
    pub(super) alignment: usize,
    pub(super) initial_bytes: usize,
    pub(super) grow_bytes: usize,
    pub(super) max_bytes: Option<usize>,
    pub(super) event_policy: EventPolicy,
    pub(super) thread_cache: bool,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            alignment: PoolOptions::DEFAULT_ALIGNMENT,
            initial_bytes: 0,
            grow_bytes: PoolOptions::DEFAULT_GROW_BYTES,
            max_bytes: None,
            event_policy: EventPolicy::default(),
            thread_cache: true,
        }
    }
}

impl PoolOptions {
    /// Default alignment of every block: 256 bytes, what `cuMemAlloc` guarantees and what
    /// vectorized device loads want.
    pub const DEFAULT_ALIGNMENT: usize = 256;
    /// Default size of each upstream allocation when the pool grows: 32 MiB, so a pool makes
    /// few upstream calls (each `cuMemAlloc` may synchronize the device) without holding much
    /// more than it needs.
    pub const DEFAULT_GROW_BYTES: usize = 32 << 20;

    /// Every block's address and size are multiples of `bytes` (a power of two).
    pub fn alignment(mut self, bytes: usize) -> Self {
        self.alignment = bytes;
        self
    }

    /// Bytes taken from the upstream when the pool is created (default 0).
    pub fn initial_bytes(mut self, bytes: usize) -> Self {
        self.initial_bytes = bytes;
        self
    }

    /// Smallest upstream allocation when the pool grows (a larger request gets its own size).
    pub fn grow_bytes(mut self, bytes: usize) -> Self {
        self.grow_bytes = bytes;
        self
    }

    /// Most bytes the pool may take from its upstream in all (`None`: no limit).
    pub fn max_bytes(mut self, bytes: Option<usize>) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// When to record the events that order cross-stream reuse.
    pub fn event_policy(mut self, policy: EventPolicy) -> Self {
        self.event_policy = policy;
        self
    }

    /// Whether each thread keeps a small cache of the blocks it frees, per stream, and
    /// serves its next allocations of the same sizes on the same stream from it without
    /// taking any shared lock (default: on). Used only with [`EventPolicy::OnSteal`]: the
    /// other policies record on frees, which the cache would skip. See "Thread caches" in
    /// the [module docs](crate::memory).
    pub fn thread_cache(mut self, on: bool) -> Self {
        self.thread_cache = on;
        self
    }

    pub(super) fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::InvalidArgument(format!("pool options: {what}")));
        if !self.alignment.is_power_of_two() {
            return bad(format!(
                "alignment {} is not a power of two",
                self.alignment
            ));
        }
        if self.grow_bytes == 0 {
            return bad("grow_bytes is 0".to_string());
        }
        if let Some(max) = self.max_bytes {
            if self.initial_bytes > max {
                return bad(format!(
                    "initial_bytes {} is above max_bytes {max}",
                    self.initial_bytes
                ));
            }
        }
        Ok(())
    }
}
