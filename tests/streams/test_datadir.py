"""streams/runtime/datadir.py: a datadir is private (0700) and tied to its app by a marker."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from schemas.config import load_config
from streams.runtime.datadir import MARKER, DatadirError, check_owner, prepare, read_owner


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_datadir_is_private_and_marked(tmp_path: Path) -> None:
    datadir = tmp_path / "var" / "faust" / "a"
    prepare(datadir, "a", "a.events")
    assert mode(datadir) == 0o700 and mode(datadir / MARKER) == 0o600
    assert json.loads((datadir / MARKER).read_text()) == {"app_id": "a", "events_topic": "a.events"}
    prepare(datadir, "a", "a.events")  # its own app again: fine
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    (open_dir / "000012.sst").write_bytes(b"state")  # an unmarked datadir of an older version
    prepare(open_dir, "a", "a.events")
    assert mode(open_dir) == 0o700 and read_owner(open_dir) == {
        "app_id": "a",
        "events_topic": "a.events",
    }


@pytest.mark.parametrize(("app_id", "topic"), [("b", "a.events"), ("a", "b.events")])
def test_another_apps_datadir_is_refused_in_one_line(
    tmp_path: Path, app_id: str, topic: str
) -> None:
    prepare(tmp_path / "d", "a", "a.events")
    with pytest.raises(DatadirError) as caught:
        prepare(tmp_path / "d", app_id, topic)
    [line] = str(caught.value).splitlines()
    assert "holds the state of app 'a'" in line and "ORACULAR_DATADIR" in line
    assert "oracular reset a" in line
    with pytest.raises(DatadirError):
        check_owner(tmp_path / "d", "b")
    check_owner(tmp_path / "d", "a")
    check_owner(tmp_path / "unmarked", "b")


def test_the_worker_refuses_another_apps_datadir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from streams.settings import settings_from_env
    from streams.worker import create_worker

    config = load_config("examples/oracular.yaml")
    datadir = str(tmp_path / "state")
    env = {"ORACULAR_DATADIR": datadir, "ORACULAR_API_PORT": "0"}  # 6067 may be taken
    settings = settings_from_env({**env, "ORACULAR_APP_ID": "app-b"})
    create_worker(settings, config)
    assert read_owner(tmp_path / "state") == {"app_id": "app-b", "events_topic": "oracular.events"}
    assert mode(tmp_path / "state") == 0o700
    other = settings_from_env({**env, "ORACULAR_APP_ID": "app-a"})
    with pytest.raises(SystemExit) as caught:
        create_worker(other, config)
    assert caught.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    [line] = lines
    assert line.startswith("oracular worker: the datadir") and "'app-b'" in line


def test_a_datadir_another_process_holds_is_refused_in_one_line(tmp_path):
    """Two workers on one datadir: the second is refused, saying how to give each its own;
    `in_use` sees it (`oracular reset` refuses then); the lock goes with the process."""
    import subprocess
    import sys

    from streams.runtime.datadir import LOCK, DatadirInUse, in_use, prepare

    datadir = tmp_path / "data"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from streams.runtime.datadir import prepare; "
            f"prepare(Path({str(datadir)!r}), 'a', 'a.events'); print('held', flush=True); "
            "sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert in_use(datadir)
        with pytest.raises(DatadirInUse, match=rf"in use by another worker \(it holds {LOCK}\)"):
            prepare(datadir, "a", "a.events")
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
        if holder.stdout is not None:
            holder.stdout.close()
    assert not in_use(datadir)  # the holder is gone, and with it its lock
    prepare(datadir, "a", "a.events")  # now this process holds it
    assert not in_use(datadir)  # its own lock is not "another worker"
    prepare(datadir, "a", "a.events")  # and taking it again is a no-op
