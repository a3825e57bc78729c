"""`python -m reef` is the `reef` command."""

from reef.cli import main

main()
