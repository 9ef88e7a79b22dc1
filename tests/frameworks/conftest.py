"""Fixtures of the supported-matrix tests: a clean SDK, an OTLP sink, a loopback
OpenAI-compatible server, and no framework reaching for the network."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e._support import JudgeServer
from tests.fakes.openai_server import RecordedRequest, Reply
from tests.fakes.otlp_sink import OtlpSink
from tests.fakes.sdk_state import clean_sdk  # noqa: F401  (autouse)

# Haystack decides at import whether to send usage telemetry: never from a test.
os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"

#: What the loopback LLM answers, per question in the prompt (else the first).
ANSWERS = {
    "capital of France": "Paris is the capital of France.",
    "Eiffel Tower": "It was completed in 1889.",
    "museum": "The Louvre is the most visited museum.",
}


def answer_for(text: str) -> str:
    for key, answer in ANSWERS.items():
        if key in text:
            return answer
    return next(iter(ANSWERS.values()))


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink() as s:
        yield s


@pytest.fixture
def llm_server() -> Iterator[JudgeServer]:
    """An OpenAI-compatible chat server on loopback answering :data:`ANSWERS`."""

    def reply(request: RecordedRequest) -> Reply:
        return Reply.text(answer_for(request.last_user_text))

    server = JudgeServer(reply).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def nltk_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The NLTK data LlamaIndex ships (its SentenceSplitter's), copied once per worker:
    nltk refuses the hard-linked files of the installed copy."""
    import shutil

    import llama_index.core

    shipped = Path(llama_index.core.__file__).parent / "_static" / "nltk_cache"
    target = tmp_path_factory.mktemp("nltk") / "nltk_data"
    shutil.copytree(shipped, target)
    return target


@pytest.fixture
def offline_caches(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, nltk_data: Path) -> Path:
    """Framework caches in the test's tmp dir (LlamaIndex, tiktoken, DSPy) and the NLTK
    data: nothing is downloaded, nothing written outside the test's directories."""
    cache = tmp_path / "caches"
    monkeypatch.setenv("LLAMA_INDEX_CACHE_DIR", str(cache / "llama_index"))
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache / "tiktoken"))
    monkeypatch.setenv("NLTK_DATA", str(nltk_data))
    monkeypatch.setenv("DSPY_CACHEDIR", str(cache / "dspy"))
    return cache


@pytest.fixture(autouse=True)
def _no_leaked_context() -> Iterator[None]:
    """An instrumentor that leaves its span current after a run would parent the next
    test's spans to it (one trace across tests): fail the test that leaks."""
    from opentelemetry import trace

    yield
    leaked = trace.get_current_span()
    assert not leaked.get_span_context().is_valid, f"a span is left current: {leaked}"
