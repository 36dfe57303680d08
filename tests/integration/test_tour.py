"""The tour's commands against the real broker: `make run` (infra/run.sh) that loses its worker
or is interrupted, `produce` onto a topic that already has data, `topics list/delete`, and
`reset` of an id that does not exist (README "A 5-minute tour", docs/tools.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.broker import REPO_ROOT
from streams.settings import product_topics
from streams.settings.exits import EXIT_NOTHING, EXIT_REFUSED
from streams.tools.admin import ensure_topics_async
from tests.cli import run_oracular

from .test_tool_errors import _env as tool_env

pytestmark = pytest.mark.integration

TS = 1_767_261_600_000
COMMAND_TIMEOUT_S = 60.0
RUN_START_TIMEOUT_S = 240.0  # run.sh: the worker starts, joins, creates its changelog: 2 busy cores
RUN_STOP_TIMEOUT_S = 90.0


def _env(kafka: str, prefix: str, tmp_path: Path) -> dict[str, str]:
    """test_tool_errors' environment, with the prefix as the app id too (a run's names)."""
    return {**tool_env(kafka, prefix, tmp_path), "ORACULAR_APP_ID": prefix}


def _events(tmp_path: Path, n: int = 12) -> Path:
    path = tmp_path / "events.jsonl"
    rows = [{"user": f"u{i % 3}", "name": "pricing.viewed", "ts": TS + i * 1000} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_produce_refuses_an_input_topic_that_already_holds_data_without_force(
    kafka, name, tmp_path
):
    prefix = name("p")
    env = _env(kafka, prefix, tmp_path)
    env.pop("ORACULAR_TOPIC_PREFIX")  # --topic-prefix instead
    asyncio.run(
        ensure_topics_async(kafka, list(product_topics({**env, "ORACULAR_TOPIC_PREFIX": prefix})))
    )
    events = _events(tmp_path)
    first, _ = run_oracular(
        "produce", str(events), "--topic-prefix", prefix, env=env, timeout=COMMAND_TIMEOUT_S
    )
    assert first.returncode == 0, first.stderr
    assert "warning" not in first.stderr
    assert (
        first.stderr.splitlines()[-1]
        == f"produce: 12 events to {prefix}.events on {kafka} (0 skipped)"
    )
    again, _ = run_oracular(
        "produce",
        str(events),
        "--now",
        "--topic-prefix",
        prefix,
        env=env,
        timeout=COMMAND_TIMEOUT_S,
    )
    assert again.returncode == 1, again.stderr
    [warning] = again.stderr.splitlines()
    assert warning.startswith(f"oracular produce: {prefix}.events already holds 12 messages")
    assert "nothing sent" in warning and "--force" in warning
    assert "`oracular reset APP_ID` (the worker's app id)" in warning
    forced, _ = run_oracular(
        "produce",
        str(events),
        "--force",
        "--topic-prefix",
        prefix,
        env=env,
        timeout=COMMAND_TIMEOUT_S,
    )
    assert forced.returncode == 0, forced.stderr
    assert forced.stderr.splitlines()[-1].startswith(f"produce: 12 events to {prefix}.events")
    assert f"`oracular topics delete {prefix}`" in warning


def test_topics_list_and_delete_one_run(kafka, name, tmp_path):
    prefix = name("run")
    env = _env(kafka, prefix, tmp_path)
    asyncio.run(ensure_topics_async(kafka, list(product_topics(env))))
    produced, _ = run_oracular(
        "produce", str(_events(tmp_path, 5)), "--quiet", env=env, timeout=COMMAND_TIMEOUT_S
    )
    assert produced.returncode == 0, produced.stderr

    listed, _ = run_oracular("topics", "list", env=env, timeout=COMMAND_TIMEOUT_S)
    assert listed.returncode == 0, listed.stderr
    assert f"{prefix}: 5 topics, 5 messages" in listed.stdout.splitlines()
    assert any(
        line.split()[:1] == [f"{prefix}.events"] and "5 messages" in line
        for line in listed.stdout.splitlines()
    )

    dry, _ = run_oracular(
        "topics", "delete", prefix, "--dry-run", env=env, timeout=COMMAND_TIMEOUT_S
    )
    assert dry.returncode == 0, dry.stderr
    assert f"  topic {prefix}.events" in dry.stdout.splitlines()
    assert dry.stdout.splitlines()[-1] == "dry run: 5 topic(s) would be deleted"

    refused, _ = run_oracular("topics", "delete", "oracular", env=env, timeout=COMMAND_TIMEOUT_S)
    assert refused.returncode == EXIT_REFUSED
    [line] = refused.stderr.splitlines()
    assert line.startswith("oracular topics: 'oracular' is the default prefix")
    assert line.endswith("— add --yes to delete them, or --dry-run to see them")

    deleted, _ = run_oracular("topics", "delete", prefix, env=env, timeout=COMMAND_TIMEOUT_S)
    assert deleted.returncode == 0, deleted.stderr
    assert "deleted 5 topic(s)" in deleted.stdout

    mistyped, _ = run_oracular("topics", "delete", prefix, env=env, timeout=COMMAND_TIMEOUT_S)
    assert mistyped.returncode == EXIT_NOTHING
    [line] = mistyped.stderr.splitlines()
    assert line.startswith(f"oracular topics: no topic belongs to '{prefix}'")
    assert line.endswith("— `oracular topics list` shows the runs")


def test_reset_of_an_unknown_id_exits_1_and_suggests_the_closest_run(kafka, name, tmp_path):
    prefix = name("run")
    env = _env(kafka, prefix, tmp_path)
    asyncio.run(ensure_topics_async(kafka, list(product_topics(env))))
    typo = prefix[:-1] + ("x" if prefix[-1] != "x" else "y")
    done, _ = run_oracular("reset", typo, env=env, timeout=COMMAND_TIMEOUT_S)
    assert done.returncode == EXIT_NOTHING, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"oracular reset: nothing belongs to app id '{typo}'")
    assert f"(did you mean {prefix}?)" in line
    assert done.stdout == ""  # no "deleted"


def _default_sigint() -> None:
    """In the child, before it execs: SIGINT as a terminal delivers it. A test run started in
    the background (`cmd &` in a script, `nohup`) passes SIGINT on ignored, and a shell that
    starts with it ignored can never trap it: the tests that send it must not depend on how
    their own run was started."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class _RunSh:
    """infra/run.sh (`make run`) in its own process group, its output collected."""

    def __init__(self, kafka: str, run_id: str, tmp_path: Path) -> None:
        env = _env(kafka, run_id, tmp_path)
        env.update(
            RUN_ID=run_id,
            SAMPLE=str(_events(tmp_path, 30)),
            LOG=str(tmp_path / "worker.log"),
            ORACULAR_BROKER=kafka,
        )
        self.log = tmp_path / "worker.log"
        self.process = subprocess.Popen(
            ["bash", str(REPO_ROOT / "infra" / "run.sh")],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            preexec_fn=_default_sigint,  # noqa: PLW1509 (no threads in the child before exec)
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if text in line:
                    return line
            if self.process.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.2)
        output = "\n".join(self.lines[-40:])
        raise AssertionError(f"run.sh never printed {text!r}; its output:\n{output}")

    def finish(self, timeout: float) -> int:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            ps = subprocess.run(
                ["ps", "-o", "pid,stat,etime,args", "--sid", str(self.process.pid)],
                capture_output=True,
                text=True,
                check=False,
            ).stdout
            log = self.log.read_text(errors="replace").splitlines()[-30:]
            output = "\n".join(self.lines[-40:])
            raise AssertionError(
                f"run.sh did not end within {timeout:.0f} s; its processes:\n{ps}\n"
                f"its output:\n{output}\nthe worker log's end:\n" + "\n".join(log)
            ) from None
        self._reader.join(timeout)
        return code

    def stop(self) -> None:
        """Whatever is left of the run (its worker, its tail) is killed."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._reader.join(10.0)
        assert self.process.stdout is not None
        self.process.stdout.close()


@pytest.fixture
def run_sh(kafka: str, name, tmp_path: Path) -> Iterator[_RunSh]:
    run = _RunSh(kafka, name("demo"), tmp_path)
    try:
        yield run
    finally:
        run.stop()


def test_make_run_notices_a_dead_worker_and_exits(run_sh):
    pid = int(run_sh.wait_for("== worker pid ", RUN_START_TIMEOUT_S).split()[-1])
    run_sh.wait_for("== outputs as they arrive", RUN_START_TIMEOUT_S)
    run_sh.wait_for("  u0  ", RUN_START_TIMEOUT_S)  # a prediction printed
    os.kill(pid, signal.SIGKILL)
    assert run_sh.finish(RUN_STOP_TIMEOUT_S) == 1
    assert any(line.startswith("== the worker exited") for line in run_sh.lines)
    assert not any(line.startswith("== stopping the worker") for line in run_sh.lines)


@pytest.mark.parametrize("whom", ["script", "group"])
def test_make_run_stops_the_tail_and_the_worker_on_sigint(run_sh, whom):
    """`script`: as a script that started `make run` in the background would, only run.sh is
    told (its children ignore SIGINT); `group`: Ctrl-C in a terminal, every process is."""
    run_sh.wait_for("== outputs as they arrive", RUN_START_TIMEOUT_S)
    run_sh.wait_for("  u0  ", RUN_START_TIMEOUT_S)
    if whom == "script":
        os.kill(run_sh.process.pid, signal.SIGINT)
    else:
        os.killpg(run_sh.process.pid, signal.SIGINT)
    assert run_sh.finish(RUN_STOP_TIMEOUT_S) == 0
    assert not any("Traceback" in line for line in run_sh.lines), "\n".join(run_sh.lines)
    tally = run_sh.wait_for("tail: ", 1.0)
    assert "predictions" in tally
    run_sh.wait_for("== summary of run", 1.0)
    run_sh.wait_for("inputs:       30 messages", 1.0)
    run_sh.wait_for("make broker-down` stops it", 1.0)  # the broker is left running: said


async def test_tour_step_3_literally(kafka, request, faust_worker, tmp_path):
    """README "A 5-minute tour" step 3 as written (the worker, `produce --now`, `tail --pretty
    --from-beginning`), on this test's own topics: started after the worker has applied every
    event, the tail shows them all, in event-time order, and its tally has the sample's
    predictions and reveals (the README's figures)."""
    from .test_serving import worker_for
    from .worker_support import PARTITIONS, deployment, wait_committed

    dep = deployment(kafka, request.node.name)
    await dep.create_topics()
    worker_for(faust_worker, dep).start()
    env = {**tool_env(kafka, dep.prefix, tmp_path), "ORACULAR_PARTITIONS": str(PARTITIONS)}
    sample = str(REPO_ROOT / "examples" / "clickstream.jsonl")
    produced, _ = await asyncio.to_thread(
        run_oracular, "produce", sample, "--now", env=env, timeout=COMMAND_TIMEOUT_S
    )
    assert produced.returncode == 0, produced.stderr
    await wait_committed(dep)  # the worker is through the sample: a tail from now shows nothing

    tail, _ = await asyncio.to_thread(
        run_oracular,
        "tail",
        "--pretty",
        "--from-beginning",
        "--idle",
        "5",
        env=env,
        timeout=RUN_STOP_TIMEOUT_S,
    )
    assert tail.returncode == 0, tail.stderr
    lines = tail.stdout.splitlines()
    times = [line[:20] for line in lines]
    assert times == sorted(times)  # event-time order across the partitions and topics
    summary = tail.stderr.splitlines()[-1]
    assert summary.startswith(
        "tail: 1,534 predictions (141 reveals: churn 48, invite 7, upgrade 86), "
    ), summary
    assert sum("episode closed" in line for line in lines) > 0


def test_an_interrupted_produce_says_how_many_events_the_broker_acknowledged(kafka, name, tmp_path):
    """Ctrl-C in the middle: exit 1 and one line with how far it got, no traceback."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    prefix = name("p")
    env = _env(kafka, prefix, tmp_path)
    asyncio.run(ensure_topics_async(kafka, list(product_topics(env))))
    total = 400_000  # several seconds of sending: the interrupt lands in the middle
    path = tmp_path / "big.jsonl"
    with path.open("w") as f:
        for i in range(total):
            f.write(f'{{"user": "u{i % 997}", "name": "pricing.viewed", "ts": {TS + i}}}\n')
    process = subprocess.Popen(
        [sys.executable, "-m", "streams.cli", "produce", str(path), "--quiet"],
        env=env,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,  # noqa: PLW1509 (no threads in the child before exec)
    )

    async def held() -> int:
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka)
        await consumer.start()
        try:
            tps = [TopicPartition(f"{prefix}.events", p) for p in range(2)]
            return sum((await consumer.end_offsets(tps)).values())
        finally:
            await consumer.stop()

    try:
        deadline = time.monotonic() + RUN_START_TIMEOUT_S
        while asyncio.run(held()) == 0:  # some sent: the interrupt lands while it sends
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "produce sent nothing"
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=RUN_STOP_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == EXIT_REFUSED, err
    assert "Traceback" not in err, err
    [line] = err.splitlines()
    assert line.startswith("oracular produce: interrupted: ") and f"of {total:,} events" in line
    acknowledged = int(line.split("interrupted: ")[1].split(" of ")[0].replace(",", ""))
    assert 0 < acknowledged < total
    assert asyncio.run(held()) >= acknowledged
