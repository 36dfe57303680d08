"""What the patches were written against: faust-streaming and aiokafka's versions, checked.
The upstream methods the patches replace are kept here (`ORIGINALS`) for `unpatch` and tests.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from typing import Any, Final

FAUST_VERSION: Final = "0.15.3"


"""The faust-streaming release these patches were written against (and the only one applied)."""


AIOKAFKA_VERSION: Final = "0.14.0"


"""The aiokafka release under it (pinned with it); one patch wraps its fetcher."""


ISOLATION_LEVEL: Final = "read_committed"


"""The worker reads committed transactional records only: aborted ones never reach the agent."""


class FaustVersionError(RuntimeError):
    """Raised on import when the installed faust-streaming is not the one patched here.

    Install faust-streaming 0.15.3 (the version pinned in pyproject.toml), or re-check each
    patched method in this module against the new version's source and update FAUST_VERSION.
    """


ORIGINALS: Final[dict[tuple[type, str], Callable[..., Any]]] = {}


"""(class, method name) -> the upstream method, kept for the tests and for `unpatch`."""


def installed_version() -> str:
    """The installed faust-streaming distribution's version."""
    return importlib.metadata.version("faust-streaming")


def check_version(version: str | None = None, aiokafka: str | None = None) -> None:
    """Raise FaustVersionError unless `version` (default: the installed one) is FAUST_VERSION
    and aiokafka's (default: the installed one) is AIOKAFKA_VERSION."""
    found = installed_version() if version is None else version
    found_aiokafka = importlib.metadata.version("aiokafka") if aiokafka is None else aiokafka
    if found_aiokafka != AIOKAFKA_VERSION:
        msg = (
            f"streams.faust.patches: aiokafka {found_aiokafka} is installed, but the fetch "
            f"patch was written for aiokafka {AIOKAFKA_VERSION}; install "
            f"aiokafka=={AIOKAFKA_VERSION}, or re-check the patched Fetcher method"
        )
        raise FaustVersionError(msg)
    if found != FAUST_VERSION:
        msg = (
            f"streams.faust.patches: faust-streaming {found} is installed, but these patches "
            f"were written for faust-streaming {FAUST_VERSION} (they replace methods of its "
            "consumer, recovery and producer buffer); install "
            f"faust-streaming=={FAUST_VERSION}, or re-check each patched method against the "
            "new source and update FAUST_VERSION"
        )
        raise FaustVersionError(msg)
