"""Judge economy: LLM judge calls and prompt tokens per case for the seed suite.

The seed suite (``contextual_recall``, ``contextual_precision``,
``context_entity_recall``, ``contextual_relevancy``) runs on ``--cases`` cases with
5-node contexts through the real LLM judge path: ``LLMJudge`` -> litellm -> HTTP ->
an OpenAI-compatible server on loopback started in this process, which answers
schema-valid JSON derived from each request (``tests.fakes.openai_server.auto_reply``).
Its token counts are estimates (about 4 characters per token), the same for every
scenario, so the ratios are meaningful and the absolute numbers indicative.

The cases draw their documents from a shared pool with a skewed popularity, as
production retrieval does: a few documents come back again and again.

Scenarios, all in one run:

1. **no caches** (the baseline): answer cache off, entity chunk cache off, one case
   at a time (so no call in flight is shared either);
2. **cold**: a fresh judge and a fresh entity chunk cache, caches on;
3. **warm**: the same cases again on the judge and chunk cache of run 2.

Target: at most 4 judge calls per case cold (one per LLM metric), 0 warm.  The
peers' per-case calls for the same suite (METRICS.md): DeepEval 10
(ContextualRecall 2 + ContextualPrecision 2 + ContextualRelevancy N+1 = 6; it has no
entity recall), Ragas 8 (LLMContextRecall 1 + LLMContextPrecision N = 5 +
ContextEntityRecall 2; it has no contextual relevancy).

Run: ``.venv/bin/python benchmarks/judge_economy.py`` (``--help`` for options).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ragtrace_collector  # noqa: F401  (sets LITELLM_LOCAL_MODEL_COST_MAP first)
from ragtrace_collector.cases import ContextItem, RAGCase
from ragtrace_collector.judges.config import JudgeConfig
from ragtrace_collector.judges.llm import LLMJudge
from ragtrace_collector.metrics import EntityCache, Metric, build_metric
from ragtrace_collector.metrics.base import MetricOptions
from ragtrace_collector.metrics.entities import ContextEntityRecall
from tests.fakes.openai_server import FakeOpenAIServer, auto_reply

SEED_SUITE = (
    "contextual_recall",
    "contextual_precision",
    "context_entity_recall",
    "contextual_relevancy",
)
NODES_PER_CASE = 5
TARGET_CALLS_PER_CASE = 4
PEERS = {"DeepEval": 10, "Ragas": 8}
_KEY_ENV = "RAGTRACE_BENCH_JUDGE_KEY"

_PEOPLE = [
    "Ada Lovelace", "Alan Turing", "Grace Hopper", "Edsger Dijkstra", "Barbara Liskov",
    "Donald Knuth", "Margaret Hamilton", "John McCarthy", "Frances Allen", "Tony Hoare",
    "Niklaus Wirth", "Radia Perlman", "Ken Thompson", "Katherine Johnson", "Claude Shannon",
]  # fmt: skip
_ORGS = [
    "Bell Labs", "Xerox PARC", "Bletchley Park", "Project MAC", "Los Alamos",
    "the Royal Society", "IBM Research", "the Ferranti works", "NASA Langley", "Digital Equipment",
]  # fmt: skip
_CITIES = [
    "London", "Manchester", "Princeton", "Boston", "Zurich", "Amsterdam", "Stanford",
    "Cambridge", "Paris", "Berlin", "Oslo", "Toronto",
]  # fmt: skip
_THINGS = [
    "compiler", "operating system", "routing protocol", "programming language",
    "guidance computer", "cipher machine", "type system", "garbage collector",
]  # fmt: skip


@dataclass
class Scenario:
    name: str
    cases: int
    http_calls: int
    judge_calls: int
    cached_calls: int
    prompt_tokens: int
    completion_tokens: int
    usd: float | None
    entity_texts_needed: int
    entity_texts_extracted: int
    errors: int
    seconds: float
    #: metric -> [judge calls, prompt tokens]
    per_metric: dict[str, list[int]]

    @property
    def calls_per_case(self) -> float:
        return self.http_calls / self.cases

    @property
    def prompt_tokens_per_case(self) -> float:
        return self.prompt_tokens / self.cases


def _documents(rng: random.Random, count: int) -> list[tuple[str, str, str, str, str]]:
    docs = []
    for _ in range(count):
        docs.append(
            (
                rng.choice(_PEOPLE),
                rng.choice(_ORGS),
                rng.choice(_CITIES),
                str(rng.randint(1936, 1999)),
                rng.choice(_THINGS),
            )
        )
    return docs


def _doc_text(doc: tuple[str, str, str, str, str]) -> str:
    person, org, city, year, thing = doc
    return (
        f"{person} joined {org} in {city} in {year}. "
        f"There {person.split()[-1]} led the work on a new {thing}. "
        f"The {thing} was later adopted by teams far beyond {city}."
    )


def build_cases(count: int, pool_size: int, seed: int = 7) -> list[RAGCase]:
    """``count`` cases of 5 nodes drawn from a pool with Zipf-like popularity."""
    rng = random.Random(seed)
    pool = _documents(rng, pool_size)
    weights = [1.0 / (rank + 1) for rank in range(pool_size)]
    cases = []
    for i in range(count):
        chosen: list[int] = []
        while len(chosen) < NODES_PER_CASE:
            pick = rng.choices(range(pool_size), weights=weights)[0]
            if pick not in chosen:
                chosen.append(pick)
        rng.shuffle(chosen)
        person, org, city, year, thing = pool[chosen[0]]
        other_org = rng.choice([o for o in _ORGS if o != org])
        expected = (
            f"{person} joined {org} in {year}. {person} worked on a {thing} in {city}. "
            f"The effort was funded by {other_org}."
        )
        cases.append(
            RAGCase(
                case_id=f"case-{i}",
                input=f"What did {person} work on at {org}?",
                expected_output=expected,
                actual_output=f"{person} worked on a {thing}.",
                retrieval_context=[
                    ContextItem(id=f"doc-{j}", content=_doc_text(pool[j])) for j in chosen
                ],
            )
        )
    return cases


def _suite(entity_cache: EntityCache) -> list[Metric]:
    metrics: list[Metric] = []
    for name in SEED_SUITE:
        if name == "context_entity_recall":
            metrics.append(ContextEntityRecall(MetricOptions(), cache=entity_cache))
        else:
            metrics.append(build_metric(name))
    return metrics


async def run_scenario(
    name: str,
    server: FakeOpenAIServer,
    judge: LLMJudge,
    metrics: list[Metric],
    cases: list[RAGCase],
    entity_cache: EntityCache,
    concurrency: int,
) -> Scenario:
    before_requests = server.request_count
    before_entities = (entity_cache.stats.hits, entity_cache.stats.misses)
    gate = asyncio.Semaphore(concurrency)
    totals: dict[str, Any] = {"calls": 0, "cached": 0, "pt": 0, "ct": 0, "usd": 0.0, "errors": 0}
    per_metric: dict[str, list[int]] = {m.name: [0, 0] for m in metrics}

    async def one(case: RAGCase) -> None:
        async with gate:
            results = await asyncio.gather(*(m.measure(case, judge) for m in metrics))
        for result in results:
            per_metric[result.metric][0] += result.cost.calls
            per_metric[result.metric][1] += result.cost.prompt_tokens
            totals["calls"] += result.cost.calls
            totals["cached"] += result.cost.cached_calls
            totals["pt"] += result.cost.prompt_tokens
            totals["ct"] += result.cost.completion_tokens
            totals["errors"] += result.error is not None
            usd = result.cost.usd
            totals["usd"] = None if usd is None or totals["usd"] is None else totals["usd"] + usd

    started = time.perf_counter()
    await asyncio.gather(*(one(c) for c in cases))
    seconds = time.perf_counter() - started
    hits = entity_cache.stats.hits - before_entities[0]
    misses = entity_cache.stats.misses - before_entities[1]
    needed = sum(1 + len(c.retrieval_context or []) for c in cases)
    return Scenario(
        name=name,
        cases=len(cases),
        http_calls=server.request_count - before_requests,
        judge_calls=totals["calls"],
        cached_calls=totals["cached"],
        prompt_tokens=totals["pt"],
        completion_tokens=totals["ct"],
        usd=totals["usd"],
        entity_texts_needed=needed,
        entity_texts_extracted=misses if (hits or misses) else 0,
        errors=totals["errors"],
        seconds=seconds,
        per_metric=per_metric,
    )


def _judge(server: FakeOpenAIServer, model: str, cache_size: int, concurrency: int) -> LLMJudge:
    return LLMJudge(
        JudgeConfig(
            model=model,
            api_base=server.base_url,
            api_key_env=_KEY_ENV,
            cache_size=cache_size,
            concurrency=concurrency,
            timeout_s=30,
        )
    )


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.setdefault(_KEY_ENV, "sk-benchmark-dummy")
    cases = build_cases(args.cases, args.pool)
    distinct_docs = len({n.content for c in cases for n in c.retrieval_context or []})
    async with FakeOpenAIServer(auto_reply) as server:
        baseline_cache = EntityCache(maxsize=0)
        baseline = await run_scenario(
            "no caches (baseline)",
            server,
            _judge(server, args.model, 0, args.judge_concurrency),
            _suite(baseline_cache),
            cases,
            baseline_cache,
            1,  # one case at a time: no sharing of calls in flight either
        )
        cache = EntityCache()
        judge = _judge(server, args.model, 4096, args.judge_concurrency)
        metrics = _suite(cache)
        cold = await run_scenario("cold", server, judge, metrics, cases, cache, args.concurrency)
        warm = await run_scenario("warm", server, judge, metrics, cases, cache, args.concurrency)
    return {
        "cases": args.cases,
        "nodes_per_case": NODES_PER_CASE,
        "distinct_documents": distinct_docs,
        "document_slots": args.cases * NODES_PER_CASE,
        "model": args.model,
        "scenarios": [baseline, cold, warm],
    }


def report(outcome: dict[str, Any]) -> bool:
    scenarios: list[Scenario] = outcome["scenarios"]
    baseline, cold, warm = scenarios
    print(
        f"judge economy: seed suite ({', '.join(SEED_SUITE)}) on {outcome['cases']} cases x "
        f"{outcome['nodes_per_case']} nodes; {outcome['distinct_documents']} distinct documents "
        f"fill {outcome['document_slots']} context slots; judge {outcome['model']} via litellm "
        "-> loopback HTTP"
    )
    print()
    header = (
        f"{'scenario':<22}{'calls/case':>11}{'prompt tok/case':>16}{'cached':>8}"
        f"{'entity texts extracted':>24}{'USD':>11}{'errors':>8}{'seconds':>9}"
    )
    print(header)
    print("-" * len(header))
    for s in scenarios:
        usd = "n/a" if s.usd is None else f"{s.usd:.4f}"
        extracted = f"{s.entity_texts_extracted}/{s.entity_texts_needed}"
        print(
            f"{s.name:<22}{s.calls_per_case:>11.2f}{s.prompt_tokens_per_case:>16.0f}"
            f"{s.cached_calls:>8}{extracted:>24}{usd:>11}{s.errors:>8}{s.seconds:>9.2f}"
        )
    print()
    print(
        f"{'per metric, per case':<24}{'baseline calls':>15}{'tokens':>8}"
        f"{'cold calls':>12}{'tokens':>8}"
    )
    for name in SEED_SUITE:
        b_calls, b_tokens = baseline.per_metric[name]
        c_calls, c_tokens = cold.per_metric[name]
        n = cold.cases
        print(
            f"{name:<24}{b_calls / n:>15.2f}{b_tokens / n:>8.0f}{c_calls / n:>12.2f}"
            f"{c_tokens / n:>8.0f}"
        )
    print()
    print("calls per case, same suite:")
    print(f"  ragtrace cold {cold.calls_per_case:.2f}   warm {warm.calls_per_case:.2f}")
    for peer, calls in PEERS.items():
        print(
            f"  {peer:<9} {calls:>5}   (ragtrace cold / {peer} = {cold.calls_per_case / calls:.2f})"
        )
    if baseline.prompt_tokens:
        print(
            f"prompt tokens cold / no-caches baseline = "
            f"{cold.prompt_tokens / baseline.prompt_tokens:.3f} "
            f"(entity chunk cache: {cold.entity_texts_extracted} of "
            f"{cold.entity_texts_needed} texts extracted, "
            f"{baseline.entity_texts_extracted} without it)"
        )
    ok = (
        cold.calls_per_case <= TARGET_CALLS_PER_CASE
        and warm.http_calls == 0
        and not any(s.errors for s in scenarios)
    )
    verdict = "met" if ok else "NOT met"
    print(f"target (<= {TARGET_CALLS_PER_CASE} calls/case cold, 0 warm, no errors): {verdict}")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=50)
    parser.add_argument("--pool", type=int, default=40, help="documents in the shared pool")
    parser.add_argument("--model", default="openai/gpt-4o-mini", help="priced by litellm's map")
    parser.add_argument("--concurrency", type=int, default=8, help="cases evaluated at once")
    parser.add_argument("--judge-concurrency", type=int, default=8)
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = parser.parse_args(argv)
    outcome = asyncio.run(main_async(args))
    ok = report(outcome)
    if args.json:
        data = {**outcome, "scenarios": [asdict(s) for s in outcome["scenarios"]]}
        print(json.dumps(data, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
