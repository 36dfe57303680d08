"""The prediction model: Beta evidence, decay, reveal rule, cooldowns, explain."""

from __future__ import annotations

import math

import pytest

from engine import (
    UnknownIntentError,
    create_state,
    deserialize,
    end_episode,
    explain,
    mark_revealed,
    observe,
    predict,
    predict_many,
    serialize,
    should_reveal,
)
from engine.durations import MAX_DURATION_MS, MAX_TIME_MS
from engine.errors import InvalidEventError, InvalidTimeError
from engine.predict import predict_settled
from tests.engine.helpers import DAY, MINUTE, MONDAY_10, QUICKSTART, WEEK, config

T0 = 1_767_261_600_000  # SPEC's example timestamp


def test_quickstart_two_signals_a_minute_apart_give_p_0_433():
    """SPEC §4 sanity pin: pricing.viewed then limit.hit a minute apart, defaults."""
    state = create_state(config({"upgrade": QUICKSTART}))
    state = observe(state, "pricing.viewed", T0)
    state = observe(state, "limit.hit", T0 + MINUTE)
    prediction = predict(state, "upgrade", T0 + MINUTE)
    assert round(prediction.p, 3) == 0.433
    decayed = 3 * 2 ** (-MINUTE / WEEK)  # the first event's 3 has decayed for one minute
    assert prediction.alpha == pytest.approx(1.5 + decayed + 2, rel=1e-12)
    assert prediction.beta == pytest.approx(8.5, rel=1e-12)


def test_predict_many_gives_the_quickstart_pin_and_names_an_unknown_intent():
    """The SPEC §4 pin through `predict_many`; an undeclared intent raises as in `predict`."""
    state = create_state(config({"upgrade": QUICKSTART}))
    state = observe(state, "pricing.viewed", T0)
    state = observe(state, "limit.hit", T0 + MINUTE)
    assert round(predict_many(state, T0 + MINUTE)["upgrade"].p, 3) == 0.433
    with pytest.raises(UnknownIntentError, match="nope"):
        predict_many(state, T0, ["upgrade", "nope"])


def test_fresh_intent_sits_at_its_prior():
    """No evidence: p = prior, sd from Beta(α0, β0), no reveal."""
    cfg = config({"x": {"signals": {"s": 1}, "prior": 0.2, "priorWeight": 20}})
    prediction = predict(create_state(cfg), "x", T0)
    assert prediction.p == pytest.approx(0.2)
    assert prediction.sd == pytest.approx(math.sqrt(4 * 16 / (20 * 20 * 21)))
    assert prediction.lower == pytest.approx(0.2 - prediction.sd)
    assert not prediction.reveal and prediction.suppressed_until is None


def test_evidence_decays_back_toward_the_prior_with_the_half_life():
    """One half-life after the last signal half of its evidence is left."""
    state = observe(create_state(config({"upgrade": QUICKSTART})), "pricing.viewed", T0)
    assert predict(state, "upgrade", T0 + WEEK).alpha == pytest.approx(1.5 + 1.5)
    assert predict(state, "upgrade", T0 + 2 * WEEK).alpha == pytest.approx(1.5 + 0.75)


def test_negative_weight_adds_to_beta():
    """A negative effective weight adds |e| to β."""
    cfg = config({"x": {"signals": {"s": -2}}})
    prediction = predict(observe(create_state(cfg), "s", T0), "x", T0)
    assert (prediction.alpha, prediction.beta) == pytest.approx((1.5, 8.5 + 2))


REVEALING = {
    "signals": {"s": 10},
    "outcome": "o",
    "prior": 0.5,
    "priorWeight": 2,
    "threshold": 0.6,
    "z": 1.0,
    "cooldown": "1h",
}


def test_reveal_needs_p_and_the_lower_bound_above_the_threshold():
    """p ≥ threshold is not enough: p − z·sd must clear it too."""
    cfg = config({"x": {**REVEALING, "signals": {"s": 0.5}, "z": 3.0}})
    state = observe(create_state(cfg), "s", T0)
    prediction = predict(state, "x", T0)
    assert prediction.p >= 0.6 and prediction.lower < 0.6 and not prediction.reveal
    strong = observe(create_state(config({"x": REVEALING})), "s", T0)
    assert should_reveal(strong, "x", T0) and predict(strong, "x", T0).reveal


def test_cooldown_after_a_reveal_suppresses_until_its_end():
    """mark_revealed(at) starts [at, at + cooldown); suppressed_until reports its end."""
    state = observe(create_state(config({"x": REVEALING})), "s", T0)
    shown = mark_revealed(state, "x", T0 + MINUTE)
    until = T0 + MINUTE + 60 * MINUTE
    assert predict(shown, "x", T0 + 2 * MINUTE).suppressed_until == until
    assert not should_reveal(shown, "x", until - 1)
    assert predict(shown, "x", until).suppressed_until is None
    assert should_reveal(shown, "x", until)
    assert should_reveal(state, "x", T0 + 2 * MINUTE)  # the input state is unchanged


