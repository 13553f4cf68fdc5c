"""`python -m corral` is the `corral` CLI."""

from corral.cli import main

main()
