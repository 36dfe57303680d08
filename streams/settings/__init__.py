"""Worker settings, defined once: defaults <- environment (`ORACULAR_*`) <- command-line flags.
The `SETTINGS` table and its one builder here; the product's topics in `topics.py`.

`SETTINGS` below is the one table of every deployment knob: its name, type, default, environment
variable, `oracular worker` flag (if it has one) and what it means. Everything else is derived
from it: the `Settings` object's defaults, `load_settings` (the one builder: `oracular worker`,
`backfill`, `produce`, `tail`, `reset`, `query` and `faust -A streams.worker worker` all read
their settings through it), the flags' help texts (`add_flag`) and the settings table in
docs/operations.md (`markdown_table`; a test fails when the page differs, and
`python -m streams.settings` prints the table to paste).

The engine's config (intents, signals, episodes) is a separate file (`ORACULAR_CONFIG`); these
are the deployment's knobs. There is no settings file: a deployment sets variables or flags.
Defaults point at the broker `make broker-up` starts. Credentials are read here and never
logged (`Settings.__repr__` and `describe` leave them out).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Final

from streams.settings.cpus import check_cpus
from streams.settings.hosts import problems as host_problems
from streams.settings.peers import Peers
from streams.settings.topics import ProductTopics, declare_topics

DEFAULT_BROKER: Final = "127.0.0.1:9092"
DEFAULT_APP_ID: Final = "oracular"
DEFAULT_API_PORT: Final = 6067
"""The lookup API's port when ORACULAR_API_PORT is unset (a free one if it is taken)."""
APP_HEADER: Final = "X-Oracular-App"
"""The lookup API's header on every answer: the answering worker's app id (ORACULAR_APP_ID)."""

# RocksDB's defaults are per partition DB (64 MiB write buffer x 3 and a 2 GiB block cache):
# with 8 partitions that is GiBs. These bound one worker's table to ~100 MiB per partition.
ROCKSDB_OPTIONS: Final = {
    "write_buffer_size": 8 << 20,
    "max_write_buffer_number": 2,
    "block_cache_size": 32 << 20,
}


def open_file_limit() -> int:
    """The process's soft limit on open files (`ulimit -n`; 1024 where it cannot be read)."""
    try:
        import resource  # noqa: PLC0415 - POSIX only

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 1024
    return soft if 0 < soft < 1 << 30 else 1 << 20


class SettingsError(ValueError):
    """A setting has a value the worker cannot use; one line per problem, each naming the
    variable or flag the value came from."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One row of the settings table."""

    name: str
    """The `Settings` attribute (topic_* and partitions: inputs of `Settings.topics`)."""
    env: str
    """Its environment variable."""
    kind: type
    """int, float, str or Path: how the variable's text is read."""
    default: Any
    """The value when neither variable nor flag is given (None: unset)."""
    help: str
    """What it means: the flag's help text and the doc table's last column."""
    flag: str | None = None
    """The `oracular worker` / `oracular backfill` flag, if it has one."""
    shown: str | None = None
    """The default as shown in help and docs when it is not simply `default` (computed)."""
    secret: bool = False
    """Never logged nor shown."""

    def default_text(self) -> str:
        """The default, as help texts and the doc table show it."""
        if self.shown is not None:
            return self.shown
        if self.default is None:
            return "unset"
        if isinstance(self.default, float) and self.default.is_integer():
            return str(int(self.default))
        return str(self.default)


_TOPIC_ROLES: Final = {
    "events": "input",
    "ticks": "timer's",
    "predictions": "predictions",
    "episodes": "closed episodes",
    "dlq": "dead-letter",
}
"""Topic role -> what the docs call its topic."""

DEFAULT_API_NICE: Final = -5
"""ORACULAR_API_NICE unset: the API process runs this many `nice` steps above its worker
where that is permitted, quietly at the worker's priority where not (BENCHMARKS.md has the
A/B)."""

