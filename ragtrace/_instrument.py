"""The decorators ``rag``, ``retriever``, ``reranker`` and ``generator``.

Layout (after pydantic-logfire's ``instrument.py``): everything that depends only on the
decorated function is computed once, at decoration time, into a :class:`_Spec` (span
name, static attributes, where the input argument sits, which argument holds a
reranker's documents).  Then one of four wrappers is chosen by the function's kind,
sync, coroutine, generator or async generator, so the wrapper is the same kind of
callable as the function (``inspect.iscoroutinefunction`` and friends keep working).

Per call, a wrapper reads one settings snapshot; when ragtrace is disabled it calls the
function directly.  Otherwise it starts the span, makes it current, calls the function
and, on the way out, records input and output in a single ``set_attributes`` call.  A
span that is not recording (sampled out, no provider) costs no capture work at all.

Streaming: a generator's span starts at the first ``next()`` and ends when the generator
is exhausted, closed or raises.  The span is made current only while the generator's own
code runs (around each step), never while the consumer runs between items.  Yielded
text is joined into ``output.value`` (kept up to ``max_content_chars``); for
``@retriever``/``@reranker`` the yielded items are the documents.  With ``output=``, the
callable is applied to each yielded item rather than to a return value.  Chunk objects
are read duck-typed: OpenAI-style ``choices[0].delta.content`` (or ``.text``), LangChain
message chunks (``.content``), LlamaIndex responses (``.delta``).  A stream that raises
keeps the partial output it produced.

A plain function that *returns* an iterator or async iterator (the OpenAI
``return client.chat.completions.create(..., stream=True)`` pattern) gets the same
treatment: the caller receives a thin proxy (:class:`_IteratorProxy` /
:class:`_AsyncIteratorProxy`) that forwards every attribute, ``close()`` and the
context-manager protocol to the real stream, and the span ends when the stream is
exhausted, closed, raises, or is garbage-collected unfinished.

Failure containment: a user exception is recorded on the span (status ERROR plus an
``exception`` event) and re-raised unchanged.  Anything ragtrace itself fails at is
reported once (``ragtrace._safety``) and the call goes on.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextvars import Token
from typing import Any, Final, TypeVar, overload

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.trace import Span, Status, StatusCode

from ragtrace import semconv
from ragtrace._capture import REDACT_MARGIN, process_text, put_value
from ragtrace._config import RUNTIME, Settings
from ragtrace._documents import MAX_DOCUMENTS, iter_documents, put_documents
from ragtrace._reference import CURRENT_RAG, RagFrame, current_rag
from ragtrace._safety import report
from ragtrace._session import Session, current_session

__all__ = ["generator", "rag", "reranker", "retriever"]

_F = TypeVar("_F", bound=Callable[..., Any])

_INPUT_NAMES: Final = ("query", "question", "input", "prompt", "message")
_DOCUMENT_ARG_NAMES: Final = (
    "documents",
    "docs",
    "nodes",
    "contexts",
    "candidates",
    "passages",
    "chunks",
    "results",
    "hits",
)
_TOP_K_NAMES: Final = ("top_k", "top_n")
_MODEL_NAMES: Final = ("model", "model_name")
_SELF_NAMES: Final = ("self", "cls")
#: Non-string items of a stream kept for output.value (strings are bounded by length).
_MAX_STREAM_ITEMS: Final = 1000
#: Return values that are never streams: checked first, so the common case stays cheap.
_PLAIN_RESULTS: Final = (str, list, tuple, dict, int, float, bool, type(None))


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Final = _Missing()


class _ArgRef:
    """Where one parameter's value sits in ``(args, kwargs)``."""

    __slots__ = ("default", "index", "name")

    def __init__(self, index: int | None, name: str | None, default: Any) -> None:
        self.index = index
        self.name = name
        self.default = default

    def get(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        index = self.index
        if index is not None and index < len(args):
            return args[index]
        name = self.name
        if name is not None and name in kwargs:
            return kwargs[name]
        return self.default


def _signature(func: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):
        return None


def _ref_for(sig: inspect.Signature, name: str) -> _ArgRef | None:
    has_var_keyword = False
    for index, param in enumerate(sig.parameters.values()):
        kind = param.kind
        if kind is param.VAR_KEYWORD:
            has_var_keyword = True
            continue
        if param.name != name or kind is param.VAR_POSITIONAL:
            continue
        default = _MISSING if param.default is param.empty else param.default
        positional = kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD)
        keyword = kind is not param.POSITIONAL_ONLY
        return _ArgRef(index if positional else None, name if keyword else None, default)
    if has_var_keyword:
        return _ArgRef(None, name, _MISSING)
    return None


