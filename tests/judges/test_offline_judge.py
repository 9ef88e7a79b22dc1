"""The offline judge: deterministic, no network, and verdicts that track relevance."""

from __future__ import annotations

import statistics

import pytest

from ragtrace_collector.judges.base import (
    AnswerRelevanceRequest,
    AttributionRequest,
    EntityExtractionRequest,
    FaithfulnessRequest,
    Judge,
    JudgeCallRecord,
    JudgeError,
    RelevanceRequest,
    RubricRequest,
    UsefulnessRequest,
)
from ragtrace_collector.judges.factory import make_judge
from ragtrace_collector.judges.offline import (
    OfflineJudge,
    content_words,
    extract_entities,
    split_sentences,
)
from ragtrace_collector.metrics import OFFLINE_METRICS, EntityCache, build_metric
from ragtrace_collector.metrics.entities import ContextEntityRecall
from tests.fakes.judge import case

DOCS = {
    "taj": "The Taj Mahal is an ivory-white marble mausoleum on the bank of the river Yamuna "
    "in Agra, India. It was commissioned in 1631 by the Mughal emperor Shah Jahan to house "
    "the tomb of his wife Mumtaz Mahal.",
    "eiffel": "The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It was "
    "designed by the engineer Gustave Eiffel and completed in 1889 for the World's Fair.",
    "python": "Python is a high-level programming language created by Guido van Rossum. "
    "Its first release was in 1991. Python emphasises code readability with significant "
    "indentation.",
    "everest": "Mount Everest is the highest mountain above sea level, located in the "
    "Himalayas on the border of Nepal and China. Its height is 8849 metres.",
    "amazon": "The Amazon rainforest covers much of the Amazon basin in South America. "
    "Most of the forest lies in Brazil, followed by Peru and Colombia.",
}
QUESTIONS = {
    "taj": (
        "Who commissioned the Taj Mahal and when?",
        "The Taj Mahal was commissioned by Shah Jahan in 1631. It houses the tomb of Mumtaz Mahal.",
    ),
    "eiffel": (
        "Who designed the Eiffel Tower?",
        "The Eiffel Tower was designed by Gustave Eiffel. It was completed in 1889.",
    ),
    "python": (
        "Who created the Python programming language?",
        "Python was created by Guido van Rossum. Its first release was in 1991.",
    ),
    "everest": (
        "How high is Mount Everest?",
        "Mount Everest is 8849 metres high. It lies on the border of Nepal and China.",
    ),
    "amazon": (
        "Where is the Amazon rainforest?",
        "The Amazon rainforest is in South America, mostly in Brazil.",
    ),
}


def test_is_a_judge() -> None:
    judge = OfflineJudge()
    assert isinstance(judge, Judge)
    assert judge.model == "offline"
    assert judge.heuristic is True
    assert isinstance(make_judge(), OfflineJudge)


def test_sentences_and_words() -> None:
    assert split_sentences("Dr. Smith met U.S. officials. Then he left!\n\n- a list item") == [
        "Dr. Smith met U.S. officials.",
        "Then he left!",
        "a list item",
    ]
    assert content_words("The capitals are located here") == content_words("capital located")
    assert "the" not in content_words("The Taj Mahal")


def test_entities() -> None:
    ents = extract_entities(DOCS["taj"])
    for e in ["Taj Mahal", "Yamuna", "Agra", "India", "1631", "Shah Jahan", "Mumtaz Mahal"]:
        assert e in ents
    assert "The" not in ents
    assert "It" not in ents
    assert "Guido van Rossum" in extract_entities(DOCS["python"])
    assert "8849" in extract_entities(DOCS["everest"])


async def test_attribution_tracks_content() -> None:
    judge = OfflineJudge()
    answer = await judge.ask(
        AttributionRequest(
            reference="Python was created by Guido van Rossum. Mount Everest is in Nepal.",
            contexts=(DOCS["taj"], DOCS["python"]),
        )
    )
    verdicts = answer.value.verdicts
    assert [v.verdict for v in verdicts] == ["yes", "no"]
    assert verdicts[0].node == 2
    assert answer.cost.calls == 1
    assert answer.cost.usd == 0.0


async def test_usefulness_and_relevance_verdicts() -> None:
    judge = OfflineJudge()
    useful = await judge.ask(
        UsefulnessRequest(
            input=QUESTIONS["eiffel"][0],
            reference=QUESTIONS["eiffel"][1],
            contexts=(DOCS["amazon"], DOCS["eiffel"]),
        )
    )
    assert [v.verdict for v in useful.value.verdicts] == ["no", "yes"]
    relevance = await judge.ask(
        RelevanceRequest(input="Who designed the Eiffel Tower?", contexts=(DOCS["eiffel"],))
    )
    statements = relevance.value.nodes[0].statements
    assert [s.verdict for s in statements] == ["yes", "yes"]
    off_topic = await judge.ask(
        RelevanceRequest(input="Who designed the Eiffel Tower?", contexts=(DOCS["amazon"],))
    )
    assert {s.verdict for s in off_topic.value.nodes[0].statements} == {"no"}


