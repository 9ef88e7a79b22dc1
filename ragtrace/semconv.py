"""Span attribute names: the single source of truth.

The SDK writes these names and the collector reads them (``from ragtrace import
semconv``).  Where a public convention exists we use it:

* OpenInference (Phoenix, Arize, Langfuse understand it): span kind, input/output,
  ``retrieval.documents.N.document.*``, ``reranker.*``, ``session.id``, ``user.id``.
* OpenTelemetry GenAI semantic conventions: ``gen_ai.operation.name``,
  ``gen_ai.retrieval.query.text``, ``gen_ai.conversation.id`` and the
  ``gen_ai.evaluation.result`` event.

Only what neither convention covers lives under ``ragtrace.*``.

The names the collector only *reads* from other instrumentation (OTel GenAI retrieval
and messages, OpenLLMetry/Traceloop) are in their own marked groups below.

This module must stay import-cheap: plain string constants and a few tiny helpers.
"""

from __future__ import annotations

import math
import numbers
from typing import Final

# --------------------------------------------------------------------------- kinds
OPENINFERENCE_SPAN_KIND: Final = "openinference.span.kind"
RAGTRACE_SPAN_KIND: Final = "ragtrace.span.kind"

# ragtrace.span.kind values
KIND_RAG: Final = "rag"
KIND_RETRIEVER: Final = "retriever"
KIND_RERANKER: Final = "reranker"
KIND_GENERATOR: Final = "generator"
#: A feedback span (``ragtrace.feedback()``): what a user said about a request.
KIND_FEEDBACK: Final = "feedback"

# openinference.span.kind values
OI_KIND_CHAIN: Final = "CHAIN"
OI_KIND_AGENT: Final = "AGENT"
OI_KIND_RETRIEVER: Final = "RETRIEVER"
OI_KIND_RERANKER: Final = "RERANKER"
OI_KIND_LLM: Final = "LLM"
OI_KIND_EVALUATOR: Final = "EVALUATOR"

#: ragtrace kind -> OpenInference kind
OPENINFERENCE_KIND_FOR: Final[dict[str, str]] = {
    KIND_RAG: OI_KIND_CHAIN,
    KIND_RETRIEVER: OI_KIND_RETRIEVER,
    KIND_RERANKER: OI_KIND_RERANKER,
    KIND_GENERATOR: OI_KIND_LLM,
}

# -------------------------------------------------------------------- resource
#: OpenInference resource attribute: the Phoenix project that a service's spans go to.
OPENINFERENCE_PROJECT_NAME: Final = "openinference.project.name"

# --------------------------------------------------------------- input / output
INPUT_VALUE: Final = "input.value"
INPUT_MIME_TYPE: Final = "input.mime_type"
OUTPUT_VALUE: Final = "output.value"
OUTPUT_MIME_TYPE: Final = "output.mime_type"
MIME_TEXT: Final = "text/plain"
MIME_JSON: Final = "application/json"

# ------------------------------------------------------------ retrieved documents
RETRIEVAL_DOCUMENTS: Final = "retrieval.documents"
RERANKER_INPUT_DOCUMENTS: Final = "reranker.input_documents"
RERANKER_OUTPUT_DOCUMENTS: Final = "reranker.output_documents"
RERANKER_QUERY: Final = "reranker.query"
RERANKER_MODEL_NAME: Final = "reranker.model_name"
RERANKER_TOP_K: Final = "reranker.top_k"

