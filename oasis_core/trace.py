"""The OasisKV trace: a workload (requests with arrival times and lengths), optionally the configuration it ran
with and the results an executor measured. The format is documented in ``traces/SCHEMA.md``.

``load_trace(path)`` validates everything and raises ``TraceError`` -- and nothing else -- for any bad input, with
a one-line message naming the file, the record and the field and showing the bad value::

    trace.json: requests[12].output_tokens: must be >= 1, got 0

``save_trace(trace, path)`` writes a deterministic file (same trace, same bytes) that ``load_trace`` reads back to
an equal ``Trace``.
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass
from os import PathLike
from typing import Any, Dict, Iterable, Optional, Sequence, Tuple, Union

from .echo import show

SCHEMA_NAME = "oasiskv-trace"
SCHEMA_VERSION = 1

_INT64_MAX = 2**63 - 1
# The most tokens one request may hold (prompt or output): ~1.07 billion, 100x the longest context of any model
# preset; more is a corrupt trace, not a workload.
MAX_REQUEST_TOKENS = 2**30
_TOP_REQUIRED = ("schema", "version", "requests")
_TOP_OPTIONAL = ("meta", "config", "results")
_REQ_REQUIRED = ("id", "arrival_s", "prompt_tokens", "output_tokens")
_REQ_OPTIONAL = ("prefix_block_ids", "prefix_block_tokens")


class TraceError(ValueError):
    """A trace (or a source file an importer reads) is unreadable or invalid. ``str(err)`` is one line:
    ``<file>: <where>: <what is wrong>, got <value>``."""


class _Problem(Exception):
    """A validation failure at ``where`` (a field path relative to the object being checked)."""

    def __init__(self, where: str, text: str):
        super().__init__(where, text)
        self.where = where
        self.text = text


# ----------------------------------------------------------------------------------------------------------------
# Showing values in messages: as JSON, short, on one line.

_JSON_TYPE = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    tuple: "array",
    dict: "object",
    type(None): "null",
}


def _json_type(value) -> str:
    return _JSON_TYPE.get(type(value), type(value).__name__)


def _show(value, limit: int = 40) -> str:
    try:
        text = json.dumps(value, default=repr)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _show_typed(value) -> str:
    return f"{_show(value)} ({_json_type(value)})"


def _join(where: str, sub: str) -> str:
    if not where:
        return sub
    return f"{where}{sub}" if sub.startswith("[") else f"{where}.{sub}"


def _key(where: str, key) -> str:
    """``where.key``, or ``where["odd key"]`` when the key is not a plain name (keeps messages on one line)."""
    key = str(key)
    if key.isidentifier() and key.isascii():
        return _join(where, key)
    return f"{where}[{json.dumps(key)}]"


# ----------------------------------------------------------------------------------------------------------------
# Field checks: raise _Problem(field, text).


def _int_field(where: str, value, minimum: int, maximum: int = _INT64_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise _Problem(where, f"must be an integer, got {_show_typed(value)}")
    if value < minimum:
        raise _Problem(where, f"must be >= {minimum}, got {value}")
    if value > maximum:
        raise _Problem(where, f"must be <= {maximum}, got {_show(value)}")
    return int(value)


def _number_field(where: str, value, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _Problem(where, f"must be a number, got {_show_typed(value)}")
    if isinstance(value, numbers.Integral) and abs(value) > _INT64_MAX:
        raise _Problem(where, f"must be a finite number of reasonable size, got {_show(value)}")
    if not math.isfinite(value):
        raise _Problem(where, f"must be a finite number, got {show(value)}")
    if value < minimum:
        raise _Problem(where, f"must be >= {minimum}, got {show(value)}")
    return float(value)


def _check_request_values(id, arrival_s, prompt_tokens, output_tokens, prefix_block_ids, prefix_block_tokens):
    """Validate one request's values; returns them normalised (ints, float arrival, tuple of block ids)."""
    id = _int_field("id", id, 0)
    arrival_s = _number_field("arrival_s", arrival_s, 0.0)
    prompt_tokens = _int_field("prompt_tokens", prompt_tokens, 1, MAX_REQUEST_TOKENS)
    output_tokens = _int_field("output_tokens", output_tokens, 1, MAX_REQUEST_TOKENS)
    if prefix_block_ids is None and prefix_block_tokens is None:
        return id, arrival_s, prompt_tokens, output_tokens, None, None
    if prefix_block_ids is None:
        raise _Problem("prefix_block_ids", "must be present when prefix_block_tokens is, got nothing")
    if prefix_block_tokens is None:
        raise _Problem("prefix_block_tokens", "must be present when prefix_block_ids is, got nothing")
    prefix_block_tokens = _int_field("prefix_block_tokens", prefix_block_tokens, 1)
    if not isinstance(prefix_block_ids, (list, tuple)):
        raise _Problem("prefix_block_ids", f"must be an array of integers, got {_show_typed(prefix_block_ids)}")
    if (
        set(map(type, prefix_block_ids)) <= {int}
        and 0 <= min(prefix_block_ids, default=0)
        and max(prefix_block_ids, default=0) <= _INT64_MAX
    ):
        ids = tuple(prefix_block_ids)  # fast path for the common case; the loop below names the bad entry
    else:
        ids = tuple(_int_field(f"prefix_block_ids[{j}]", b, 0) for j, b in enumerate(prefix_block_ids))
    most = -(-prompt_tokens // prefix_block_tokens)
    if len(ids) > most:
        raise _Problem(
            "prefix_block_ids",
            f"must have at most ceil(prompt_tokens / prefix_block_tokens) = {most} entries, got {len(ids)}",
        )
    return id, arrival_s, prompt_tokens, output_tokens, ids, prefix_block_tokens


def _check_order(requests: Sequence["TraceRequest"]) -> None:
    """Arrivals non-decreasing, ids unique; raises _Problem("requests[i].<field>", ...)."""
    seen: Dict[int, int] = {}
    for i, r in enumerate(requests):
        if i and r.arrival_s < requests[i - 1].arrival_s:
            raise _Problem(
                f"requests[{i}].arrival_s",
                f"must be >= requests[{i - 1}].arrival_s ({requests[i - 1].arrival_s!r}), got {show(r.arrival_s)}",
            )
        if r.id in seen:
            raise _Problem(f"requests[{i}].id", f"must be unique but repeats requests[{seen[r.id]}].id, got {r.id}")
        seen[r.id] = i


# ----------------------------------------------------------------------------------------------------------------
# Data classes


@dataclass(frozen=True)
class TraceRequest:
    """One request of a workload.

    ``arrival_s`` is seconds since the start of the trace. ``prefix_block_ids`` (optional) names the prompt's
    blocks of ``prefix_block_tokens`` tokens each, in order; equal ids in different requests mean the same prefix
    content, so its KV can be reused. It covers at most the whole prompt.
    """

    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_block_ids: Optional[Tuple[int, ...]] = None
    prefix_block_tokens: Optional[int] = None

    def __post_init__(self):
        try:
            values = _check_request_values(
                self.id,
                self.arrival_s,
                self.prompt_tokens,
                self.output_tokens,
                self.prefix_block_ids,
                self.prefix_block_tokens,
            )
        except _Problem as p:
            raise ValueError(f"TraceRequest.{p.where}: {p.text}") from None
        for name, value in zip(
            ("id", "arrival_s", "prompt_tokens", "output_tokens", "prefix_block_ids", "prefix_block_tokens"), values
        ):
            object.__setattr__(self, name, value)

    @property
    def total_tokens(self) -> int:
        """Context length when the last output token is produced."""
        return self.prompt_tokens + self.output_tokens

    def to_dict(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {
            "id": self.id,
            "arrival_s": self.arrival_s,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
        }
        if self.prefix_block_ids is not None:
            out["prefix_block_ids"] = list(self.prefix_block_ids)
            out["prefix_block_tokens"] = self.prefix_block_tokens
        return out


@dataclass(frozen=True)
class Trace:
    """A workload (requests in arrival order, unique ids) plus optional free-form ``meta`` (provenance),
    ``config`` (the configuration it runs with) and ``results`` (measurements recorded by a run)."""

    requests: Tuple[TraceRequest, ...]
    meta: Optional[Dict[str, Any]] = None
    config: Optional[Dict[str, Any]] = None
    results: Optional[Dict[str, Any]] = None

    def __post_init__(self):
        requests = tuple(self.requests)
        object.__setattr__(self, "requests", requests)
        try:
            if not requests:
                raise _Problem("requests", "must hold at least 1 request, got 0")
            for i, r in enumerate(requests):
                if not isinstance(r, TraceRequest):
                    raise _Problem(f"requests[{i}]", f"must be a TraceRequest, got {show(r)}")
            _check_order(requests)
            for name in _TOP_OPTIONAL:
                value = getattr(self, name)
                if value is not None:
                    _check_section(name, value)
        except _Problem as p:
            raise ValueError(f"Trace.{p.where}: {p.text}") from None

    @property
    def duration_s(self) -> float:
        return self.requests[-1].arrival_s - self.requests[0].arrival_s

    def to_dict(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"schema": SCHEMA_NAME, "version": SCHEMA_VERSION}
        for name in ("meta", "config"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        out["requests"] = [r.to_dict() for r in self.requests]
        if self.results is not None:
            out["results"] = self.results
        return out


# ----------------------------------------------------------------------------------------------------------------
# Sections: meta and config are free-form JSON objects; results has a few reserved keys with fixed types.


def _check_json_value(where: str, value) -> None:
    """Only JSON values (no NaN or infinity) so that a saved trace is valid JSON."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise _Problem(where, f"keys must be strings, got {_show_typed(k)}")
            _check_json_value(_key(where, k), v)
    elif isinstance(value, (list, tuple)):
        for j, v in enumerate(value):
            _check_json_value(f"{where}[{j}]", v)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise _Problem(where, f"must be a finite number, got {show(value)}")
    elif not (value is None or isinstance(value, (bool, int, str))):
        raise _Problem(where, f"must be a JSON value, got {show(value)}")


def _check_section(name: str, value) -> None:
    if not isinstance(value, dict):
        raise _Problem(name, f"must be an object, got {_show_typed(value)}")
    try:
        _check_json_value(name, value)
    except RecursionError:
        raise _Problem(name, "is nested too deeply, got more levels than Python can check") from None
    if name == "results":
        _check_results(value)


def _check_results(results: Dict[str, Any]) -> None:
    if "selection_file" in results and not isinstance(results["selection_file"], str):
        raise _Problem("results.selection_file", f"must be a string, got {_show_typed(results['selection_file'])}")
    if "link_bytes" in results:
        links = results["link_bytes"]
        if not isinstance(links, dict):
            raise _Problem("results.link_bytes", f"must be an object, got {_show_typed(links)}")
        for k, v in links.items():
            _int_field(_key("results.link_bytes", k), v, 0)
    if "steps" in results:
        steps = results["steps"]
        if not isinstance(steps, list):
            raise _Problem("results.steps", f"must be an array, got {_show_typed(steps)}")
        for j, s in enumerate(steps):
            where = f"results.steps[{j}]"
            if not isinstance(s, dict):
                raise _Problem(where, f"must be an object, got {_show_typed(s)}")
            for key, check in (
                ("step", lambda w, v: _int_field(w, v, 0)),
                ("duration_s", lambda w, v: _number_field(w, v, 0.0)),
            ):
                if key not in s:
                    raise _Problem(f"{where}.{key}", "missing required field")
                check(f"{where}.{key}", s[key])


# ----------------------------------------------------------------------------------------------------------------
# Parsing


def _check_keys(where: str, obj: Dict[str, Any], required: Iterable[str], optional: Iterable[str]) -> None:
    required, optional = tuple(required), tuple(optional)
    for key in obj:
        if key not in required and key not in optional:
            raise _Problem(_key(where, key), f"unknown field (allowed: {', '.join(required + optional)})")
    for key in required:
        if key not in obj:
            raise _Problem(_join(where, key), "missing required field")


def _parse_request(i: int, r) -> "TraceRequest":
    """``requests[i]`` of a trace, checked (raises ``_Problem``)."""
    where = f"requests[{i}]"
    if not isinstance(r, dict):
        raise _Problem(where, f"must be an object, got {_show_typed(r)}")
    _check_keys(where, r, _REQ_REQUIRED, _REQ_OPTIONAL)
    try:
        values = _check_request_values(
            r["id"],
            r["arrival_s"],
            r["prompt_tokens"],
            r["output_tokens"],
            r.get("prefix_block_ids"),
            r.get("prefix_block_tokens"),
        )
    except _Problem as p:
        raise _Problem(_join(where, p.where), p.text) from None
    return TraceRequest(*values)


def _parse(obj, parsed=None) -> Trace:
    if not isinstance(obj, dict):
        raise _Problem("top level", f"must be an object, got {_json_type(obj)}")
    # schema and version first, so an unrelated JSON file is named as such rather than by its first odd key
    for key in ("schema", "version"):
        if key not in obj:
            raise _Problem(key, "missing required field")
    if obj["schema"] != SCHEMA_NAME:
        raise _Problem("schema", f"must be {_show(SCHEMA_NAME)}, got {_show_typed(obj['schema'])}")
    version = obj["version"]
    if isinstance(version, bool) or version != SCHEMA_VERSION or not isinstance(version, int):
        raise _Problem(
            "version", f"must be {SCHEMA_VERSION} (the version this loader reads), got {_show_typed(version)}"
        )
    _check_keys("", obj, _TOP_REQUIRED, _TOP_OPTIONAL)
    for name in _TOP_OPTIONAL:
        if name in obj:
            _check_section(name, obj[name])

    if parsed is None:
        raw = obj["requests"]
        if not isinstance(raw, list):
            raise _Problem("requests", f"must be an array, got {_show_typed(raw)}")
        requests = [_parse_request(i, r) for i, r in enumerate(raw)]
    else:  # a streaming reader (oasis_core.trace_stream) checked every request as it arrived
        requests = parsed
    if not requests:
        raise _Problem("requests", "must hold at least 1 request, got 0")
    _check_order(requests)
    return Trace(requests=tuple(requests), meta=obj.get("meta"), config=obj.get("config"), results=obj.get("results"))


def parse_trace(obj, source: str = "<trace>") -> Trace:
    """Validate an already-decoded JSON object as a trace; errors are ``TraceError("<source>: ...")``."""
    try:
        return _parse(obj)
    except _Problem as p:
        raise TraceError(f"{source}: {p.where}: {p.text}") from None
    except RecursionError:
        raise TraceError(f"{source}: top level: is nested too deeply to check") from None


class _DuplicateKey(Exception):
    pass


def _no_duplicate_keys(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _reject_constant(name):
    raise ValueError(f"{name} is not valid JSON")


def loads_trace(text: Union[str, bytes], source: str = "<trace>") -> Trace:
    """Parse and validate trace text (``str`` or UTF-8 ``bytes``)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TraceError(f"{source}: not UTF-8 text: byte {e.object[e.start]:#04x} at offset {e.start}") from None
    if not text.strip():
        raise TraceError(f"{source}: empty file")
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise TraceError(f"{source}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except _DuplicateKey as e:
        raise TraceError(f"{source}: invalid JSON: an object repeats the key {_show(e.args[0])}") from None
    except RecursionError:
        raise TraceError(f"{source}: invalid JSON: nested too deeply") from None
    except ValueError as e:  # NaN / Infinity constants, integers with too many digits
        raise TraceError(f"{source}: invalid JSON: {' '.join(str(e).split())}") from None
    return parse_trace(obj, source)


def load_trace(path: Union[str, PathLike]) -> Trace:
    """Read and validate the trace file at ``path``. Raises ``TraceError`` (only) on any problem; its message
    starts with ``str(path)``."""
    source = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise TraceError(f"{source}: cannot read: {e.strerror or type(e).__name__}") from None
    return loads_trace(data, source)


# ----------------------------------------------------------------------------------------------------------------
# Writing


def _dumps_compact(value) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=True, allow_nan=False, separators=(", ", ": "))


def dumps_trace(trace: Trace) -> str:
    """The file text of ``trace``: fixed key order, one request per line, sections with sorted keys."""
    lines = ["{", f'  "schema": {json.dumps(SCHEMA_NAME)},', f'  "version": {SCHEMA_VERSION},']
    for name in ("meta", "config"):
        if getattr(trace, name) is not None:
            lines.append(f'  "{name}": {_dumps_compact(getattr(trace, name))},')
    lines.append('  "requests": [')
    body = [f"    {json.dumps(r.to_dict(), allow_nan=False, separators=(', ', ': '))}" for r in trace.requests]
    lines.append(",\n".join(body))
    lines.append("  ]," if trace.results is not None else "  ]")
    if trace.results is not None:
        lines.append(f'  "results": {_dumps_compact(trace.results)}')
    lines.append("}")
    return "\n".join(lines) + "\n"


def save_trace(trace: Trace, path: Union[str, PathLike]) -> None:
    """Write ``trace`` to ``path`` (UTF-8, ``\\n`` line ends); the same trace always gives the same bytes."""
    text = dumps_trace(trace)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
