"""`oracular reset APP_ID`: forget an app id, like Kafka Streams' application reset tool.

Deletes the app id's internal topics (its state changelog and Faust's internal topics, all
named `<app id>-...`), its consumer group (and so its committed offsets) and its local state
directory, the marker naming the app (streams/runtime/datadir.py) with it; a datadir whose marker
names another app is refused. Refuses while the group has active members: stop the workers first.
The input and output topics are not touched.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import GroupCoordinatorNotAvailableError
from aiokafka.protocol.admin import DeleteGroupsRequest

from streams.runtime.datadir import DatadirError, check_owner, in_use
from streams.tools.admin import BrokerError, quiet_aiokafka

GROUP_ID_NOT_FOUND = 69  # Kafka error codes
GROUP_NOT_EMPTY = 68


@dataclass
class ResetPlan:
    """What a reset deletes."""

    app_id: str
    topics: list[str] = field(default_factory=list)
    group: str | None = None
    """The consumer group, if the broker knows it."""
    members: int = 0
    """Active members of the group: a reset refuses while there are any."""
    datadir: Path | None = None
    """The local state directory, if it exists."""
    datadir_in_use: bool = False
    """A worker on this host holds the datadir's lock: a reset refuses then."""
    looked_at: Path | None = None
    """Where the local state was looked for."""

    def describe(self) -> str:
        """What will be (or would be) deleted, one line each."""
        lines = [f"reset {self.app_id}:"]
        lines += [f"  topic          {name}" for name in self.topics] or ["  topics         none"]
        lines.append(f"  consumer group {self.group or 'none (never committed)'}")
        if self.datadir is not None:
            lines.append(f"  local state    {self.datadir}")
        else:
            lines.append(
                f"  local state    none at {self.looked_at} (the worker's is under the directory "
                "it ran in: run reset there, or pass --datadir)"
            )
        return "\n".join(lines)


async def plan_reset(
    bootstrap: str, app_id: str, datadir: Path, client: Mapping[str, Any] | None = None
) -> ResetPlan:
    """Find what belongs to `app_id` on the broker and on disk."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **(client or {}))
    try:
        with quiet_aiokafka():
            await admin.start()
        topics = sorted(t for t in await admin.list_topics() if t.startswith(f"{app_id}-"))
        described = await _describe_group(admin, app_id)
    except Exception as exc:
        msg = f"could not inspect app id {app_id!r} on {bootstrap}: {exc!r}. Is the broker up?"
        raise BrokerError(msg) from exc
    finally:
        await admin.close()
    group = described.groups[0]
    error_code, state, members = group[0], group[2], group[5]
    known = error_code == 0 and state not in ("Dead", "")
    if datadir.exists():
        try:
            check_owner(datadir, app_id)  # never another app's state
        except DatadirError as exc:
            raise BrokerError(str(exc)) from exc
    return ResetPlan(
        app_id,
        topics,
        app_id if known else None,
        len(members) if known else 0,
        datadir if datadir.exists() else None,
        datadir.exists() and in_use(datadir),  # a worker runs on it, in whatever group
        datadir,
    )


COORDINATOR_WAIT_S = 20.0
"""A fresh broker creates its offsets topic on the first group request: wait for it."""


async def _describe_group(admin: Any, group: str) -> Any:
    deadline = time.monotonic() + COORDINATOR_WAIT_S
    while True:
        try:
            [described] = await admin.describe_consumer_groups([group])
        except GroupCoordinatorNotAvailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
        else:
            return described


async def execute_reset(
    bootstrap: str, plan: ResetPlan, client: Mapping[str, Any] | None = None
) -> None:
    """Delete what `plan` lists. Raises BrokerError if the group has active members."""
    if plan.datadir_in_use:
        msg = f"the datadir {plan.datadir} is in use by a running worker: stop it first"
        raise BrokerError(msg)
    if plan.members:
        msg = (
            f"the consumer group {plan.app_id!r} has {plan.members} active member(s): stop "
            "its workers first (a reset under running workers would be undone by them)"
        )
        raise BrokerError(msg)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **(client or {}))
    try:
        with quiet_aiokafka():
            await admin.start()
        if plan.group is not None:
            coordinator = await admin.find_coordinator(plan.group)
            # aiokafka's admin client has no delete_consumer_groups; the request is public.
            response = await admin._send_request(DeleteGroupsRequest([plan.group]), coordinator)
            for group, code in response.results:
                if code == GROUP_NOT_EMPTY:
                    msg = f"the consumer group {group!r} became active again: stop its workers"
                    raise BrokerError(msg)
                if code not in (0, GROUP_ID_NOT_FOUND):
                    msg = f"Kafka refused to delete consumer group {group!r}: error {code}"
                    raise BrokerError(msg)
        if plan.topics:
            await admin.delete_topics(plan.topics)
    except BrokerError:
        raise
    except Exception as exc:
        msg = f"reset of {plan.app_id!r} failed on {bootstrap}: {exc!r}"
        raise BrokerError(msg) from exc
    finally:
        await admin.close()
    if plan.datadir is not None:
        shutil.rmtree(plan.datadir)
