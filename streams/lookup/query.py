"""`oracular query USER`: ask a worker's lookup API and print the answer readably.

Standard library only (urllib): the command needs no event loop and no Faust. Its exit codes
are the other commands' (streams/cli/common.py): 69 when no worker's API answers.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from streams.settings import APP_HEADER, DEFAULT_API_PORT, Settings
from streams.settings.exits import EXIT_UNAVAILABLE, EXIT_USAGE


@dataclass(frozen=True)
class QueryError(Exception):
    """The lookup failed: what went wrong, what to do, and the exit code (the CLI prints
    them in the product's one error style)."""

    what: str
    todo: str
    code: int


TODO_4XX = "check the user, the intent and --at"


API_URL_FILE = "api-url"
"""The file in a worker's datadir that holds its API's URL while it runs."""


def default_url(settings: Settings) -> str:
    """ORACULAR_API_URL; else, with ORACULAR_API_PORT unset, the URL the app's local worker
    wrote in its datadir (the free port it took when 6067 was another's); else the local
    worker's API by ORACULAR_API_HOST and ORACULAR_API_PORT."""
    if settings.api_url:
        return settings.api_url.rstrip("/")
    if settings.api_port is None:
        try:
            written = (settings.state_dir / API_URL_FILE).read_text().strip()
        except OSError:
            written = ""
        if written.startswith(("http://", "https://")):
            return written.rstrip("/")
    port = DEFAULT_API_PORT if settings.api_port is None else settings.api_port
    host = settings.api_host
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    scheme = "https" if settings.api_tls_cert is not None else "http"
    return f"{scheme}://{host}:{port}"


def lookup(
    url: str,
    user: str,
    *,
    intent: str | None = None,
    explain: bool = False,
    stale: bool = False,
    at: int | None = None,
    token: str | None = None,
    cafile: Path | None = None,
    app_id: str | None = None,
    timeout_s: float = 10.0,
) -> dict[str, Any]:
    """GET /v1/users/{user}[/intents/{intent}] and return the JSON answer.

    Raises:
        QueryError: the API refused (its error message), could not be reached, or is another
            app's than `app_id` (its answers' X-Oracular-App header).
    """
    path = _user_path(user)
    if intent is not None:
        path += "/intents/" + urllib.parse.quote(intent, safe="")
    params = {k: "true" for k, v in (("explain", explain), ("stale", stale)) if v}
    if at is not None:
        params["at"] = str(at)
    full = url.rstrip("/") + path + ("?" + urllib.parse.urlencode(params) if params else "")
    request = urllib.request.Request(full, headers={"Accept": "application/json"})
    return _ask(request, token, cafile, app_id, timeout_s, todo_4xx=TODO_4XX)


def reveal(
    url: str,
    user: str,
    intent: str,
    *,
    ts: int | None = None,
    token: str | None = None,
    cafile: Path | None = None,
    app_id: str | None = None,
    timeout_s: float = 10.0,
) -> dict[str, Any]:
    """POST /v1/users/{user}/revealed (the app showed `intent`'s prompt): the 202 answer, with
    the command appended to the input topic and where.

    Raises:
        QueryError: as `lookup`.
    """
    full = url.rstrip("/") + _user_path(user) + "/revealed"
    body = {"intent": intent} if ts is None else {"intent": intent, "ts": ts}
    request = urllib.request.Request(
        full,
        data=json.dumps(body).encode(),
        headers={"Accept": "application/json", "Content-Type": "application/json"},
        method="POST",
    )
    return _ask(request, token, cafile, app_id, timeout_s, todo_4xx=TODO_4XX)


def _user_path(user: str) -> str:
    if user in (".", ".."):  # HTTP drops such path segments: the request would miss the user
        what = f"user id {user!r} cannot be named in a URL path"
        raise QueryError(what, "ask POST /v1/lookup for it", EXIT_USAGE)
    return "/v1/users/" + urllib.parse.quote(user, safe="")


def _ask(
    request: urllib.request.Request,
    token: str | None,
    cafile: Path | None,
    app_id: str | None,
    timeout_s: float,
    *,
    todo_4xx: str,
) -> dict[str, Any]:
    """Send `request` (with the token); its JSON answer, or a QueryError saying what to do."""
    full = request.full_url
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        context = ssl.create_default_context(cafile=str(cafile)) if cafile else None
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
            _check_app(full, response.headers.get(APP_HEADER), app_id)
            body: dict[str, Any] = json.loads(response.read())
            return body
    except urllib.error.HTTPError as exc:
        _check_app(full, exc.headers.get(APP_HEADER), app_id)
        try:
            detail = json.loads(exc.read()).get("error", exc.reason)
        except (ValueError, AttributeError):
            detail = exc.reason
        code = EXIT_UNAVAILABLE if exc.code in (502, 503, 504) else EXIT_USAGE
        todo = todo_4xx
        if exc.code == 401:
            todo = "set ORACULAR_API_TOKEN (or ORACULAR_API_TOKEN_FILE) to the workers' token"
        elif exc.code in (503, 504):
            todo = f"retry after {exc.headers.get('Retry-After', 'a moment')} s"
        elif exc.code == 502:
            todo = "see the worker's log for the peer it names"
        what = f"{full}: HTTP {exc.code}: {detail}"
        raise QueryError(what, todo, code) from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        what = f"{full}: cannot reach the worker's API ({reason})"
        todo = "is `oracular worker` running? Pass --url or set ORACULAR_API_URL"
        raise QueryError(what, todo, EXIT_UNAVAILABLE) from exc


def _check_app(url: str, answered: str | None, app_id: str | None) -> None:
    """QueryError when the worker that answered is another app's (or says none)."""
    if app_id is None or answered == app_id:
        return
    who = f"app {answered!r}" if answered else "a server that names no app"
    what = (
        f"{url}: answered by {who}, not app {app_id!r} (ORACULAR_APP_ID): another app's worker "
        "has this address"
    )
    todo = (
        "pass --url (or set ORACULAR_API_URL / ORACULAR_API_PORT) to your app's worker, or set "
        "ORACULAR_APP_ID to the app you mean"
    )
    raise QueryError(what, todo, EXIT_UNAVAILABLE)


def _time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def _num(value: float) -> str:
    return f"{value:.3f}" if abs(value) < 1000 else f"{value:.3g}"


def render(body: dict[str, Any], out: TextIO) -> None:
    """Print an answer: who, where from, then one row per intent (and its explanation)."""
    position = body["position"]
    served = body["served_by"]
    known = "known" if body["known"] else "unknown (new user: the prior)"
    print(f"user {body['user']}: {known}", file=out)
    print(
        f"  at {_time(body['at'])}   state as of {_time(body['as_of'])}   "
        f"partition {position['partition']} "
        + (f"offset {position['offset']}" if position["offset"] is not None else "(no input yet)"),
        file=out,
    )
    app = f"app {body['app']}, " if "app" in body else ""
    print(
        f"  served by {served['worker']} ({served['role']}), {app}config {body['config']}", file=out
    )
    print(file=out)
    rows = [("intent", "p", "lower", "reveal", "suppressed until")]
    for name, item in body["intents"].items():
        rows.append(
            (
                name,
                _num(item["p"]),
                _num(item["lower"]),
                "YES" if item["reveal"] else "no",
                _time(item["suppressed_until"]),
            )
        )
    _table(rows, out)
    for name, item in body["intents"].items():
        why = item.get("explain")
        if why is None:
            continue
        episodes = why["episodes"]
        print(
            f"\n{name}: alpha {_num(why['alpha'])} beta {_num(why['beta'])}, episodes "
            f"with outcome {_num(episodes['hits'])}, without {_num(episodes['misses'])}",
            file=out,
        )
        signals = [
            ("signal", "initial", "learned", "effective", "hits", "misses", "seen", "contrib")
        ]
        signals += [
            (
                signal,
                _num(s["initial"]),
                _num(s["learned"]),
                _num(s["effective"]),
                _num(s["hits"]),
                _num(s["misses"]),
                str(s["seen"]),
                _num(s["contribution"]),
            )
            for signal, s in why["signals"].items()
        ]
        _table(signals, out)


def _table(rows: Sequence[tuple[str, ...]], out: TextIO) -> None:
    widths = [max(len(row[n]) for row in rows) for n in range(len(rows[0]))]
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        print("  " + "  ".join(cells).rstrip(), file=out)
