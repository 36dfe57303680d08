"""The `oracular` command line.

Subcommands live in `streams/cli_offline.py` (no Kafka) and `streams/cli_kafka.py`; they import
what they need when they run, so `oracular replay` never loads Faust.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from engine import ConfigError
from streams import cli_kafka, cli_offline
from streams.cli_common import EXIT_USAGE
from streams.settings import SettingsError


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.run(args))
    except ConfigError as exc:
        print(f"oracular: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SettingsError as exc:
        name = f"oracular {args.command}" if getattr(args, "command", None) else "oracular"
        print(f"{name}: bad settings:\n{exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `oracular replay ... | head` is fine
        return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="oracular",
        description="Real-time intent prediction on Kafka: the oracular engine per user.",
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", dest="command")
    cli_offline.register(commands)
    cli_kafka.register(commands)
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
