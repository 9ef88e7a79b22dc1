"""context_entity_recall with the offline judge never contradicts its own reason: an
entity of the expected output that the retrieved text contains is never reported
missing, whatever the capitalisation around it (issue 29, item 4)."""

from __future__ import annotations

import asyncio
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragtrace_collector.judges.offline import OfflineJudge
from ragtrace_collector.metrics import EntityCache
from ragtrace_collector.metrics.entities import ContextEntityRecall, normalise_entity
from tests.fakes.judge import case

#: A small vocabulary, so that the reference and the contexts share words often; each
#: word may be written lower case, capitalised or in capitals.
_WORDS = ("card", "refunds", "reset", "password", "paris", "issued", "within", "days", "france")
_word = st.builds(
    lambda w, style: {"low": w, "cap": w.capitalize(), "up": w.upper()}[style],
    st.sampled_from(_WORDS),
    st.sampled_from(("low", "cap", "cap", "up")),
)
_number = st.integers(min_value=1, max_value=40).map(str)
_sentence = st.lists(st.one_of(_word, _word, _word, _number), min_size=1, max_size=6).map(
    lambda ws: " ".join(ws) + "."
)
_text = st.lists(_sentence, min_size=1, max_size=3).map(" ".join)


def _present(entity: str, text: str) -> bool:
    """``entity`` (normalised) as whole words of ``text`` (casefolded, spaces collapsed)."""
    haystack = " ".join(text.casefold().split())
    return re.search(rf"(?<!\w){re.escape(entity)}(?!\w)", haystack) is not None


def _measure(reference: str, contexts: list[str]) -> dict[str, list[str]]:
    metric = ContextEntityRecall(cache=EntityCache(0))
    result = asyncio.run(
        metric.measure(case(expected_output=reference, contexts=contexts), OfflineJudge())
    )
    return result.details


def test_the_reported_example() -> None:
    """The issue's case: "missing: card" beside "Card refunds are issued ..."."""
    details = _measure(
        "Card refunds are issued within 5 days.",
        ["Card refunds are issued within 5 days of the request. Use the same card."],
    )
    assert details["missing"] == []
    assert details["matched"] == ["5", "card"]


def test_a_sentence_start_word_found_lower_case() -> None:
    details = _measure("Reset the password first.", ["You can reset it from the login page."])
    assert "reset" not in details["missing"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reference=_text, contexts=st.lists(_text, min_size=1, max_size=3))
def test_an_entity_present_in_the_retrieved_text_is_never_missing(
    reference: str, contexts: list[str]
) -> None:
    details = _measure(reference, contexts)
    for entity in details.get("missing", []):
        assert entity == normalise_entity(entity)
        assert not any(_present(entity, c) for c in contexts), (entity, reference, contexts)
