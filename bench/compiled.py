"""`python -m bench.compiled`: the optional mypyc build of engine/, its equality check, its A/B.

`make compiled` runs `build` then `check`. Nothing here touches the source tree: the
default build (`make test`, CI, the worker) stays pure Python.

- `build`: copies engine/ to build/compiled-src/, compiles it there with mypyc and keeps only
  the extension modules in build/compiled/ (engine/*.so and mypyc's shared runtime module).
  Putting build/compiled first on the import path runs the compiled engine:
  `PYTHONSAFEPATH=1 PYTHONPATH=build/compiled:. .venv/bin/python -m streams.cli replay ...`
  (PYTHONSAFEPATH, or `python -P`: `-m` otherwise puts the current directory, and so the
  pure engine/, ahead of PYTHONPATH).
- `check`: `oracular replay` with `--out` and `--states` on the realistic stream
  (bench/realistic.py, 20,000 events) and on examples/clickstream.jsonl, once pure and once
  compiled; the files must be byte-identical, and each run asserts that every engine module
  it imported is the build asked for (.so or .py), so a check that silently ran the pure
  engine twice fails. Exits 1 on any difference.
- `ab`: `python -m bench.offline --runs 1` alternating pure and compiled (`--pairs`), the
  medians of each side.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "build" / "compiled-src"
COMPILED = ROOT / "build" / "compiled"
CLOCK = 1_767_603_600_000 + 365 * 86_400_000  # as bench.offline: a fixed --clock

# Run in each replay process: the replay itself, then the proof of which engine ran.
RUN_REPLAY = """
import sys
from streams.cli import main
want = sys.argv[1]
code = main(sys.argv[2:])
files = {name: getattr(module, "__file__", "") or "" for name, module in sys.modules.items()
         if name == "engine" or name.startswith("engine.")}
wrong = sorted(name for name, path in files.items() if not path.endswith(want))
if not files or wrong:
    sys.exit(f"expected every engine module to be a {want} file; not: {wrong or 'none imported'}")
