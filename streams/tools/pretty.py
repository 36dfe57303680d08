"""`oracular tail --pretty`: output messages as readable lines, and a tally of what was shown.

Pure functions of a decoded message (docs/messages.md), so any run's outputs read the same:
a prediction, a closed episode or a dead letter is recognised by its fields, whatever the
topic's name (a prefix, a backfill's suffix):

    2026-01-07T12:20:02Z  user-00116  pricing.viewed          upgrade p=0.466
    2026-01-07T12:21:17Z  user-00116  limit.hit               upgrade p=0.604 REVEAL
    2026-01-07T12:51:17Z  user-00116  episode closed (timeout) after 37m42s: upgrade held; ...
    dead letter from oracular.events partition 3 offset 17, key 'u1': the reason
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

ORDER_WINDOW_S = 2.0
"""`oracular tail --order-window` default (`streams.tools.kafkatools.EventTimeOrder`); here, in a
module without aiokafka, so that the command line's help needs none."""

USER_WIDTH = 10
EVENT_WIDTH = 22


def kind(message: Mapping[str, Any]) -> str:
    """`prediction`, `episode`, `dead letter` or `unknown`, from the message's fields."""
    if "error" in message and "value" in message:
        return "dead letter"
    if "closed_at" in message and "started_at" in message:
        return "episode"
    if "intents" in message and "at" in message:
        return "prediction"
    return "unknown"


def iso(ms: Any) -> str:
    """Epoch milliseconds as ISO-8601 UTC to the second (`2026-01-05T09:04:52Z`)."""
    if not isinstance(ms, int) or isinstance(ms, bool):
        return str(ms)
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return str(ms)


def duration(ms: int) -> str:
    """A span as `45s`, `31m18s`, `2h05m` or `3d04h`."""
    seconds = max(ms, 0) // 1000
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def format_message(message: Mapping[str, Any], topic: str | None = None) -> str:
    """One readable line for an output message (`topic` is shown only when the message is
    not one of the product's outputs)."""
    what = kind(message)
    if what == "prediction":
        return _prediction(message)
    if what == "episode":
        return _episode(message)
    if what == "dead letter":
        return _dead_letter(message)
    where = f" on {topic}" if topic else ""
    if "undecodable" in message:
        return f"undecodable message{where}: {message['undecodable']!r}"
    return f"unknown message{where}: {dict(message)!r}"


def _prediction(message: Mapping[str, Any]) -> str:
    kind_of_input = message.get("type", "event")
    if kind_of_input == "revealed":
        what = f"revealed {message.get('event')}"
    elif kind_of_input == "end":
        what = "sign-out"
    elif kind_of_input == "erased":
        what = f"ERASED by {message.get('event')}"
    else:
        what = str(message.get("event"))
    parts = []
    for intent, fields in message.get("intents", {}).items():
        text = f"{intent} p={_p(fields.get('p'))}"
        if fields.get("reveal"):
            text += " REVEAL"
        before = fields.get("before_outcome")
        if isinstance(before, Mapping):
            text += f" OUTCOME (p was {_p(before.get('p'))} before it)"
        until = fields.get("suppressed_until")
        if until is not None:
            text += f" (cooldown until {iso(until)})"
        parts.append(text)
    return (
        f"{iso(message.get('at'))}  {message.get('user')!s:<{USER_WIDTH}}  "
        f"{what:<{EVENT_WIDTH}}  {'  '.join(parts)}"
    ).rstrip()


def _p(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, int | float) else str(value)


def _episode(message: Mapping[str, Any]) -> str:
    started, closed = message.get("started_at"), message.get("closed_at")
    span = ""
    if isinstance(started, int) and isinstance(closed, int):
        span = f" after {duration(closed - started)}"
    verdicts = []
    for intent, fields in message.get("intents", {}).items():
        signals = fields.get("signals") or []
        shown = f" [{', '.join(map(str, signals))}]" if signals else ""
        verdicts.append(f"{intent} {fields.get('verdict')}{shown}")
    head = (
        f"{iso(closed)}  {message.get('user')!s:<{USER_WIDTH}}  "
        f"episode closed ({message.get('reason')}){span}"
    )
    return f"{head}: {'; '.join(verdicts)}" if verdicts else head


