"""The settings the patches read, as one typed object configured on the Faust app.
`streams.runtime.app` configures it from the worker's settings; an unconfigured app is Faust's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final


@dataclass(frozen=True)
class ConsumerSettings:
    """How the patched consumer of one Faust app fetches and where it runs."""

    fetch_max_wait_ms: int | None = None
    """The broker holds a fetch of the input at most this long (None: Faust's wait)."""
    on_worker_loop: bool = False
    """The consumer runs on the worker's event loop, not in Faust's consumer thread."""
    quiet_topics: frozenset[str] = field(default_factory=frozenset)
    """Topics whose records alone do not keep the consumer's fetches short (the ticks)."""


UNCONFIGURED: Final = ConsumerSettings()
"""What the patches do for an app nobody configured: what Faust does."""


def configure(app: Any, settings: ConsumerSettings) -> None:
    """Give the patches of `app`'s consumer `settings` (before the app starts)."""
    app._oracular_consumer = settings


def consumer_settings(app: Any) -> ConsumerSettings:
    """The settings `configure` gave `app`, or `UNCONFIGURED`."""
    found = getattr(app, "_oracular_consumer", UNCONFIGURED)
    return found if isinstance(found, ConsumerSettings) else UNCONFIGURED
