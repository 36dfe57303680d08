"""`oracular replay` and `oracular check-config` end to end, in-process."""

from __future__ import annotations

import io
import json
from pathlib import Path

import msgpack
import pytest

from engine import Event, deserialize, replay
from schemas.config import load_config
from schemas.files import read_lines
from streams.cli import main, offline
from streams.runtime.progress import Progress
from streams.tools import replay as replay_tool
from streams.tools.replay import OfflineRun

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "oracular.yaml"
TS = 1_767_261_600_000
MIN = 60_000

EVENTS = [
    {"id": "e1", "user": "u1", "name": "pricing.viewed", "ts": TS},
    {"id": "e2", "user": "u1", "name": "limit.hit", "ts": TS + MIN},
    {"id": "e3", "user": "u2", "name": "cancel.viewed", "ts": TS + MIN},
    {"id": "e4", "user": "u1", "type": "revealed", "intent": "upgrade", "ts": TS + 2 * MIN},
    {"id": "e5", "user": "u1", "name": "upgrade.completed", "ts": TS + 40 * MIN},
    {"id": "e6", "user": "u2", "type": "end", "ts": TS + 3 * MIN},
]


def _run(tmp_path, lines, *extra):
    events = tmp_path / "events.jsonl"
    events.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    code = main(
        ["replay", str(events), "--config", str(CONFIG), "--out", str(out), "--quiet", *extra]
    )
    return code, [json.loads(line) for line in out.read_text().splitlines()]


def test_replay_writes_the_engine_outputs_with_topics(tmp_path):
    """Outputs equal engine.replay of the same events, as messages with deterministic ids."""
    code, messages = _run(tmp_path, [json.dumps(e) for e in EVENTS])
    assert code == 0
    by_topic = {}
    for message in messages:
        by_topic.setdefault(message["topic"], []).append(message)
    predictions = {m["id"] for m in by_topic["oracular.predictions"]}
    assert predictions == {"u1:e1", "u1:e2", "u2:e3", "u1:e4", "u1:e5"}
    episodes = by_topic["oracular.episodes"]
    # u1's first episode timed out 30m after its last event (a reveal is a command, not an
    # event: it does not extend the episode); u2 signed out; u1's second closes at the end.
    assert [(m["id"], m["reason"], m["closed_at"]) for m in episodes] == [
        (f"u1:{TS}/1", "timeout", TS + MIN + 30 * MIN),
        (f"u2:{TS + MIN}/1", "end", TS + 3 * MIN),
        (f"u1:{TS + 40 * MIN}/2", "timeout", TS + 70 * MIN),
    ]
    assert episodes[0]["intents"]["upgrade"] == {
        "verdict": "held",
        "signals": ["limit.hit", "pricing.viewed"],
    }
    engine_result = replay(
        load_config(CONFIG),
        [
            Event(
                e["user"],
                e["ts"],
                name=e.get("name"),
                type=e.get("type", "event"),
                intent=e.get("intent"),
                id=e["id"],
            )
            for e in EVENTS
        ],
    )
    expected = {
        f"u:{s.event.id}": {k: v.p for k, v in s.predictions.items()}
        for s in engine_result.steps
        if s.predictions
    }
    got = {
        f"u:{m['id'].split(':')[1]}": {k: v["p"] for k, v in m["intents"].items()}
        for m in by_topic["oracular.predictions"]
    }
    assert got == expected
    upgrade = next(m for m in messages if m["id"] == "u1:e5")["intents"]["upgrade"]
    assert upgrade["p"] == 0.15 and upgrade["before_outcome"]["p"] > 0.15


def test_bad_lines_are_dead_lettered_with_line_numbers_and_the_rest_applies(tmp_path, capsys):
    """Nothing is lost: bad lines become DLQ records with the reason; good ones still apply."""
    lines = [
        json.dumps(EVENTS[0]),
        "garbage",
        json.dumps({"user": "u1", "ts": TS}),
        json.dumps({"type": "identify", "userId": "u1"}),
        json.dumps({"user": "u1", "type": "revealed", "intent": "nope", "ts": TS}),
        json.dumps(EVENTS[1]),
    ]
    events = tmp_path / "events.jsonl"
    events.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["replay", str(events), "--config", str(CONFIG), "--out", str(out)]) == 0
    messages = [json.loads(line) for line in out.read_text().splitlines()]
    dlq = [m for m in messages if m["topic"] == "oracular.events.dlq"]
    assert [m["error"].split(":")[0] for m in dlq] == ["line 2", "line 3", "unknown intent 'nope'"]
    assert dlq[0]["value"] == "garbage"
    assert "field 'name' is missing" in dlq[1]["error"]
    summary = capsys.readouterr().err
    assert "applied 2" in summary and "ignored 1" in summary and "dead-lettered 3" in summary


