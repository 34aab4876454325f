"""The ``ferrio`` console script: runs the command line, which is written in Rust."""

from __future__ import annotations

import signal
import sys

from ferrio import _native


def main() -> None:
    """Run ``ferrio`` with this process's arguments and exit with its status."""
    # Behave like the native binary: Ctrl-C ends the command at once instead of waiting for
    # Python to run its handler.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(_native.cli_main(sys.argv))


if __name__ == "__main__":
    main()
