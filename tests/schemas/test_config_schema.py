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


_OK_YAML = "intents:\n  up:\n    signals: {a: 1}\n"


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        (
            "bad.yaml",
            b"\xff\xfe" + _OK_YAML.encode("utf-16-le"),
            "not UTF-8 text (invalid start byte at byte 0): a config file must be saved as UTF-8",
        ),
        (
            "bad.yaml",
            (_OK_YAML + "episodeTimeout: 1" + "0" * 5000 + "\n").encode(),
            "not valid YAML: an integer has more than 4300 digits",
        ),
        (
            "bad.json",
            b'{"intents": {"up": {"signals": {"a": 1' + b"0" * 5000 + b"}}}}",
            "not valid JSON: an integer has more than 4300 digits",
        ),
        (
            "bad.json",
            b"[" * 100_000 + b"]" * 100_000,
            "not valid JSON: its maps and lists nest too deeply to read",
        ),
        (
            "bad.yaml",
            b"[" * 5_000 + b"]" * 5_000,
            "not valid YAML: its maps and lists nest too deeply to read",
        ),
        (
            "bad.yaml",
            b"intents: {up: {signals: {a: 1}}}\nsince: 2024-13-45\n",
            "not valid YAML: a value cannot be read: month must be in 1..12",
        ),
    ],
    ids=["not-utf8", "yaml-huge-int", "json-huge-int", "json-deep", "yaml-deep", "yaml-bad-date"],
)
def test_load_config_reports_files_the_parser_cannot_read(tmp_path, name, data, message):
    """Bytes that are not UTF-8, an integer Python will not convert, nesting deeper than the
    parser recurses: one problem naming the file, never a traceback."""
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.problems == ((str(path), message),)


@pytest.mark.parametrize("name", ["ok.yaml", "ok.json"])
def test_load_config_reads_a_file_with_a_byte_order_mark(tmp_path, name):
    """Some editors start UTF-8 files with a byte order mark; JSON's parser refuses it."""
    text = _OK_YAML if name.endswith(".yaml") else '{"intents": {"up": {"signals": {"a": 1}}}}'
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert list(load_config(path).intents) == ["up"]


def test_load_config_reports_a_missing_file(tmp_path):
    """A missing file says so."""
    with pytest.raises(ConfigError, match=r"nope\.yaml: no such config file"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="a directory, not a config file"):
        load_config(tmp_path)


DURATION_TEXTS = [
    *("500ms", "0ms", "1.5ms", "1.0ms", "2.3d", "1.15h", "1.001s", "1.005s", " 3 d "),
    *("0.0001s", "1.0001s", "0.0001m", "0.00001m", "0.00001h", "0.000001h"),
    *("0.00001d", "1.000001d", "0.00001w", "1.000001w", "0.000s", "0.00000w", "0.001s"),
    *("1e3s", "1.s", ".5s", "5", "-1s", "1 m s", "١٢s", "1.5 h", "0.5"),
]


def _duration_config(key: str, text: str) -> dict[str, object]:
    if key == "episodeTimeout":
        return {"episodeTimeout": text, "intents": {"x": {"signals": {}}}}
    if key == "learning.halfLife":
        return {"learning": {"halfLife": text}, "intents": {"x": {"signals": {}}}}
    return {"intents": {"x": {"signals": {}, key: text}}}


@pytest.mark.parametrize("key", ["episodeTimeout", "cooldown", "halfLife", "learning.halfLife"])
@pytest.mark.parametrize("text", DURATION_TEXTS)
def test_schema_and_validator_agree_on_duration_strings(key, text):
    """A string duration has at most the decimal places that keep it whole milliseconds (none
    with ms, 3 with s, 4 with m, 5 with h, d and w): the pattern and the validator agree."""
    config = _duration_config(key, text)
    assert VALIDATOR.is_valid(config) == _validator_accepts(config)


def test_duration_strings_of_every_millisecond_agree():
    """Exhaustively over 0.000s .. 2.999s and their 4-decimal neighbours."""
    for ms in range(0, 3000, 7):
        for text in (f"{ms // 1000}.{ms % 1000:03d}s", f"{ms // 1000}.{ms % 1000:03d}1s"):
            config = _duration_config("cooldown", text)
            assert VALIDATOR.is_valid(config) == _validator_accepts(config), text


def _validator_accepts(config: dict) -> bool:
    """The engine's validator takes `config` (the schema is checked against it)."""
    try:
        EngineConfig.from_dict(config)
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize("weight", [1e-200, 1e-320])
def test_schema_and_validator_accept_a_tiny_positive_prior_weight(weight):
    """SPEC §2: only priorWeight ≤ 0 is invalid."""
    config = {"intents": {"x": {"signals": {}, "prior": 0.5, "priorWeight": weight}}}
    EngineConfig.from_dict(config)
    VALIDATOR.validate(config)


def test_validator_only_rules_are_the_known_ones():
    """What a JSON Schema cannot state, the validator alone refuses: a priorWeight whose
    prior·priorWeight is 0 in floats (a product of two fields), and a name with a lone
    surrogate (a pattern cannot say it the same way in every regex dialect)."""
    for config in (
        {"intents": {"x": {"signals": {}, "prior": 0.01, "priorWeight": 1e-323}}},
        {"intents": {"x": {"signals": {"a\ud800": 1}}}},
    ):
        with pytest.raises(ConfigError):
            EngineConfig.from_dict(config)
        assert VALIDATOR.is_valid(config)


@pytest.mark.parametrize("k", [1e6 + 1, 1e308])
def test_schema_and_validator_accept_any_positive_prior_episodes(k):
    """SPEC §2: priorEpisodes has no maximum."""
    config = {"learning": {"priorEpisodes": k}, "intents": {"x": {"signals": {}}}}
    EngineConfig.from_dict(config)
    VALIDATOR.validate(config)
