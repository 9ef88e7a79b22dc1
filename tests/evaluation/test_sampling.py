"""Consistent sampling, attribute rules and budgets (ragtrace_collector.evaluation.sampling)."""

from __future__ import annotations

import itertools
import math
import random
from hashlib import blake2b

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from ragtrace import semconv
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.evaluation.sampling import (
    RuleMatch,
    Sampler,
    SamplingConfig,
    SamplingRule,
    rate_threshold,
    sampling_hash,
    trace_attribute_lookup,
)


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _trace_ids(n: int, seed: int = 7) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(16) for _ in range(n)]


def _no_rules(rate: float, **kw: object) -> SamplingConfig:
    return SamplingConfig.model_validate({"rate": rate, "rules": [], **kw})


# ---------------------------------------------------------------- the hash


def test_hash_is_the_documented_function() -> None:
    tid = bytes(range(16))
    expected = int.from_bytes(blake2b(tid, digest_size=8).digest(), "big")
    assert sampling_hash(tid) == expected
    assert sampling_hash(tid.hex()) == expected  # hex and raw bytes agree
    # the test vectors written in the docstring
    assert sampling_hash(tid) == 0xF49644867B0897EA
    assert sampling_hash(tid, "chat-42") == 0xDB01020124A05E8C
    keyed = int.from_bytes(blake2b(b"chat-42", digest_size=8, key=b"s1").digest(), "big")
    assert sampling_hash(tid, "chat-42", seed="s1") == keyed


def test_rate_threshold_bounds() -> None:
    assert rate_threshold(0.0) == 0
    assert rate_threshold(1.0) == 1 << 64
    assert rate_threshold(0.5) == 1 << 63
    assert rate_threshold(0.25) == 1 << 62
    for bad in (-0.1, 1.5, math.nan):
        with pytest.raises(ValueError, match="within"):
            rate_threshold(bad)


def test_decision_agrees_with_hash_and_threshold() -> None:
    sampler = Sampler(_no_rules(0.3))
    threshold = rate_threshold(0.3)
    for tid in _trace_ids(2000):
        assert sampler.decide(tid).sampled == (sampling_hash(tid) < threshold)


# -------------------------------------------------------------- consistency


def test_same_ids_same_decisions_across_instances() -> None:
    config = _no_rules(0.2)
    a, b = Sampler(config), Sampler(SamplingConfig.model_validate(config.model_dump()))
    ids = _trace_ids(5000)
    decisions_a = [a.decide(t).sampled for t in ids]
    assert decisions_a == [b.decide(t).sampled for t in ids]
    assert decisions_a == [b.decide(t.hex()).sampled for t in ids]  # hex form too
    assert decisions_a == [a.decide(t).sampled for t in ids]  # and stable over time
    assert 0 < sum(decisions_a) < len(ids)


def test_seed_draws_an_independent_sample() -> None:
    ids = _trace_ids(4000)
    plain = {t for t in ids if Sampler(_no_rules(0.5)).decide(t).sampled}
    seeded = {t for t in ids if Sampler(_no_rules(0.5, hash_seed="x")).decide(t).sampled}
    # independent halves overlap on about a quarter of the ids
    assert abs(len(plain & seeded) - len(ids) / 4) < 5 * math.sqrt(len(ids) * 3 / 16)


RATES = [0.0, 0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0]


def test_lower_rate_sample_is_subset_of_higher() -> None:
    ids = _trace_ids(20_000)
    samples = [{t for t in ids if Sampler(_no_rules(r)).decide(t).sampled} for r in RATES]
    for lower, higher in itertools.pairwise(samples):
        assert lower <= higher
    assert samples[0] == set()
    assert samples[-1] == set(ids)


@settings(max_examples=200, deadline=None)
@given(
    st.binary(min_size=16, max_size=16),
    st.floats(0.0, 1.0),
    st.floats(0.0, 1.0),
)
def test_subset_property_any_id_any_rates(tid: bytes, r1: float, r2: float) -> None:
    lo, hi = sorted((r1, r2))
    if Sampler(_no_rules(lo)).decide(tid).sampled:
        assert Sampler(_no_rules(hi)).decide(tid).sampled


@pytest.mark.parametrize("rate", [0.01, 0.1, 0.5, 0.9])
def test_realised_rate_within_tolerance(rate: float) -> None:
    n = 40_000
    sampler = Sampler(_no_rules(rate))
    hits = sum(sampler.decide(t).sampled for t in _trace_ids(n, seed=11))
    sd = math.sqrt(n * rate * (1 - rate))
    assert abs(hits - n * rate) < 5 * sd, (hits, n * rate, sd)


