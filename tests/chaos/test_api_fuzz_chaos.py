"""A long schemathesis run against a live worker (`make chaos`; `make test` runs 40 s of it in
tests/integration/test_hostile.py): requests generated from the worker's own OpenAPI document
for CHAOS_FUZZ_SECONDS (300) while it consumes input; no 5xx, no answer outside the document,
and lookups, /readyz and input still served after it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.conftest import WorkerFactory
from tests.integration.test_hostile import fuzz_a_worker

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.chaos_full,
    pytest.mark.skipif(os.environ.get("CHAOS_FULL") != "1", reason="the full runs: make chaos"),
]

FUZZ_S = float(os.environ.get("CHAOS_FUZZ_SECONDS", "300"))


async def test_full_a_long_schemathesis_run(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory, tmp_path: Path
) -> None:
    seen = await fuzz_a_worker(kafka, request, faust_worker, tmp_path, FUZZ_S)
    print(f"\nschemathesis for {FUZZ_S:g} s: {seen['test cases']} test cases, no failure")
