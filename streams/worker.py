"""The worker: the runtime (`streams/runtime/`) with the lookup API (`streams/lookup/`) served
beside it. `oracular worker` builds it from flags; `faust -A streams.worker worker` from the
`ORACULAR_*` environment variables (`streams/settings/`)."""

from __future__ import annotations

import logging
from typing import Any

import faust

from engine import EngineConfig
from schemas.config import load_config
from streams.lookup.api import install_serving
from streams.runtime.app import create_runtime
from streams.settings import Settings, describe, settings_from_env

log = logging.getLogger("oracular.worker")


def create_worker(settings: Settings, config: EngineConfig) -> faust.App:
    """The worker's Faust app: the runtime, and the lookup API with its health and metrics
    (streams/lookup/api.py). A backfill runs the runtime alone (`create_runtime`)."""
    runtime = create_runtime(settings, config)
    install_serving(runtime.app, runtime, settings)

    @runtime.app.task
    async def log_settings() -> None:  # once Faust's logging is set up, whoever started it
        log.info("oracular worker settings:\n%s", describe(settings))

    return runtime.app


def app_from_env() -> faust.App:
    """The app `faust -A streams.worker` runs: settings from ORACULAR_*."""
    settings = settings_from_env()
    config = load_config(settings.config_path)
    return create_worker(settings, config)


def __getattr__(name: str) -> Any:
    """`streams.worker.app`, built from the environment on first use (for `faust -A
    streams.worker`)."""
    if name == "app":
        built = app_from_env()
        globals()["app"] = built
        return built
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
