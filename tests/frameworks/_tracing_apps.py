"""The RAG apps of the MLflow, Langfuse and traceloop-sdk matrix cells, each run in a
process of its own (``python -m tests.frameworks._tracing_apps APP``, APP one of
:data:`_APPS`): these SDKs set up their OTLP export once per process, from the
environment, as a user's app does, so every test starts one with the collector's
address in its environment.

Protocol: one JSON request per line on stdin (``{"question", "session", "positional",
"embedded", "reworded"}``), one JSON line back per request on stdout (``{"ids",
"texts", "answer"}``: what the app retrieved and answered), sent once the request's
spans are exported; what an SDK prints goes to stderr.  The app retrieves with the
corpus's keyword rule (:func:`_matrix.rank`) and answers with the loopback
OpenAI-compatible server at ``MATRIX_LLM_URL``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

from tests.e2e._instrumented import KB
from tests.frameworks._matrix import rank

#: The question behind each embedding the embedded app is given.
QUESTION_OF: dict[tuple[float, ...], str] = {}


def _generate(question: str, texts: list[str]) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=os.environ["MATRIX_LLM_URL"], api_key="sk-loopback")
    context = "\n".join(texts)
    completion = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": f"Context:\n{context}\n\n{question}"}],
    )
    return completion.choices[0].message.content or ""


def _mlflow_flush() -> None:
    from mlflow.tracing.provider import provider

    provider.get().force_flush(10_000)  # its OTLP span processor batches


def _mlflow_app() -> tuple[Callable[[dict[str, Any]], dict[str, Any]], Callable[[], None]]:
    import mlflow
    from mlflow.entities import Document, SpanType

    @mlflow.trace(span_type=SpanType.RETRIEVER)
    def retrieve(query: str) -> list[Document]:
        return [
            Document(page_content=KB[i], metadata={"doc_uri": f"kb/{i}"}, id=i) for i in rank(query)
        ]

    @mlflow.trace(span_type=SpanType.LLM)
    def generate(question: str, docs: list[Document]) -> str:
        return _generate(question, [d.page_content for d in docs])

    @mlflow.trace  # no span type: UNKNOWN, the outermost span above the retriever
    def answer(question: str, session: str | None = None) -> str:
        if session is not None:
            span = mlflow.get_current_active_span()
            assert span is not None
            span.set_attribute("session.id", session)
        return generate(question, retrieve(question))

    def ask(request: dict[str, Any]) -> dict[str, Any]:
        text = answer(request["question"], request.get("session"))
        return {"answer": text}

    return ask, _mlflow_flush


def _langfuse_app() -> tuple[Callable[[dict[str, Any]], dict[str, Any]], Callable[[], None]]:
    from langchain_core.documents import Document
    from langfuse import get_client, observe, propagate_attributes

    def documents(query: str) -> list[Document]:
        return [
            Document(page_content=KB[i], metadata={"source": f"kb/{i}"}, id=i) for i in rank(query)
        ]

    @observe(as_type="retriever")
    def retrieve(query: str) -> list[Document]:
        return documents(query)

    @observe(as_type="generation")
    def generate(question: str, docs: list[Document]) -> str:
        return _generate(question, [d.page_content for d in docs])

    @observe()  # a plain span: the outermost observation above the retriever
    def answer(question: str) -> str:
        return generate(question, retrieve(question))

    @observe(as_type="retriever")
    def search(vector: list[float], k: int) -> list[Document]:
        return documents(QUESTION_OF[tuple(vector)])

    @observe()
    def answer_embedded(vector: list[float]) -> str:
        """An app whose request carries only the question's embedding: no argument
        anywhere holds its text."""
        question = QUESTION_OF[tuple(vector)]
        docs = search(vector, 2)
        return generate(question, docs)

    def ask(request: dict[str, Any]) -> dict[str, Any]:
        question = request["question"]
        session = request.get("session")
        if request.get("embedded"):
            vector = [float(len(question)), 0.5]
            QUESTION_OF[tuple(vector)] = question
            text = answer_embedded(vector)
        elif session is None:
            text = answer(question) if request.get("positional") else answer(question=question)
        else:
            with propagate_attributes(session_id=session):
                text = answer(question)
        return {"answer": text}

    def flush() -> None:
        get_client().flush()

    return ask, flush


def _lcel_chain() -> Any:
    """An LCEL RAG chain: a LangChain retriever (``Document(id=...)``, the corpus's
    keyword rule) and the loopback LLM."""
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.runnables import RunnableLambda, RunnablePassthrough

    class KeywordRetriever(BaseRetriever):
        def _get_relevant_documents(
            self, query: str, *, run_manager: CallbackManagerForRetrieverRun
        ) -> list[Document]:
            return [
                Document(page_content=KB[i], metadata={"source": f"kb/{i}"}, id=i)
                for i in rank(query)
            ]

    def generate(inputs: dict[str, Any]) -> str:
        return _generate(inputs["question"], [d.page_content for d in inputs["context"]])

    return {
        "context": KeywordRetriever(),
        "question": RunnablePassthrough(),
    } | RunnableLambda(generate)


def _langfuse_langchain_app() -> tuple[
    Callable[[dict[str, Any]], dict[str, Any]], Callable[[], None]
]:
    """The LCEL chain traced by Langfuse's LangChain callback handler (no decorator)."""
    from langfuse import get_client, propagate_attributes
    from langfuse.langchain import CallbackHandler

    chain = _lcel_chain()

    def ask(request: dict[str, Any]) -> dict[str, Any]:
        config: Any = {"callbacks": [CallbackHandler()]}
        session = request.get("session")
        if session is None:
            return {"answer": chain.invoke(request["question"], config=config)}
        with propagate_attributes(session_id=session):
            return {"answer": chain.invoke(request["question"], config=config)}

    def flush() -> None:
        get_client().flush()

    return ask, flush


