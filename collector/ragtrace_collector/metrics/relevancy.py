"""``contextual_relevancy``: the share of the retrieved statements that are relevant
to the input (reference-free, one judge call for all nodes).

The judge splits each node into statements and answers yes or no for each.
``score = yes / (yes + no)``; other verdict words are dropped; no statements ->
skipped.
"""

from __future__ import annotations

from typing import Any

from ragtrace_collector.cases import RAGCase
from ragtrace_collector.judges.base import JudgeError, RelevanceRequest, RelevanceResponse
from ragtrace_collector.metrics.base import (
    MetricBase,
    Outcome,
    Run,
    no_input,
    normalise_verdict,
    order_by_node,
    plural,
    share_outcome,
)

__all__ = ["ContextualRelevancy", "relevance_outcome"]


def relevance_outcome(response: RelevanceResponse, node_count: int) -> Outcome:
    """Relevant statements over all statements.  Shared with ``turn_contextual_relevancy``."""
    if len(response.nodes) != node_count:
        raise JudgeError(
            "invalid_response", f"expected {node_count} nodes, got {len(response.nodes)}"
        )
    order = order_by_node([n.node for n in response.nodes], node_count)
    per_node: list[dict[str, Any]] = []
    yes = no = dropped = 0
    for rank, i in enumerate(order, start=1):
        node = response.nodes[i]
        words = [normalise_verdict(s.verdict) for s in node.statements]
        n_yes = words.count("yes")
        n_no = words.count("no")
        yes += n_yes
        no += n_no
        dropped += len(words) - n_yes - n_no
        per_node.append(
            {
                "node": rank,
                "relevant": n_yes,
                "statements": n_yes + n_no,
                "irrelevant_statements": [
                    s.statement for s, w in zip(node.statements, words, strict=True) if w == "no"
                ],
            }
        )
    return share_outcome(
        yes,
        yes + no,
        details={"nodes": per_node, "relevant": yes, "statements": yes + no},
        dropped=dropped,
        skip_reason="the retrieved nodes yielded no statements to judge",
        reason=f"{yes} of {plural(yes + no, 'retrieved statement')} relevant to the input",
        judge_reason=response.reason,
    )


class ContextualRelevancy(MetricBase):
    name = "contextual_relevancy"

    def missing_inputs(self, case: RAGCase) -> str | None:
        missing = no_input(case)
        if missing is not None:
            return missing
        if case.retrieval_context is None:
            return "no retrieval_context captured"
        if not case.retrieval_context:
            return "nothing was retrieved: no statements to judge"
        return None

    async def _score(self, case: RAGCase, run: Run) -> Outcome:
        assert case.input is not None
        contexts = tuple(case.context_texts())
        response = await run.ask(
            RelevanceRequest(
                input=case.input, contexts=contexts, prompt_template=self.options.prompt_template
            )
        )
        return relevance_outcome(response, len(contexts))
