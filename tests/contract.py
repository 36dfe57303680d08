"""The lookup API's contract in the tests: every answer a test receives through
`contract_session` is checked against the OpenAPI document (schemas/lookup-api.openapi.json)
with openapi-core. An undocumented status, field or missing header fails the request."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aiohttp import ClientHandlerType, ClientRequest, ClientResponse, ClientSession
from jsonschema import Draft202012Validator
from openapi_core import Config, OpenAPI
from openapi_core.templating.paths.exceptions import OperationNotFound, PathNotFound
from openapi_core.testing import MockRequest, MockResponse
from yarl import URL

from schemas.lookup_api import openapi_document


def _text(value: bytes, **_parameters: str) -> str:
    return value.decode("utf-8")


_DOCUMENT = openapi_document()
_DOCUMENT["servers"] = [{"url": "/"}]  # the tests' workers listen on free ports
SPEC = OpenAPI.from_dict(
    _DOCUMENT,
    # /metrics in OpenMetrics is text, as its text/plain form is (openapi-core knows only that).
    config=Config(extra_media_type_deserializers={"application/openmetrics-text": _text}),
)
_ERROR = Draft202012Validator(
    {"$ref": "#/components/schemas/Error", "components": _DOCUMENT["components"]}
)


def answer_problems(
    method: str, url: URL | str, status: int, headers: Mapping[str, str], body: bytes
) -> list[str]:
    """What in an answer the document does not allow (empty: it conforms). A path or method
    the API does not serve must be answered 404 or 405 with the JSON error body."""
    url = URL(url)
    request = MockRequest(
        f"{url.scheme}://{url.raw_authority}",
        method.lower(),
        url.raw_path,
        args=dict(url.query),
        headers=dict(headers),
    )
    kind = headers.get("Content-Type", "application/json")
    response = MockResponse(body, status, headers=dict(headers), content_type=kind)
    where = f"{method} {url.path_qs} -> {status}"
    try:
        SPEC.validate_response(request, response)
    except (PathNotFound, OperationNotFound):
        if status not in (404, 405):
            return [f"{where}: an undocumented path or method answered {status}"]
        return [f"{where}: {e.message}" for e in _ERROR.iter_errors(_json(body))]
    except Exception as exc:  # openapi-core's validation errors: what did not match, and why
        cause = f" ({str(exc.__cause__)[-600:]})" if exc.__cause__ else ""
        return [f"{where}: {type(exc).__name__}{cause}; body {body[:300]!r}"]
    return []


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return body.decode(errors="replace")


async def _check(request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
    response = await handler(request)
    body = await response.read()  # kept by the response: the test reads it again
    problems = answer_problems(request.method, request.url, response.status, response.headers, body)
    assert not problems, "the answer does not match the OpenAPI document:\n" + "\n".join(problems)
    return response


def contract_session(**kwargs: Any) -> ClientSession:
    """An aiohttp ClientSession whose every answer is checked against the document."""
    return ClientSession(middlewares=(_check,), **kwargs)
