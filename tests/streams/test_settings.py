"""streams/settings/: one table, one builder (defaults <- ORACULAR_* <- flags), help and docs
made from the table, and no flag ever written into the process environment."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import typing
from pathlib import Path
from typing import Any

import pytest

from streams import settings as settings_module
from streams.cli import _parser, main
from streams.settings import (
    SETTINGS,
    Settings,
    SettingsError,
    as_environment,
    describe,
    load_settings,
    markdown_table,
)
from streams.settings.exits import EXIT_USAGE

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "oracular.yaml"
OPERATIONS = ROOT / "docs" / "operations.md"


@pytest.fixture(autouse=True)
def _no_oracular_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [k for k in os.environ if k.startswith("ORACULAR_")]:
        monkeypatch.delenv(var)


def _oracular_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("ORACULAR_")}


def _commands() -> dict[str, argparse.ArgumentParser]:
    return _parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr,return-value]


def test_the_defaults_are_the_tables() -> None:
    built = load_settings({})
    assert built == Settings()
    for row in SETTINGS:
        if hasattr(built, row.name):
            assert getattr(built, row.name) == row.default, row.name
    assert [spec.name for spec in built.topics] == [
        "oracular.events",
        "oracular.ticks",
        "oracular.predictions",
        "oracular.episodes",
        "oracular.events.dlq",
    ]
    assert {spec.partitions for spec in built.topics} == {8}


def test_every_field_has_its_row_and_type() -> None:
    hints = typing.get_type_hints(Settings)
    for row in SETTINGS:
        if row.name in hints:
            assert row.kind in (hints[row.name], *typing.get_args(hints[row.name])), row.name
            assert row.env.startswith("ORACULAR_"), row.name
    assert len({row.env for row in SETTINGS}) == len(SETTINGS)
    assert len({row.flag for row in SETTINGS if row.flag}) == len([r for r in SETTINGS if r.flag])


def test_a_variable_beats_the_default_and_a_flag_beats_the_variable() -> None:
    env = {
        "ORACULAR_LATENESS_MS": "5000",
        "ORACULAR_IDLE_MS": "7",
        "ORACULAR_TOPIC_PREFIX": "env",
        "ORACULAR_PARTITIONS": "3",
    }
    built = load_settings(env, {"lateness_ms": "9000", "topic_prefix": "flag", "idle_ms": None})
    assert built.lateness_ms == 9000  # flag
    assert built.idle_ms == 7  # variable (the flag was not given)
    assert built.max_skew_ms == 60_000  # default
    assert built.topics.events.name == "flag.events"
    assert built.topics.events.partitions == 3


def test_an_empty_variable_or_flag_is_not_given() -> None:
    built = load_settings({"ORACULAR_BROKER": ""}, {"broker": ""})
    assert built.broker == settings_module.DEFAULT_BROKER


def test_each_problem_is_one_line_naming_the_variable_or_the_flag() -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(
            {
                "ORACULAR_IDLE_MS": "soon",
                "ORACULAR_BATCH_MAX": "0",
                "ORACULAR_OUTPUT_FORMAT": "xml",
                "ORACULAR_CONSUMER_LOOP": "threads",
                "ORACULAR_LATENESS_MS": "1",
            },
            {"lateness_ms": "-1", "tick_interval_s": "fast", "api_port": "70000"},
        )
    assert str(caught.value).splitlines() == [
        "ORACULAR_IDLE_MS='soon': must be a whole number",
        "--tick-interval='fast': must be a number",
        "ORACULAR_BATCH_MAX: must be > 0 (got 0)",
        "--lateness-ms: must be >= 0 (got -1)",
        "ORACULAR_OUTPUT_FORMAT: must be msgpack or json (got 'xml')",
        "ORACULAR_CONSUMER_LOOP: must be worker or thread (got 'threads')",
        "--api-port: must be 0-65535 (got 70000)",
    ]


def test_a_bad_topic_name_names_where_it_came_from() -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings({"ORACULAR_TOPIC_DLQ": "dead letters"}, {"topic_prefix": "ok"})
    [line] = str(caught.value).splitlines()
    assert line.startswith("--topic-prefix, ORACULAR_TOPIC_DLQ: Topic name 'dead letters'")


def test_the_retired_grace_variable_is_refused_with_its_replacements() -> None:
    with pytest.raises(SettingsError, match="ORACULAR_GRACE_MS: replaced by ORACULAR_LATENESS_MS"):
        load_settings({"ORACULAR_GRACE_MS": "1000"})


def test_secrets_are_neither_logged_nor_shown() -> None:
    built = load_settings(
        {
            "ORACULAR_SASL_PASSWORD": "pw-1",
            "ORACULAR_API_TOKEN": "tok-2",
            "ORACULAR_ERASURE_KEY": "key-3",
        }
    )
    for secret in ("pw-1", "tok-2", "key-3"):
        assert secret not in describe(built) and secret not in repr(built)
    assert {row.name for row in SETTINGS if row.secret} == {
        "sasl_username",
        "sasl_password",
        "ssl_keyfile",
        "api_token",
        "erasure_key",
    }


def test_flags_become_variables_only_for_child_processes() -> None:
    assert as_environment({"lateness_ms": "5", "broker": None, "api_port": ""}) == {
        "ORACULAR_LATENESS_MS": "5"
    }


@pytest.mark.parametrize("command", ["worker", "backfill"])
def test_the_flag_help_is_made_from_the_table(command: str) -> None:
    parser = _commands()[command]
    by_flag = {a.option_strings[0]: a for a in parser._actions if a.option_strings}
    for row in SETTINGS:
        if row.flag is None or (
            row.name == "config_path" or (command == "backfill" and row.name == "app_id")
        ):
            continue  # required unless the variable is set: said in their own words
        action = by_flag[row.flag]
        assert action.dest == row.name
        assert action.default is None  # the default comes from load_settings, not argparse
        assert action.help == (
            f"{row.help} (default {row.default_text()}; env {row.env})".replace("%", "%%")
        )
    help_text = parser.format_help()
    assert "ORACULAR_LATENESS_MS" in help_text and "120000" in help_text


def test_the_operations_doc_table_is_the_tables() -> None:
    doc = OPERATIONS.read_text()
    found = re.search(
        r"<!-- settings table: generated [^\n]*-->\n(.*?)<!-- end of settings table -->",
        doc,
        re.DOTALL,
    )
    assert found, "docs/operations.md lost its settings table markers"
    assert found.group(1) == markdown_table(), (
        "docs/operations.md's settings table differs from streams/settings/ SETTINGS: "
        "paste the output of `python -m streams.settings` between the markers"
    )
    for row in SETTINGS:  # and so every variable (and flag) is documented
        assert f"| `{row.env}` |" in found.group(1)


def test_the_doc_check_fails_on_a_missing_or_wrong_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """The doc check can fail: a changed default or a new row changes the table."""
    table = markdown_table()
    changed = tuple(
        dataclasses.replace(row, default=1) if row.name == "batch_max" else row for row in SETTINGS
    )
    monkeypatch.setattr(settings_module, "SETTINGS", changed)
    assert markdown_table() != table
    extra = settings_module.Setting("x", "ORACULAR_X", int, 1, "a new knob")
    monkeypatch.setattr(settings_module, "SETTINGS", (*SETTINGS, extra))
    assert "`ORACULAR_X`" in markdown_table() and "`ORACULAR_X`" not in table


def _stub_deployment(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """`oracular worker` up to Faust, with the broker steps stubbed: the settings it ran with."""
    import streams.tools.admin

    seen: list[Any] = []

    async def prepare(settings: Any, create: bool = True) -> None:
        seen.append(settings)

    monkeypatch.setattr(streams.tools.admin, "prepare_deployment", prepare)
    return seen


def test_worker_flags_reach_the_settings_not_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import streams.worker

    seen = _stub_deployment(monkeypatch)

    class Stop(Exception):
        pass

    def create_worker(settings: Any, config: Any) -> Any:
        raise Stop

    monkeypatch.setattr(streams.worker, "create_worker", create_worker)
    monkeypatch.setenv("ORACULAR_LATENESS_MS", "1000")
    monkeypatch.setenv("ORACULAR_IDLE_MS", "2000")
    with pytest.raises(Stop):
        main(["worker", "--config", str(CONFIG), "--lateness-ms", "3000", "--app-id", "w"])
    [settings] = seen
    assert (settings.lateness_ms, settings.idle_ms, settings.app_id) == (3000, 2000, "w")
    assert settings.config_path == CONFIG
    assert _oracular_environment() == {
        "ORACULAR_LATENESS_MS": "1000",
        "ORACULAR_IDLE_MS": "2000",
    }


def test_a_bad_worker_flag_is_one_line_naming_the_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = _stub_deployment(monkeypatch)
    code = main(["worker", "--lateness-ms", "soon", "--api-url", "worker-1"])
    assert code == EXIT_USAGE and seen == []
    assert capsys.readouterr().err.splitlines() == [
        "oracular worker: bad settings: 2 problems — docs/operations.md lists them:",
        "  --lateness-ms='soon': must be a whole number",
        "  --api-url: must start with http:// (got 'worker-1')",
    ]


def test_processes_children_get_the_flags_as_their_own_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import streams.tools.processes

    _stub_deployment(monkeypatch)
    started: list[Any] = []
    monkeypatch.setattr(
        streams.tools.processes,
        "run_processes",
        lambda argv, envs: started.append((argv, envs)) or 0,
    )
    monkeypatch.setenv("ORACULAR_IDLE_MS", "2000")
    argv = ["worker", "--config", str(CONFIG), "--processes", "2", "--partitions", "4"]
    code = main([*argv, "--lateness-ms", "3000", "--api-port", "7000", "--datadir", "/d"])
    assert code == 0
    [(child_argv, envs)] = started
    assert child_argv == ["--loglevel", "info", "--no-create-topics"]
    for i, env in enumerate(envs):
        assert env["ORACULAR_LATENESS_MS"] == "3000"
        assert env["ORACULAR_IDLE_MS"] == "2000"
        assert env["ORACULAR_PARTITIONS"] == "4"
        assert env["ORACULAR_CONFIG"] == str(CONFIG)
        assert env["ORACULAR_DATADIR"] == f"/d/p{i}"
        assert env["ORACULAR_API_PORT"] == str(7000 + i)
        child = load_settings(env)  # what the child reads
        assert (child.lateness_ms, child.idle_ms, child.api_port) == (3000, 2000, 7000 + i)
    assert _oracular_environment() == {"ORACULAR_IDLE_MS": "2000"}


def test_backfill_settings_use_a_fresh_app_id_and_suffixed_outputs() -> None:
    from streams.cli.kafka import _backfill_settings

    os.environ["ORACULAR_APP_ID"] = "base"  # removed again by the autouse fixture's undo
    try:
        args = _parser().parse_args(
            ["backfill", "--config", str(CONFIG), "--topic-prefix", "t", "--output-suffix", ".bf"]
        )
        settings, since = _backfill_settings(args)
    finally:
        del os.environ["ORACULAR_APP_ID"]
    assert since is None
    assert re.fullmatch(r"base-backfill-\d{8}T\d{6}", settings.app_id)
    assert [spec.name for spec in settings.topics] == [
        "t.events",
        "t.ticks",
        "t.predictions.bf",
        "t.episodes.bf",
        "t.events.dlq.bf",
    ]
    assert _oracular_environment() == {}


def test_a_backfill_suffix_that_makes_an_illegal_name_names_the_suffix() -> None:
    from streams.cli.kafka import _backfill_settings

    args = _parser().parse_args(["backfill", "--config", str(CONFIG), "--output-suffix", "/x"])
    from streams.settings import SettingsError

    with pytest.raises(SettingsError, match=r"^--output-suffix: Topic name"):
        _backfill_settings(args)
