"""Importers from public production traces to the OasisKV trace format (``traces/SCHEMA.md``).

- ``import_mooncake``: Mooncake (FAST'25) JSONL -- ``timestamp`` (ms), ``input_length``, ``output_length``,
  ``hash_ids`` (512-token prefix blocks). Its timestamps are quantised into ~3 s buckets; the importer spreads the
  requests of each bucket over the bucket, keeping file order.
- ``import_azure``: Azure LLM inference trace 2023 CSV -- ``TIMESTAMP`` (wall clock, 7 fractional digits),
  ``ContextTokens``, ``GeneratedTokens``. Needs pandas (imported only when called).

Both return a validated ``Trace`` whose ``meta`` records the source file name and the import options. Problems
in the source raise ``TraceError("<file>: line <n>: <field>: <what>, got <value>")``.

Regenerate the bundled slice (from the repository root)::

    python -m oasis_core.importers mooncake traces/public/mooncake_conversation_trace.jsonl \\
        --limit 200 --model qwen3-8b --out traces/mooncake_slice.json
"""

from __future__ import annotations

import argparse
import json
import math
from os import PathLike
from pathlib import Path
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from .cliargs import one_line
from .echo import clip, show
from .trace import MAX_REQUEST_TOKENS, Trace, TraceError, TraceRequest, _show, _show_typed, save_trace

MOONCAKE_BLOCK_TOKENS = 512
MAX_TIMESTAMP_MS = 10**12  # ~31.7 years: a later Mooncake timestamp is corrupt
_SPREADS = ("auto", "uniform", "even", "none")
_OVERFLOWS = ("clip", "drop")


