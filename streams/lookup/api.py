"""The worker's HTTP API: per-user lookups, reveal feedback, routing, health and metrics.

Every worker serves it (docs/serving.md) from a process of its own (`streams.lookup.replica` feeds
it, `streams.lookup.process` runs it), started before the consumer joins the group, so
`/livez` and `/readyz` answer during start-up and recovery. `install_serving(app, runtime,
settings)` is the one hook the worker (`streams.worker.create_worker`) calls. The handlers
here run against a `Node`: the replica in the API process, or a fake in unit tests.

- Lookups are routed by the user's partition (murmur2, `streams.lookup.serving.partition_for`): the
  worker owning it answers from its copy; any other worker forwards exactly one hop to the
  owner's URL (Faust's assignor shares each worker's `canonical_url`, which is this API's
  URL), or answers from its standby copy when the caller passes `?stale=true`.
- Reads never write the table. The owner answers from its decoded users (`UserCache`) when it
  holds the user, else it decodes that one user's stored value; a long batch yields to the
  event loop every few milliseconds.
- Reveals are appended to the input topic as `revealed` commands, keyed by user, so the agent
  applies them in order and a replay sees them; a `ts` further ahead than the max skew is
  refused.
- The front door (`streams.lookup.front`): every phase of a connection is bounded and every error is
  JSON (an unexpected one says only "internal error" and a logged id); every answer says the
  app id (`X-Oracular-App`). A forward carries this worker's token, goes only to an allowed
  peer (ORACULAR_API_PEERS), follows no redirect, and its answer is checked (502 otherwise).
- Exposure: a non-loopback bind needs a token (or ORACULAR_API_ALLOW_NO_TOKEN); TLS optional.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import socket
import ssl
import sys
import time
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NoReturn, Protocol, get_args

import msgpack
import msgspec
from aiohttp import ClientError, ClientSession, ClientTimeout, HttpVersion11, TCPConnector, web
from mode import Service
from yarl import URL

from engine import EngineConfig, EngineError
from engine.episodes import Reason
from schemas.events import DecodeError, erase_command
from schemas.lookup_api import openapi_document
from streams.faust import patches as faust_patches
from streams.lookup.crosssite import check_request
from streams.lookup.front import Guard, GuardedHandler, Limits, internal_error
from streams.lookup.metrics import (
    CONTENT_TYPE,
    OPENMETRICS_CONTENT_TYPE,
    Family,
    Metrics,
    monitor_families,
    processor_families,
    render,
)
from streams.lookup.query import API_URL_FILE
from streams.lookup.replica import ChildArgs, Feed
from streams.lookup.serving import (
    FORWARDED_HEADER,
    RETRY_AFTER_S,
    ApiError,
    BatchItem,
    PartitionView,
    PeerAnswerError,
    Route,
    UserRead,
    answer,
    answer_json,
    batch_body,
    batch_counts,
    check_intents,
    check_peer_answer,
    check_peer_batch,
    check_user,
    config_identity,
    is_peer_batch_for,
    parse_at,
    parse_batch,
    parse_bool,
    parse_erase,
    parse_reveal,
    partition_for,
    read_user,
    route,
)
from streams.runtime import processor as processor_module
from streams.runtime.failstop import FAIL_STOP
from streams.settings import APP_HEADER, DEFAULT_API_NICE, DEFAULT_API_PORT, Settings
from streams.settings.cpus import cpus_line, reserve_cpus
from streams.settings.exits import EXIT_UNAVAILABLE, EXIT_USAGE
from streams.settings.hosts import Hosts
from streams.settings.peers import Peers
from streams.settings.topics import STATE_TABLE

log = logging.getLogger("oracular.api")

YIELD_AFTER_S = 0.005
"""A batch lookup gives the API's event loop back (to other lookups) after this long answering
users. By time, not by count: a user already decoded costs a few hundredths of a
millisecond, one decoded from its stored value several times that."""
MAX_PEER_ANSWER_BYTES = 16 << 20
"""Largest answer taken from another worker (a batch of 1,000 with explanations is ~2 MiB)."""
RESOLVE_TTL_S = 60.0
MAX_RESOLVED = 256
DEFAULT_PORT = DEFAULT_API_PORT
"""The API's port when ORACULAR_API_PORT is unset (a free one if it is taken)."""


class Node(Protocol):
    """What the API needs of the worker it runs in (`FaustNode`; a fake in unit tests)."""

    me: str
    partitions: int
    config: EngineConfig
    events_topic: str

    def view(self, partition: int) -> PartitionView: ...

    def get(self, partition: int, key: bytes) -> bytes | None: ...

    def routing(self) -> dict[str, Any]: ...

    def health(self) -> list[str]: ...

    def lag(self) -> dict[int, int]: ...

    def counts(self) -> Mapping[str, int]: ...

    def inputs_by_partition(self) -> Mapping[tuple[str, int], int]: ...

    def episodes_by_reason(self) -> Mapping[str, int]: ...

    def gauges(self) -> list[Family]: ...

    async def append(self, key: bytes, value: bytes, partition: int) -> tuple[int, int]: ...


class UserCache(Protocol):
    """Users read (`streams.lookup.replica.ReplicaCache`): a lookup of a user it does not hold
    decodes what predictions read of the user's stored value and hands it to `keep`."""

    def peek(self, key: bytes) -> UserRead | None: ...

    def keep(self, key: bytes, read: UserRead) -> None: ...


