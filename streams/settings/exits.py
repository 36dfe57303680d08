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
EXIT_SOFTWARE: Final = 70  # sysexits EX_SOFTWARE
"""The worker stopped on an exception nobody expected (a bug): restart it (nothing
unacknowledged is lost) and report the log's last lines."""
EXIT_DATADIR_IN_USE: Final = 73  # sysexits EX_CANTCREAT
"""Another worker holds the datadir (its lock): give each worker its own ORACULAR_DATADIR."""
EXIT_STORAGE: Final = 74  # sysexits EX_IOERR
"""The local store could not be written or read (disk full, an I/O error): free space or fix
the disk, then restart; the state is restored from the changelog where it is not kept."""
EXIT_RESTART: Final = 75  # sysexits EX_TEMPFAIL
"""The worker stopped to recover, and a restart does: a partition's local copy was found
corrupt and set aside (the restart restores it from the changelog), or the worker was frozen
while writing and fenced itself (streams/runtime/fencing.py)."""
EXIT_STOP_TIMEOUT: Final = 124  # as timeout(1) exits
"""A stop (SIGTERM, Ctrl-C) took longer than ORACULAR_SHUTDOWN_TIMEOUT_S: the worker exited
with nothing more acknowledged; the next owner applies the rest again."""
