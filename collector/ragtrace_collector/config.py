"""The collector's configuration: one YAML file, validated by pydantic.

``load_config(path)`` reads YAML, replaces ``${VAR}`` and ``${VAR:-default}`` in every
string value with the environment (``$${`` escapes a literal ``${``), and validates the
result against :class:`CollectorConfig`.  Every model forbids unknown keys; a typo gets
a "did you mean" hint.  Any problem raises :class:`ConfigError`, whose ``problems`` each
name the key (dotted path) and what is wrong with it.

Durations accept a number of seconds or a string with a unit (``250ms``, ``2s``,
``5m``, ``1h``); sizes accept a number of bytes or a string (``512KiB``, ``16MiB``,
``1GB``).  With no file at all, the defaults give a working collector: OTLP receivers
on 127.0.0.1:4317/4318, admin on 127.0.0.1:8888, spans written to
``ragtrace-spans.jsonl``.

Each section's model lives next to the component it configures (``receivers/config.py``,
``exporters/config.py``, ``evaluation/config.py``, ``storage/config.py``, ...); this module
only composes them into :class:`CollectorConfig` and loads the file.  To add a section,
write its model beside its code, deriving from
:class:`~ragtrace_collector.configbase.StrictModel` (unknown keys are errors), and add a
field here.
"""

from __future__ import annotations

import difflib
import os
import re
import types
import typing
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from ragtrace_collector.admin.config import AdminConfig
from ragtrace_collector.alerts.config import AlertsConfig
from ragtrace_collector.assembly.config import AssemblyConfig
from ragtrace_collector.component.config import LoggingConfig
from ragtrace_collector.component.redaction import redact, url_secrets
from ragtrace_collector.configbase import Duration, StrictModel
from ragtrace_collector.evaluation.case_builder import CasesConfig
from ragtrace_collector.evaluation.config import EvaluationConfig
from ragtrace_collector.evaluation.enrichment import EnrichmentConfig
from ragtrace_collector.evaluation.sampling import SamplingConfig
from ragtrace_collector.exporters.config import (
    ExporterConfig,
    PhoenixExporterConfig,
    default_exporters,
)
from ragtrace_collector.feedback.config import FeedbackConfig
from ragtrace_collector.judges.config import JudgeConfig
from ragtrace_collector.metrics import OFFLINE_METRICS, MetricOptions
from ragtrace_collector.metrics.config import MetricName, expand_include_defaults
from ragtrace_collector.receivers.config import ReceiversConfig
from ragtrace_collector.segments import SegmentsConfig
from ragtrace_collector.storage.config import StorageConfig
from ragtrace_collector.stores.reference import ReferenceStoreConfig
from ragtrace_collector.stores.session import SessionStoreConfig

__all__ = [
    "CollectorConfig",
    "ConfigError",
    "ShutdownConfig",
    "describe_errors",
    "load_config",
    "parse_config",
]


# The process's own section: the deadlines of its shutdown sequence, which spans
# every stage (receivers, processor, exporters, the spill file), so it belongs to none.
class ShutdownConfig(StrictModel):
    """Deadlines of the graceful shutdown (SIGTERM, SIGINT)."""

    #: In-flight requests may finish within this after the receivers stop.
    receiver_grace: Duration = 5.0
    #: The trace processor may finish held traces within this; then they go out as is.
    processor_timeout: Duration = 10.0
    #: Exporters may deliver their queues within this; what remains is counted dropped.
    flush_timeout: Duration = 20.0
    #: Without a write-ahead log (``storage.directory``): spans undelivered at the
    #: deadline are appended here as OTLP/JSON lines (the file exporter's format);
    #: ``ragtrace-collector replay FILE --endpoint URL`` sends them again.
    spill_path: Path | None = None


class ConfigError(ValueError):
    """The configuration is invalid; ``problems`` has one line per problem.

    ``partial`` is the configuration built from the top-level sections that are valid
    (the others at their defaults) and ``failed_sections`` names the others, so that
    ``check-config`` can run the checks of :mod:`ragtrace_collector.service.preflight` on what
    is valid and report everything in one pass.  ``partial`` is None when no such
    configuration could be built."""

    def __init__(
        self,
        problems: Sequence[str],
        source: str = "config",
        *,
        partial: CollectorConfig | None = None,
        failed_sections: frozenset[str] = frozenset(),
    ) -> None:
        self.problems = list(problems)
        self.source = source
        self.partial = partial
        self.failed_sections = failed_sections
        super().__init__(self.render())

    def render(self) -> str:
        lines = [f"{self.source}: invalid configuration"]
        # A problem may quote a URL with credentials: redacted like the logs.
        lines += [f"  - {redact(p)}" for p in self.problems]
        return "\n".join(lines)


