"""`python -m bench.offline`: `oracular replay` against the engine alone, on the realistic stream.

Issue 34's first target is a ratio measured in one run: `oracular replay` (the command, run
in this process on a file of the realistic stream, its outputs written to /dev/null) against
the engine alone on the same events (per event one `observe` and one `predict` of the
config's first intent, the states in a dict). The runs alternate, replay then engine; every
figure is the median of `--runs`, in events per second of this process's CPU time. Also
measured: `apply_event` per event (`Replayer`, the engine's reference replay), and decoding
and encoding the stored states the replay leaves (`schemas.stored`, µs per user: what a
cache miss, a restore or a cold lookup pays).

Two rungs between the engine and the command show where a replay's time beyond the engine
goes: the leanest replay Python allows (`skeleton`: msgspec's parse, the event's three
fields, `apply_event`, a three-field output line; no check of any kind, no bookkeeping), and
the product's decoder with `apply_event` (`decoded_apply`: `schemas.files.read_lines` with
every check of the input, the same minimal outputs, none of the processor's bookkeeping).

`--profile` prints cProfile's top functions of one replay instead. `make bench` runs this
with its defaults and records the section in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import gc
import io
import os
import pstats
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from bench.realistic import CONFIG, DAY, START, realistic_stream
from engine import (
    EngineConfig,
    EngineState,
    Event,
    Replayer,
    apply_event,
    create_state,
    observe,
    predict,
)
from schemas.config import load_config
from schemas.events import DecodeError, IgnoredMessage, decode_event
from schemas.files import read_lines
from schemas.stored import decode_stored, encode_stored

BEGIN, END = "<!-- bench:offline:begin -->", "<!-- bench:offline:end -->"
CLOCK = START + 365 * DAY
"""The replays' clock (`--clock`): fixed, so a run does not depend on the day it runs."""


@dataclass(frozen=True, slots=True)
class Figures:
    """One invocation's medians."""

    events: int
    messages: int
    users: int
    changed: float
    """Share of the events whose `apply_event` changed a prediction."""
    sessions: tuple[int, int, float]
    """Fewest, most and mean events per session."""
    replay: float
    """`oracular replay` events/s: the track and page events over the whole run's time (the
    identify calls it also reads count as its overhead, as for a producer's stream)."""
    engine: float
    """observe + predict events/s."""
    apply: float
    """apply_event events/s."""
    skeleton: float
    """The leanest replay's events/s (`skeleton`)."""
    decoded_apply: float
    """The product's decoder with `apply_event` (`decoded_apply`), events/s."""
    ratios: list[float]
    """replay / engine of each run pair."""
    decode_us: float
    encode_us: float
    cold_lookup_us: float
    """A lookup of a user not in the cache, in the lookup API's own code: its stored bytes
    decoded (`streams.lookup.serving.read_user`) and the JSON answer built (`answer`: every
    intent predicted at the replay's clock); no RocksDB read, no HTTP."""
    bytes_per_user: int
    replays: list[float]
    engines: list[float]


def events_of(messages: list[bytes]) -> list[Event]:
    """The events the worker's decoder makes of `messages` (ignored messages left out)."""
    events = []
    for raw in messages:
        try:
            events.append(decode_event(raw))
        except IgnoredMessage:
            continue
        except DecodeError as exc:  # the generator makes none: a change broke it
            msg = f"the realistic stream has an undecodable message: {exc}"
            raise SystemExit(msg) from exc
    return events


def engine_alone(config: EngineConfig, events: list[Event]) -> None:
    """Per event one `observe` and one `predict`: the engine's own cost."""
    fresh = create_state(config)
    intent = next(iter(config.intents))
    states: dict[str, Any] = {}
    for event in events:
        state = observe(states.get(event.user, fresh), event.name or "", event.at)
        predict(state, intent, event.at)
        states[event.user] = state


def apply_alone(config: EngineConfig, events: list[Event]) -> None:
    """`apply_event` per event (the engine's reference replay)."""
    replayer = Replayer(config)
    for event in events:
        replayer.feed(event)


