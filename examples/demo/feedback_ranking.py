"""Which metric predicts an unhappy user, on the support bot: the collector's feedback
stage fed in-process, without the network.

The bot answers the golden questions, a share of them with a retrieval fault (the
demo's faults, drawn at random per request).  Every answer is scored by the offline
metrics (``ragtrace_collector.offline.evaluate_rows``), and the simulated users of
:mod:`examples.demo.feedback` give their thumbs.  Both go to a
:class:`~ragtrace_collector.feedback.stage.FeedbackStage` as they would in the
collector: the scores as the evaluator's result listener hands them, each feedback
before its scores or, for the late ones, after them.  The stage's report ranks the
metrics by AUROC: the retrieval metrics should lead, a metric unrelated to retrieval
should sit near 0.5.

    .venv/bin/python -m examples.demo.feedback_ranking              # ~10 s
    .venv/bin/python -m examples.demo.feedback_ranking --requests 600 --seed 3
"""

from __future__ import annotations

import argparse
import asyncio
import random
from typing import Any

from examples.demo.collector import DEMO_METRICS
from examples.demo.feedback import UserModel, found_answer
from examples.support_bot import FaultMode, SupportBot, load_golden
from ragtrace_collector.feedback.config import FeedbackConfig
from ragtrace_collector.feedback.record import Feedback
from ragtrace_collector.feedback.stage import FeedbackStage
from ragtrace_collector.offline import evaluate_rows

SERVICE = "support-bot"
FAULTS = (FaultMode.WRONG_INDEX, FaultMode.DROP_TOP, FaultMode.SHUFFLE)
#: The live demo's metrics, single-turn.
METRICS = [m for m in DEMO_METRICS if not m.startswith("turn_")]


def _requests(count: int, fault_share: float, rng: random.Random) -> list[dict[str, Any]]:
    """The bot's answers as evaluation rows, each with whether it found its article."""
    bot = SupportBot()
    golden = load_golden()
    rows = []
    for i in range(count):
        item = golden[i % len(golden)]
        bot.fault = rng.choice(FAULTS) if rng.random() < fault_share else FaultMode.NONE
        answer = bot.answer(item.input)
        rows.append(
            {
                "input": item.input,
                "actual_output": answer.text,
                "expected_output": item.expected_output,
                "retrieval_context": [hit["content"] for hit in answer.contexts],
                "retrieved_context_ids": answer.context_ids,
                "reference_context_ids": list(item.reference_context_ids),
                "reference_contexts": list(item.reference_contexts),
                "found": found_answer(answer.context_ids, item.reference_context_ids),
            }
        )
    return rows


async def _rank(
    rows: list[dict[str, Any]], results: list[Any], rng: random.Random
) -> dict[str, Any]:
    stage = FeedbackStage(FeedbackConfig(), refresh_interval=3600)
    await stage.start()
    users = UserModel()
    try:
        for i, (row, item) in enumerate(zip(rows, results, strict=True)):
            trace_id = f"{i + 1:032x}"
            choice = users.decide(rng, row["found"])
            feedback = None
            if choice is not None:
                up, late = choice
                feedback = Feedback(
                    trace_id, None, "user_feedback", 1.0 if up else 0.0, "boolean",
                    user_id=f"user-{rng.randrange(500)}", service=SERVICE,
                )  # fmt: skip
                if not late:  # given before the request was evaluated: it waits
                    await stage.record(feedback)
            for result in item.results:
                stage.scored(SERVICE, result.metric, result, trace_id, ())
            await stage.drain()
            if choice is not None and choice[1] and feedback is not None:
                await stage.record(feedback)
        await stage.refresh()
        return stage.report()
    finally:
        await stage.shutdown(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--fault-share", type=float, default=0.35)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rows = _requests(args.requests, args.fault_share, rng)
    report = evaluate_rows(
        [{k: v for k, v in row.items() if k != "found"} for row in rows],
        metrics=METRICS,
    )
    ranked = asyncio.run(_rank(rows, list(report.items), rng))
    missed = sum(not row["found"] for row in rows)
    print(
        f"{len(rows)} requests, {missed} without the right article; feedback "
        f"{ranked['counts']['recorded']}, pairs {ranked['counts']['pairs']}"
    )
    print(f"{'metric':<28}{'AUROC':>7}  {'interval':<15}{'kappa':>7}{'pairs':>7}{'neg':>6}")
    for series in ranked["series"]:
        auroc = series["auroc"]
        interval = series["interval"]
        shown = f"[{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "-"
        kappa = series["kappa"]
        print(
            f"{series['metric']:<28}{auroc if auroc is None else f'{auroc:.3f}':>7}  "
            f"{shown:<15}{'-' if kappa is None else f'{kappa:.2f}':>7}"
            f"{series['pairs']:>7}{series['negatives']:>6}"
        )


if __name__ == "__main__":
    main()
