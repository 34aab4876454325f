"""A model of the end of a remote read: where a free GET should cut a slow one (``share.rs``).

Simulates one read in 1 ms steps: 64 GETs take even ranges of the object, each waits for its
reply (the first-byte delay, +-20%), then receives its body at a max-min fair share of the link,
capped per connection; each connection is weighted 1 +- a spread, in its share and in its cap,
so some run faster than others. Once no range is left, a free GET takes over the end of the
range in flight with the most time left at its rate so far (where that is more than twice the
mean reply wait and at least 2 MiB), as ``share.rs`` does, cut either at the middle (what
ferrio does) or where both GETs would end together after the new one's wait (session 21's trial,
not kept). Prints the rate of each cut for a few links (medians of five seeds) and how many
ranges were cut. A model, not a measurement: it leaves out what a dropped body costs the server
and the link.

    python3 benchmarks/steal_model.py
"""

from __future__ import annotations

import random
import statistics

MIB = 1 << 20
GIB = 1 << 30
STEP = 0.001


def read_time(link: float, cap: float, delay: float, cut: str, size: int, gets: int,
              spread: float, seed: int) -> tuple[float, int]:  # fmt: skip
    """Seconds the read takes and how many ranges were cut."""
    rng = random.Random(seed)
    planned = [(i * size // gets, (i + 1) * size // gets) for i in range(gets)][::-1]
    gs = [{"state": "free", "w": 1 + spread * (2 * rng.random() - 1)} for _ in range(gets)]
    waited, replies, cuts, t = 0.0, 0, 0, 0.0

    def take() -> tuple[int, int] | str | None:
        nonlocal cuts
        if planned:
            return planned.pop()
        wait = waited / replies if replies else 0.0
        best = None
        for g in gs:
            if g["state"] != "body" or g["end"] - g["at"] < 2 * MIB or g["at"] <= g["from"]:
                continue
            left = (t - g["began"]) * (g["end"] - g["at"]) / (g["at"] - g["from"])
            if left > 2 * wait and (best is None or left > best[0]):
                best = (left, g)
        if best is None:
            running = any(g["state"] in ("body", "wait") and g["end"] - g["at"] >= 2 * MIB
                          for g in gs)  # fmt: skip
            return "later" if running else None
        left, g = best
        n = g["end"] - g["at"]
        keep = n / 2 if cut == "middle" else n * (left + wait) / (2 * left)
        at = g["at"] + int(keep) // (64 << 10) * (64 << 10)
        if not g["at"] < at < g["end"]:
            return "later"
        part, g["end"] = (at, g["end"]), at
        cuts += 1
        return part

    while True:
        for g in gs:
            if g["state"] == "free" or (g["state"] == "later" and t >= g["until"]):
                r = take()
                if r is None:
                    g["state"] = "done"
                elif r == "later":
                    g.update(state="later", until=t + 0.010)
                else:
                    reply = t + delay * (0.8 + 0.4 * rng.random())
                    g.update(state="wait", at=r[0], end=r[1], reply=reply, asked=t)
            if g["state"] == "wait" and t >= g["reply"]:
                waited, replies = waited + t - g["asked"], replies + 1
                g.update(state="body", began=t, **{"from": g["at"]})
        active = [g for g in gs if g["state"] == "body"]
        if not active and all(g["state"] == "done" for g in gs):
            return t, cuts
        budget, rest, share = link * STEP, list(active), {}
        while rest:
            each = budget / sum(g["w"] for g in rest)
            full = [g for g in rest if each >= cap * STEP]
            if not full:
                share.update({id(g): each * g["w"] for g in rest})
                break
            for g in full:
                share[id(g)] = cap * g["w"] * STEP
                budget -= cap * g["w"] * STEP
                rest.remove(g)
        for g in active:
            g["at"] = min(g["end"], g["at"] + share[id(g)])
            if g["at"] >= g["end"]:
                g["state"] = "free"
        t += STEP


def main() -> None:
    cases = [
        ("dev VM, 2 GiB, +50 ms", 3.5 * GIB, 100e6, 0.05, 2 * GIB, 0.5),
        ("dev VM, 2 GiB, no delay", 3.5 * GIB, 100e6, 0.0, 2 * GIB, 0.5),
        ("16-core machine, 2 GiB, +50 ms", 12 * GIB, 100e6, 0.05, 2 * GIB, 0.2),
        ("an S3-like store, 8 GiB, +30 ms", 12 * GIB, 90e6, 0.03, 8 * GIB, 0.3),
    ]
    print("| link | cut at the middle | cut to end together |")
    print("|---|---|---|")
    for name, link, cap, delay, size, spread in cases:
        row = []
        for cut in ("middle", "together"):
            runs = [read_time(link, cap, delay, cut, size, 64, spread, s) for s in range(5)]
            secs = statistics.median(r[0] for r in runs)
            cuts = statistics.median(r[1] for r in runs)
            row.append(f"{size / GIB / secs:.3f} GiB/s ({cuts} cuts)")
        print(f"| {name} | {row[0]} | {row[1]} |")


if __name__ == "__main__":
    main()
