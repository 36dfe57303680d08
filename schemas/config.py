"""Loading a config file (YAML or JSON) into a validated `EngineConfig`."""

from __future__ import annotations

import difflib
import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from engine import ConfigError, EngineConfig


def load_config(path: str | Path) -> EngineConfig:
    """Read and validate the config at `path` (`.json`, else YAML).

    Raises:
        ConfigError: the file is missing, is not UTF-8, does not parse (an integer of more
            digits than Python converts, nesting deeper than the parser recurses), or breaks a
            rule; every problem is listed with its path, prefixed with the file name.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            what = "no such config file"  # the words every command uses for a missing file
        elif isinstance(exc, IsADirectoryError):
            what = "a directory, not a config file"
        else:
            what = f"cannot read the config file: {exc.strerror}"
        raise ConfigError([(str(path), what)]) from exc
    try:
        text = data.decode("utf-8-sig")  # a byte order mark (some editors write one) is dropped
    except UnicodeDecodeError as exc:
        msg = (
            f"not UTF-8 text ({exc.reason} at byte {exc.start}): "
            "a config file must be saved as UTF-8"
        )
        raise ConfigError([(str(path), msg)]) from exc
    try:
        obj = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:  # JSONDecodeError is a ValueError
        reason = _reason(exc).replace('in "<unicode string>", ', "").replace("\n", " ")
        raise ConfigError(
            [(str(path), f"not valid {_format(path)}: {' '.join(reason.split())}")]
        ) from exc
    except RecursionError as exc:
        msg = f"not valid {_format(path)}: its maps and lists nest too deeply to read"
        raise ConfigError([(str(path), msg)]) from exc
    if obj is None:
        msg = "the file is empty: a config is a mapping with `intents:` (examples/oracular.yaml)"
        raise ConfigError([(str(path), msg)])
    try:
        return EngineConfig.from_dict(obj)
    except ConfigError as exc:
        raise ConfigError(
            [
                (f"{path}: {where}" if where else str(path), _with_hint(where, what))
                for where, what in exc.problems
            ]
        ) from exc


def _with_hint(where: str, what: str) -> str:
    """An unknown key's problem with the closest allowed key (`halfLive`: did you mean
    halfLife?)."""
    head, sep, choices = what.partition("; expected one of ")
    if head != "unknown key" or not sep:
        return what
    key = where.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(key, choices.split(", "), n=1, cutoff=0.6)
    return f"unknown key (did you mean {close[0]}?); expected one of {choices}" if close else what


def config_schema() -> dict[str, Any]:
    """The config's JSON Schema (`schemas/config.schema.json`)."""
    text = resources.files("schemas").joinpath("config.schema.json").read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def _format(path: Path) -> str:
    return "JSON" if path.suffix == ".json" else "YAML"


def _reason(exc: ValueError | yaml.YAMLError) -> str:
    """What the parser refused. A ValueError that is not a JSONDecodeError comes from a value's
    own conversion: an integer literal too long for `int` (Python refuses more than 4,300
    digits) or a YAML date that does not exist (`2024-13-45`); its text has no position."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem and exc.problem_mark:
        mark = exc.problem_mark  # where, said once, without PyYAML's snippet and caret
        context = f"{exc.context}, " if exc.context else ""
        return f"{context}{exc.problem} at line {mark.line + 1}, column {mark.column + 1}"
    if isinstance(exc, json.JSONDecodeError | yaml.YAMLError):
        return str(exc)
    if "integer string conversion" in str(exc):
        limit = sys.get_int_max_str_digits()
        return f"an integer has more than {limit} digits"
    return f"a value cannot be read: {exc}"