_PARSE = msgspec.json.Decoder()
_ENCODE = msgspec.json.Encoder()


def skeleton(config: EngineConfig, lines: list[bytes]) -> dict[str, EngineState]:
    """The leanest replay of the realistic stream's Segment lines Python allows: msgspec's
    parse (no limit, duplicate key or encoding checked), the user, name and time as the
    product's decoder computes them for this stream (`sentAt` without `receivedAt` in a file:
    the time as sent), `apply_event`, and a line of user, time and the changed intents' `p`
    per input that changes a prediction. Everything a real replay adds (its checks, the
    dead letters, ids remembered, the stored users, the timers, full outputs) is left out:
    the figure is a floor, not a product. Returns the states (tests compare them with
    `Replayer`'s: the engine's work is all done)."""
    fresh = create_state(config)
    states: dict[str, EngineState] = {}
    lines_out: list[bytes] = []
    iso = datetime.datetime.fromisoformat
    for raw in lines:
        obj = _PARSE.decode(raw)
        kind = obj.get("type")
        if kind == "track":
            name = obj["event"]
        elif kind == "page":
            name = "page.viewed"
        else:
            continue
        user = obj["userId"]
        at = int(iso(obj["timestamp"]).timestamp() * 1000)
        step = apply_event(states.get(user, fresh), Event(user, at, name))
        states[user] = step.state
        if step.predictions:
            changed = {intent: p.p for intent, p in step.predictions.items()}
            lines_out.append(_ENCODE.encode({"user": user, "at": at, "p": changed}))
            if len(lines_out) >= 256:
                lines_out.clear()  # written to nowhere, as the replay's go to /dev/null
    return states


def decoded_apply(config: EngineConfig, events_path: Path) -> dict[str, EngineState]:
    """The product's decoder over the file (`read_lines`: every check `oracular replay`
    makes of an input) and `apply_event`, with `skeleton`'s minimal outputs: the replay
    without the processor (no dedupe, stored users, timers or full output messages)."""
    fresh = create_state(config)
    states: dict[str, EngineState] = {}
    lines_out: list[bytes] = []
    with events_path.open("rb") as handle:
        data = io.BytesIO(handle.read())  # read once, as the skeleton's lines are in memory
    for line in read_lines(data, "jsonl"):
        event = line.event
        if event is None:
            continue
        step = apply_event(states.get(event.user, fresh), event)
        states[event.user] = step.state
        if step.predictions:
            changed = {intent: p.p for intent, p in step.predictions.items()}
            lines_out.append(_ENCODE.encode({"user": event.user, "at": event.at, "p": changed}))
            if len(lines_out) >= 256:
                lines_out.clear()
    return states


def replay(config_path: Path, events_path: Path) -> None:
    """`oracular replay EVENTS --config CONFIG --out /dev/null --quiet` in this process."""
    from streams.cli import main  # noqa: PLC0415 - the shell, imported only when measured

    code = main(
        [
            "replay",
            str(events_path),
            "--config",
            str(config_path),
            "--out",
            os.devnull,
            "--quiet",
            "--clock",
            str(CLOCK),
        ]
    )
    if code != 0:
        msg = f"oracular replay exited with {code}"
        raise SystemExit(msg)


def _seconds(fn: Callable[[], object]) -> float:
    """The CPU time `fn` takes in this process (`time.process_time`): on these shared
    two-core machines the wall clock also counts other jobs' turns, which moved wall-clock
    rates by 2-3x within minutes while the CPU time moved by a few percent."""
    gc.collect()  # the previous run's garbage is not this one's to collect
    started = time.process_time()
    fn()
    return time.process_time() - started


def stored_values(config_path: Path, events_path: Path) -> list[bytes]:
    """The table values a replay of the file leaves, one per user."""
    from streams.tools.replay import OfflineRun  # noqa: PLC0415

    config = load_config(config_path)
    run = OfflineRun(config, str(events_path), CLOCK)
    with events_path.open("rb") as handle:
        for line in read_lines(handle, "jsonl"):
            run.feed_line(line)
    run.finish()
    return list(run.stored().values())


