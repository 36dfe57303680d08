"""bench/compiled.py's equality check can fail: a "compiled" replay that imported the pure
engine is refused (no build needed, so this runs in CI; `make compiled` runs the check itself)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import compiled

SAMPLE = compiled.ROOT / "examples" / "clickstream.jsonl"
CONFIG = compiled.ROOT / "examples" / "oracular.yaml"


def test_a_pure_replay_passes_as_pure(tmp_path: Path) -> None:
    out, states = tmp_path / "out.jsonl", tmp_path / "states.jsonl"
    compiled.replay(False, SAMPLE, CONFIG, out, states)
    assert out.stat().st_size > 0
    assert states.stat().st_size > 0


def test_a_compiled_replay_that_ran_the_pure_engine_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compiled, "COMPILED", tmp_path / "no-build")  # nothing compiled there
    with pytest.raises(SystemExit, match="compiled replay failed"):
        compiled.replay(True, SAMPLE, CONFIG, tmp_path / "out.jsonl", tmp_path / "states.jsonl")


def test_the_check_and_the_ab_refuse_to_run_without_a_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compiled, "COMPILED", tmp_path / "no-build")
    with pytest.raises(SystemExit, match="make compiled"):
        compiled.check(100)
    with pytest.raises(SystemExit, match="make compiled"):
        compiled.ab(1, 100)