sys.exit(code)
"""


def env(compiled: bool) -> dict[str, str]:
    """The environment of a pure or a compiled run: the repository on the path either way
    (streams/, schemas/), build/compiled ahead of it for the compiled one; PYTHONSAFEPATH
    so that `-m` and `-c` do not put the current directory first."""
    paths = [str(COMPILED)] if compiled else []
    return {**os.environ, "PYTHONSAFEPATH": "1", "PYTHONPATH": os.pathsep.join([*paths, str(ROOT)])}


def build() -> None:
    """mypyc engine/ into build/compiled (see the module docs)."""
    shutil.rmtree(SOURCE, ignore_errors=True)
    shutil.rmtree(COMPILED, ignore_errors=True)
    shutil.copytree(
        ROOT / "engine", SOURCE / "engine", ignore=shutil.ignore_patterns("__pycache__")
    )
    print("== mypyc engine/ (build/compiled-src/mypyc.log; about 20 s)", flush=True)
    log = SOURCE / "mypyc.log"
    with log.open("w") as handle:
        done = subprocess.run(
            [sys.executable, "-m", "mypyc", "engine"],
            cwd=SOURCE,
            stdout=handle,
            stderr=handle,
            check=False,
        )
    if done.returncode != 0:
        print(log.read_text()[-4000:], file=sys.stderr)
        msg = f"mypyc failed ({done.returncode}); the log: {log}"
        raise SystemExit(msg)
    (COMPILED / "engine").mkdir(parents=True)
    # mypyc's shared runtime lives at the top level (<hash>__mypyc.*.so); the modules import it.
    for lib in SOURCE.glob("*__mypyc*.so"):
        shutil.copy2(lib, COMPILED)
    modules = sorted((SOURCE / "engine").glob("*.so"))
    for module in modules:
        shutil.copy2(module, COMPILED / "engine")
    # py.typed only, so type checkers pointed here see a typed package; no .py is copied, so
    # nothing here can fall back to the pure engine.
    shutil.copy2(ROOT / "engine" / "py.typed", COMPILED / "engine")
    print(f"== {len(modules)} compiled modules in {COMPILED.relative_to(ROOT)}/engine")


def require_build() -> None:
    """Refuse to run without a build: the compiled side would silently be the pure engine."""
    if not any(COMPILED.glob("engine/*.so")):
        raise SystemExit("no compiled engine in build/compiled: run `make compiled`")


def replay(compiled: bool, events: Path, config: Path, out: Path, states: Path) -> None:
    """`oracular replay` in a fresh process, pure or compiled."""
    want = ".so" if compiled else ".py"
    argv = ["replay", str(events), "--config", str(config), "--out", str(out)]
    argv += ["--states", str(states), "--clock", str(CLOCK), "--quiet"]
    done = subprocess.run(
        [sys.executable, "-c", RUN_REPLAY, want, *argv], env=env(compiled), cwd=ROOT, check=False
    )
    if done.returncode != 0:
        msg = f"the {'compiled' if compiled else 'pure'} replay failed on {events}"
        raise SystemExit(msg)


def check(events: int) -> None:
    """Replays pure and compiled must write the same bytes (see the module docs)."""
    require_build()
    from bench.realistic import CONFIG, realistic_stream  # noqa: PLC0415
    from schemas.config import load_config  # noqa: PLC0415

    failed = []
    with tempfile.TemporaryDirectory(prefix="oracular-compiled-") as tmp:
        realistic = Path(tmp) / "realistic.jsonl"
        stream = realistic_stream(load_config(CONFIG), events, 1_000, seed=11)
        realistic.write_bytes(b"".join(raw + b"\n" for raw in stream.messages))
        cases = [
            ("realistic", realistic, CONFIG),
            (
                "clickstream",
                ROOT / "examples" / "clickstream.jsonl",
                ROOT / "examples" / "oracular.yaml",
            ),
        ]
        for name, path, config in cases:
            files = {}
            for build_name, compiled in (("pure", False), ("compiled", True)):
                out = Path(tmp) / f"{name}.{build_name}.out.jsonl"
                states = Path(tmp) / f"{name}.{build_name}.states.jsonl"
                replay(compiled, path, config, out, states)
                files[build_name] = (out.read_bytes(), states.read_bytes())
            for kind, pure, comp in zip(
                ("--out", "--states"), files["pure"], files["compiled"], strict=True
            ):
                digest = hashlib.sha256(pure).hexdigest()[:16]
                same = pure == comp and len(pure) > 0
                print(
                    f"{'same' if same else 'DIFFERENT':9} {name} {kind}: pure {len(pure):,} bytes "
                    f"(sha256 {digest}), compiled {len(comp):,} bytes "
                    f"(sha256 {hashlib.sha256(comp).hexdigest()[:16]})"
                )
                if not same:
                    failed.append(f"{name} {kind}")
    if failed:
        msg = f"FAILED: the compiled engine's replay differs from the pure one: {failed}"
        raise SystemExit(msg)
    print("== the compiled and pure builds give byte-identical replays")


FIGURES = re.compile(
    r"replay ([\d,]+) events/s, engine alone ([\d,]+), apply_event ([\d,]+); replay/engine ([\d.]+)"
    r".*state decode ([\d.]+) µs/user, encode ([\d.]+) µs/user; cold lookup ([\d.]+) µs"
)


def ab(pairs: int, events: int) -> None:
    """`python -m bench.offline --runs 1`, pure then compiled, `pairs` times; the medians."""
    require_build()
    seen: dict[str, list[tuple[float, ...]]] = {"pure": [], "compiled": []}
    for n in range(pairs):
        for name, compiled in (("pure", False), ("compiled", True)):
            argv = [sys.executable, "-m", "bench.offline", "--runs", "1", "--events", str(events)]
            done = subprocess.run(
                argv, env=env(compiled), cwd=ROOT, capture_output=True, text=True, check=True
            )
            match = FIGURES.search(done.stdout)
            if match is None:
                msg = f"bench.offline printed no figures: {done.stdout}{done.stderr}"
                raise SystemExit(msg)
            figures = tuple(float(g.replace(",", "")) for g in match.groups())
            seen[name].append(figures)
            print(f"pair {n + 1} {name:8}: {done.stdout.strip()}", flush=True)
    labels = (
        "replay events/s",
        "engine alone events/s",
        "apply_event events/s",
        "replay/engine",
        "state decode µs/user",
        "state encode µs/user",
        "cold lookup µs",
    )
    for i, label in enumerate(labels):
        pure = statistics.median(f[i] for f in seen["pure"])
        comp = statistics.median(f[i] for f in seen["compiled"])
        digits = 3 if label == "replay/engine" else 0 if "events/s" in label else 1
        print(
            f"{label:24} pure {pure:>10,.{digits}f}  compiled {comp:>10,.{digits}f}  "
            f"compiled/pure {comp / pure:.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.compiled", description=__doc__.splitlines()[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="mypyc engine/ into build/compiled")
    checking = commands.add_parser("check", help="pure and compiled replays must be byte-identical")
    checking.add_argument("--events", type=int, default=20_000)
    timing = commands.add_parser("ab", help="bench.offline, pure and compiled alternating")
    timing.add_argument("--pairs", type=int, default=5)
    timing.add_argument("--events", type=int, default=50_000)
    args = parser.parse_args()
    if args.command == "build":
        build()
    elif args.command == "check":
        check(args.events)
    else:
        ab(args.pairs, args.events)


if __name__ == "__main__":
    main()