async def test_faithfulness_and_answer_relevance() -> None:
    judge = OfflineJudge()
    faith = await judge.ask(
        FaithfulnessRequest(
            output="The Eiffel Tower was completed in 1889. The Eiffel Tower was completed "
            "in 1925. Bananas are yellow.",
            contexts=(DOCS["eiffel"],),
        )
    )
    assert [c.verdict for c in faith.value.claims] == ["yes", "no", "idk"]
    rel = await judge.ask(
        AnswerRelevanceRequest(
            input="Who designed the Eiffel Tower?",
            output="Gustave Eiffel designed the tower. The weather in Lima is mild in winter.",
        )
    )
    assert [s.verdict for s in rel.value.statements] == ["yes", "no"]


async def test_rubric_and_entities_tasks() -> None:
    judge = OfflineJudge()
    recall = await judge.ask(
        RubricRequest(
            kind="recall",
            input="q",
            contexts=(DOCS["python"],),
            expected_output=QUESTIONS["python"][1],
        )
    )
    assert recall.value.score == 1.0
    precision = await judge.ask(
        RubricRequest(
            kind="precision",
            input="q",
            contexts=(DOCS["amazon"], DOCS["python"]),
            expected_output=QUESTIONS["python"][1],
        )
    )
    assert precision.value.score == 0.5
    ents = await judge.ask(
        EntityExtractionRequest(texts=("Trains run from Paris to Rome.", "1999", "Paris and Rome."))
    )
    # A lone capitalised word opening a sentence is not read as a name (see
    # tests/metrics/test_entities_present.py for why).
    assert ents.value.entities == [["Paris", "Rome"], ["1999"], ["Rome"]]


async def test_unknown_task_is_a_config_error() -> None:
    from typing import ClassVar

    from pydantic import BaseModel

    from ragtrace_collector.judges.base import JudgeTask

    class Other(JudgeTask[BaseModel]):
        task_name: ClassVar[str] = "other"
        response_model: ClassVar[type[BaseModel]] = BaseModel

    with pytest.raises(JudgeError) as info:
        await OfflineJudge().ask(Other())
    assert info.value.kind == "config"


async def test_on_call_hook() -> None:
    records: list[JudgeCallRecord] = []
    judge = OfflineJudge(on_call=records.append)
    await judge.ask(EntityExtractionRequest(texts=("Paris",)))
    assert [(r.model, r.task, r.outcome) for r in records] == [("offline", "entities", "ok")]


async def test_deterministic() -> None:
    task = RelevanceRequest(input=QUESTIONS["taj"][0], contexts=tuple(DOCS.values()))
    first = await OfflineJudge().ask(task)
    second = await OfflineJudge().ask(task)
    assert first.value == second.value
    metric = build_metric("contextual_recall")
    c = case(expected_output=QUESTIONS["taj"][1], contexts=list(DOCS.values()))
    assert (await metric.measure(c, OfflineJudge())) == (await metric.measure(c, OfflineJudge()))


def _cases(degraded: bool) -> list:
    keys = list(DOCS)
    out = []
    for i, key in enumerate(keys):
        question, answer = QUESTIONS[key]
        if degraded:
            # The retriever got worse: the right document is gone, wrong ones come back.
            docs = [DOCS[keys[(i + 1) % len(keys)]], DOCS[keys[(i + 2) % len(keys)]]]
        else:
            docs = [DOCS[key], DOCS[keys[(i + 1) % len(keys)]]]
        out.append(
            case(input=question, expected_output=answer, actual_output=answer, contexts=docs)
        )
    return out


@pytest.mark.parametrize(
    ("name", "min_good"),
    [
        ("contextual_recall", 0.9),
        ("contextual_precision", 0.9),
        # half of the "good" retrieval is an unrelated second document
        ("contextual_relevancy", 0.4),
        ("context_entity_recall", 0.9),
        ("context_recall_rubric", 0.9),
        ("context_precision_rubric", 0.9),
    ],
)
async def test_scores_drop_when_retrieval_degrades(name: str, min_good: float) -> None:
    judge = OfflineJudge()
    metric = build_metric(name)
    if name == "context_entity_recall":
        metric = ContextEntityRecall(cache=EntityCache(64))

    async def mean_score(degraded: bool) -> float:
        results = [await metric.measure(c, judge) for c in _cases(degraded)]
        assert all(r.heuristic and r.reason.startswith("[heuristic] ") for r in results)
        assert all(r.judge == "offline" for r in results)
        scores = [r.score for r in results if r.score is not None]
        assert len(scores) == len(results)
        return statistics.mean(scores)

    good, bad = await mean_score(False), await mean_score(True)
    assert good >= min_good
    assert bad <= 0.1


def test_offline_metrics_are_known() -> None:
    from ragtrace_collector.metrics import METRIC_NAMES

    assert set(OFFLINE_METRICS) <= set(METRIC_NAMES)
