"""The worker's last resort when Faust keeps a re-read partition from resuming."""

from __future__ import annotations

import pytest

from schemas.config import load_config
from streams import app as app_module
from streams.app import REREAD_TIMEOUT_S, _Runtime
from streams.processor import Processor
from tests.streams.test_cli_replay import CONFIG
from tests.streams.test_processor import EVENTS, TICKS


@pytest.fixture
def runtime():
    runtime = _Runtime.__new__(_Runtime)  # only what check_holes uses
    runtime.processor = Processor(
        load_config(CONFIG), events_topic=EVENTS, ticks_topic=TICKS, grace_ms=0
    )
    runtime.holes = {}
    return runtime


def test_a_hole_that_was_re_read_is_forgotten(runtime, monkeypatch):
    """Progress past the hole's offset clears it; nothing restarts."""
    monkeypatch.setattr(app_module.os, "execv", lambda *a: pytest.fail("restarted"))
    runtime.holes[0] = (10, 0.0)
    runtime.processor.next_offset[0] = 11
    runtime.check_holes()
    assert runtime.holes == {}


def test_a_hole_not_re_read_in_time_restarts_the_worker(runtime, monkeypatch):
    """No progress for REREAD_TIMEOUT_S: the process re-executes its own command line."""
    calls = []
    monkeypatch.setattr(app_module.os, "execv", lambda path, argv: calls.append((path, argv)))
    now = app_module.time.monotonic()
    runtime.holes[0] = (10, now)
    runtime.processor.next_offset[0] = 10
    runtime.check_holes()
    assert calls == []  # still within the timeout
    runtime.holes[0] = (10, now - REREAD_TIMEOUT_S - 1)
    runtime.check_holes()
    assert calls and calls[0][0] == app_module.sys.executable
    assert calls[0][1][1:] == app_module.sys.orig_argv[1:]