def test_outcome_starts_a_cooldown_and_resets_evidence():
    """After the outcome: evidence back at the prior, no reveal during the cooldown."""
    cfg = config({"x": {**REVEALING, "resetOnOutcome": True}})
    state = observe(create_state(cfg), "s", T0)
    state = observe(state, "o", T0 + MINUTE)
    prediction = predict(state, "x", T0 + MINUTE)
    assert (prediction.alpha, prediction.beta) == (1.0, 1.0)
    assert prediction.suppressed_until == T0 + MINUTE + 60 * MINUTE
    assert state.intents["x"].learned["s"].hits == 1  # learning is kept


def test_later_of_two_cooldowns_is_reported():
    """suppressed_until is the later end of the cooldowns still running."""
    cfg = config({"x": {**REVEALING, "resetOnOutcome": False}})
    state = observe(create_state(cfg), "s", T0)
    state = mark_revealed(state, "x", T0 + 10 * MINUTE)
    state = observe(state, "o", T0 + 5 * MINUTE)  # late: applied at the clock, T0 + 10m
    assert state.intents["x"].last_outcome_at == T0 + 10 * MINUTE
    state = observe(state, "o", T0 + 30 * MINUTE)
    assert predict(state, "x", T0 + 31 * MINUTE).suppressed_until == T0 + 90 * MINUTE


def test_without_reset_on_outcome_the_evidence_stays():
    """resetOnOutcome: false keeps α after the outcome."""
    cfg = config({"x": {**REVEALING, "resetOnOutcome": False}})
    state = observe(observe(create_state(cfg), "s", T0), "o", T0)
    assert predict(state, "x", T0).alpha == pytest.approx(11.0)


def test_explain_contribution_and_impact():
    """contribution is what a signal still adds; impact is p minus p without it."""
    cfg = config({"upgrade": QUICKSTART})
    state = observe(create_state(cfg), "pricing.viewed", MONDAY_10)
    state = observe(state, "limit.hit", MONDAY_10)
    result = explain(state, "upgrade", MONDAY_10 + WEEK)
    pricing = result.signals["pricing.viewed"]
    assert pricing.contribution == pytest.approx(1.5)
    assert result.signals["limit.hit"].contribution == pytest.approx(1.0)
    alpha, beta = 1.5 + 1.5 + 1.0, 8.5
    assert result.p == pytest.approx(alpha / (alpha + beta))
    assert pricing.impact == pytest.approx(alpha / (alpha + beta) - 2.5 / 11.0)
    assert (pricing.initial, pricing.learned, pricing.effective, pricing.seen) == (3, 0, 3, 1)


