"""Loading a config file (YAML or JSON) into a validated `EngineConfig`."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from engine import ConfigError, EngineConfig


def load_config(path: str | Path) -> EngineConfig:
    """Read and validate the config at `path` (`.json`, else YAML).

    Raises:
        ConfigError: the file is missing, does not parse, or breaks a rule; every problem is
            listed with its path, prefixed with the file name.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([(str(path), f"cannot read the config file: {exc.strerror}")]) from exc
    try:
        obj = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError([(str(path), f"not valid {_format(path)}: {exc}")]) from exc
    try:
        return EngineConfig.from_dict(obj)
    except ConfigError as exc:
        raise ConfigError(
            [(f"{path}: {where}" if where else str(path), what) for where, what in exc.problems]
        ) from exc


def config_schema() -> dict[str, Any]:
    """The config's JSON Schema (`schemas/config.schema.json`)."""
    text = resources.files("schemas").joinpath("config.schema.json").read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def _format(path: Path) -> str:
    return "JSON" if path.suffix == ".json" else "YAML"
