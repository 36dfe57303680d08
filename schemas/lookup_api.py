"""The lookup API's contract: its OpenAPI 3.1 document, `lookup-api.openapi.json` beside this
module. Every endpoint, field, status code, header and the auth scheme are in it; each worker
serves it at `GET /openapi.json`, and the tests check every answer against it (docs/serving.md).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

DOCUMENT: Final = Path(__file__).with_name("lookup-api.openapi.json")


def openapi_document(
    server_url: str | None = None, intents: Sequence[str] | None = None
) -> dict[str, Any]:
    """The document; the copy a worker serves is its own: with `server_url`, `servers` names
    that worker (a client generated from it reaches the worker that served it), and with
    `intents`, an intent anywhere in a request is one of the config's declared intents."""
    document: dict[str, Any] = json.loads(DOCUMENT.read_text(encoding="utf-8"))
    if server_url:
        document["servers"] = [{"url": server_url, "description": "the worker that served this"}]
    if intents:
        declared = sorted(intents)
        components = document["components"]
        components["parameters"]["intent"]["schema"]["enum"] = declared
        components["schemas"]["RevealRequest"]["properties"]["intent"]["enum"] = declared
        item = components["schemas"]["BatchRequest"]["properties"]["users"]["items"]["anyOf"][1]
        item["properties"]["intents"]["items"]["enum"] = declared
    return document
