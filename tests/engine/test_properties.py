"""Properties of the engine that hold for every config and every sequence of steps.

Each test draws a config in the users' camelCase form and one user's steps (see
`tests/engine/strategies.py`); a falsifying example prints both, so it can be pasted into a
unit test as it stands. Final states are compared through `serialize` bytes, which hold every
float bit for bit.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from engine import (
    END_OF_TIME,
    EngineConfig,
    EngineState,
    close_if_due,
    create_state,
    deserialize,
    episode_closed,
    explain,
    predict,
    predict_many,
    replay,
    serialize,
    should_reveal,
)
from engine.packing import pack
from engine.predict import as_of, as_of_span, predict_read, predict_settled
from engine.serialize import state_to_record
from tests.engine.strategies import (
    DAY,
    MINUTE,
    T0,
    UNKNOWN_EVENTS,
    Case,
    apply,
    cases,
    final,
    multi_user_cases,
    reordered,
    run,
    step_time,
    time_scales,
    to_event,
)

COUNT_FLOOR = -1e-12
"""Counts are floats: rounding may leave a hair below zero, never more."""

MAX_PENDING = 32

# Forty one-signal sessions under a 14-day window, a minute apart: more closed episodes than an
# intent may hold, so the oldest turn into misses at once (the 32-episode cap).
OVERFLOW = Case(
    {
        "episodeTimeout": "30m",
        "intents": {
            "upgrade": {
                "signals": {"pricing.viewed": 3, "limit.hit": 2},
                "outcome": "upgrade.completed",
                "halfLife": "7d",
                "attribution": "14d",
            },
        },
    },
    (
        *(
            step
            for i in range(40)
            for step in (
                ("event", "pricing.viewed", T0 + 2 * i * MINUTE),
                ("end", T0 + (2 * i + 1) * MINUTE),
            )
        ),
        ("event", "upgrade.completed", T0 + 81 * MINUTE),
    ),
)


def _canonical(value: Any) -> Any:
    """`value` with every dict's keys sorted, so declaration order does not show."""
    if isinstance(value, Mapping):
        return {key: _canonical(value[key]) for key in sorted(value)}
    if isinstance(value, list | tuple):
        return [_canonical(item) for item in value]
    return value


def _order_free_bytes(state: EngineState) -> bytes:
    """The state's record (without its config) as msgpack with sorted keys: floats bit for bit."""
    return pack(_canonical(state_to_record(state, include_config=False)))


def _read_all(state: EngineState, at: int) -> list[Any]:
    """Every read of every intent at `at`."""
    out: list[Any] = []
    for intent in state.config.intents:
        out += [
            predict(state, intent, at),
            explain(state, intent, at),
            should_reveal(state, intent, at),
        ]
    return out


def _read_time(state: EngineState, step_at: int) -> int:
    """A time a read at `step_at` happens at: the state's clock if that is later."""
    return step_at if state.clock is None else max(state.clock, step_at)


@given(case=cases(), data=st.data())
def test_predict_many_is_predict_for_each_intent_asked(case, data):
    """`predict_many` (one pass to `at` for all intents) answers what `predict` answers per
    intent, at any read time, for every intent or a subset in any order."""
    states = run(create_state(case.engine_config()), case.steps)
    for step, state in zip(case.steps, states, strict=True):
        at = _read_time(state, step_time(step)) + data.draw(st.integers(0, 10 * 86_400_000))
        declared = list(state.config.intents)
        assert predict_many(state, at) == {n: predict(state, n, at) for n in declared}
        asked = data.draw(st.lists(st.sampled_from(declared), unique=True))
        assert predict_many(state, at, asked) == {n: predict(state, n, at) for n in asked}
        assert list(predict_many(state, at, asked)) == asked


@given(case=cases(), data=st.data())
def test_a_view_from_as_of_span_is_the_read_at_every_time_of_its_span(case, data):
    """`as_of_span` (a reader may keep a user's view between reads): the view is `as_of`
    at every read time of its span, its ends included, and predicts from it are
    `predict_many`'s bit for bit; the span is never empty and holds the time it was made at."""
    states = run(create_state(case.engine_config()), case.steps)
    for step, state in zip(case.steps, states, strict=True):
        at = _read_time(state, step_time(step)) + data.draw(st.integers(0, 10 * 86_400_000))
        view, after, until = as_of_span(state, at)
        assert after is None or after < at
        assert until is None or at <= until
        earliest = _read_time(state, step_time(step))
        low = earliest if after is None else max(earliest, after + 1)
        high = at + 10 * 86_400_000 if until is None else until
        times = {at, low, high, data.draw(st.integers(low, high))}
        for t in sorted(times):
            assert state_to_record(as_of(state, t)) == state_to_record(view), (t, after, until)
            assert predict_settled(view, t, list(view.config.intents)) == predict_many(state, t)
        if until is not None:  # the span ends where the read changes
            assert state_to_record(as_of(state, until + 1)) != state_to_record(view)


