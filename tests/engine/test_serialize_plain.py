"""`state_from_record` with a config takes the plain path (`engine.serialize._plain_state`)
for a record as `state_to_record` writes it; the plain path builds the same state as the
checked one, and leaves every other record to it, so a bad record gets the same error."""

from __future__ import annotations

import copy
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import EngineConfig, create_state, state_from_record, state_to_record
from tests.engine.strategies import cases, final
from tests.engine.test_serialize import CFG, _busy_state

SERIALIZE = sys.modules["engine.serialize"]  # `engine.serialize` is also the function


def _checked(record, config):
    plain = SERIALIZE._plain_state
    SERIALIZE._plain_state = lambda record, config: None
    try:
        return _outcome(record, config)
    finally:
        SERIALIZE._plain_state = plain


def _outcome(record, config):
    try:
        return ("state", state_from_record(copy.deepcopy(record), config=config))
    except Exception as exc:  # the same exception, type and text, is the point
        return ("error", type(exc).__name__, str(exc))


def _leaves(value, path=()):
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _leaves(item, (*path, index))
    yield path


ODD = [
    None,
    True,
    0,
    1,
    -1,
    2.5,
    -0.5,
    1e301,
    float("nan"),
    float("inf"),
    "x",
    [],
    [1.0, 2.0],
    [1.0, 2.0, 3],
    {},
    2**63,
    -(2**63) - 1,
    253402300800000,
]


def _set(record, path, value):
    if not path:
        return value
    target = record
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return record


@settings(max_examples=200, deadline=None)
@given(cases(max_size=16))
def test_the_plain_path_builds_the_state_the_checked_path_builds(case):
    config = EngineConfig.from_dict(case.config)
    state = final(create_state(config), case.steps)
    record = state_to_record(state, include_config=False)
    plain = _outcome(record, config)
    assert plain == _checked(record, config)
    assert plain == ("state", state)


@settings(max_examples=400, deadline=None)
@given(cases(max_size=12), st.data())
def test_a_changed_record_gets_what_the_checked_path_gives(case, data):
    config = EngineConfig.from_dict(case.config)
    state = final(create_state(config), case.steps)
    record = state_to_record(state, include_config=False)
    path = data.draw(st.sampled_from(list(_leaves(record))))
    value = data.draw(st.sampled_from(ODD))
    changed = _set(copy.deepcopy(record), path, value)
    got, want = _outcome(changed, config), _checked(changed, config)
    if got[0] == "state" and want[0] == "state":
        assert repr(got[1]) == repr(want[1])  # NaN compares unequal to itself
    else:
        assert got == want


@pytest.mark.parametrize(
    "change",
    [
        lambda r: r[5]["upgrade"][1].__setitem__(7, [0.0, 0.0, 0]),  # a name that is no string
        lambda r: r[5]["upgrade"][0].__setitem__(0, 3),  # a count written as an int
        lambda r: r.append(None),
    ],
)
def test_records_the_plain_path_leaves_to_the_checked_one(change):
    record = state_to_record(_busy_state(), include_config=False)
    change(record)
    assert _outcome(record, CFG) == _checked(record, CFG)
    assert SERIALIZE._plain_state(record, CFG) is None
