"""infra.cluster without running it: each node's config, the ports, the CLI on nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra import cluster
from infra.broker import DEFAULT_CACHE_DIR, free_port, port_is_free


def properties(text: str) -> dict[str, str]:
    return dict(
        line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#")
    )


def three_nodes(tmp_path: Path) -> cluster.Cluster:
    pairs = [(19092, 19093), (19094, 19095), (19096, 19097)]
    nodes = [cluster.Node(n, tmp_path / f"node{n}", *pair) for n, pair in enumerate(pairs, 1)]
    return cluster.Cluster(tmp_path, nodes, DEFAULT_CACHE_DIR / "lib")


def six_free_ports() -> int:
    """A port whose next five are free too (node n's pair is base + 2(n-1), + 1)."""
    for _ in range(50):
        base = free_port()
        if base < 65530 and all(port_is_free(base + n) for n in range(6)):
            return base
    pytest.fail("no six consecutive free ports")


def test_each_node_has_its_id_ports_and_data_and_the_whole_quorum(tmp_path: Path) -> None:
    the_cluster = three_nodes(tmp_path)
    props = properties(cluster.node_properties(the_cluster, the_cluster.node(2)))

    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == (
        "1@127.0.0.1:19093,2@127.0.0.1:19095,3@127.0.0.1:19097"
    )
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19094,CONTROLLER://127.0.0.1:19095"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19094"
    assert props["log.dirs"] == str(tmp_path / "node2" / "data")
    assert the_cluster.bootstrap == "127.0.0.1:19092,127.0.0.1:19094,127.0.0.1:19096"


def test_every_topic_gets_three_replicas_and_two_in_sync(tmp_path: Path) -> None:
    the_cluster = three_nodes(tmp_path)
    text = cluster.node_properties(the_cluster, the_cluster.node(1))
    props = properties(text)

    assert props["default.replication.factor"] == "3"
    assert props["offsets.topic.replication.factor"] == "3"
    assert props["transaction.state.log.replication.factor"] == "3"
    assert props["min.insync.replicas"] == "2"
    assert props["transaction.state.log.min.isr"] == "2"
    assert props["unclean.leader.election.enable"] == "false"
    assert props["auto.create.topics.enable"] == "false"  # the single node's settings stay
    assert text.count("offsets.topic.replication.factor=") == 1  # replaced, not repeated


def test_free_ports_are_six_distinct_and_kept_for_a_restart(tmp_path: Path) -> None:
    pairs = cluster._ports(tmp_path, None)

    assert len(pairs) == 3
    assert len({port for pair in pairs for port in pair}) == 6
    assert cluster._ports(tmp_path, None) == pairs  # the same quorum addresses next time


def test_a_given_port_numbers_the_nodes_from_it(tmp_path: Path) -> None:
    base = six_free_ports()
    pairs = cluster._ports(tmp_path, base)

    assert pairs == [(base, base + 1), (base + 2, base + 3), (base + 4, base + 5)]


def test_status_and_down_of_a_cluster_never_started(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cluster.main(["--dir", str(tmp_path), "status"]) == 1
    assert "not running" in capsys.readouterr().out
    assert cluster.main(["--dir", str(tmp_path), "down"]) == 0
