"""The end-to-end bench's inputs (bench/inputs.py), the peers' and the passthrough's decoding of
them, the load generator's Segment records, and the same-run ratio table."""

from __future__ import annotations

import json

import msgpack
import pytest

from bench.inputs import (
    KEEP_INPUT,
    STREAMS,
    build,
    closing,
    ratio_rows,
    segment_record,
    selected,
    sent_at_ms,
)
from bench.loadgen import _prepared_segment
from bench.passthrough import reencode
from bench.peers import count_event, decode
from bench.realistic import iso_time
from schemas.events import decode_event

PARTITIONS = 8


@pytest.fixture(scope="module")
def realistic():
    return build("realistic", 1_500, 60, PARTITIONS)


@pytest.fixture(scope="module")
def synthetic():
    return build("synthetic", 1_000, 50, PARTITIONS)


def test_selected_streams():
    assert selected("both") == STREAMS
    assert selected("realistic") == ("realistic",)
    assert selected("realistic,synthetic") == ("synthetic", "realistic")
    with pytest.raises(ValueError, match="unknown stream"):
        selected("nope")
    with pytest.raises(ValueError, match="once"):
        selected("synthetic,synthetic")


def test_synthetic_input_is_the_old_one(synthetic):
    assert synthetic.topic_config == {}
    assert synthetic.ignored == 0
    assert len(synthetic.records) == len(synthetic.events) == 1_000 + PARTITIONS
    for record, event in zip(synthetic.records, synthetic.events, strict=True):
        assert record.timestamp_ms is None
        assert record.key == event.user.encode()
        assert decode_event(record.value) == event


def test_realistic_records_decode_to_the_expected_events(realistic):
    """What the worker decodes from the records (with their record timestamps, as the skew
    correction sees them) is exactly the event list the expected outputs come from."""
    decoded = []
    for record in realistic.records:
        try:
            decoded.append(decode_event(record.value, fallback_ts=record.timestamp_ms))
        except Exception as exc:  # IgnoredMessage: identify calls
            assert type(exc).__name__ == "IgnoredMessage"
    assert decoded == realistic.events
    assert realistic.ignored == len(realistic.records) - len(realistic.events) > 0
    assert realistic.topic_config == KEEP_INPUT
    # Every record is stamped (month-old times: the topic must keep them) and keyed by user.
    assert all(record.timestamp_ms is not None for record in realistic.records)
    marks = realistic.events[-PARTITIONS:]
    assert all(mark.at == realistic.events[-PARTITIONS - 1].at + 24 * 3600 * 1000 for mark in marks)
    assert marks == closing(realistic.events[:-PARTITIONS], PARTITIONS)


def test_segment_record_is_stamped_with_sent_at():
    raw = json.dumps(
        {
            "type": "track",
            "userId": "u1",
            "event": "x",
            "timestamp": iso_time(5_000),
            "sentAt": iso_time(5_250),
        }
    ).encode()
    record = segment_record(raw)
    assert record.key == b"u1"
    assert record.timestamp_ms == 5_250 == sent_at_ms(json.loads(raw))
    assert decode_event(raw, fallback_ts=record.timestamp_ms).at == 5_000
    anonymous = segment_record(b'{"type":"page","anonymousId":"a9","timestamp":"x"}')
    assert anonymous.key == b"a9" and anonymous.timestamp_ms is None


def test_peers_and_passthrough_take_both_formats(realistic, synthetic):
    for record in (realistic.records[3], synthetic.records[3]):
        assert reencode(record.value) == record.value  # compact JSON and msgpack round-trip
        event = decode(record.value)
        assert event["user"].encode() == record.key
        state, output = count_event(event, None)
        assert state[0] == 1
        assert msgpack.unpackb(output)["count"] == 1
    segment = decode(realistic.records[3].value)
    message = json.loads(realistic.records[3].value)
    assert segment == {
        "user": message["userId"],
        "ts": message["timestamp"],
        "id": message["messageId"],
    }


