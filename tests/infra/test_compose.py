"""infra/docker-compose.yml is not run in CI (no docker), so at least keep it in step."""

from __future__ import annotations

import re

import yaml

from infra.broker import INFRA_DIR, POM, SINGLE_NODE_SETTINGS
from streams.settings import product_topics


def compose() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((INFRA_DIR / "docker-compose.yml").read_text())


def test_compose_creates_every_product_topic() -> None:
    script = compose()["services"]["topics"]["command"][0]

    for spec in product_topics({}):
        assert re.search(rf"(?<![\w.]){re.escape(spec.name)}(?![\w.])", script), spec.name


def test_compose_runs_the_kafka_version_of_the_pom() -> None:
    version = re.search(r"<kafka.version>(.+)</kafka.version>", POM.read_text())
    assert version is not None

    services = compose()["services"]
    assert services["kafka"]["image"] == f"apache/kafka:{version.group(1)}"
    assert services["topics"]["image"] == f"apache/kafka:{version.group(1)}"


def test_compose_uses_the_single_node_settings_and_port() -> None:
    kafka = compose()["services"]["kafka"]
    env = {key: str(value) for key, value in kafka["environment"].items()}

    assert kafka["ports"] == ["127.0.0.1:9092:9092"]
    for key, value in SINGLE_NODE_SETTINGS.items():
        if key.startswith(("num.", "log.cleaner")):
            continue  # thread and buffer sizes: the image's defaults are fine in a container
        assert env["KAFKA_" + key.upper().replace(".", "_")] == value, key
