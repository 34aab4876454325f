"""``python -m ferrio``: the command line, as the ``ferrio`` console script runs it."""

from ferrio._cli import main

main()
