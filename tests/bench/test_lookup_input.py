"""`python -m bench.lookup --stream`: what each stream preloads, whom it looks up, and how many
inputs the workers apply once the backlog is drained (the throughput windows' end)."""

from __future__ import annotations

from bench.inputs import KEEP_INPUT
from bench.lookup import lookup_input
from bench.workers import CONFIG
from schemas.events import IgnoredMessage, decode_event


def _applied_and_users(records) -> tuple[int, set[str]]:
    """The records as the worker decodes them: (events applied, their users)."""
    applied, users = 0, set()
    for record in records:
        try:
            event = decode_event(record.value, fallback_ts=record.timestamp_ms)
        except IgnoredMessage:
            continue
        applied += 1
        users.add(event.user)
    return applied, users


def test_the_synthetic_stream_is_the_clickstream_every_earlier_figure_used() -> None:
    source = lookup_input("synthetic", 3000, 200)
    assert source.config == CONFIG and source.topic_config == {}
    applied, users = _applied_and_users(source.records)
    assert source.applied == applied == len(source.records) == 3000
    assert source.users == sorted(users)


def test_the_realistic_stream_counts_what_the_workers_apply_and_no_closing_marks() -> None:
    source = lookup_input("realistic", 3000, 100)
    assert source.config.name == "realistic.yaml"
    assert source.topic_config == dict(KEEP_INPUT)  # month-old record times are kept
    applied, users = _applied_and_users(source.records)
    assert source.applied == applied < len(source.records)  # identify calls: not applied
    assert source.users == sorted(users)
    assert not any(user.startswith("sentinel-") for user in users)
