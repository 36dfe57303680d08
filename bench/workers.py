"""The processes the bench runs: the product's worker and helper modules.

Both are `infra.processes.LoggedProcess` (what the integration tests' FaustWorker is too): a
subprocess tied to the bench, its output in a log file under the bench's temp dir.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from infra.processes import READY_LINE, REPO_ROOT, LoggedProcess, child_env, log_time
from streams.settings import product_topics

ROOT = REPO_ROOT
CONFIG = ROOT / "examples" / "oracular.yaml"
PARTITIONS = 8
READY_TIMEOUT_S = 300.0  # worker start to "Worker ready" (a restore included)
STOP_TIMEOUT_S = 60.0  # SIGTERM to exit


def add_worker_env_option(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, what: str
) -> None:
    """`--worker-env NAME=VALUE` (repeatable): extra settings for the measured workers; the
    parsed value is a list of (name, value) pairs, `dict(args.worker_env)`."""
    parser.add_argument(
        "--worker-env",
        action="append",
        default=[],
        type=_setting,
        metavar="ORACULAR_X=VALUE",
        help=what,
    )


def _setting(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        msg = f"expected NAME=VALUE, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return name, value


def clean_env(extra: Mapping[str, str], root: Path = ROOT) -> dict[str, str]:
    """This process's environment without any ORACULAR_* a developer may have set, plus
    `extra`, with the checkout `root` first on PYTHONPATH."""
    return child_env(extra, root=root, drop="ORACULAR_")


def helper(module: str, name: str, bootstrap: str, logs: Path, **flags: object) -> LoggedProcess:
    """`python -m <module> --bootstrap <broker> --<flag> <value> ...`, its log `<logs>/<name>.log`
    (not yet started)."""
    argv = [sys.executable, "-m", module, "--bootstrap", bootstrap]
    for flag, value in flags.items():
        argv += [f"--{flag.replace('_', '-')}", str(value)]
    return LoggedProcess(name, argv, env=clean_env({}), log_path=logs / f"{name}.log")


class Worker(LoggedProcess):
    """`python -m streams.cli worker` with its settings in ORACULAR_* variables."""

    def __init__(
        self,
        name: str,
        *,
        bootstrap: str,
        app_id: str,
        prefix: str,
        datadir: Path,
        log_path: Path,
        settings: Mapping[str, str] | None = None,
        root: Path = ROOT,
        processes: int = 1,
        config: Path = CONFIG,
        command: tuple[str, ...] = ("worker",),
    ) -> None:
        """A worker for `app_id` on topics `<prefix>.*` (overridable in `settings`), run from
        the checkout `root` on `config`; `processes` > 1 runs `oracular worker --processes N`
        (datadirs `<datadir>/p<i>`). `command`: the subcommand and its own flags (e.g.
        `("backfill", "--app-id", app_id)`)."""
        self.app_id, self.prefix, self.datadir = app_id, prefix, datadir
        self.processes = processes
        self.settings = {
            "ORACULAR_BROKER": bootstrap,
            "ORACULAR_APP_ID": app_id,
            "ORACULAR_TOPIC_PREFIX": prefix,
            "ORACULAR_PARTITIONS": str(PARTITIONS),
            "ORACULAR_DATADIR": str(datadir),
            **(settings or {}),
        }
        self.config = config
        argv = [sys.executable, "-m", "streams.cli", *command, "--config", str(config)]
        if processes > 1:
            argv += ["--processes", str(processes)]
        super().__init__(
            name, argv, env=clean_env(self.settings, root), log_path=log_path, cwd=root
        )

    async def ready(self, count: int = 1, timeout_s: float = READY_TIMEOUT_S) -> float:
        """Wait until `count` of its processes logged "Worker ready"; the log time (epoch s) of
        the `count`-th."""
        line = await self.wait_line_async(READY_LINE, timeout_s, count=count)
        return log_time(line) or time.time()

    @property
    def topics(self) -> Any:
        """The product topics this worker uses."""
        return product_topics(self.settings)

    def summaries(self) -> dict[str, dict[str, str]]:
        """Per process id in the log, the fields of its last `oracular summary` line (the one
        logged at shutdown)."""
        found = {}
        for line in self.log_text().splitlines():
            if "oracular summary:" in line:
                pid = re.match(r"^\[[^]]*\] \[(\d+)\]", line)
                found[pid.group(1) if pid else "?"] = dict(
                    part.split("=", 1)
                    for part in line.split("summary:", 1)[1].split()
                    if "=" in part
                )
        return found

    def summary(self) -> dict[str, str]:
        """The fields of the last `oracular summary` line (the one logged at shutdown)."""
        found = self.summaries()
        return list(found.values())[-1] if found else {}
