"""`python -m phaselens.cli`: the same entry point as the `phaselens` command."""

from phaselens.cli import main

main()
