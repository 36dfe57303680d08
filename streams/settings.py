"""Worker settings: environment variables (`ORACULAR_*`), overridable by `oracular worker` flags.

The engine's config (intents, signals, episodes) is a separate file (`ORACULAR_CONFIG`); these
are the deployment's knobs. Defaults point at the broker `make broker-up` starts. Credentials
are read here and never logged (`Settings.__repr__` hides them).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Final

from streams.topics import ProductTopics, product_topics

DEFAULT_BROKER: Final = "127.0.0.1:9092"
DEFAULT_APP_ID: Final = "oracular"

# RocksDB's defaults are per partition DB (64 MiB write buffer x 3 and a 2 GiB block cache):
# with 8 partitions that is GiBs. These bound one worker's table to ~100 MiB per partition.
ROCKSDB_OPTIONS: Final = {
    "write_buffer_size": 8 << 20,
    "max_write_buffer_number": 2,
    "block_cache_size": 32 << 20,
}


class SettingsError(ValueError):
    """A setting has a value the worker cannot use; the message names the variable."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Everything a worker needs besides the engine config."""

    config_path: Path = Path("examples/oracular.yaml")
    """ORACULAR_CONFIG: the engine config file (YAML or JSON)."""
    broker: str = DEFAULT_BROKER
    """ORACULAR_BROKER: bootstrap servers, `host:port[,host:port]`."""
    app_id: str = DEFAULT_APP_ID
    """ORACULAR_APP_ID: the Faust app id: consumer group and internal topic prefix."""
    datadir: Path | None = None
    """ORACULAR_DATADIR: RocksDB and Faust state; default var/faust/<app id>."""
    topics: ProductTopics = field(default_factory=product_topics)
    """ORACULAR_TOPIC_PREFIX / ORACULAR_TOPIC_* / ORACULAR_PARTITIONS (streams/topics.py)."""
    tick_interval_s: float = 1.0
    """ORACULAR_TICK_INTERVAL_S: how often the timer ticks each owned partition."""
    lateness_ms: int = 120_000
    """ORACULAR_LATENESS_MS: the watermark trails the largest event time by this; disorder
    across users within it changes nothing (docs/time.md)."""
    idle_ms: int = 30_000
    """ORACULAR_IDLE_MS: a caught-up partition without input this long runs its clock on with
    the wall clock, so silent users close on time (docs/time.md)."""
    max_skew_ms: int = 60_000
    """ORACULAR_MAX_SKEW_MS: how far an event time may run ahead of its record's timestamp
    and moves the watermark (docs/time.md)."""
    state_cache_users: int = 50_000
    """ORACULAR_STATE_CACHE_USERS: decoded user states kept between batches (most recently
    used); each costs a few KiB of memory and saves a read and a decode (BENCHMARKS.md)."""
    batch_max: int = 500
    """ORACULAR_BATCH_MAX: most messages applied per batch (one state read/write per user)."""
    batch_window_s: float = 0.01
    """ORACULAR_BATCH_WINDOW_S: longest wait to fill a batch (10 ms: p99 34 ms at half load
    against 96 ms with 50 ms, at the same throughput; BENCHMARKS.md)."""
    output_format: str = "msgpack"
    """ORACULAR_OUTPUT_FORMAT: msgpack or json, for the output topics."""
    summary_interval_s: float = 30.0
    """ORACULAR_SUMMARY_INTERVAL_S: how often the worker logs its counters."""
    replication_factor: int = 1
    """ORACULAR_REPLICATION_FACTOR: for the internal topics Faust creates (changelog)."""
    standby_replicas: int = 0
    """ORACULAR_STANDBY_REPLICAS: table standbys on other workers (0 for one worker)."""
    session_timeout_s: float = 10.0
    """ORACULAR_SESSION_TIMEOUT_S: a dead worker leaves the group after this."""
    commit_interval_s: float = 1.0
    """ORACULAR_COMMIT_INTERVAL_S: how often consumed offsets are committed."""
    web_port: int | None = None
    """ORACULAR_WEB_PORT: serve Faust's web views on this port; unset: no web server."""
    security_protocol: str = "PLAINTEXT"
    """ORACULAR_SECURITY_PROTOCOL: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."""
    sasl_mechanism: str = "PLAIN"
    """ORACULAR_SASL_MECHANISM: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512."""
    sasl_username: str | None = field(default=None, repr=False)
    """ORACULAR_SASL_USERNAME."""
    sasl_password: str | None = field(default=None, repr=False)
    """ORACULAR_SASL_PASSWORD (never logged)."""
    ssl_cafile: str | None = None
    """ORACULAR_SSL_CAFILE: CA bundle for SSL / SASL_SSL (default: the system's)."""
    ssl_certfile: str | None = None
    """ORACULAR_SSL_CERTFILE: client certificate for mutual TLS."""
    ssl_keyfile: str | None = field(default=None, repr=False)
    """ORACULAR_SSL_KEYFILE: its private key."""
    api_host: str = "127.0.0.1"
    """ORACULAR_API_HOST: the lookup API's bind address (docs/serving.md)."""
    api_port: int | None = None
    """ORACULAR_API_PORT: the lookup API's port; 0 picks a free one. Unset: 6067, or a free
    port when 6067 is taken (a second worker on one host). The port is logged and advertised."""
    api_url: str | None = None
    """ORACULAR_API_URL: how other workers reach this one's API (default http://host:port)."""
    api_token: str | None = field(default=None, repr=False)
    """ORACULAR_API_TOKEN: bearer token required by every endpoint but /livez (never logged)."""
    api_forward_timeout_s: float = 2.0
    """ORACULAR_API_FORWARD_TIMEOUT_S: a lookup forwarded to the owning worker gives up (504)."""
    ready_max_lag: int = 10_000
    """ORACULAR_READY_MAX_LAG: /readyz fails while more input messages than this wait."""

    @property
    def state_dir(self) -> Path:
        """The datadir, defaulting to var/faust/<app id>."""
        return self.datadir if self.datadir is not None else Path("var") / "faust" / self.app_id

    @property
    def broker_url(self) -> str:
        """Faust's form of the bootstrap servers (`kafka://host:port;host:port`)."""
        hosts = [h.strip() for h in self.broker.split(",") if h.strip()]
        return ";".join(h if "://" in h else f"kafka://{h}" for h in hosts)

    def credentials(self) -> Any:
        """Faust broker credentials for TLS/SASL, or None for PLAINTEXT."""
        import faust  # noqa: PLC0415 - keep faust out of `oracular replay`

        protocol = self.security_protocol
        context = None
        if protocol in ("SSL", "SASL_SSL"):
            context = ssl.create_default_context(cafile=self.ssl_cafile)
            if self.ssl_certfile:
                context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
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
        if self.security_protocol in ("SSL", "SASL_SSL"):
            context = ssl.create_default_context(cafile=self.ssl_cafile)
            if self.ssl_certfile:
                context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
            kwargs["ssl_context"] = context
        if self.security_protocol.startswith("SASL"):
            kwargs.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=self.sasl_password,
            )
        return kwargs


