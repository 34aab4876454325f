"""The ``ferrio`` console script: runs the command line, which is written in Rust."""

from __future__ import annotations

import sys

from ferrio import _native


def main() -> None:
    """Run ``ferrio`` with this process's arguments and exit with its status."""
    # The command line installs its own Ctrl-C handler: it stops cleanly and exits with 130.
    # It is `ferrio` in its messages however it was started (console script, python -m).
    sys.exit(_native.cli_main(["ferrio", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