DOCUMENT_ID: Final = "document.id"
DOCUMENT_CONTENT: Final = "document.content"
DOCUMENT_SCORE: Final = "document.score"
DOCUMENT_METADATA: Final = "document.metadata"
DOCUMENT_FIELDS: Final = (DOCUMENT_ID, DOCUMENT_CONTENT, DOCUMENT_SCORE, DOCUMENT_METADATA)
# How many documents a retriever returned / a reranker received and returned.  Recorded
# even with capture_content=False (structure without text).  Kept outside the
# ``retrieval.documents.*`` namespace so that backends unflattening that list are not confused.
RETRIEVAL_DOCUMENT_COUNT: Final = "ragtrace.retrieval.document_count"
RERANKER_INPUT_DOCUMENT_COUNT: Final = "ragtrace.reranker.input_document_count"
RERANKER_OUTPUT_DOCUMENT_COUNT: Final = "ragtrace.reranker.output_document_count"

# ------------------------------------------------------------------ score segments
# A segment key (collector ``segments:``) read, when no attribute carries it, as the
# name of the case's first retriever span.
SEGMENT_RETRIEVER_NAME: Final = "retriever.name"

GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_OPERATION_RETRIEVAL: Final = "retrieval"
GEN_AI_RETRIEVAL_QUERY_TEXT: Final = "gen_ai.retrieval.query.text"

# ------------------------------------------------------------------ generation
LLM_MODEL_NAME: Final = "llm.model_name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_OPERATION_CHAT: Final = "chat"

# ---------------------------------------------------------------- conversation
SESSION_ID: Final = "session.id"
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
USER_ID: Final = "user.id"
TURN_INDEX: Final = "ragtrace.turn.index"
EXPECTED_OUTCOME: Final = "ragtrace.expected_outcome"

# ----------------------------------------------------------------- ground truth
EXPECTED_OUTPUT: Final = "ragtrace.expected_output"
REFERENCE_CONTEXTS: Final = "ragtrace.reference_contexts"  # JSON list of strings
REFERENCE_CONTEXT_IDS: Final = "ragtrace.reference_context_ids"  # JSON list of strings
GROUND_TRUTH_ATTRIBUTES: Final = (
    EXPECTED_OUTPUT,
    REFERENCE_CONTEXTS,
    REFERENCE_CONTEXT_IDS,
    EXPECTED_OUTCOME,
)

# OTel general attribute of the "exception" span event (used when the SDK's own
# record_exception cannot render the exception).
EXCEPTION_TYPE: Final = "exception.type"

# SDK bookkeeping
RAGTRACE_CONTENT_TRUNCATED: Final = "ragtrace.content_truncated"
RAGTRACE_SDK_VERSION: Final = "ragtrace.sdk.version"

# ============================================================================
# Names the collector *reads* from other instrumentation (it never writes them).
# Each group is read by one module of ``ragtrace_collector.conventions``.

# --------------------------------------------------- OTel GenAI (read only)
# From the GenAI semantic conventions (gen-ai-spans.md, gen_ai_attributes): retrieval
# spans carry the retrieved documents as a JSON array of objects (``id``, ``score``,
# and content/metadata where recorded); agent and workflow spans are the request roots.
GEN_AI_RETRIEVAL_DOCUMENTS: Final = "gen_ai.retrieval.documents"
GEN_AI_INPUT_MESSAGES: Final = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
GEN_AI_OPERATION_INVOKE_AGENT: Final = "invoke_agent"
GEN_AI_OPERATION_INVOKE_WORKFLOW: Final = "invoke_workflow"

