"""The metric suite scored by the LLM judge, end to end through litellm and HTTP.

The server's verdicts are scripted; the scores must be exactly what METRICS.md
computes from them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ragtrace_collector.cases import ContextItem, RAGCase
from ragtrace_collector.metrics import DEFAULT_ENTITY_CACHE, build_metric
from tests.fakes.openai_server import FakeOpenAIServer, RecordedRequest, Reply, fenced_blocks
from tests.judges.conftest import MakeJudge

MODEL = "openai/ragtrace-test-judge"


@pytest.fixture(autouse=True)
def _fresh_entity_cache() -> Iterator[None]:
    DEFAULT_ENTITY_CACHE.clear()
    yield
    DEFAULT_ENTITY_CACHE.clear()


def case(
    contexts: list[str],
    *,
    expected: str | None = "Reference answer.",
    question: str = "What happened?",
) -> RAGCase:
    return RAGCase(
        input=question,
        expected_output=expected,
        actual_output="An answer.",
        retrieval_context=[ContextItem(content=c, id=f"d{i}") for i, c in enumerate(contexts)],
    )


def attribution(*verdicts: str) -> dict[str, object]:
    return {
        "verdicts": [
            {"statement": f"Statement {i}.", "verdict": v, "node": 1 if v == "yes" else None}
            for i, v in enumerate(verdicts, 1)
        ],
        "reason": "scripted",
    }


def usefulness(*verdicts: str) -> dict[str, object]:
    return {
        "verdicts": [{"node": i, "verdict": v, "reason": ""} for i, v in enumerate(verdicts, 1)],
        "reason": "scripted",
    }


# --------------------------------------------------------- contextual_recall
@pytest.mark.parametrize(
    ("verdicts", "score", "strict_score"),
    [
        (("yes", "yes", "no", "no"), 0.5, 0.0),
        (("yes", "yes", "yes"), 1.0, 1.0),
        (("Yes.", "maybe", "NO"), 0.5, 0.0),
    ],
)
async def test_contextual_recall_exact_scores(
    openai_server: FakeOpenAIServer,
    make_judge: MakeJudge,
    verdicts: tuple[str, ...],
    score: float,
    strict_score: float,
) -> None:
    openai_server.handler = lambda _req: Reply.json(attribution(*verdicts))
    judge = make_judge(MODEL)

    plain = await build_metric("contextual_recall", {}).measure(case(["n1", "n2"]), judge)
    strict = await build_metric("contextual_recall", {"strict": True}).measure(
        case(["n1", "n2"]), judge
    )

    assert plain.score == pytest.approx(score)
    assert plain.error is None
    assert plain.judge == MODEL
    assert plain.heuristic is False
    assert plain.cost.calls == 1
    assert strict.score == pytest.approx(strict_score)
    # The strict metric asked the same question: served from the cache.
    assert strict.cost.calls == 0
    assert strict.cost.cached_calls == 1
    assert openai_server.request_count == 1


async def test_contextual_recall_without_usable_verdicts_is_skipped(
    openai_server: FakeOpenAIServer, make_judge: MakeJudge
) -> None:
    openai_server.enqueue(Reply.json(attribution()))
    result = await build_metric("contextual_recall").measure(case(["n1"]), make_judge())
    assert result.skipped
    assert result.score is None
    assert result.error is None


# ------------------------------------------------------ contextual_precision
@pytest.mark.parametrize(
    ("verdicts", "ap"),
    [
        (("yes", "no", "yes"), 0.8333333),
        (("no", "yes", "yes"), 0.5833333),
        (("yes", "no", "no", "yes"), 0.75),
        (("no", "no"), 0.0),
    ],
)
async def test_contextual_precision_exact_ap(
    openai_server: FakeOpenAIServer, make_judge: MakeJudge, verdicts: tuple[str, ...], ap: float
) -> None:
    openai_server.enqueue(Reply.json(usefulness(*verdicts)))
    nodes = [f"node text {i}" for i in range(len(verdicts))]

    result = await build_metric("contextual_precision").measure(case(nodes), make_judge())

    assert result.score == pytest.approx(ap, abs=1e-6)
    assert result.cost.calls == 1
    user = openai_server.requests[0].messages[1]["content"]
    assert len(fenced_blocks(user)["NODE"]) == len(nodes)


async def test_contextual_precision_wrong_count_retries_then_errors(
    openai_server: FakeOpenAIServer, make_judge: MakeJudge
) -> None:
    openai_server.enqueue(Reply.json(usefulness("yes")), Reply.json(usefulness("yes", "no", "no")))

    result = await build_metric("contextual_precision").measure(case(["a", "b"]), make_judge())

    assert result.score is None
    assert result.passed is None
    assert result.error is not None
    assert result.error.startswith("invalid_response")
    assert result.cost.calls == 2
    assert openai_server.request_count == 2


async def test_junk_twice_is_an_error_result_with_its_cost(
    openai_server: FakeOpenAIServer, make_judge: MakeJudge
) -> None:
    openai_server.enqueue(Reply.text("no idea"), Reply.text("{broken"))

    result = await build_metric("contextual_recall").measure(case(["a"]), make_judge())

    assert result.outcome == "error"
    assert result.error is not None
    assert result.error.startswith("invalid_response")
    assert result.cost.calls == 2
    assert result.cost.prompt_tokens > 0


async def test_junk_then_repairable_answer_scores(
    openai_server: FakeOpenAIServer, make_judge: MakeJudge
) -> None:
    body = "```json\n" + str(attribution("yes", "no")) + "\n```"  # Python repr: quotes, None
    openai_server.enqueue(Reply.text(body))

    result = await build_metric("contextual_recall").measure(case(["a"]), make_judge())

    assert result.score == pytest.approx(0.5)
    assert openai_server.request_count == 1


# ---------------------------------------------------- context_entity_recall
ENTITIES = {
    "The Taj Mahal, on the Yamuna in Agra, was built from 1631 by Shah Jahan for Mumtaz Mahal.": [
        "Taj Mahal",
        "Yamuna",
        "Agra",
        "1631",
        "Shah Jahan",
        "Mumtaz Mahal",
    ],
    "The Taj Mahal stands in Agra.": ["Taj Mahal", "Agra"],
    "Shah Jahan built it for Mumtaz Mahal in India.": ["Shah Jahan", "Mumtaz Mahal", "India"],
    "UNESCO listed the Taj Mahal in India.": ["Taj Mahal", "UNESCO", "India"],
}


def entity_handler(req: RecordedRequest) -> Reply:
    texts = fenced_blocks(req.prompt_text).get("TEXT", [])
    return Reply.json({"entities": [ENTITIES[t] for t in texts]})


async def test_context_entity_recall_exact_score_and_chunk_cache(
    openai_server: FakeOpenAIServer, make_judge: MakeJudge
) -> None:
    openai_server.handler = entity_handler
    judge = make_judge()
    metric = build_metric("context_entity_recall")
    reference = next(iter(ENTITIES))

    first = await metric.measure(
        case(
            ["The Taj Mahal stands in Agra.", "Shah Jahan built it for Mumtaz Mahal in India."],
            expected=reference,
        ),
        judge,
    )
    assert first.score == pytest.approx(4 / 6, abs=1e-6)
    assert first.cost.calls == 1
    assert len(fenced_blocks(openai_server.requests[0].prompt_text)["TEXT"]) == 3

    # Same reference, one chunk seen before: only the new chunk is extracted.
    second = await metric.measure(
        case(
            ["The Taj Mahal stands in Agra.", "UNESCO listed the Taj Mahal in India."],
            expected=reference,
        ),
        judge,
    )
    assert second.score == pytest.approx(2 / 6, abs=1e-6)
    assert openai_server.request_count == 2
    assert fenced_blocks(openai_server.requests[1].prompt_text)["TEXT"] == [
        "UNESCO listed the Taj Mahal in India."
    ]


# ----------------------------------------------------- contextual_relevancy
async def test_contextual_relevancy_exact_score(
    openai_server: FakeOpenAIServer, make_judge: MakeJudge
) -> None:
    openai_server.enqueue(
        Reply.json(
            {
                "nodes": [
                    {
                        "node": 1,
                        "statements": [
                            {"statement": "a", "verdict": "yes"},
                            {"statement": "b", "verdict": "no"},
                        ],
                    },
                    {"node": 2, "statements": [{"statement": "c", "verdict": "yes"}]},
                    {"node": 3, "statements": [{"statement": "d", "verdict": "no"}]},
                ],
                "reason": "half relevant",
            }
        )
    )

    result = await build_metric("contextual_relevancy").measure(
        case(["a. b.", "c.", "d."]), make_judge()
    )

    assert result.score == pytest.approx(0.5)
    assert result.cost.calls == 1


# ------------------------------------------------------------------- rubric
async def test_rubric_metric_takes_the_judges_score(
    openai_server: FakeOpenAIServer, make_judge: MakeJudge
) -> None:
    openai_server.enqueue(Reply.json({"score": "0.6", "reason": "most facts present"}))

    result = await build_metric("context_recall_rubric").measure(case(["a"]), make_judge())

    assert result.score == pytest.approx(0.6)
    assert result.passed is True
    assert "rubric_recall" in openai_server.requests[0].messages[0]["content"]


async def test_rubric_out_of_range_twice_is_an_error_not_half(
    openai_server: FakeOpenAIServer, make_judge: MakeJudge
) -> None:
    openai_server.enqueue(
        Reply.json({"score": 6, "reason": "out of ten"}),
        Reply.json({"score": -1, "reason": "oops"}),
    )

    result = await build_metric("context_precision_rubric").measure(case(["a"]), make_judge())

    assert result.score is None
    assert result.error is not None
    assert "outside [0, 1]" in result.error


async def test_metric_prompt_template_option_reaches_the_server(
    openai_server: FakeOpenAIServer, make_judge: MakeJudge
) -> None:
    openai_server.enqueue(Reply.json(attribution("yes")))
    template = "OUR HOUSE RECALL PROMPT.\n$contexts\nReference:\n$reference"

    result = await build_metric("contextual_recall", {"prompt_template": template}).measure(
        case(["a"]), make_judge()
    )

    assert result.score == 1.0
    assert openai_server.requests[0].messages[1]["content"].startswith("OUR HOUSE RECALL PROMPT.")
