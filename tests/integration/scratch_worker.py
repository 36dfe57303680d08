import sys
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient

from schemas.outputs import decode_output
from schemas.stored import decode_stored

from .worker_support import *
from . import worker_support
from .test_worker import FAST_TICK_S, DAY_MS

def debug_worker(faust_worker, dep, **env):
    argv = [sys.executable, "/tmp/patched_worker.py", *dep.argv()[3:]]
    return faust_worker("streams.app", app_id=dep.app_id, env=dep.env(**env), argv=argv)

async def test_two(kafka, request, faust_worker, tmp_path):
    dep = deployment(kafka, request.node.name, settings={"ORACULAR_GRACE_MS": str(HUGE_GRACE_MS)})
    events = generate_stream(dep.config, events=5_000, users=200, seed=13)
    marks = sentinels(events[-1].at + 30 * DAY_MS)
    expected = expected_outputs(dep.config, events + marks, until=marks[0].at)
    await dep.create_topics()
    first = debug_worker(faust_worker, dep, ORACULAR_TICK_INTERVAL_S=FAST_TICK_S)
    first.start()
    split = len(events) * 2 // 5
    meta = await produce_many(kafka, dep.topics.events.name, [encode_event(e) for e in events[:split]])
    await wait_committed(dep)
    second = relocate(debug_worker(faust_worker, dep, ORACULAR_TICK_INTERVAL_S=FAST_TICK_S), tmp_path / "second")
    second.start()
    await wait_group_stable(dep, members=2)
    meta += await produce_many(kafka, dep.topics.events.name, [encode_event(e) for e in events[split:] + marks])
    where = {e.id: (m.partition, m.offset, e.user) for e, m in zip(events + marks, meta)}
    try:
        records = await wait_for_outputs(dep, expected, timeout_s=40)
        assert_outputs_equal(records, expected)
        await assert_states_equal(dep, expected)
        print("PASS")
    except AssertionError as exc:
        print("FAIL", str(exc)[:500])
        outs = await read_all(kafka, dep.topics.predictions.name) + await read_all(kafka, dep.topics.episodes.name)
        seen = {decode_output(r.value)["id"] for r in outs}
        missing = sorted(set(expected.messages) - seen)
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka); await admin.start()
        print("committed", {tp.partition: o.offset for tp, o in (await admin.list_consumer_group_offsets(dep.app_id)).items() if tp.topic == dep.topics.events.name})
        await admin.close()
        cl = await read_all(kafka, dep.changelog)
        last = {}
        for r in cl:
            last[r.key.decode()] = decode_stored(r.value, dep.config)
        for ident in missing:
            user, ref = ident.split(":")
            print("missing", ident, where.get(ref), "stored last_offset", last[user].last_offset if user in last else None)
    first.stop(); second.stop()
    print(first.log_path, second.log_path)