def _mlflow_langchain_app() -> tuple[
    Callable[[dict[str, Any]], dict[str, Any]], Callable[[], None]
]:
    """The LCEL chain traced by ``mlflow.langchain.autolog()`` (no decorator)."""
    import mlflow

    mlflow.langchain.autolog()
    chain = _lcel_chain()

    def ask(request: dict[str, Any]) -> dict[str, Any]:
        return {"answer": chain.invoke(request["question"])}

    return ask, _mlflow_flush


def _keyword_retriever() -> Any:
    """A LangChain retriever with the corpus's keyword rule, whose documents carry their
    id only as ``Document.id`` (no id in the metadata)."""
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever

    class KeywordRetriever(BaseRetriever):
        def _get_relevant_documents(
            self, query: str, *, run_manager: CallbackManagerForRetrieverRun
        ) -> list[Document]:
            return [Document(page_content=KB[i], id=i) for i in rank(query)]

    return KeywordRetriever()


def _traceloop_app() -> tuple[Callable[[dict[str, Any]], dict[str, Any]], Callable[[], None]]:
    """traceloop-sdk: ``Traceloop.init`` (exporting to ``TRACELOOP_BASE_URL``) with its
    LangChain instrumentation, a ``@workflow`` calling a ``@task`` that invokes the
    LangChain retriever, then the loopback LLM.  With ``"reworded"`` the task returns
    its documents shortened for the prompt (new text, same ids), so the retriever span's
    documents and the task's no longer match by text."""
    from langchain_core.documents import Document
    from traceloop.sdk import Traceloop
    from traceloop.sdk.decorators import task, workflow
    from traceloop.sdk.instruments import Instruments

    Traceloop.init(
        app_name=os.environ["OTEL_SERVICE_NAME"],
        disable_batch=True,
        telemetry_enabled=False,
        instruments={Instruments.LANGCHAIN},
    )
    retriever = _keyword_retriever()

    @task(name="retrieve")
    def retrieve(question: str, reworded: bool = False) -> list[Document]:
        docs = retriever.invoke(question)
        if reworded:
            return [Document(page_content=d.page_content[:24] + "...", id=d.id) for d in docs]
        return list(docs)

    used: list[str] = []

    @workflow(name="answer")
    def answer(question: str, reworded: bool = False) -> str:
        docs = retrieve(question, reworded)
        used[:] = [d.page_content for d in docs]
        return _generate(question, used)

    def ask(request: dict[str, Any]) -> dict[str, Any]:
        reworded = bool(request.get("reworded"))
        text = answer(question=request["question"], reworded=reworded)
        return {"answer": text, "texts": list(used)}

    def flush() -> None:
        # disable_batch: each span is exported as it ends; nothing is left to flush.
        pass

    return ask, flush


_APPS = {
    "mlflow": _mlflow_app,
    "langfuse": _langfuse_app,
    "langfuse-langchain": _langfuse_langchain_app,
    "mlflow-langchain": _mlflow_langchain_app,
    "traceloop": _traceloop_app,
}


def main() -> None:
    protocol = sys.stdout
    sys.stdout = sys.stderr  # what an SDK prints (traceloop-sdk's banners) is not a reply
    ask, flush = _APPS[sys.argv[1]]()
    for line in sys.stdin:
        request = json.loads(line)
        got = ask(request)
        ids = rank(request["question"])
        flush()
        texts = got.get("texts") or [KB[i] for i in ids]
        out = {"ids": ids, "texts": texts, "answer": got["answer"]}
        protocol.write(json.dumps(out) + "\n")
        protocol.flush()


if __name__ == "__main__":
    main()


# ------------------------------------------------------------------ the tests' side
class AppProcess:
    """One app process (see the module docstring), exporting to ``serve``'s OTLP/HTTP
    receiver with the SDK's own settings: ``env``, plus the loopback LLM's address."""

    def __init__(self, which: str, env: dict[str, str], llm_url: str) -> None:
        import subprocess
        from pathlib import Path

        root = Path(__file__).resolve().parents[2]
        full = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("OTEL_", "LANGFUSE_", "MLFLOW_", "TRACELOOP_"))
        }
        full.update(env, MATRIX_LLM_URL=llm_url, PYTHONPATH=str(root))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.frameworks._tracing_apps", which],
            env=full,
            cwd=root,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(
        self,
        question: str,
        *,
        session: str | None = None,
        positional: bool = False,
        embedded: bool = False,
        reworded: bool = False,
    ) -> Any:
        """What the app retrieved and answered (a :class:`~tests.e2e._instrumented.Retrieved`),
        once its spans are exported."""
        from tests.e2e._instrumented import Retrieved

        assert self._proc.stdin is not None
        assert self._proc.stdout is not None
        request = {
            "question": question,
            "session": session,
            "positional": positional,
            "embedded": embedded,
            "reworded": reworded,
        }
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        assert line, f"the app exited: {self._proc.wait(30)}"
        got = json.loads(line)
        return Retrieved(got["ids"], got["texts"], got["answer"])

    def __enter__(self) -> AppProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(60)
        finally:
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait(10)
