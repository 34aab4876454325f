//! A progress bar on stderr for work that takes more than about a second, shown only when
//! stderr is a terminal and the output is not JSON.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// A bar that appears after a second of work.
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
    start: Instant,
    total: u64,
    label: String,
    enabled: bool,
}

impl Progress {
    /// A bar for `total` bytes; `quiet` (JSON output) hides it.
    pub(crate) fn new(label: &str, total: u64, quiet: bool) -> Progress {
        Progress {
            bar: None,
            start: Instant::now(),
            total,
            label: label.to_string(),
            enabled: !quiet && std::io::stderr().is_terminal(),
        }
    }

    /// Changes the total, for work whose size is known only once it has started.
    pub(crate) fn set_total(&mut self, total: u64) {
        self.total = total;
        if let Some(bar) = &self.bar {
            bar.set_length(total);
        }
    }

    /// Changes the text before the bar (a file count, say).
    pub(crate) fn set_label(&mut self, label: String) {
        if let Some(bar) = &self.bar {
            bar.set_message(label.clone());
        }
        self.label = label;
    }

    /// Reports `done` bytes so far.
    pub(crate) fn set(&mut self, done: u64) {
        if !self.enabled {
            return;
        }
        if self.bar.is_none() && self.start.elapsed() > Duration::from_secs(1) {
            let bar = ProgressBar::new(self.total);
            let style = ProgressStyle::with_template(
                "{msg} [{bar:30}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}",
            )
            .map(|s| s.progress_chars("=> "));
            if let Ok(style) = style {
                bar.set_style(style);
            }
            bar.set_message(self.label.clone());
            self.bar = Some(bar);
        }
        if let Some(bar) = &self.bar {
            bar.set_position(done);
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}
