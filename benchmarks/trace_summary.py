"""What ferrio's opt-in timeline (``FERRIO_TRACE=1``) says about one read.

The trace is written to standard error at exit, one line per event
(``ferrio-trace <start s> <duration ms> <thread> <what> <amount>``, ``bounce/trace.rs``).
Given the read's span on ``CLOCK_MONOTONIC``, this prints one line per kind of event inside it
(count, total and longest time, when the first started and the last ended, in ms from the
read's start) under a head line that says where the read's time went: for a remote read into
GPU memory, how long its GETs waited for their first byte, for pinned pieces and for the
copies. ``remote_compare.py --trace-dir`` calls it for every traced run.

    python3 benchmarks/trace_summary.py STDERR_FILE BEGIN END
"""

from __future__ import annotations

import sys

Event = tuple[float, float, int, str, int]


def parse(stderr: str) -> list[Event]:
    """The trace's events: (start s, duration ms, thread, what, amount)."""
    events = []
    for line in stderr.splitlines():
        parts = line.split()
        if len(parts) == 6 and parts[0] == "ferrio-trace":
            events.append(
                (float(parts[1]), float(parts[2]), int(parts[3]), parts[4], int(parts[5]))
            )
    return events


def summarise(events: list[Event], span: list[float]) -> str:
    """A head line and one line per kind of event that started inside `span`."""
    t0, t1 = span
    inside = [e for e in events if t0 - 1e-3 <= e[0] <= t1]
    ms = lambda t: (t - t0) * 1e3  # noqa: E731
    kinds: dict[str, list[Event]] = {}
    for e in inside:
        kinds.setdefault(e[3], []).append(e)
    lines = []
    for what, es in sorted(kinds.items()):
        durations = sorted(e[1] for e in es)
        lines.append(
            f"  {what:<10} n={len(es):<5} total={sum(durations):9.1f} ms "
            f"p50={durations[len(durations) // 2]:7.2f} max={durations[-1]:7.2f} ms "
            f"first={ms(min(e[0] for e in es)):7.1f} "
            f"last_end={ms(max(e[0] + e[1] / 1e3 for e in es)):7.1f} ms "
            f"amount={sum(e[4] for e in es)}"
        )

    def total(what: str) -> float:
        return sum(e[1] for e in kinds.get(what, []))

    # GETs whose first request went out more than 5 ms after the read's first one (of as many
    # as the read had at once, the first `answer` of each).
    answers = sorted(e[0] for e in kinds.get("answer", []))
    late = sum(1 for t in answers[:64] if answers and (t - answers[0]) * 1e3 > 5)
    slow_tasks = sum(1 for e in kinds.get("get-task", []) if e[1] > 5)
    bodies = kinds.get("body", [])
    last_body = max((e[0] + e[1] / 1e3 for e in bodies), default=t0)
    pins = kinds.get("pin", [])
    head = (
        f"read {ms(t1):.0f} ms; GETs {len(kinds.get('answer', []))} ({late} of the first 64 "
        f"asked > 5 ms late; {slow_tasks} tasks first ran > 5 ms after their spawn; permit "
        f"waits {total('permit'):.0f} ms), first byte mean "
        f"{total('answer') / max(1, len(kinds.get('answer', []))):.1f} ms; last body ends at "
        f"{ms(last_body):.0f} ms; pins {len(pins)} ({total('pin'):.0f} ms, last ends "
        f"{ms(max((e[0] + e[1] / 1e3 for e in pins), default=t0)):.0f} ms); piece waits "
        f"{total('piece'):.0f} ms; hand-over waits {total('hand-over'):.0f} ms; copy thread "
        f"idle {total('copy-idle'):.0f} / waiting {total('copy-wait'):.0f} ms"
    )
    return "\n".join([head, *lines])


def main() -> None:
    path, begin, end = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    with open(path) as f:
        print(summarise(parse(f.read()), [begin, end]))


if __name__ == "__main__":
    main()