def _dead_letter(message: Mapping[str, Any]) -> str:
    source = message.get("source_topic", message.get("topic"))
    key = message.get("key")
    if isinstance(key, bytes):
        key = key.decode("utf-8", errors="replace")
    cut = " (truncated)" if message.get("truncated") else ""
    return (
        f"dead letter from {source} partition {message.get('partition')} offset "
        f"{message.get('offset')}, key {key!r}{cut}: {message.get('error')}"
    )


CLOSE_REASONS = {"timeout": "timed out", "end": "ended by sign-out"}
"""An episode close's `reason` in words: idle for the episode timeout (found by the timer or by
the user's next event, whichever came first), or an `end` event (a sign-out)."""


class Tally:
    """Counts of the messages shown: predictions (and reveals per intent), episodes, dead
    letters, others."""

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.reveals: Counter[str] = Counter()
        self.closes: Counter[str] = Counter()

    def add(self, message: Mapping[str, Any]) -> None:
        what = kind(message)
        self.kinds[what] += 1
        if what == "prediction":
            for intent, fields in message.get("intents", {}).items():
                if isinstance(fields, Mapping) and fields.get("reveal"):
                    self.reveals[intent] += 1
        elif what == "episode":
            self.closes[str(message.get("reason"))] += 1

    def summary(self) -> str:
        """`1,534 predictions (141 reveals: upgrade 86, ...), 573 episodes closed (573 timed
        out), 0 dead letters`."""
        predictions = plural(self.kinds["prediction"], "prediction")
        if self.reveals:
            each = ", ".join(f"{name} {n:,}" for name, n in sorted(self.reveals.items()))
            predictions += f" ({plural(sum(self.reveals.values()), 'reveal')}: {each})"
        else:
            predictions += " (no reveals)"
        episodes = plural(self.kinds["episode"], "episode") + " closed"
        if self.closes:
            reasons = (f"{n:,} {CLOSE_REASONS.get(r, r)}" for r, n in sorted(self.closes.items()))
            episodes += f" ({', '.join(reasons)})"
        parts = [predictions, episodes, plural(self.kinds["dead letter"], "dead letter")]
        if self.kinds["unknown"]:
            parts.append(plural(self.kinds["unknown"], "other message"))
        return ", ".join(parts)


def plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def event_time(message: Mapping[str, Any], fallback: int) -> int:
    """The time an output speaks of: a prediction's `at`, an episode's `closed_at`; anything
    else (a dead letter, an unknown message) `fallback`, its record's timestamp."""
    what = kind(message)
    value = message.get("at") if what == "prediction" else None
    if what == "episode":
        value = message.get("closed_at")
    return value if isinstance(value, int) and not isinstance(value, bool) else fallback


@dataclass(frozen=True)
class Filter:
    """`oracular tail --user/--intent/--reveals`: which outputs to show (all by default).

    - `users`: only these users' predictions and episodes, and dead letters with their key;
    - `intents`: only predictions and episodes that speak of one of these intents (dead
      letters belong to no intent: none);
    - `reveals`: only predictions with a reveal (of one of `intents`, if given).
    """

    users: frozenset[str] = frozenset()
    intents: frozenset[str] = frozenset()
    reveals: bool = False

    @property
    def everything(self) -> bool:
        return not (self.users or self.intents or self.reveals)

    def __call__(self, message: Mapping[str, Any]) -> bool:
        if self.everything:
            return True
        what = kind(message)
        if self.users:
            user = message.get("key") if what == "dead letter" else message.get("user")
            if isinstance(user, bytes):
                user = user.decode("utf-8", errors="replace")
            if user not in self.users:
                return False
        if what not in ("prediction", "episode"):
            return not (self.intents or self.reveals)
        intents = message.get("intents")
        fields = intents if isinstance(intents, Mapping) else {}
        named = [name for name in fields if not self.intents or name in self.intents]
        if not named:
            return False
        if self.reveals:
            return what == "prediction" and any(
                isinstance(fields[name], Mapping) and fields[name].get("reveal") for name in named
            )
        return True