def test_realised_rate_over_session_ids() -> None:
    n, rate = 20_000, 0.2
    sampler = Sampler(_no_rules(rate))
    tid = bytes(16)
    hits = sum(sampler.decide(tid, f"session-{i}").sampled for i in range(n))
    assert abs(hits - n * rate) < 5 * math.sqrt(n * rate * (1 - rate))


# ---------------------------------------------------------------- sessions


def test_all_turns_of_a_session_share_the_decision() -> None:
    sampler = Sampler(_no_rules(0.3))
    other = Sampler(_no_rules(0.3))
    seen = set()
    for i in range(300):
        sid = f"conv-{i}"
        turns = _trace_ids(8, seed=i)
        decisions = {sampler.decide(t, sid).sampled for t in turns}
        decisions |= {other.decide(t, sid).sampled for t in turns}
        assert len(decisions) == 1, sid
        (decision,) = decisions
        assert decision == (sampling_hash(b"", sid) < rate_threshold(0.3))
        assert sampler.decide(turns[0], sid).hashed_on == "session"
        seen.add(decision)
    assert seen == {True, False}


def test_empty_session_id_falls_back_to_trace_id() -> None:
    sampler = Sampler(_no_rules(0.5))
    for tid in _trace_ids(200):
        d = sampler.decide(tid, "")
        assert d.hashed_on == "trace"
        assert d.sampled == sampler.decide(tid, None).sampled


# -------------------------------------------------------------------- rules


def test_default_config_evaluates_ground_truth_always() -> None:
    sampler = Sampler()  # default: rate 0.1, ground truth at 1.0
    ids = _trace_ids(2000)
    for name in semconv.GROUND_TRUTH_ATTRIBUTES:
        for tid in ids[:200]:
            d = sampler.decide(tid, None, {name: "x"})
            assert d.sampled
            assert d.rule == "ground_truth"
            assert d.rate == 1.0
    plain = [sampler.decide(t, None, {"service.name": "svc"}) for t in ids]
    assert {d.rule for d in plain} == {"default"}
    assert {d.rate for d in plain} == {0.1}
    assert 0 < sum(d.sampled for d in plain) < len(ids) / 4


def test_first_matching_rule_wins() -> None:
    config = SamplingConfig.model_validate(
        {
            "rate": 0.0,
            "rules": [
                {"name": "gt", "match": {"ground_truth": True}, "rate": 1.0},
                {"name": "checkout", "match": {"equals": {"service.name": "checkout"}}, "rate": 0},
                {"name": "svc", "match": {"exists": ["service.name"]}, "rate": 1.0},
                {
                    "name": "env",
                    "match": {"one_of": {"deployment.environment": ["staging", "dev"]}},
                    "rate": 1.0,
                },
            ],
        }
    )
    s = Sampler(config)
    tid = bytes(range(16))
    gt_and_checkout = {"service.name": "checkout", semconv.EXPECTED_OUTPUT: "y"}
    assert s.decide(tid, None, gt_and_checkout).rule == "gt"
    assert s.decide(tid, None, {"service.name": "checkout"}).rule == "checkout"
    assert not s.decide(tid, None, {"service.name": "checkout"}).sampled
    assert s.decide(tid, None, {"service.name": "search"}).rule == "svc"
    assert s.decide(tid, None, {"deployment.environment": "dev"}).rule == "env"
    assert s.decide(tid, None, {"deployment.environment": "prod"}).rule == "default"
    assert s.decide(tid, None, None).rule == "default"
    assert s.decide(tid, None, {}).outcome == "unsampled"


def test_match_conditions_are_anded_and_typed() -> None:
    rule = SamplingRule(
        name="both",
        match=RuleMatch(equals={"service.name": "a", "canary": True}, exists_any=["x", "y"]),
        rate=1.0,
    )
    s = Sampler(SamplingConfig(rate=0.0, rules=[rule]))
    tid = bytes(16)
    assert s.decide(tid, None, {"service.name": "a", "canary": True, "y": 1}).sampled
    assert not s.decide(tid, None, {"service.name": "a", "canary": True}).sampled
    assert not s.decide(tid, None, {"service.name": "b", "canary": True, "x": 1}).sampled
    # 1 is not True: an attribute's type is part of its value
    assert not s.decide(tid, None, {"service.name": "a", "canary": 1, "x": 1}).sampled


def test_negated_ground_truth_and_catch_all() -> None:
    config = SamplingConfig(
        rate=0.0,
        rules=[
            SamplingRule(name="no_gt", match=RuleMatch(ground_truth=False), rate=0.0),
            SamplingRule(name="all", rate=1.0),
        ],
    )
    s = Sampler(config)
    assert s.decide(bytes(16), None, {}).rule == "no_gt"
    assert s.decide(bytes(16), None, {semconv.REFERENCE_CONTEXT_IDS: "[]"}).rule == "all"


