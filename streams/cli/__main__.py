"""`python -m streams.cli`: the `oracular` command."""

from streams.cli import main

raise SystemExit(main())