# -------------------------------------------------------------------- sections


class CollectorConfig(StrictModel):
    """The root of ``collector.yaml``."""

    receivers: ReceiversConfig = Field(
        default_factory=ReceiversConfig,
        description="Where spans come in: OTLP/gRPC and OTLP/HTTP, optional auth and TLS.",
    )
    assembly: AssemblyConfig = Field(
        default_factory=AssemblyConfig,
        description="Grouping spans into traces: when a trace is ready, memory bounds.",
    )
    exporters: dict[str, ExporterConfig] = Field(
        default_factory=default_exporters,
        description="Where spans go, evaluated or not: exporters under names you choose, "
        "each of the kind set by its `type`.  At least one.",
    )
    #: The judge answering the LLM metrics: ``offline`` or a litellm model string.
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    metrics: Annotated[
        dict[MetricName, MetricOptions] | None, BeforeValidator(expand_include_defaults)
    ] = Field(
        None,
        description="Metric name (docs/metrics.md) -> options.  Unset: the default set "
        f"({', '.join(OFFLINE_METRICS)}).  Listing metrics replaces the default set; "
        "add `include_defaults: true` to add yours to it.",
    )
    evaluation: EvaluationConfig = Field(
        default_factory=EvaluationConfig,
        description="Evaluation workers, queue and deadlines; `enabled: false` makes the "
        "collector a plain OTLP pass-through.",
    )
    cases: CasesConfig = Field(
        default_factory=CasesConfig,
        description="Which spans become evaluation cases: ragtrace `@rag` spans, else the "
        "outermost CHAIN/AGENT/workflow span with a retriever below it (OpenInference, OTel "
        "GenAI, OpenLLMetry); matchers and attributes to override that.",
    )
    sampling: SamplingConfig = Field(
        default_factory=SamplingConfig,
        description="Which traces are evaluated: a consistent hash of the trace id (the "
        "session id for conversations) against a rate, rules and budgets.",
    )
    #: Ground truth from a JSONL or YAML file, matched on the request input.
    reference_store: ReferenceStoreConfig | None = None
    session_store: SessionStoreConfig = Field(
        default_factory=SessionStoreConfig,
        description="Earlier turns of each conversation, for the turn metrics: in memory "
        "(one process) or in Redis (several replicas).",
    )
    enrichment: EnrichmentConfig = Field(
        default_factory=EnrichmentConfig,
        description="How results are written onto spans (flat keys, OpenInference, "
        "GenAI events) and on which span.",
    )
    segments: SegmentsConfig = Field(
        default_factory=list,
        description="Attribute keys (e.g. `service.version`, `app.index_version`) whose values "
        "label the score metrics and split the drop detector's series: a key, or "
        "`{key, max_values}` (default 20 values; the rest count as `other`, a case without "
        "the attribute as `unset`).  Read from the case span, its resource, then its "
        "retriever spans.  See docs/alerting.md.",
    )
    alerts: AlertsConfig = Field(
        default_factory=AlertsConfig,
        description="The built-in drop detector: rules and notifiers.  May also be a "
        "bare list of rules.",
    )
    admin: AdminConfig = Field(
        default_factory=AdminConfig,
        description="The admin HTTP port: `/metrics` (Prometheus), `/healthz`, `/readyz`.",
    )
    logging: LoggingConfig = Field(
        default_factory=LoggingConfig, description="The collector's structlog output."
    )
    shutdown: ShutdownConfig = Field(
        default_factory=ShutdownConfig,
        description="Deadlines of the graceful shutdown on SIGTERM or SIGINT.",
    )
    storage: StorageConfig = Field(
        default_factory=StorageConfig,
        description="The write-ahead log: with `directory` set, every accepted request is "
        "on disk before it is acknowledged, and replayed after a crash.",
    )
    feedback: FeedbackConfig = Field(
        default_factory=FeedbackConfig,
        description="User feedback joined to the scores of its request, and how well each "
        "metric predicts it (docs/feedback.md).",
    )

    @field_validator("exporters")
    @classmethod
    def _some_exporter(cls, value: dict[str, ExporterConfig]) -> dict[str, ExporterConfig]:
        if not value:
            raise ValueError("at least one exporter is required (spans must go somewhere)")
        return value

    @model_validator(mode="after")
    def _rules_use_segments(self) -> CollectorConfig:
        keys = {k.key for k in self.segments}
        for rule in self.alerts.rules:
            for key in rule.segment_keys:
                if key not in keys:
                    raise ValueError(
                        f"alerts rule {rule.name!r}: {key!r} is not one of the `segments:` "
                        f"keys ({', '.join(sorted(keys)) or 'none configured'})"
                    )
        return self

    @model_validator(mode="after")
    def _phoenix_needs_flat_keys(self) -> CollectorConfig:
        for name, exporter in self.exporters.items():
            if isinstance(exporter, PhoenixExporterConfig) and not self.enrichment.flat:
                raise ValueError(
                    f"exporters.{name}: the phoenix exporter reads the results from the "
                    "ragtrace.eval.* attributes, which enrichment.flat: false turns off"
                )
        return self

    def secrets(self) -> list[str]:
        """Values that must never appear in logs: tokens, header values, the judge's API
        key, and the credentials inside every URL the config holds."""
        found = [t.get_secret_value() for t in self.receivers.auth.bearer_tokens]
        urls: list[str | None] = [self.session_store.url, self.judge.api_base]
        for exporter in self.exporters.values():
            found += exporter.secrets()
            urls.append(exporter.secret_url())
        for notifier in (self.alerts.webhook, self.alerts.alertmanager):
            if notifier is not None:
                found += list(notifier.headers.values())
                urls += [notifier.url, getattr(notifier, "generator_url", None)]
        try:
            found.append(self.judge.api_key() or "")
        except ValueError:
            pass  # an unset key variable is reported when the judge is built
        for url in urls:
            found += url_secrets(url)
        return [s for s in found if s]