def test_rules_on_a_multi_span_trace() -> None:
    resource = {"service.name": "api"}
    spans = [
        {**resource, semconv.RAGTRACE_SPAN_KIND: "rag"},
        {**resource, semconv.RAGTRACE_SPAN_KIND: "retriever", "db": "vec"},
        {"service.name": "llm-proxy", semconv.REFERENCE_CONTEXT_IDS: '["d1"]'},
    ]
    lookup = trace_attribute_lookup(spans)
    assert lookup("service.name") == ("api", "llm-proxy")
    assert lookup("missing") == ()
    config = SamplingConfig.model_validate(
        {
            "rate": 0.0,
            "rules": [
                {"name": "gt", "match": {"ground_truth": True}, "rate": 1.0},
                {"name": "proxy", "match": {"equals": {"service.name": "llm-proxy"}}, "rate": 1},
            ],
        }
    )
    s = Sampler(config)
    assert s.decide(bytes(16), None, lookup).rule == "gt"  # ground truth on any span
    assert s.decide(bytes(16), None, trace_attribute_lookup(spans[:2])).rule == "default"
    no_gt = [{k: v for k, v in sp.items() if k != semconv.REFERENCE_CONTEXT_IDS} for sp in spans]
    assert s.decide(bytes(16), None, trace_attribute_lookup(no_gt)).rule == "proxy"


def test_config_rejects_bad_input() -> None:
    with pytest.raises(ValidationError, match="extra"):
        SamplingConfig.model_validate({"rate": 0.1, "ratee": 1})
    with pytest.raises(ValidationError):
        SamplingConfig.model_validate({"rate": 1.5})
    with pytest.raises(ValidationError):
        SamplingConfig.model_validate({"rules": [{"name": "a", "rate": -0.1}]})
    with pytest.raises(ValidationError, match="used twice"):
        SamplingConfig.model_validate(
            {"rules": [{"name": "a", "rate": 1}, {"name": "a", "rate": 0}]}
        )
    with pytest.raises(ValidationError, match="reserved"):
        SamplingConfig.model_validate({"rules": [{"name": "default", "rate": 1}]})
    with pytest.raises(ValidationError, match="extra"):
        SamplingConfig.model_validate({"rules": [{"name": "a", "rate": 1, "match": {"eq": {}}}]})


def test_decision_attributes_and_reason() -> None:
    s = Sampler(_no_rules(1.0))
    d = s.decide(bytes(16), "sess")
    assert d.attributes() == {semconv.EVAL_SAMPLE_RATE: 1.0, semconv.EVAL_SAMPLED: True}
    assert "rule 'default' rate 1" in d.reason
    assert "session hash" in d.reason
    u = Sampler(_no_rules(0.0)).decide(bytes(16))
    assert u.outcome == "unsampled"
    assert u.reason.startswith("not sampled")
    assert u.attributes()[semconv.EVAL_SAMPLED] is False


# ------------------------------------------------------------------ budgets


def test_evaluations_per_minute_budget_under_burst() -> None:
    clock = FakeClock()
    s = Sampler(_no_rules(1.0, max_evaluations_per_minute=5), clock=clock)
    ids = _trace_ids(40)
    burst = [s.decide(t) for t in ids[:20]]
    assert [d.outcome for d in burst] == ["sampled"] * 5 + ["budget"] * 15
    assert {d.budget for d in burst[5:]} == {"max_evaluations_per_minute"}
    assert "exhausted" in burst[5].reason
    assert s.evaluations_last_minute() == 5

    clock.advance(59.9)
    assert s.decide(ids[20]).outcome == "budget"
    clock.advance(0.1)  # the first admissions are now 60 s old
    later = [s.decide(t) for t in ids[20:30]]
    assert [d.outcome for d in later] == ["sampled"] * 5 + ["budget"] * 5


def test_evaluation_budget_is_a_sliding_window() -> None:
    clock = FakeClock()
    s = Sampler(_no_rules(1.0, max_evaluations_per_minute=4), clock=clock)
    ids = iter(_trace_ids(100))
    outcomes = []
    for _ in range(12):  # one request every 20 s: 3 per minute fit, all pass
        outcomes.append(s.decide(next(ids)).outcome)
        clock.advance(20)
    assert outcomes == ["sampled"] * 12
    # 2 at t, 2 at t+30: full; at t+59 still full; at t+60 two slots free again
    clock.advance(100)
    assert [s.decide(next(ids)).outcome for _ in range(2)] == ["sampled"] * 2
    clock.advance(30)
    assert [s.decide(next(ids)).outcome for _ in range(3)] == ["sampled", "sampled", "budget"]
    clock.advance(29)
    assert s.decide(next(ids)).outcome == "budget"
    clock.advance(1)
    assert [s.decide(next(ids)).outcome for _ in range(3)] == ["sampled", "sampled", "budget"]


