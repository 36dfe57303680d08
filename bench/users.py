"""How `oracular replay` grows with the number of users: resident memory and speed, with every
user held decoded (`--memory` above the run's needs, as replay ran before issue 46) and within
the default `--memory` (512 MiB; the users beyond it written to disk).

    python -m bench.users --users 10000,100000,1000000

Each size is the synthetic clickstream (`bench/synthetic.py`) with the example config, two
events a user on average, as the issue that asked for bounded memory measured it. Each replay
runs under a small Python parent that reports its only child's peak RSS (`ru_maxrss` of its
children) and CPU time. Prints a markdown table; figures move with the machine's load, so
compare the two runs of one size.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.synthetic import clickstream
from schemas.config import load_config
from schemas.events import encode_event

CONFIG = Path(__file__).parents[1] / "examples" / "oracular.yaml"
UNBOUNDED_MIB = 1 << 20
"""`--memory` that holds every user decoded: a terabyte."""
_MEASURE = """
import json, resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": done.returncode, "stderr": done.stderr[-4000:],
                  "maxrss_kib": usage.ru_maxrss, "cpu_s": usage.ru_utime + usage.ru_stime}))
"""
_SUMMARY = re.compile(r"replay: applied ([\d,]+).*users ([\d,]+)(?: \(beyond --memory: ([\d,]+))?")


def write_stream(path: Path, users: int, per_user: int) -> int:
    """`per_user` events a user on average, of `users` users, into `path` (JSON lines, time
    order; `bench.synthetic.clickstream` with the example config); how many messages."""
    events = clickstream(load_config(CONFIG), users * per_user, users)
    with path.open("wb") as out:
        for chunk in range(0, len(events), 100_000):
            lines = [encode_event(e, as_json=True) for e in events[chunk : chunk + 100_000]]
            out.write(b"\n".join(lines) + b"\n")
    return len(events)


def replay(path: Path, memory_mib: int) -> dict[str, Any]:
    """One `oracular replay` of `path`: peak RSS, CPU, users, users written to disk."""
    argv = [sys.executable, "-m", "streams.cli", "replay", str(path), "--config", str(CONFIG)]
    argv += ["--out", "/dev/null", "--memory", str(memory_mib)]
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, *argv], capture_output=True, text=True, check=True
    )
    result = json.loads(done.stdout)
    found = _SUMMARY.search(result["stderr"])
    if result["rc"] != 0 or found is None:
        msg = f"replay failed ({result['rc']}): {result['stderr'][-2000:]}"
        raise RuntimeError(msg)
    applied, users, spilled = (int((g or "0").replace(",", "")) for g in found.groups())
    return {
        "rss_mib": result["maxrss_kib"] / 1024,
        "cpu_s": result["cpu_s"],
        "applied": applied,
        "users": users,
        "spilled": spilled,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", default="10000,100000,1000000", help="comma-separated sizes")
    parser.add_argument("--memory", type=int, default=512, help="the bounded run's --memory MiB")
    parser.add_argument("--per-user", type=int, default=2, help="events per user (on average)")
    parser.add_argument("--dir", help="where the streams go (default: a temporary directory)")
    args = parser.parse_args()
    sizes = [int(n) for n in args.users.split(",")]
    rows = [
        "| users | messages | users kept | run | peak RSS (MiB) | CPU (s) | messages per "
        "CPU-second | users written to disk | ÷ in memory, speed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for size in sizes:
            path = Path(tmp) / f"users-{size}.jsonl"
            messages = write_stream(path, size, args.per_user)
            print(f"users {size:,}: {messages:,} messages in {path}", file=sys.stderr)
            runs = {}
            for mode, mib in (
                ("in memory", UNBOUNDED_MIB),
                (f"--memory {args.memory}", args.memory),
            ):
                runs[mode] = run = replay(path, mib)
                print(f"  {mode}: {run}", file=sys.stderr)
            fast = messages / runs["in memory"]["cpu_s"]
            for mode, run in runs.items():
                rate = messages / run["cpu_s"]
                rows.append(
                    f"| {size:,} | {messages:,} | {run['users']:,} | {mode} | "
                    f"{run['rss_mib']:,.0f} | {run['cpu_s']:.1f} | {rate:,.0f} | "
                    f"{run['spilled']:,} | {rate / fast:.2f} |"
                )
            path.unlink()
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