@given(case=cases(), data=st.data())
def test_predict_read_is_predict_many_without_the_view(case, data):
    """`predict_read` predicts from the state as it is (the lookup API: no timed-out episode
    closed, no window settled) what `predict_many` predicts from the view, bit for bit (repr:
    -0.0 is not 0.0), at any read time from the clock on: past timeouts and windows too."""
    states = run(create_state(case.engine_config()), case.steps)
    for step, state in zip(case.steps, states, strict=True):
        at = _read_time(state, step_time(step)) + data.draw(st.integers(0, 40 * 86_400_000))
        declared = list(state.config.intents)
        asked = data.draw(st.lists(st.sampled_from(declared), unique=True)) + declared
        expected = predict_many(state, at, asked)
        assert repr(predict_read(state, at, asked)) == repr(expected), at


# --- determinism ---------------------------------------------------------------------------------


@given(case=cases())
def test_the_same_config_and_steps_always_give_equal_states_and_equal_bytes(case):
    """Two runs of the same steps under two configs built from the same dict are identical."""
    first = run(create_state(case.engine_config()), case.steps)
    second = run(create_state(case.engine_config()), case.steps)
    for step, a, b in zip(case.steps, first, second, strict=True):
        assert a == b, step
        assert serialize(a) == serialize(b), step
        assert serialize(a, include_config=False) == serialize(b, include_config=False), step
        at = step_time(step)
        assert _read_all(a, at) == _read_all(b, at), step


@given(case=cases())
def test_declaring_intents_and_signals_in_another_order_changes_no_intent_s_results(case):
    """Reversing the order intents and signals are declared in changes no state or read."""
    cfg = case.engine_config()
    other = EngineConfig.from_dict(reordered(case.config))
    assert list(other.intents) == list(reversed(cfg.intents))
    forward = run(create_state(cfg), case.steps)
    backward = run(create_state(other), case.steps)
    for step, a, b in zip(case.steps, forward, backward, strict=True):
        assert a.episode == b.episode and a.clock == b.clock, step
        assert a.intents == b.intents, step
        assert _order_free_bytes(a) == _order_free_bytes(b), step
        at = step_time(step)
        for intent in cfg.intents:
            assert predict(a, intent, at) == predict(b, intent, at), (step, intent)
            assert explain(a, intent, at) == explain(b, intent, at), (step, intent)


# --- no transition or read mutates its input -----------------------------------------------------


@given(case=cases(), data=st.data())
def test_no_transition_or_read_ever_changes_the_state_it_was_given(case, data):
    """Every transition and read leaves its input state equal to a copy taken before the call."""
    cfg = case.engine_config()
    state = create_state(cfg)
    for step in case.steps:
        blob, snapshot = serialize(state), copy.deepcopy(state)
        at = step_time(step)
        _read_all(state, at)
        close_if_due(state, at + data.draw(st.integers(0, 3 * max(time_scales(case.config)))))
        following = apply(state, step)
        assert state == snapshot, step
        assert serialize(state) == blob, step
        state = following


# --- serialization -------------------------------------------------------------------------------


@given(case=cases())
def test_every_state_survives_serialize_and_deserialize_bit_for_bit(case):
    """deserialize(serialize(s)) equals s and re-serializes to the same bytes, config or not."""
    cfg = case.engine_config()
    for state in [create_state(cfg), *run(create_state(cfg), case.steps)]:
        blob = serialize(state)
        back = deserialize(blob)
        assert back == state
        assert serialize(back) == blob

        again = deserialize(blob, config=cfg)
        assert again == state
        assert serialize(again) == blob

        compact = serialize(state, include_config=False)
        restored = deserialize(compact, config=cfg)
        assert restored == state
        assert serialize(restored, include_config=False) == compact
        assert serialize(restored) == blob


@given(case=cases())
def test_a_state_restored_after_any_step_continues_exactly_as_the_uninterrupted_run(case):
    """For every k: run k steps, serialize, deserialize, run the rest: the same final bytes."""
    cfg = case.engine_config()
    fresh = create_state(cfg)
    states = [fresh, *run(fresh, case.steps)]
    expected = serialize(states[-1])
    for k, state in enumerate(states):
        rest = case.steps[k:]
        compact = deserialize(serialize(state, include_config=False), config=cfg)
        assert serialize(final(compact, rest)) == expected, k
        embedded = deserialize(serialize(state))
        assert serialize(final(embedded, rest)) == expected, k


# --- invariants ----------------------------------------------------------------------------------


