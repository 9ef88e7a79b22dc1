"""Offline evaluation of the four non-LLM metrics: ragtrace's ``evaluate()`` against Ragas.

The same generated samples (default 10,000: 5 retrieved contexts and 2 reference
contexts of about 200 characters, 5 retrieved ids and 3 reference ids out of 20) go
through

* Ragas ``NonLLMContextRecall``, ``IDBasedContextRecall``,
  ``NonLLMContextPrecisionWithReference`` and ``IDBasedContextPrecision``
  (``await metric.single_turn_ascore(sample)`` per sample, in a separate venv built
  from the hash-pinned ``tools/ragas.lock.txt`` by ``scripts/_env.sh``'s
  ``ensure_ragas``, so that Ragas never enters the project's lock), and
* ``ragtrace_collector.offline.runner.evaluate()`` with the matching metric, one batch per
  metric (``asyncio.run(evaluate(cases, [name], None))`` and then
  ``report.scores(name)``, both timed),

back to back in one invocation, best of ``--repeat`` runs each.  Time is the CPU time of
the process (``time.process_time``), so that other load on the machine distorts the
figures less; on a quiet machine it is the wall time.  It prints µs per case
for both, the ratio, and the largest absolute difference between the two scores of a
sample (Ragas adds 1e-10 to the denominator of its average precision, so about 1e-10
there is agreement).  Samples are built before the clocks start on both sides.

A judge-free ``evaluate()`` batch builds the per-item result objects
(``report.items``: an ``ItemResult`` with a full ``MetricResult``, reason and details
per case) only when they are first read; the column "+items us" is what reading
them costs on top, per case, and "ratio+items" the ratio with it included.

Run: ``.venv/bin/python benchmarks/nonllm_vs_ragas.py [--cases N] [--repeat R]``
(``--ragas-python PATH`` to use an existing Ragas interpreter instead of building one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ragtrace_collector.cases import RAGCase
from ragtrace_collector.offline.loaders import parse_text
from ragtrace_collector.offline.runner import evaluate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nonllm_recall import contexts  # the same ~200-character texts

ROOT = Path(__file__).resolve().parent.parent

#: Ragas metric -> the ragtrace metric that computes the same score.
PAIRS = {
    "NonLLMContextRecall": "non_llm_context_recall",
    "IDBasedContextRecall": "id_context_recall",
    "NonLLMContextPrecisionWithReference": "non_llm_context_precision",
    "IDBasedContextPrecision": "id_context_precision",
}

# No network at run time: Ragas's usage tracking off, litellm's price map local, the
# Hugging Face hubs offline.
_OFFLINE_ENV = {
    "RAGAS_DO_NOT_TRACK": "true",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def samples(n: int, seed: int = 11) -> list[dict[str, Any]]:
    """Ragas-style rows: some references near a retrieved context, some not."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        retrieved, reference = contexts(rng)
        rows.append(
            {
                "retrieved_contexts": retrieved,
                "reference_contexts": reference,
                "retrieved_context_ids": rng.sample([f"d{i}" for i in range(20)], 5),
                "reference_context_ids": rng.sample([f"d{i}" for i in range(20)], 3),
            }
        )
    return rows


def ragas_python(given: str | None) -> str:
    """The Ragas interpreter: ``--ragas-python``, else the pinned venv (built if needed)."""
    if given:
        return given
    script = f'source "{ROOT}/scripts/_env.sh" && ensure_ragas && echo "$RAGTRACE_RAGAS_PYTHON"'
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, check=False, timeout=1800
    )
    if done.returncode != 0:
        sys.exit(f"building the Ragas venv failed:\n{done.stderr}")
    return done.stdout.strip().splitlines()[-1]


def run_ragas(python: str, data: Path, repeat: int, names: list[str]) -> dict[str, Any]:
    script = str(ROOT / "benchmarks" / "_ragas_side.py")
    done = subprocess.run(
        [python, script, str(data), str(repeat), ",".join(names)],
        capture_output=True,
        text=True,
        check=False,
        timeout=3600,
        env={**os.environ, **_OFFLINE_ENV},
    )
    if done.returncode != 0:
        sys.exit(f"the Ragas side failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def run_ragtrace(
    cases: list[RAGCase], name: str, repeat: int
) -> tuple[float, float, list[float | None]]:
    """(best seconds of evaluate() + scores, best seconds of then building the items,
    the scores)."""
    best = best_items = math.inf
    scores: list[float | None] = []
    for _ in range(repeat):
        started = time.process_time()
        report = asyncio.run(evaluate(cases, [name], None))
        scores = report.scores(name)
        scored = time.process_time()
        items = report.items
        built = time.process_time()
        best = min(best, scored - started)
        best_items = min(best_items, built - scored)
        assert [item.results[0].score for item in items] == scores
    return best, best_items, scores


def max_difference(ours: list[float | None], theirs: list[float | None]) -> tuple[float, int]:
    """(largest |ours - theirs| where both scored, samples scored by only one side)."""
    worst = 0.0
    one_sided = 0
    for a, b in zip(ours, theirs, strict=True):
        if a is None or b is None:
            one_sided += (a is None) != (b is None)
            continue
        worst = max(worst, abs(a - b))
    return worst, one_sided


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3, help="best of R runs, each side")
    parser.add_argument("--ragas-python", default=None, help="an interpreter with Ragas")
    parser.add_argument(
        "--only", default=None, help="comma-separated ragtrace metric names (default: all four)"
    )
    args = parser.parse_args()
    pairs = {r: n for r, n in PAIRS.items() if args.only is None or n in args.only.split(",")}
    if not pairs:
        parser.error(f"--only: expected some of {', '.join(PAIRS.values())}")

    rows = samples(args.cases)
    python = ragas_python(args.ragas_python)
    with tempfile.TemporaryDirectory(prefix="ragtrace-bench-") as tmp:
        data = Path(tmp) / "samples.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        loaded = parse_text(data.read_text(encoding="utf-8"))
        assert not loaded.errors, loaded.errors[:3]
        cases = loaded.cases
        ragas = run_ragas(python, data, args.repeat, list(pairs))
        ours = {name: run_ragtrace(cases, name, args.repeat) for name in pairs.values()}

    n = args.cases
    print(f"{n} samples: 5 retrieved x 2 reference contexts of ~200 chars, 5 x 3 ids of 20")
    print(
        f"best of {args.repeat}; Ragas: single_turn_ascore per sample; "
        "ragtrace: evaluate() + report.scores(); CPU time per case"
    )
    header = (
        f"{'metric':28s} {'Ragas us':>10s} {'ragtrace us':>12s} {'ratio':>8s} "
        f"{'+items us':>10s} {'ratio+items':>12s} {'max |diff|':>11s}"
    )
    print(header)
    print("-" * len(header))
    for ragas_name, name in pairs.items():
        theirs = ragas[ragas_name]
        seconds, items_seconds, scores = ours[name]
        worst, one_sided = max_difference(scores, theirs["scores"])
        ragas_us = theirs["seconds"] / n * 1e6
        ours_us = seconds / n * 1e6
        items_us = items_seconds / n * 1e6
        note = f"  ({one_sided} scored by one side only)" if one_sided else ""
        print(
            f"{name:28s} {ragas_us:10.2f} {ours_us:12.2f} {ragas_us / ours_us:7.1f}x "
            f"{items_us:10.2f} {ragas_us / (ours_us + items_us):11.1f}x {worst:11.2e}{note}"
        )


if __name__ == "__main__":
    main()