@dataclass
class Api:
    """The handlers' shared state: the node, options, metrics and the forwarding client."""

    node: Node
    token: str | None = None
    forward_timeout_s: float = 2.0
    max_skew_ms: int = 60_000
    """A reveal's `ts` may be at most this far ahead of the clock (ORACULAR_MAX_SKEW_MS)."""
    client_ssl: ssl.SSLContext | None = None
    """Verifies the other workers' API certificates when forwarding (None: the system's)."""
    app_id: str = "oracular"
    """ORACULAR_APP_ID: said on every answer (APP_HEADER); a peer must say the same."""
    peers: Peers = field(default_factory=Peers)
    """Where lookups may be forwarded (ORACULAR_API_PEERS; default here: loopback only)."""
    peer_problems: set[tuple[str, str]] = field(default_factory=set)
    """(peer URL, problem) already logged: each is logged once."""
    addresses: dict[str, tuple[float, list[str]]] = field(default_factory=dict)
    """Host -> (when resolved, its addresses), for the peer check."""
    limits: Limits = field(default_factory=Limits)
    hosts: Hosts = field(default_factory=Hosts)
    """The names the /v1/ endpoints answer to besides addresses and localhost
    (`streams.lookup.crosssite`: DNS rebinding)."""
    guard: Guard | None = None
    """The server's connections (set once it serves)."""
    metrics: Metrics = field(default_factory=Metrics)
    session: ClientSession | None = None
    cache: UserCache | None = None
    """Decoded users whose changelog records are acknowledged (write-through: never a state
    the table does not hold); the owner answers from it without reading or decoding. None:
    every lookup reads the table."""
    reads: Counter[str] = field(default_factory=Counter)
    """Users the owner's lookups read, by source: "cache" or "table"."""
    clock: Callable[[], int] = lambda: int(time.time() * 1000)

    @property
    def config(self) -> EngineConfig:
        return self.node.config

    async def start(self) -> None:
        """Open the client session used to forward lookups."""
        if self.session is None:
            self.session = ClientSession(
                timeout=ClientTimeout(total=self.forward_timeout_s),
                connector=TCPConnector(ssl=self.client_ssl or True),
            )

    async def resolve(self, host: str) -> list[str]:
        """`host`'s addresses (itself if it is one), cached for a minute; [] if unresolved."""
        with contextlib.suppress(ValueError):
            return [str(ipaddress.ip_address(host.strip("[]")))]
        now = time.monotonic()
        cached = self.addresses.get(host)
        if cached is not None and now - cached[0] < RESOLVE_TTL_S:
            return cached[1]
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, None)
        except OSError:
            found: list[str] = []
        else:
            found = sorted({str(info[4][0]) for info in infos})
        if len(self.addresses) >= MAX_RESOLVED:
            self.addresses.clear()
        self.addresses[host] = (now, found)
        return found

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None


