"""A worker's datadir (ORACULAR_DATADIR): private, and tied to the app it holds.

The datadir holds every user's state (RocksDB) in plain bytes, and each state records the
input offsets it applied, which mean something only for the app's own changelog and input
topic. So `prepare` (called by `streams.runtime.app.create_runtime` before Faust opens anything):

- creates it 0700 (and closes an existing one to 0700): no other local user can list or read
  the RocksDB files, whatever their own modes;
- writes `MARKER` in it, `{"app_id": ..., "events_topic": ...}`, the first time;
- refuses a datadir whose marker names another app id or another input topic, in one line
  (`DatadirError`): starting app `a` on app `b`'s datadir mixed the two apps' states;
- takes an exclusive lock (`flock` on `LOCK`), held until the process exits, and refuses a
  datadir another process holds (`DatadirInUse`): two workers on one datadir both opened
  RocksDB copies of the same partitions, and crashed on RocksDB's own lock once one of them
  froze. The kernel drops the lock when the process dies, however it dies.

`oracular reset` deletes the datadir, the marker with it, and refuses one that another app's
marker claims (`check_owner`).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import stat
from pathlib import Path
from typing import Final

log = logging.getLogger("oracular.worker")

MARKER: Final = "oracular-datadir.json"
"""The file in a datadir naming the app (and input topic) its state belongs to."""
MODE: Final = 0o700
LOCK: Final = "oracular-datadir.lock"
"""The file in a datadir its worker holds an exclusive `flock` on."""

_held: dict[Path, int] = {}
"""Datadir -> the descriptor of its lock, for the datadirs this process holds."""


class DatadirError(Exception):
    """The datadir cannot be used by this app; the message is one line saying what to do."""


class DatadirInUse(DatadirError):
    """Another process (a worker, a backfill) holds the datadir's lock."""


def lock(datadir: Path) -> None:
    """Hold `datadir`'s lock until this process exits (again: nothing to do).

    Raises:
        DatadirInUse: another process holds it.
    """
    key = datadir.resolve()
    if key in _held:
        return
    fd = os.open(datadir / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        msg = (
            f"the datadir {datadir} is in use by another worker (it holds {LOCK}): give each "
            "worker its own ORACULAR_DATADIR (--datadir), or stop the other one first"
        )
        raise DatadirInUse(msg) from None
    _held[key] = fd


def in_use(datadir: Path) -> bool:
    """True when another process holds `datadir`'s lock (`oracular reset` refuses then)."""
    if datadir.resolve() in _held or not (datadir / LOCK).exists():
        return False
    fd = os.open(datadir / LOCK, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the lock taken here
    return False


def read_owner(datadir: Path) -> dict[str, str] | None:
    """The marker's contents (None: no marker). DatadirError when it cannot be read."""
    marker = datadir / MARKER
    try:
        owner = json.loads(marker.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        msg = f"the datadir's marker {marker} cannot be read ({exc}); fix or remove it"
        raise DatadirError(msg) from exc
    if not isinstance(owner, dict) or not isinstance(owner.get("app_id"), str):
        msg = f"the datadir's marker {marker} names no app id; fix or remove it"
        raise DatadirError(msg)
    return {str(k): str(v) for k, v in owner.items()}


def check_owner(datadir: Path, app_id: str, events_topic: str | None = None) -> None:
    """DatadirError unless `datadir` is unmarked or marked for `app_id` (and, when given,
    `events_topic`)."""
    owner = read_owner(datadir)
    if owner is None:
        return
    theirs = (owner["app_id"], owner.get("events_topic"))
    if theirs[0] != app_id or (events_topic is not None and theirs[1] != events_topic):
        msg = (
            f"the datadir {datadir} holds the state of app {theirs[0]!r} (input topic "
            f"{theirs[1]!r}), not of app {app_id!r} (input topic {events_topic!r}): give each "
            f"app its own ORACULAR_DATADIR (or `oracular reset {theirs[0]}` to delete that state)"
        )
        raise DatadirError(msg)


def prepare(datadir: Path, app_id: str, events_topic: str) -> None:
    """Create `datadir` 0700 (or make it 0700), lock it, check and write its marker.

    Raises:
        DatadirInUse: another process holds it.
        DatadirError: another app's datadir, or one that cannot be made private.
    """
    check_owner(datadir, app_id, events_topic)
    try:
        datadir.mkdir(mode=MODE, parents=True, exist_ok=True)
        lock(datadir)
        if stat.S_IMODE(datadir.stat().st_mode) != MODE:
            os.chmod(datadir, MODE)
        marker = datadir / MARKER
        if not marker.exists():
            if any(p.name not in (MARKER, LOCK) for p in datadir.iterdir()):
                log.warning(
                    "datadir %s had no marker: taken as app %r's (written now)", datadir, app_id
                )
            text = json.dumps({"app_id": app_id, "events_topic": events_topic}) + "\n"
            marker.write_text(text, encoding="utf-8")
            os.chmod(marker, 0o600)
    except OSError as exc:
        msg = f"cannot prepare the datadir {datadir}: {exc.strerror or exc}"
        raise DatadirError(msg) from exc
