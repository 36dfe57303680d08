"""What the chaos run must end with, checked against the input topic and the offline replay.

The accounting. The input topic, read back, is the ground truth: every record is labelled by
the generation (its bytes are unique), never by the product's decoder. An offset holds a good
event, a producer's retry of one (the same id again) or a malformed message, and must be
accounted for exactly once:

- a malformed message is *dead-lettered*: a DLQ record names its (partition, offset) and
  carries its original key and bytes; no output derives from it;
- a good event is *applied*: the final changelog state of its user equals the replay's state of
  that user's good events (which applies each exactly once), the stored last offset of the user
  is the offset of its last good event, the stored count of applied inputs (when the stored
  format has one) equals its number of good events, and when the replay publishes a prediction
  for the event, that prediction id is among the outputs; it is not in the DLQ;
- a retry is *skipped*: its user's applied count and state are those of the good events alone
  (the replay, given the retries too, skips them the same way), and it is not in the DLQ.

A good event that was lost changes its user's state (or at least the inputs count and, when it
is the last, the last offset) and usually removes a prediction id; one applied twice changes
the state and the count; a malformed message applied would add an id and miss from the DLQ.

Outputs: every id the replay publishes is present, no other id is, and every copy of an id is
byte-identical (at-least-once allows duplicates, never differences) and equal to the replay's.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from engine import EngineConfig, serialize
from infra.broker import REPO_ROOT
from schemas.outputs import decode_output
from schemas.stored import decode_stored
from tests.integration.support import FaustWorker, Record
from tests.integration.worker_support import Deployment

from .stream import Message

REPLAY_TIMEOUT_S = 120.0  # `oracular replay` of 50,000 events on a busy 2-core box


@dataclass
class Row:
    """One line of the result table."""

    check: str
    ok: bool
    detail: str
    problems: list[str] = field(default_factory=list)


def table(rows: Sequence[Row]) -> str:
    """The rows as a fixed-width table, then up to 10 problems per failed row."""
    width = max(len(r.check) for r in rows)
    lines = [f"{'check':<{width}}  result  detail", f"{'-' * width}  ------  ------"]
    lines += [f"{r.check:<{width}}  {'ok' if r.ok else 'FAIL':<6}  {r.detail}" for r in rows]
    for r in rows:
        if not r.ok and r.problems:
            lines.append(f"\n{r.check}: {len(r.problems)} problems, e.g.:")
            lines += [f"  {p}" for p in r.problems[:10]]
    return "\n".join(lines)


# --- the input topic, read back ---------------------------------------------------------------


@dataclass
class Input:
    """The input topic as labelled by the generation."""

    at: dict[str, tuple[int, int]]
    """Label (event id or bad:<kind>#n) -> (partition, offset)."""
    good: dict[tuple[int, int], Message]
    bad: dict[tuple[int, int], Message]
    retried: dict[tuple[int, int], Message]
    """Producers' retries: a good event's id again."""
    ends: dict[int, int]
    problems: list[str]


def label_input(
    records: Iterable[Record], generated: Sequence[Message], ends: dict[int, int]
) -> Input:
    """Label every input record; note records not generated, or out of their generated order."""
    by_value = {m.value: m for m in generated}
    rank = {m.value: n for n, m in enumerate(generated)}
    good: dict[tuple[int, int], Message] = {}
    bad: dict[tuple[int, int], Message] = {}
    retried: dict[tuple[int, int], Message] = {}
    at: dict[str, tuple[int, int]] = {}
    problems: list[str] = []
    last_rank: dict[int, int] = {}
    seen: Counter[bytes] = Counter()
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        where = (r.partition, r.offset)
        m = by_value.get(r.value or b"")
        if m is None:
            problems.append(f"{where}: a record the test did not generate")
            continue
        seen[m.value] += 1
        if seen[m.value] > 1:
            problems.append(f"{where}: {m.label} is in the topic twice (producer duplicate)")
        if r.key != m.key or r.timestamp != m.at:
            problems.append(f"{where}: {m.label} has key {r.key!r} / ts {r.timestamp}")
        if rank[m.value] < last_rank.get(r.partition, -1):
            problems.append(f"{where}: {m.label} is out of its generated (time) order")
        last_rank[r.partition] = rank[m.value]
        kind = retried if m.retry is not None else good if m.event is not None else bad
        kind[where] = m
        at[f"{m.label}#{rank[m.value]}" if m.bad else m.label] = where
    for p, end in ends.items():
        have = sorted(o for (q, o) in [*good, *bad, *retried] if q == p)
        if have != list(range(end)):
            problems.append(f"partition {p}: offsets are not 0..{end - 1} ({len(have)} records)")
    return Input(at, good, bad, retried, ends, problems)


async def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        return {tp.partition: end for tp, end in (await consumer.end_offsets(tps)).items()}
    finally:
        await consumer.stop()


# --- the offline replay -----------------------------------------------------------------------


@dataclass
class Replay:
    """What `oracular replay --states` gives for the good events, in their order."""

    messages: dict[str, dict[str, Any]]
    """Prediction and episode id -> message (without the JSON line's "topic")."""
    states: dict[str, bytes]
    dead_letters: list[dict[str, Any]]


def run_replay(config_path: Path, events: Sequence[Message], until: int, workdir: Path) -> Replay:
    """Write the good events as JSON lines and run `oracular replay` on them (a subprocess)."""
    workdir.mkdir(parents=True, exist_ok=True)
    source, out, states = workdir / "events.jsonl", workdir / "out.jsonl", workdir / "states.jsonl"
    with source.open("w") as handle:
        for m in events:
            e = m.event
            assert e is not None
            line: dict[str, Any] = {"id": e.id, "user": e.user, "ts": e.at, "type": e.type}
            if m.retry is not None:
                line["attempt"] = 2  # as sent: a retry of the event, with its id
            if e.name is not None:
                line["name"] = e.name
            if e.intent is not None:
                line["intent"] = e.intent
            handle.write(json.dumps(line) + "\n")
    argv = [sys.executable, "-m", "streams.cli", "replay", str(source), "--config"]
    argv += [str(config_path), "--until", str(until), "--out", str(out), "--states", str(states)]
    # The replay runs while the stream is still produced, its events dated up to minutes
    # ahead: its clock (for the bound on clocks running ahead) is the end of the stream.
    argv += ["--clock", str(until)]
    subprocess.run([*argv, "--quiet"], cwd=REPO_ROOT, check=True, timeout=REPLAY_TIMEOUT_S)
    messages: dict[str, dict[str, Any]] = {}
    dead: list[dict[str, Any]] = []
    for line in out.read_text().splitlines():
        message = json.loads(line)
        topic = message.pop("topic")
        if "dlq" in topic:
            dead.append(message)
        else:
            assert message["id"] not in messages, f"the replay gives id {message['id']} twice"
            messages[message["id"]] = message
    replayed = {}
    for line in states.read_text().splitlines():
        record = json.loads(line)
        replayed[record["user"]] = base64.b64decode(record["state"])
    return Replay(messages, replayed, dead)


# --- the checks -------------------------------------------------------------------------------


def check_produced(inp: Input, generated: Sequence[Message], withheld: Sequence[Message]) -> Row:
    """The topic holds every generated message once, in order (the harness's own check)."""
    missing = len(generated) - len(withheld) - len(inp.good) - len(inp.bad) - len(inp.retried)
    problems = list(inp.problems)
    if missing:
        problems.append(f"{missing} generated messages are not in the topic (send failures)")
    total = sum(inp.ends.values())
    detail = (
        f"{total} records on {len(inp.ends)} partitions: {len(inp.good)} good, "
        f"{len(inp.retried)} retried, {len(inp.bad)} malformed"
    )
    if withheld:
        names = ", ".join(f"{m.label} of {m.event.user}" for m in withheld if m.event)
        detail += f"; withheld on purpose (CHAOS_INJECT=drop): {names}"
    return Row("input topic = the generated stream", not problems, detail, problems)


def check_dead_letters(inp: Input, letters: Sequence[Record], topic: str) -> Row:
    """The DLQ holds exactly the malformed offsets, each with its origin and original bytes."""
    problems = []
    copies: dict[tuple[int, int], list[bytes]] = defaultdict(list)
    for r in letters:
        m = decode_output(r.value or b"")
        where = (m.get("partition"), m.get("offset"))
        copies[where].append(r.value or b"")  # type: ignore[index]
        origin = inp.bad.get(where)  # type: ignore[arg-type]
        if origin is None:
            label = inp.good.get(where)  # type: ignore[arg-type]
            what = f"the good event {label.label}" if label else "no input"
            problems.append(f"{where}: dead letter for {what}: {m.get('error')!r}")
        elif (m.get("topic"), m.get("key"), m.get("value")) != (topic, origin.key, origin.value):
            problems.append(f"{where}: the dead letter does not carry the original message")
    for where, origin in sorted(inp.bad.items()):
        if where not in copies:
            problems.append(f"{where}: malformed ({origin.bad}) but not dead-lettered")
    problems += [f"{w}: {len(c)} copies differ" for w, c in copies.items() if len(set(c)) > 1]
    kinds = Counter(m.bad for m in inp.bad.values())
    dups = len(letters) - len(copies)
    detail = f"{len(copies)} offsets of {len(inp.bad)} malformed ({dups} duplicate copies); " + (
        ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
    )
    return Row("dead letters = the malformed messages", not problems, detail, problems)


def check_retries(inp: Input, stored: dict[str, Any], dlq_offsets: set[Any]) -> Row:
    """Every producer's retry skipped: not dead-lettered, and its user's applied count is
    that of the good events alone (a retry applied again would raise it)."""
    problems = []
    good: Counter[str] = Counter(m.event.user for m in inp.good.values() if m.event)
    for where, m in sorted(inp.retried.items()):
        assert m.event is not None
        user = m.event.user
        if where in dlq_offsets:
            problems.append(f"{where}: the retry of {m.event.id} was dead-lettered")
        inputs = getattr(stored.get(user), "inputs", None)
        if inputs is not None and inputs != good[user]:
            problems.append(
                f"{where}: user {user} applied {inputs} inputs for {good[user]} good events "
                f"(the retry of {m.event.id}, {m.retry}, counted again?)"
            )
    kinds = Counter(m.retry for m in inp.retried.values())
    detail = (
        f"{len(inp.retried)} retries ({kinds['once']} at once, {kinds['later']} seconds later) "
        f"of {len({m.event.user for m in inp.retried.values() if m.event})} users: "
        "none applied again or dead-lettered"
    )
    return Row("retried events applied once", not problems and bool(inp.retried), detail, problems)


def changelog_users(records: Iterable[Record], config: EngineConfig) -> dict[str, Any]:
    """User -> decoded StoredUser of the last changelog value of its key."""
    last: dict[bytes, bytes] = {}
    for r in records:
        if r.value is None:
            last.pop(r.key or b"", None)
        else:
            last[r.key or b""] = r.value
    return {k.decode(): decode_stored(v, config) for k, v in last.items()}


def state_diff(actual: bytes, expected: bytes) -> str:
    """Where two serialized engine states differ: the top-level fields of their records."""
    a, b = msgpack.unpackb(actual), msgpack.unpackb(expected)
    if not (isinstance(a, list) and isinstance(b, list)):
        return "not comparable"
    fields = [str(n) for n in range(max(len(a), len(b))) if a[n : n + 1] != b[n : n + 1]]
    if not fields:
        return "equal"
    first = int(fields[0])
    return f"record fields {', '.join(fields)} differ ({a[first]!r:.80} vs {b[first]!r:.80})"


def check_changelog_order(records: Iterable[Record], config: EngineConfig) -> Row:
    """No user's last changelog record is older than an earlier one of that user.

    A redelivery or a timer close rewrites the same input offset; a smaller offset (or input
    count) after a larger one is a stale state written after a newer one (a worker that was
    frozen sending what it had pending). While a newer record follows it, it is harmless
    (restores skip older records; compaction keeps the last): counted in the detail. As a
    user's last record it is what compaction keeps and the next owner restores: a failure,
    even where the final-state row has not caught it (the replay could agree by chance).
    """
    high: dict[bytes, tuple[int, int, int]] = {}  # user -> (offset, last offset, inputs)
    stale: dict[bytes, str] = {}
    superseded = 0
    count = 0
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        if r.value is None:
            continue
        count += 1
        key = r.key or b""
        s = decode_stored(r.value, config)
        now = (r.offset, s.last_offset, getattr(s, "inputs", None) or 0)
        best = high.get(key)
        if best is not None and (now[1] < best[1] or now[2] < best[2]):
            stale[key] = (
                f"user {key.decode()}: changelog {r.partition}/{r.offset} stores last offset "
                f"{now[1]} ({now[2]} inputs) after {r.partition}/{best[0]} stored {best[1]} "
                f"({best[2]} inputs), and nothing newer follows"
            )
            continue
        if key in stale:
            superseded += 1
            del stale[key]
        high[key] = now
    problems = sorted(stale.values())
    detail = (
        f"{count} records of {len(high)} users; stale writes: {len(problems)} still last of their "
        f"user, {superseded} superseded later"
    )
    return Row("changelog never goes backwards", not problems, detail, problems)


def check_states(stored: dict[str, Any], replay: Replay) -> Row:
    """Each user's last changelog state equals the replay's final state."""
    want = replay.states
    problems = [f"user {u}: no state in the changelog" for u in sorted(set(want) - set(stored))]
    problems += [f"user {u}: not in the replay" for u in sorted(set(stored) - set(want))]
    equal = 0
    for user in sorted(set(stored) & set(want)):
        got = serialize(stored[user].state, include_config=False)
        if got == want[user]:
            equal += 1
        else:
            problems.append(f"user {user}: state differs: {state_diff(got, want[user])}")
    return Row(
        "final states = replay --states",
        not problems,
        f"{equal} of {len(want)} users equal",
        problems,
    )


def check_accounting(
    inp: Input,
    stored: dict[str, Any],
    replay: Replay,
    seen_ids: set[str],
    dlq_offsets: set[Any],
    when: Callable[[int], float],
) -> Row:
    """Every offset applied or dead-lettered, exactly once (see the module's docs).

    `when` maps a message's time to seconds since the run began, to place the offsets found
    unaccounted on the fault log's time line.
    """
    problems: list[str] = []
    unaccounted: list[tuple[tuple[int, int], Message]] = []
    by_user: dict[str, list[tuple[tuple[int, int], Message]]] = defaultdict(list)
    for where, m in sorted(inp.good.items()):
        assert m.event is not None
        by_user[m.event.user].append((where, m))
    evidence: Counter[str] = Counter()
    for user, items in by_user.items():
        problems += _user_accounting(user, items, stored.get(user), replay)
        for where, m in items:
            pid = f"{user}:{m.label}"
            if where in dlq_offsets:
                problems.append(f"{where}: good event {m.label} dead-lettered")
            elif pid in replay.messages:
                evidence["prediction id"] += 1
                if pid not in seen_ids:
                    problems.append(
                        f"{where}: {m.label} of {user} not applied: no prediction {pid}"
                    )
                    unaccounted.append((where, m))
            else:
                evidence["state only"] += 1
    for where, m in sorted(inp.bad.items()):
        if where not in dlq_offsets:
            problems.append(f"{where}: malformed ({m.bad}) neither applied nor dead-lettered")
            unaccounted.append((where, m))
    total = len(inp.good) + len(inp.bad)
    detail = (
        f"{total} offsets: {len(inp.good)} applied ({evidence['prediction id']} with their "
        f"prediction id, {evidence['state only']} by state, last offset and count), "
        f"{len(inp.bad)} dead-lettered"
    )
    if unaccounted:
        spans = _spans(sorted(unaccounted, key=lambda item: item[0]), when)
        problems.insert(0, f"offsets unaccounted (partition: offsets, due at): {spans}")
    return Row("every input offset accounted once", not problems, detail, problems)


def _spans(items: list[tuple[tuple[int, int], Message]], when: Callable[[int], float]) -> str:
    """Offsets grouped in runs no more than 50 apart: "p0 102-154 (9.1-12.3 s)"."""
    spans: list[list[Any]] = []
    for (p, o), m in items:
        if spans and spans[-1][0] == p and o - spans[-1][2] <= 50:
            spans[-1][2], spans[-1][4] = o, m.at
            spans[-1][5] += 1
        else:
            spans.append([p, o, o, m.at, m.at, 1])
    return "; ".join(
        f"p{p} {a}-{b} ({n} found, due {when(t0):.1f}-{when(t1):.1f} s)"
        for p, a, b, t0, t1, n in spans
    )


def dead_lettered(letters: Iterable[Record]) -> set[tuple[Any, Any]]:
    """The (partition, offset) every dead letter names."""
    found = set()
    for r in letters:
        m = decode_output(r.value or b"")
        found.add((m.get("partition"), m.get("offset")))
    return found


def all_problems(rows: Sequence[Row]) -> str:
    """Every problem of every failed row (the table shows ten)."""
    parts = []
    for r in rows:
        if r.problems:
            parts.append(f"{r.check}: {len(r.problems)} problems")
            parts += [f"  {p}" for p in r.problems]
    return "\n".join(parts)


def dump(
    workdir: Path,
    outputs: Iterable[Record],
    stored: dict[str, Any],
    changelog: Iterable[Record],
    config: EngineConfig,
) -> None:
    """Keep what a post-mortem needs: every output record, every changelog record's header
    (where, when, whose, which input offset and count), every user's last stored header."""
    with (workdir / "changelog.jsonl").open("w") as handle:
        for r in changelog:
            s = decode_stored(r.value, config) if r.value is not None else None
            line = {"partition": r.partition, "offset": r.offset, "timestamp": r.timestamp}
            line["user"] = (r.key or b"").decode(errors="replace")
            line["last_offset"] = getattr(s, "last_offset", None)
            line["inputs"] = getattr(s, "inputs", None)
            handle.write(json.dumps(line) + "\n")
    with (workdir / "outputs.jsonl").open("w") as handle:
        for r in outputs:
            where = {"partition": r.partition, "offset": r.offset, "timestamp": r.timestamp}
            handle.write(json.dumps({**where, **decode_output(r.value or b"")}, default=repr))
            handle.write("\n")
    with (workdir / "stored.jsonl").open("w") as handle:
        for user, s in sorted(stored.items()):
            header = {k: getattr(s, k, None) for k in ("partition", "last_offset", "inputs")}
            handle.write(
                json.dumps({"user": user, **header, "episodes": getattr(s, "episodes", None)})
            )
            handle.write("\n")


def _user_accounting(
    user: str, items: list[tuple[tuple[int, int], Message]], stored: Any, replay: Replay
) -> list[str]:
    """A user's stored state: the replay's, its last offset the last event's, the count equal."""
    if stored is None:
        return [f"user {user}: {len(items)} good events, no stored state"]
    problems = []
    (partition, last), label = items[-1][0], items[-1][1].label
    if stored.last_offset != last:
        problems.append(
            f"user {user}: last applied offset {stored.last_offset}, "
            f"its last event {label} is at {partition}/{last}"
        )
    inputs = getattr(stored, "inputs", None)  # stored format 2 counts the inputs applied
    if inputs is not None and inputs != len(items):
        problems.append(f"user {user}: {inputs} inputs applied, {len(items)} in the topic")
    if serialize(stored.state, include_config=False) != replay.states.get(user):
        problems.append(f"user {user}: state differs from the replay of its {len(items)} events")
    return problems


def check_outputs(records: Iterable[Record], replay: Replay) -> tuple[Row, set[str]]:
    """Every replay id present, no other id, every copy byte-identical and equal to the replay."""
    copies: dict[str, set[tuple[bytes | None, bytes]]] = defaultdict(set)
    count = 0
    for r in records:
        count += 1
        copies[decode_output(r.value or b"")["id"]].add((r.key, r.value or b""))
    problems = [f"missing {i}" for i in sorted(set(replay.messages) - set(copies))]
    problems += [f"unexpected id {i}" for i in sorted(set(copies) - set(replay.messages))]
    for ident, variants in copies.items():
        if len(variants) > 1:
            problems.append(f"{ident}: {len(variants)} different copies")
        want = replay.messages.get(ident)
        for key, value in variants:
            got = decode_output(value)
            if want is not None and got != want:
                problems.append(f"{ident}: got {got}, replay gives {want}")
            if key != str(got.get("user")).encode():
                problems.append(f"{ident}: keyed {key!r}, not by its user")
    detail = (
        f"{len(set(copies) & set(replay.messages))} of {len(replay.messages)} ids "
        f"({count} records, {count - len(copies)} duplicate copies)"
    )
    return Row("outputs = replay (ids, bytes)", not problems, detail, problems), set(copies)


async def committed_vs_end(dep: Deployment, partitions: int) -> dict[int, tuple[int | None, int]]:
    """Input partition -> (committed offset of the app's group, end offset)."""
    topic = dep.topics.events.name
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer = AIOKafkaConsumer(bootstrap_servers=dep.bootstrap, group_id=None)
    admin = AIOKafkaAdminClient(bootstrap_servers=dep.bootstrap)
    await consumer.start()
    await admin.start()
    try:
        ends = await consumer.end_offsets(tps)
        committed = await admin.list_consumer_group_offsets(dep.app_id)
        return {
            tp.partition: (committed[tp].offset if tp in committed else None, end)
            for tp, end in ends.items()
        }
    finally:
        await admin.close()
        await consumer.stop()


def check_committed(offsets: dict[int, tuple[int | None, int]]) -> Row:
    problems = [f"partition {p}: committed {c}, end {e}" for p, (c, e) in offsets.items() if c != e]
    detail = ", ".join(f"p{p} {c}/{e}" for p, (c, e) in sorted(offsets.items()))
    return Row("committed = end offset", not problems, detail, problems)


async def group_state(dep: Deployment) -> tuple[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=dep.bootstrap)
    await admin.start()
    try:
        [response] = await admin.describe_consumer_groups([dep.app_id])
        group = response.groups[0]
        return group[2], len(group[5])
    finally:
        await admin.close()


SUMMARY = re.compile(r"oracular summary: .*\blag=(\w+)")


def worker_lags(workers: Sequence[FaustWorker], since: dict[int, int]) -> dict[int, str | None]:
    """Worker -> the lag of its last summary logged after `since` (log size), None if none."""
    lags: dict[int, str | None] = {}
    for n, worker in enumerate(workers):
        if not worker.running:
            continue
        text = worker.log_text()[since.get(n, 0) :]
        found = SUMMARY.findall(text)
        lags[n] = found[-1] if found else None
    return lags


def check_workers(
    lags: dict[int, str | None], group: tuple[str, int], fleet_size: int, exits: list[str]
) -> Row:
    problems = [f"w{n}: last summary lag={lag}" for n, lag in lags.items() if lag != "0"]
    state, members = group
    if state != "Stable" or members != len(lags):
        problems.append(f"group {state} with {members} members, {len(lags)} workers alive")
    problems += exits
    detail = f"{len(lags)} of {fleet_size} alive, group {state}/{members}, lags " + ", ".join(
        f"w{n}={lag}" for n, lag in sorted(lags.items())
    )
    return Row("no worker stuck (lag 0, group stable)", not problems, detail, problems)


async def poll(interval_s: float, deadline: float) -> bool:
    """Sleep `interval_s` unless past `deadline`; False when the deadline has passed."""
    if time.monotonic() >= deadline:
        return False
    await asyncio.sleep(interval_s)
    return True
