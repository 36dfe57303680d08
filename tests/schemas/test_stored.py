"""The state table's value encoding (`schemas.stored`): the bytes assembled from reused
per-intent parts are exactly msgpack's encoding of the whole value."""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import given, settings

from engine import EngineConfig, create_state, observe, state_to_record
from schemas.stored import STORED_VERSION, StoredUser, decode_stored, encode_stored
from tests.engine.strategies import T0, Case, apply, cases


def _plain(user: StoredUser) -> bytes:
    """The value as one `msgpack.packb` call writes it (the layout the module documents)."""
    state = user.state
    value: bytes = msgpack.packb(
        [
            STORED_VERSION,
            user.partition,
            user.last_offset,
            state.episode.last_event_at if state.episode.started_at is not None else None,
            state_to_record(state, include_config=False),
            user.inputs,
            user.episodes,
            user.clock,
            user.timer_close,
            user.tick_offset,
        ]
    )
    return value


@settings(max_examples=150, deadline=None)
@given(cases(max_size=30))
def test_encoding_a_user_step_by_step_gives_msgpacks_bytes_of_the_whole_value(case: Case) -> None:
    config = EngineConfig.from_dict(case.config)
    state = create_state(config)
    packed: Any = None  # handed from each StoredUser to the next, as the processor does
    for number, step in enumerate(case.steps):
        state = apply(state, step)
        user = StoredUser(
            state,
            partition=number % 3,
            last_offset=number,
            inputs=number + 1,
            episodes=number // 2,
            clock=state.clock,
            timer_close=None if number % 2 else T0 + number,
            tick_offset=number if number % 4 == 0 else None,
            packed=packed,
        )
        encoded = encode_stored(user)
        assert encoded == _plain(user), f"step {number}: {step!r}"
        assert decode_stored(encoded, config) == user
        packed = user.packed
        assert packed is not None
        assert {name: part[0] for name, part in packed.items()} == dict(state.intents)


def test_many_intents_take_a_map16_header_and_unchanged_intents_are_not_repacked() -> None:
    intents = {
        f"intent-{n:02}": {"signals": {"pricing.viewed": 1.0}, "outcome": f"done.{n}"}
        for n in range(20)
    }
    config = EngineConfig.from_dict({"intents": intents})
    user = StoredUser(create_state(config), partition=0, last_offset=-1)
    first = encode_stored(user)
    assert first == _plain(user)
    assert first.find(b"\xde\x00\x14") > 0  # the 20 intents' map 16 header
    parts = dict(user.packed or {})
    state = observe(user.state, "done.7", T0)  # only intent-07 changes (its outcome)
    changed = StoredUser(state, partition=0, last_offset=0, inputs=1, packed=user.packed)
    assert encode_stored(changed) == _plain(changed)
    assert changed.packed is not None
    repacked = [name for name, part in changed.packed.items() if part is not parts[name]]
    assert repacked == ["intent-07"]