def _first_ref(sig: inspect.Signature | None, names: tuple[str, ...]) -> _ArgRef | None:
    if sig is None:
        return None
    present = set(sig.parameters)
    for name in names:
        if name in present:
            return _ref_for(sig, name)
    return None


def _default_name(func: Any) -> str:
    """The qualified name without ``<locals>`` noise: ``Class.method`` or ``function``."""
    qualname = getattr(func, "__qualname__", None) or type(func).__qualname__
    return str(qualname).rpartition("<locals>.")[2]


class _Spec:
    """Everything about a decorated function that does not change between calls."""

    __slots__ = (
        "docs_ref",
        "input_ref",
        "is_rag",
        "kind",
        "model_ref",
        "name",
        "output",
        "skip",
        "static",
        "top_k_ref",
    )

    def __init__(
        self,
        kind: str,
        func: Any,
        name: str | None,
        input_name: str | None,
        output: Callable[[Any], Any] | None,
    ) -> None:
        if name is not None and (not isinstance(name, str) or not name):
            raise TypeError(f"ragtrace.{kind}: name= must be a non-empty str, got {name!r}")
        if output is not None and not callable(output):
            raise TypeError(f"ragtrace.{kind}: output= must be a callable, got {output!r}")
        self.kind = kind
        self.is_rag = kind == semconv.KIND_RAG
        self.name = name or _default_name(func)
        self.output = output
        static: dict[str, Any] = {
            semconv.OPENINFERENCE_SPAN_KIND: semconv.OPENINFERENCE_KIND_FOR[kind],
            semconv.RAGTRACE_SPAN_KIND: kind,
        }
        if kind == semconv.KIND_RETRIEVER:
            static[semconv.GEN_AI_OPERATION_NAME] = semconv.GEN_AI_OPERATION_RETRIEVAL
        elif kind == semconv.KIND_GENERATOR:
            static[semconv.GEN_AI_OPERATION_NAME] = semconv.GEN_AI_OPERATION_CHAT
        self.static = static

        sig = _signature(func)
        params = list(sig.parameters.values()) if sig is not None else []
        self.skip = 1 if params and params[0].name in _SELF_NAMES else 0
        if input_name is not None:
            if not isinstance(input_name, str) or not input_name:
                raise TypeError(
                    f"ragtrace.{kind}: input= must be an argument name (str), got {input_name!r}"
                )
            if sig is None:
                ref: _ArgRef | None = _ArgRef(None, input_name, _MISSING)
            else:
                ref = _ref_for(sig, input_name)
            if ref is None:
                raise TypeError(
                    f"ragtrace.{kind}: input={input_name!r} is not a parameter of {self.name}{sig}"
                )
            self.input_ref: _ArgRef | None = ref
        else:
            self.input_ref = _first_ref(sig, _INPUT_NAMES)
        self.docs_ref = (
            _first_ref(sig, _DOCUMENT_ARG_NAMES) if kind == semconv.KIND_RERANKER else None
        )
        self.top_k_ref = _first_ref(sig, _TOP_K_NAMES) if kind == semconv.KIND_RERANKER else None
        self.model_ref = _first_ref(sig, _MODEL_NAMES) if kind == semconv.KIND_GENERATOR else None


