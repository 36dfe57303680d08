"""The `oracular` command line: its parser, its subcommands, and how they print.
The work itself is in streams/tools/, streams/runtime/ and streams/lookup/.

Subcommands live in `streams/cli/offline.py` (no Kafka) and `streams/cli/kafka.py`; they import
what they need when they run, so `oracular replay` never loads Faust.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from engine import ConfigError
from streams.cli import kafka as cli_kafka
from streams.cli import offline as cli_offline
from streams.cli.common import Parser, fail
from streams.settings import SettingsError
from streams.settings.exits import EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    parser = _parser()
    words = list(sys.argv[1:] if argv is None else argv)
    _refuse_unknown_flags(parser, words)  # before argparse's "required" complaints
    args, extra = parser.parse_known_args(words)
    if extra:
        _command_parser(parser, args).unrecognized(extra)
    if not hasattr(args, "run"):
        parser.print_help()
        return EXIT_USAGE
    command = getattr(args, "command", None) or ""
    try:
        return int(args.run(args))
    except ConfigError as exc:
        problems = [f"{path}: {what}" if path else what for path, what in exc.problems]
        return _problems(command, "the config", problems, "fix the config (docs/configuration.md)")
    except SettingsError as exc:
        problems = str(exc).splitlines()
        return _problems(command, "bad settings", problems, "docs/operations.md lists them")
    except BrokenPipeError:  # `oracular replay ... | head` is fine
        return 0


def _problems(command: str, what: str, problems: list[str], todo: str) -> int:
    """One problem: one line, `oracular COMMAND: WHAT: PROBLEM — TODO`. Several (a config is
    checked in one pass): that line with their count, then one indented line each."""
    if len(problems) == 1:
        if problems[0].endswith(("no such config file", "a directory, not a config file")):
            todo = "check the path"
        return fail(command, f"{what}: {problems[0]}", todo)
    code = fail(command, f"{what}: {len(problems)} problems", f"{todo}:")
    print("\n".join(f"  {line}" for line in problems), file=sys.stderr)
    return code


def _refuse_unknown_flags(parser: Parser, words: list[str]) -> None:
    """A mistyped flag (`--confg`) is named, with the closest one, before anything else."""
    found = parser
    for word in words:
        if word == "--":
            break
        subparsers = [a for a in found._actions if isinstance(a, argparse._SubParsersAction)]
        if subparsers and word in subparsers[0].choices:
            found = subparsers[0].choices[word]
            continue
        flags = {o for a in found._actions for o in a.option_strings}
        if found is not parser and word.startswith("--") and word.split("=")[0] not in flags:
            found.unrecognized([word])


def _command_parser(parser: Parser, args: argparse.Namespace) -> Parser:
    """The (sub)command's own parser (`oracular topics delete`'s for its flags)."""
    found = parser
    for dest in ("command", "action"):
        name = getattr(args, dest, None)
        subparsers = [a for a in found._actions if isinstance(a, argparse._SubParsersAction)]
        if name is None or not subparsers or name not in subparsers[0].choices:
            break
        found = subparsers[0].choices[name]
    return found


def _parser() -> Parser:
    parser = Parser(
        prog="oracular",
        description="Real-time intent prediction on Kafka: the oracular engine per user.",
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", dest="command")
    cli_offline.register(commands)
    cli_kafka.register(commands)
    return parser
