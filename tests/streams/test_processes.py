"""`oracular worker --processes N`: each child's environment."""

from __future__ import annotations

from pathlib import Path

from streams.processes import child_environments


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
