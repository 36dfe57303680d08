"""The lookup API's OpenAPI document (schemas/lookup-api.openapi.json) is a valid OpenAPI 3.1
document, covers every route and every status the API answers, and is served at
`GET /openapi.json` naming the worker that serves it."""

from __future__ import annotations

import re
from pathlib import Path

from aiohttp import ClientSession
from openapi_spec_validator import validate
from openapi_spec_validator.readers import read_from_filename

from schemas.lookup_api import DOCUMENT, openapi_document
from streams.lookup.api import Api, build_web_app
from tests.contract import answer_problems, contract_session
from tests.streams.test_serving import FakeNode, config, start_worker

__all__ = ["config"]  # the module-scoped fixture, shared

TOKEN = "s3cret"

LOOKUP = Path(__file__).resolve().parents[2] / "streams" / "lookup"


def test_the_document_is_valid_openapi_3_1() -> None:
    spec, _ = read_from_filename(str(DOCUMENT))
    validate(spec)  # raises on any fault
    assert spec["openapi"].startswith("3.1")


def _routes(config) -> set[tuple[str, str]]:
    worker_app = build_web_app(Api(FakeNode(config)))
    return {
        (route.method.lower(), route.resource.canonical)
        for route in worker_app.router.routes()
        if route.method != "HEAD"
    }


def test_every_route_is_in_the_document_and_nothing_else(config) -> None:
    documented = {
        (method, path)
        for path, item in openapi_document()["paths"].items()
        for method in item
        if method != "parameters"
    }
    assert _routes(config) == documented


def test_every_status_the_api_raises_is_documented() -> None:
    """Each `ApiError(NNN` in streams/lookup is a status some operation documents."""
    raised = {
        int(code)
        for source in LOOKUP.glob("*.py")
        for code in re.findall(r"ApiError\(\s*([0-9]{3})", source.read_text())
    }
    documented = {
        int(status)
        for item in openapi_document()["paths"].values()
        for method, operation in item.items()
        if method != "parameters"
        for status in operation["responses"]
    }
    assert raised and raised <= documented, raised - documented


async def test_the_document_is_served_without_a_token_naming_the_worker(config) -> None:
    worker = await start_worker(config, token=TOKEN)
    try:
        async with contract_session() as http:
            async with http.get(f"{worker.url}/openapi.json") as response:
                assert response.status == 200
                served = await response.json()
            async with http.get(f"{worker.url}/v1/routing") as response:
                assert response.status == 401  # the rest still needs the token
        expected = openapi_document()
        assert served.pop("servers") == [
            {"url": worker.url, "description": "the worker that served this"}
        ]
        expected.pop("servers")
        intent = served["components"]["parameters"]["intent"]["schema"]
        assert intent.pop("enum") == sorted(config.intents)  # the worker's own intents
        reveal = served["components"]["schemas"]["RevealRequest"]["properties"]["intent"]
        assert reveal.pop("enum") == sorted(config.intents)
        batch = served["components"]["schemas"]["BatchRequest"]["properties"]["users"]
        assert batch["items"]["anyOf"][1]["properties"]["intents"]["items"].pop("enum")
        assert served == expected
    finally:
        await worker.server.close()


async def test_an_answer_outside_the_document_is_caught(config) -> None:
    """The check the tests rely on can fail: an extra field, a missing header, an
    undocumented status, a wrong type."""
    worker = await start_worker(config)
    try:
        async with ClientSession() as http, http.get(f"{worker.url}/livez") as response:
            body, headers = await response.read(), dict(response.headers)
        url = f"{worker.url}/livez"
        assert answer_problems("GET", url, 200, headers, body) == []
        assert answer_problems("GET", url, 200, headers, b'{"live":true,"extra":1}')
        assert answer_problems("GET", url, 200, {"Content-Type": "application/json"}, body)
        assert answer_problems("GET", url, 418, headers, body)
        routing = f"{worker.url}/v1/routing"
        assert answer_problems("GET", routing, 200, headers, b'{"generation":"1"}')
        assert answer_problems("GET", f"{worker.url}/nowhere", 200, headers, body)
        not_found = b'{"error":"Not Found","status":404}'
        assert answer_problems("GET", f"{worker.url}/nowhere", 404, headers, not_found) == []
    finally:
        await worker.server.close()
