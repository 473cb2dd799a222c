"""`python -m mlactl`: the same as the `mlactl` command."""

from mlactl.cli import main

main()