def test_msgpack_input_gives_the_same_outputs_as_jsonl(tmp_path):
    """A msgpack stream of the same messages replays identically."""
    _, from_jsonl = _run(tmp_path, [json.dumps(e) for e in EVENTS])
    packed = tmp_path / "events.msgpack"
    packed.write_bytes(b"".join(msgpack.packb(e) for e in EVENTS))
    out = tmp_path / "out2.jsonl"
    assert main(["replay", str(packed), "--config", str(CONFIG), "--out", str(out), "--quiet"]) == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == from_jsonl


def test_until_closes_only_what_is_due_and_states_are_written(tmp_path):
    """--until is the final watermark; --states writes each user's final state."""
    states = tmp_path / "states.jsonl"
    _, messages = _run(
        tmp_path,
        [json.dumps(e) for e in EVENTS],
        "--until",
        str(TS + 69 * MIN),
        "--states",
        str(states),
    )
    assert [m["id"] for m in messages if m["topic"] == "oracular.episodes"] == [
        f"u1:{TS}/1",
        f"u2:{TS + MIN}/1",
    ]
    import base64

    config = load_config(CONFIG)
    users = {}
    for line in states.read_text().splitlines():
        record = json.loads(line)
        users[record["user"]] = deserialize(base64.b64decode(record["state"]), config=config)
    assert users["u1"].episode.started_at == TS + 40 * MIN  # still open: not due by --until


def test_usage_errors_are_one_line_not_tracebacks(tmp_path, capsys):
    """A bad config, a missing file and a bad --until each give a message and exit 2."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("intents: {x: {signals: {a: heavy}}}\n")
    assert main(["replay", "nope.jsonl", "--config", str(bad)]) == 2
    assert "intents.x.signals.a: weight must be a finite number" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "nope.jsonl"), "--config", str(CONFIG)]) == 2
    assert "no such file" in capsys.readouterr().err
    events = tmp_path / "e.jsonl"
    events.write_text("")
    assert main(["replay", str(events), "--config", str(CONFIG), "--until", "later"]) == 2
    assert "must be epoch milliseconds or an ISO-8601 time" in capsys.readouterr().err


def test_check_config(capsys):
    """check-config summarises a valid config."""
    assert main(["check-config", str(CONFIG)]) == 0
    assert "upgrade: 4 signals, outcome upgrade.completed" in capsys.readouterr().out


def test_progress_counts_every_line_though_it_is_advanced_per_chunk(tmp_path, capsys, monkeypatch):
    """Lines are applied a chunk of `_CHUNK_LINES` at a time, the progress line advanced per
    chunk: its final count is every line, and the outputs do not depend on the chunk."""
    lines = [json.dumps({**EVENTS[0], "id": f"e{n}", "ts": TS + n}) for n in range(10)]
    lines[3:3] = ["garbage", lines[2], json.dumps({"type": "identify", "userId": "u1"})]
    events = tmp_path / "events.jsonl"
    events.write_text("\n".join(lines) + "\n")
    written = []
    for chunk in (4, 1, 256):
        monkeypatch.setattr(offline, "_CHUNK_LINES", chunk)
        out = tmp_path / f"out-{chunk}.jsonl"
        assert main(["replay", str(events), "--config", str(CONFIG), "--out", str(out)]) == 0
        assert "replay: 13 events" in capsys.readouterr().err
        written.append(out.read_bytes())
    assert written[0] == written[1] == written[2]
    topics = [json.loads(line)["topic"] for line in written[0].splitlines()]
    assert topics == [
        *["oracular.predictions"] * 3,
        "oracular.events.dlq",  # "garbage", between the predictions of its neighbours
        *["oracular.predictions"] * 7,  # (the repeated line is a duplicate id: no output)
        "oracular.episodes",
    ]


def test_a_pipe_is_applied_a_line_at_a_time():
    """From a pipe, each line's outputs are written before the next line is read."""
    config = load_config(CONFIG)
    text = "".join(json.dumps({**EVENTS[0], "id": f"e{n}", "ts": TS + n}) + "\n" for n in range(5))
    out = io.StringIO()
    seen = []

    def lines():
        for line in read_lines(io.BytesIO(text.encode()), "jsonl"):
            seen.append(len(out.getvalue().splitlines()))  # outputs written before this line
            yield line

    class Pipe(io.BytesIO):
        def seekable(self) -> bool:
            return False

    progress = offline._ProgressOf(Pipe(), Progress("replay", enabled=False))
    offline._feed(OfflineRun(config, "-", TS), lines(), out, progress)
    assert seen == [0, 1, 2, 3, 4]


