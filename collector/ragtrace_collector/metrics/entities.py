"""``context_entity_recall``: the share of the reference's entities found in the
retrieval context.

``score = |GE ∩ CE| / |GE|`` over *normalised* entity sets (casefold, surrounding
whitespace and punctuation trimmed, inner spaces collapsed).  Ragas matches exact
strings; the normalisation is a deliberate improvement.

Judge economy: every text whose entities are not known yet goes into **one**
extraction call; each text's entities are cached by content hash in a bounded LRU
shared across cases (production retrieves the same documents again and again).  When
several cases in flight need the same chunk, one extracts it and the others wait for
that answer instead of asking again.
"""

from __future__ import annotations

import asyncio
import hashlib
import unicodedata
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ragtrace_collector.cases import RAGCase
from ragtrace_collector.judges.base import EntityExtractionRequest, JudgeError
from ragtrace_collector.metrics.base import MetricBase, MetricOptions, Outcome, Run, blank

__all__ = ["ContextEntityRecall", "EntityCache", "normalise_entity"]


def _is_trimmable(ch: str) -> bool:
    return ch.isspace() or unicodedata.category(ch).startswith("P")


def normalise_entity(entity: str) -> str:
    """``"  Taj   Mahal, "`` -> ``"taj mahal"``; ``"PARIS"`` -> ``"paris"``."""
    text = " ".join(entity.casefold().split())
    start, end = 0, len(text)
    while start < end and _is_trimmable(text[start]):
        start += 1
    while end > start and _is_trimmable(text[end - 1]):
        end -= 1
    return text[start:end]


def entity_set(entities: Iterable[str]) -> set[str]:
    return {n for n in (normalise_entity(e) for e in entities) if n}


@dataclass
class _Stats:
    hits: int = 0
    misses: int = 0
    shared: int = 0


class EntityCache:
    """Entities per text, keyed by (judge model, prompt template, content hash).

    A bounded LRU of finished extractions plus the extractions in flight, so that
    concurrent cases needing the same chunk make one call between them.
    """

    def __init__(self, maxsize: int = 8192) -> None:
        if maxsize < 0:
            raise ValueError("maxsize must be >= 0")
        self.maxsize = maxsize
        self._done: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        self._inflight: dict[str, asyncio.Future[tuple[str, ...]]] = {}
        self.stats = _Stats()

    def __len__(self) -> int:
        return len(self._done)

    def clear(self) -> None:
        self._done.clear()

    @staticmethod
    def key(model: str, template: str | None, text: str) -> str:
        h = hashlib.blake2b(digest_size=20)
        for part in (model, template or "", text):
            h.update(part.encode("utf-8", "surrogatepass"))
            h.update(b"\x00")
        return h.hexdigest()

    def _remember(self, key: str, entities: tuple[str, ...]) -> None:
        if self.maxsize == 0:
            return
        self._done[key] = entities
        self._done.move_to_end(key)
        while len(self._done) > self.maxsize:
            self._done.popitem(last=False)

    async def extract(
        self, texts: Sequence[str], run: Run, template: str | None
    ) -> tuple[dict[str, tuple[str, ...]], int]:
        """Entities of each text (by text), and how many texts came from the cache.

        At most one judge call: all the texts that are neither cached nor being
        extracted by another case right now, batched.
        """
        loop = asyncio.get_running_loop()
        model = run.judge.model if run.judge is not None else "none"
        found: dict[str, tuple[str, ...]] = {}
        waiting: dict[str, asyncio.Future[tuple[str, ...]]] = {}
        mine: list[tuple[str, str, asyncio.Future[tuple[str, ...]]]] = []
        for text in dict.fromkeys(texts):
            key = self.key(model, template, text)
            cached = self._done.get(key)
            if cached is not None:
                self._done.move_to_end(key)
                found[text] = cached
                self.stats.hits += 1
                continue
            pending = self._inflight.get(key)
            if pending is not None and pending.get_loop() is loop and not pending.done():
                waiting[text] = pending
                self.stats.shared += 1
                continue
            future: asyncio.Future[tuple[str, ...]] = loop.create_future()
            self._inflight[key] = future
            mine.append((text, key, future))
            self.stats.misses += 1
        from_cache = len(found) + len(waiting)

        if mine:
            try:
                response = await run.ask(
                    EntityExtractionRequest(
                        texts=tuple(t for t, _, _ in mine), prompt_template=template
                    )
                )
                if len(response.entities) != len(mine):
                    raise JudgeError(
                        "invalid_response",
                        f"expected {len(mine)} entity lists, got {len(response.entities)}",
                    )
            except BaseException as exc:
                # Whoever waits on these texts learns of the failure (without our cost).
                shared = (
                    JudgeError(exc.kind, str(exc))
                    if isinstance(exc, JudgeError)
                    else JudgeError("api_error", "a shared entity extraction was abandoned")
                )
                for _, key, future in mine:
                    if not future.done():
                        future.set_exception(shared)
                        future.exception()  # retrieved: no "never retrieved" warning
                    if self._inflight.get(key) is future:
                        del self._inflight[key]
                raise
            for (text, key, future), entities in zip(mine, response.entities, strict=True):
                value = tuple(entities)
                found[text] = value
                self._remember(key, value)
                if not future.done():
                    future.set_result(value)
                if self._inflight.get(key) is future:
                    del self._inflight[key]

        for text, pending in waiting.items():
            found[text] = await asyncio.shield(pending)
        return found, from_cache


#: The process-wide cache the built-in metric instances share.
DEFAULT_ENTITY_CACHE = EntityCache()


class ContextEntityRecall(MetricBase):
    name = "context_entity_recall"

    def __init__(self, options: MetricOptions | None = None, cache: EntityCache | None = None):
        super().__init__(options)
        self.cache = cache if cache is not None else DEFAULT_ENTITY_CACHE

    def missing_inputs(self, case: RAGCase) -> str | None:
        if blank(case.expected_output):
            return "no expected_output to take reference entities from"
        if case.retrieval_context is None:
            return "no retrieval_context captured"
        return None

    async def _score(self, case: RAGCase, run: Run) -> Outcome:
        assert case.expected_output is not None
        reference = case.expected_output
        contexts = case.context_texts()
        entities, cached = await self.cache.extract(
            [reference, *contexts], run, self.options.prompt_template
        )
        ge = entity_set(entities[reference])
        ce: set[str] = set()
        for text in contexts:
            ce |= entity_set(entities[text])
        details = {
            "reference_entities": sorted(ge),
            "context_entities": sorted(ce),
            "texts_from_cache": cached,
        }
        if not ge:
            return Outcome.skip("the expected output has no entities", **details)
        matched = ge & ce
        details["matched"] = sorted(matched)
        details["missing"] = sorted(ge - ce)
        reason = f"{len(matched)} of {len(ge)} reference entities found in the retrieval context"
        if ge - ce:
            shown = ", ".join(sorted(ge - ce)[:5])
            reason += f"; missing: {shown}" + (" ..." if len(ge - ce) > 5 else "")
        return Outcome(len(matched) / len(ge), reason, details)