def build_web_app(api: Api) -> web.Application:
    """The aiohttp application of the API (routes, auth, JSON errors, size limits)."""
    app = web.Application(
        middlewares=[_front(api), _auth(api)], client_max_size=api.limits.max_body_bytes
    )
    handlers = _Handlers(api)
    app.router.add_get("/livez", handlers.livez)
    app.router.add_get("/readyz", handlers.readyz)
    app.router.add_get("/metrics", handlers.metrics)
    app.router.add_get("/openapi.json", handlers.openapi)
    app.router.add_get("/v1/routing", handlers.routing)
    app.router.add_get("/v1/users/{user}", handlers.user)
    app.router.add_get("/v1/users/{user}/intents/{intent}", handlers.intent)
    app.router.add_post("/v1/lookup", handlers.batch)
    app.router.add_post("/v1/users/{user}/revealed", handlers.revealed)
    app.router.add_delete("/v1/users/{user}", handlers.erase)
    app.on_startup.append(lambda _: api.start())
    app.on_cleanup.append(lambda _: api.close())
    return app


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(body: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(
        text=json.dumps(body, separators=(",", ":"), allow_nan=False),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def _answer(body: dict[str, Any]) -> web.Response:
    """A lookup's 200 answer: the bytes `_json` would write (`answer_json`), sooner."""
    return web.Response(body=answer_json(body), content_type="application/json", charset="utf-8")


def _error_response(exc: ApiError) -> web.Response:
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
    return _json(exc.body(), exc.status, headers)


def _front(api: Api) -> Any:
    """The outermost middleware: marks the connection busy while a request is answered
    (`streams.lookup.front`), refuses a declared body over the limit before reading it, closes a
    connection at its request limit, and turns every error into JSON: an unexpected one into
    a 500 that says only "internal error" and an id (logged with the traceback)."""
    limit = api.limits.max_body_bytes

    @web.middleware
    async def front(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        conn = request.protocol if isinstance(request.protocol, GuardedHandler) else None
        if conn is not None:
            conn.begin()
        closing = False
        try:
            check_escapes(request.raw_path)
            # A refusal here leaves the body unread (the stream is lost), or its framing is
            # faulty (RFC 9112 6.1: HTTP/1.0 with a Transfer-Encoding): answered, then closed.
            closing = True
            if request.content_length is not None and request.content_length > limit:
                msg = f"the body is {request.content_length} bytes; the limit is {limit}"
                raise ApiError(413, msg)
            check_request(request.method, request.path, request.headers, request.secure, api.hosts)
            if request.version < HttpVersion11 and "Transfer-Encoding" in request.headers:
                raise ApiError(400, "an HTTP/1.0 request may not have a Transfer-Encoding")
            closing = False
            response = await handler(request)
        except ApiError as exc:
            response = _api_error(request, exc)
            closing = closing or exc.status == 408  # the body was not read
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            message = exc.reason
            if exc.status == 413:
                message = f"the body is larger than {limit} bytes"
            response = _json({"error": message, "status": exc.status}, exc.status)
            closing = exc.status == 413
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception as exc:
            response = internal_error(f"{request.method} {request.path}", exc)
        finally:
            if conn is not None:
                closing = conn.end() or closing
        if closing:
            response.force_close()
        response.headers[APP_HEADER] = api.app_id
        # The time spent here, forwards included: what a client measures beyond it is the
        # network and the wait for a CPU on either side (`python -m bench.lookup` shows both).
        elapsed_ms = (time.perf_counter() - started) * 1000
        response.headers["Server-Timing"] = f"app;dur={elapsed_ms:.3f}"
        return response

    return front


def _api_error(request: web.Request, exc: ApiError) -> web.Response:
    """The answer of a refused request; a 500 says only "internal error" (its message is
    logged with the id)."""
    if exc.status == 500:
        return internal_error(f"{request.method} {request.path}", exc)
    return _error_response(exc)


def check_escapes(raw_path: str) -> None:
    """400 unless the path's and query's percent-escapes decode as UTF-8 (aiohttp would pass
    `%ff` on as the three characters, naming another user)."""
    try:
        urllib.parse.unquote_to_bytes(raw_path).decode("utf-8")
    except UnicodeDecodeError as exc:
        msg = "the URL has percent-escapes that are not UTF-8 (quote the user id's UTF-8 bytes)"
        raise ApiError(400, msg) from exc


async def read_body(request: web.Request, limits: Limits) -> bytes:
    """The request body, read within the body deadline (408 after it) and the size limit
    (413: the aiohttp application's client_max_size)."""
    try:
        async with asyncio.timeout(limits.body_timeout_s):
            return await request.read()
    except TimeoutError as exc:
        msg = f"the body did not arrive within {limits.body_timeout_s:g} s"
        raise ApiError(408, msg) from exc


PUBLIC_PATHS: Final = frozenset({"/livez", "/openapi.json"})
"""Answered without a token: nothing about the worker or its users."""


def _auth(api: Api) -> Any:
    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        token = api.token
        if token and request.path not in PUBLIC_PATHS:
            # Header bytes that are not UTF-8 arrive as surrogate escapes: compared as the
            # bytes sent, they cannot match (401), and cannot fail to encode.
            given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
            scheme, _, value = given.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(
                value.strip(), token.encode()
            ):
                return _json(
                    {"error": "missing or wrong bearer token (ORACULAR_API_TOKEN)", "status": 401},
                    401,
                    {"WWW-Authenticate": 'Bearer realm="oracular"'},
                )
        return await handler(request)

    return auth


class _Handlers:
    def __init__(self, api: Api) -> None:
        self.api = api
        self.node = api.node
        self.config_id = config_identity(api.config)
        self.contract: str | None = None
        """GET /openapi.json's body."""

    # --- health and metrics -----------------------------------------------------------

    async def livez(self, request: web.Request) -> web.Response:
        return _json({"live": True})  # no token needed: nothing about the worker

    async def readyz(self, request: web.Request) -> web.Response:
        reasons = self.node.health()
        body = {"ready": not reasons, "worker": self.node.me, "reasons": reasons}
        if reasons:
            return _json(body, 503, {"Retry-After": str(RETRY_AFTER_S)})
        return _json(body)

    async def metrics(self, request: web.Request) -> web.Response:
        handled = getattr(processor_module, "HANDLED", ())
        outputs = [getattr(processor_module, name, None) for name in ("PREDICTIONS", "EPISODES")]
        counts = dict.fromkeys(getattr(processor_module, "REPORTED", ()), 0)
        counts.update(self.node.counts())
        lags = self.node.lag()
        families = processor_families(
            counts,
            handled,
            [o for o in outputs if o is not None],
            by_partition=self.node.inputs_by_partition(),
            partitions=lags,
            closed_by_reason=self.node.episodes_by_reason(),
            reasons=get_args(Reason),
        )
        lag = Family("oracular_partition_lag", "gauge", "Input messages waiting, per partition.")
        for partition, value in sorted(lags.items()):
            lag.add(value, (("partition", str(partition)),))
        reads = Family(
            "oracular_lookup_reads_total",
            "counter",
            "Users read by lookups answered here, by source (decoded-user cache or table).",
        )
        for source in ("cache", "table"):
            reads.add(self.api.reads[source], (("source", source),))
        families += [lag, *self.node.gauges(), *self.api.metrics.families(), reads]
        if self.api.guard is not None:
            families += self.api.guard.families()
        families.append(
            Family("oracular_config_info", "gauge", "The engine config's hash.").add(
                1, (("config", self.config_id),)
            )
        )
        # Prometheus asks for OpenMetrics in its Accept header; other scrapers get the text
        # format every Prometheus-compatible reader takes.
        openmetrics = "application/openmetrics-text" in request.headers.get("Accept", "")
        kind = OPENMETRICS_CONTENT_TYPE if openmetrics else CONTENT_TYPE
        return web.Response(
            text=render(families, openmetrics=openmetrics),
            headers={"Content-Type": kind},
            charset=None,
        )

    async def openapi(self, request: web.Request) -> web.Response:
        if self.contract is None:  # built once: the worker's URL and config do not change
            document = openapi_document(self.node.me, list(self.api.config.intents))
            self.contract = json.dumps(document, separators=(",", ":"))
        return web.Response(text=self.contract, content_type="application/json")

    async def routing(self, request: web.Request) -> web.Response:
        return _json(self.node.routing())

    # --- lookups --------------------------------------------------------------------------

    async def user(self, request: web.Request) -> web.StreamResponse:
        return await self._single(request, "user", None)

    async def intent(self, request: web.Request) -> web.StreamResponse:
        return await self._single(request, "intent", request.match_info["intent"])

    async def _single(
        self, request: web.Request, endpoint: str, intent: str | None
    ) -> web.StreamResponse:
        started = time.perf_counter()
        status = "invalid"
        try:
            user = check_user(request.match_info["user"])
            intents = None if intent is None else check_intents(self.api.config, intent)
            query = request.query
            stale = parse_bool(query.get("stale"), "stale")
            with_explain = parse_bool(query.get("explain"), "explain")
            at = parse_at(query.get("at"), self.api.clock())
            forwarded = FORWARDED_HEADER in request.headers
            partition = partition_for(user, self.node.partitions)
            view = self.node.view(partition)
            decision = route(partition, view, stale=stale, forwarded=forwarded)
            if decision.action == "forward":
                assert decision.url is not None
                response, status = await self._forward_single(
                    request, decision.url, user, partition
                )
                return response
            if decision.action == "unavailable":
                status = "unavailable"
                raise ApiError(503, decision.reason, retry_after=RETRY_AFTER_S, partition=partition)
            body = self._local(
                user,
                partition,
                decision,
                settling=view.settling,
                intents=intents,
                at=at,
                with_explain=with_explain,
            )
            status = "found" if body["known"] else "unknown"
            return _answer(body)
        except ApiError as exc:
            if exc.status == 504:
                status = "timeout"
            elif exc.status == 503:
                status = "unavailable"
            elif exc.status >= 500:
                status = "error"
            raise
        finally:
            self.api.metrics.lookup(endpoint, status, time.perf_counter() - started)

    def _local(
        self,
        user: str,
        partition: int,
        decision: Route,
        *,
        settling: bool,
        intents: list[str] | None,
        at: int,
        with_explain: bool,
        with_status: bool = False,
    ) -> dict[str, Any]:
        """Answer from this worker's copy of the partition (one user read)."""
        return answer(
            self._read(user, partition, decision, settling=settling, full=with_explain),
            user,
            intents=intents,
            at=at,
            with_explain=with_explain,
            served_by={"worker": self.node.me, "role": decision.role},
            config_id=self.config_id,
            app_id=self.api.app_id,
            with_status=with_status,
        )

    def _read(
        self, user: str, partition: int, decision: Route, *, settling: bool, full: bool
    ) -> UserRead:
        """The user as predictions read it (or, with `full`, its whole state: for `explain`):
        from the cache of users read when this worker owns the partition and is not
        rebalancing or restoring it, else read and decoded from the table copy the route
        chose. Whole states are not kept: `explain` is rare, and a reading is a third of the
        decoding."""
        key = user.encode()
        cached = decision.role == "active" and not settling and not full
        cache = self.api.cache if cached else None
        if cache is not None:
            read = cache.peek(key)
            if read is not None and read.partition == partition:
                self.api.reads["cache"] += 1
                return read
        raw = self.node.get(partition, key)
        self.api.reads["table"] += 1
        if raw is None:
            return read_user(None, self.api.config, partition)
        try:
            read = read_user(raw, self.api.config, partition, full=full)
        except EngineError as exc:  # a stored state this worker cannot read
            msg = f"the stored state of user {user[:64]!r} cannot be read: {exc}"
            raise ApiError(500, msg, partition=partition) from exc
        if cache is not None:
            cache.keep(key, read)
        return read

    async def _forward_single(
        self, request: web.Request, url: str, user: str, partition: int
    ) -> tuple[web.Response, str]:
        body = await read_body(request, self.api.limits) if request.can_read_body else None
        status, payload, headers = await self._forward(request.method, url, request.path_qs, body)
        if status == 200:
            try:
                check_peer_answer(payload, user, partition)
            except PeerAnswerError as exc:
                raise self._bad_peer(url, f"answered {exc}") from exc
        outcome = "forwarded"
        if status == 503:
            outcome = "unavailable"
        return web.Response(
            body=payload, status=status, content_type="application/json", headers=headers
        ), outcome

    async def _forward(
        self, method: str, url: str, path_qs: str, body: bytes | None
    ) -> tuple[int, bytes, dict[str, str]]:
        """One hop to `url`, with this worker's own token (never the caller's), only to an
        allowed peer, redirects not followed; (status, body, headers to pass on). Timeout:
        504; down: 503; a peer not allowed, refusing the token or answering garbage: 502."""
        api = self.api
        assert api.session is not None, "the API was not started"
        await self._check_peer(url)
        headers = {FORWARDED_HEADER: self.node.me, "Content-Type": "application/json"}
        if api.token:
            headers["Authorization"] = f"Bearer {api.token}"
        try:
            async with api.session.request(
                method,
                url.rstrip("/") + path_qs,
                data=body,
                headers=headers,
                allow_redirects=False,
            ) as response:
                payload = await _read_bounded(response.content, MAX_PEER_ANSWER_BYTES + 1)
                status, app = response.status, response.headers.get(APP_HEADER)
                passed = {}
                if "Retry-After" in response.headers:
                    passed["Retry-After"] = response.headers["Retry-After"][:8]
        except TimeoutError as exc:
            api.metrics.forwards[(("outcome", "timeout"),)] += 1
            msg = f"the owning worker {url} did not answer within {api.forward_timeout_s:g} s"
            raise ApiError(504, msg, worker=url) from exc
        except ClientError as exc:
            api.metrics.forwards[(("outcome", "unreachable"),)] += 1
            msg = f"the owning worker {url} is unreachable ({type(exc).__name__}); retry"
            raise ApiError(503, msg, retry_after=RETRY_AFTER_S, worker=url) from exc
        api.metrics.forwards[(("outcome", str(status)),)] += 1
        if status in (401, 403):
            raise self._bad_peer(
                url,
                f"refused this worker's token ({status}): every worker of the app must have "
                "the same ORACULAR_API_TOKEN",
            )
        if len(payload) > MAX_PEER_ANSWER_BYTES or not (
            status in (200, 503, 504) or 400 <= status < 500
        ):
            raise self._bad_peer(url, f"answered HTTP {status}, not a lookup answer")
        if app != api.app_id:
            raise self._bad_peer(
                url,
                f"is app {str(app)[:64]!r}, not {api.app_id!r}: another app's worker on the "
                "advertised address (check ORACULAR_API_URL and ORACULAR_APP_ID there)",
            )
        return status, payload, passed

    async def _check_peer(self, url: str) -> None:
        """502 unless `url`'s host is an allowed peer (ORACULAR_API_PEERS)."""
        api = self.api
        host = URL(url).host or ""
        addresses = await api.resolve(host)
        if not api.peers.allows(host, addresses):
            raise self._bad_peer(
                url,
                f"is not an allowed peer: {host} ({', '.join(addresses) or 'unresolved'}) is "
                f"outside ORACULAR_API_PEERS ({api.peers.describe()})",
            )

    def _bad_peer(self, url: str, problem: str) -> ApiError:
        """A 502 saying what is wrong with the owning worker; logged once per worker and
        problem (the first words of it), with what to fix."""
        key = (url, problem.split(":", 1)[0][:40])
        if key not in self.api.peer_problems:
            self.api.peer_problems.add(key)
            log.warning("lookup API: not forwarding to the owning worker %s: it %s", url, problem)
        self.api.metrics.forwards[(("outcome", "refused"),)] += 1
        return ApiError(502, f"the owning worker {url} {problem}", worker=url)

    async def batch(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        statuses: dict[str, int] = {}
        try:
            raw = await read_body(request, self.api.limits)
            batch = parse_batch(raw, self.api.config, self.api.limits.max_body_bytes)
            at = batch.at if batch.at is not None else self.api.clock()
            forwarded = FORWARDED_HEADER in request.headers
            results: list[dict[str, Any] | None] = [None] * len(batch.items)
            remote: dict[str, list[int]] = {}
            local: list[tuple[int, int, Route, bool]] = []
            # `route` is a function of the partition's view and the request only: decided once
            # a partition (one view a batch already), not once a user; with whether it settles.
            routes: dict[int, tuple[Route, bool]] = {}
            for n, item in enumerate(batch.items):
                partition = partition_for(item.user, self.node.partitions)
                routed = routes.get(partition)
                if routed is None:
                    view = self.node.view(partition)
                    decision = route(partition, view, stale=batch.stale, forwarded=forwarded)
                    routed = routes[partition] = (decision, view.settling)
                decision, settling = routed
                if decision.action == "forward":
                    assert decision.url is not None
                    remote.setdefault(decision.url, []).append(n)
                elif decision.action == "unavailable":
                    results[n] = _unavailable(item, partition, decision.reason)
                else:
                    local.append((n, partition, decision, settling))
            # The forwards go out first, so the owners answer their users while this worker
            # answers its own (a mixed batch then takes the longer of the two, not the sum).
            forwarding = asyncio.gather(
                *(
                    self._forward_batch(request, url, batch, indexes, at=at, results=results)
                    for url, indexes in remote.items()
                )
            )
            try:
                await self._answer_local(batch, local, at, results, remote_too=bool(remote))
            except BaseException:
                forwarding.cancel()  # a failed batch's forwards are not waited for
                raise
            forwards = await forwarding
            whole = next((answer for answer in forwards if answer is not None), None)
            if whole is not None:  # every user on one other worker: its answer, as it is
                statuses.update(whole[0])
                return web.Response(body=whole[1], content_type="application/json", charset="utf-8")
            final = [r if r is not None else {"status": "unavailable"} for r in results]
            for result in final:
                statuses[result["status"]] = statuses.get(result["status"], 0) + 1
            return _answer(batch_body(at, statuses, final))
        except ApiError:
            statuses["invalid"] = 1
            raise
        finally:
            elapsed = time.perf_counter() - started
            metrics = self.api.metrics
            for status, count in statuses.items():
                metrics.lookups[(("endpoint", "batch"), ("status", status))] += count
            metrics.lookup_seconds.observe(elapsed, (("endpoint", "batch"),))

    async def _answer_local(
        self,
        batch: Any,
        local: list[tuple[int, int, Route, bool]],
        at: int,
        results: list[dict[str, Any] | None],
        *,
        remote_too: bool,
    ) -> None:
        """The batch's users answered here, into their slots of `results`."""
        if remote_too and local:
            await _yield()  # the forwards' requests are written before the local users
        resumed = time.perf_counter()
        for n, partition, decision, settling in local:
            item = batch.items[n]
            try:
                body = self._local(
                    item.user,
                    partition,
                    decision,
                    settling=settling,
                    intents=item.intents,
                    at=at,
                    with_explain=batch.explain,
                    with_status=True,
                )
            except ApiError as exc:  # this user only: the others are answered
                status = "unavailable" if exc.status == 503 else "error"
                results[n] = {**_unavailable(item, partition, exc.message), "status": status}
                continue
            results[n] = body
            if time.perf_counter() - resumed >= YIELD_AFTER_S:
                await _yield()  # never hold the loop for a whole batch
                resumed = time.perf_counter()

    async def _forward_batch(
        self,
        request: web.Request,
        url: str,
        batch: Any,
        indexes: list[int],
        *,
        at: int,
        results: list[dict[str, Any] | None],
    ) -> tuple[dict[str, int], bytes] | None:
        """One forward per owner for its users; their slots get the owner's answers.

        When the owner has every user of the batch, its answer is the batch's answer: then
        (its counts, the answer) are returned to be passed on as they are, without encoding
        all the results again (if its head adds up: `batch_counts`). An owner that is not an
        allowed peer, refuses this worker's token or answers garbage: its users' results are
        errors saying so, or, when it has them all, the batch is a 502.
        """
        items: list[BatchItem] = [batch.items[n] for n in indexes]
        # msgspec: the owner parses the same JSON value (ids are valid Unicode: check_user),
        # and this body is never shown to a client, so its bytes need not be json.dumps's.
        body = msgspec.json.encode(batch.to_json(items, at))
        whole = len(indexes) == len(results)
        try:
            status, payload, _ = await self._forward("POST", url, "/v1/lookup", body)
            if status != 200:
                raise ApiError(status, payload.decode(errors="replace")[:300])
            users = [item.user for item in items]
            # Passed on whole, the answer need only be checked (its shape and users: a peer
            # answers for what was asked, or not at all), not decoded: msgspec's quick look.
            checked = whole and is_peer_batch_for(payload, users)
            try:
                answers = [] if checked else check_peer_batch(payload, users)
            except PeerAnswerError as exc:
                raise self._bad_peer(url, f"answered {exc}") from exc
            if whole:
                counts = batch_counts(payload, at, len(indexes))
                if counts is not None:
                    return counts, payload
                if checked:  # a head that does not add up: its results are used after all
                    answers = check_peer_batch(payload, users)
        except ApiError as exc:
            if whole and exc.status == 502:
                raise
            for n in indexes:
                item = batch.items[n]
                partition = partition_for(item.user, self.node.partitions)
                result = _unavailable(item, partition, exc.message)
                if exc.status == 502:
                    result["status"] = "error"
                results[n] = result
            return None
        for n, result in zip(indexes, answers, strict=True):
            results[n] = result
        return None

    # --- reveals --------------------------------------------------------------------------

    async def revealed(self, request: web.Request) -> web.Response:
        user = check_user(request.match_info["user"])
        body = await read_body(request, self.api.limits)
        intent, ts = parse_reveal(body, self.api.config, self.api.clock(), self.api.max_skew_ms)
        command = {
            "id": f"api-{uuid.uuid4().hex}",
            "user": user,
            "type": "revealed",
            "intent": intent,
            "ts": ts,
        }
        return await self._append_command(user, command, self.api.metrics.reveals, "reveal")

    async def erase(self, request: web.Request) -> web.Response:
        user = check_user(request.match_info["user"])
        reason = parse_erase(await read_body(request, self.api.limits))
        try:
            command = erase_command(user, self.api.clock(), reason)
        except DecodeError as exc:
            raise ApiError(400, str(exc)) from exc
        return await self._append_command(user, command, self.api.metrics.erasures, "erasure")

    async def _append_command(
        self, user: str, command: dict[str, Any], counter: Counter[Any], what: str
    ) -> web.Response:
        """Append a command to the input topic keyed by `user`; 202 with where it went."""
        partition = partition_for(user, self.node.partitions)
        try:
            written, offset = await self.node.append(
                user.encode(), msgpack.packb(command), partition
            )
        except Exception as exc:
            counter[(("outcome", "failed"),)] += 1
            log.warning("lookup API: could not append an %s for %r: %s", what, user[:64], exc)
            msg = f"could not append the {what} to {self.node.events_topic}: {exc}; retry"
            raise ApiError(503, msg, retry_after=RETRY_AFTER_S) from exc
        counter[(("outcome", "accepted"),)] += 1
        return _json(
            {
                "accepted": True,
                "command": command,
                "topic": self.node.events_topic,
                "partition": written,
                "offset": offset,
            },
            202,
        )


async def _read_bounded(stream: Any, limit: int) -> bytes:
    """A body read to its end, or to `limit` bytes if it is longer (`read(n)` alone returns
    what has arrived so far)."""
    body = bytearray()
    while len(body) < limit and (chunk := await stream.read(limit - len(body))):
        body += chunk
    return bytes(body)


async def _yield() -> None:
    """Let the event loop run what is ready (other lookups) before going on."""
    await asyncio.sleep(0)


def _unavailable(item: BatchItem, partition: int, reason: str) -> dict[str, Any]:
    return {"user": item.user, "status": "unavailable", "partition": partition, "error": reason}


# --- the Faust side -----------------------------------------------------------------------


class FaustNode:
    """The running Faust app as the API process's feed (`streams.lookup.replica.Feed`) reads
    it: assignment, table copies, lag, counters, the producer."""

    def __init__(self, app: Any, runtime: Any, me: str, settings: Settings) -> None:
        self.app, self.runtime, self.me = app, runtime, me
        self.ready_max_lag = settings.ready_max_lag
        self.partitions = settings.topics.events.partitions
        self.events_topic = settings.topics.events.name
        self.config = runtime.processor.config
        self.table = app.tables[STATE_TABLE]
        self.assigned_once = False
        self.worker_loop: asyncio.AbstractEventLoop | None = None
        """The Faust worker's loop, where produce calls must run (set when the API starts)."""

    @property
    def changelog(self) -> str:
        name: str = self.table.changelog_topic.get_topic_name()
        return name

    def _settling(self) -> bool:
        app = self.app
        return bool(app.rebalancing or getattr(app, "in_recovery", False))

    def _owners(self) -> dict[int, str]:
        owners = {}
        with contextlib.suppress(KeyError, AttributeError):
            for url, topics in self.app.assignor.tables_metadata().items():
                for partition in topics.get(self.changelog, ()):
                    owners[partition] = str(url)
        return owners

    def views(self) -> dict[int, tuple[str | None, bool, str | None]]:
        """Every partition's (local role, settling, owner URL) for the API process's status:
        an owner is settling while rebalancing or restoring, or until its copy is open; a
        standby counts once its copy is open."""
        from faust.types import TP  # noqa: PLC0415

        assignor = self.app.assignor
        actives, standbys = assignor.assigned_actives(), assignor.assigned_standbys()
        dbs = faust_patches.open_partitions(self.table)
        settling, owners = self._settling(), self._owners()
        views = {}
        for partition in range(self.partitions):
            tp = TP(self.changelog, partition)
            local: str | None = None
            here = settling
            if tp in actives:
                local = "active"
                here = settling or partition not in dbs
            elif tp in standbys and partition in dbs:
                local = "standby"
            views[partition] = (local, here, owners.get(partition))
        return views

    def databases(self) -> dict[int, Any]:
        """The open local copies (RocksDB databases) by partition."""
        return faust_patches.open_databases(self.table)

    def routing(self) -> dict[str, Any]:
        owners = self._owners()
        assignor = self.app.assignor
        mine = {
            "active": sorted(
                tp.partition for tp in assignor.assigned_actives() if tp.topic == self.changelog
            ),
            "standby": sorted(
                tp.partition for tp in assignor.assigned_standbys() if tp.topic == self.changelog
            ),
        }
        return {
            "generation": self.app.consumer_generation_id,
            "rebalancing": bool(self.app.rebalancing),
            "recovering": bool(getattr(self.app, "in_recovery", False)),
            "worker": self.me,
            "partitions": {str(p): owners.get(p) for p in range(self.partitions)},
            "here": mine,
        }

    def health(self) -> list[str]:
        app = self.app
        reasons = []
        if not self.assigned_once:
            reasons.append("starting: no partition assignment yet")
        if app.rebalancing:
            reasons.append("rebalancing")
        if getattr(app, "in_recovery", False):
            reasons.append("recovering tables")
        if self.assigned_once and app.unassigned:
            reasons.append("unassigned: this worker owns no partition")
        lag = sum(self.lag().values())
        if lag > self.ready_max_lag:
            reasons.append(f"lag {lag} > ORACULAR_READY_MAX_LAG {self.ready_max_lag}")
        reasons += self.runtime.disk.health()
        if FAIL_STOP.stopping is not None:
            reasons.append(f"stopping: {FAIL_STOP.stopping.kind}")
        return reasons

    def lag(self) -> dict[int, int]:
        lags = self.runtime.positions.partition_lags()
        return {partition: lag for partition, lag in lags.items() if lag is not None}

    def counts(self) -> Mapping[str, int]:
        return dict(self.runtime.processor.counts)

    def inputs_by_partition(self) -> Mapping[tuple[str, int], int]:
        return dict(self.runtime.processor.by_partition)

    def episodes_by_reason(self) -> Mapping[str, int]:
        return dict(self.runtime.processor.closed_by_reason)

    def gauges(self) -> list[Family]:
        assignor = self.app.assignor
        assigned = Family("oracular_assigned_partitions", "gauge", "State partitions held here.")
        for role, tps in (
            ("active", assignor.assigned_actives()),
            ("standby", assignor.assigned_standbys()),
        ):
            assigned.add(sum(1 for tp in tps if tp.topic == self.changelog), (("role", role),))
        return [
            assigned,
            Family("oracular_rebalancing", "gauge", "1 while a rebalance is under way.").add(
                int(bool(self.app.rebalancing))
            ),
            Family("oracular_recovering", "gauge", "1 while tables are being restored.").add(
                int(bool(getattr(self.app, "in_recovery", False)))
            ),
            Family("oracular_ready", "gauge", "1 when /readyz answers 200.").add(
                int(not self.health())
            ),
            Family("oracular_assignment_generation", "gauge", "Consumer group generation.").add(
                self.app.consumer_generation_id
            ),
            self._restore_family(),
            *self._datadir_families(),
            *monitor_families(self.app.monitor),
        ]

    def _datadir_families(self) -> list[Family]:
        """The datadir's free space and its guard (streams/runtime/diskguard.py), and the
        corrupt local copies set aside (streams/faust/stores.py)."""
        disk = self.runtime.disk
        return [
            Family(
                "oracular_datadir_free_bytes",
                "gauge",
                "Free bytes on the datadir's disk, as last read (-1: not read yet).",
            ).add(-1 if disk.free_bytes is None else disk.free_bytes),
            Family(
                "oracular_datadir_min_free_bytes",
                "gauge",
                "ORACULAR_MIN_FREE_BYTES: below it the worker takes no input (0: no guard).",
            ).add(disk.min_free),
            Family(
                "oracular_datadir_low",
                "gauge",
                "1 while input is held because the datadir's disk is low on space.",
            ).add(int(disk.holding)),
            Family(
                "oracular_store_set_aside_total",
                "counter",
                "Corrupt local copies set aside (and restored from the changelog).",
            ).add(faust_patches.set_aside_count[0]),
        ]

    def _restore_family(self) -> Family:
        """Changelog records still to restore, for active and standby partitions: the
        progress of a recovery (0 once the tables are up to date)."""
        family = Family(
            "oracular_restore_remaining_records",
            "gauge",
            "Changelog records still to restore before the table copies are up to date.",
        )
        recovery = getattr(self.app.tables, "recovery", None)
        for role in ("active", "standby"):
            remaining = getattr(recovery, f"{role}_remaining_total", None)
            for _ in range(3):  # Faust's offsets change on the worker's thread meanwhile
                try:
                    family.add(int(remaining()) if remaining else 0, (("role", role),))
                    break
                except RuntimeError:  # a dict changed while it was read: read again
                    continue
        return family

    async def append(self, key: bytes, value: bytes, partition: int) -> tuple[int, int]:
        """Produce on the worker's own loop (Faust's producer lives there), from any loop."""
        worker_loop = self.worker_loop
        if worker_loop is None or worker_loop is asyncio.get_running_loop():
            return await self._append(key, value, partition)
        future = asyncio.run_coroutine_threadsafe(self._append(key, value, partition), worker_loop)
        return await asyncio.wrap_future(future)

    async def _append(self, key: bytes, value: bytes, partition: int) -> tuple[int, int]:
        sent = await self.app.producer.send(self.events_topic, key, value, partition, None, None)
        metadata = await sent
        return int(metadata.partition), int(metadata.offset)


class ApiService(Service):
    """Runs the API in a process of its own (`streams.lookup.replica`), fed by this worker.

    Started before the consumer joins the group, so `/livez` and `/readyz` answer during
    start-up and recovery (partitions not yet copied to the API process are settling)."""

    def __init__(
        self, app: Any, feed: Feed, url: str, sock: socket.socket, datadir: Path | None = None
    ) -> None:
        super().__init__()
        self.app, self.feed, self.url, self.sock = app, feed, url, sock
        self.url_file = None if datadir is None else datadir / API_URL_FILE

    async def on_start(self) -> None:
        # Before the consumer joins: a `faust worker --web-port` must not change the URL the
        # assignor advertises for this worker.
        self.app.conf.canonical_url = self.url
        self.feed.node.worker_loop = asyncio.get_running_loop()
        await self.feed.start()
        host, port = self.sock.getsockname()[:2]
        log.info(
            "oracular lookup API on %s:%s, advertised to other workers as %s", host, port, self.url
        )
        if self.url_file is not None:  # `oracular query` finds it there (a free port too)
            with contextlib.suppress(OSError):
                self.url_file.parent.mkdir(parents=True, exist_ok=True)
                partial = self.url_file.with_suffix(".partial")
                partial.write_text(self.url + "\n")
                partial.replace(self.url_file)
        log.info(
            "lookup API process: %s%s",
            self.feed.process.pid if self.feed.process else "?",
            cpus_line(self.feed.args.cpus),
        )

    async def on_stop(self) -> None:
        await self.feed.stop()
        if self.url_file is not None:
            with contextlib.suppress(OSError):
                self.url_file.unlink()


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket on host:port (port 0: a free one)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    sock.listen(128)  # now: a port bound but not listening could be bound again
    sock.setblocking(False)
    return sock


def advertised_url(settings: Settings, sock: socket.socket) -> str:
    """The URL other workers use: ORACULAR_API_URL, else http(s)://host:bound port (https
    with ORACULAR_API_TLS_CERT)."""
    if settings.api_url:
        return str(URL(settings.api_url.rstrip("/")))  # as Faust's assignor will spell it
    port = sock.getsockname()[1]
    host = settings.api_host
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    if ":" in host:
        host = f"[{host}]"
    scheme = "https" if settings.api_tls_cert is not None else "http"
    return str(URL(f"{scheme}://{host}:{port}"))


def _refuse(message: str) -> NoReturn:
    """Stop the worker before it starts: one line on stderr, exit 2 (a settings problem)."""
    print(f"oracular worker: {message}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


def check_exposure(settings: Settings, sock: socket.socket) -> None:
    """Refuse to serve a non-loopback address without a token, unless
    ORACULAR_API_ALLOW_NO_TOKEN says so (then warn, at every start)."""
    host = str(sock.getsockname()[0])
    if ipaddress.ip_address(host.split("%", maxsplit=1)[0]).is_loopback or settings.api_token:
        return
    where = f"the lookup API on {host} (ORACULAR_API_HOST={settings.api_host})"
    if not settings.api_allow_no_token:
        _refuse(
            f"{where} would serve predictions and take reveals from the network without a "
            "token: set ORACULAR_API_TOKEN or ORACULAR_API_TOKEN_FILE, bind 127.0.0.1, or set "
            "ORACULAR_API_ALLOW_NO_TOKEN=true to serve it open (docs/serving.md)"
        )
    warning = (
        f"{where} serves without a token (ORACULAR_API_ALLOW_NO_TOKEN=true): anyone who can "
        "reach it reads predictions and posts reveals"
    )
    log.warning("%s", warning)
    print(f"oracular worker: WARNING: {warning}", file=sys.stderr)


def tls_paths(settings: Settings) -> tuple[str | None, str | None, str | None]:
    """(ORACULAR_API_TLS_CERT, ORACULAR_API_TLS_KEY, ORACULAR_API_TLS_CAFILE) as paths."""
    cert, key, cafile = settings.api_tls_cert, settings.api_tls_key, settings.api_tls_cafile
    return tuple(None if p is None else str(p) for p in (cert, key, cafile))  # type: ignore[return-value]


def tls_contexts(settings: Settings) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
    """(the API's server context with ORACULAR_API_TLS_CERT/KEY, the forwarding client's
    context with ORACULAR_API_TLS_CAFILE); None where unset. A file that cannot be loaded
    stops the worker with one line."""
    return load_tls(*tls_paths(settings))


def load_tls(
    cert: str | None, key: str | None, cafile: str | None
) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
    """`tls_contexts` from the three paths."""
    server = client = None
    try:
        if cert is not None and key is not None:
            server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            server.load_cert_chain(cert, key)
        if cafile is not None:
            client = ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        _refuse(
            "cannot load the lookup API's TLS files (ORACULAR_API_TLS_CERT, "
            f"ORACULAR_API_TLS_KEY, ORACULAR_API_TLS_CAFILE): {exc}"
        )
    return server, client


def own_names(settings: Settings, url: str) -> list[str]:
    """The host names this worker is asked by: its bind address, its advertised URL's host
    and this machine's names (`streams.lookup.crosssite.Hosts`)."""
    names = [settings.api_host, URL(url).host or "", socket.gethostname()]
    with contextlib.suppress(OSError):
        names.append(socket.getfqdn())
    return names


def allowed_peers(settings: Settings, sock: socket.socket) -> Peers:
    """ORACULAR_API_PEERS, else loopback, this host's addresses and the brokers' networks."""
    if settings.api_peers:
        return Peers.parse(settings.api_peers)  # checked by load_settings
    hosts = {str(sock.getsockname()[0])}
    brokers: set[str] = set()
    for name, into in [(socket.gethostname(), hosts)] + [
        (URL(f"//{h.split('://')[-1].strip()}").host or "", brokers)
        for h in settings.broker.split(",")
        if h.strip()
    ]:
        with contextlib.suppress(OSError, UnicodeError):
            into.update(str(info[4][0]) for info in socket.getaddrinfo(name, None))
    hosts -= {"0.0.0.0", "::"}
    peers = Peers.around(sorted(hosts), sorted(brokers))
    log.info("lookup API: forwards only to workers in %s (ORACULAR_API_PEERS)", peers.describe())
    return peers


def bind_api(settings: Settings, default_port: int = DEFAULT_PORT) -> socket.socket:
    """The API's listening socket: ORACULAR_API_HOST:ORACULAR_API_PORT, or `default_port`
    when the port is unset (a free port when that is taken, said in one line on stderr). A
    port that cannot be had stops the worker: one line on stderr, exit 69."""
    port = default_port if settings.api_port is None else settings.api_port
    try:
        try:
            sock = bind(settings.api_host, port)
        except OSError:
            if settings.api_port is not None:
                raise
            sock = bind(settings.api_host, 0)  # a second worker on this host
            taken = (
                f"the lookup API's port {port} on {settings.api_host} is taken (another "
                f"worker?): serving on port {sock.getsockname()[1]} instead; set "
                "ORACULAR_API_PORT to choose one"
            )
            log.warning("lookup API: %s", taken)
            print(f"oracular worker: {taken}", file=sys.stderr)
    except OSError as exc:
        print(
            f"oracular worker: cannot serve the lookup API on {settings.api_host}:{port}: "
            f"{exc.strerror or exc}. Set ORACULAR_API_PORT to a free port (0 picks one) or "
            "ORACULAR_API_HOST (docs/serving.md).",
            file=sys.stderr,
        )
        raise SystemExit(EXIT_UNAVAILABLE) from exc
    return sock


def install_serving(app: Any, runtime: Any, settings: Settings) -> Feed:
    """Serve the API from this worker: bind, advertise, route, time batches.

    Binds the socket now, so the URL Faust's assignor shares with the group is known before
    the worker joins; Faust's own table views stay off. The API runs in a process of its own
    (`streams.lookup.replica`) that this worker starts and feeds.
    """
    sock = bind_api(settings)
    check_exposure(settings, sock)
    tls_contexts(settings)  # a file that cannot be loaded stops the worker here, in one line
    url = advertised_url(settings, sock)
    app.conf.canonical_url = url
    app.conf.web_tables_enabled = False  # Faust's raw /table views: never
    # Faust applies a standby's changelog records in batches of this many (default 1,000, with
    # no time bound): a stale read could trail the owner by that many writes. One at a time,
    # a standby trails only by the changelog's replication delay.
    node_table = app.tables[STATE_TABLE]
    node_table.standby_buffer_size = 1
    node = FaustNode(app, runtime, url, settings)
    args = ChildArgs(
        url=url,
        app_id=settings.app_id,
        config=node.config,
        partitions=node.partitions,
        events_topic=node.events_topic,
        token=settings.api_token,
        forward_timeout_s=settings.api_forward_timeout_s,
        max_skew_ms=settings.max_skew_ms,
        peers=allowed_peers(settings, sock),
        hosts=Hosts.of(settings.api_hosts, own_names(settings, url)),
        limits=Limits.from_settings(settings),
        tls=tls_paths(settings),
        log_level=logging.getLogger("oracular").getEffectiveLevel(),
        nice=DEFAULT_API_NICE if settings.api_nice is None else settings.api_nice,
        nice_set=settings.api_nice is not None,
        realtime=settings.api_realtime,
        cpus=reserve_cpus(settings.api_cpus),
    )
    metrics = Metrics()
    feed = Feed(args, sock, node, metrics)
    runtime.watch_writes(feed.written)
    app.add_dependency(ApiService(app, feed, url, sock, settings.state_dir))

    @app.on_partitions_assigned.connect  # type: ignore[untyped-decorator]
    async def assigned(sender: Any, *_: Any, **__: Any) -> None:
        node.assigned_once = True

    runtime.time_batches(metrics.batch)
    return feed
