"""``python -m timerlc``: the command line."""

from timerlc.cli import main

main()
