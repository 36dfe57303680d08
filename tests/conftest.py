"""Hypothesis profiles for the whole test suite.

- "ci": derandomized (the same examples on every run), 60 examples per property, no deadline,
  no example database, and the reproduction blob printed for any failure.
- "dev": more examples per property, no deadline, random seeds (a local run explores more).

Which one loads: $HYPOTHESIS_PROFILE if it is set; otherwise "ci" when $CI is truthy (GitHub
Actions and most CI systems set CI=true); otherwise "dev". `pytest --hypothesis-profile NAME`
overrides all of this.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

# Both start from Hypothesis's own defaults, not from whatever profile is loaded right now
# (Hypothesis loads its built-in "ci" profile by itself when it detects CI).
_DEFAULT = settings.get_profile("default")

settings.register_profile(
    "ci",
    _DEFAULT,
    derandomize=True,
    max_examples=60,
    deadline=None,
    print_blob=True,
    database=None,  # derandomized runs neither need nor write an example database
    suppress_health_check=[HealthCheck.too_slow],  # shared CI runners are slow now and then
)
settings.register_profile("dev", _DEFAULT, max_examples=200, deadline=None)


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in ("", "0", "false", "no", "off")


settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if _truthy(os.environ.get("CI")) else "dev")
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "chaos_full: `make chaos` only (the full chaos runs); runs only with CHAOS_FULL=1",
    )


class FailStopped(BaseException):
    """A fail-stop inside the test process (streams/runtime/failstop.py): the worker's would
    end the process, which would end the whole test run without a report."""


@pytest.fixture(autouse=True, scope="session")
def _fail_stop_raises_in_tests() -> object:
    """In the test process, `FAIL_STOP` raises FailStopped instead of exiting: a test that
    reaches it fails (or asserts it) instead of killing pytest. Workers that tests start as
    subprocesses exit as in production."""
    from streams.runtime.failstop import FAIL_STOP

    def exit_process(code: int) -> None:
        raise FailStopped(code)

    FAIL_STOP._exit = exit_process
    return FAIL_STOP