def _check_invariants(state: EngineState, at: int) -> None:
    """Assert every invariant the state and its reads at `at` must keep."""
    config = state.config
    episode = state.episode
    if episode.started_at is None:
        assert episode.last_event_at is None
    else:
        assert episode.last_event_at is not None
        assert episode.started_at <= episode.last_event_at
        assert state.clock is not None and episode.last_event_at <= state.clock
    gain = config.learning.gain
    decays = config.learning.half_life_ms is not None
    for name, intent_config in config.intents.items():
        intent = state.intents[name]
        assert set(intent.learned) == set(intent_config.signals), name
        assert len(intent.pending) <= MAX_PENDING, name
        assert all(count >= 1 for count in intent.seen.values()), (name, intent.seen)
        assert set(intent.seen) <= set(intent_config.signals), name
        for record in (intent.episodes, *intent.learned.values()):
            assert record.hits >= COUNT_FLOOR and record.misses >= COUNT_FLOOR, (name, record)
        base_total = intent.episodes.hits + intent.episodes.misses
        if not decays:  # stored counts are all valued alike only without decay
            for signal, record in intent.learned.items():
                total = record.hits + record.misses
                assert total <= base_total * (1 + 1e-9) + 1e-12, (name, signal, record)

        explanation = explain(state, name, at)
        shown = explanation.episodes
        assert shown.hits >= COUNT_FLOOR and shown.misses >= COUNT_FLOOR, (name, shown)
        shown_total = shown.hits + shown.misses
        for signal, weight in intent_config.signals.items():
            part = explanation.signals[signal]
            assert part.hits >= COUNT_FLOOR and part.misses >= COUNT_FLOOR, (name, signal)
            assert part.hits + part.misses <= shown_total * (1 + 1e-9) + 1e-12, (
                name,
                signal,
                part,
                shown,
            )
            assert abs(part.learned) <= gain * abs(weight) + 1e-12, (name, signal, part)
            assert part.initial == weight
            assert math.isfinite(part.effective), (name, signal, part)
            if intent_config.outcome is None:
                assert part.effective == weight, (name, signal, part)

        prediction = predict(state, name, at)
        assert 0.0 <= prediction.p <= 1.0, (name, prediction)
        assert prediction.lower <= prediction.p, (name, prediction)
        assert prediction.sd >= 0.0, (name, prediction)
        assert prediction.alpha > 0.0 and prediction.beta > 0.0, (name, prediction)
        assert prediction.reveal == should_reveal(state, name, at), (name, prediction)
        assert prediction.p == explanation.p, name
        if prediction.suppressed_until is not None:
            assert not prediction.reveal and prediction.suppressed_until > at, name


@example(case=OVERFLOW, data=None)
@given(case=cases(max_size=60, end_weight=4), data=st.data())
def test_every_state_keeps_the_engine_s_invariants(case, data):
    """After every step: counts ≥ 0, signal counts ≤ base rate, learned within cap, p in [0, 1]."""
    state = create_state(case.engine_config())
    _check_invariants(state, T0)
    longest = max(time_scales(case.config))
    for step in case.steps:
        state = apply(state, step)
        at = _read_time(state, step_time(step))
        _check_invariants(state, at)
        if data is not None:  # and as a read a while later shows it
            _check_invariants(state, at + data.draw(st.integers(0, 3 * longest)))


# --- reads ---------------------------------------------------------------------------------------


@given(case=cases(), data=st.data())
def test_reads_between_steps_change_neither_the_final_state_nor_later_reads(case, data):
    """Reads at arbitrary times between steps leave the final state and its reads unchanged."""
    cfg = case.engine_config()
    untouched = final(create_state(cfg), case.steps)
    longest = max(time_scales(case.config))
    state = create_state(cfg)
    for step in case.steps:
        for _ in range(data.draw(st.integers(0, 3))):
            at = step_time(step) + data.draw(st.integers(-longest, 3 * longest))
            _read_all(state, max(at, 0))
        state = apply(state, step)
    assert serialize(state) == serialize(untouched)
    later = _read_time(state, T0) + data.draw(st.integers(0, 3 * longest))
    assert _read_all(state, later) == _read_all(untouched, later)


@given(case=cases(), data=st.data())
def test_an_unknown_event_changes_no_intent_s_prediction_or_explanation(case, data):
    """Reads at t equal the reads at t after observing, at t, an event no intent mentions."""
    longest = max(time_scales(case.config))
    for state in [
        create_state(case.engine_config()),
        *run(create_state(case.engine_config()), case.steps),
    ]:
        at = _read_time(state, T0) + data.draw(st.integers(0, 3 * longest))
        after = apply(state, ("event", data.draw(st.sampled_from(UNKNOWN_EVENTS)), at))
        for intent in state.config.intents:
            assert predict(after, intent, at) == predict(state, intent, at), intent
            assert explain(after, intent, at) == explain(state, intent, at), intent


