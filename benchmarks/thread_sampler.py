"""What every thread of this process is doing, sampled, for the first milliseconds of a read.

With ``FERRIO_BENCH_SAMPLE_MS=N`` set, :class:`ThreadSampler` samples every thread of the process it
runs in for N ms (about every 0.5 ms): its state and the kernel function it waits in
(``/proc/self/task/*/wchan``), and, in uninterruptible sleep, its kernel stack where readable
(root). Idle threads are left out. :meth:`ThreadSampler.dump` writes the samples to stderr as
``ferrio-sample <t> <tid> <name> <state> <wchan> [stack]`` lines, beside ferrio's own trace
(``FERRIO_TRACE``; the thread ids are the trace's), and :func:`summarise` says in a few lines
where the threads waited. A stall of the whole process shows as every worker in the same
kernel wait at once, and as a gap in the samples (the sampler itself waits too). Used by
``remote_compare.py`` and ``first_call.py``.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time

# Kernel functions a thread waits in while it has nothing to do: left out of the samples.
IDLE_WCHANS = {
    "0", "futex_wait_queue", "futex_wait", "futex_do_wait", "do_epoll_wait", "ep_poll",
    "hrtimer_nanosleep", "do_nanosleep", "pipe_read", "do_sys_poll", "do_select", "wait_woken",
}  # fmt: skip


class ThreadSampler:
    """Samples this process's threads from :meth:`start` for ``FERRIO_BENCH_SAMPLE_MS`` ms (nothing
    without it)."""

    def __init__(self) -> None:
        self.ms = float(os.environ.get("FERRIO_BENCH_SAMPLE_MS", "0") or 0)
        self.lines: list[str] = []
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        if self.ms > 0:
            self.thread = threading.Thread(target=self._run, daemon=True)
            self.thread.start()

    def _run(self) -> None:
        def read(path: str) -> str:
            try:
                with open(path) as f:
                    return f.read()
            except OSError:
                return ""

        me = threading.get_native_id()
        end = time.monotonic() + self.ms / 1e3
        while (now := time.monotonic()) < end:
            for tid in os.listdir("/proc/self/task"):
                if int(tid) == me:
                    continue
                stat = read(f"/proc/self/task/{tid}/stat")
                if not stat:
                    continue
                name = stat[stat.index("(") + 1 : stat.rindex(")")].replace(" ", "_")
                state = stat[stat.rindex(")") + 2]
                wchan = read(f"/proc/self/task/{tid}/wchan").strip() or "0"
                if state == "S" and wchan in IDLE_WCHANS:
                    continue
                stack = ""
                if state == "D":
                    frames = read(f"/proc/self/task/{tid}/stack").splitlines()
                    names = [f.split()[-1].split("+")[0] for f in frames[:12] if f.split()]
                    stack = " " + "<".join(names)
                self.lines.append(f"ferrio-sample {now:.6f} {tid} {name} {state} {wchan}{stack}")
            time.sleep(0.0005)

    def dump(self) -> None:
        """Waits for the sampling to end, then writes its lines to stderr."""
        if self.thread is not None:
            self.thread.join()
            sys.stderr.write("".join(line + "\n" for line in self.lines))


def summarise(stderr: str, t0: float) -> str:
    """The samples in `stderr`: how often each (thread name, kernel wait) was seen blocked
    (state D), the longest gap between samples (ms, when the sampler itself was held up), and
    one line per sample with a blocked thread (ms from `t0`: thread id and wait)."""
    samples: dict[float, list[tuple[str, str, str, str]]] = {}
    for line in stderr.splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[0] == "ferrio-sample":
            t = float(parts[1])
            samples.setdefault(t, []).append((parts[2], parts[3], parts[4], parts[5]))
    if not samples:
        return "  no samples (FERRIO_BENCH_SAMPLE_MS unset?)"
    times = sorted(samples)
    counts: dict[tuple[str, str], int] = {}
    for rows in samples.values():
        for _, name, state, wchan in rows:
            if state == "D":
                counts[(name, wchan)] = counts.get((name, wchan), 0) + 1
    gap = max((b - a for a, b in itertools.pairwise(times)), default=0.0)
    out = [
        f"  {len(times)} samples over {(times[-1] - times[0]) * 1e3:.1f} ms; "
        f"longest gap {gap * 1e3:.1f} ms; blocked (D): "
        + (", ".join(f"{n}/{w} x{c}" for (n, w), c in sorted(counts.items())) or "never")
    ]
    for t in times:
        blocked = [f"{tid}:{w}" for tid, _, s, w in samples[t] if s == "D"]
        if blocked:
            out.append(f"  {(t - t0) * 1e3:7.1f} ms  " + " ".join(blocked))
    return "\n".join(out)
