"""The LLM judge: judge tasks answered by any model litellm can call.

One :meth:`LLMJudge.ask`:

1. renders the task's template (``prompting``), untrusted text fenced;
2. returns a cached answer for an identical rendered prompt (same model and
   parameters), or joins an identical call already in flight;
3. calls ``litellm.acompletion`` under the instance's concurrency limit, with a
   per-call timeout and our own retry policy (429, 5xx and connection errors, with
   exponential backoff, jitter and ``Retry-After``; litellm's ``num_retries`` is 0);
   The answer's size is bounded on the wire, before anything parses it (for models
   served through the OpenAI client: OpenAI and any OpenAI-compatible server): the
   HTTP client refuses a body over ``answer_byte_limit(judge.max_answer_chars)``
   bytes as soon as it is announced (Content-Length) or read, and any compressed
   body (it asks for ``identity``; a compressed one could inflate without bound).  A
   refusal is a ``JudgeError("invalid_response")`` on the metric, never retried;
   without it, the client would parse a 10 MB JSON body on the event loop;
4. parses the answer as one JSON object (local repair of fences, prose, trailing
   commas, Python literals), validates it strictly against the task's response
   model (extra keys and wrong types rejected) and ``task.check``;
5. on an invalid answer asks exactly once more, quoting the validation error, then
   raises ``JudgeError("invalid_response")``.  It never guesses.

A caller may be cancelled (the collector's per-metric timeout does that).  The call
lives as long as at least one caller still waits for it; when the last one gives up,
the call is cancelled too, wherever it is (waiting for a slot, on the wire, or in a
retry's backoff), its concurrency slot is freed at once and nothing is cached for it.
The cost of a shared call goes to the first caller still there to receive it.

Tokens and USD come from litellm's cost data; an unknown price is ``None``, never 0.
Every HTTP attempt and every cache hit is reported to ``on_call`` as a
:class:`JudgeCallRecord`; an attempt cut off because nobody waits for it any more is
reported with outcome ``"cancelled"`` (not as an error of the model).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import functools
import hashlib
import importlib
import json
import os
import random
import ssl
import time
import warnings
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import httpx
import structlog
from pydantic import BaseModel, ValidationError

from ragtrace_collector.component.logs import hold_third_party_loggers, redact
from ragtrace_collector.judges.base import (
    JudgeAnswer,
    JudgeCallRecord,
    JudgeError,
    JudgeErrorKind,
    JudgeTask,
    R,
)
from ragtrace_collector.judges.cache import LRUCache
from ragtrace_collector.judges.config import JudgeConfig
from ragtrace_collector.judges.prompting import PromptError, PromptLibrary, RenderedPrompt
from ragtrace_collector.judges.repair import parse_json_object
from ragtrace_collector.results import Cost

__all__ = ["JudgeStats", "LLMJudge", "answer_byte_limit"]

_log = structlog.get_logger(__name__)

_MAX_ECHO_CHARS = 4000
_MAX_PROBLEM_CHARS = 600
#: The most bytes JSON takes for one character of the answer text: a character outside
#: the Basic Multilingual Plane (one ``str`` character) escaped as a surrogate pair,
#: ``\ud83d\ude00``.
_BYTES_PER_ANSWER_CHAR = 12
#: Room for the rest of a chat completion: ids, usage, choices, headers of JSON.
_ANSWER_ENVELOPE_BYTES = 64 * 1024


def answer_byte_limit(max_answer_chars: int) -> int:
    """The largest HTTP answer body read from the judge: one holding an answer of
    ``max_answer_chars`` characters, however it is escaped, plus its envelope."""
    return max_answer_chars * _BYTES_PER_ANSWER_CHAR + _ANSWER_ENVELOPE_BYTES


@dataclass
class JudgeStats:
    """Counters of one judge instance (for benchmarks, tests and debugging)."""

    #: ask() calls.
    requests: int = 0
    #: Answers served from the cache or from an identical call in flight.
    cache_hits: int = 0
    #: Of those, answers shared with an identical call in flight.
    shared_in_flight: int = 0
    #: HTTP completions attempted (including failed and retried ones).
    http_calls: int = 0
    #: HTTP attempts repeated after 429, 5xx or a connection error.
    http_retries: int = 0
    #: Second calls made because the first answer failed validation.
    validation_retries: int = 0
    #: Answers that needed local JSON repair.
    repaired: int = 0
    #: Calls cancelled because every caller waiting for them was cancelled.
    abandoned: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class _Flight:
    """One call in flight and the callers waiting for it."""

    task: asyncio.Task[tuple[BaseModel, Cost]]
    #: Callers awaiting ``task`` right now; at 0 (all cancelled) the call is cancelled.
    waiters: int = 0
    #: Whether a caller has been handed the call's cost (it is charged once).
    charged: bool = False
    #: Cancelled because nobody waits any more: its outcome is never cached.
    abandoned: bool = False


@dataclass
class _LoopState:
    loop: asyncio.AbstractEventLoop
    semaphore: asyncio.Semaphore
    inflight: dict[str, _Flight] = field(default_factory=dict)
    #: The OpenAI client with the bounded HTTP client, handed to litellm as ``client``
    #: (its connections belong to this loop); None when the model does not go
    #: through the OpenAI client.
    client: Any = None


class _InvalidAnswer(Exception):
    """The answer is not a valid response; the message is what to tell the model."""


class _AnswerRefused(Exception):
    """The judge's HTTP answer was refused unread: too large, or compressed."""


