"""Time ``non_llm_context_recall`` per case against the bare rapidfuzz calls.

10,000 cases, each with 5 retrieved and 2 reference contexts of about 200 characters.
The baseline is the same similarity work done directly with rapidfuzz (for each
reference, the max of ``Levenshtein.normalized_similarity`` over the retrieved
contexts), measured in the same run; the ratio is the metric's overhead (inputs
check, result model, details, async call).

Run: ``.venv/bin/python benchmarks/nonllm_recall.py [--cases N] [--repeat R]``
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

from rapidfuzz.distance import Levenshtein

from ragtrace_collector.cases import ContextItem, RAGCase
from ragtrace_collector.metrics import build_metric

_WORD_TEXT = (
    "retrieval context reference answer question document index vector search rank model "
    "paris france tower river city capital engineer design built year history museum art "
    "python language code release version system service latency error budget alert "
    "mountain height border valley forest basin rain species climate energy market price"
)
_WORDS = _WORD_TEXT.split()


def _text(rng: random.Random, length: int = 200) -> str:
    words: list[str] = []
    size = 0
    while size < length:
        w = rng.choice(_WORDS)
        words.append(w)
        size += len(w) + 1
    return " ".join(words)[:length]


def contexts(rng: random.Random) -> tuple[list[str], list[str]]:
    """5 retrieved contexts; 2 references: one close to a retrieved context, one unrelated."""
    retrieved = [_text(rng) for _ in range(5)]
    near = retrieved[rng.randrange(5)]
    cut = rng.randrange(20, 60)
    return retrieved, [near[cut:] + near[:cut], _text(rng)]


def _cases(n: int, seed: int = 7) -> list[RAGCase]:
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        retrieved, reference = contexts(rng)
        cases.append(
            RAGCase(
                retrieval_context=[ContextItem(content=t) for t in retrieved],
                reference_contexts=reference,
            )
        )
    return cases


def _baseline(cases: list[RAGCase]) -> tuple[float, float]:
    inputs = [([c.content for c in case.retrieval_context or []], case.reference_contexts or [])
              for case in cases]  # fmt: skip
    sim = Levenshtein.normalized_similarity
    started = time.perf_counter()
    total = 0.0
    for retrieved, reference in inputs:
        recalled = sum(1 for r in reference if max([sim(r, c) for c in retrieved]) > 0.5)
        total += recalled / len(reference)
    return time.perf_counter() - started, total / len(inputs)


async def _metric(cases: list[RAGCase]) -> tuple[float, float]:
    metric = build_metric("non_llm_context_recall")
    started = time.perf_counter()
    total = 0.0
    for case in cases:
        result = await metric.measure(case, None)
        assert result.score is not None
        total += result.score
    return time.perf_counter() - started, total / len(cases)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3, help="best of R runs")
    args = parser.parse_args()
    cases = _cases(args.cases)
    base_runs, metric_runs = [], []
    for _ in range(args.repeat):
        t, base_mean = _baseline(cases)
        base_runs.append(t)
        t, metric_mean = asyncio.run(_metric(cases))
        metric_runs.append(t)
        assert abs(base_mean - metric_mean) < 1e-12, (base_mean, metric_mean)
    base = min(base_runs) / args.cases * 1e6
    metric = min(metric_runs) / args.cases * 1e6
    print(f"non_llm_context_recall: {args.cases} cases, 5 retrieved x 2 reference x ~200 chars")
    print(f"  mean score                 {metric_mean:.4f}")
    print(f"  bare rapidfuzz baseline    {base:8.2f} us/case")
    print(f"  metric (measure)           {metric:8.2f} us/case")
    print(f"  ratio metric / baseline    {metric / base:8.2f}x")


if __name__ == "__main__":
    main()
