"""Input is never applied on state that was not restored: every owned input partition needs its
changelog partition active here.

Faust's assignor leaves a topic it does not find in its metadata out of the assignment
("Ignoring missing topic"). When that is the state table's changelog, the worker is given input
partitions without their changelog partitions: nothing is restored, and every user of those
partitions reads as new (a failover chaos run lost 1,259 users' inputs so). The check runs after
each recovery, before any input applies: a changelog partition left out while its topic holds
records stops the worker (exit 75; the restart's assignment restores it). Left out while the
topic is empty or not there yet (a new deployment whose workers start together) there is
nothing to restore, and the worker goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable

log = logging.getLogger("oracular.worker")


class StateNotRestored(Exception):
    """Input partitions were assigned without their changelog partitions, which hold state."""


async def check_restored(
    owned: Iterable[int],
    active: Iterable[int],
    end_offsets: Callable[[list[int]], Awaitable[dict[int, int]]],
    changelog: str,
) -> None:
    """Raise StateNotRestored when an `owned` input partition's changelog partition is not
    `active` here and holds records (`end_offsets` of those partitions: {} for no topic)."""
    missing = sorted(set(owned) - set(active))
    if not missing:
        return
    ends = await end_offsets(missing)
    holding = [p for p in missing if ends.get(p, 0) > 0]
    if holding:
        msg = (
            f"input partitions {holding} were assigned without their changelog partitions of "
            f"{changelog} (not in the assignor's metadata), which hold state: nothing of them "
            "was restored"
        )
        raise StateNotRestored(msg)
    log.info(
        "input partitions %s were assigned without their changelog partitions, which hold "
        "nothing yet (a new deployment): going on",
        missing,
    )