SETTINGS: Final[tuple[Setting, ...]] = (
    Setting("config_path", "ORACULAR_CONFIG", Path, Path("examples/oracular.yaml"),
            "the engine config, YAML or JSON (docs/configuration.md)", "--config"),
    Setting("broker", "ORACULAR_BROKER", str, DEFAULT_BROKER,
            "bootstrap servers host:port[,host:port]", "--broker"),
    Setting("app_id", "ORACULAR_APP_ID", str, DEFAULT_APP_ID,
            "Faust app id: consumer group and prefix of its internal (changelog) topics",
            "--app-id"),
    Setting("datadir", "ORACULAR_DATADIR", Path, None,
            "RocksDB and Faust state; one per worker, created 0700, refused if another app's "
            "(its marker file)", "--datadir",
            shown="var/faust/<app id>"),
    Setting("partitions", "ORACULAR_PARTITIONS", int, 8,
            "partitions of every product topic and of the state table", "--partitions"),
    Setting("topic_prefix", "ORACULAR_TOPIC_PREFIX", str, "oracular",
            "topics are named PREFIX.events, PREFIX.ticks, PREFIX.predictions, PREFIX.episodes "
        "and PREFIX.events.dlq",
            "--topic-prefix"),
    *(
        Setting(f"topic_{role}", f"ORACULAR_TOPIC_{role.upper()}", str, None,
                f"a full name for the {_TOPIC_ROLES[role]} topic instead of the prefixed one",
                shown=f"PREFIX.{'events.dlq' if role == 'dlq' else role}")
        for role in _TOPIC_ROLES
    ),
    Setting("tick_interval_s", "ORACULAR_TICK_INTERVAL_S", float, 1.0,
            "seconds between the timer's ticks of each owned partition", "--tick-interval"),
    Setting("lateness_ms", "ORACULAR_LATENESS_MS", int, 120_000,
            "the watermark trails the newest event time by this; disorder across users within "
            "it changes nothing (docs/time.md)", "--lateness-ms"),
    Setting("idle_ms", "ORACULAR_IDLE_MS", int, 30_000,
            "a caught-up partition without input this long runs its clock on with the wall "
            "clock, so silent users close on time", "--idle-ms"),
    Setting("max_skew_ms", "ORACULAR_MAX_SKEW_MS", int, 60_000,
            "an input's time may run this far ahead of its record's timestamp (and of the "
            "worker's clock); further ahead it is dead-lettered (`clock_ahead`), so a wrong "
            "device clock moves no user into the future (docs/time.md)", "--max-skew-ms"),
    Setting("output_format", "ORACULAR_OUTPUT_FORMAT", str, "msgpack",
            "msgpack or json, on the output topics", "--output-format"),
    Setting("web_port", "ORACULAR_WEB_PORT", int, None,
            "serve Faust's own web views (its statistics pages) on this port, bound to "
            "`ORACULAR_API_HOST`; never its raw table views or `/router` (state and the "
            "workers' URLs, without the API's token). Unset: no Faust web server; the lookup "
            "API (`docs/serving.md`) is separate", "--web-port"),
    Setting("batch_max", "ORACULAR_BATCH_MAX", int, 500,
            "most messages applied per batch (one state read and write per user)"),
    Setting("state_cache_users", "ORACULAR_STATE_CACHE_USERS", int, 50_000,
            "decoded user states kept between batches, least recently used evicted (0: no "
            "cache); each costs a few KiB and saves a read and a decode (BENCHMARKS.md)"),
    Setting("state_write_interval_s", "ORACULAR_STATE_WRITE_INTERVAL_S", float, 2.0,
            "while a full batch waits in the worker's buffer (a backlog), the states of the "
            "batches applied are written together, at the latest this long after the first: "
            "one changelog record per user instead of one per batch; their inputs are acked "
            "once written (0: every batch writes its own; docs/operations.md)"),
    Setting("batch_window_s", "ORACULAR_BATCH_WINDOW_S", float, 0.005,
            "batches start at most this often: a batch that is not full waits until this "
            "long after the last one started (one that took longer is followed at once); "
            "latency against batch size (a shorter window, a lower p99 at half load; a "
            "backlog fills batches at once, so throughput is the same; BENCHMARKS.md)"),
    Setting("fetch_max_wait_ms", "ORACULAR_FETCH_MAX_WAIT_MS", int, 2,
            "longest the broker holds a fetch that finds no new input while input arrives "
            "(an idle worker's fetches wait 500 ms); a fetch of quiet partitions holds the "
            "busy ones back this long (Faust's 1,500 ms delivered input in 1-second bursts)"),
    Setting("consumer_loop", "ORACULAR_CONSUMER_LOOP", str, "worker",
            "where the Kafka consumer runs: `worker`, on the worker's event loop, or `thread`, "
            "in a thread of its own as Faust runs it (which waits for the GIL while the worker "
            "applies batches: a higher p50 and p99 latency at half load, BENCHMARKS.md)"),
    Setting("summary_interval_s", "ORACULAR_SUMMARY_INTERVAL_S", float, 30.0,
            "how often the worker logs its counters"),
    Setting("commit_interval_s", "ORACULAR_COMMIT_INTERVAL_S", float, 1.0,
            "how often consumed offsets are committed"),
    Setting("session_timeout_s", "ORACULAR_SESSION_TIMEOUT_S", float, 10.0,
            "a dead worker leaves the group after this"),
    Setting("shutdown_timeout_s", "ORACULAR_SHUTDOWN_TIMEOUT_S", float, 30.0,
            "a stop (SIGTERM, Ctrl-C) that takes longer than this (a broker gone, a write "
            "that never returns) ends the worker anyway, with exit 124 and nothing more "
            "acknowledged: the next owner applies the rest again"),
    Setting("min_free_bytes", "ORACULAR_MIN_FREE_BYTES", int, 64 * 1024 * 1024,
            "the worker takes no input while its datadir's disk has less free space than "
            "this (not ready, `oracular_datadir_low` 1; docs/operations.md), so RocksDB never "
            "fills the disk mid-batch (0: no guard)"),
    Setting("replication_factor", "ORACULAR_REPLICATION_FACTOR", int, 1,
            "replication of the topics the worker creates (use 3 on a real cluster)"),
    Setting("standby_replicas", "ORACULAR_STANDBY_REPLICAS", int, 0,
            "table standbys on other workers (0 for one worker)"),
    Setting("security_protocol", "ORACULAR_SECURITY_PROTOCOL", str, "PLAINTEXT",
            "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"),
    Setting("sasl_mechanism", "ORACULAR_SASL_MECHANISM", str, "PLAIN",
            "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"),
    Setting("sasl_username", "ORACULAR_SASL_USERNAME", str, None,
            "SASL user name (never logged)", secret=True),
    Setting("sasl_password", "ORACULAR_SASL_PASSWORD", str, None,
            "SASL password (never logged)", secret=True),
    Setting("ssl_cafile", "ORACULAR_SSL_CAFILE", str, None,
            "CA bundle for SSL and SASL_SSL (unset: the system's)"),
    Setting("ssl_certfile", "ORACULAR_SSL_CERTFILE", str, None,
            "client certificate for mutual TLS"),
    Setting("ssl_keyfile", "ORACULAR_SSL_KEYFILE", str, None,
            "the client certificate's private key (never logged)", secret=True),
    Setting("erasure_key", "ORACULAR_ERASURE_KEY", str, None,
            "secret key of the digests that remember erased users (docs/lifecycle.md). Unset: "
            "a fixed, public key, so whoever reads the changelog can test a guessed user id "
            "against them. Keep it once users are erased: under another key their markers are "
            "not found", secret=True),
    Setting("api_host", "ORACULAR_API_HOST", str, "127.0.0.1",
            "the lookup API's bind address (docs/serving.md)", "--api-host"),
    Setting("api_port", "ORACULAR_API_PORT", int, None,
            f"the lookup API's port; 0 picks a free one. Unset: {DEFAULT_API_PORT}, or a free "
            f"port when {DEFAULT_API_PORT} is taken (a second worker on one host); the port is "
            "logged and advertised", "--api-port", shown=str(DEFAULT_API_PORT)),
    Setting("api_url", "ORACULAR_API_URL", str, None,
            "the URL other workers forward lookups to (set it behind NAT or in containers)",
            "--api-url", shown="http://<host>:<port>"),
    Setting("api_token", "ORACULAR_API_TOKEN", str, None,
            "bearer token required by every API endpoint but /livez (never logged); set but "
            "empty is an error. Required to bind a non-loopback address (docs/serving.md)",
            secret=True),
    Setting("api_token_file", "ORACULAR_API_TOKEN_FILE", Path, None,
            "a file holding the token instead (read once at start; surrounding whitespace "
            "ignored)"),
    Setting("api_allow_no_token", "ORACULAR_API_ALLOW_NO_TOKEN", bool, False,
            "true: serve a non-loopback ORACULAR_API_HOST without a token (anyone who can reach "
            "it reads predictions and posts reveals; warned at every start)", shown="false"),
    Setting("api_tls_cert", "ORACULAR_API_TLS_CERT", Path, None,
            "serve the API over TLS with this PEM certificate (chain); with ORACULAR_API_TLS_KEY"),
    Setting("api_tls_key", "ORACULAR_API_TLS_KEY", Path, None,
            "the TLS certificate's PEM private key (never logged)"),
    Setting("api_tls_cafile", "ORACULAR_API_TLS_CAFILE", Path, None,
            "CA bundle that verifies the other workers' API certificates when forwarding, and "
            "the worker's for `oracular query` (unset: the system's)"),
    Setting("api_forward_timeout_s", "ORACULAR_API_FORWARD_TIMEOUT_S", float, 2.0,
            "a lookup forwarded to the owning worker gives up after this (504)"),
    Setting("api_hosts", "ORACULAR_API_HOSTS", str, None,
            "host names the lookup API's /v1/ endpoints answer to besides IP addresses, "
            "localhost, this machine's names and the advertised URL's host: comma-separated, or "
            "`*` for any; another name in a request's Host gets 421 (DNS rebinding; "
            "docs/serving.md)", shown="none"),
    Setting("api_peers", "ORACULAR_API_PEERS", str, None,
            "the workers lookups may be forwarded to: comma-separated host names, addresses "
            "and CIDR networks, or `*` for any; a worker the group advertises elsewhere gets "
            "no forward (502; docs/serving.md)",
            shown="loopback, this host's addresses and the brokers' /24 (IPv6: /64) networks"),
    Setting("api_header_timeout_s", "ORACULAR_API_HEADER_TIMEOUT_S", float, 10.0,
            "a new API connection whose request line and headers have not all arrived this "
            "long after it opened is closed (slow or silent clients)"),
    Setting("api_body_timeout_s", "ORACULAR_API_BODY_TIMEOUT_S", float, 10.0,
            "a request body not complete this long after its headers: 408, connection closed; "
            "an answer its client has not taken this long after it was ready: closed"),
    Setting("api_keepalive_s", "ORACULAR_API_KEEPALIVE_S", float, 15.0,
            "an idle keep-alive connection is closed after this (the next request's headers "
            "must have arrived by then)"),
    Setting("api_max_requests_per_connection", "ORACULAR_API_MAX_REQUESTS_PER_CONNECTION", int,
            1000, "the answer to a connection's Nth request closes it (`Connection: close`)"),
    Setting("api_max_connections", "ORACULAR_API_MAX_CONNECTIONS", int, None,
            "open API connections at most; at the cap a new one closes the least recently "
            "active connection idle for 0.5 s, or gets a 503 (as many refused ones linger "
            "0.25 s at most). At most a quarter of the open-file limit (`ulimit -n`); the API "
            "stops accepting at 1.5 times the cap, so it holds three eighths of the limit at "
            "most: the rest is RocksDB's and Kafka's",
            shown="the smaller of 1000 and a quarter of the open-file limit"),
    Setting("api_max_body_bytes", "ORACULAR_API_MAX_BODY_BYTES", int, 512 * 1024,
            "largest request body; a larger one, declared or sent, is a 413 before it is read"),
    Setting("api_nice", "ORACULAR_API_NICE", int, None,
            "the lookup API process's priority relative to its worker's, as `nice` counts "
            "(negative: higher, so a lookup does not wait for the CPU behind the worker's "
            "batches; 0: the worker's). Raising it needs root, CAP_SYS_NICE or a RLIMIT_NICE "
            "that allows it; refused, the API runs at the worker's priority, said in one "
            "warning when the value was set, in one info line when it is the default "
            "(docs/serving.md)",
            shown=f"{DEFAULT_API_NICE} where permitted, else the worker's priority"),
    Setting("api_realtime", "ORACULAR_API_REALTIME", int, 0,
            "run the lookup API process under the real-time round-robin policy (SCHED_RR) at "
            "this priority (1-99; 0: off): a lookup that is ready then runs at once instead "
            "of after the worker's time slice. A flood of lookups can then take a whole core "
            "from the worker (Linux still leaves other tasks 5% of each core); the front "
            "door's limits bound it. Needs root, CAP_SYS_NICE or a RLIMIT_RTPRIO that allows "
            "it; refused, one warning, and the API keeps ORACULAR_API_NICE "
            "(docs/serving.md)"),
    Setting("api_cpus", "ORACULAR_API_CPUS", str, None,
            "CPUs reserved for the lookup API, as `taskset -c` lists them (`3`, `2-3`): the "
            "API process runs on them alone and the worker's own threads keep off them, so a "
            "lookup never waits for a core behind the worker's batches nor takes one from them "
            "(docs/serving.md). Unset: both may run on every CPU the worker may use"),
    Setting("ready_max_lag", "ORACULAR_READY_MAX_LAG", int, 10_000,
            "/readyz answers 503 while more input messages than this wait", "--ready-max-lag"),
)  # fmt: skip
"""The settings table: every deployment knob, in the order the docs list them."""