def _check_options(time_scale, max_context, limit, overflow=None, spread=None) -> None:
    if (
        isinstance(time_scale, bool)
        or not isinstance(time_scale, (int, float))
        or not (math.isfinite(time_scale) and time_scale > 0)
    ):
        raise ValueError(f"time_scale: must be a finite number > 0, got {show(time_scale)}")
    for name, value, minimum in (("max_context", max_context, 2), ("limit", limit, 1)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
            raise ValueError(f"{name}: must be None or an integer >= {minimum}, got {show(value)}")
    if overflow is not None and overflow not in _OVERFLOWS:
        raise ValueError(f"overflow: must be one of {', '.join(_OVERFLOWS)}, got {show(overflow)}")
    if spread is not None and spread not in _SPREADS:
        raise ValueError(f"spread: must be one of {', '.join(_SPREADS)}, got {show(spread)}")


def fit_context(prompt_tokens: int, output_tokens: int, max_context: Optional[int]) -> Tuple[int, int]:
    """Clip a request so that ``prompt + output <= max_context``: the prompt loses its tail first (its beginning,
    where shared prefixes live, is kept); the output is cut only if it alone leaves no room for a 1-token prompt."""
    if max_context is None or prompt_tokens + output_tokens <= max_context:
        return prompt_tokens, output_tokens
    output_tokens = min(output_tokens, max_context - 1)
    return min(prompt_tokens, max_context - output_tokens), output_tokens


def _read_error(path, e: OSError) -> TraceError:
    return TraceError(f"{path}: cannot read: {e.strerror or type(e).__name__}")


# ----------------------------------------------------------------------------------------------------------------
# Mooncake


def _mooncake_field(path, line_no: int, row: dict, name: str, minimum: int, maximum: int) -> int:
    if name not in row:
        raise TraceError(f"{path}: line {line_no}: {name}: missing required field")
    value = row[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(f"{path}: line {line_no}: {name}: must be an integer, got {_show_typed(value)}")
    if value < minimum:
        raise TraceError(f"{path}: line {line_no}: {name}: must be >= {minimum}, got {value}")
    if value > maximum:
        raise TraceError(f"{path}: line {line_no}: {name}: must be <= {maximum}, got {_show(value)}")
    return value


def _read_mooncake(path, need: Optional[int] = None) -> List[Tuple[int, int, int, int, List[int]]]:
    """Rows as (line number, timestamp_ms, input_length, output_length, hash_ids), validated.

    With ``need``, stop once ``need`` rows are read, their last timestamp bucket is complete and one row of the
    next bucket (which fixes the bucket's width) is read; later rows are neither read nor checked."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise _read_error(path, e) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(f"{path}: not UTF-8 text: byte {e.object[e.start]:#04x} at offset {e.start}") from None
    rows = []
    last_ts = 0
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as e:
            msg = e.msg if isinstance(e, json.JSONDecodeError) else "unparseable"
            raise TraceError(f"{path}: line {line_no}: invalid JSON: {msg}") from None
        if not isinstance(row, dict):
            raise TraceError(f"{path}: line {line_no}: must be a JSON object, got {_show_typed(row)}")
        ts = _mooncake_field(path, line_no, row, "timestamp", 0, MAX_TIMESTAMP_MS)
        if ts < last_ts:
            raise TraceError(f"{path}: line {line_no}: timestamp: must be >= the previous row's {last_ts}, got {ts}")
        last_ts = ts
        n_in = _mooncake_field(path, line_no, row, "input_length", 1, MAX_REQUEST_TOKENS)
        n_out = _mooncake_field(path, line_no, row, "output_length", 1, MAX_REQUEST_TOKENS)
        hash_ids = row.get("hash_ids", [])
        # set(map(type, ...)) rejects bools (type bool, not int) and is fast on ~300k ids
        if not isinstance(hash_ids, list) or not set(map(type, hash_ids)) <= {int} or min(hash_ids, default=0) < 0:
            raise TraceError(
                f"{path}: line {line_no}: hash_ids: must be an array of integers >= 0, got {_show(hash_ids)}"
            )
        if len(hash_ids) > -(-n_in // MOONCAKE_BLOCK_TOKENS):
            raise TraceError(
                f"{path}: line {line_no}: hash_ids: must cover at most input_length = {n_in} tokens "
                f"in {MOONCAKE_BLOCK_TOKENS}-token blocks, got {len(hash_ids)} blocks"
            )
        rows.append((line_no, ts, n_in, n_out, hash_ids))
        if need is not None and len(rows) > need and ts > rows[need - 1][1]:
            break
    if not rows:
        raise TraceError(f"{path}: empty file")
    return rows


def bucket_width(timestamps_s: Sequence[float]) -> Optional[float]:
    """The bucket width of quantised timestamps (Mooncake's ~3 s), or None when they are not bucketed.

    Bucketed: at least two distinct timestamps, and every gap between consecutive distinct ones is within 1% of a
    positive multiple of the median gap (empty buckets make multiples). Arrivals of a Poisson process are not:
    their gaps are exponential, not multiples of one width."""
    starts = np.unique(np.asarray(timestamps_s, dtype=np.float64))
    if starts.size < 2:
        return None
    gaps = np.diff(starts)
    width = float(np.median(gaps))
    multiple = np.round(gaps / width)
    if np.any(multiple < 1) or np.any(np.abs(gaps - multiple * width) > 0.01 * width):
        return None
    return width


def spread_buckets(timestamps_s: Sequence[float], spread: str = "uniform", seed: int = 0) -> np.ndarray:
    """Spread requests that share a quantised timestamp over their bucket (``bucket_width`` must find buckets).

    A bucket starts at a distinct timestamp and ends at the next distinct one; the last bucket gets the median
    bucket width. ``uniform``: sorted seeded uniform draws in ``[start, end)``; ``even``: ``start + i * w / n`` for
    the i-th of n requests; ``none``: unchanged. File order is kept and the result is non-decreasing and never
    reaches the next bucket. Buckets are drawn in order from one generator, so the first n arrivals do not depend
    on the rows after them. Timestamps that are not bucketed raise ``ValueError`` (spreading them would invent
    gaps the trace does not have).
    """
    t = np.asarray(timestamps_s, dtype=np.float64)
    if spread == "none" or t.size == 0:
        return t.copy()
    last_width = bucket_width(t)
    if last_width is None:
        raise ValueError(
            f"spread: {show(spread)} spreads quantised timestamp buckets (Mooncake's ~3 s), but these "
            "timestamps are not bucketed; use spread 'none' (or 'auto')"
        )
    starts, first, counts = np.unique(t, return_index=True, return_counts=True)
    widths = np.append(np.diff(starts), last_width)
    rng = np.random.default_rng(seed)
    out = t.copy()
    for start, i0, n, w in zip(starts, first, counts, widths):
        if spread == "uniform":
            offsets = np.sort(rng.random(n)) * w
        else:
            offsets = np.arange(n) * (w / n)
        out[i0 : i0 + n] = start + offsets
    return out


def import_mooncake(
    path: Union[str, PathLike],
    limit: Optional[int] = None,
    time_scale: float = 1.0,
    max_context: Optional[int] = None,
    seed: int = 0,
    spread: str = "auto",
    overflow: str = "clip",
) -> Trace:
    """Import a Mooncake JSONL trace.

    - ``limit``: keep the first ``limit`` requests (after dropping, if ``overflow="drop"``).
    - ``time_scale``: arrival times are multiplied by it (0.5 = the same requests in half the time, twice the rate).
    - ``max_context``: cap on ``prompt + output`` tokens; ``overflow="clip"`` shortens the request (``fit_context``)
      and truncates ``prefix_block_ids`` to the blocks of the shortened prompt, ``"drop"`` skips it.
    - ``spread``/``seed``: how the ~3 s timestamp buckets are spread (``spread_buckets``); ``"auto"`` spreads
      ``uniform`` when the timestamps are bucketed (``bucket_width``) and leaves them as they are otherwise.
      ``meta.options.spread`` records the spread applied.

    Request ids are the 0-based row numbers of the source file (so they survive dropping and slicing);
    ``prefix_block_ids`` are the rows' ``hash_ids`` with ``prefix_block_tokens = 512``. The first arrival is at
    the first row's timestamp (0 in the published file), not shifted to 0. Arrivals are rounded to the
    microsecond so that saved traces stay short; rounding keeps them non-decreasing.
    """
    _check_options(time_scale, max_context, limit, overflow, spread)
    rows = _read_mooncake(path, need=limit if overflow == "clip" or max_context is None else None)
    seconds = [ts / 1000.0 for _, ts, _, _, _ in rows]
    if spread == "auto":
        spread = "uniform" if bucket_width(seconds) is not None else "none"
    try:
        arrivals = spread_buckets(seconds, spread, seed) * time_scale
    except ValueError as e:
        raise TraceError(f"{path}: {e}") from None
    requests = []
    for index, ((_, _, n_in, n_out, hash_ids), arrival) in enumerate(zip(rows, arrivals)):
        if limit is not None and len(requests) >= limit:
            break
        if max_context is not None and n_in + n_out > max_context and overflow == "drop":
            continue
        prompt, output = fit_context(n_in, n_out, max_context)
        ids = tuple(hash_ids[: -(-prompt // MOONCAKE_BLOCK_TOKENS)])
        requests.append(
            TraceRequest(
                id=index,
                arrival_s=round(float(arrival), 6),
                prompt_tokens=prompt,
                output_tokens=output,
                prefix_block_ids=ids,
                prefix_block_tokens=MOONCAKE_BLOCK_TOKENS,
            )
        )
    if not requests:
        raise TraceError(f"{path}: every request is longer than max_context = {max_context} (overflow='drop')")
    meta = {
        "source": Path(path).name,
        "importer": "mooncake",
        "options": {
            "limit": limit,
            "time_scale": time_scale,
            "max_context": max_context,
            "seed": seed,
            "spread": spread,
            "overflow": overflow,
        },
    }
    return Trace(requests=tuple(requests), meta=meta)


# ----------------------------------------------------------------------------------------------------------------
# Azure 2023


AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def import_azure(
    path: Union[str, PathLike],
    limit: Optional[int] = None,
    time_scale: float = 1.0,
    max_context: Optional[int] = None,
    overflow: str = "clip",
) -> Trace:
    """Import an Azure LLM inference trace 2023 CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    Arrivals are seconds since the first row's timestamp (parsed to the microsecond; the 7th fractional digit,
    100 ns, is dropped), times ``time_scale``. Ids are 0-based data-row numbers. ``limit``, ``max_context`` and
    ``overflow`` behave as in ``import_mooncake``. Error messages count lines from 1 with the header as line 1.
    """
    import pandas as pd  # imported here: oasis_core must import without pandas

    _check_options(time_scale, max_context, limit, overflow)
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False, nrows=None)
    except OSError as e:
        raise _read_error(path, e) from None
    except pd.errors.EmptyDataError:
        raise TraceError(f"{path}: empty file") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as e:
        raise TraceError(f"{path}: unreadable CSV: {' '.join(str(e).split())}") from None
    missing = [c for c in AZURE_COLUMNS if c not in df.columns]
    if missing:
        raise TraceError(
            f"{path}: line 1: {missing[0]}: missing column (header has: {clip(', '.join(map(str, df.columns[:20])), 300)})"
        )
    if df.empty:
        raise TraceError(f"{path}: no data rows")

    raw_ts = df["TIMESTAMP"].str.strip()
    # 7 fractional digits are 100 ns; keep 6 so the format is exact and portable across pandas versions.
    ts = pd.to_datetime(
        raw_ts.str.replace(r"^(.*\.\d{6})\d+$", r"\1", regex=True), format="%Y-%m-%d %H:%M:%S.%f", errors="coerce"
    )
    bad = ts.isna().to_numpy()
    if bad.any():
        i = int(np.argmax(bad))
        raise TraceError(
            f"{path}: line {i + 2}: TIMESTAMP: must be 'YYYY-MM-DD HH:MM:SS.fffffff', got {_show(raw_ts.iloc[i])}"
        )
    seconds = (ts - ts.iloc[0]).dt.total_seconds().to_numpy()
    back = np.flatnonzero(np.diff(seconds) < 0)
    if back.size:
        i = int(back[0]) + 1
        raise TraceError(
            f"{path}: line {i + 2}: TIMESTAMP: must be >= the previous row's {raw_ts.iloc[i - 1]}, got {raw_ts.iloc[i]}"
        )

    counts = {}
    for name, minimum in (("ContextTokens", 1), ("GeneratedTokens", 1)):
        text = df[name].str.strip()
        ok = text.str.fullmatch(r"\d+").to_numpy()
        if not ok.all():
            i = int(np.argmin(ok))
            raise TraceError(f"{path}: line {i + 2}: {name}: must be an integer, got {_show(df[name].iloc[i])}")
        long = (text.str.lstrip("0").str.len() > len(str(MAX_REQUEST_TOKENS))).to_numpy()  # int64 could overflow
        values = np.where(long, MAX_REQUEST_TOKENS + 1, text.where(~long, "0").astype(np.int64).to_numpy())
        for bad, rule in (
            (values < minimum, f">= {minimum}"),
            (values > MAX_REQUEST_TOKENS, f"<= {MAX_REQUEST_TOKENS}"),
        ):
            if bad.any():
                i = int(np.argmax(bad))
                raise TraceError(f"{path}: line {i + 2}: {name}: must be {rule}, got {df[name].iloc[i].strip()}")
        counts[name] = values

    requests = []
    for index, (arrival, n_in, n_out) in enumerate(
        zip(seconds * time_scale, counts["ContextTokens"], counts["GeneratedTokens"])
    ):
        if limit is not None and len(requests) >= limit:
            break
        n_in, n_out = int(n_in), int(n_out)
        if max_context is not None and n_in + n_out > max_context and overflow == "drop":
            continue
        prompt, output = fit_context(n_in, n_out, max_context)
        requests.append(
            TraceRequest(id=index, arrival_s=round(float(arrival), 6), prompt_tokens=prompt, output_tokens=output)
        )
    if not requests:
        raise TraceError(f"{path}: every request is longer than max_context = {max_context} (overflow='drop')")
    meta = {
        "source": Path(path).name,
        "importer": "azure",
        "start": str(raw_ts.iloc[0]),
        "options": {"limit": limit, "time_scale": time_scale, "max_context": max_context, "overflow": overflow},
    }
    return Trace(requests=tuple(requests), meta=meta)


# ----------------------------------------------------------------------------------------------------------------
# Command line (``python -m oasis_core.importers`` and ``python -m oasis_sim import`` share these options)


class UsageError(ValueError):
    """A bad command line; ``str(err)`` is one line."""


class OneLineParser(argparse.ArgumentParser):
    """argparse that raises ``UsageError`` (one line) instead of printing the usage and exiting."""

    def error(self, message):
        raise UsageError(" ".join(message.split()))


def _int_option(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {show(text)}") from None


def _float_option(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {show(text)}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be finite, got {show(text)}")
    return v


def add_import_arguments(parser: argparse.ArgumentParser) -> None:
    """The importer's positional arguments and options (documented in ``traces/SCHEMA.md``)."""
    parser.add_argument("format", choices=("mooncake", "azure"), help="the source trace's format")
    parser.add_argument("source", help="the source trace file")
    parser.add_argument("-o", "--out", required=True, help="where to write the OasisKV trace (JSON; overwritten)")
    parser.add_argument("--limit", type=_int_option, default=None, help="keep the first N requests")
    parser.add_argument(
        "--time-scale", type=_float_option, default=1.0, help="multiply arrival times by this (0.5: twice the rate)"
    )
    parser.add_argument("--model", default=None, help="clip requests to this model preset's context")
    parser.add_argument(
        "--max-context", type=_int_option, default=None, help="clip prompt + output to this many tokens"
    )
    parser.add_argument(
        "--overflow",
        choices=_OVERFLOWS,
        default="clip",
        help="a request longer than the context: clip it (the prompt's tail first) or drop it",
    )
    parser.add_argument("--seed", type=_int_option, default=0, help="bucket spreading seed (mooncake)")
    parser.add_argument(
        "--spread",
        choices=_SPREADS,
        default="auto",
        help="how requests sharing a ~3 s timestamp bucket are spread over it (mooncake): auto = "
        "uniform if the timestamps are bucketed, else none",
    )


def check_out_file(path: str) -> None:
    """Refuse an output path that cannot be written (a folder, a missing or read-only parent) before any work."""
    import os

    if os.path.isdir(path):
        raise UsageError(f"--out {path}: is a folder, not a file")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(f"--out {path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise UsageError(f"--out {path}: not writable")


def import_from_args(args) -> Trace:
    """Import the trace that ``add_import_arguments``' options describe and write it to ``args.out``.

    Raises ``TraceError`` for a bad source and ``UsageError`` for bad options or output path (one line each)."""
    from .specs import get_model

    check_out_file(args.out)
    max_context = args.max_context
    try:
        if args.seed < 0:
            raise ValueError(f"seed: must be >= 0, got {args.seed}")
        if args.model is not None:
            model_max = get_model(args.model).max_context_tokens
            max_context = model_max if max_context is None else min(max_context, model_max)
        if args.format == "mooncake":
            trace = import_mooncake(
                args.source,
                limit=args.limit,
                time_scale=args.time_scale,
                max_context=max_context,
                seed=args.seed,
                spread=args.spread,
                overflow=args.overflow,
            )
        else:
            trace = import_azure(
                args.source,
                limit=args.limit,
                time_scale=args.time_scale,
                max_context=max_context,
                overflow=args.overflow,
            )
    except TraceError:
        raise
    except ValueError as e:  # an option: the message names it
        raise UsageError(f"options: {' '.join(str(e).split())}") from None
    if args.model is not None:
        trace = Trace(requests=trace.requests, meta={**trace.meta, "model": args.model})
    try:
        save_trace(trace, args.out)
    except OSError as e:
        raise UsageError(f"--out {args.out}: cannot write: {e.strerror or type(e).__name__}") from None
    return trace


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m oasis_core.importers {mooncake,azure} SRC --out DST [options]``: exit 0, or 2 with one line on
    stderr for any bad input."""
    import os
    import sys

    parser = OneLineParser(
        prog="python -m oasis_core.importers",
        description="Convert a public trace to an OasisKV trace (traces/SCHEMA.md).",
    )
    add_import_arguments(parser)
    try:
        args = parser.parse_args(argv)
        trace = import_from_args(args)
        print(f"wrote {len(trace.requests)} requests over {trace.duration_s:.1f} s to {args.out}")
        sys.stdout.flush()  # a closed stdout fails here, inside the handler below, not at interpreter exit
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except ValueError as e:  # UsageError, TraceError
        print(f"{parser.prog}: error: {one_line(e)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # stdout closed early: the trace is written, nothing to report
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
