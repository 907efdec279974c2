"""`python -m posttrain.cli ...`: the `posttrain` command."""

from posttrain.cli import main

main()
