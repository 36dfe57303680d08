"""`oracular tune` and `oracular evaluate` from files: formats, errors, JSON and plots."""

from __future__ import annotations

import json

import pytest

from streams.cli import main
from tests.engine.test_tune import _history

CONFIG_TEXT = "episodeTimeout: 30m\nintents: {x: {signals: {a: 2}, outcome: o}}\n"


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(CONFIG_TEXT)
    return str(path)


def _csv(tmp_path, rows, header="user_id,what,when"):
    path = tmp_path / "events.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return str(path)


def _history_csv(tmp_path):
    rows = [f"{e.user},{e.name},{e.at}" for e in _history()]
    return _csv(tmp_path, rows)


COLUMNS = ["--user-col", "user_id", "--event-col", "what", "--time-col", "when"]


def test_tune_reads_csv_with_a_column_mapping_and_prints_json(tmp_path, config, capsys):
    """The hand-computed tune case, from a CSV with its own column names."""
    code = main(
        [
            "tune",
            _history_csv(tmp_path),
            "--config",
            config,
            "--min-episodes",
            "2",
            "--json",
            *COLUMNS,
        ]
    )
    assert code == 0
    [report] = json.loads(capsys.readouterr().out)
    signals = {s["signal"]: s for s in report["signals"]}
    assert signals["a"]["suggested"] == 0.67 and signals["a"]["interval"] == [-0.96, 1.8]
    assert signals["b"]["declared"] is None and signals["b"]["suggested"] == -0.67


def test_tune_text_table(tmp_path, config, capsys):
    """The text table names the intent, the measure and each signal."""
    assert (
        main(["tune", _history_csv(tmp_path), "--config", config, "--min-episodes", "2", *COLUMNS])
        == 0
    )
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("x (outcome o): 3 of 6 episodes with the outcome")
    assert "score" not in out.splitlines()[1]  # normalized difference: score == lift


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (
            ["u1,a,1767261601000", "u1,b,1767261600999"],
            "line 3: user 'u1' at 1767261600999 comes after their event at 1767261601000",
        ),
        (
            ["u1,a,1767261601000", "u1,b,soon"],
            "line 3: column 'when' must be epoch milliseconds or an ISO",
        ),
        (["u1,,1767261601000"], "line 2: column 'what' is empty"),
    ],
)
def test_unsorted_or_unparseable_rows_name_the_line(tmp_path, config, capsys, rows, message):
    """Bad files stop with the line and what was wrong, not a traceback."""
    assert main(["evaluate", _csv(tmp_path, rows), "--config", config, *COLUMNS]) == 2
    assert message in capsys.readouterr().err


def test_missing_csv_column_says_how_to_map_it(tmp_path, config, capsys):
    """A CSV without the expected column names the columns it has."""
    assert main(["tune", _csv(tmp_path, ["u1,a,1"]), "--config", config]) == 2
    err = capsys.readouterr().err
    assert "line 1: the CSV header has no column 'user' (the user id, --user-col)" in err
    assert "its columns are 'user_id', 'what', 'when'" in err


def test_evaluate_json_and_plot(tmp_path, config, capsys):
    """evaluate prints per-intent scores as JSON and draws a PNG."""
    plot = tmp_path / "eval.png"
    assert (
        main(
            [
                "evaluate",
                _history_csv(tmp_path),
                "--config",
                config,
                "--json",
                "--plot",
                str(plot),
                *COLUMNS,
            ]
        )
        == 0
    )
    [score] = json.loads(capsys.readouterr().out)
    assert score["intent"] == "x" and score["predictions"] > 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tune_evaluate_help_says_what_the_docs_and_the_code_do(capsys):
    """The help said "scaled to the config's total |weight|"; the code and the docs use the
    factor of engine.tune.SCALES with the lowest Brier score."""
    from engine.tune import SCALES

    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "total |weight|" not in text
    assert f"factor ({SCALES[0]:g}, {SCALES[1]:g}, ..., {SCALES[-1]:g}) with the lowest" in text