def state_codec(config: EngineConfig, values: list[bytes], runs: int) -> tuple[float, float]:
    """(µs to decode a stored user, µs to encode one): medians of `runs` passes over all, in
    CPU time."""
    decodes, encodes = [], []
    for _ in range(runs):
        gc.collect()
        started = time.process_time()
        users = [decode_stored(raw, config) for raw in values]
        decodes.append((time.process_time() - started) * 1e6 / len(values))
        for user in users:
            user.packed = None  # a decoded user's first write packs every intent
        started = time.process_time()
        for user in users:
            encode_stored(user)
        encodes.append((time.process_time() - started) * 1e6 / len(values))
    return statistics.median(decodes), statistics.median(encodes)


def cold_lookups(config: EngineConfig, values: list[bytes], runs: int) -> float:
    """µs per cold lookup (see `Figures.cold_lookup_us`): median of `runs` passes over all
    the stored users, in CPU time."""
    from streams.lookup.serving import answer, read_user  # noqa: PLC0415 - the shell

    passes = []
    for _ in range(runs):
        gc.collect()
        started = time.process_time()
        for n, raw in enumerate(values):
            read = read_user(raw, config, 0)
            answer(
                read,
                f"user-{n}",
                intents=None,
                at=CLOCK,
                with_explain=False,
                served_by={},
                config_id="bench",
            )
        passes.append((time.process_time() - started) * 1e6 / len(values))
    return statistics.median(passes)


def measure(events: int, users: int, runs: int, seed: int = 11) -> Figures:
    """Generate the stream, write it to a temp file and measure (see the module docs)."""
    from streams.runtime.memory import GcPolicy  # noqa: PLC0415

    GcPolicy.tune()  # as `oracular replay` does: both sides run under the same collector
    config = load_config(CONFIG)
    stream = realistic_stream(config, events, users, seed=seed)
    decoded = events_of(stream.messages)
    replayer = Replayer(config)
    changed = sum(bool(replayer.feed(event).predictions) for event in decoded)
    with tempfile.TemporaryDirectory(prefix="oracular-bench-") as tmp:
        path = Path(tmp) / "realistic.jsonl"
        path.write_bytes(b"".join(raw + b"\n" for raw in stream.messages))
        replays, engines, applies, skeletons, decodes = [], [], [], [], []
        n = len(decoded)
        for _ in range(runs):
            replays.append(n / _seconds(lambda: replay(CONFIG, path)))
            engines.append(n / _seconds(lambda: engine_alone(config, decoded)))
            applies.append(n / _seconds(lambda: apply_alone(config, decoded)))
            skeletons.append(n / _seconds(lambda: skeleton(config, stream.messages)))
            decodes.append(n / _seconds(lambda: decoded_apply(config, path)))
        values = stored_values(CONFIG, path)
    decode_us, encode_us = state_codec(config, values, runs)
    cold_lookup_us = cold_lookups(config, values, runs)
    return Figures(
        events=len(decoded),
        messages=len(stream.messages),
        users=users,
        changed=changed / len(decoded),
        sessions=(min(stream.sessions), max(stream.sessions), statistics.mean(stream.sessions)),
        replay=statistics.median(replays),
        engine=statistics.median(engines),
        apply=statistics.median(applies),
        skeleton=statistics.median(skeletons),
        decoded_apply=statistics.median(decodes),
        ratios=[r / e for r, e in zip(replays, engines, strict=True)],
        decode_us=decode_us,
        encode_us=encode_us,
        cold_lookup_us=cold_lookup_us,
        bytes_per_user=int(statistics.median(len(v) for v in values)),
        replays=replays,
        engines=engines,
    )


