"""`python -m mlactl.cli`: the same as the `mlactl` command."""

from mlactl.cli import main

main()