def test_feed_lines_gives_what_feed_line_gives_across_batches(monkeypatch):
    """`OfflineRun.feed_lines` (the chunks `oracular replay` applies) and `feed_line` per line
    give the same outputs in the same order, the same states and counters, with batches
    (`BATCH_LINES`) ending inside a chunk."""
    monkeypatch.setattr(replay_tool, "BATCH_LINES", 3)
    config = load_config(CONFIG)
    raw = [json.dumps({**EVENTS[n % 2], "id": f"e{n}", "ts": TS + n * MIN}) for n in range(11)]
    raw[4:4] = ["garbage", raw[2], json.dumps({"type": "identify", "userId": "u1"})]
    text = ("\n".join(raw) + "\n").encode()
    one, chunks = OfflineRun(config, "f", TS), OfflineRun(config, "f", TS)
    by_line = [o for line in read_lines(io.BytesIO(text), "jsonl") for o in one.feed_line(line)]
    lines = list(read_lines(io.BytesIO(text), "jsonl"))
    by_chunk = [o for at in range(0, len(lines), 4) for o in chunks.feed_lines(lines[at : at + 4])]
    by_line += one.finish()
    by_chunk += chunks.finish()
    assert [(o.role, o.key, o.message) for o in by_chunk] == [
        (o.role, o.key, o.message) for o in by_line
    ]
    assert len(by_line) > 10 and any(o.role == "dlq" for o in by_line)
    assert chunks.stored() == one.stored() and chunks.counts == one.counts


def test_with_a_state_ttl_the_summary_counts_expired_users_and_states_keep_the_active(
    tmp_path, capsys
):
    """`stateTtl`: users quiet for longer than it by `--until` are not in `--states`, and the
    summary says how many expired."""
    config = tmp_path / "ttl.yaml"
    config.write_text(
        CONFIG.read_text().replace("episodeTimeout: 30m", "episodeTimeout: 30m\nstateTtl: 15d")
    )
    late = {"id": "e9", "user": "u3", "name": "pricing.viewed", "ts": TS + 20 * 24 * 60 * MIN}
    events = tmp_path / "events.jsonl"
    events.write_text("\n".join(json.dumps(e) for e in [*EVENTS, late]) + "\n")
    states = tmp_path / "states.jsonl"
    code = main(
        [
            "replay",
            str(events),
            "--config",
            str(config),
            "--out",
            str(tmp_path / "out.jsonl"),
            "--until",
            str(late["ts"] + MIN),
            "--states",
            str(states),
        ]
    )
    assert code == 0
    assert [json.loads(line)["user"] for line in states.read_text().splitlines()] == ["u3"]
    assert "expired 2, users 1 " in capsys.readouterr().err


def test_replay_beyond_its_memory_writes_users_to_disk_and_gives_the_same_files(tmp_path, capsys):
    """`--memory 1` holds 128 users decoded: a stream of 600 goes over the disk, and the
    outputs and states files are byte for byte the ones a run in memory writes."""
    from bench.synthetic import clickstream
    from schemas.events import encode_event

    events = tmp_path / "events.jsonl"
    stream = clickstream(load_config(CONFIG), 6_000, 600, 3)
    events.write_bytes(b"".join(encode_event(e, as_json=True) + b"\n" for e in stream))
    spill = tmp_path / "spill"
    spill.mkdir()
    files = {}
    for memory in ("512", "1"):
        out, states = tmp_path / f"out-{memory}.jsonl", tmp_path / f"states-{memory}.jsonl"
        argv = ["replay", str(events), "--config", str(CONFIG), "--out", str(out)]
        argv += ["--states", str(states), "--memory", memory, "--spill-dir", str(spill)]
        assert main(argv) == 0
        files[memory] = (out.read_bytes(), states.read_bytes())
        summary = capsys.readouterr().err
        assert ("written to disk" in summary) == (memory == "1"), summary
    assert files["1"] == files["512"]
    assert len(files["1"][1].splitlines()) == 600
    assert not any(spill.iterdir())  # removed at the end


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--memory", "0"], "--memory 0: give at least 1 MiB"),
        (["--spill-dir", "/nonexistent/spill"], "--spill-dir /nonexistent/spill is not a"),
    ],
)
def test_replay_memory_flags_are_checked_before_it_runs(tmp_path, capsys, flags, problem):
    events = tmp_path / "events.jsonl"
    events.write_text(json.dumps(EVENTS[0]) + "\n")
    code = main(["replay", str(events), "--config", str(CONFIG), "--out", "-", *flags])
    assert code != 0
    assert problem in capsys.readouterr().err
