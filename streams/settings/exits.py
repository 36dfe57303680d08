"""The exit codes every command and the worker share (docs/tools.md "Exit codes").

Written once here: the command line, the worker and the lookup API's client all exit with these.
"""

from typing import Final

EXIT_USAGE: Final = 2
"""Bad flags, settings, config or input file (docs/tools.md "Exit codes")."""
EXIT_UNAVAILABLE: Final = 69  # sysexits EX_UNAVAILABLE: the broker is not there or refused
"""The broker (or a worker's API) is not there, refused, or a topic is missing."""
EXIT_REFUSED: Final = 1
"""Refused (a consumer group with active members, the default prefix without --yes), or a
backfill interrupted before its end."""
EXIT_NOTHING: Final = 1
"""The id or prefix given matches nothing (`reset`, `topics delete`): probably a typo."""
