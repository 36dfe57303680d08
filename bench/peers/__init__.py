"""Peers of the product's worker in the end-to-end benchmark (bench/e2e.py).

Each peer is a stream processor written the way its framework's documentation teaches, doing the
same small per-user stateful job on the bench's preloaded input topic (msgpack events keyed by
user), in its own process, with its own consumer group, state directory and output topic:

per event: decode the value (msgpack, or Segment JSON on the realistic stream); read the user's
state (a count and the last event time) from the framework's RocksDB-backed, changelogged
store; write it back with the count plus one and this event's time; send one msgpack output
(user, event id, count) keyed by the user.

- `bench.peers.faust_agent`: a Faust agent (faust-streaming, the product's own runtime) over
  `app.Table(..., store="rocksdb://")`, one `await topic.send(...)` per output;
- `bench.peers.quix_app`: Quix Streams (confluent-kafka / librdkafka underneath), a
  `StreamingDataFrame` with `update(..., stateful=True)` and `to_topic(...)`.

Both are started as `python -m bench.peers.<name> --bootstrap B --source S --dest D --app-id A
--datadir DIR` and run until SIGTERM. The product's worker does far more per event (the engine,
predictions, episodes and their timer, a changelog record per user per batch awaited before the
input is committed), so the peers say what the frameworks cost with almost nothing to compute.

Quix Streams is a bench-only dependency: `ensure_quixstreams()` installs the pinned release into
the running interpreter's environment the first time it is needed.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import subprocess
import sys
from typing import Any

import msgpack

QUIXSTREAMS_VERSION = "3.28.1"
"""The Quix Streams release the bench installs (Python >= 3.11; librdkafka 2.12 via
confluent-kafka, which speaks to Kafka 4.0 brokers)."""
INSTALL_TIMEOUT_S = 600.0


def decode(value: bytes) -> dict[str, Any]:
    """An input event: a msgpack map (user, ts, type, name, id, ...), or a Segment JSON message
    (the realistic stream: starts with `{`), whose `userId` (else `anonymousId`), `timestamp`
    and `messageId` are taken as user, ts and id."""
    if value[:1] == b"{":
        message = json.loads(value)
        return {
            "user": message.get("userId") or message.get("anonymousId"),
            "ts": message.get("timestamp"),
            "id": message.get("messageId"),
        }
    event: dict[str, Any] = msgpack.unpackb(value, raw=False)
    return event


def count_event(event: dict[str, Any], state: list[int] | None) -> tuple[list[int], bytes]:
    """The peers' per-event work: (new state [count, last event time], the output value)."""
    count = (state[0] if state else 0) + 1
    output: bytes = msgpack.packb({"user": event["user"], "id": event.get("id"), "count": count})
    return [count, event["ts"]], output


def quixstreams_version() -> str | None:
    """The installed Quix Streams version, or None."""
    try:
        return importlib.metadata.version("quixstreams")
    except importlib.metadata.PackageNotFoundError:
        return None


def ensure_quixstreams(say: Any = print) -> tuple[str | None, str]:
    """Install Quix Streams if missing; (its version, "") or (None, why it is unavailable)."""
    version = quixstreams_version()
    if version is not None:
        return version, ""
    spec = f"quixstreams=={QUIXSTREAMS_VERSION}"
    say(f"installing {spec} into {sys.prefix} (bench-only dependency)")
    try:
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        done = subprocess.run(
            [*pip, spec],
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"`pip install {spec}` failed: {exc}"
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return None, f"`pip install {spec}` exited {done.returncode}: {last[0][:200]}"
    importlib.invalidate_caches()
    version = quixstreams_version()
    if version is None:
        return None, f"`pip install {spec}` succeeded but the package is not importable"
    return version, ""
