"""BM25 retrieval over the knowledge base, a lexical reranker, and the fault switch.

Retrieval uses ``rank_bm25.BM25Okapi`` over the title and text of every article.  The
reranker re-scores the retriever's candidates by IDF-weighted coverage of the query
terms, blended with the retriever's own (normalised) score.  Both are deterministic.

Faults degrade retrieval on purpose, so that a drop in retrieval quality can be shown:

* ``wrong_index``: the search index and the document store are out of sync (a fixed
  derangement of the row mapping), so every hit returns some other article;
* ``drop_top``: the best hit is lost;
* ``shuffle``: the ranking is shuffled across a wider pool before the cut-off, so the
  right article often falls out of the candidates and the scores no longer match them.
"""

from __future__ import annotations

import enum
import os
import random
import zlib
from collections.abc import Iterable, Sequence
from typing import TypedDict

from rank_bm25 import BM25Okapi

from examples.support_bot.data import Article
from examples.support_bot.text import terms

__all__ = [
    "FAULT_ENV",
    "FaultMode",
    "Hit",
    "KnowledgeBase",
    "LexicalReranker",
    "fault_from_env",
    "parse_fault",
]

#: Environment variable read for the default fault mode.
FAULT_ENV = "RAGTRACE_EXAMPLE_FAULT"


class FaultMode(enum.StrEnum):
    """How retrieval is degraded (``none`` = healthy)."""

    NONE = "none"
    WRONG_INDEX = "wrong_index"
    DROP_TOP = "drop_top"
    SHUFFLE = "shuffle"


def parse_fault(value: str | FaultMode | None) -> FaultMode:
    """``None``, ``""`` and ``"none"`` mean healthy; anything unknown is a clear error."""
    if isinstance(value, FaultMode):
        return value
    if value is None or not value.strip():
        return FaultMode.NONE
    try:
        return FaultMode(value.strip().lower().replace("-", "_"))
    except ValueError:
        choices = ", ".join(mode.value for mode in FaultMode)
        raise ValueError(f"unknown fault mode {value!r}; choose one of: {choices}") from None


def fault_from_env() -> FaultMode:
    """The fault mode named by ``RAGTRACE_EXAMPLE_FAULT`` (healthy when unset)."""
    return parse_fault(os.environ.get(FAULT_ENV))


class Hit(TypedDict):
    """A retrieved article as the ragtrace SDK reads it (a plain dict)."""

    id: str
    content: str
    score: float
    metadata: dict[str, str | int]


class KnowledgeBase:
    """The articles plus a BM25 index over their titles and texts."""

    def __init__(self, articles: Sequence[Article], *, seed: int = 7) -> None:
        if not articles:
            raise ValueError("a knowledge base needs at least one article")
        self.articles: tuple[Article, ...] = tuple(articles)
        self.by_id: dict[str, Article] = {a.id: a for a in self.articles}
        self._doc_terms = [terms(f"{a.title}. {a.text}") for a in self.articles]
        self._bm25 = BM25Okapi(self._doc_terms)
        self._idf: dict[str, float] = {
            term: max(float(value), 0.0) for term, value in self._bm25.idf.items()
        }
        # A derangement (no article maps to itself): the "wrong index" fault's row mapping.
        order = list(range(len(self.articles)))
        random.Random(seed).shuffle(order)
        self._misaligned = {order[i]: order[(i + 1) % len(order)] for i in range(len(order))}

    def __len__(self) -> int:
        return len(self.articles)

    def idf(self, term: str) -> float:
        """The (non-negative) BM25 IDF of a stemmed term; 0 for unknown terms."""
        return self._idf.get(term, 0.0)

    def rank(self, query: str) -> list[tuple[int, float]]:
        """``(article index, BM25 score)`` for every article with a positive score, best first."""
        query_terms = terms(query)
        if not query_terms:
            return []
        scores = self._bm25.get_scores(query_terms)
        ranked = [(i, float(s)) for i, s in enumerate(scores) if s > 0.0]
        ranked.sort(key=lambda pair: (-pair[1], pair[0]))
        return ranked

    def search(self, query: str, k: int, fault: FaultMode = FaultMode.NONE) -> list[Hit]:
        """The top ``k`` articles for ``query`` (fewer if fewer match), degraded by ``fault``."""
        if k <= 0:
            return []
        ranked = self.rank(query)
        if fault is FaultMode.DROP_TOP:
            ranked = ranked[1:]
        elif fault is FaultMode.SHUFFLE:
            pool = ranked[: 3 * k]
            shuffled = pool[:]
            random.Random(zlib.crc32(query.encode("utf-8"))).shuffle(shuffled)
            # Scores stay in descending order; the articles behind them do not.
            ranked = [(idx, score) for (idx, _), (_, score) in zip(shuffled, pool, strict=True)]
        hits: list[Hit] = []
        for index, score in ranked[:k]:
            shown = self._misaligned[index] if fault is FaultMode.WRONG_INDEX else index
            hits.append(self._hit(shown, score))
        return hits

    def _hit(self, index: int, score: float) -> Hit:
        article = self.articles[index]
        return Hit(
            id=article.id,
            content=article.text,
            score=round(score, 4),
            metadata={"title": article.title, "category": article.category},
        )


class LexicalReranker:
    """Re-score candidates by IDF-weighted query-term coverage, blended with the retriever score.

    Coverage is measured on the article's title and text.

    ``final = coverage_weight * coverage + (1 - coverage_weight) * score / max_score``,
    ties broken by the retriever's order.  Deterministic and offline.
    """

    def __init__(self, kb: KnowledgeBase, *, coverage_weight: float = 0.6) -> None:
        if not 0.0 <= coverage_weight <= 1.0:
            raise ValueError("coverage_weight must be between 0 and 1")
        self._kb = kb
        self._weight = coverage_weight

    def rerank(self, query: str, documents: Iterable[Hit], top_k: int) -> list[Hit]:
        docs = list(documents)
        if not docs or top_k <= 0:
            return []
        query_terms = set(terms(query))
        total_idf = sum(self._kb.idf(t) for t in query_terms)
        max_score = max((d["score"] for d in docs), default=0.0)
        scored: list[tuple[float, int, Hit]] = []
        for position, doc in enumerate(docs):
            title = doc["metadata"].get("title", "")
            doc_terms = set(terms(f"{title}. {doc['content']}"))
            covered = sum(self._kb.idf(t) for t in query_terms & doc_terms)
            coverage = covered / total_idf if total_idf > 0 else 0.0
            retrieval = doc["score"] / max_score if max_score > 0 else 0.0
            final = self._weight * coverage + (1.0 - self._weight) * retrieval
            scored.append((final, position, doc))
        scored.sort(key=lambda item: (-item[0], item[1]))
        reranked: list[Hit] = []
        for final, position, doc in scored[:top_k]:
            metadata = dict(doc["metadata"])
            metadata["retriever_rank"] = position
            reranked.append(
                Hit(id=doc["id"], content=doc["content"], score=round(final, 4), metadata=metadata)
            )
        return reranked