def test_reads_reject_unknown_intents_and_bad_times():
    """Clear errors: the intent name and the declared ones; time must be int ms."""
    state = create_state(config({"upgrade": QUICKSTART}))
    with pytest.raises(UnknownIntentError, match=r"unknown intent 'upgrad'.*'upgrade'"):
        predict(state, "upgrad", T0)
    with pytest.raises(UnknownIntentError):
        mark_revealed(state, "nope", T0)
    with pytest.raises(InvalidTimeError, match=r"epoch milliseconds as an int \(got str"):
        observe(state, "pricing.viewed", "2026-01-01")  # type: ignore[arg-type]
    with pytest.raises(InvalidTimeError):
        predict(state, "upgrade", 1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("at", [-1, MAX_TIME_MS + 1, 2**64, -(2**63) - 1])
def test_a_time_outside_1970_to_9999_is_refused_by_every_call(at):
    """Times are epoch ms from 1970 to the end of year 9999: what a stored state and an output
    can hold with any duration added (beyond it, serialize would fail later, far from the
    cause)."""
    state = observe(create_state(config({"upgrade": QUICKSTART})), "pricing.viewed", T0)
    calls = [
        lambda: observe(state, "pricing.viewed", at),
        lambda: end_episode(state, at),
        lambda: predict(state, "upgrade", at),
        lambda: explain(state, "upgrade", at),
        lambda: should_reveal(state, "upgrade", at),
        lambda: mark_revealed(state, "upgrade", at),
    ]
    for call in calls:
        with pytest.raises(InvalidTimeError, match=r"from 0 \(1970\) to 253402300799999"):
            call()


def test_the_extremes_of_time_and_duration_still_serialize_and_predict():
    """The latest time with the longest durations: every derived time (a cooldown's end, an
    attribution window's end, a timeout) still fits a serialized state."""
    longest = f"{MAX_DURATION_MS}ms"
    intent = {**QUICKSTART, "cooldown": longest, "halfLife": longest, "attribution": longest}
    cfg = config({"upgrade": intent}, episodeTimeout=longest)
    state = create_state(cfg)
    for at, name in ((0, "pricing.viewed"), (1, "upgrade.completed")):
        state = observe(state, name, at)
    state = mark_revealed(end_episode(state, 2), "upgrade", 3)
    state = observe(state, "pricing.viewed", MAX_TIME_MS)
    prediction = predict(state, "upgrade", MAX_TIME_MS)
    assert prediction.suppressed_until == 3 + MAX_DURATION_MS
    assert deserialize(serialize(state), config=cfg) == state


def test_time_never_runs_backwards_inside_a_state():
    """A late event is applied at the state's last time."""
    state = observe(create_state(config({"upgrade": QUICKSTART})), "page.viewed", T0 + DAY)
    late = observe(state, "pricing.viewed", T0)
    assert late.clock == T0 + DAY and late.episode.last_event_at == T0 + DAY
    assert late.intents["upgrade"].evidence["pricing.viewed"].at == T0 + DAY


@pytest.mark.parametrize("name", [None, "", 3, b"pricing.viewed"])
def test_an_event_name_that_is_not_a_non_empty_string_is_refused(name):
    state = create_state(config({"upgrade": QUICKSTART}))
    with pytest.raises(InvalidEventError, match="an event name must be a non-empty string"):
        observe(state, name, T0)  # type: ignore[arg-type]


@pytest.mark.parametrize("weight", [1e-200, 1e-300, 1e-320])
def test_a_tiny_prior_weight_predicts_and_explains(weight):
    """sd = sqrt(αβ / ((α+β)²(α+β+1))) underflowed to 0/0 (ZeroDivisionError) for
    priorWeight 1e-200; it is computed as p(1 − p)/(α+β+1) when the products underflow, and
    explain's 'p without this signal' no longer cancels the prior away."""
    cfg = config({"u": {"signals": {"a": 1, "b": -1}, "outcome": "o", "priorWeight": weight}})
    state = create_state(cfg)
    fresh = predict(state, "u", T0)
    rel = 1e-9 if weight > 1e-300 else 1e-2  # 1e-320 is subnormal: a few digits only
    assert fresh.p == pytest.approx(0.15, rel=rel)
    assert fresh.sd == pytest.approx(math.sqrt(0.15 * 0.85), rel=rel)
    state = observe(observe(state, "a", T0), "b", T0 + 1)
    prediction = predict(state, "u", T0 + 2)
    assert prediction.p == pytest.approx(0.5)
    assert prediction.sd == pytest.approx(math.sqrt(0.25 / 3))
    explanation = explain(state, "u", T0 + 2)
    assert explanation.p == pytest.approx(0.5)
    # without a: (α0) / (α0 + β0 + 1) ≈ 0; without b: (α0 + 1) / (α0 + 1 + β0) ≈ 1
    assert explanation.signals["a"].impact == pytest.approx(0.5)
    assert explanation.signals["b"].impact == pytest.approx(-0.5)


def test_sd_keeps_the_documented_formula_bit_for_bit_where_it_does_not_underflow():
    """The pinned results were computed with sqrt(αβ / ((α+β)²(α+β+1))): it stays in use."""
    cfg = config({"u": {**QUICKSTART, "priorWeight": 1e-100}, "v": QUICKSTART})
    state = observe(observe(create_state(cfg), "pricing.viewed", T0), "limit.hit", T0 + MINUTE)
    for name in ("u", "v"):
        p = predict(state, name, T0 + MINUTE)
        total = p.alpha + p.beta
        assert p.sd == math.sqrt(p.alpha * p.beta / (total * total * (total + 1.0)))


def test_an_intent_that_is_not_a_string_is_an_unknown_intent():
    """predict(state, ['u'], t) said 'unhashable type: list'."""
    state = create_state(config({"u": QUICKSTART}))
    for call in (predict, explain, should_reveal, mark_revealed):
        with pytest.raises(UnknownIntentError, match=r"unknown intent \['u'\]"):
            call(state, ["u"], T0)
    with pytest.raises(UnknownIntentError):
        predict_many(state, T0, [["u"]])


def test_predict_settled_names_an_undeclared_intent_as_predict_many_does() -> None:
    """It read the state's intent before the config, so a name not declared was a KeyError
    instead of its documented UnknownIntentError."""
    state = create_state(config({"u": QUICKSTART}))
    for names in (["nope"], ["u", "nope"], [["u"]]):
        with pytest.raises(UnknownIntentError, match="unknown intent"):
            predict_settled(state, T0, names)
    assert predict_settled(state, T0, ["u"]) == predict_many(state, T0, ["u"])


def test_an_event_name_that_is_not_unicode_text_is_an_unknown_name_and_serializes():
    """A lone surrogate (json.loads makes one of "\\ud800") cannot be declared, so such an event
    only opens or extends the episode; serialize never sees the name."""
    cfg = config({"u": QUICKSTART}, episodeTimeout="30m")
    state = observe(create_state(cfg), "pricing.viewed", T0)
    after = observe(state, "pricing.viewed\ud800", T0 + MINUTE)
    assert after.intents == state.intents
    assert after.episode.last_event_at == T0 + MINUTE
    assert deserialize(serialize(after)) == after
    assert deserialize(serialize(after, include_config=False), config=cfg) == after