BY_NAME: Final = {s.name: s for s in SETTINGS}
BY_FLAG: Final = {s.flag: s for s in SETTINGS if s.flag}
ENV_VARS: Final = {s.name: s.env for s in SETTINGS}
"""Setting name -> its environment variable."""
_TOPIC_INPUTS: Final = ("partitions", "topic_prefix", *(f"topic_{r}" for r in _TOPIC_ROLES))


def default(name: str) -> Any:
    """The default of the setting `name` (its `SETTINGS` row): the one place defaults live,
    for every part that has one of its own (`TimePolicy`, the API's `Limits`)."""
    return BY_NAME[name].default


API_CONNECTIONS_AT_MOST: Final = 1000
"""The cap on open API connections when ORACULAR_API_MAX_CONNECTIONS is unset (or less, a
quarter of the open-file limit)."""


def _default_topics() -> ProductTopics:
    return declare_topics(default("topic_prefix"), default("partitions"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Everything a worker needs besides the engine config; each field is a row of `SETTINGS`
    (its meaning, variable and flag are there), but `topics`, which the rows partitions,
    topic_prefix and topic_* declare."""

    # Defaults are the table's: RUF009 cannot see that _default returns an immutable value.
    config_path: Path = default("config_path")  # noqa: RUF009
    broker: str = default("broker")
    app_id: str = default("app_id")
    datadir: Path | None = default("datadir")  # noqa: RUF009
    topics: ProductTopics = field(default_factory=_default_topics)
    tick_interval_s: float = default("tick_interval_s")
    lateness_ms: int = default("lateness_ms")
    idle_ms: int = default("idle_ms")
    max_skew_ms: int = default("max_skew_ms")
    output_format: str = default("output_format")
    web_port: int | None = default("web_port")
    batch_max: int = default("batch_max")
    state_cache_users: int = default("state_cache_users")
    batch_window_s: float = default("batch_window_s")
    state_write_interval_s: float = default("state_write_interval_s")
    fetch_max_wait_ms: int = default("fetch_max_wait_ms")
    consumer_loop: str = default("consumer_loop")
    summary_interval_s: float = default("summary_interval_s")
    commit_interval_s: float = default("commit_interval_s")
    session_timeout_s: float = default("session_timeout_s")
    shutdown_timeout_s: float = default("shutdown_timeout_s")
    min_free_bytes: int = default("min_free_bytes")
    replication_factor: int = default("replication_factor")
    standby_replicas: int = default("standby_replicas")
    security_protocol: str = default("security_protocol")
    sasl_mechanism: str = default("sasl_mechanism")
    sasl_username: str | None = field(default=default("sasl_username"), repr=False)
    sasl_password: str | None = field(default=default("sasl_password"), repr=False)
    ssl_cafile: str | None = default("ssl_cafile")
    ssl_certfile: str | None = default("ssl_certfile")
    ssl_keyfile: str | None = field(default=default("ssl_keyfile"), repr=False)
    erasure_key: str | None = field(default=default("erasure_key"), repr=False)
    api_host: str = default("api_host")
    api_port: int | None = default("api_port")
    api_url: str | None = default("api_url")
    api_token: str | None = field(default=default("api_token"), repr=False)
    api_token_file: Path | None = default("api_token_file")  # noqa: RUF009
    api_allow_no_token: bool = default("api_allow_no_token")
    api_tls_cert: Path | None = default("api_tls_cert")  # noqa: RUF009
    api_tls_key: Path | None = default("api_tls_key")  # noqa: RUF009
    api_tls_cafile: Path | None = default("api_tls_cafile")  # noqa: RUF009
    api_forward_timeout_s: float = default("api_forward_timeout_s")
    api_hosts: str | None = default("api_hosts")
    api_peers: str | None = default("api_peers")
    api_header_timeout_s: float = default("api_header_timeout_s")
    api_body_timeout_s: float = default("api_body_timeout_s")
    api_keepalive_s: float = default("api_keepalive_s")
    api_max_requests_per_connection: int = default("api_max_requests_per_connection")
    api_max_connections: int | None = default("api_max_connections")
    api_max_body_bytes: int = default("api_max_body_bytes")
    api_nice: int | None = default("api_nice")
    api_realtime: int = default("api_realtime")
    api_cpus: str | None = default("api_cpus")
    ready_max_lag: int = default("ready_max_lag")

    @property
    def state_dir(self) -> Path:
        """The datadir, defaulting to var/faust/<app id>."""
        return self.datadir if self.datadir is not None else Path("var") / "faust" / self.app_id

    @property
    def api_connections(self) -> int:
        """The cap on open API connections: ORACULAR_API_MAX_CONNECTIONS, else the smaller of
        1000 and a quarter of the open-file limit."""
        if self.api_max_connections is not None:
            return self.api_max_connections
        return max(1, min(API_CONNECTIONS_AT_MOST, open_file_limit() // 4))

    @property
    def broker_url(self) -> str:
        """Faust's form of the bootstrap servers (`kafka://host:port;host:port`)."""
        hosts = [h.strip() for h in self.broker.split(",") if h.strip()]
        return ";".join(h if "://" in h else f"kafka://{h}" for h in hosts)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of the broker connection (SSL, SASL_SSL), else None."""
        if self.security_protocol not in ("SSL", "SASL_SSL"):
            return None
        context = ssl.create_default_context(cafile=self.ssl_cafile)
        if self.ssl_certfile:
            context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
        return context

    def credentials(self) -> Any:
        """Faust broker credentials for TLS/SASL, or None for PLAINTEXT."""
        import faust  # noqa: PLC0415 - keep faust out of `oracular replay`

        protocol = self.security_protocol
        context = self.ssl_context()
        if protocol == "SSL":
            return faust.SSLCredentials(context)
        if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
            return faust.SASLCredentials(
                username=self.sasl_username,
                password=self.sasl_password,
                mechanism=self.sasl_mechanism,
                ssl_context=context,
            )
        return None

    def client_kwargs(self) -> dict[str, Any]:
        """The same security settings as keyword arguments for aiokafka clients."""
        if self.security_protocol == "PLAINTEXT":
            return {}
        kwargs: dict[str, Any] = {"security_protocol": self.security_protocol}
        context = self.ssl_context()
        if context is not None:
            kwargs["ssl_context"] = context
        if self.security_protocol.startswith("SASL"):
            kwargs.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=self.sasl_password,
            )
        return kwargs


def load_settings(
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, str | None] | None = None,
    *,
    sources: Mapping[str, str] | None = None,
) -> Settings:
    """The settings: each row's default, replaced by its variable in `env` (default: the
    process environment), replaced by its value in `flags` (setting name -> the flag's text;
    None or "" means not given). Nothing is written to the environment.

    `sources` names where a flag value came from when it is not the row's own flag (for
    messages); by default a flag value is reported as its flag, a variable as itself.

    Raises:
        SettingsError: one line per problem, naming the variable or flag of the bad value.
    """
    env = os.environ if env is None else env
    given: dict[str, tuple[str, str]] = {}  # name -> (text, where it came from)
    problems = []
    if env.get("ORACULAR_GRACE_MS"):
        problems.append(
            "ORACULAR_GRACE_MS: replaced by ORACULAR_LATENESS_MS, ORACULAR_IDLE_MS and "
            "ORACULAR_MAX_SKEW_MS (docs/time.md explains the watermark); unset it"
        )
    if "ORACULAR_API_TOKEN" in env and not env["ORACULAR_API_TOKEN"].strip():
        problems.append(
            "ORACULAR_API_TOKEN: set but empty; set a token (or ORACULAR_API_TOKEN_FILE), or "
            "unset it to serve without one (loopback only)"
        )
    for row in SETTINGS:
        text = env.get(row.env)
        if text:
            given[row.name] = (text, row.env)
    for name, text in (flags or {}).items():
        row = BY_NAME[name]  # a KeyError here is a bug in a caller
        if text:
            where = (sources or {}).get(name) or row.flag or row.env
            given[name] = (text, where)
    values: dict[str, Any] = {}
    for name, (text, where) in given.items():
        kind = BY_NAME[name].kind
        try:
            values[name] = _read(kind, text)
        except ValueError:
            what = {int: "a whole number", float: "a number", bool: "true or false"}
            problems.append(f"{where}={text!r}: must be {what.get(kind, kind.__name__)}")
    where_from = {name: where for name, (_, where) in given.items()}
    problems += _read_token_file(values, where_from)
    topic_inputs = {name: values.pop(name, default(name)) for name in _TOPIC_INPUTS}
    if topic_inputs["partitions"] < 1:
        problems.append(
            f"{where_from.get('partitions', 'ORACULAR_PARTITIONS')}: must be a whole number "
            f">= 1 (got {topic_inputs['partitions']})"
        )
    else:
        try:
            values["topics"] = declare_topics(
                topic_inputs["topic_prefix"],
                topic_inputs["partitions"],
                {role: topic_inputs[f"topic_{role}"] for role in _TOPIC_ROLES},
            )
        except ValueError as exc:
            named = list(dict.fromkeys(where_from[n] for n in _TOPIC_INPUTS[1:] if n in where_from))
            problems.append(f"{', '.join(named) or 'ORACULAR_TOPIC_PREFIX'}: {exc}")
    # An unreadable value is left at its default here, so the checks below report only the
    # readable values' problems: every problem is reported at once.
    settings = Settings(**values)
    problems += _check(settings, lambda name: where_from.get(name, ENV_VARS[name]))
    if problems:
        raise SettingsError("\n".join(problems))
    return settings


_TRUE: Final = ("1", "true", "yes", "on")
_FALSE: Final = ("0", "false", "no", "off")


def _read(kind: type, text: str) -> Any:
    """A variable's or flag's text as `kind` (ValueError when it is not one)."""
    if kind is bool:
        if text.strip().lower() not in _TRUE + _FALSE:
            raise ValueError(text)
        return text.strip().lower() in _TRUE
    return kind(text)


def _read_token_file(values: dict[str, Any], where_from: Mapping[str, str]) -> list[str]:
    """ORACULAR_API_TOKEN_FILE's token into values["api_token"] (read here, once: at start)."""
    path = values.get("api_token_file")
    if path is None:
        return []
    where = where_from.get("api_token_file", "ORACULAR_API_TOKEN_FILE")
    if values.get("api_token"):
        return [f"{where}: ORACULAR_API_TOKEN is set too; set one of them"]
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        return [f"{where}: cannot read {path}: {getattr(exc, 'strerror', None) or exc}"]
    if not token:
        return [f"{where}: {path} is empty; write the token in it"]
    values["api_token"] = token
    return []