_ENV: Final = {
    "config_path": ("ORACULAR_CONFIG", Path),
    "broker": ("ORACULAR_BROKER", str),
    "app_id": ("ORACULAR_APP_ID", str),
    "datadir": ("ORACULAR_DATADIR", Path),
    "tick_interval_s": ("ORACULAR_TICK_INTERVAL_S", float),
    "lateness_ms": ("ORACULAR_LATENESS_MS", int),
    "idle_ms": ("ORACULAR_IDLE_MS", int),
    "max_skew_ms": ("ORACULAR_MAX_SKEW_MS", int),
    "state_cache_users": ("ORACULAR_STATE_CACHE_USERS", int),
    "batch_max": ("ORACULAR_BATCH_MAX", int),
    "batch_window_s": ("ORACULAR_BATCH_WINDOW_S", float),
    "output_format": ("ORACULAR_OUTPUT_FORMAT", str),
    "summary_interval_s": ("ORACULAR_SUMMARY_INTERVAL_S", float),
    "replication_factor": ("ORACULAR_REPLICATION_FACTOR", int),
    "standby_replicas": ("ORACULAR_STANDBY_REPLICAS", int),
    "session_timeout_s": ("ORACULAR_SESSION_TIMEOUT_S", float),
    "commit_interval_s": ("ORACULAR_COMMIT_INTERVAL_S", float),
    "web_port": ("ORACULAR_WEB_PORT", int),
    "security_protocol": ("ORACULAR_SECURITY_PROTOCOL", str),
    "sasl_mechanism": ("ORACULAR_SASL_MECHANISM", str),
    "sasl_username": ("ORACULAR_SASL_USERNAME", str),
    "sasl_password": ("ORACULAR_SASL_PASSWORD", str),
    "ssl_cafile": ("ORACULAR_SSL_CAFILE", str),
    "ssl_certfile": ("ORACULAR_SSL_CERTFILE", str),
    "ssl_keyfile": ("ORACULAR_SSL_KEYFILE", str),
    "api_host": ("ORACULAR_API_HOST", str),
    "api_port": ("ORACULAR_API_PORT", int),
    "api_url": ("ORACULAR_API_URL", str),
    "api_token": ("ORACULAR_API_TOKEN", str),
    "api_forward_timeout_s": ("ORACULAR_API_FORWARD_TIMEOUT_S", float),
    "ready_max_lag": ("ORACULAR_READY_MAX_LAG", int),
}
"""Settings field -> (environment variable, type)."""