# ------------------------------------------------------------ env interpolation
_ENV_RE = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{")


_Loc = tuple[str | int, ...]


def _interpolate(
    value: Any, env: Mapping[str, str], path: _Loc, problems: list[tuple[_Loc, str]]
) -> Any:
    """``value`` with every ``${...}`` replaced; each bad reference (every one, not
    only the first) is added to ``problems`` and left as written."""
    if isinstance(value, str):
        return _interpolate_str(value, env, path, problems)
    if isinstance(value, dict):
        return {k: _interpolate(v, env, (*path, str(k)), problems) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env, (*path, i), problems) for i, v in enumerate(value)]
    return value


def _interpolate_str(
    text: str, env: Mapping[str, str], path: _Loc, problems: list[tuple[_Loc, str]]
) -> str:
    if "${" not in text:
        return text

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$${":
            return "${"
        name, default = m.group(1), m.group(2)
        if name is None:
            problems.append(
                (
                    path,
                    f"{_dotted(path)}: malformed ${{...}} reference in {text!r} "
                    "(use ${NAME} or ${NAME:-default}; write $${ for a literal ${)",
                )
            )
            return m.group(0)
        value = env.get(name)
        if value is None or (value == "" and default is not None):
            if default is None:
                problems.append(
                    (
                        path,
                        f"{_dotted(path)}: environment variable {name} is not set "
                        f"(write ${{{name}:-default}} to give a default)",
                    )
                )
                return m.group(0)
            return default
        return value

    return _ENV_RE.sub(sub, text)


def _dotted(path: Sequence[str | int]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out or "(top level)"


# ------------------------------------------------------------------ validation
def parse_config(
    data: Any, *, env: Mapping[str, str] | None = None, source: str = "config"
) -> CollectorConfig:
    """Validate already-parsed YAML data (``None`` means defaults)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            [f"(top level): expected a mapping of sections, got {type(data).__name__}"], source
        )
    env_problems: list[tuple[_Loc, str]] = []
    data = _interpolate(data, os.environ if env is None else env, (), env_problems)
    problems = [text for _loc, text in env_problems]
    # A key whose ${VAR} is unset is not validated as well: its error would be noise.
    unset = [loc for loc, _text in env_problems]
    try:
        config = CollectorConfig.model_validate(data)
    except ValidationError as exc:
        described = describe_errors(exc)
        problems += [text for loc, text in described if not any(_under(loc, u) for u in unset)]
        failed = {str(loc[0]) for loc, _text in described if loc}
    else:
        if not problems:
            return config
        failed = set()
    failed |= {str(loc[0]) for loc in unset if loc}
    raise ConfigError(
        problems,
        source,
        partial=_partial_config(data, failed),
        failed_sections=frozenset(failed),
    ) from None


def _under(loc: Sequence[str | int], prefix: Sequence[str | int]) -> bool:
    return tuple(loc[: len(prefix)]) == tuple(prefix)


def _partial_config(data: dict[str, Any], failed: set[str]) -> CollectorConfig | None:
    """The config of the valid top-level sections (the failed ones at their defaults)."""
    valid = {k: v for k, v in data.items() if k not in failed and k in CollectorConfig.model_fields}
    evaluation = data.get("evaluation")
    if "evaluation" in failed and isinstance(evaluation, dict):
        enabled = evaluation.get("enabled")
        if isinstance(enabled, bool):  # whether serve would build the evaluation stage
            valid["evaluation"] = {"enabled": enabled}
    try:
        return CollectorConfig.model_validate(valid)
    except ValidationError:
        return None


def load_config(
    path: Path | None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> CollectorConfig:
    """Read, interpolate and validate ``path``; ``None`` gives the defaults.

    ``overrides`` maps dotted keys (``receivers.http.endpoint``) to values that
    replace the file's (``serve --set``, ``--http-endpoint``...)."""
    if path is None:
        return parse_config(_override({}, overrides), env=env, source="(defaults)")
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(["file not found"], source) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"cannot read the file: {exc}"], source) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([f"YAML syntax error at {where}{problem}"], source) from None
    if overrides and (data is None or isinstance(data, dict)):
        data = _override(data or {}, overrides)
    return parse_config(data, env=env, source=source)