def settings_from_env(env: Mapping[str, str] | None = None) -> Settings:
    """The settings from `env` alone (default: the process environment): `load_settings`
    without flags, as `faust -A streams.worker worker` runs."""
    return load_settings(env)


def as_environment(flags: Mapping[str, str | None]) -> dict[str, str]:
    """The flags given, as the variables that mean the same (for child processes, which read
    their settings through `load_settings` like any worker)."""
    return {BY_NAME[name].env: text for name, text in flags.items() if text}


def _check(settings: Settings, label: Any) -> list[str]:
    """Range and choice checks; `label(name)` is the variable or flag the value came from."""
    problems = []
    positive = (
        "tick_interval_s",
        "batch_max",
        "batch_window_s",
        "fetch_max_wait_ms",
        "summary_interval_s",
        "replication_factor",
        "session_timeout_s",
        "shutdown_timeout_s",
        "commit_interval_s",
        "api_forward_timeout_s",
        "api_header_timeout_s",
        "api_body_timeout_s",
        "api_keepalive_s",
        "api_max_requests_per_connection",
        "api_max_body_bytes",
    )
    for name in positive:
        if getattr(settings, name) <= 0:
            problems.append(f"{label(name)}: must be > 0 (got {getattr(settings, name)})")
    not_negative = (
        "lateness_ms",
        "idle_ms",
        "max_skew_ms",
        "state_cache_users",
        "state_write_interval_s",
        "standby_replicas",
        "ready_max_lag",
        "min_free_bytes",
    )
    for name in not_negative:
        if getattr(settings, name) < 0:
            problems.append(f"{label(name)}: must be >= 0 (got {getattr(settings, name)})")
    for name, (first, second) in (
        ("output_format", ("msgpack", "json")),
        ("consumer_loop", ("worker", "thread")),
    ):
        value = getattr(settings, name)
        if value not in (first, second):
            problems.append(f"{label(name)}: must be {first} or {second} (got {value!r})")
    protocols = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
    if settings.security_protocol not in protocols:
        problems.append(f"{label('security_protocol')}: must be one of {', '.join(protocols)}")
    if settings.security_protocol.startswith("SASL") and not (
        settings.sasl_username and settings.sasl_password
    ):
        problems.append("ORACULAR_SASL_USERNAME and ORACULAR_SASL_PASSWORD: required for SASL")
    for name in ("api_port", "web_port"):
        port = getattr(settings, name)
        if port is not None and not 0 <= port <= 65535:
            problems.append(f"{label(name)}: must be 0-65535 (got {port})")
    return problems + _check_api(settings, label)


