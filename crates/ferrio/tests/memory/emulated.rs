//! The conformance suite on emulated streams over host memory: the emulator runs a stream only
//! when told and reports every launch that touches bytes another stream's earlier, unfinished
//! launch touches (a hazard).

use std::sync::Arc;

use ferrio::memory::{
    Block, EmulatedStream, EmulatedStreams, HostUpstream, PoolOptions, PoolResource,
};

use super::{Backend, PoolOf};

struct Emulated {
    emu: EmulatedStreams,
}

impl Backend for Emulated {
    type Up = HostUpstream;
    type Order = EmulatedStreams;
    type Gate = ();

    fn pool(&self, options: PoolOptions) -> PoolOf<Self> {
        PoolResource::new(HostUpstream, self.emu.clone(), options).expect("pool")
    }
    fn stream(&self) -> EmulatedStream {
        self.emu.create_stream()
    }
    /// Emulated streams run only in `progress` and `finish`, so every stream is held anyway.
    fn hold(&self, _stream: &EmulatedStream) {}
    fn write(&self, stream: &EmulatedStream, block: Block, _tag: u32) {
        self.emu.launch(stream, block.addr(), block.size());
    }
    fn read_expect(&self, stream: &EmulatedStream, block: Block, _tag: u32) {
        self.emu.launch(stream, block.addr(), block.size());
    }
    fn progress(&self, stream: &EmulatedStream) {
        self.emu.advance(stream, 2);
    }
    /// Runs the given streams last to first (so a later stream that was not made to wait runs
    /// into an earlier one's pending work), then everything.
    fn finish(&self, streams: &[EmulatedStream]) -> Vec<String> {
        for s in streams.iter().rev() {
            self.emu.advance(s, usize::MAX);
        }
        let mut failures = self.emu.hazards();
        if !self.emu.run_until_idle() {
            failures.push("a wait was never satisfied".to_string());
        }
        failures.extend(self.emu.hazards());
        failures.dedup();
        failures
    }
    fn first_word(&self, _block: Block) -> Option<u32> {
        None
    }
}

fn emulated() -> Arc<Emulated> {
    Arc::new(Emulated {
        emu: EmulatedStreams::new(),
    })
}

#[test]
fn emulated_same_stream_reuse_is_immediate() {
    super::same_stream_reuse_is_immediate(emulated().as_ref());
}

#[test]
fn emulated_handoff_waits_for_pending_work() {
    super::handoff_waits_for_pending_work(emulated().as_ref());
}

#[test]
fn emulated_handoff_after_completion_needs_no_wait() {
    super::handoff_after_completion_needs_no_wait(emulated().as_ref());
}

#[test]
fn emulated_detached_stream_lends_its_blocks() {
    super::detached_stream_lends_its_blocks(emulated().as_ref());
}

#[test]
fn emulated_out_of_memory_is_reported_and_recovered() {
    super::out_of_memory_is_reported_and_recovered(emulated().as_ref(), "host");
}

#[test]
fn emulated_threads_that_miss_together_grow_once() {
    super::threads_that_miss_together_grow_once(&emulated());
}

#[test]
fn emulated_threads_that_miss_together_grow_once_stress() {
    super::threads_that_miss_together_grow_once_stress(&emulated(), 200);
}

#[test]
fn emulated_kernels_on_many_streams_never_wait_prewarmed() {
    super::kernels_on_many_streams_never_wait(&emulated(), true);
}

#[test]
fn emulated_kernels_on_many_streams_never_wait_cold() {
    super::kernels_on_many_streams_never_wait(&emulated(), false);
}

#[test]
fn emulated_stress() {
    for cfg in super::STRESS {
        super::stress(&emulated(), cfg);
    }
}
