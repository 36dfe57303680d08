"""`oracular worker --processes N`: each child's environment."""

from __future__ import annotations

import shutil
from pathlib import Path

from streams.tools.processes import child_environments


def test_children_get_their_own_datadir_and_ports():
    env = {"ORACULAR_APP_ID": "a", "ORACULAR_API_PORT": "7000", "ORACULAR_WEB_PORT": "0"}
    children = child_environments(3, env, Path("var/faust/a"))
    assert [c["ORACULAR_DATADIR"] for c in children] == [
        "var/faust/a/p0",
        "var/faust/a/p1",
        "var/faust/a/p2",
    ]
    assert [c["ORACULAR_API_PORT"] for c in children] == ["7000", "7001", "7002"]
    assert all(c["ORACULAR_WEB_PORT"] == "0" for c in children)  # 0: each picks a free port
    assert all(c["ORACULAR_APP_ID"] == "a" for c in children)


def test_an_explicit_datadir_is_the_parent_of_the_children():
    children = child_environments(2, {"ORACULAR_DATADIR": "/data/w"}, Path("unused"))
    assert [c["ORACULAR_DATADIR"] for c in children] == ["/data/w/p0", "/data/w/p1"]


def test_a_killed_supervisor_takes_its_workers_with_it(tmp_path):
    """Even a worker that ignores SIGTERM (one already stopping) dies with its supervisor."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import streams.tools.processes

    assert shutil.which("setpriv"), "util-linux's setpriv is what ties workers to the supervisor"
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    child_cmd = streams.tools.processes.tied_to_parent([sys.executable, "-c", stubborn])
    supervisor = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; "
            f"c = subprocess.Popen({child_cmd!r}); print(c.pid, flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    with supervisor.stdout:
        child = int(supervisor.stdout.readline())
    # setpriv arms the death signal, then becomes the worker: kill the supervisor after that.
    deadline = time.monotonic() + 30
    while "setpriv" in os.readlink(f"/proc/{child}/exe"):
        assert time.monotonic() < deadline, "the worker did not start"
        time.sleep(0.05)
    supervisor.kill()
    supervisor.wait(timeout=30)
    deadline = time.monotonic() + 30  # generous: a loaded machine
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        with open(f"/proc/{child}/stat") as stat:
            if stat.read().rsplit(")", 1)[1].split()[0] == "Z":  # gone; init reaps it
                return
        time.sleep(0.1)
    with open(f"/proc/{child}/status") as proc:
        status = proc.read()
    os.kill(child, signal.SIGKILL)
    raise AssertionError(f"the worker outlived its killed supervisor: {status}")