def _check_api(settings: Settings, label: Any) -> list[str]:
    """The lookup API's settings (`_check`)."""
    problems = []
    connections = settings.api_max_connections
    if connections is not None and not 1 <= connections <= open_file_limit() // 4:
        problems.append(
            f"{label('api_max_connections')}: must be 1 to {open_file_limit() // 4}, a quarter "
            f"of the open-file limit ({open_file_limit()}; refused connections linger as many "
            f"more, the rest is RocksDB's and Kafka's) (got {connections})"
        )
    token = settings.api_token
    if token and token.strip() and (not token.isprintable() or any(c.isspace() for c in token)):
        where = label("api_token_file") if settings.api_token_file else label("api_token")
        problems.append(f"{where}: the token must be printable, without spaces")
    if settings.api_hosts is not None:
        problems += [f"{label('api_hosts')}: {p}" for p in host_problems(settings.api_hosts)]
    if settings.api_peers is not None:
        try:
            Peers.parse(settings.api_peers)
        except ValueError as exc:
            problems.append(f"{label('api_peers')}: {exc}")
    if (settings.api_tls_cert is None) != (settings.api_tls_key is None):
        problems.append("ORACULAR_API_TLS_CERT and ORACULAR_API_TLS_KEY: set both or neither")
    if not 0 <= settings.api_realtime <= 99:
        problems.append(
            f"{label('api_realtime')}: must be 0 (off) to 99, a SCHED_RR priority "
            f"(got {settings.api_realtime})"
        )
    if settings.api_nice is not None and not -20 <= settings.api_nice <= 19:
        problems.append(
            f"{label('api_nice')}: must be -20 to 19, as nice (got {settings.api_nice})"
        )
    if settings.api_cpus is not None and (problem := check_cpus(settings.api_cpus)):
        problems.append(f"{label('api_cpus')}: {problem}")
    if not settings.api_host.strip():
        problems.append(f"{label('api_host')}: must be an address such as 127.0.0.1")
    if settings.api_url is not None and not settings.api_url.startswith(("http://", "https://")):
        problems.append(f"{label('api_url')}: must start with http:// (got {settings.api_url!r})")
    return problems


