"""ORACULAR_API_CPUS: the CPU list read as `taskset -c` writes it, checked against the CPUs this
process may use, and applied to the worker's own threads (`reserve_cpus`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.settings import SettingsError, load_settings
from streams.settings.cpus import check_cpus, format_cpus, parse_cpus

ALLOWED = os.sched_getaffinity(0)


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("3", {3}), ("2-3", {2, 3}), ("0,4-5", {0, 4, 5}), (" 1 , 1-2 ", {1, 2}), ("7-7", {7})],
)
def test_a_cpu_list_reads_as_taskset_writes_it(text: str, cpus: set[int]) -> None:
    assert parse_cpus(text) == cpus


@pytest.mark.parametrize(
    "text", ["", "a", "1-", "-1", "3-1", "1,,2", "²", "１", "1.5", "0x1", "99999"]
)
def test_anything_else_is_refused_naming_the_part(text: str) -> None:
    with pytest.raises(ValueError, match="CPU"):
        parse_cpus(text)


@given(st.sets(st.integers(0, 300), min_size=1))
def test_a_formatted_list_reads_back_as_the_same_cpus(cpus: set[int]) -> None:
    text = format_cpus(cpus)
    assert parse_cpus(text) == cpus
    assert len(text.split(",")) <= len(cpus)  # runs are ranges


def test_the_reserved_cpus_must_be_this_process_s_and_leave_the_worker_one() -> None:
    outside = max(ALLOWED) + 1
    assert f"CPUs {outside} are not among" in (check_cpus(str(outside)) or "")
    assert "leaves the worker none" in (check_cpus(format_cpus(ALLOWED)) or "")
    if len(ALLOWED) > 1:
        assert check_cpus(str(max(ALLOWED))) is None


def test_a_bad_value_is_one_settings_problem_that_names_the_variable() -> None:
    assert load_settings(env={}).api_cpus is None
    with pytest.raises(SettingsError) as raised:
        load_settings(env={"ORACULAR_API_CPUS": "2-x", "ORACULAR_API_NICE": "-21"})
    lines = [line for line in str(raised.value).splitlines() if "ORACULAR_API" in line]
    assert any(line.count("ORACULAR_API_CPUS") == 1 and "'2-x'" in line for line in lines)
    assert len([line for line in lines if "ORACULAR_API_CPUS" in line]) == 1


@pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two CPUs to reserve one")
def test_the_worker_keeps_its_threads_off_the_reserved_cpus() -> None:
    """In a process of its own (it pins the process that calls it): a thread started before
    and one started after `reserve_cpus` both keep off the reserved CPU."""
    reserved = max(ALLOWED)
    code = f"""
import os, threading
from streams.settings.cpus import reserve_cpus
seen = {{}}
stop = threading.Event()
def before():
    stop.wait()
    seen["before"] = os.sched_getaffinity(0)
early = threading.Thread(target=before)
early.start()
assert reserve_cpus("{reserved}") == {{{reserved}}}
late = threading.Thread(target=lambda: seen.setdefault("after", os.sched_getaffinity(0)))
late.start(); late.join(); stop.set(); early.join()
print(sorted(os.sched_getaffinity(0)), sorted(seen["before"]), sorted(seen["after"]))
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    rest = str(sorted(ALLOWED - {reserved}))
    assert result.stdout.split() and result.stdout.strip() == f"{rest} {rest} {rest}"