# --------------------------------------------- OpenLLMetry / Traceloop (read only)
# From opentelemetry-semantic-conventions-ai (``SpanAttributes``, ``Events``,
# ``EventAttributes``) and its LangChain and vector-DB instrumentations.
TRACELOOP_SPAN_KIND: Final = "traceloop.span.kind"
TRACELOOP_KIND_WORKFLOW: Final = "workflow"
TRACELOOP_KIND_AGENT: Final = "agent"
#: Every span of the LlamaIndex instrumentation below its top span is a ``task``.
TRACELOOP_KIND_TASK: Final = "task"
TRACELOOP_ENTITY_INPUT: Final = "traceloop.entity.input"
TRACELOOP_ENTITY_OUTPUT: Final = "traceloop.entity.output"
#: ``Traceloop.set_association_properties({"session_id": ...})``
TRACELOOP_SESSION_ID: Final = "traceloop.association.properties.session_id"
#: gen_ai.operation.name of the LangChain instrumentation's retriever spans
TRACELOOP_OPERATION_VECTOR_DB_RETRIEVE: Final = "vector_db_retrieve"
#: One span event per result of a vector-DB query (Chroma, Qdrant, Pinecone, ...).
DB_QUERY_RESULT_EVENT: Final = "db.query.result"
DB_QUERY_RESULT_ID: Final = "db.query.result.id"
DB_QUERY_RESULT_SCORE: Final = "db.query.result.score"
DB_QUERY_RESULT_DISTANCE: Final = "db.query.result.distance"
DB_QUERY_RESULT_METADATA: Final = "db.query.result.metadata"
DB_QUERY_RESULT_DOCUMENT: Final = "db.query.result.document"

# ------------------------------------------------- MLflow tracing (read only)
# From ``mlflow.tracing.constant.SpanAttributeKey`` and ``mlflow.entities.SpanType``:
# MLflow writes every one of its span attributes as JSON, so a span type is the
# JSON-quoted string (``"RETRIEVER"``, quotes included) and a session id set with
# ``span.set_attribute("session.id", ...)`` arrives as ``"..."`` too.
MLFLOW_SPAN_TYPE: Final = "mlflow.spanType"
MLFLOW_SPAN_INPUTS: Final = "mlflow.spanInputs"
MLFLOW_SPAN_OUTPUTS: Final = "mlflow.spanOutputs"
MLFLOW_TYPE_RETRIEVER: Final = '"RETRIEVER"'
MLFLOW_TYPE_RERANKER: Final = '"RERANKER"'
#: Span types that may be the case span (the outermost one above a retriever);
#: ``UNKNOWN`` is what ``@mlflow.trace`` without ``span_type`` writes.
MLFLOW_ROOT_TYPES: Final = (
    '"CHAIN"',
    '"AGENT"',
    '"WORKFLOW"',
    '"UNKNOWN"',
    '"LLM"',
    '"CHAT_MODEL"',
)

# ------------------------------------------ Langfuse Python SDK v3+ (read only)
# From ``langfuse._client.attributes.LangfuseOtelSpanAttributes``: the type an
# observation was made with (``@observe(as_type=...)``), its input and output (JSON, or
# the text itself); the session (``propagate_attributes(session_id=...)``) is written
# as ``session.id`` (:data:`SESSION_ID`).
LANGFUSE_OBSERVATION_TYPE: Final = "langfuse.observation.type"
LANGFUSE_OBSERVATION_INPUT: Final = "langfuse.observation.input"
LANGFUSE_OBSERVATION_OUTPUT: Final = "langfuse.observation.output"
LANGFUSE_TYPE_RETRIEVER: Final = "retriever"
#: Observation types that may be the case span; ``span`` is ``@observe()``'s default.
LANGFUSE_ROOT_TYPES: Final = ("span", "chain", "agent", "generation")

# ------------------------------------------------------------------ evaluation
EVAL_PREFIX: Final = "ragtrace.eval"
EVAL_MODEL: Final = "ragtrace.eval.model"
EVAL_SAMPLE_RATE: Final = "ragtrace.eval.sample_rate"
EVAL_SAMPLED: Final = "ragtrace.eval.sampled"
EVAL_COST_USD: Final = "ragtrace.eval.cost_usd"
EVAL_LATENCY_MS: Final = "ragtrace.eval.latency_ms"
#: Written by the collector on a scored case span: the question and the answer the
#: metrics judged, as read from the span (JSON and framework objects reduced to their
#: text), cut at ``enrichment.max_text_chars``.  OpenInference's ``input.value`` /
#: ``output.value`` hold what the app recorded and are left as they are; neither the
#: OpenInference nor the GenAI conventions name the judged text.
EVAL_INPUT: Final = "ragtrace.eval.input"
EVAL_OUTPUT: Final = "ragtrace.eval.output"
#: Written by the collector on a case span whose retrieved ids were compared with
#: reference ids: where each document's id was read (``document.id``,
#: ``metadata.doc_id``, ...; several comma-separated when documents differ).  Outside
#: ``ragtrace.eval.*``, which holds results and the evaluation summary only.
DOCUMENT_ID_SOURCE: Final = "ragtrace.retrieval.document_id_source"

