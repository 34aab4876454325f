"""What growing the descriptor table costs a process of several threads, and what ferrio's
reservation on import saves (RESULTS.md, "Object storage", session 17).

A second thread is parked (as a GPU library's or the remote runtime's would be), then 300
sockets are opened one by one; the slowest two are printed with their descriptor numbers. The
socket whose descriptor needs a larger table waits for an RCU grace period. With ``--ferrio``
ferrio is imported first, which grows the table while the process still has one thread.

    python3 benchmarks/fd_growth.py [--ferrio]
"""

from __future__ import annotations

import socket
import sys
import threading
import time


def main() -> None:
    if "--ferrio" in sys.argv:
        import ferrio  # noqa: F401  (grows the table on import)
    parked = threading.Event()
    other = threading.Thread(target=parked.wait)
    other.start()
    socks, times = [], []
    try:
        for _ in range(300):
            t0 = time.perf_counter()
            s = socket.socket()
            times.append(((time.perf_counter() - t0) * 1e3, s.fileno()))
            socks.append(s)
    finally:
        parked.set()
        for s in socks:
            s.close()
    slowest = ", ".join(f"{ms:.2f} ms (descriptor {fd})" for ms, fd in sorted(times)[-2:])
    print(f"{'with' if '--ferrio' in sys.argv else 'without'} ferrio: slowest socket() {slowest}")


if __name__ == "__main__":
    main()