def describe(settings: Settings) -> str:
    """One line per setting for the worker's start-up log; credentials are left out."""
    names = {f.name for f in fields(settings)}
    return (
        "\n".join(
            f"  {row.name} = {getattr(settings, row.name)!s}"
            for row in SETTINGS
            if row.name in names and not row.secret
        )
        + "\n  topics = "
        + ", ".join(spec.name for spec in settings.topics)
    )


def add_flag(
    parser: argparse.ArgumentParser, name: str, *, text: str | None = None, **kwargs: Any
) -> None:
    """Add setting `name`'s flag to `parser`, its help text made from the table: what it
    means, its default and its variable. The value lands in `args.<name>` as text (None when
    not given): `load_settings` reads and checks it, as it does the variable."""
    row = BY_NAME[name]
    if row.flag is None:
        msg = f"setting {name} has no flag"
        raise ValueError(msg)
    text = text or f"{row.help} (default {row.default_text()}; env {row.env})"
    kwargs.setdefault("metavar", row.env.removeprefix("ORACULAR_"))
    parser.add_argument(row.flag, dest=name, help=text.replace("%", "%%"), **kwargs)


def flag_values(args: argparse.Namespace) -> dict[str, str | None]:
    """The setting flags of `args` (setting name -> text or None), for `load_settings`."""
    return {row.name: getattr(args, row.name, None) for row in SETTINGS if row.flag}