class _BoundedStream(httpx.AsyncByteStream):
    """An answer body that raises :class:`_AnswerRefused` past ``limit`` bytes."""

    def __init__(self, inner: httpx.AsyncByteStream, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        async for chunk in self._inner:
            size += len(chunk)
            if size > self._limit:
                raise _AnswerRefused(f"answer body over {self._limit} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


def _bounded_http_client(openai: Any, limit: int, tls: ssl.SSLContext) -> httpx.AsyncClient:
    """The OpenAI client's default HTTP client (its timeouts, pool limits, redirects
    and environment proxies), refusing any answer body over ``limit`` bytes."""

    async def plain(request: httpx.Request) -> None:
        request.headers["Accept-Encoding"] = "identity"

    async def bound(response: httpx.Response) -> None:
        encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise _AnswerRefused(f"compressed answer body (Content-Encoding: {encoding[:40]})")
        announced = response.headers.get("Content-Length", "")
        if announced.isdigit() and int(announced) > limit:
            raise _AnswerRefused(f"answer body of {announced} bytes, over {limit} bytes")
        stream = response.stream
        if isinstance(stream, httpx.AsyncByteStream):
            response.stream = _BoundedStream(stream, limit)

    client: httpx.AsyncClient = openai.DefaultAsyncHttpxClient(
        verify=tls, event_hooks={"request": [plain], "response": [bound]}
    )
    return client


def _refusal(exc: BaseException) -> _AnswerRefused | None:
    """The :class:`_AnswerRefused` behind what the OpenAI client and litellm raised."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, _AnswerRefused):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


class LLMJudge:
    """A :class:`~ragtrace_collector.judges.base.Judge` backed by ``litellm.acompletion``."""

    def __init__(
        self,
        config: JudgeConfig,
        *,
        on_call: Callable[[JudgeCallRecord], None] | None = None,
        prompts: PromptLibrary | None = None,
    ) -> None:
        if config.is_offline:
            raise ValueError("LLMJudge needs a litellm model string, not 'offline'")
        self._config = config
        self._prompts = prompts if prompts is not None else PromptLibrary(config.prompt_dir)
        self._api_key = config.api_key()
        self._litellm = _import_litellm()
        named = _provider(self._litellm, config.model)
        self._json_mode = config.json_mode and _supports_json_mode(self._litellm, named)
        self._via_openai_client = named is not None and named[1] == "openai"
        # Loading the CA bundle takes tens of milliseconds: here, not on the loop when
        # each loop's client is built.
        self._tls = httpx.create_ssl_context() if self._via_openai_client else None
        self._cache: LRUCache[BaseModel] = LRUCache(config.cache_size)
        self._on_call = on_call
        self._listener_failed = False
        self._state: _LoopState | None = None
        self.stats = JudgeStats()

    # ------------------------------------------------------------- protocol
    @property
    def model(self) -> str:
        return self._config.model

    @property
    def heuristic(self) -> bool:
        return False

    @property
    def config(self) -> JudgeConfig:
        return self._config

    @property
    def json_mode(self) -> bool:
        """Whether calls ask for ``response_format={"type": "json_object"}``."""
        return self._json_mode

    def render(self, task: JudgeTask[Any]) -> RenderedPrompt:
        """The prompt ``ask`` would send for ``task`` (for inspection and tests)."""
        return self._prompts.render(task)

    def clear_cache(self) -> None:
        self._cache.clear()

    async def ask(self, task: JudgeTask[R]) -> JudgeAnswer[R]:
        self.stats.requests += 1
        try:
            prompt = self._prompts.render(task)
        except PromptError as exc:
            raise JudgeError("config", str(exc)) from None
        key = self._cache_key(task, prompt)

        cached = self._cache.get(key)
        if cached is not None:
            return self._hit(task, cached, shared=False)

        state = self._loop_state()
        flight = state.inflight.get(key)
        if flight is None:
            flight = _Flight(asyncio.ensure_future(self._answer(task, prompt)))
            state.inflight[key] = flight
            flight.task.add_done_callback(functools.partial(self._settle, state, key, flight))
        return await self._await_flight(task, state, key, flight)

    async def _await_flight(
        self, task: JudgeTask[R], state: _LoopState, key: str, flight: _Flight
    ) -> JudgeAnswer[R]:
        """Wait for ``flight`` as one of its callers; the last caller to be cancelled
        cancels the call."""
        flight.waiters += 1
        try:
            value, cost = await asyncio.shield(flight.task)
        except JudgeError as exc:
            if flight.charged:
                # Another caller of this call was told first and charged its cost.
                raise JudgeError(exc.kind, str(exc)) from None
            flight.charged = True
            raise
        finally:
            flight.waiters -= 1
            if flight.waiters == 0 and not flight.task.done():
                self._abandon(state, key, flight)
        if flight.charged:
            return self._hit(task, value, shared=True)
        flight.charged = True
        return JudgeAnswer(value=cast(R, value.model_copy(deep=True)), cost=cost)

    # --------------------------------------------------------------- caching
    def _cache_key(self, task: JudgeTask[Any], prompt: RenderedPrompt) -> str:
        cfg = self._config
        material = {
            "task": f"{type(task).__module__}.{type(task).__qualname__}",
            "model": cfg.model,
            "api_base": cfg.api_base,
            "temperature": cfg.temperature,
            "extra": cfg.extra_params,
            "messages": prompt.messages(),
        }
        blob = json.dumps(material, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()

    def _hit(self, task: JudgeTask[R], value: BaseModel, *, shared: bool) -> JudgeAnswer[R]:
        self.stats.cache_hits += 1
        if shared:
            self.stats.shared_in_flight += 1
        self._emit(
            JudgeCallRecord(
                model=self.model, task=task.task_name, outcome="cached", latency_s=0.0, cost_usd=0.0
            )
        )
        return JudgeAnswer(
            value=cast(R, value.model_copy(deep=True)),
            cost=Cost(cached_calls=1, usd=0.0),
            cached=True,
        )

    def _abandon(self, state: _LoopState, key: str, flight: _Flight) -> None:
        """Every caller of ``flight`` was cancelled: cancel the call itself, so that it
        frees its concurrency slot (and stops retrying) now.  A later identical request
        starts a new call instead of joining this dying one."""
        if state.inflight.get(key) is flight:
            del state.inflight[key]
        flight.abandoned = True
        self.stats.abandoned += 1
        flight.task.cancel()

    def _settle(
        self,
        state: _LoopState,
        key: str,
        flight: _Flight,
        done: asyncio.Future[tuple[BaseModel, Cost]],
    ) -> None:
        if state.inflight.get(key) is flight:
            del state.inflight[key]
        if done.cancelled():
            return
        # exception() also marks a failure as retrieved.
        if done.exception() is None and not flight.abandoned:
            value, _ = done.result()
            self._cache.put(key, value.model_copy(deep=True))

    def _loop_state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        if self._state is None or self._state.loop is not loop:
            self._state = _LoopState(
                loop, asyncio.Semaphore(self._config.concurrency), client=self._openai_client()
            )
        return self._state

    def _openai_client(self) -> Any:
        """An OpenAI client whose HTTP client bounds the answer's size, for litellm's
        ``client`` parameter; None for other providers, or when the client cannot be
        built here (litellm then builds its own and reports the problem)."""
        if self._tls is None:
            return None
        import openai

        cfg = self._config
        try:
            return openai.AsyncOpenAI(
                api_key=self._api_key or os.environ.get("OPENAI_API_KEY"),
                base_url=cfg.api_base,
                timeout=cfg.timeout_s,
                max_retries=0,
                http_client=_bounded_http_client(
                    openai, answer_byte_limit(cfg.max_answer_chars), self._tls
                ),
            )
        except openai.OpenAIError:
            return None

    # ------------------------------------------------------------ answering
    async def _answer(self, task: JudgeTask[Any], prompt: RenderedPrompt) -> tuple[BaseModel, Cost]:
        messages = prompt.messages()
        cost = Cost()
        for round_ in (1, 2):
            try:
                text, call_cost = await self._complete(messages, task.task_name)
            except JudgeError as exc:
                raise JudgeError(exc.kind, str(exc), cost=cost + exc.cost) from None
            cost = cost + call_cost
            limit = self._config.max_answer_chars
            if len(text) > limit:  # refused before any parsing: it would stall the loop
                _log.warning(
                    "judge_answer_too_large",
                    model=self.model,
                    task=task.task_name,
                    chars=len(text),
                    limit=limit,
                )
                raise JudgeError(
                    "invalid_response",
                    f"{task.task_name}: answer of {len(text)} characters exceeds "
                    f"judge.max_answer_chars ({limit})",
                    cost=cost,
                )
            try:
                return self._validate(task, text), cost
            except _InvalidAnswer as problem:
                if round_ == 2:
                    _log.warning(
                        "judge_invalid_response",
                        model=self.model,
                        task=task.task_name,
                        problem=str(problem),
                    )
                    raise JudgeError(
                        "invalid_response",
                        f"{task.task_name}: invalid answer after one retry: {problem}",
                        cost=cost,
                    ) from None
                self.stats.validation_retries += 1
                messages = [
                    *messages,
                    {"role": "assistant", "content": text[:_MAX_ECHO_CHARS]},
                    {"role": "user", "content": _retry_instruction(str(problem))},
                ]
        raise AssertionError("unreachable")  # pragma: no cover

    def _validate(self, task: JudgeTask[Any], text: str) -> BaseModel:
        try:
            obj, repaired = parse_json_object(text)
        except ValueError as exc:
            raise _InvalidAnswer(str(exc)) from None
        if repaired:
            self.stats.repaired += 1
        try:
            value = task.response_model.model_validate(obj, strict=True)
        except ValidationError as exc:
            raise _InvalidAnswer(_describe(exc)) from None
        problem = task.check(value)
        if problem is not None:
            raise _InvalidAnswer(problem)
        return value

    async def _complete(self, messages: list[dict[str, str]], task_name: str) -> tuple[str, Cost]:
        cfg = self._config
        attempt = 0
        json_fallback_used = False
        while True:
            state = self._loop_state()
            delay = 0.0
            async with state.semaphore:
                started = time.monotonic()
                self.stats.http_calls += 1
                try:
                    async with asyncio.timeout(cfg.timeout_s):
                        response = await self._litellm.acompletion(**self._params(messages))
                except (TimeoutError, self._litellm.Timeout):
                    self._record(task_name, "timeout", started)
                    raise JudgeError(
                        "timeout", f"{task_name}: no answer from {self.model} in {cfg.timeout_s}s"
                    ) from None
                except asyncio.CancelledError:
                    # Every caller gave up (or the loop is closing): not a model failure.
                    self._record(task_name, "cancelled", started)
                    raise
                except Exception as exc:
                    self._record(task_name, "error", started)
                    refused = _refusal(exc)
                    if refused is not None:
                        limit = answer_byte_limit(cfg.max_answer_chars)
                        _log.warning(
                            "judge_answer_too_large",
                            model=self.model,
                            task=task_name,
                            problem=str(refused),
                            limit_bytes=limit,
                        )
                        raise JudgeError(
                            "invalid_response",
                            f"{task_name}: {refused}; refused unread (judge.max_answer_chars "
                            f"{cfg.max_answer_chars} allows {limit} bytes)",
                        ) from None
                    if not json_fallback_used and self._json_mode and _rejects_json_mode(exc):
                        # A server that refuses response_format: ask without it.
                        _log.warning("judge_json_mode_unsupported", model=self.model)
                        self._json_mode = False
                        json_fallback_used = True
                        continue
                    kind, retryable = _classify(self._litellm, exc)
                    if not retryable or attempt >= cfg.max_retries:
                        suffix = f" after {attempt + 1} attempts" if attempt else ""
                        # The provider's text may quote api_base with its credentials.
                        message = redact(f"{task_name}: {_short(exc)}{suffix}")
                        raise JudgeError(kind, message) from None
                    delay = self._backoff(attempt, _retry_after(exc))
                    _log.info(
                        "judge_retry",
                        model=self.model,
                        task=task_name,
                        kind=kind,
                        attempt=attempt + 1,
                        delay_s=round(delay, 3),
                    )
                else:
                    return self._accept(response, task_name, started)
            attempt += 1
            self.stats.http_retries += 1
            await asyncio.sleep(delay)  # outside the semaphore: a waiting retry holds no slot

    def _params(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        cfg = self._config
        params: dict[str, Any] = {
            **cfg.extra_params,
            "model": cfg.model,
            "messages": messages,
            "temperature": cfg.temperature,
            "timeout": cfg.timeout_s,
            "num_retries": 0,
        }
        if cfg.api_base is not None:
            params["api_base"] = cfg.api_base
        if self._api_key is not None:
            params["api_key"] = self._api_key
        if self._json_mode:
            params["response_format"] = {"type": "json_object"}
        client = self._loop_state().client
        if client is not None:
            params["client"] = client
        return params

    def _accept(self, response: Any, task_name: str, started: float) -> tuple[str, Cost]:
        choices = getattr(response, "choices", None) or []
        message = getattr(choices[0], "message", None) if choices else None
        text = getattr(message, "content", None) or ""
        usage = getattr(response, "usage", None)
        prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
        usd = self._usd(response)
        self.stats.prompt_tokens += prompt_tokens
        self.stats.completion_tokens += completion_tokens
        self._record(task_name, "ok", started, prompt_tokens, completion_tokens, usd)
        cost = Cost(
            calls=1, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, usd=usd
        )
        return str(text), cost

    def _usd(self, response: Any) -> float | None:
        """The call's price from litellm's cost map; None when the model has none."""
        hidden = getattr(response, "_hidden_params", None) or {}
        usd = hidden.get("response_cost") if isinstance(hidden, dict) else None
        if usd is None:
            try:
                usd = self._litellm.completion_cost(completion_response=response, model=self.model)
            except Exception:
                return None
        try:
            value = float(usd)
        except (TypeError, ValueError):
            return None
        return value if value >= 0 else None

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        cfg = self._config
        if retry_after is not None:
            return min(max(retry_after, 0.0), cfg.backoff_max_s)
        ceiling = min(cfg.backoff_max_s, cfg.backoff_base_s * (2.0**attempt))
        return ceiling / 2 + random.uniform(0, ceiling / 2)

    # ------------------------------------------------------------ telemetry
    def _record(
        self,
        task_name: str,
        outcome: Literal["ok", "error", "timeout", "cancelled"],
        started: float,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        usd: float | None = None,
    ) -> None:
        self._emit(
            JudgeCallRecord(
                model=self.model,
                task=task_name,
                outcome=outcome,
                latency_s=time.monotonic() - started,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                cost_usd=usd,
            )
        )

    def _emit(self, record: JudgeCallRecord) -> None:
        if self._on_call is None:
            return
        try:
            self._on_call(record)
        except Exception:
            if not self._listener_failed:
                self._listener_failed = True
                _log.exception("judge_on_call_listener_failed")


# ---------------------------------------------------------------- helpers
_FIRST_CALL_MODULES = (
    "openai.resources",
    "litellm.proxy._types",
    "litellm._service_logger",
    "litellm.integrations.prometheus_services",
    # What a call with our own OpenAI client (the bounded HTTP client) loads on top:
    # httpx's connection machinery and the asyncio backend of anyio, and the modules
    # litellm's OpenAI path imports when it is handed a client.
    "httpcore",
    "h2.connection",
    "anyio._backends._asyncio",
    "litellm.llms.openai.chat.gpt_audio_transformation",
    "litellm.llms.vertex_ai.vertex_ai_partner_models.anthropic.transformation",
    "litellm.proxy.openai_files_endpoints.common_utils",
)


def _import_litellm() -> Any:
    """Import litellm quietly and offline (its cost map from the installed package)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    # litellm's own types trip a pydantic notice on first use; it is not ours to act on.
    warnings.filterwarnings(
        "ignore", message=r"Item '\w+' on TypedDict class 'ChatCompletion", category=UserWarning
    )
    litellm: Any = importlib.import_module("litellm")
    # Modules that litellm and the openai client (its transport for OpenAI and every
    # OpenAI-compatible server) import on first use: about 1.3 s that would otherwise
    # land on the event loop inside the first judge call.  Pay it now, with the rest.
    for module in _FIRST_CALL_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    litellm.suppress_debug_info = True
    # Message bodies are user data: keep them out of any litellm logging callback.
    litellm.turn_off_message_logging = True
    # Its import gave its loggers a handler of their own: route them through ours
    # (redacted) and hold them at WARNING unless logging.third_party_debug opts in.
    hold_third_party_loggers()
    return litellm


def _provider(litellm: Any, model: str) -> tuple[str, str] | None:
    """(model name, provider) as litellm resolves ``model``; None when it cannot."""
    try:
        name, provider, _, _ = litellm.get_llm_provider(model)
    except Exception:
        return None
    return str(name), str(provider)


def _supports_json_mode(litellm: Any, named: tuple[str, str] | None) -> bool:
    if named is None:
        return False
    try:
        params = litellm.get_supported_openai_params(model=named[0], custom_llm_provider=named[1])
    except Exception:
        return False
    return bool(params) and "response_format" in params


def _rejects_json_mode(exc: Exception) -> bool:
    status = getattr(exc, "status_code", None)
    return status in (400, 422) and "response_format" in str(exc)


def _classify(litellm: Any, exc: Exception) -> tuple[JudgeErrorKind, bool]:
    """(error kind, retryable) for an exception raised by ``acompletion``."""
    if isinstance(exc, litellm.RateLimitError):
        return "rate_limited", True
    if isinstance(exc, litellm.AuthenticationError | litellm.PermissionDeniedError):
        return "config", False
    if isinstance(exc, litellm.NotFoundError):
        return "config", False
    if isinstance(exc, litellm.APIConnectionError):
        return "api_error", True
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and status >= 500:
        return "api_error", True
    if status == 429:
        return "rate_limited", True
    return "api_error", False


def _retry_after(exc: Exception) -> float | None:
    """Seconds from a ``Retry-After`` (or ``retry-after-ms``) header on the error."""
    headers: Any = getattr(exc, "litellm_response_headers", None)
    if not headers:
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None)
    if not headers:
        return None
    try:
        lowered = {str(k).lower(): str(v) for k, v in headers.items()}
        millis = lowered.get("retry-after-ms")
        if millis is not None:
            return float(millis) / 1000.0
    except (AttributeError, TypeError, ValueError):
        return None
    value = lowered.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(str(value))
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_input=False, include_url=False):
        loc = ".".join(str(p) for p in error["loc"]) or "(root)"
        parts.append(f"{loc}: {error['msg']}")
    return _clip("; ".join(parts), _MAX_PROBLEM_CHARS)


def _retry_instruction(problem: str) -> str:
    return (
        "Your previous reply was rejected: "
        f"{_clip(problem, _MAX_PROBLEM_CHARS)}. "
        "Reply again with only the corrected JSON object: exactly the keys and types "
        "required, nothing before or after it."
    )


def _short(exc: Exception) -> str:
    return _clip(f"{type(exc).__name__}: {exc}", 500)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