ENV_VARS: Final = {name: var for name, (var, _) in _ENV.items()}


def settings_from_env(env: Mapping[str, str] | None = None) -> Settings:
    """Read the settings from `env` (default: the process environment).

    Raises:
        SettingsError: listing every variable whose value is unusable.
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    problems = []
    if env.get("ORACULAR_GRACE_MS"):
        problems.append(
            "ORACULAR_GRACE_MS: replaced by ORACULAR_LATENESS_MS, ORACULAR_IDLE_MS and "
            "ORACULAR_MAX_SKEW_MS (docs/time.md explains the watermark); unset it"
        )
    for name, (var, kind) in _ENV.items():
        raw = env.get(var)
        if raw is None or raw == "":
            continue
        try:
            values[name] = kind(raw)
        except ValueError:
            problems.append(f"{var}={raw!r}: must be a {kind.__name__}")
    try:
        values["topics"] = product_topics(env)
    except ValueError as exc:
        problems.append(str(exc))
    if problems:
        raise SettingsError("\n".join(problems))
    settings = Settings(**values)
    _check(settings)
    return settings


def _check(settings: Settings) -> None:
    problems = []
    positive = (
        "tick_interval_s",
        "batch_max",
        "batch_window_s",
        "summary_interval_s",
        "replication_factor",
        "session_timeout_s",
        "commit_interval_s",
    )
    for name in positive:
        if getattr(settings, name) <= 0:
            problems.append(f"{ENV_VARS[name]}: must be > 0 (got {getattr(settings, name)})")
    for name in ("lateness_ms", "idle_ms", "max_skew_ms", "state_cache_users"):
        if getattr(settings, name) < 0:
            problems.append(f"{ENV_VARS[name]}: must be >= 0 (got {getattr(settings, name)})")
    if settings.standby_replicas < 0:
        problems.append("ORACULAR_STANDBY_REPLICAS: must be >= 0")
    if settings.output_format not in ("msgpack", "json"):
        problems.append(
            f"ORACULAR_OUTPUT_FORMAT: must be msgpack or json (got {settings.output_format!r})"
        )
    protocols = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
    if settings.security_protocol not in protocols:
        problems.append(f"ORACULAR_SECURITY_PROTOCOL: must be one of {', '.join(protocols)}")
    if settings.security_protocol.startswith("SASL") and not (
        settings.sasl_username and settings.sasl_password
    ):
        problems.append("ORACULAR_SASL_USERNAME and ORACULAR_SASL_PASSWORD: required for SASL")
    problems += _check_api(settings)
    if problems:
        raise SettingsError("\n".join(problems))


def _check_api(settings: Settings) -> list[str]:
    """Problems with the lookup API's settings (docs/serving.md)."""
    problems = []
    if settings.api_port is not None and not 0 <= settings.api_port <= 65535:
        problems.append(f"ORACULAR_API_PORT: must be 0-65535 (got {settings.api_port})")
    if not settings.api_host.strip():
        problems.append("ORACULAR_API_HOST: must be an address such as 127.0.0.1")
    if settings.api_url is not None and not settings.api_url.startswith(("http://", "https://")):
        problems.append(f"ORACULAR_API_URL: must start with http:// (got {settings.api_url!r})")
    if settings.api_forward_timeout_s <= 0:
        problems.append("ORACULAR_API_FORWARD_TIMEOUT_S: must be > 0")
    if settings.ready_max_lag < 0:
        problems.append(f"ORACULAR_READY_MAX_LAG: must be >= 0 (got {settings.ready_max_lag})")
    return problems


def describe(settings: Settings) -> str:
    """One line per setting for the worker's start-up log; credentials are left out."""
    hidden = {"sasl_username", "sasl_password", "ssl_keyfile", "api_token"}
    return (
        "\n".join(
            f"  {f.name} = {getattr(settings, f.name)!s}"
            for f in fields(settings)
            if f.name not in hidden and f.name != "topics"
        )
        + "\n  topics = "
        + ", ".join(spec.name for spec in settings.topics)
    )