def test_unsampled_traces_do_not_consume_the_budget() -> None:
    clock = FakeClock()
    s = Sampler(_no_rules(0.5, max_evaluations_per_minute=3), clock=clock)
    ids = _trace_ids(200)
    decisions = [s.decide(t) for t in ids]
    chosen = [d for d in decisions if d.outcome != "unsampled"]
    assert [d.outcome for d in chosen[:3]] == ["sampled"] * 3
    assert {d.outcome for d in chosen[3:]} == {"budget"}
    assert sum(d.outcome == "unsampled" for d in decisions) > 50


def test_cost_budget_blocks_after_spend_and_recovers_after_the_hour() -> None:
    clock = FakeClock(start=5000.25)
    s = Sampler(_no_rules(1.0, max_cost_usd_per_hour=1.0), clock=clock)
    ids = iter(_trace_ids(100))
    assert s.decide(next(ids)).sampled
    s.record_cost(0.6)
    clock.advance(600)
    assert s.decide(next(ids)).sampled  # 0.6 < 1.0
    s.record_cost(0.5)
    assert s.spend_last_hour() == pytest.approx(1.1)
    blocked = s.decide(next(ids))
    assert blocked.outcome == "budget"
    assert blocked.budget == "max_cost_usd_per_hour"
    assert not blocked.sampled

    clock.advance(3001)  # the first spend's 1 s bucket is now wholly older than an hour
    assert s.spend_last_hour() == pytest.approx(0.5)
    assert s.decide(next(ids)).sampled  # recovered: 0.5 < 1.0
    clock.advance(600)
    assert s.spend_last_hour() == 0.0
    assert s.decide(next(ids)).sampled


def test_cost_budget_never_forgets_early() -> None:
    clock = FakeClock(start=0.0)
    s = Sampler(_no_rules(1.0, max_cost_usd_per_hour=1.0), clock=clock)
    s.record_cost(1.0)
    clock.advance(3599.999)
    assert s.decide(bytes(16)).outcome == "budget"
    clock.advance(1.01)
    assert s.decide(bytes(16)).outcome == "sampled"


def test_cost_budget_accumulates_many_small_costs() -> None:
    clock = FakeClock(start=0.0)
    s = Sampler(_no_rules(1.0, max_cost_usd_per_hour=0.5), clock=clock)
    admitted = 0
    for _ in range(1000):
        if s.decide(bytes(16)).sampled:
            admitted += 1
            s.record_cost(1 / 64)  # exact in binary: the sum reaches 0.5 exactly
        clock.advance(0.25)
    assert admitted == 32  # all within 250 s: nothing left the hour


def test_both_budgets_and_bad_costs() -> None:
    clock = FakeClock()
    s = Sampler(
        _no_rules(1.0, max_evaluations_per_minute=10, max_cost_usd_per_hour=0.1), clock=clock
    )
    assert s.decide(bytes(16)).sampled
    s.record_cost(0.2)
    assert s.decide(bytes(16)).budget == "max_cost_usd_per_hour"
    assert s.evaluations_last_minute() == 1  # refused ones take no slot
    s.record_cost(0.0)
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="cost"):
            s.record_cost(bad)


def test_zero_budget_refuses_everything() -> None:
    s = Sampler(_no_rules(1.0, max_evaluations_per_minute=0))
    assert {s.decide(t).outcome for t in _trace_ids(20)} == {"budget"}


def test_ground_truth_rule_is_still_budgeted() -> None:
    s = Sampler(SamplingConfig(max_evaluations_per_minute=1), clock=FakeClock())
    gt = {semconv.EXPECTED_OUTPUT: "x"}
    assert s.decide(bytes(16), None, gt).outcome == "sampled"
    assert s.decide(bytes(16), None, gt).outcome == "budget"


def test_telemetry_counts_decisions() -> None:
    telemetry = Telemetry()
    s = Sampler(_no_rules(0.5, max_evaluations_per_minute=10), telemetry=telemetry)
    outcomes = [s.decide(t).outcome for t in _trace_ids(200)]

    def count(decision: str) -> float:
        value = telemetry.registry.get_sample_value(
            "ragtrace_eval_traces_total", {"decision": decision}
        )
        return value or 0.0

    for decision in ("sampled", "unsampled", "budget"):
        assert count(decision) == outcomes.count(decision)
    assert outcomes.count("sampled") == 10