class _Call:
    """One running decorated call; for ``@rag`` also the frame ``set_reference`` sees."""

    __slots__ = (
        "args",
        "ctx",
        "kwargs",
        "rag_token",
        "session",
        "settings",
        "span",
        "spec",
        "token",
        "turn",
    )

    def __init__(
        self,
        spec: _Spec,
        settings: Settings,
        span: Span,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self.spec = spec
        self.settings = settings
        self.span = span
        self.args = args
        self.kwargs = kwargs
        self.session: Session | None = None
        self.turn: int | None = None
        self.token: Token[context_api.Context] | None = None
        self.rag_token: Token[RagFrame | None] | None = None
        self.ctx: context_api.Context = context_api.Context()

    def enter(self) -> tuple[Token[context_api.Context], Token[RagFrame | None] | None]:
        """Make the span (and, for ``@rag``, this call) current: one generator step."""
        token = context_api.attach(self.ctx)
        return token, CURRENT_RAG.set(self) if self.spec.is_rag else None

    @staticmethod
    def leave(tokens: tuple[Token[context_api.Context], Token[RagFrame | None] | None]) -> None:
        if tokens[1] is not None:
            CURRENT_RAG.reset(tokens[1])
        context_api.detach(tokens[0])


def _begin(
    spec: _Spec,
    settings: Settings,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    attach: bool,
) -> _Call | None:
    """Start the span (and make it current if ``attach``); None if ragtrace failed."""
    try:
        span = settings.tracer.start_span(spec.name, attributes=spec.static)
    except Exception as exc:
        report("starting a span", exc)
        return None
    call = _Call(spec, settings, span, args, kwargs)
    try:
        ctx = trace_api.set_span_in_context(span)
        if spec.is_rag:
            sess = current_session()
            if sess is not None:
                call.session = sess
                parent = current_rag()
                if parent is not None and parent.session is sess:
                    call.turn = parent.turn  # a nested @rag call shares its turn
                else:
                    call.turn = sess.next_turn()
        if attach:
            call.token = context_api.attach(ctx)
            if spec.is_rag:
                call.rag_token = CURRENT_RAG.set(call)
        else:
            call.ctx = ctx
    except Exception as exc:
        report("starting a span", exc)
        _end_span(span)
        return None
    return call


def _end_span(span: Span) -> None:
    try:
        span.end()
    except Exception as exc:
        report("ending a span", exc)


def _record_error(span: Span, exc: BaseException) -> None:
    try:
        span.record_exception(exc, escaped=True)
    except Exception as inner:
        report("recording an exception", inner)
        try:
            span.add_event("exception", {semconv.EXCEPTION_TYPE: type(exc).__qualname__})
        except Exception:
            pass
    try:
        description = f"{type(exc).__name__}: {exc}"
    except Exception:
        description = type(exc).__name__
    try:
        span.set_status(Status(StatusCode.ERROR, description))
    except Exception as inner:
        report("setting the span status", inner)


# ------------------------------------------------------------------- capture


def _input_value(spec: _Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    ref = spec.input_ref
    if ref is not None:
        value = ref.get(args, kwargs)
        return None if value is _MISSING else value
    for value in args[spec.skip :] if spec.skip else args:
        if isinstance(value, str):
            return value
    for value in kwargs.values():
        if isinstance(value, str):
            return value
    return None


def _reranker_documents(call: _Call) -> Any:
    spec = call.spec
    if spec.docs_ref is not None:
        value = spec.docs_ref.get(call.args, call.kwargs)
        return None if value is _MISSING else value
    for value in call.args[spec.skip :]:
        if isinstance(value, (list, tuple)):
            return value
    for value in call.kwargs.values():
        if isinstance(value, (list, tuple)):
            return value
    return None


def _capture_input(call: _Call, attrs: dict[str, Any]) -> None:
    spec = call.spec
    settings = call.settings
    kind = spec.kind
    if kind == semconv.KIND_RERANKER:
        try:
            docs = iter_documents(_reranker_documents(call))
            if docs is not None:
                attrs[semconv.RERANKER_INPUT_DOCUMENT_COUNT] = put_documents(
                    attrs, semconv.RERANKER_INPUT_DOCUMENTS, docs, settings
                )
            if spec.top_k_ref is not None:
                top_k = spec.top_k_ref.get(call.args, call.kwargs)
                if isinstance(top_k, int) and not isinstance(top_k, bool):
                    attrs[semconv.RERANKER_TOP_K] = top_k
        except Exception as exc:
            report("capturing the reranker's input documents", exc)
    elif spec.model_ref is not None:
        model = spec.model_ref.get(call.args, call.kwargs)
        if isinstance(model, str) and model:
            attrs[semconv.LLM_MODEL_NAME] = model
            attrs[semconv.GEN_AI_REQUEST_MODEL] = model
    if not settings.capture_content:
        return
    value = _input_value(spec, call.args, call.kwargs)
    if value is None:
        return
    text = put_value(attrs, semconv.INPUT_VALUE, semconv.INPUT_MIME_TYPE, value, settings, "input")
    if text is not None:
        if kind == semconv.KIND_RETRIEVER:
            attrs[semconv.GEN_AI_RETRIEVAL_QUERY_TEXT] = text
        elif kind == semconv.KIND_RERANKER:
            attrs[semconv.RERANKER_QUERY] = text


def _capture_session(call: _Call, attrs: dict[str, Any]) -> None:
    sess = call.session
    if sess is None:
        return
    attrs[semconv.SESSION_ID] = sess.session_id
    attrs[semconv.GEN_AI_CONVERSATION_ID] = sess.session_id
    if call.turn is not None:
        attrs[semconv.TURN_INDEX] = call.turn
    if sess.user_id is not None:
        attrs[semconv.USER_ID] = sess.user_id
    if sess.expected_outcome is not None:
        attrs[semconv.EXPECTED_OUTCOME] = process_text(sess.expected_outcome, call.settings, attrs)


def _documents_out(call: _Call, value: Any, attrs: dict[str, Any], extra: int = 0) -> None:
    docs = iter_documents(value)
    if docs is None:
        return
    if call.spec.kind == semconv.KIND_RETRIEVER:
        attrs[semconv.RETRIEVAL_DOCUMENT_COUNT] = extra + put_documents(
            attrs, semconv.RETRIEVAL_DOCUMENTS, docs, call.settings
        )
    else:
        attrs[semconv.RERANKER_OUTPUT_DOCUMENT_COUNT] = extra + put_documents(
            attrs, semconv.RERANKER_OUTPUT_DOCUMENTS, docs, call.settings
        )


def _capture_output(call: _Call, result: Any, attrs: dict[str, Any]) -> None:
    spec = call.spec
    settings = call.settings
    returns_documents = spec.kind in (semconv.KIND_RETRIEVER, semconv.KIND_RERANKER)
    if not returns_documents and not settings.capture_content:
        return
    value = result
    if spec.output is not None:
        try:
            value = spec.output(result)
        except Exception as exc:
            report("the output= callable", exc)
            return
    if returns_documents:
        _documents_out(call, value, attrs)
    elif type(value) is str:
        put_value(attrs, semconv.OUTPUT_VALUE, semconv.OUTPUT_MIME_TYPE, value, settings, "output")
    elif not isinstance(value, (Iterator, AsyncIterator)):
        # An iterator returned by a plain function is the caller's to consume.
        put_value(attrs, semconv.OUTPUT_VALUE, semconv.OUTPUT_MIME_TYPE, value, settings, "output")


def _finish(call: _Call, result: Any, error: BaseException | None) -> None:
    """Record input, output (or the error) and the session; detach; end.  Never raises."""
    span = call.span
    try:
        if span.is_recording():
            attrs: dict[str, Any] = {}
            _capture_input(call, attrs)
            if error is None:
                _capture_output(call, result, attrs)
            if call.session is not None:
                _capture_session(call, attrs)
            if attrs:
                span.set_attributes(attrs)
            if error is not None:
                _record_error(span, error)
    except Exception as exc:
        report("recording a span", exc)
    finally:
        if call.rag_token is not None:
            try:
                CURRENT_RAG.reset(call.rag_token)
            except Exception as exc:
                report("restoring the current @rag call", exc)
        if call.token is not None:
            try:
                context_api.detach(call.token)
            except Exception as exc:
                report("restoring the context", exc)
        _end_span(span)


class _Stream:
    """What a streaming call yielded, bounded in memory."""

    __slots__ = (
        "call",
        "chunks",
        "documents",
        "extra_documents",
        "kept",
        "omitted",
        "only_text",
        "recording",
    )

    def __init__(self, call: _Call) -> None:
        self.call = call
        self.recording = call.span.is_recording()
        self.documents = call.spec.kind in (semconv.KIND_RETRIEVER, semconv.KIND_RERANKER)
        self.chunks: list[Any] = []
        self.kept = 0  # characters kept (text streams)
        self.omitted = 0  # characters dropped beyond the limit (text streams)
        self.only_text = True
        self.extra_documents = 0  # documents beyond MAX_DOCUMENTS (counted, not kept)

    def add(self, item: Any) -> None:
        """Collect one yielded item; never raises."""
        if not self.recording:
            return
        call = self.call
        settings = call.settings
        if not self.documents and not settings.capture_content:
            return
        try:
            output = call.spec.output
            value = output(item) if output is not None else item
            if value is None:
                return
            if self.documents:
                if len(self.chunks) < MAX_DOCUMENTS:
                    self.chunks.append(value)
                else:
                    self.extra_documents += 1
                return
            if not isinstance(value, str):
                text = _chunk_text(value)
                if text is not None:
                    value = text
            if isinstance(value, str):
                limit = settings.max_content_chars
                if limit and self.kept > limit + REDACT_MARGIN:
                    self.omitted += len(value)
                    return
                self.kept += len(value)
            else:
                self.only_text = False
                if len(self.chunks) >= _MAX_STREAM_ITEMS:
                    return
            self.chunks.append(value)
        except Exception as exc:
            report("collecting a streamed item", exc)

    def finish(self, error: BaseException | None) -> None:
        call = self.call
        span = call.span
        try:
            if self.recording:
                attrs: dict[str, Any] = {}
                _capture_input(call, attrs)
                self._output(attrs)  # on an error too: the partial output is evidence
                if call.session is not None:
                    _capture_session(call, attrs)
                if attrs:
                    span.set_attributes(attrs)
                if error is not None and not isinstance(error, GeneratorExit):
                    _record_error(span, error)
        except Exception as exc:
            report("recording a span", exc)
        finally:
            _end_span(span)

    def _output(self, attrs: dict[str, Any]) -> None:
        call = self.call
        settings = call.settings
        if self.documents:
            _documents_out(call, self.chunks, attrs, self.extra_documents)
            return
        if not settings.capture_content or not self.chunks:
            return
        if self.only_text:
            text = process_text("".join(self.chunks), settings, attrs, self.omitted)
            attrs[semconv.OUTPUT_VALUE] = text
            attrs[semconv.OUTPUT_MIME_TYPE] = semconv.MIME_TEXT
        else:
            put_value(
                attrs,
                semconv.OUTPUT_VALUE,
                semconv.OUTPUT_MIME_TYPE,
                self.chunks,
                settings,
                "streamed output",
            )


def _field(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _chunk_text(chunk: Any) -> str | None:
    """The text of one streamed chunk object, read duck-typed; None if it has none.

    OpenAI-style chunks (objects or dicts): ``choices[0].delta.content``, or
    ``choices[0].text`` for completions; a chunk without text (the role chunk, the
    finish chunk, a usage-only chunk with no choices) counts as "".  LlamaIndex stream
    responses: ``.delta``.  LangChain message chunks: ``.content`` when it is a string.
    """
    if isinstance(chunk, (bytes, int, float, bool)) or chunk is None:
        return None
    choices = _field(chunk, "choices")
    if isinstance(choices, (list, tuple)):
        if not choices:
            return ""
        first = choices[0]
        delta = _field(first, "delta")
        if delta is not None:
            content = _field(delta, "content")
            return content if isinstance(content, str) else ""
        text = _field(first, "text")
        return text if isinstance(text, str) else ""
    for name in ("delta", "content", "text"):
        value = _field(chunk, name)
        if isinstance(value, str):
            return value
    return None


class _StreamProxy:
    """What the two proxies share: the wrapped stream, its span, and ending it once."""

    __slots__ = ("__weakref__", "_call", "_done", "_inner", "_stream")

    def __init__(self, inner: Any, call: _Call) -> None:
        self._inner = inner
        self._call = call
        self._stream = _Stream(call)
        self._done = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __repr__(self) -> str:
        return f"<ragtrace stream of {self._inner!r}>"

    def _end(self, error: BaseException | None) -> None:
        if not self._done:
            self._done = True
            self._stream.finish(error)

    def __del__(self) -> None:
        try:
            self._end(GeneratorExit())
        except Exception:
            pass


class _IteratorProxy(_StreamProxy):
    """What a decorated function returns in place of the iterator it returned."""

    __slots__ = ()

    def __iter__(self) -> _IteratorProxy:
        return self

    def __next__(self) -> Any:
        call = self._call
        tokens = call.enter()
        try:
            item = next(self._inner)
        except StopIteration:
            self._end(None)
            raise
        except BaseException as exc:
            self._end(exc)
            raise
        finally:
            call.leave(tokens)
        self._stream.add(item)
        return item

    def close(self) -> None:
        try:
            closer = getattr(self._inner, "close", None)
            if callable(closer):
                closer()
        finally:
            self._end(GeneratorExit())

    def __enter__(self) -> _IteratorProxy:
        enter = getattr(self._inner, "__enter__", None)
        if callable(enter):
            enter()
        return self

    def __exit__(self, *exc_info: Any) -> Any:
        exit_ = getattr(self._inner, "__exit__", None)
        try:
            return exit_(*exc_info) if callable(exit_) else None
        finally:
            self._end(exc_info[1] if exc_info[1] is not None else GeneratorExit())


class _AsyncIteratorProxy(_StreamProxy):
    """The async twin of :class:`_IteratorProxy` (an OpenAI ``AsyncStream``...)."""

    __slots__ = ()

    def __aiter__(self) -> _AsyncIteratorProxy:
        return self

    async def __anext__(self) -> Any:
        call = self._call
        tokens = call.enter()
        try:
            item = await self._inner.__anext__()
        except StopAsyncIteration:
            self._end(None)
            raise
        except BaseException as exc:
            self._end(exc)
            raise
        finally:
            call.leave(tokens)
        self._stream.add(item)
        return item

    async def aclose(self) -> None:
        try:
            closer = getattr(self._inner, "aclose", None) or getattr(self._inner, "close", None)
            if callable(closer):
                result = closer()
                if inspect.isawaitable(result):
                    await result
        finally:
            self._end(GeneratorExit())

    async def close(self) -> None:
        await self.aclose()

    async def __aenter__(self) -> _AsyncIteratorProxy:
        enter = getattr(self._inner, "__aenter__", None)
        if callable(enter):
            await enter()
        return self

    async def __aexit__(self, *exc_info: Any) -> Any:
        exit_ = getattr(self._inner, "__aexit__", None)
        try:
            return await exit_(*exc_info) if callable(exit_) else None
        finally:
            self._end(exc_info[1] if exc_info[1] is not None else GeneratorExit())


def _returned_stream(call: _Call, result: Any) -> Any:
    """If ``result`` is an iterator, hand the open span to a proxy around it.

    Returns the proxy, or None when ``result`` is not a stream (the call then ends as
    usual).  The call's context is detached now (the function has returned); the proxy
    makes the span current again around each step of the stream.
    """
    if isinstance(result, (str, bytes, list, tuple, dict)):
        return None
    if isinstance(result, Iterator):
        make: Any = _IteratorProxy
    elif isinstance(result, AsyncIterator):
        make = _AsyncIteratorProxy
    else:
        return None
    try:
        call.ctx = trace_api.set_span_in_context(call.span)
        if call.rag_token is not None:
            CURRENT_RAG.reset(call.rag_token)
            call.rag_token = None
        if call.token is not None:
            context_api.detach(call.token)
            call.token = None
        return make(result, call)
    except Exception as exc:
        report("wrapping a returned stream", exc)
        return None


# ------------------------------------------------------------------ wrappers


def _wrap_sync(func: Callable[..., Any], spec: _Spec) -> Callable[..., Any]:
    runtime = RUNTIME

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        settings = runtime.settings
        if not settings.enabled:
            return func(*args, **kwargs)
        call = _begin(spec, settings, args, kwargs, True)
        if call is None:
            return func(*args, **kwargs)
        try:
            result = func(*args, **kwargs)
        except BaseException as exc:
            _finish(call, None, exc)
            raise
        if not isinstance(result, _PLAIN_RESULTS):
            proxy = _returned_stream(call, result)
            if proxy is not None:
                return proxy
        _finish(call, result, None)
        return result

    return wrapper


def _wrap_async(func: Callable[..., Any], spec: _Spec) -> Callable[..., Any]:
    runtime = RUNTIME

    @functools.wraps(func)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        settings = runtime.settings
        if not settings.enabled:
            return await func(*args, **kwargs)
        call = _begin(spec, settings, args, kwargs, True)
        if call is None:
            return await func(*args, **kwargs)
        try:
            result = await func(*args, **kwargs)
        except BaseException as exc:
            _finish(call, None, exc)
            raise
        if not isinstance(result, _PLAIN_RESULTS):
            proxy = _returned_stream(call, result)
            if proxy is not None:
                return proxy
        _finish(call, result, None)
        return result

    return wrapper


def _wrap_generator(func: Callable[..., Any], spec: _Spec) -> Callable[..., Any]:
    runtime = RUNTIME

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        settings = runtime.settings
        if not settings.enabled:
            return (yield from func(*args, **kwargs))
        call = _begin(spec, settings, args, kwargs, False)
        if call is None:
            return (yield from func(*args, **kwargs))
        stream = _Stream(call)
        enter = call.enter
        leave = call.leave
        inner = func(*args, **kwargs)
        # PEP 380's expansion of ``yield from``, with the span current around each step.
        try:
            tokens = enter()
            try:
                item = next(inner)
            finally:
                leave(tokens)
            while True:
                stream.add(item)
                try:
                    sent = yield item
                except GeneratorExit:
                    raise
                except BaseException as thrown:
                    tokens = enter()
                    try:
                        item = inner.throw(thrown)
                    finally:
                        leave(tokens)
                else:
                    tokens = enter()
                    try:
                        item = next(inner) if sent is None else inner.send(sent)
                    finally:
                        leave(tokens)
        except StopIteration as stop:
            stream.finish(None)
            return stop.value
        except GeneratorExit as closing:
            try:
                tokens = enter()
                try:
                    inner.close()
                finally:
                    leave(tokens)
            except BaseException as exc:
                stream.finish(exc)
                raise
            stream.finish(closing)
            raise
        except BaseException as exc:
            stream.finish(exc)
            raise

    return wrapper


def _wrap_async_generator(func: Callable[..., Any], spec: _Spec) -> Callable[..., Any]:
    runtime = RUNTIME

    @functools.wraps(func)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        settings = runtime.settings
        call = _begin(spec, settings, args, kwargs, False) if settings.enabled else None
        inner = func(*args, **kwargs)
        if call is None:
            # Disabled, or ragtrace failed to start a span: plain delegation.
            to_throw: BaseException | None = None
            sent: Any = None
            try:
                while True:
                    if to_throw is not None:
                        thrown, to_throw = to_throw, None
                        item = await inner.athrow(thrown)
                    else:
                        item = await inner.asend(sent)
                    try:
                        sent = yield item
                    except GeneratorExit:
                        raise
                    except BaseException as thrown_in:
                        to_throw = thrown_in
                        sent = None
            except StopAsyncIteration:
                return
            except GeneratorExit:
                await inner.aclose()
                raise
        stream = _Stream(call)
        enter = call.enter
        leave = call.leave
        to_throw = None
        sent = None
        # An async ``yield from``: asend/athrow/aclose are forwarded to the inner generator,
        # with the span current around each step.
        try:
            while True:
                tokens = enter()
                try:
                    if to_throw is not None:
                        thrown, to_throw = to_throw, None
                        item = await inner.athrow(thrown)
                    else:
                        item = await inner.asend(sent)
                finally:
                    leave(tokens)
                stream.add(item)
                try:
                    sent = yield item
                except GeneratorExit:
                    raise
                except BaseException as thrown_in:
                    to_throw = thrown_in
                    sent = None
        except StopAsyncIteration:
            stream.finish(None)
            return
        except GeneratorExit as closing:
            try:
                tokens = enter()
                try:
                    await inner.aclose()
                finally:
                    leave(tokens)
            except BaseException as exc:
                stream.finish(exc)
                raise
            stream.finish(closing)
            raise
        except BaseException as exc:
            stream.finish(exc)
            raise

    return wrapper


def _decorate(kind: str, func: Any, name: str | None, input_name: str | None, output: Any) -> Any:
    if isinstance(func, (classmethod, staticmethod)):
        wrapped = _decorate(kind, func.__func__, name, input_name, output)
        return type(func)(wrapped)
    if not callable(func):
        raise TypeError(f"ragtrace.{kind} decorates a function, got {func!r}")
    spec = _Spec(kind, func, name, input_name, output)
    if inspect.isasyncgenfunction(func):
        return _wrap_async_generator(func, spec)
    if inspect.isgeneratorfunction(func):
        return _wrap_generator(func, spec)
    if inspect.iscoroutinefunction(func):
        return _wrap_async(func, spec)
    return _wrap_sync(func, spec)


def _decorator(
    kind: str,
    func: Any,
    name: str | None,
    input_name: str | None,
    output: Callable[[Any], Any] | None,
) -> Any:
    if func is None:
        return lambda f: _decorate(kind, f, name, input_name, output)
    return _decorate(kind, func, name, input_name, output)


@overload
def rag(func: _F, /) -> _F: ...
@overload
def rag(
    func: None = None,
    /,
    *,
    name: str | None = None,
    input: str | None = None,
    output: Callable[[Any], Any] | None = None,
) -> Callable[[_F], _F]: ...
def rag(
    func: Any = None,
    /,
    *,
    name: str | None = None,
    input: str | None = None,
    output: Callable[[Any], Any] | None = None,
) -> Any:
    """Trace a RAG request: one ``CHAIN`` span per call, an evaluation case for the
    collector.  Inside :func:`ragtrace.session` it is one turn of the conversation.

    ``name``: span name (default: the function's qualified name).  ``input``: the
    argument holding the user input (default: an argument named query, question, input,
    prompt or message, else the first ``str`` argument).  ``output``: extracts the
    answer from the return value (for a generator: from each yielded item).
    """
    return _decorator(semconv.KIND_RAG, func, name, input, output)


@overload
def retriever(func: _F, /) -> _F: ...
@overload
def retriever(
    func: None = None,
    /,
    *,
    name: str | None = None,
    input: str | None = None,
    output: Callable[[Any], Any] | None = None,
) -> Callable[[_F], _F]: ...
def retriever(
    func: Any = None,
    /,
    *,
    name: str | None = None,
    input: str | None = None,
    output: Callable[[Any], Any] | None = None,
) -> Any:
    """Trace a retrieval: the returned documents become ``retrieval.documents.N.*``.

    ``output`` extracts the documents from the return value (e.g. ``lambda r: r.hits``).
    """
    return _decorator(semconv.KIND_RETRIEVER, func, name, input, output)


@overload
def reranker(func: _F, /) -> _F: ...
@overload
def reranker(
    func: None = None,
    /,
    *,
    name: str | None = None,
    input: str | None = None,
    output: Callable[[Any], Any] | None = None,
) -> Callable[[_F], _F]: ...
def reranker(
    func: Any = None,
    /,
    *,
    name: str | None = None,
    input: str | None = None,
    output: Callable[[Any], Any] | None = None,
) -> Any:
    """Trace a reranking: input documents (an argument named documents, docs, nodes,
    contexts, candidates, passages, chunks, results or hits, else the first list
    argument) become ``reranker.input_documents.N.*``, the returned ones
    ``reranker.output_documents.N.*``."""
    return _decorator(semconv.KIND_RERANKER, func, name, input, output)


@overload
def generator(func: _F, /) -> _F: ...
@overload
def generator(
    func: None = None,
    /,
    *,
    name: str | None = None,
    input: str | None = None,
    output: Callable[[Any], Any] | None = None,
) -> Callable[[_F], _F]: ...
def generator(
    func: Any = None,
    /,
    *,
    name: str | None = None,
    input: str | None = None,
    output: Callable[[Any], Any] | None = None,
) -> Any:
    """Trace answer generation (an ``LLM`` span).  A ``model``/``model_name`` argument
    is recorded as ``llm.model_name`` and ``gen_ai.request.model``."""
    return _decorator(semconv.KIND_GENERATOR, func, name, input, output)
