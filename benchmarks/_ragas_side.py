"""The Ragas half of ``nonllm_vs_ragas.py``; runs in the Ragas venv, not the project's.

Reads the samples (JSONL, Ragas field names) from argv[1], scores them with the four
non-LLM Ragas metrics (or those named, comma-separated, in argv[3]), best of
``argv[2]`` runs each, and prints one JSON object:
``{metric: {"seconds": best, "scores": [...]}}`` (NaN written as null).

Each metric runs the way Ragas's own per-sample API runs it: ``await
metric.single_turn_ascore(sample)`` in one event loop, samples built beforehand (not
timed).  This is Ragas's fastest documented path; ``ragas.evaluate()`` adds its
executor and progress bar on top.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
import warnings


def main() -> None:
    warnings.simplefilter("ignore")  # ragas's deprecation warnings on the legacy imports
    from ragas.dataset_schema import SingleTurnSample
    from ragas.metrics import (
        IDBasedContextPrecision,
        IDBasedContextRecall,
        NonLLMContextPrecisionWithReference,
        NonLLMContextRecall,
    )

    path, repeat = sys.argv[1], int(sys.argv[2])
    with open(path, encoding="utf-8") as fh:
        samples = [SingleTurnSample(**json.loads(line)) for line in fh if line.strip()]
    metrics = {
        "NonLLMContextRecall": NonLLMContextRecall(),
        "IDBasedContextRecall": IDBasedContextRecall(),
        "NonLLMContextPrecisionWithReference": NonLLMContextPrecisionWithReference(),
        "IDBasedContextPrecision": IDBasedContextPrecision(),
    }
    if len(sys.argv) > 3:
        metrics = {name: metrics[name] for name in sys.argv[3].split(",")}
    out: dict[str, dict[str, object]] = {}
    for name, metric in metrics.items():

        async def run(metric: object = metric) -> tuple[float, list[float]]:
            score = metric.single_turn_ascore  # type: ignore[attr-defined]
            started = time.process_time()
            scores = [await score(s) for s in samples]
            return time.process_time() - started, scores

        best = math.inf
        scores: list[float] = []
        for _ in range(repeat):
            seconds, scores = asyncio.run(run())
            best = min(best, seconds)
        out[name] = {
            "seconds": best,
            "scores": [None if math.isnan(float(s)) else float(s) for s in scores],
        }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