# --- timers --------------------------------------------------------------------------------------


def _settled(state: EngineState) -> bytes:
    """The state with every episode that timed out before its clock closed, as bytes."""
    at = state.clock if state.clock is not None else 0
    return serialize(close_if_due(state, at).state)


@given(case=cases(), data=st.data())
def test_closing_by_timer_at_any_watermark_gives_the_same_states_as_closing_lazily(case, data):
    """close_if_due at a watermark up to the next step's time, then the step, equals the step."""
    cfg = case.engine_config()
    timeout = cfg.episode_timeout_ms
    lazy_states = run(create_state(cfg), case.steps)
    state = create_state(cfg)
    for step, lazy in zip(case.steps, lazy_states, strict=True):
        last = state.episode.last_event_at
        if state.clock is not None and data.draw(st.booleans()):
            low, high = state.clock, max(state.clock, step_time(step))
            choices = [st.integers(low, high)]
            if timeout is not None and last is not None:
                edges = [w for w in (last + timeout, last + timeout + 1) if low <= w <= high]
                if edges:
                    choices.append(st.sampled_from(edges))
            watermark = data.draw(st.one_of(choices))
            due = timeout is not None and last is not None and watermark > last + timeout
            timer = close_if_due(state, watermark)
            if due:
                assert timer.closed is not None, watermark
                assert timer.closed.closed_at == last + timeout
                assert timer.closed.reason == "timeout"
                assert episode_closed(state, timer.state)
                assert timer.state.episode.started_at is None
            else:
                assert timer.closed is None, watermark
                assert timer.state == state
                assert serialize(timer.state) == serialize(state)
            twice = close_if_due(timer.state, watermark)
            assert twice.closed is None, watermark
            assert serialize(twice.state) == serialize(timer.state)
            state = timer.state
        state = apply(state, step)
        # A reveal closes nothing: until the next event or sign-out, the lazy state may still
        # hold an episode the timer closed. Both agree once what is due by their clock closes.
        assert _settled(state) == _settled(lazy), step
        if step[0] != "revealed":
            assert serialize(state) == serialize(lazy), step


@given(case=cases())
def test_close_if_due_is_a_no_op_until_the_timeout_has_passed(case):
    """close_if_due at the deadline or earlier returns the same state; just past it, it closes."""
    cfg = case.engine_config()
    timeout = cfg.episode_timeout_ms
    for state in run(create_state(cfg), case.steps):
        last = state.episode.last_event_at
        if timeout is None or last is None:
            for watermark in (state.clock or 0, END_OF_TIME):
                assert close_if_due(state, watermark).closed is None
                assert close_if_due(state, watermark).state == state
            continue
        deadline = last + timeout
        for watermark in (last, deadline - 1, deadline):
            still = close_if_due(state, watermark)
            assert still.closed is None and serialize(still.state) == serialize(state)
        closed = close_if_due(state, deadline + 1)
        assert closed.closed is not None and closed.closed.closed_at == deadline
        much_later = close_if_due(state, deadline + 10 * DAY)
        assert serialize(much_later.state) == serialize(closed.state)


# --- replay --------------------------------------------------------------------------------------


@given(case=multi_user_cases())
def test_replay_of_interleaved_users_equals_running_each_user_directly(case):
    """replay over several users' Event objects ends in the states their direct runs reach."""
    config, per_user, order = case
    cfg = EngineConfig.from_dict(copy.deepcopy(config))
    direct = {user: run(create_state(cfg), steps) for user, steps in per_user.items()}
    position = dict.fromkeys(per_user, 0)
    events, expected_steps = [], []
    for user in order:
        index = position[user]
        position[user] += 1
        events.append(to_event(user, per_user[user][index]))
        expected_steps.append(direct[user][index])

    result = replay(cfg, events, until=0)  # a watermark in the past: nothing closes at the end
    assert result.closed_at_end == []
    assert set(result.states) == set(per_user)
    for user, states in direct.items():
        assert serialize(result.states[user]) == serialize(states[-1]), user
    assert len(result.steps) == len(events)
    for got, want in zip(result.steps, expected_steps, strict=True):
        assert serialize(got.state) == serialize(want), got.event

    closing = replay(cfg, events)  # the default final watermark: every timed-out episode closes
    for user, states in direct.items():
        timer = close_if_due(states[-1], END_OF_TIME)
        assert serialize(closing.states[user]) == serialize(timer.state), user
    assert {user for user, _ in closing.closed_at_end} == {
        user
        for user, states in direct.items()
        if close_if_due(states[-1], END_OF_TIME).closed is not None
    }