def _override(data: dict[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """``data`` with each dotted key of ``overrides`` set (sections made as needed)."""
    for dotted, value in (overrides or {}).items():
        *parents, last = dotted.split(".")
        node = data
        for i, part in enumerate(parents):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(parents[: i + 1])
                raise ConfigError([f"{dotted}: cannot set it, {where} is not a section"])
            node = child
        node[last] = value
    return data


def describe_errors(
    exc: ValidationError, model: Any = CollectorConfig, at: Sequence[str | int] = ()
) -> list[tuple[list[str | int], str]]:
    """Each problem of ``exc`` (raised validating ``model``) as one line that names its
    dotted key and what is wrong, in plain words; an unknown key gets the key it is
    close to ("did you mean"), at any depth.  ``at`` is where ``model`` sits in the
    file (``evaluation.metric_defaults`` for :class:`MetricOptions` checked on their
    own).  Returns (the key's path, the line) pairs."""
    described: list[tuple[list[str | int], str]] = []
    for error in exc.errors(include_url=False):
        path, parent, node = _walk(model, error["loc"])
        loc = [*at, *path]
        described += [(loc, line) for line in _error_lines(error, loc, parent, node)]
    return described


#: Pydantic error types, in plain words: what the key expects.
_EXPECTED: dict[str, str] = {
    "int_parsing": "a whole number",
    "int_type": "a whole number",
    "int_from_float": "a whole number",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "text (a string)",
    "dict_type": "a mapping (key: value lines)",
    "model_type": "a mapping (key: value lines)",
    "model_attributes_type": "a mapping (key: value lines)",
    "list_type": "a list",
    "path_type": "a file path (text)",
}
#: Keys whose values are never echoed in an error (they may hold credentials).
_SECRET_KEY = re.compile(r"token|key|secret|password|header|auth", re.IGNORECASE)


def _shown(value: Any, loc: Sequence[str | int]) -> str:
    """The offending value, for an error line: short, and never a secret."""
    kind = {dict: "a mapping", list: "a list", type(None): "nothing (null)"}.get(type(value))
    if kind is not None:
        return kind
    if any(isinstance(p, str) and _SECRET_KEY.search(p) for p in loc):
        return f"a value of type {type(value).__name__} (not shown: it may be a secret)"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _error_lines(error: Any, loc: list[str | int], parent: Any, node: Any) -> list[str]:
    """The lines of one pydantic error at ``loc``; ``parent`` is the type holding its
    last key and ``node`` the type at ``loc`` (see :func:`_walk`)."""
    key = _dotted(loc)
    kind = error["type"]
    if kind == "extra_forbidden":
        return [_unknown_key(loc, _keys(parent))]
    if kind == "missing":
        return [f"{key}: required key is missing"]
    if kind in ("union_tag_invalid", "union_tag_not_found") and isinstance(node, _Tagged):
        return _union_tag_lines(error, loc, node)
    if kind in _EXPECTED:
        return [f"{key}: expected {_EXPECTED[kind]}, got {_shown(error['input'], loc)}"]
    if kind == "literal_error":
        choices = error.get("ctx", {}).get("expected", "")
        return [f"{key}: expected {choices}, got {_shown(error['input'], loc)}"]
    msg = error["msg"].removeprefix("Value error, ")
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        msg += f", got {_shown(error['input'], loc)}"
    return [f"{key}: {msg}"]


def _union_tag_lines(error: Any, loc: list[str | int], union: _Tagged) -> list[str]:
    """A discriminated union whose tag (``type``, ``kind``) is missing or unknown.

    Without a known tag pydantic checks none of the other keys, so each key that no
    member has is reported here too: ``typ: file`` gets "did you mean 'type'?", not
    only "type is missing"."""
    tags = list(union.members)
    expected = ", ".join(repr(t) for t in tags)
    where = _dotted([*loc, union.field])
    if error["type"] == "union_tag_not_found":
        lines = [f"{where}: required key is missing (one of: {expected})"]
    else:
        tag = str(error.get("ctx", {}).get("tag", ""))
        close = _closest(tag, tags)
        hint = f"did you mean {close!r}?" if close else f"one of: {expected}"
        lines = [f"{where}: unknown value {tag!r} ({hint})"]
    given = error["input"] if isinstance(error["input"], Mapping) else {}
    known = _keys(union)
    lines += [_unknown_key([*loc, str(k)], known) for k in given if str(k) not in known]
    return lines


def _unknown_key(loc: Sequence[str | int], known: Collection[str]) -> str:
    """The line for an unknown key: the known key it is close to, else the keys
    allowed there.  Every unknown key, at every depth, is worded here."""
    close = _closest(str(loc[-1]), known)
    if close:
        hint = f" (did you mean {close!r}?)"
    elif known:
        hint = f" (expected one of: {', '.join(sorted(known))})"
    else:
        hint = ""
    return f"{_dotted(loc)}: unknown key{hint}"


def _closest(word: str, choices: Collection[str]) -> str | None:
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return close[0] if close else None


# The walk from a pydantic error's location to the models it passes through.
@dataclass(frozen=True)
class _Tagged:
    """A discriminated union of models: the member is named by the value of ``field``."""

    field: str
    members: dict[str, type[BaseModel]]


def _walk(model: Any, loc: Sequence[str | int]) -> tuple[list[str | int], Any, Any]:
    """``loc`` as the file spells it, without what pydantic inserts (the tag of a
    discriminated union's member, ``[key]`` for a mapping's key), with the type that
    holds its last key and the type at ``loc`` (None where they cannot be told)."""
    path: list[str | int] = []
    parent = node = _resolve(model)
    for part in loc:
        if part == "[key]":  # a mapping's key failed its own validation (a metric name)
            continue
        if isinstance(node, _Tagged) and part in node.members:
            node = node.members[part]
            continue
        path.append(part)
        parent, node = node, _child(node, part)
    return path, parent, node


def _resolve(tp: Any, discriminator: str | None = None) -> Any:
    """``tp`` without ``Annotated`` and ``None``: a model, a container type, a
    discriminated union as :class:`_Tagged`, or None for any other union."""
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp, *extras = get_args(tp)
            for extra in extras:
                if isinstance(getattr(extra, "discriminator", None), str):
                    discriminator = extra.discriminator
            continue
        if origin in (Union, types.UnionType):
            args = [a for a in get_args(tp) if a is not type(None)]
            if len(args) == 1:
                tp = args[0]
                continue
            if discriminator is None:
                return None
            members = {_tag(a, discriminator): a for a in args if _is_model(a)}
            return _Tagged(discriminator, {t: m for t, m in members.items() if t is not None})
        return tp


def _child(node: Any, part: str | int) -> Any:
    """The type of ``part`` in ``node``: a model's field (by name or alias), a mapping's
    value, a list's item."""
    if _is_model(node):
        for name, info in node.model_fields.items():
            if part in (name, info.alias):
                hint = typing.get_type_hints(node, include_extras=True).get(name, info.annotation)
                tag = info.discriminator if isinstance(info.discriminator, str) else None
                return _resolve(hint, tag)
        return None
    origin = get_origin(node)
    if origin in (dict, Mapping):
        return _resolve(get_args(node)[1])
    if origin in (list, tuple, Sequence):
        return _resolve(get_args(node)[0])
    return None


def _keys(node: Any) -> set[str]:
    """The keys allowed in the mapping ``node`` describes, as the file spells them (an
    alias such as ``for`` rather than ``for_``); every member's for a union."""
    models = node.members.values() if isinstance(node, _Tagged) else [node]
    return {
        info.alias or name
        for model in models
        if _is_model(model)
        for name, info in model.model_fields.items()
    }


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _tag(model: type[BaseModel], field: str) -> str | None:
    """The one value ``model``'s ``field`` may take (its ``Literal``), if it has one."""
    info = model.model_fields.get(field)
    values = get_args(info.annotation) if info is not None else ()
    return str(values[0]) if len(values) == 1 else None