def test_loadgen_segment_record_is_stamped_when_sent(realistic):
    raw = next(r.value for r in realistic.records if b'"type":"track"' in r.value)
    prepared = _prepared_segment(raw, "L0-7", [0, 1, 2])
    now = 1_780_000_000_123
    value = iso_time(now).encode().join(prepared.parts)
    message = json.loads(value)
    assert message["timestamp"] == message["sentAt"] == iso_time(now)
    assert message["messageId"] == "L0-7"
    assert prepared.sent_key == f"{message['userId']}:L0-7"
    event = decode_event(value, fallback_ts=now + 3)
    assert event.at == now + 3  # received (the record time) minus nothing: sent at `now`
    assert event.id == "L0-7"
    assert prepared.partition in (0, 1, 2)


def test_ratio_rows():
    rows = ratio_rows(
        [
            ("passthrough", 40_000.0),
            ("oracular worker", 10_000.0),
            ("Faust agent", None),
            ("Quix Streams", 20_000.0),
        ]
    )
    assert [(r.label, r.to_passthrough, r.to_quix) for r in rows] == [
        ("passthrough", 1.0, 2.0),
        ("oracular worker", 0.25, 0.5),
        ("Quix Streams", 0.5, 1.0),
    ]
    alone = ratio_rows([("oracular worker", 5.0), ("Quix Streams", None)])
    assert [(r.to_passthrough, r.to_quix) for r in alone] == [(None, None)]


def test_each_stream_has_its_own_section_markers():
    from bench.report import BEGIN, END, markers

    assert markers("synthetic") == (BEGIN, END)
    realistic = markers("realistic")
    assert realistic != (BEGIN, END)
    assert all("realistic" in marker for marker in realistic)


def test_ratio_rows_per_cpu_second():
    rows = ratio_rows(
        [
            ("passthrough", 40_000.0, 80_000.0),
            ("oracular worker", 10_000.0, 16_000.0),
            ("Quix Streams", 20_000.0, None),
        ]
    )
    assert [(r.per_cpu, r.per_cpu_to_passthrough) for r in rows] == [
        (80_000.0, 1.0),
        (16_000.0, 0.2),
        (None, None),
    ]


def test_the_report_ratio_table_from_results():
    from bench import report
    from bench.results import Results
    from bench.session import Params

    r = Results(Params(runs=1, peers=("faust", "quix")), stream="realistic")
    r.passthrough = [{"rate": 400.0, "cpu": 0.25}]
    r.pipeline = [{"rate": 100.0, "cpu": 0.5}]
    r.backfill = [{"rate": 90.0, "cpu": float("nan")}]
    r.peers = {"faust": [{"error": "failed"}], "quix": [{"rate": 200.0, "cpu": 0.5}]}
    table = report.ratio_table(r)
    assert table[2:] == [
        "| passthrough | 400 | 1.00 | 2.00 | 1,600 | 1.00 |",
        "| oracular worker | 100 | 0.25 | 0.50 | 200 | 0.12 |",
        "| oracular backfill | 90 | 0.23 | 0.45 | n/a | n/a |",
        "| Quix Streams | 200 | 0.50 | 1.00 | 400 | 0.25 |",
    ]


def test_a_failed_backfill_run_is_reported_not_fatal():
    from bench import report
    from bench.results import Results
    from bench.session import Params
    from bench.throughput import failed_backfill

    error = (
        "b-15-backfill exited (0) before its outputs were complete; log x:\n"
        "backfill b complete: applied=10, predictions=5, episodes=2 in 1.0 s (10 messages/s)"
    )
    row = failed_backfill(error)
    assert "applied=10, predictions=5, episodes=2" in row["ended_by"]
    assert "rate" not in row
    r = Results(Params(runs=2, peers=()), stream="realistic")
    r.passthrough = [{"rate": 400.0, "cpu": 0.25}]
    r.pipeline = [{"rate": 100.0, "cpu": 0.5}]
    r.backfill = [row]
    assert [line.split(" | ")[0] for line in report.ratio_table(r)[2:]] == [
        "| passthrough",
        "| oracular worker",
    ]
    assert "FAILED" in report.backfill_text(r)[0]
    r.backfill.append({"rate": 90.0, "cpu": 0.5, "own_rate": "x", "ended_by": "e", "exit": 0})
    assert report.ratio_table(r)[-1].startswith("| oracular backfill | 90 |")
