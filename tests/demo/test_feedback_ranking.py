"""The support bot's simulated users and the ranking of the metrics by AUROC: the
retrieval metrics predict a thumbs-down, answer_relevancy does not."""

from __future__ import annotations

import asyncio
import random

from examples.demo.feedback import UserModel, found_answer
from examples.demo.feedback_ranking import METRICS, _rank, _requests
from ragtrace_collector.offline import evaluate_rows


def test_users_are_unhappier_when_the_article_was_missed() -> None:
    rng = random.Random(0)
    model = UserModel()
    found = [model.decide(rng, True) for _ in range(2000)]
    missed = [model.decide(rng, False) for _ in range(2000)]

    def down(choices: list[tuple[bool, bool] | None]) -> float:
        given = [c for c in choices if c is not None]
        return sum(not up for up, _ in given) / len(given)

    assert down(found) < 0.25 < 0.6 < down(missed)
    assert found_answer(["a", "b"], ("b",))
    assert not found_answer(["a"], ("b",))


def test_retrieval_metrics_rank_above_one_unrelated_to_retrieval() -> None:
    rng = random.Random(1)
    rows = _requests(240, 0.35, rng)
    report = evaluate_rows([{k: v for k, v in r.items() if k != "found"} for r in rows], METRICS)
    ranked = asyncio.run(_rank(rows, list(report.items), rng))
    order = [s["metric"] for s in ranked["series"]]
    assert order[-1] == "answer_relevancy"
    top = ranked["series"][0]
    assert top["metric"] in {"id_context_recall", "non_llm_context_recall", "contextual_recall"}
    assert top["auroc"] > 0.65
    assert ranked["series"][-1]["auroc"] < 0.6


def test_the_demo_panel_ranks_the_series_of_get_feedback() -> None:
    from rich.console import Console

    from examples.demo.display import feedback_table

    report = {
        "counts": {"recorded": 40},
        "series": [
            {"metric": "contextual_recall", "name": "user_feedback", "auroc": 0.81,
             "interval": [0.7, 0.9], "kappa": 0.5, "pairs": 40},
            {"metric": "faithfulness", "name": "user_feedback", "auroc": 0.55,
             "interval": None, "kappa": None, "pairs": 40},
            {"metric": "faithfulness", "name": "helpfulness", "auroc": 0.9,
             "interval": None, "kappa": None, "pairs": 3},
        ],
    }  # fmt: skip
    console = Console(width=120, record=True)
    console.print(feedback_table(report, sent=50))
    text = console.export_text()
    assert text.index("contextual_recall") < text.index("faithfulness")
    assert "0.810" in text
    assert "0.900" not in text  # another feedback name is not this panel's
    assert "50 feedback sent" in text
