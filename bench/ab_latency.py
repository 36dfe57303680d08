"""Latency A/B of worker checkouts on one broker: `python -m bench.ab_latency`.

    python -m bench.ab_latency --rate 5085 --rounds 5 base=/tmp/base new=.
    python -m bench.ab_latency --rate 8410 held=. unheld=.:ORACULAR_STATE_WRITE_INTERVAL_S=0

Starts one broker (as `python -m bench` does), warms it with a passthrough run, then runs
the latency case (bench/latency.py: `--rate` events/s for 20 s, live timestamps, 10,000
users) once per checkout per round, alternating, so each pair shares the machine's state
of the moment. These machines drift by more than the changes measured here from one minute
to the next; alternating pairs on one broker is what makes two checkouts comparable (a
fresh broker per run also puts its JIT warm-up into the first run).

Per run it prints p50 / p99 produce → prediction, and the worker's own leg (produce → the
prediction's record timestamp, set when the worker hands it to its producer), which leaves
out the bench's consumer; at the end, the medians per checkout. Nothing is recorded in
BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
from pathlib import Path

from bench.latency import latency_run
from bench.session import Params, Session
from infra.broker import PRODUCTION_GROUP_SETTINGS, start_broker

Checkout = tuple[Path, dict[str, str]]
"""A worker checkout and the settings its workers get."""


async def _run(bench: Session, rate: float, rounds: int, roots: dict[str, Checkout]) -> None:
    await latency_run(bench, "passthrough", rate, 0)  # the broker's JIT warm-up
    rows: dict[str, list[tuple[float, ...]]] = {name: [] for name in roots}
    for round_ in range(rounds):
        for name, (root, settings) in roots.items():
            bench.params.worker_root, bench.params.worker_env = root, settings
            result = await latency_run(bench, "pipeline", rate, round_)
            row = tuple(
                result[key] * 1000 for key in ("p50", "p99", "to_output_p50", "to_output_p99")
            )
            rows[name].append(row)
            print(
                f"{name} round {round_ + 1}: p50 {row[0]:.1f} ms, p99 {row[1]:.1f} ms; "
                f"worker's leg p50 {row[2]:.1f} ms, p99 {row[3]:.1f} ms",
                flush=True,
            )
    for name, runs in rows.items():
        medians = [statistics.median(column) for column in zip(*runs, strict=True)]
        print(
            f"{name} medians of {len(runs)}: p50 {medians[0]:.1f} ms, p99 {medians[1]:.1f} ms; "
            f"worker's leg p50 {medians[2]:.1f} ms, p99 {medians[3]:.1f} ms"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ab_latency", description=__doc__)
    parser.add_argument("--rate", type=float, required=True, help="offered events/s")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "checkouts",
        nargs="+",
        metavar="NAME=DIR[:ORACULAR_X=VALUE...]",
        help="worker checkouts, each with settings for its workers",
    )
    args = parser.parse_args(argv)
    roots: dict[str, Checkout] = {}
    for spec in args.checkouts:
        name, sep, rest = spec.partition("=")
        directory, *assignments = rest.split(":")
        settings = dict(a.partition("=")[::2] for a in assignments)
        if not sep or not Path(directory, "streams").is_dir():
            parser.error(f"{spec!r}: expected NAME=DIR, DIR a checkout of this repository")
        if not all(key.startswith("ORACULAR_") and value for key, value in settings.items()):
            parser.error(f"{spec!r}: settings are ORACULAR_X=VALUE, separated by ':'")
        roots[name] = (Path(directory).resolve(), settings)
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # leader elections of new topics
    workdir = Path(tempfile.mkdtemp(prefix="oracular-ab-"))
    broker = start_broker(
        workdir / "kafka", port=None, stop_with_parent=True, overrides=PRODUCTION_GROUP_SETTINGS
    )
    try:
        asyncio.run(_run(Session(broker, workdir, Params()), args.rate, args.rounds, roots))
    finally:
        broker.stop(wipe=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
