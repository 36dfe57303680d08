"""An end-to-end benchmark session (`Session`) and what it is asked to measure (`Params`).

The phases (bench/throughput.py, bench/latency.py, bench/recovery.py) each take the session:
its broker, its temp dir, unique names for topics and app ids, the workers and helper
processes it makes, and the `Results` they fill in.
"""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from bench.inputs import config_path
from bench.results import Results
from bench.workers import CONFIG, ROOT, Worker, helper
from infra.broker import Broker
from infra.processes import LoggedProcess
from schemas.config import load_config


def say(message: str) -> None:
    """Progress on stderr."""
    print(f"[e2e] {message}", file=sys.stderr, flush=True)


@dataclass
class Params:
    """Sizes and repetitions of the end-to-end benchmarks."""

    events: int = 100_000
    """Throughput input (was 200,000 before the peers and the scale-out run joined the phase:
    halved to keep `make bench` near 12 minutes; `--e2e-events 200000` for the old size)."""
    users: int = 10_000
    runs: int = 3
    latency_runs: int = 3
    latency_seconds: float = 20.0
    latency_warmup_s: float = 3.0
    latency_rate: float | None = None
    """Offered load; default half the measured pipeline throughput."""
    recovery_users: int = 100_000
    recovery_events_per_user: int = 2
    recovery_runs: int = 3
    phases: tuple[str, ...] = ("throughput", "latency", "recovery")
    peers: tuple[str, ...] = ("faust", "quix")
    """Peers run in the throughput phase (bench/peers): "faust", "quix"."""
    processes: int = 2
    """The throughput phase also runs `oracular worker --processes N` (1: no scale-out run)."""
    streams: tuple[str, ...] = ("synthetic", "realistic")
    """The input streams (bench/inputs.py), each through the throughput and latency phases;
    recovery runs once, on the synthetic stream's config."""
    backfill: bool = True
    """The throughput phase also drains the input with `oracular backfill`."""
    worker_env: dict[str, str] = field(default_factory=dict)
    """Extra ORACULAR_* settings for the measured workers (experiments; noted in the output)."""
    worker_root: Path = ROOT
    """The checkout the workers run from (A/B a change against the same broker and data)."""
    keep: bool = False
    """Keep the temporary directory (broker data, worker logs and state) for inspection."""


class Session:
    """One end-to-end benchmark session: a broker, a temp dir, unique names, the results."""

    def __init__(
        self, broker: Broker, workdir: Path, params: Params, stream: str = "synthetic"
    ) -> None:
        """Use `broker`; everything else goes under `workdir`; the workers run the config of
        `stream` (bench/inputs.py)."""
        self.broker, self.workdir, self.params = broker, workdir, params
        self.bootstrap = broker.bootstrap
        self.stream = stream
        self.config_path = config_path(stream) if stream != "synthetic" else CONFIG
        self.config = load_config(self.config_path)
        self.session = uuid.uuid4().hex[:6]
        self.counter = 0
        self.results = Results(params, stream=stream)

    def name(self, what: str) -> str:
        """A name no other run (or earlier session on a reused broker) uses."""
        self.counter += 1
        return f"bench-{self.session}-{self.counter:02d}-{what}"

    def worker(
        self,
        name: str,
        *,
        app_id: str | None = None,
        processes: int = 1,
        command: tuple[str, ...] = ("worker",),
        **settings: str,
    ) -> Worker:
        """A worker with its own app id, topic prefix, datadir and log (unless overridden);
        `processes` > 1: `oracular worker --processes N`; `command`: another subcommand."""
        app_id = app_id or name
        return Worker(
            name,
            bootstrap=self.bootstrap,
            app_id=app_id,
            prefix=settings.pop("prefix", name),
            datadir=self.workdir / "state" / name,
            log_path=self.workdir / "logs" / f"{name}.log",
            root=self.params.worker_root,
            processes=processes,
            config=self.config_path,
            command=command,
            settings={
                **self.params.worker_env,
                **{f"ORACULAR_{k.upper()}": v for k, v in settings.items()},
            },
        )

    def helper(self, module: str, name: str, **flags: object) -> LoggedProcess:
        """`python -m <module> --bootstrap <broker> --<flag> <value> ...` (not yet started)."""
        return helper(module, name, self.bootstrap, self.workdir / "logs", **flags)
