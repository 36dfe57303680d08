"""schemas/config.schema.json agrees with engine.EngineConfig.from_dict."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

from engine import ConfigError, EngineConfig
from schemas.config import config_schema, load_config
from tests.engine.test_config import INVALID_CONFIGS

VALIDATOR = jsonschema.Draft202012Validator(config_schema())
ROOT = Path(__file__).resolve().parents[2]

VALID_CONFIGS = [
    {"intents": {"x": {"signals": {}}}},
    {"intents": {"x": {"signals": {"a": -1.5, "b": 0}, "outcome": None}}},
    {
        "$schema": "./schemas/config.schema.json",
        "episodeTimeout": 0,
        "intents": {"x": {"signals": {"a": 1}, "cooldown": "0s", "attribution": 0}},
    },
    {
        "episodeTimeout": "1.5h",
        "learning": {"gain": 0, "priorEpisodes": 0.01, "halfLife": 1, "lift": "association-rule"},
        "intents": {
            "x": {
                "signals": {"a": 1},
                "outcome": "o",
                "halfLife": "2w",
                "prior": 0.99,
                "priorWeight": 0.1,
                "threshold": 0,
                "z": 0,
                "resetOnOutcome": False,
            }
        },
    },
]


@pytest.mark.parametrize("config", VALID_CONFIGS)
def test_schema_accepts_what_the_validator_accepts(config):
    """Valid configs pass both."""
    EngineConfig.from_dict(config)
    VALIDATOR.validate(config)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        # JSON has no NaN: that rule is the validator's alone.
        case
        for case in INVALID_CONFIGS
        if "(got nan)" not in case[1]
    ],
)
def test_schema_rejects_what_the_validator_rejects(config, message):
    """Each invalid config of the validator's tests is invalid for the schema too."""
    with pytest.raises(ConfigError):
        EngineConfig.from_dict(config)
    assert not VALIDATOR.is_valid(config), message


def test_shipped_example_config_is_valid_for_both():
    """examples/oracular.yaml loads and matches the schema."""
    path = ROOT / "examples" / "oracular.yaml"
    config = load_config(path)
    assert "upgrade" in config.intents
    VALIDATOR.validate(yaml.safe_load(path.read_text()))


def test_load_config_prefixes_problems_with_the_file(tmp_path):
    """A bad file: every problem names the file and the path inside it."""
    path = tmp_path / "bad.yaml"
    path.write_text("intents:\n  upgrade:\n    signals: {x: heavy}\n    prior: 3\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert [p for p, _ in caught.value.problems] == [
        f"{path}: intents.upgrade.signals.x",
        f"{path}: intents.upgrade.prior",
    ]


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("bad.yaml", "intents: [unclosed", "not valid YAML"),
        ("bad.json", "{", "not valid JSON"),
    ],
)
def test_load_config_reports_unparseable_files(tmp_path, name, text, message):
    """A file that does not parse gives one message, not a traceback."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_load_config_reports_a_missing_file(tmp_path):
    """A missing file says so."""
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(tmp_path / "nope.yaml")