# suffixes of ragtrace.eval.<metric>.<field>
EVAL_FIELD_SCORE: Final = "score"
EVAL_FIELD_REASON: Final = "reason"
EVAL_FIELD_PASSED: Final = "passed"
EVAL_FIELD_THRESHOLD: Final = "threshold"
EVAL_FIELD_ERROR: Final = "error"
EVAL_FIELD_SKIPPED: Final = "skipped"
EVAL_FIELD_CONVERSATION_SCORE: Final = "conversation_score"
EVAL_FIELD_REFERENCE: Final = "reference"
#: The judge that produced the result: "offline", a litellm model string, or "none".
EVAL_FIELD_JUDGE: Final = "judge"
#: Per-document verdicts (JSON list of {span_id, position, score, label, explanation}):
#: where each retrieved document sits (its retriever or reranker span and index).
EVAL_FIELD_DOCUMENTS: Final = "documents"

# ------------------------------------------------------------------ user feedback
# ``ragtrace.feedback()`` (and, later, the collector's ``POST /v1/feedback``) sends one
# span per feedback, in the request's own trace: a child of the request span and linked
# to it when its span id is known (``ragtrace.span.kind=feedback``, OpenInference kind
# EVALUATOR, so no convention takes it for a request).  Its attributes mirror the
# common shape of Phoenix annotations (name, score, label, explanation, identifier),
# Langfuse scores (name, value, dataType, comment) and the GenAI
# ``gen_ai.evaluation.result`` event (name, score.value, score.label, explanation):
FEEDBACK_SPAN_NAME: Final = "ragtrace.feedback"
#: What the feedback is about, e.g. ``user_feedback`` (Phoenix ``name``, Langfuse
#: ``name``, ``gen_ai.evaluation.name``).  In the collector (planned), a repeat of
#: (request, name, user id) replaces the earlier one.
FEEDBACK_NAME: Final = "ragtrace.feedback.name"
#: A double in [0, 1]; a thumbs-up is 1.0, a thumbs-down 0.0 (Phoenix ``score``,
#: Langfuse ``value``, ``gen_ai.evaluation.score.value``).
FEEDBACK_VALUE: Final = "ragtrace.feedback.value"
#: ``boolean`` (the app sent a thumbs) or ``numeric`` (Langfuse ``dataType``).
FEEDBACK_VALUE_TYPE: Final = "ragtrace.feedback.value_type"
#: ``positive`` or ``negative``; a number is negative below 0.5 (Phoenix ``label``,
#: ``gen_ai.evaluation.score.label``; the ``outcome`` label of ragtrace_feedback_total).
FEEDBACK_OUTCOME: Final = "ragtrace.feedback.outcome"
#: Free text from the user (Phoenix ``explanation``, Langfuse ``comment``,
#: ``gen_ai.evaluation.explanation``).
FEEDBACK_COMMENT: Final = "ragtrace.feedback.comment"
#: Who gave the feedback (Phoenix ``identifier``, the planned upsert key with the name).
FEEDBACK_USER_ID: Final = "ragtrace.feedback.user_id"
#: What the answer should have been, as the user wrote it (LangSmith ``correction``).
FEEDBACK_CORRECTION: Final = "ragtrace.feedback.correction"

