"""A bounded load generator for the OpenAI-compatible server (`python -m oasis_exec serve`).

Open-loop arrivals from a workload trace: the Mooncake conversation trace (JSONL, through
`oasis_core.importers.import_mooncake`) or an OasisKV trace (JSON, `oasis_core.trace.load_trace`). Each request
is sent at its (scaled) arrival time, but at most `--concurrency` are in flight: an arrival that finds no free
slot waits, and the wait is recorded (`start_lag_s`), so an overloaded server shows up as lag, not as unbounded
client memory. Lengths are capped to fit the served model's context (read from `/v1/models`).
`--deadline-s` bounds the run in time: at the deadline, requests still streaming are cut (outcome `cut`, their
connection closed, so the server aborts them) and requests not yet sent are dropped (`not_sent`); the record covers
what completed inside the window.

Prompts are token ids. Mooncake's `hash_ids` name 512-token prefix blocks; equal ids yield equal token blocks
(seeded by the id), so shared prefixes stay shared. Requests stream (`stream_options.include_usage`), and a
seeded share of clients (`--disconnect-frac`) hang up mid-stream, to exercise abort paths.

Writes one JSON record: the options, counts per outcome, throughput, TTFT/TPOT/E2E percentiles, the server's
final `/metrics` gauges, and (with `--per-request`) every request.

    python experiments/common/loadgen.py --base-url http://127.0.0.1:8000 --limit 300 --time-scale 0.05 \\
        --concurrency 32 --max-output 128 --out /tmp/loadgen.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from oasis_core import provenance  # noqa: E402

DEFAULT_TRACE = ROOT / "traces" / "public" / "mooncake_conversation_trace.jsonl"
FALLBACK_TRACE = ROOT / "traces" / "mooncake_slice.json"
PREFIX_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class Job:
    index: int
    arrival_s: float
    prompt_ids: tuple[int, ...]
    max_tokens: int
    disconnect_after: int | None  # hang up after this many content chunks (None = read to the end)


@dataclass
class Record:
    index: int
    outcome: str = "pending"  # ok | disconnected | rejected_429 | http_<status> | error
    status: int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    streamed_chunks: int = 0  # content chunks received (one engine step each), counted also for cut requests
    finish_reason: str | None = None
    start_lag_s: float = 0.0
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    retries: int = 0
    error: str | None = None


@dataclass
class LoadConfig:
    base_url: str
    trace: str | None = None
    limit: int = 300
    time_scale: float = 1.0
    concurrency: int = 32
    max_prompt: int | None = None
    max_output: int = 128
    disconnect_frac: float = 0.0
    retry_429: int = 0
    seed: int = 0
    timeout_s: float = 600.0
    model: str | None = None
    per_request: bool = False
    deadline_s: float | None = None
    extra: dict = field(default_factory=dict)


def load_requests(path: Path, limit: int, time_scale: float, max_context: int):
    """(arrival_s, prompt_tokens, output_tokens, prefix_block_ids) per request; cycles the trace up to `limit`."""
    if path.suffix == ".jsonl":
        from oasis_core.importers import import_mooncake

        trace = import_mooncake(path, limit=limit, time_scale=time_scale, max_context=max_context)
        scale = 1.0
    else:
        from oasis_core.importers import fit_context
        from oasis_core.trace import load_trace

        trace = load_trace(path)
        scale = time_scale
    rows = []
    for r in trace.requests:
        p, o = r.prompt_tokens, r.output_tokens
        if path.suffix != ".jsonl":
            p, o = fit_context(p, o, max_context)
        rows.append((r.arrival_s * scale, p, o, r.prefix_block_ids or ()))
    if not rows:
        raise ValueError(f"{path}: no requests")
    t0 = rows[0][0]
    rows = [(a - t0, p, o, h) for a, p, o, h in rows]
    span = rows[-1][0] + (rows[1][0] - rows[0][0] if len(rows) > 1 else 0.0)
    out = []
    for i in range(limit):  # repeat the trace (shifted by its span) when it is shorter than `limit`
        a, p, o, h = rows[i % len(rows)]
        out.append((a + span * (i // len(rows)), p, o, h))
    return out


def make_jobs(cfg: LoadConfig, max_model_len: int, vocab: int) -> list[Job]:
    path = Path(cfg.trace) if cfg.trace else (DEFAULT_TRACE if DEFAULT_TRACE.exists() else FALLBACK_TRACE)
    cap_out = max(1, min(cfg.max_output, max_model_len - 1))
    cap_prompt = max_model_len - cap_out
    if cfg.max_prompt is not None:
        cap_prompt = min(cap_prompt, cfg.max_prompt)
    rows = load_requests(path, cfg.limit, cfg.time_scale, max_model_len)
    rng = random.Random(cfg.seed)
    block_cache: dict[int, list[int]] = {}

    def block(h: int) -> list[int]:
        if h not in block_cache:
            block_cache[h] = np.random.default_rng(h).integers(0, vocab, PREFIX_BLOCK_TOKENS).tolist()
        return block_cache[h]

    jobs = []
    for i, (arrival, n_prompt, n_out, hash_ids) in enumerate(rows):
        n_prompt, n_out = max(1, min(n_prompt, cap_prompt)), max(1, min(n_out, cap_out))
        ids: list[int] = []
        for h in hash_ids:
            if len(ids) >= n_prompt:
                break
            ids.extend(block(h))
        if len(ids) < n_prompt:
            ids.extend(rng.randrange(vocab) for _ in range(n_prompt - len(ids)))
        drop = rng.random() < cfg.disconnect_frac
        jobs.append(Job(i, arrival, tuple(ids[:n_prompt]), n_out, rng.randrange(n_out) if drop else None))
    return jobs


async def _one(client: httpx.AsyncClient, cfg: LoadConfig, model: str, job: Job, rec: Record) -> None:
    body = {
        "model": model,
        "prompt": list(job.prompt_ids),
        "max_tokens": job.max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    rec.prompt_tokens = len(job.prompt_ids)
    for attempt in range(cfg.retry_429 + 1):
        sent = time.perf_counter()
        first = last = None
        chunks = 0
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            rec.status = resp.status_code
            if resp.status_code == 429 and attempt < cfg.retry_429:
                rec.retries += 1
                await asyncio.sleep(float(resp.headers.get("retry-after", "1")))
                continue
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                rec.outcome = "rejected_429" if resp.status_code == 429 else f"http_{resp.status_code}"
                rec.error = text[:300]
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                ev = json.loads(data)
                if "error" in ev:
                    rec.outcome, rec.error = "error", ev["error"].get("message")
                    return
                if ev.get("usage"):
                    rec.completion_tokens = ev["usage"]["completion_tokens"]
                for ch in ev.get("choices", []):
                    # A chunk is one engine step's output; its text may be empty (a partial character held back).
                    now = time.perf_counter()
                    first = first if first is not None else now
                    last = now
                    chunks += 1
                    rec.streamed_chunks = chunks
                    if ch.get("finish_reason"):
                        rec.finish_reason = ch["finish_reason"]
                if job.disconnect_after is not None and chunks > job.disconnect_after:
                    rec.outcome = "disconnected"
                    return  # leaving the `async with` closes the connection mid-stream
        done = time.perf_counter()
        if rec.finish_reason is None:
            rec.outcome, rec.error = "error", "stream ended without a finish reason"
            return
        rec.outcome = "ok"
        rec.e2e_s = done - sent
        if first is not None:
            rec.ttft_s = first - sent
            if rec.completion_tokens > 1:
                rec.tpot_s = (last - first) / (rec.completion_tokens - 1)
        return


def _pct(values: list[float], qs=(50, 90, 99)) -> dict[str, float | None]:
    arr = np.asarray([v for v in values if v is not None], dtype=float)
    return {f"p{q}": (float(np.percentile(arr, q)) if arr.size else None) for q in qs} | {
        "mean": float(arr.mean()) if arr.size else None
    }


def parse_metrics(text: str) -> dict[str, float]:
    """Unlabelled `oasis_*` samples of a Prometheus exposition."""
    out = {}
    for line in text.splitlines():
        if line.startswith("oasis_") and "{" not in line:
            name, _, value = line.partition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


async def run_load(cfg: LoadConfig) -> dict:
    limits = httpx.Limits(max_connections=cfg.concurrency + 4, max_keepalive_connections=cfg.concurrency)
    timeout = httpx.Timeout(cfg.timeout_s, connect=30.0)
    async with httpx.AsyncClient(base_url=cfg.base_url, limits=limits, timeout=timeout) as client:
        card = (await client.get("/v1/models")).json()["data"][0]
        model = cfg.model or card["id"]
        jobs = make_jobs(cfg, card["max_model_len"], card.get("vocab_size", 256))
        records = [Record(j.index) for j in jobs]
        sem = asyncio.Semaphore(cfg.concurrency)
        sent: set[int] = set()
        t0 = time.perf_counter()

        async def launch(job: Job, rec: Record) -> None:
            await asyncio.sleep(max(0.0, t0 + job.arrival_s - time.perf_counter()))
            due = time.perf_counter()
            async with sem:
                rec.start_lag_s = time.perf_counter() - due
                sent.add(job.index)
                try:
                    await _one(client, cfg, model, job, rec)
                except (httpx.HTTPError, json.JSONDecodeError) as exc:
                    rec.outcome, rec.error = "error", f"{type(exc).__name__}: {exc}"

        tasks = [asyncio.create_task(launch(j, r)) for j, r in zip(jobs, records)]
        _, pending = await asyncio.wait(tasks, timeout=cfg.deadline_s)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        wall = time.perf_counter() - t0
        for r in records:
            if r.outcome == "pending":
                r.outcome = "cut" if r.index in sent else "not_sent"
        metrics_text = (await client.get("/metrics")).text

    ok = [r for r in records if r.outcome == "ok"]
    outcomes: dict[str, int] = {}
    for r in records:
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
    out_tokens = sum(r.completion_tokens for r in ok)
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": provenance.commit(full=True, default=None),
        "server": {"base_url": cfg.base_url, "model": model, "card": card},
        "config": {k: v for k, v in asdict(cfg).items() if k != "per_request"},
        "requests": len(records),
        "outcomes": outcomes,
        "wall_s": wall,
        "throughput_tok_s": out_tokens / wall if wall > 0 else 0.0,
        # every chunk streamed inside the window, also of requests cut at the deadline (one token a chunk)
        "throughput_streamed_tok_s": sum(r.streamed_chunks for r in records) / wall if wall > 0 else 0.0,
        "request_rate_per_s": len(ok) / wall if wall > 0 else 0.0,
        "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "completion_tokens": out_tokens,
        "ttft_s": _pct([r.ttft_s for r in ok]),
        "tpot_s": _pct([r.tpot_s for r in ok]),
        "e2e_s": _pct([r.e2e_s for r in ok]),
        "start_lag_s": _pct([r.start_lag_s for r in records]),
        "server_metrics_after": parse_metrics(metrics_text),
        "errors": [asdict(r) for r in records if r.outcome not in ("ok", "disconnected", "cut", "not_sent")][:20],
        "per_request": [asdict(r) for r in records] if cfg.per_request else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root URL")
    p.add_argument(
        "--trace",
        help=f"Mooncake JSONL or OasisKV trace JSON (default {DEFAULT_TRACE.name}, else {FALLBACK_TRACE.name})",
    )
    p.add_argument("--limit", type=int, default=300, help="requests to send (the trace repeats if shorter)")
    p.add_argument("--time-scale", type=float, default=1.0, help="multiply arrival times (0.1 = 10x the rate)")
    p.add_argument("--concurrency", type=int, default=32, help="requests in flight, at most")
    p.add_argument("--max-prompt", type=int, help="cap on prompt tokens (also capped by the model's context)")
    p.add_argument("--max-output", type=int, default=128, help="cap on output tokens")
    p.add_argument("--disconnect-frac", type=float, default=0.0, help="share of clients that hang up mid-stream")
    p.add_argument("--retry-429", type=int, default=0, help="retries of a 429, after Retry-After")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout-s", type=float, default=600.0, help="per-request read timeout")
    p.add_argument("--model", help="model name to send (default: the server's)")
    p.add_argument("--per-request", action="store_true", help="include every request's record")
    p.add_argument(
        "--deadline-s",
        type=float,
        help="end the run this many seconds after the first arrival: cut requests in flight, drop those not yet sent",
    )
    p.add_argument("--out", help="write the JSON record here (default: stdout)")
    a = p.parse_args(argv)
    if a.concurrency < 1 or a.limit < 1 or a.max_output < 1 or not 0 <= a.disconnect_frac <= 1:
        p.error("--concurrency, --limit, --max-output must be >= 1 and --disconnect-frac in [0, 1]")
    if a.deadline_s is not None and a.deadline_s <= 0:
        p.error("--deadline-s must be > 0")
    cfg = LoadConfig(
        base_url=a.base_url,
        trace=a.trace,
        limit=a.limit,
        time_scale=a.time_scale,
        concurrency=a.concurrency,
        max_prompt=a.max_prompt,
        max_output=a.max_output,
        disconnect_frac=a.disconnect_frac,
        retry_429=a.retry_429,
        seed=a.seed,
        timeout_s=a.timeout_s,
        model=a.model,
        per_request=a.per_request,
        deadline_s=a.deadline_s,
    )
    result = asyncio.run(run_load(cfg))
    text = json.dumps(result, indent=2)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text + "\n")
        print(f"wrote {a.out}: {result['outcomes']}, {result['throughput_tok_s']:.1f} tok/s", file=sys.stderr)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
