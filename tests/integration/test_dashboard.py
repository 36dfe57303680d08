"""Every metric the operator's dashboard and alert rules read is on a running worker's
/metrics (a real scrape, against the session broker): a renamed metric breaks this test,
not a panel in production."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from aiohttp import ClientSession, ClientTimeout
from prometheus_client.parser import text_string_to_metric_families

from infra.grafana.queries import PROMETHEUS_OWN, alert_queries, dashboard_queries, metric_names
from tests.contract import contract_session

from .test_serving import api_url, get_json, worker_for
from .worker_support import deployment, generate_stream, produce_events, wait_committed

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HTTP_TIMEOUT_S = 15.0


def _free_port() -> int:
    """A port the OS handed out, closed again (Faust's web server takes no port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scraped_names(text: str) -> set[str]:
    """Every series name a /metrics text can give: its samples', and for each family the
    names its type implies (a histogram's _bucket/_sum/_count, a counter's _total), so a
    family with no sample yet (no lookup so far) counts."""
    names: set[str] = set()
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(family.name + s for s in suffixes.get(family.type, ()))
        names.update(sample.name for sample in family.samples)
    return names


async def test_every_metric_of_the_dashboard_and_the_alerts_is_scraped(
    kafka, request, faust_worker
):
    web_port = _free_port()
    settings = {"ORACULAR_API_PORT": "0", "ORACULAR_WEB_PORT": str(web_port)}
    dep = deployment(kafka, request.node.name, settings=settings)
    await dep.create_topics()
    worker = worker_for(faust_worker, dep).start()
    url = await asyncio.to_thread(api_url, worker)
    events = generate_stream(dep.config, events=200, users=20, seed=7)
    await produce_events(kafka, dep.topics.events.name, events)
    await wait_committed(dep)
    async with contract_session(timeout=ClientTimeout(total=HTTP_TIMEOUT_S)) as http:
        await get_json(http, f"{url}/v1/users/{events[0].user}", token=None)  # a lookup
        async with http.get(f"{url}/metrics") as response:
            assert response.status == 200
            text = await response.text()
    # --web-port serves what it promises: Faust's statistics pages (Faust's, not the API).
    async with ClientSession(timeout=ClientTimeout(total=HTTP_TIMEOUT_S)) as http:
        async with http.get(f"http://127.0.0.1:{web_port}/") as response:
            assert response.status == 200
            sensors = await response.json()
        assert any("messages_received_total" in sensor for sensor in sensors.values())
        async with http.get(f"http://127.0.0.1:{web_port}/assignment/") as response:
            assert response.status == 200
            assert dep.topics.events.name in json.dumps(await response.json())
    scraped = scraped_names(text)
    used = {
        where: metric_names(expr)
        for where, expr in {**dashboard_queries(), **alert_queries()}.items()
    }
    missing = {
        where: sorted(names - scraped - PROMETHEUS_OWN)
        for where, names in used.items()
        if names - scraped - PROMETHEUS_OWN
    }
    assert not missing, f"not on the worker's /metrics: {missing}"
    assert "process_open_fds" in scraped and "oracular_inputs_total" in scraped
    # The worker's process and its lookup API's, told apart (the API's stood for the worker's).
    started = {
        line.split('process="')[1].split('"')[0]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("process_start_time_seconds{")
    }
    assert set(started) == {"worker", "api"} and started["worker"] <= started["api"], started