# ragtrace.feedback.value_type values
FEEDBACK_TYPE_BOOLEAN: Final = "boolean"
FEEDBACK_TYPE_NUMERIC: Final = "numeric"
# ragtrace.feedback.outcome values
FEEDBACK_POSITIVE: Final = "positive"
FEEDBACK_NEGATIVE: Final = "negative"
#: A number below this is negative feedback.
FEEDBACK_NEGATIVE_BELOW: Final = 0.5
#: Default ``ragtrace.feedback.name``.
FEEDBACK_DEFAULT_NAME: Final = "user_feedback"
#: Bounds shared by the SDK and the collector's ``POST /v1/feedback``: a longer name or
#: user id is refused (a name is a metric label, a user id part of the upsert key, so
#: cutting either could merge two of them); a longer comment or correction is cut.
FEEDBACK_MAX_NAME_CHARS: Final = 128
FEEDBACK_MAX_USER_ID_CHARS: Final = 256
FEEDBACK_MAX_TEXT_CHARS: Final = 4000

# OpenInference inline evaluations: evaluations.N.evaluation.<field>
EVALUATIONS: Final = "evaluations"
EVALUATION_NAME: Final = "evaluation.name"
EVALUATION_SCORE: Final = "evaluation.score"
EVALUATION_LABEL: Final = "evaluation.label"
EVALUATION_EXPLANATION: Final = "evaluation.explanation"
EVALUATION_ANNOTATOR_KIND: Final = "evaluation.annotator_kind"

# OTel GenAI evaluation event
GEN_AI_EVALUATION_RESULT_EVENT: Final = "gen_ai.evaluation.result"
GEN_AI_EVALUATION_NAME: Final = "gen_ai.evaluation.name"
GEN_AI_EVALUATION_SCORE_VALUE: Final = "gen_ai.evaluation.score.value"
GEN_AI_EVALUATION_SCORE_LABEL: Final = "gen_ai.evaluation.score.label"
GEN_AI_EVALUATION_EXPLANATION: Final = "gen_ai.evaluation.explanation"
#: OTel general attribute; set on an evaluation event when the evaluation itself errored.
ERROR_TYPE: Final = "error.type"
LABEL_PASS: Final = "pass"
LABEL_FAIL: Final = "fail"
#: Labels of per-document verdicts.
LABEL_RELEVANT: Final = "relevant"
LABEL_IRRELEVANT: Final = "irrelevant"


def eval_attr(metric: str, field: str) -> str:
    """``ragtrace.eval.<metric>.<field>``."""
    return f"{EVAL_PREFIX}.{metric}.{field}"


def document_attr(prefix: str, index: int, field: str) -> str:
    """``<prefix>.<index>.<field>``, e.g. ``retrieval.documents.0.document.id``."""
    return f"{prefix}.{index}.{field}"


def evaluation_attr(index: int, field: str) -> str:
    """``evaluations.<index>.<field>``, e.g. ``evaluations.0.evaluation.score``."""
    return f"{EVALUATIONS}.{index}.{field}"


def feedback_number(value: object) -> tuple[float, str] | None:
    """A feedback value as (number in [0, 1], ``boolean`` or ``numeric``), or None.

    A bool is a thumbs (1.0 or 0.0); any other real number counts when finite and in
    [0, 1] (an int past a float's range is refused, never raised)."""
    if isinstance(value, bool):
        return (1.0 if value else 0.0), FEEDBACK_TYPE_BOOLEAN
    if not isinstance(value, numbers.Real):
        return None
    try:
        number = float(value)
    except (OverflowError, TypeError, ValueError):
        return None
    if math.isfinite(number) and 0.0 <= number <= 1.0:
        return number, FEEDBACK_TYPE_NUMERIC
    return None


def feedback_outcome(value: float) -> str:
    """``negative`` below 0.5, else ``positive`` (value already in [0, 1])."""
    return FEEDBACK_NEGATIVE if value < FEEDBACK_NEGATIVE_BELOW else FEEDBACK_POSITIVE