def markdown_table() -> str:
    """The settings table of docs/operations.md, made from `SETTINGS`."""

    def code(text: str) -> str:
        return f"`{text}`"

    lines = ["| variable | flag | default | meaning |", "|---|---|---|---|"]
    for row in SETTINGS:
        default = row.default_text()
        lines.append(
            f"| {code(row.env)} | {code(row.flag) if row.flag else ''} | "
            f"{default if default == 'unset' else code(default)} | "
            f"{row.help.replace('<', '&lt;')} |"
        )
    return "\n".join(lines) + "\n"


def product_topics(env: Mapping[str, str] | None = None) -> ProductTopics:
    """The product's topics as the settings in `env` declare them (default: the process
    environment), read by `load_settings` like every other setting.

    Raises:
        ValueError: a bad name or partition count, naming the variable.
    """
    return load_settings(env).topics


def _fields_match_the_table() -> None:
    """Every `Settings` field but topics is a row, and every row a field or a topic input."""
    names = {f.name for f in dataclasses.fields(Settings)} - {"topics"}
    rows = set(BY_NAME) - set(_TOPIC_INPUTS)
    if names != rows:
        msg = f"Settings fields and SETTINGS rows differ: {sorted(names ^ rows)}"
        raise AssertionError(msg)


_fields_match_the_table()
