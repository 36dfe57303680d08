"""The end-to-end bench's input streams: what a run preloads, what it expects, how it reports.

`python -m bench --stream NAME` picks them (default both, synthetic first):

- `synthetic`: bench/synthetic.py `clickstream` (seed 7) on `examples/oracular.yaml`: small
  native msgpack events keyed by user, the stream every earlier figure in BENCHMARKS.md used;
- `realistic`: bench/realistic.py (seed 11) on `bench/realistic.yaml`: Segment JSON messages
  (500-900 bytes, `identify` calls among them), about half the events changing a prediction,
  sessions of 5-30 events closed by the idle timeout.

Either ends with one closing mark per partition a day after its last event (bench/synthetic.py
`closing_marks`, native msgpack for both: the worker takes either format on one topic), so the
watermark closes every episode the events leave open, as `engine.replay` expects.

Each record carries a record timestamp: None (the producer's clock) for the synthetic events,
the message's own `sentAt` for a Segment message. The worker corrects a Segment event's device
time by `record time - sentAt` (Segment's clock-skew rule); a record stamped when the bench
preloads it would move every event of the month-long stream to the few seconds of the preload.
So the realistic input topic keeps its records forever (`retention.ms=-1`, `KEEP_INPUT`): the
broker would otherwise delete month-old records at its first retention check.

Pure: no broker, no clock (tests/bench/test_inputs.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Final

from bench import realistic, synthetic
from engine import EngineConfig, Event
from schemas.config import load_config
from schemas.events import DecodeError, IgnoredMessage, decode_event, encode_event

ROOT: Final = Path(__file__).resolve().parents[1]
DAY_MS: Final = 24 * 3600 * 1000
KEEP_INPUT: Final = {"retention.ms": "-1"}
"""Input topic configs for records stamped with old times (see the module docstring)."""

STREAMS: Final = ("synthetic", "realistic")
"""The streams `--stream` takes, in the order `both` runs them."""


@dataclass(frozen=True, slots=True)
class Record:
    """One input record: key, value, record timestamp (epoch ms; None: the producer's clock)."""

    key: bytes
    value: bytes
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class BenchInput:
    """A stream prepared for the throughput phase."""

    name: str
    config_path: Path
    records: list[Record]
    """What the input topic holds, in produce order (closing marks last)."""
    events: list[Event]
    """The events the worker decodes from `records` (ignored messages left out), in order:
    what `engine.replay` is given for the expected outputs."""
    ignored: int
    """Records the worker reads but ignores (Segment `identify` calls)."""
    topic_config: Mapping[str, str]
    """Extra configs of the input topic."""
    describe: str
    """One sentence for the report: what the input is."""


def config_path(name: str) -> Path:
    """The config a stream's workers run."""
    if name == "synthetic":
        return ROOT / "examples" / "oracular.yaml"
    if name == "realistic":
        return realistic.CONFIG
    msg = f"unknown stream {name!r} (known: {', '.join(STREAMS)})"
    raise ValueError(msg)


def selected(text: str) -> tuple[str, ...]:
    """`--stream` value -> the streams to run: a name, comma-separated names, or "both"."""
    names = STREAMS if text.strip() == "both" else tuple(p.strip() for p in text.split(","))
    for name in names:
        config_path(name)  # raises for an unknown name
    if not names or len(set(names)) != len(names):
        msg = f"--stream {text!r}: name each stream once"
        raise ValueError(msg)
    return tuple(name for name in STREAMS if name in names)


def sent_at_ms(message: Mapping[str, object]) -> int | None:
    """A Segment message's `sentAt` in epoch ms (None without one)."""
    sent = message.get("sentAt")
    if not isinstance(sent, str):
        return None
    return int(datetime.fromisoformat(sent.replace("Z", "+00:00")).timestamp() * 1000)


def segment_record(raw: bytes) -> Record:
    """A Segment JSON message as its producer's record: keyed by its user, stamped `sentAt`."""
    message = json.loads(raw)
    user = message.get("userId") or message.get("anonymousId")
    return Record(str(user).encode(), raw, sent_at_ms(message))


def closing(events: Sequence[Event], partitions: int) -> list[Event]:
    """The closing marks after `events` (their time order: the last is the latest)."""
    return synthetic.closing_marks(events[-1].at + DAY_MS, partitions)


def build(
    name: str, events: int, users: int, partitions: int, config: EngineConfig | None = None
) -> BenchInput:
    """The named stream of about `events` events over `users` users, with its closing marks."""
    path = config_path(name)
    config = config or load_config(path)
    if name == "synthetic":
        stream = synthetic.clickstream(config, events, users)
        stream += closing(stream, partitions)
        records = [Record(e.user.encode(), encode_event(e)) for e in stream]
        return BenchInput(
            name,
            path,
            records,
            stream,
            0,
            {},
            f"{events:,} msgpack events over {users:,} users (`bench/synthetic.py` "
            f"`clickstream`, seed 7; config `examples/oracular.yaml`)",
        )
    generated = realistic.realistic_stream(config, events, users)
    records, decoded, ignored = [], [], 0
    for raw in generated.messages:
        record = segment_record(raw)
        try:
            decoded.append(decode_event(raw, fallback_ts=record.timestamp_ms))
        except IgnoredMessage:
            ignored += 1
        except DecodeError as exc:  # the generator makes none: a change broke it
            msg = f"the realistic stream has an undecodable message: {exc}"
            raise ValueError(msg) from exc
        records.append(record)
    marks = closing(decoded, partitions)
    records += [Record(e.user.encode(), encode_event(e), e.at) for e in marks]
    mean = sum(generated.sessions) / len(generated.sessions)
    return BenchInput(
        name,
        path,
        records,
        decoded + marks,
        ignored,
        KEEP_INPUT,
        f"{len(decoded):,} Segment JSON track and page events and {ignored:,} identify calls "
        f"over {users:,} users (`bench/realistic.py`, seed {generated.seed}; sessions of "
        f"{min(generated.sessions)}-{max(generated.sessions)} events, mean {mean:.1f}; config "
        "`bench/realistic.yaml`), keyed by `userId`, each record stamped with its `sentAt`",
    )


@dataclass(frozen=True, slots=True)
class RatioRow:
    """One line of the same-run comparison: a drainer's median rate against the baselines."""

    label: str
    rate: float
    to_passthrough: float | None
    to_quix: float | None
    per_cpu: float | None = None
    """Events per CPU-second of its process(es), when its CPU was measured."""
    per_cpu_to_passthrough: float | None = None


def ratio_rows(
    rates: Sequence[tuple[str, float | None] | tuple[str, float | None, float | None]],
) -> list[RatioRow]:
    """Each measured rate as a ratio to the passthrough's and Quix Streams' in the same run.

    `rates` are (label, median events/s or None when not measured[, events per CPU-second or
    None]); the baselines are found by their labels, "passthrough" and "Quix Streams".
    Unmeasured rows are left out; a ratio is None when its baseline was not measured.
    """
    found = {row[0]: row for row in rates if row[1]}
    base, quix = found.get("passthrough"), found.get("Quix Streams")
    base_cpu = base[2] if base is not None and len(base) > 2 else None
    out = []
    for row in found.values():
        label, rate = row[0], row[1]
        assert rate is not None
        per_cpu = row[2] if len(row) > 2 else None
        out.append(
            RatioRow(
                label,
                rate,
                rate / base[1] if base is not None and base[1] else None,
                rate / quix[1] if quix is not None and quix[1] else None,
                per_cpu,
                per_cpu / base_cpu if per_cpu and base_cpu else None,
            )
        )
    return out