def section(figures: Figures, runs: int, when: str, command: str) -> str:
    """The Markdown section `make bench` records."""
    f = figures
    ratio = statistics.median(f.ratios)
    shown = ", ".join(f"{r:.3f}" for r in f.ratios)
    low, high, mean = f.sessions
    return "\n".join(
        [
            BEGIN,
            f"### Offline on the realistic stream (`make bench`, {when})",
            "",
            f"Data: `bench/realistic.py` (seed 11): {f.messages:,} Segment JSON messages "
            f"({f.events:,} track and page events, the rest identify calls) of {f.users:,} "
            f"users; sessions of {low}-{high} events (mean {mean:.1f}); "
            f"{f.changed:.1%} of the events change a prediction; config "
            f"`bench/realistic.yaml` (3 intents of 12, 8 and 6 signals). Median of {runs} "
            f"runs, replay and engine alternating; events per second of the process's CPU "
            "time (`time.process_time`: other jobs on the shared cores do not count). "
            f"Command: `{command}`.",
            "",
            "| case | what | events/s | ratio to the engine alone |",
            "|---|---|---:|---:|",
            f"| engine alone | `observe` + one `predict` per event | {f.engine:,.0f} | 1.000 |",
            f"| apply_event | the engine's reference replay (`Replayer`) | {f.apply:,.0f} | "
            f"{f.apply / f.engine:.3f} |",
            f"| the leanest replay | msgspec's parse, `apply_event`, a three-field output line; "
            f"no check, no bookkeeping (`skeleton`: a floor) | {f.skeleton:,.0f} | "
            f"{f.skeleton / f.engine:.3f} |",
            f"| decoder + apply_event | every check of the input (`read_lines`), `apply_event`, "
            f"the same minimal outputs; no processor | {f.decoded_apply:,.0f} | "
            f"{f.decoded_apply / f.engine:.3f} |",
            f"| oracular replay | the command on the JSON file, outputs to /dev/null | "
            f"{f.replay:,.0f} | {ratio:.3f} |",
            "",
            f"Replay / engine alone per run pair: {shown} (issue 34's target: ≥ 0.5). "
            f"Stored state (`schemas.stored`, {f.users:,} users after the replay, median "
            f"{f.bytes_per_user:,} bytes): decode {f.decode_us:.1f} µs per user "
            f"(`decode_stored`: a cache miss, a restore, a cold lookup), encode "
            f"{f.encode_us:.1f} µs per user (`encode_stored`, every intent packed). A cold "
            f"lookup (a user not in the cache) costs {f.cold_lookup_us:.1f} µs of CPU in the "
            "lookup API's code: the stored bytes decoded (`streams.lookup.serving.read_user`) "
            "and the answer built (`answer`, all 3 intents predicted), without the RocksDB "
            "read and the HTTP round trip.",
            END,
        ]
    )


def main() -> None:
    """Print the figures (or a profile)."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.offline", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--profile", action="store_true", help="cProfile one replay instead")
    args = parser.parse_args()
    if args.profile:
        config = load_config(CONFIG)
        stream = realistic_stream(config, args.events, args.users, seed=args.seed)
        with tempfile.TemporaryDirectory(prefix="oracular-bench-") as tmp:
            path = Path(tmp) / "realistic.jsonl"
            path.write_bytes(b"".join(raw + b"\n" for raw in stream.messages))
            profile = cProfile.Profile()
            profile.runcall(replay, CONFIG, path)
        pstats.Stats(profile).sort_stats("tottime").print_stats(30)
        return
    figures = measure(args.events, args.users, args.runs, args.seed)
    print(
        f"replay {figures.replay:,.0f} events/s, engine alone {figures.engine:,.0f}, "
        f"apply_event {figures.apply:,.0f}, the leanest replay {figures.skeleton:,.0f}, "
        f"decoder + apply_event {figures.decoded_apply:,.0f}; replay/engine "
        f"{statistics.median(figures.ratios):.3f} "
        f"({', '.join(f'{r:.3f}' for r in figures.ratios)}); state decode "
        f"{figures.decode_us:.1f} µs/user, encode {figures.encode_us:.1f} µs/user; cold lookup "
        f"{figures.cold_lookup_us:.1f} µs; "
        f"{figures.changed:.1%} of events change a prediction"
    )


if __name__ == "__main__":
    main()
